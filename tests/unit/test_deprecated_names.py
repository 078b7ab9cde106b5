"""The names of 0.1 keep working for one minor version, each with a DeprecationWarning that
names its replacement."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_agentgate import Attempt, BaseRepo, EngineSettings, Move
from pytest_agentgate.store.attempts import AttemptInfo
from pytest_agentgate.workspace.fork import Workspace


def attempt() -> Attempt:
    ws = Workspace(Path("/ws"), "b" * 40, "main", BaseRepo(Path("/r/.git"), Path("/r")), Path("/i"))
    found = Attempt(task="t", agent="a", workspace=ws)
    found.record_ref, found.record_commit, found.change_commit = "refs/x/1", "1" * 40, "2" * 40
    return found


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [("ref", "record_ref", "refs/x/1"), ("commit", "change_commit", "2" * 40),
     ("record", "record_commit", "1" * 40)],
)  # fmt: skip
def test_attempt_names(old: str, new: str, value: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"Attempt.{old} is deprecated.*Attempt.{new}"):
        assert getattr(attempt(), old) == value


def test_attempt_info_and_move_names() -> None:
    info = AttemptInfo("refs/agentgate/attempts/t/1", "3" * 40, "2026", "s", {})
    with pytest.warns(DeprecationWarning, match="record_ref"):
        assert info.ref == info.record_ref
    with pytest.warns(DeprecationWarning, match="record_commit"):
        assert info.commit == info.record_commit
    move = Move("refs/heads/main", "a", "b", "merge", "t")
    with pytest.warns(DeprecationWarning, match="Move.moved_ref"):
        assert move.ref == "refs/heads/main"


def test_the_new_names_do_not_warn(recwarn: pytest.WarningsRecorder) -> None:
    a = attempt()
    assert a.record_ref and a.record_commit and a.change_commit
    assert a.as_dict()["attempt_ref"] == "refs/x/1"
    assert not recwarn.list


def test_unknown_engine_options_are_named() -> None:
    with pytest.raises(TypeError, match="unknown engine setting"):
        EngineSettings.of(target="main", promte=True)


