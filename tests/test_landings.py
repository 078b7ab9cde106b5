"""Landings as the project keeps its history (``--agentgate-land``): a squash and a rebase
each land a linear history, each keeps the re-test of the exact tree that lands, and
rollback, revert and audit handle them as they handle merges; against real repositories
and real pytest gates."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import fsck, git

from pytest_agentgate.cli.main import main

GATE = "python -m pytest -q -p no:cacheprovider tests"

CALLER = {
    "ledger/summary.py": """
        from ledger.report import build


        def summary(amounts):
            store = build(amounts)
            store.add_entry(100)
            return len(store.entries())
        """,
    "tests/test_summary.py": """
        from ledger.summary import summary


        def test_summary():
            assert summary([1, 2]) == 3
        """,
}


def _engine(service: Path, landing: str, start: str):
    from pytest_agentgate import Engine, GateSpec

    return Engine.open(
        service, "main", promote=True, workdir=service.parent / "work", base=start,
        gate=GateSpec(commands=(GATE,), timeout=120, landing=landing),  # type: ignore[arg-type]
    )  # fmt: skip


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip("\n"))


def _trailers(service: Path, commit: str) -> dict[str, str]:
    out = git(service, "log", "-1", "--format=%(trailers:only,unfold)", commit)
    pairs = (line.split(": ", 1) for line in out.splitlines() if ": " in line)
    return {k.removeprefix("Agentgate-"): v for k, v in pairs}


@pytest.mark.parametrize("landing", ["squash", "rebase"])
def test_a_linear_landing_is_retested_and_undone_like_a_merge(
    service: Path, capsys: pytest.CaptureFixture[str], landing: str
) -> None:
    start = git(service, "rev-parse", "main")
    e = _engine(service, landing, start)
    first, second = e.fork(task="Add a summary"), e.fork(task="Add a total")
    _write(first.path, CALLER)
    _write(second.path, {"ledger/total.py": "def total(xs):\n    return sum(xs)\n"})
    one = e.run_attempt(first, task="Add a summary", agent="agent-a")
    two = e.run_attempt(second, task="Add a total", agent="agent-b")
    e.close()
    assert one.verdict.status == two.verdict.status == "promoted", (one.verdict, two.verdict)
    assert one.move is not None and two.move is not None
    # On its own base a rebase is the attempt's commit; a squash is always a commit of its own.
    assert one.move.kind == ("squash" if landing == "squash" else "fast-forward")
    assert two.move.kind == landing and two.move.retested  # onto a moved tip: re-tested
    assert git(service, "rev-list", "--merges", f"{start}..main") == ""  # linear
    assert git(service, "rev-list", "--first-parent", f"{start}..main").split() == [
        two.move.new, one.move.new,
    ]  # fmt: skip
    assert git(service, "rev-parse", "main^{tree}") == two.move.tree
    record = _trailers(service, two.record_ref)
    assert record["Retest"] in ("passed", "passed early"), record
    assert record.get("Landing") == landing, record
    landed = _trailers(service, two.move.new)
    assert git(service, "log", "-1", "--format=%an|%s", two.move.new) == "agent-b|Add a total"
    if landing == "squash":
        assert landed["Squashed"] == two.change_commit and landed["Id"] == two.uid, landed
        assert git(service, "rev-parse", f"{one.move.new}^") == start
    else:  # the attempt's commit replayed: its message kept, its source named
        assert landed["Rebased"] == two.change_commit and landed["Task"] == "Add a total"
        assert one.move.new == one.change_commit
    assert git(service, "rev-parse", f"{two.move.new}^{{tree}}") != git(
        service, "rev-parse", f"{two.change_commit}^{{tree}}"
    )  # the merged tree landed, not the attempt's own
    # Audit: every landed tree was judged (the squash on the base by its own gate).
    assert main(["audit", "--repo", str(service), "--since", start]) == 0, capsys.readouterr()
    capsys.readouterr()
    # Revert the first (its change goes, the second's stays), then roll back to the start.
    assert main(["revert", "--repo", str(service), one.record_ref]) == 0, capsys.readouterr()
    assert not (service / "ledger/summary.py").exists() and (service / "ledger/total.py").exists()
    assert main(["rollback", "--repo", str(service), "--to", start]) == 0
    assert git(service, "rev-parse", "main^{tree}") == git(
        service, "rev-parse", f"{start}^{{tree}}"
    )
    capsys.readouterr()
    assert main(["attempts", "--repo", str(service), "--json"]) == 0
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["Add a summary"]["undone"] and rows["Add a total"]["undone"], rows
    fsck(service)


@pytest.mark.parametrize("landing", ["squash", "rebase"])
def test_a_rename_against_a_new_caller_is_caught_by_the_retest(service: Path, landing: str) -> None:
    """Two changes that merge cleanly and break together: the re-test of the squashed or
    rebased tree rejects the second, and the target keeps only the first."""
    start = git(service, "rev-parse", "main")
    e = _engine(service, landing, start)
    rename, caller = e.fork(task="Rename add_entry"), e.fork(task="Add a summary")
    for rel in ("ledger/store.py", "ledger/report.py", "ledger/api.py"):
        path = rename.path / rel
        path.write_text(path.read_text().replace("add_entry", "add"))
    _write(caller.path, CALLER)
    one = e.run_attempt(rename, task="Rename add_entry", agent="agent-a")
    tip = git(service, "rev-parse", "main")
    two = e.run_attempt(caller, task="Add a summary", agent="agent-b")
    e.close()
    assert one.verdict.status == "promoted", one.verdict
    assert two.verdict.status == "rejected" and two.verdict.check == "retest", two.verdict
    assert "test_summary" in two.verdict.reason
    assert git(service, "rev-parse", "main") == tip
    fsck(service)


def test_the_option_the_ini_and_the_marker(pytester: pytest.Pytester, service: Path) -> None:
    """The run's setting lands each attempt of the run; a marker's ``land=`` its own; a
    value that is none of the three is refused, naming where it came from."""
    start = git(service, "rev-parse", "main")
    pytester.makepyfile(
        test_tasks="""
        import pytest

        @pytest.mark.gated(task="Add a", agent="a")
        def test_1_a(agent_workspace):
            (agent_workspace.path / "a.txt").write_text("a")

        @pytest.mark.gated(task="Add b", agent="b", land="squash")
        def test_2_b(agent_workspace):
            (agent_workspace.path / "b.txt").write_text("b")
        """
    )
    pytester.makeini("[pytest]\nagentgate_land = rebase\n")
    args = (f"--agentgate-repo={service}", f"--agentgate-base={start}", "--agentgate-promote",
            "-p", "no:cacheprovider")  # fmt: skip
    result = pytester.runpytest(*args, "--agentgate-gate=true", "--agentgate-gate-exit-code=true")
    result.assert_outcomes(passed=2)
    assert git(service, "rev-list", "--merges", f"{start}..main") == ""
    assert git(service, "log", "-1", "--format=%s", "main") == "Add b"
    assert "Agentgate-Squashed" in git(service, "log", "-1", "--format=%B", "main")
    # The run's rebase: on its own base, the attempt's commit itself.
    assert git(service, "log", "-1", "--format=%s%n%B", "main^").startswith("Add a\n")
    assert "Agentgate-Squashed" not in git(service, "log", "-1", "--format=%B", "main^")
    bad = pytester.runpytest(*args, "--agentgate-land=octopus")
    assert bad.ret == 4
    bad.stderr.fnmatch_lines(
        ["*invalid --agentgate-land 'octopus'*expected one of merge, squash, rebase*"]
    )


def _agents_that_check_their_base(start: str) -> str:
    """Three agent tasks, each checking that it forked from ``start``, with nothing of the
    others' (they land meanwhile)."""
    return "import pytest\n" + "".join(
        f"""

@pytest.mark.gated(task="Add {n}", agent="a{n}")
def test_{n}(agent_workspace):
    assert agent_workspace.base == "{start}"
    assert sorted(p.name for p in agent_workspace.path.glob("*.txt")) == []
    (agent_workspace.path / "{n}.txt").write_text("{n}")
"""
        for n in range(3)
    )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_run_start_forks_every_agent_from_where_the_run_began(
    pytester: pytest.Pytester, service: Path, workers: str
) -> None:
    """``--agentgate-base=run-start``: every agent of the run (under pytest-xdist, on every
    worker) forks from the target as the run found it; the queue still merges each onto the
    tip that moved, and the run says which base it used."""
    start = git(service, "rev-parse", "main")
    pytester.makepyfile(test_tasks=_agents_that_check_their_base(start))
    result = pytester.runpytest_subprocess(
        f"--agentgate-repo={service}", "--agentgate-base=run-start", "--agentgate-promote",
        "--agentgate-gate=true", "--agentgate-gate-exit-code=true", "-n", workers,
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=3)
    said = f"*fork* from main as it was when the run started, {start[:12]}*"
    result.stdout.fnmatch_lines([said])
    names = git(service, "ls-tree", "--name-only", "main", "--", "0.txt", "1.txt", "2.txt")
    assert names.split() == ["0.txt", "1.txt", "2.txt"]
    assert len(git(service, "rev-list", "--merges", f"{start}..main").split()) == 2
    fsck(service)


