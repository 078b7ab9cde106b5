"""A push is judged per ref from ``--porcelain``: a lost lease is a race, a refusal is the
server's policy (the words git prints, as this git prints them)."""

from __future__ import annotations

import pytest

from pytest_agentgate.errors import GitError
from pytest_agentgate.git.transport import PushResult, RefStatus, parse_porcelain

MAIN = "refs/heads/main"


def statuses(out: str, refs: list[str] | None = None) -> list[RefStatus]:
    return parse_porcelain(out, refs or [MAIN])


@pytest.mark.parametrize("reason", ["stale info", "fetch first", "non-fast-forward"])
def test_a_lost_lease_is_a_race(reason: str) -> None:
    (found,) = statuses(f"To srv\n!\tabc:{MAIN}\t[rejected] ({reason})\nDone\n")
    assert found.outcome == "lost"
    assert PushResult((found,)).lost_race and PushResult((found,)).refused is None


@pytest.mark.parametrize(
    "summary",
    [
        "[remote rejected] (pre-receive hook declined)",
        "[remote rejected] (protected branch hook declined)",
        "[remote rejected] (deny updating a hidden ref)",
        "[rejected] (hook declined)",
    ],
)
def test_a_refusal_is_not_a_race(summary: str) -> None:
    (found,) = statuses(f"To srv\n!\tabc:{MAIN}\t{summary}\nDone\n")
    result = PushResult((found,), ("policy: no",))
    assert found.outcome == "refused" and not result.lost_race
    assert result.refusal().endswith(": policy: no")


def test_an_atomic_push_blames_the_ref_that_failed() -> None:
    out = (
        f"To srv\n!\tabc:{MAIN}\t[remote rejected] (pre-receive hook declined)\n"
        "!\tdef:refs/agentgate/lease/main\t[remote rejected] (atomic transaction failed)\nDone\n"
    )
    found = statuses(out, [MAIN, "refs/agentgate/lease/main"])
    assert [s.outcome for s in found] == ["refused", "refused"]
    assert PushResult(tuple(found)).refused == found[0]  # the reason given is the hook's
    assert "pre-receive hook declined" in PushResult(tuple(found)).refusal()


def test_ok_lines_and_missing_verdicts() -> None:
    (found,) = statuses(f"To srv\n \tabc:{MAIN}\t1111..2222\nDone\n")
    assert found.outcome == "ok"
    assert statuses("fatal: the remote end hung up\n") == []
    with pytest.raises(GitError, match="no verdict"):
        statuses(f"To srv\n!\tabc:{MAIN}\t[rejected] (stale info)\n", [MAIN, "refs/heads/other"])


def test_the_server_s_own_transaction_is_judged_by_what_it_said() -> None:
    line = f"To srv\n!\tabc:{MAIN}\t[remote rejected] (atomic transaction failed)\nDone\n"
    moved = ["error: cannot lock ref 'refs/heads/main': is at 1111 but expected 2222"]
    (raced,) = parse_porcelain(line, [MAIN], moved)
    assert raced.outcome == "lost"
    stale = ["error: cannot lock ref 'refs/heads/main': Unable to create 'main.lock': File exists."]
    (locked,) = parse_porcelain(line, [MAIN], stale)
    assert locked.outcome == "refused"
    assert "File exists" in PushResult((locked,), tuple(stale)).refusal()
    (silent,) = parse_porcelain(line, [MAIN])
    assert silent.outcome == "refused"  # no sign of a race: trying again cannot help


def test_an_unreported_outcome_is_unknown() -> None:
    (found,) = statuses(
        f"To srv\n!\tabc:{MAIN}\t[remote failure] (remote failed to report status)\n"
    )
    assert found.outcome == "unknown"
