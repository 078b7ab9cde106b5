"""Attacks on what a retry resumes: checkpoints, state outside the workspace, notes.

Each test is an attack that worked in a trial of the first version of retries and
checkpoints, kept so it stays stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import git

from pytest_agentgate import Engine, GateSpec
from pytest_agentgate.errors import AgentgateError, ConfigError


def engine(service: Path, **options: object) -> Engine:
    return Engine.open(
        service, "main", promote=True, workdir=service.parent / "work",
        gate=GateSpec(outcome_is_enough=True), **options,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_forged_trailer_in_a_checkpoint_message_restores_nothing(
    service: Path, tmp_path: Path
) -> None:
    """The agent builds a tree holding ``@abs/<a host path>`` and gets its id into the
    checkpoint's message (a test body that checkpoints with the agent's own progress notes):
    a full resume must never take it for the checkpoint's state and write it to the host."""
    target = tmp_path / "host" / "owned-by-agent.txt"
    e = engine(service)
    ws = e.fork(task="forge")
    payload = tmp_path / "payload"
    (payload / "@abs" / str(target).lstrip("/")).parent.mkdir(parents=True)
    (payload / "@abs" / str(target).lstrip("/")).write_text("written by the plugin\n")
    index = tmp_path / "forge-index"
    env = {**os.environ, "GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": str(payload)}
    subprocess.run(["git", "-C", str(service), "add", "-A"], env=env, check=True)
    tree = subprocess.run(
        ["git", "-C", str(service), "write-tree"], env=env, check=True, capture_output=True,
        text=True,
    ).stdout.strip()  # fmt: skip
    (ws.path / "x.txt").write_text("x\n")
    point = ws.checkpoint(f"migrated half the schema\n\nAgentgate-State: {tree}\n")
    child = e.fork(task="forge", resume_from=point, mode="full")
    assert not target.exists()
    assert (child.path / "x.txt").exists()  # the checkpoint's code still resumes
    message = git(service, "log", "-1", "--format=%B", point)
    assert message.splitlines()[0].endswith("migrated half the schema Agentgate-State: " + tree)


def test_a_checkpoint_naming_a_state_that_is_not_its_parent_is_refused(
    service: Path, tmp_path: Path
) -> None:
    from pytest_agentgate import checkpoints
    from pytest_agentgate.repo import Author, BaseRepo

    repo = BaseRepo(service / ".git", service)
    base = repo.resolve_commit("main")
    forged = repo.commit_tree(
        repo.tree_of(base), [base],
        f"agentgate: checkpoint: x\n\nAgentgate-State: {base}\n", Author("a", "a@e"),
    )  # fmt: skip
    assert repo.update_ref(f"{checkpoints.PREFIX}forged/t/1", forged, None, "test")
    with pytest.raises(checkpoints.CheckpointError, match="not its parents"):
        checkpoints.read(repo, forged)


def test_overlapping_state_paths_are_refused(tmp_path: Path) -> None:
    """``state=[S/sub/db, S]``: the agent replaced ``S/sub`` by a link to a host folder, and
    putting the inner path back deleted a host file through it (capture read one)."""
    from pytest_agentgate.marker import gated

    outer = str(tmp_path / "S")
    with pytest.raises(TypeError, match="overlap: declare the outer one alone"):
        gated("t", state=[f"{outer}/sub/db", outer])
    with pytest.raises(TypeError, match="overlap"):
        gated("t", state=["var/", "var/app.db"])


def test_a_state_path_reached_through_a_link_is_refused(service: Path, tmp_path: Path) -> None:
    """Put back through a linked ancestor, git replaced the host's link by a folder."""
    real = tmp_path / "real" / "a"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    e = engine(service)
    ws = e.fork(task="linked")
    with pytest.raises(ConfigError, match="reached through a symbolic link"), e.state_held(
        ws, [str(tmp_path / "link" / "a")]
    ):
        pass
    assert (tmp_path / "link").is_symlink()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to run as nobody")
def test_a_read_only_folder_an_agent_left_in_state_is_still_put_back(tmp_path: Path) -> None:
    """As an unprivileged user (the agent is the same user in its sandbox), a folder the
    agent made read-only kept what it wrote past the put back, silently."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    import tempfile

    # Somewhere the unprivileged user can reach (pytest's own folders are root's alone).
    place = Path(tempfile.mkdtemp(prefix="agentgate-nobody-", dir="/tmp"))
    os.chmod(place, 0o755)
    state = place / "state"
    (state / "keep").mkdir(parents=True)
    (state / "keep" / "backdoor.txt").write_text("planted by a rejected try\n")
    os.chmod(state / "keep", 0o555)
    subprocess.run(["chown", "-R", "65534:65534", str(state)], check=True)
    script = (
        "import sys; from pathlib import Path; from pytest_agentgate.removal import empty_dir; "
        f"empty_dir(Path({str(state)!r}))"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         script], capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        assert state.is_dir() and list(state.iterdir()) == []
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -5])
def test_a_note_that_could_never_reach_a_budget_is_refused(service: Path, value: float) -> None:
    ws = engine(service).fork(task="notes")
    with pytest.raises(AgentgateError, match="finite and not negative"):
        ws.note(tokens=value)


def test_a_checkpoint_of_a_huge_agent_git_is_refused(service: Path) -> None:
    """An agent that fills its .git made each checkpoint copy gigabytes."""
    from pytest_agentgate.checkpoints import CheckpointError

    e = engine(service, max_bytes=100_000)
    ws = e.fork(task="huge")
    with open(ws.path / ".git" / "blob0", "wb") as out:
        out.truncate(1 << 20)
    with pytest.raises(CheckpointError, match="bytes, more than 100,000"):
        ws.checkpoint("step")