def test_without_run_start_a_later_agent_forks_from_what_landed(
    pytester: pytest.Pytester, service: Path
) -> None:
    """The default, as the docs say: each agent forks from the tip it finds (here the second
    finds the first's landing), which is what the checks in the tasks above refuse."""
    start = git(service, "rev-parse", "main")
    pytester.makepyfile(test_tasks=_agents_that_check_their_base(start))
    result = pytester.runpytest_subprocess(
        f"--agentgate-repo={service}", "--agentgate-promote", "--agentgate-gate=true",
        "--agentgate-gate-exit-code=true", "-n", "0", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=2)


def test_run_start_under_xdist_opens_nothing_without_a_gated_test(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The controller reads the run's start for its workers without an engine: a run with
    no gated test, outside any repository, passes and writes nothing."""
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    pytester.makeini("[pytest]\nagentgate_base = run-start\n")
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "forked from" not in result.stdout.str() and "agentgate" not in result.stderr.str()


def test_a_squash_already_landed_is_not_landed_twice(service: Path, tmp_path: Path) -> None:
    """A leader that died after its move and records, before its verdicts, leaves its
    entry queued: the next leader must see the squashed change landed (it is not the tip's
    ancestor, so a merge preview alone would land it again over a person's later commit)."""
    import os

    from pytest_agentgate.land.queue import Entry, LandingQueue
    from pytest_agentgate.land.target import LocalBranch
    from pytest_agentgate.store import oplog
    from pytest_agentgate.store.record import Record

    start = git(service, "rev-parse", "main")
    (service / "k0.txt").write_text("k0\n")
    git(service, "add", "k0.txt")
    git(service, "commit", "-qm", "change k0")
    change = git(service, "rev-parse", "main")
    git(service, "reset", "-q", "--hard", start)
    from pytest_agentgate.git.repo import BaseRepo

    repo = BaseRepo(service / ".git", service)
    record = Record("task k0", "k0", start, repo.tree_of(change), uid="uid-k0", landing="squash")
    entry = Entry(seq=0, uid="uid-k0", key="k", change_commit=change, record=record,
                  pid=os.getpid())  # fmt: skip
    target = LocalBranch(repo, "main", oplog.OpLog(repo.common_dir))
    from pytest_agentgate.land.landings import landing_commit

    landed = landing_commit(repo, start, change, repo.tree_of(change), record)
    assert target.move(landed.commit, start, "squashed", _note()).moved
    (service / "k0.txt").unlink()  # a person removes what it added, afterwards
    git(service, "commit", "-qam", "a person's removal")
    tip = git(service, "rev-parse", "main")
    queue = LandingQueue(repo, target)
    chain, aside, already = queue.leader.chain(tip, [entry])
    assert (chain, aside, already) == ([], [], [entry])


def _note():
    from pytest_agentgate.land.target import MoveNote

    return MoveNote("promote", agent="k0", task="task k0", kind="squash")


def test_a_squash_refuses_a_base_off_the_target_s_history(service: Path) -> None:
    git(service, "checkout", "-q", "-b", "side")
    (service / "f.txt").write_text("v2\n")
    git(service, "add", "f.txt")
    git(service, "commit", "-qm", "side")
    side = git(service, "rev-parse", "side")
    git(service, "checkout", "-q", "main")
    (service / "g.txt").write_text("main moved\n")
    git(service, "add", "g.txt")
    git(service, "commit", "-qm", "main moves")
    e = _engine(service, "squash", side)
    ws = e.fork(task="Add b")
    (ws.path / "b.txt").write_text("b\n")
    done = e.run_attempt(ws, task="Add b", agent="agent-b")
    e.close()
    assert done.verdict.status == "error", done.verdict
    assert "--agentgate-land=squash needs the attempt's base" in done.verdict.reason
    assert "b.txt" not in git(service, "ls-tree", "--name-only", "main")


def test_show_finds_a_squashed_attempt_by_its_id_and_by_its_landed_commit(
    service: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = git(service, "rev-parse", "main")
    e = _engine(service, "squash", start)
    ws = e.fork(task="Add a total")
    _write(ws.path, {"ledger/total.py": "def total(xs):\n    return sum(xs)\n"})
    done = e.run_attempt(ws, task="Add a total", agent="agent-b")
    e.close()
    assert done.verdict.status == "promoted" and done.move is not None, done.verdict
    uid = _trailers(service, done.move.new)["Id"]
    for name in (uid, done.move.new):
        capsys.readouterr()
        assert main(["show", "--repo", str(service), name]) == 0, name
        assert done.record_ref in capsys.readouterr().out
