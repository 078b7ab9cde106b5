"""The queue's waiting and its early re-tests: a waiter reads its verdict the moment it is
written, a leader whose own attempt is decided hands over, a fast-forward that finds a
leader at work joins its batch, and a batch's merged tree is tested while its attempts' own
gates run, its result used only by a batch whose top is exactly that tree; against real
repositories, real threads and processes holding real locks, and real pytest runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import fsck, git, wait_for
from test_queue import GATE, KEY, LEADER, Bench, agent, logs

from pytest_agentgate.engine.landing import _reusable
from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.land.queue import Entry, LandingQueue
from pytest_agentgate.land.retest import Retested
from pytest_agentgate.store.attempts import list_attempts


class Retests:
    """A re-test that records what it ran (early or not) and can be held back."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.ran: list[tuple[str, bool]] = []
        self.reused: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        #: From which call on (0: the first) a re-test waits for ``hold``.
        self.held_from = 0
        self.started = threading.Event()
        self.later: list[Entry] = []  # enqueued while the first re-test runs

    def __call__(
        self,
        tree: str,
        tip: str,
        bases: Sequence[str],
        *,
        ahead: bool = False,
        running: object = None,
        reuse: Retested | None = None,
    ) -> Retested:
        if reuse is not None:  # the engine's rule, for a gate that reports no tests
            self.reused.append(tree)
            return reuse
        self.ran.append((tree, ahead))
        while self.later:
            self.bench.queue.enqueue(self.later.pop(0))
        self.started.set()
        if len(self.ran) > self.held_from:
            assert self.hold.wait(60), "held back for a minute"
        return Retested(True)


def early_bench(service: Path, tmp_path: Path) -> Bench:
    b = Bench(service, tmp_path)
    b.queue = LandingQueue(b.repo, b.target, early=True)
    return b


def lead(b: Bench, entries: Sequence[Entry], retest: Retests) -> list[object]:
    """Queue ``entries`` and lead with ``retest``; their verdicts."""
    queued = [b.queue.enqueue(e) for e in entries]
    with b.target.lock():
        b.queue.lead(KEY, retest)  # type: ignore[arg-type]
    return [b.queue.verdict(e.uid) for e in queued]


def announce(b: Bench, entry: Entry) -> None:
    """``entry``'s own gate begins (as the engine announces it)."""
    b.queue.announce(entry.uid, KEY, tree=b.repo.tree_of(entry.change_commit), base=entry.base)


def early_run(b: Bench, uid: str, retest: Retests) -> None:
    """Start an early re-test as ``uid``'s gate begins, and wait for it to end."""
    b.queue.early.begin(uid, KEY, retest)  # type: ignore[arg-type]
    for thread in b.queue.early._threads:
        thread.join(60)


def two_tested_early(service: Path, tmp_path: Path) -> tuple[Bench, Entry, Entry, Retests]:
    """Attempts x and y, whose gates began together, and the early re-test of their merge."""
    b = early_bench(service, tmp_path)
    x, y = b.attempt("x", {"x.txt": "x"}), b.attempt("y", {"y.txt": "y"})
    announce(b, x)
    announce(b, y)
    retest = Retests(b)
    early_run(b, x.uid, retest)
    return b, x, y, retest


def early_files(b: Bench) -> list[str]:
    folder = b.queue.early.folder
    return sorted(p.suffix for p in folder.iterdir()) if folder.exists() else []


# -- waiting ----------------------------------------------------------------------------


def test_a_waiter_reads_its_verdict_while_the_leader_leads_the_next_batch(
    service: Path, tmp_path: Path
) -> None:
    """Found measuring 16 tests under ``-n 4``: waiters whose batch had landed waited on
    the lock while their leader re-tested the next batch, a whole gate's duration each."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("first", {"first.txt": "0"})])  # the rest need merges
    mine, next_one = b.attempt("mine", {"mine.txt": "1"}), b.attempt("next", {"next.txt": "2"})
    retest = Retests(b)
    retest.later.append(next_one)  # reaches the queue while the first batch is re-tested
    retest.held_from, _ = 1, retest.hold.clear()  # the second batch's re-test is held
    found: list[object] = []
    holding = threading.Event()

    def leader() -> None:
        with b.target.lock():
            holding.set()
            wait_for(b.queue.entries, what="the waiter's entry")
            b.queue.lead(KEY, retest)  # type: ignore[arg-type]

    def waiter() -> None:
        found.append(
            b.queue.land(
                mine.record, mine.change_commit, KEY, retest,  # type: ignore[arg-type]
            )
        )  # fmt: skip

    lead = threading.Thread(target=leader)
    lead.start()
    assert holding.wait(30)
    wait = threading.Thread(target=waiter)
    wait.start()
    # The leader lands the first batch, then re-tests the next one and is held there.
    wait_for(lambda: len(retest.ran) == 2, what="the second batch's re-test")
    wait.join(10)
    try:
        assert not wait.is_alive(), "the waiter still waits for the lock the leader holds"
        assert found[0].status == "promoted"  # type: ignore[attr-defined]
    finally:
        retest.hold.set()
        lead.join(60)
        wait.join(60)
    assert b.queue.verdict(next_one.uid) is not None
    fsck(b.path)


def test_a_leader_whose_own_attempt_is_decided_hands_the_next_batch_over(
    service: Path, tmp_path: Path
) -> None:
    """Its test reports now; the attempt queued meanwhile is left for its own waiter (each
    waiter that finds the lock free and no verdict leads)."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("first", {"first.txt": "0"})])
    mine, later = b.attempt("mine", {"mine.txt": "1"}), b.attempt("later", {"later.txt": "2"})
    retest = Retests(b)
    retest.later.append(later)
    b.queue.enqueue(mine)
    with b.target.lock():
        b.queue.lead(KEY, retest, own=mine.uid)  # type: ignore[arg-type]
    assert b.queue.verdict(mine.uid) is not None
    assert b.queue.verdict(later.uid) is None
    assert [e.uid for e in b.queue.entries()] == [later.uid]
    with b.target.lock():  # its waiter, finding no verdict, leads
        b.queue.lead(KEY, retest, own=later.uid)  # type: ignore[arg-type]
    assert b.queue.verdict(later.uid) is not None and b.queue.entries() == []
    fsck(b.path)


def test_a_fast_forward_that_finds_a_leader_at_work_here_joins_its_queue(
    service: Path, tmp_path: Path
) -> None:
    """The tip moves under a leader at work: a fast-forward waiting for its lock would need
    a merge all the same, after its whole batch."""
    b = Bench(service, tmp_path)
    assert b.target.busy() is False
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, sys, time
            fd = os.open({str(b.repo.private_dir / "locks" / "refs%2Fheads%2Fmain.lock")!r},
                         os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("held", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    (b.repo.private_dir / "locks").mkdir(exist_ok=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert b.target.busy() is True
    finally:
        holder.kill()
        holder.communicate()
    assert b.target.busy() is False


# -- early re-tests ---------------------------------------------------------------------


def test_an_early_retest_of_the_batch_stands_for_its_retest(service: Path, tmp_path: Path) -> None:
    """Two attempts' gates begin together: their merged tree is tested at the same time.
    One fast-forwards; the other's batch has exactly that tree on top, and lands on the
    early run's verdict, with no re-test of its own."""
    b, x, y, retest = two_tested_early(service, tmp_path)
    assert [ahead for _, ahead in retest.ran] == [True]  # one run, held to the bases only
    ((tested, _),) = retest.ran
    assert set(b.repo.tree_paths(tested)) >= {"x.txt", "y.txt"}
    assert early_files(b) == [".json"]
    for entry in (x, y):  # their own gates passed
        b.queue.arrived(entry.uid)
    (fast,) = lead(b, [x], retest)
    assert fast.kind == "fast-forward"  # type: ignore[attr-defined]
    (merged,) = lead(b, [y], retest)
    assert merged.status == "promoted" and merged.kind == "merge"  # type: ignore[attr-defined]
    assert merged.retested  # type: ignore[attr-defined]
    assert retest.reused == [tested] and len(retest.ran) == 1
    assert b.repo.tree_of("refs/heads/main") == tested  # exactly the tree that was tested
    records = {a.task: a for a in list_attempts(b.repo)}
    assert records["task y"].trailers["Retest"] == "passed early"
    assert early_files(b) == [".decided"]  # used once, then gone: that tree is judged
    fsck(b.path)
    # The audit counts a tree its early re-test judged as judged.
    from pytest_agentgate.cli.main import main

    assert main(["audit", "--repo", str(b.path), "--target", "main"]) == 0


def test_an_early_retest_of_another_tree_is_never_used(service: Path, tmp_path: Path) -> None:
    """y failed its own gate (never queued) and the tip moved by another landing: x's batch
    has another top, which is re-tested; the early result stays unused."""
    b, x, y, retest = two_tested_early(service, tmp_path)
    b.queue.arrived(x.uid)
    b.queue.arrived(y.uid)
    b.lead([b.attempt("other", {"other.txt": "o"})])  # moves the tip first
    (landed,) = lead(b, [x], retest)
    assert landed.status == "promoted" and landed.retested  # type: ignore[attr-defined]
    assert retest.reused == [] and len(retest.ran) == 2 and retest.ran[1][1] is False
    assert "y.txt" not in git(b.path, "ls-tree", "--name-only", "main").split()
    assert early_files(b) == [".decided", ".json"]  # x's tree, tested by its leader


def test_no_early_retest_for_one_attempt_on_its_own_base(service: Path, tmp_path: Path) -> None:
    """Alone and on the tip: its own gate tests the very tree it would land (a fast-forward)."""
    b = early_bench(service, tmp_path)
    x = b.attempt("x", {"x.txt": "x"})
    announce(b, x)
    retest = Retests(b)
    early_run(b, x.uid, retest)
    assert retest.ran == [] and early_files(b) == []


def test_a_leader_waits_for_the_early_retest_under_way(service: Path, tmp_path: Path) -> None:
    """It began before a re-test begun now would: the leader blocks on its lock, and then
    takes its verdict, running nothing itself."""
    b = early_bench(service, tmp_path)
    first = b.attempt("first", {"first.txt": "0"})
    x, y = b.attempt("x", {"x.txt": "x"}), b.attempt("y", {"y.txt": "y"})
    for entry in (first, x, y):
        announce(b, entry)
    retest = Retests(b)
    retest.hold.clear()
    b.queue.early.begin(x.uid, KEY, retest)  # type: ignore[arg-type]
    assert retest.started.wait(30)
    for entry in (first, x, y):
        b.queue.arrived(entry.uid)
    b.lead([first])  # a fast-forward: no re-test
    done: list[object] = []
    leading = threading.Thread(target=lambda: done.append(lead(b, [x, y], retest)))
    leading.start()
    time.sleep(0.5)
    assert leading.is_alive() and len(retest.ran) == 1  # waiting, not re-testing
    retest.hold.set()
    leading.join(60)
    assert not leading.is_alive()
    assert [o.status for o in done[0]] == ["promoted", "promoted"]  # type: ignore[attr-defined]
    assert len(retest.ran) == 1 and len(retest.reused) == 1
    fsck(b.path)


def test_an_early_retest_killed_half_way_leaves_nothing_to_wait_for(
    service: Path, tmp_path: Path
) -> None:
    """SIGKILL while its gate runs: its lock goes with its process, its marker says a dead
    process; the leader re-tests at once, and the next early re-test sweeps the marker."""
    b = early_bench(service, tmp_path)
    first = b.attempt("first", {"first.txt": "0"})
    x = b.attempt("x", {"x.txt": "x"})
    for entry in (first, x):
        announce(b, entry)
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pytest_agentgate.store import oplog
        from pytest_agentgate.land.queue import LandingQueue
        from pytest_agentgate.land.retest import Retested
        from pytest_agentgate.git.repo import BaseRepo
        from pytest_agentgate.land.target import LocalBranch
        from pathlib import Path
        repo = BaseRepo(Path({str(b.path)!r}), None)
        target = LocalBranch(repo, "main", oplog.OpLog(repo.common_dir))
        queue = LandingQueue(repo, target, early=True)
        def retest(tree, tip, bases, **_):
            print("running", flush=True)
            time.sleep(120)
            return Retested(True)
        queue.early.begin("uid-x", {KEY!r}, retest)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
        assert early_files(b) == [".running"]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    marker = next(b.queue.early.folder.iterdir())
    assert json.loads(marker.read_text())["pid"] == proc.pid
    for entry in (first, x):
        b.queue.arrived(entry.uid)
    b.lead([first])
    begin = time.monotonic()
    retest = Retests(b)
    b.queue.enqueue(x)
    with b.target.lock():
        b.queue.lead(KEY, retest)  # type: ignore[arg-type]
    assert time.monotonic() - begin < 30
    assert b.queue.verdict(x.uid).status == "promoted"  # type: ignore[union-attr]
    assert len(retest.ran) == 1 and retest.reused == []  # re-tested here, nothing waited for
    # The next early re-test sweeps the dead one's marker.
    y, z = b.attempt("y", {"y.txt": "y"}), b.attempt("z", {"z.txt": "z"})
    announce(b, y)
    announce(b, z)
    early_run(b, y.uid, Retests(b))
    assert early_files(b) == [".decided", ".json"]
    fsck(b.path)


def test_an_early_result_answers_only_as_the_batch_s_re_test_would() -> None:
    """It ran held to its own attempts' bases; the batch's re-test is held to its bases and
    the tip it lands on, which the early run could not know. Only a pass with no failing
    test that the comparison with all of that accepts counts; a failure never counts as it
    is when the gate reports tests (held to other bases, it may have failed a test the
    batch may fail): the tree is run again. Found by the two trials, reading the code."""
    held = {"t.py::test_a": "passed", "t.py::test_b": "failed", "t.py::test_s": "skipped"}
    fine = {"t.py::test_a": "passed", "t.py::test_b": "passed", "t.py::test_s": "skipped"}
    assert _reusable(Retested(True, tests=fine), held)
    assert _reusable(Retested(True, tests={**fine, "t.py::test_new": "passed"}), held)
    assert not _reusable(Retested(True, tests={**fine, "t.py::test_a": "failed"}), held)
    assert not _reusable(Retested(True, tests={**fine, "t.py::test_a": "skipped"}), held)
    # Gone where it passed: a re-test allows no removal here.
    assert not _reusable(Retested(True, tests={"t.py::test_b": "passed"}), held)
    # A new test that does not pass: held to the batch's bases it must pass.
    assert not _reusable(Retested(True, tests={**fine, "t.py::test_new": "skipped"}), held)
    # A failure the early run's own bases excused (it failed there): a re-test held to
    # these, where it passed or was skipped, would not (the second trial's two cases).
    assert not _reusable(Retested(True, tests={**fine, "t.py::test_b": "failed"}), held)
    assert not _reusable(Retested(True, tests={**fine, "t.py::test_s": "failed"}), held)
    assert not _reusable(Retested(True, tests={**fine, "t.py::test_x": "failed"}), None)
    assert not _reusable(Retested(False, tests=fine), held)  # a failure: run again
    assert not _reusable(Retested(True, tests=None), held)  # no results where held has some
    assert _reusable(Retested(True, tests=None), None)  # a gate that reports no tests
    # ... but not its failure: a run ended half-way, or whose sandbox could not start,
    # fails alike (found under load: bwrap killed, its batch's last attempt rejected).
    assert not _reusable(Retested(False, tests=None), None)
    assert _reusable(Retested(True, tests=fine), None)


def test_a_tree_a_leader_re_tested_itself_never_lands_on_an_early_pass(
    service: Path, tmp_path: Path
) -> None:
    """Found by a trial: the leader re-tested a tree itself (the early run was still
    settling, no marker yet) and it failed; the early run then passed the same tree and kept
    the result; a later batch with exactly that top (the same change again, by another
    agent) landed on it, a tree already seen failing."""
    b = early_bench(service, tmp_path)
    x, y = b.attempt("x", {"x.txt": "x"}), b.attempt("y", {"y.txt": "y"})
    again = b.attempt("again", {"y.txt": "y"})  # y's change, on y's base
    runs: list[tuple[str, bool]] = []

    def retest(tree, tip, bases, *, ahead=False, running=None, reuse=None):  # type: ignore[no-untyped-def]
        if reuse is not None:
            runs.append(("reused", reuse.ok))
            return reuse
        if ahead:  # a flaky test passes in the early run, after the leader's run ended
            time.sleep(1.5)
            runs.append(("early", True))
            return Retested(True)
        time.sleep(1.0)  # meanwhile the early run settles, finds y queued, and tests it
        runs.append(("leader", False))  # ... and fails in the leader's
        return Retested(False, "tests failed: test_flaky")

    for entry in (x, y):
        announce(b, entry)
    b.queue.early.begin(x.uid, KEY, retest)
    b.queue.arrived(x.uid)
    with b.target.lock():
        b.queue.lead(KEY, retest, own=b.queue.enqueue(x).uid)  # a fast-forward
    queued = b.queue.enqueue(y)
    b.queue.arrived(y.uid)
    with b.target.lock():  # within the early run's settling: no marker yet
        b.queue.lead(KEY, retest, own=queued.uid)
    assert b.queue.verdict(y.uid).status == "rejected"  # type: ignore[union-attr]
    for thread in b.queue.early._threads:
        thread.join(30)
    queued = b.queue.enqueue(again)
    with b.target.lock():
        b.queue.lead(KEY, retest, own=queued.uid)
    assert b.queue.verdict(again.uid).status == "rejected"  # type: ignore[union-attr]
    assert "y.txt" not in git(b.path, "ls-tree", "--name-only", "main").split()
    assert ("reused", True) not in runs, runs
    fsck(b.path)


def test_a_tree_judged_by_a_leader_is_never_answered_by_an_early_run_again(
    service: Path, tmp_path: Path
) -> None:
    """Found by the second trial: a failing early result (per-test results) is run again,
    and that run, which failed too, did not mark the tree judged; an early run of the same
    tree for a later attempt with the same change then answered for it. Every tree a leader
    judges, however, is marked: the later batch is re-tested by its leader."""
    b = early_bench(service, tmp_path)
    x, y = b.attempt("x", {"x.txt": "x"}), b.attempt("y", {"y.txt": "y"})
    again = b.attempt("again", {"y.txt": "y"})  # y's change again, on y's base
    held = {"t.py::test_ok": "passed", "t.py::test_flaky": "passed"}
    runs: list[tuple[str, bool]] = []

    def retest(tree, tip, bases, *, ahead=False, running=None, reuse=None):  # type: ignore[no-untyped-def]
        if reuse is not None and _reusable(reuse, held):  # the engine's rule
            runs.append(("reused", reuse.ok))
            return reuse
        ok = ahead and len(runs) > 1  # fails early and in the leader's run; passes later
        runs.append(("early" if ahead else "leader", ok))
        tests = {"t.py::test_ok": "passed", "t.py::test_flaky": "passed" if ok else "failed"}
        return Retested(ok, "" if ok else "tests failed: test_flaky", tests=tests)

    for entry in (x, y):
        announce(b, entry)
    early_run(b, x.uid, retest)  # type: ignore[arg-type]
    b.queue.arrived(x.uid)
    with b.target.lock():
        b.queue.lead(KEY, retest, own=b.queue.enqueue(x).uid)  # a fast-forward
    queued = b.queue.enqueue(y)
    b.queue.arrived(y.uid)
    with b.target.lock():  # the early failure is not taken: run again, fails
        b.queue.lead(KEY, retest, own=queued.uid)
    assert b.queue.verdict(y.uid).status == "rejected"  # type: ignore[union-attr]
    announce(b, again)
    early_run(b, again.uid, retest)  # type: ignore[arg-type]
    queued = b.queue.enqueue(again)
    b.queue.arrived(again.uid)
    with b.target.lock():
        b.queue.lead(KEY, retest, own=queued.uid)
    assert runs == [("early", False), ("leader", False), ("leader", False)], runs
    assert b.queue.verdict(again.uid).status == "rejected"  # type: ignore[union-attr]
    fsck(b.path)


def test_a_stopped_early_runner_does_not_stall_the_queue(service: Path, tmp_path: Path) -> None:
    """Found by the second trial reading the code: a leader waited, holding the target's
    lock, for as long as the early run's process lived; stopped (SIGSTOP) or stuck, forever.
    Now it waits a few gates' durations at most, then re-tests itself."""
    from pytest_agentgate.land import early

    b = early_bench(service, tmp_path)
    first, x = b.attempt("first", {"first.txt": "0"}), b.attempt("x", {"x.txt": "x"})
    for entry in (first, x):
        announce(b, entry)
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from pytest_agentgate.store import oplog
        from pytest_agentgate.land.queue import LandingQueue
        from pytest_agentgate.land.retest import Retested
        from pytest_agentgate.git.repo import BaseRepo
        from pytest_agentgate.land.target import LocalBranch
        repo = BaseRepo(Path({str(b.path)!r}), None)
        target = LocalBranch(repo, "main", oplog.OpLog(repo.common_dir))
        queue = LandingQueue(repo, target, early=True)
        def retest(tree, tip, bases, **_):
            print("running", flush=True)
            time.sleep(120)  # stuck (as stopped: alive, holding its lock, never ending)
            return Retested(True)
        queue.early.begin("uid-x", {KEY!r}, retest)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    floor = early.WAIT_FLOOR_S
    early.WAIT_FLOOR_S = 1.0
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
        for entry in (first, x):
            b.queue.arrived(entry.uid)
        b.lead([first])
        retest = Retests(b)
        b.queue.enqueue(x)
        begin = time.monotonic()
        with b.target.lock():
            b.queue.lead(KEY, retest)  # type: ignore[arg-type]
        assert time.monotonic() - begin < 20
        assert b.queue.verdict(x.uid).status == "promoted"  # type: ignore[union-attr]
        assert len(retest.ran) == 1  # re-tested here, after a bounded wait
    finally:
        early.WAIT_FLOOR_S = floor
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    fsck(b.path)


def test_a_verdict_no_version_here_can_read_is_an_error_not_a_spin(
    service: Path, tmp_path: Path
) -> None:
    """Found by the second trial reading the code: a verdict file with fields this version
    does not know raised TypeError out of the waiter; one cut short made it spin through its
    turns without waiting. Now neither counts as a verdict: the waiter waits for the lock,
    and its turns end in a clear error."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("first", {"first.txt": "0"})])
    mine = b.attempt("mine", {"mine.txt": "1"})
    b.queue.folder.mkdir(parents=True, exist_ok=True)
    (b.queue.folder / f"{mine.uid}.verdict").write_text(json.dumps({"status": "x", "new_field": 1}))
    assert b.queue.verdict(mine.uid) is None
    import pytest as _pytest

    from pytest_agentgate.errors import AgentgateError

    with _pytest.raises(AgentgateError, match="gave no verdict"):
        b.queue.land(
            mine.record, mine.change_commit, KEY, Retests(b),  # type: ignore[arg-type]
        )  # fmt: skip


def test_an_early_retest_ended_by_an_interrupt_leaves_no_thread_exception(
    service: Path, tmp_path: Path
) -> None:
    """Found by a trial: a gate ended half-way raises KeyboardInterrupt in the early run's
    thread, which died printing it at the end of the run."""
    b = early_bench(service, tmp_path)
    x, y = b.attempt("x", {"x.txt": "x"}), b.attempt("y", {"y.txt": "y"})
    announce(b, x)
    announce(b, y)
    seen: list[object] = []
    before = threading.excepthook
    threading.excepthook = seen.append
    try:

        def interrupted(*_: object, **__: object) -> Retested:
            raise KeyboardInterrupt  # as the gate's supervisor does when its run is ended

        early_run(b, x.uid, interrupted)  # type: ignore[arg-type]
    finally:
        threading.excepthook = before
    assert seen == [] and early_files(b) == []


def test_a_corrupt_intent_does_not_stop_a_run_s_end(service: Path, tmp_path: Path) -> None:
    """Found by a trial: an intent whose pid is no integer made the end of a run raise,
    before its workspaces were removed."""
    b = early_bench(service, tmp_path)
    x, y = b.attempt("x", {"x.txt": "x"}), b.attempt("y", {"y.txt": "y"})
    announce(b, x)
    announce(b, y)
    retest = Retests(b)
    retest.hold.clear()
    b.queue.early.begin(x.uid, KEY, retest)  # type: ignore[arg-type]
    assert retest.started.wait(30)
    (b.queue.folder / "bad.intent").write_text(json.dumps({"key": KEY, "pid": 5.5}))
    (b.queue.folder / "worse.intent").write_text(json.dumps({"key": KEY, "pid": "x"}))
    b.queue.arrived(y.uid)
    b.queue.arrived(x.uid)
    threading.Timer(0.5, retest.hold.set).start()
    b.queue.early.close()  # no other process's attempt: it ends the run and returns


def test_no_early_retest_after_a_gate_shorter_than_the_settling(
    service: Path, tmp_path: Path
) -> None:
    """Found by a trial: with gates of 0.05 s the attempts were queued before the early run
    had settled, and the leader and the early run tested the same tree twice."""
    b = early_bench(service, tmp_path)
    x, y = b.attempt("x", {"x.txt": "x"}), b.attempt("y", {"y.txt": "y"})
    announce(b, x)
    announce(b, y)
    retest = Retests(b)
    b.queue.early.begin(x.uid, KEY, retest, last_gate_s=0.05)  # type: ignore[arg-type]
    assert b.queue.early._threads == [] and retest.ran == []
    early_run(b, x.uid, retest)  # no gate known yet: it runs
    assert len(retest.ran) == 1


@pytest.mark.parametrize("promote", [True, False], ids=["promote", "dry run"])
def test_early_retests_under_xdist_land_on_their_verdict(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, promote: bool
) -> None:
    """Two agent tests under ``-n 2`` whose gates run together: three gate runs (their own
    two and one early re-test, no re-test after them), and the merge lands on the early
    run's verdict, as its record says; in a dry run too (on the run's scratch ref)."""
    log = logs(tmp_path)
    pytester.makepyfile(**{f"test_agent_{n}": agent(n, tmp_path, 2) for n in range(2)})
    gate = GATE.replace("time.sleep(0.3)", "time.sleep(1)")
    os.environ["GATE_LOG"] = str(log)
    try:
        result = pytester.runpytest_subprocess(
            "-n", "2", f"--agentgate-repo={service}", *(["--agentgate-promote"] * promote),
            f"--agentgate-gate-exit-code={gate}", "--agentgate-gate-env=GATE_LOG",
            f"--agentgate-sandbox-bind={log.parent}:rw",
        )  # fmt: skip
    finally:
        del os.environ["GATE_LOG"]
    result.assert_outcomes(passed=2)
    landed_on = (
        "main"
        if promote
        else git(service, "for-each-ref", "--format=%(refname)", "refs/agentgate/dryruns/")
    )
    assert set(git(service, "ls-tree", "--name-only", landed_on).split()) >= {
        "change-0.txt",
        "change-1.txt",
    }
    runs = len(log.read_text().splitlines())
    how = sorted(str(a.trailers.get("Retest")) for a in list_attempts(BaseRepo.open(service)))
    assert (runs, how) == (3, ["None", "passed early"]), (runs, how)
    fsck(service)


def test_a_process_ending_lets_its_early_retest_finish_for_another_s_attempt(
    service: Path, tmp_path: Path
) -> None:
    """Found under ``-n 2``: the worker whose attempt fast-forwarded ended its run, and
    with it the early re-test the other worker's leader was waiting for."""
    b = early_bench(service, tmp_path)
    x, y = b.attempt("x", {"x.txt": "x"}), b.attempt("y", {"y.txt": "y"})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        b.queue.announce(x.uid, KEY, tree=b.repo.tree_of(x.change_commit), base=x.base)
        intent = b.queue.folder / f"{y.uid}.intent"  # y is another process's, still judged
        announce(b, y)
        data = json.loads(intent.read_text())
        intent.write_text(json.dumps({**data, "pid": other.pid}))
        retest = Retests(b)
        retest.hold.clear()
        b.queue.early.begin(x.uid, KEY, retest)  # type: ignore[arg-type]
        assert retest.started.wait(30)
        b.queue.arrived(x.uid)  # x fast-forwarded; its process ends its run
        closing = threading.Thread(target=b.queue.early.close)
        closing.start()
        closing.join(1.0)
        assert closing.is_alive(), "the early re-test another process waits for was ended"
        retest.hold.set()
        closing.join(30)
        assert not closing.is_alive() and early_files(b) == [".json"]
    finally:
        retest.hold.set()
        other.kill()
        other.communicate()


def test_early_retests_are_on_by_default_and_off_by_their_option(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    """On for a branch here; ``--agentgate-no-early-retest`` turns them off; off for a
    branch on a server, whose leader batches other machines' attempts with this one's."""
    from pytest_agentgate import Engine

    assert Engine.open(service, "main").queue.early.enabled is True
    assert Engine.open(service, "main", early_retest=False).queue.early.enabled is False
    server = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(service), str(server))
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(server), str(clone))
    remote = Engine.open(clone, "main", remote="origin", promote=True)
    assert remote.queue.early.enabled is False
    pytester.makepyfile(
        test_it="""
        def test_it(request):
            from pytest_agentgate.pytest_plugin.settings import Settings
            assert not Settings.from_config(request.config).engine.early_retest
        """
    )
    pytester.runpytest(
        f"--agentgate-repo={service}", "--agentgate-no-early-retest"
    ).assert_outcomes(passed=1)


def test_no_early_retest_of_more_attempts_than_a_batch_holds(service: Path, tmp_path: Path) -> None:
    """Which of them the first batch takes depends on the order they arrive in, not known
    while their gates run: 16 separate processes spent a gate run more on an early re-test
    of 8 of them."""
    b = Bench(service, tmp_path)
    b.queue = LandingQueue(b.repo, b.target, batch_max=2, early=True)
    made = [b.attempt(name, {f"{name}.txt": name}) for name in ("x", "y", "z")]
    for entry in made:
        announce(b, entry)
    retest = Retests(b)
    early_run(b, made[0].uid, retest)
    assert retest.ran == [] and early_files(b) == []
    b.queue.arrived(made[2].uid)  # two left: one batch holds them
    early_run(b, made[0].uid, retest)
    assert len(retest.ran) == 1 and early_files(b) == [".json"]


# -- found by the third trial, end to end ------------------------------------------------


def test_a_zombie_process_is_dead() -> None:
    """Found by a trial: pytest-xdist keeps a SIGKILLed worker a zombie for a while (its
    locks already let go), ``kill(pid, 0)`` said alive, and the next leader landed the dead
    worker's queued attempt."""
    from pytest_agentgate.store import pending

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(
        lambda: Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
        what="the child to be a zombie",
    )
    try:
        assert pending.pid_alive(child.pid) is False
    finally:
        child.wait()
    assert pending.pid_alive(os.getpid()) is True


def test_a_ctrl_c_during_a_batch_s_move_still_gives_every_waiter_its_verdict(
    service: Path, tmp_path: Path
) -> None:
    """Found by a trial: a Ctrl-C held through the move was raised before the waiters'
    verdicts (and before the move's log line): each waiter, finding none, recorded its
    landed attempt a second time, as interrupted."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    entries = [b.queue.enqueue(b.attempt(f"k{i}", {f"k{i}.txt": str(i)})) for i in range(3)]
    env = {**os.environ, "AGENTGATE_FAULT": "moved:int"}
    stopped = subprocess.run(
        [sys.executable, "-c", LEADER, str(b.path)], env=env, check=False,
        start_new_session=True,  # the Ctrl-C goes to its process group alone
    )  # fmt: skip
    assert stopped.returncode == -signal.SIGINT  # interrupted, after the move and its verdicts
    found = [b.queue.verdict(e.uid) for e in entries]
    assert [o.status if o else None for o in found] == ["promoted"] * 3
    assert all(o is not None and o.record_ref for o in found)
    ops = [r.op for r in b.target.log.read()]
    assert ops.count("promote") == 2 and "pending-abandoned" not in ops  # its log line too
    assert pending_open(b) == []
    fsck(b.path)


def pending_open(b: Bench) -> list[object]:
    from pytest_agentgate.store import pending

    return list(pending.open_lines(b.target.log.read(), b.target.ref))


def test_a_verdict_whose_waiter_died_is_swept_by_the_next_leader(
    service: Path, tmp_path: Path
) -> None:
    """Found by a trial: an entry with a verdict whose waiter died before reading it stayed
    in the queue's folder for good (nothing lists an entry that has a verdict)."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    gone = b.attempt("gone", {"gone.txt": "g"})
    b.lead([gone])  # landed; then its waiter dies before it reads the verdict
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (entry,) = b.queue.folder.glob(f"*-{gone.uid}.entry")
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "pid": dead.pid}))
    assert sorted(p.suffix for p in b.queue.folder.glob(f"*{gone.uid}*")) == [".entry", ".verdict"]
    b.lead([b.attempt("next", {"next.txt": "n"})])
    assert list(b.queue.folder.glob(f"*{gone.uid}*")) == []
    fsck(b.path)


def test_a_waiter_interrupted_after_its_leader_died_recording_it_takes_its_record(
    service: Path, tmp_path: Path
) -> None:
    """Found by a trial: its leader was killed after the move and its records, before its
    verdicts; the waiter, interrupted then, took its entry back and was recorded a second
    time, as interrupted. Its landed record is its verdict now."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    mine = b.queue.enqueue(b.attempt("mine", {"mine.txt": "1"}))
    env = {**os.environ, "AGENTGATE_FAULT": "recorded"}
    died = subprocess.run([sys.executable, "-c", LEADER, str(b.path)], env=env, check=False)
    assert died.returncode == -signal.SIGKILL
    b.queue.withdraw(mine)  # as its waiter does when interrupted
    found = b.queue.verdict(mine.uid)
    assert found is not None and found.status == "promoted" and found.record_ref
    assert [a.task for a in list_attempts(b.repo)].count("task mine") == 1
    fsck(b.path)
