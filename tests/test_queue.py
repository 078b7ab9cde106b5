"""The landing queue: batches share one re-test, a failing batch is bisected to its culprit,
a leader that dies loses nothing, an interrupted waiter withdraws; against real repositories,
real processes and real pytest runs."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import fsck, git, land, spawn_pytest, wait_for

from pytest_agentgate.git.index import IndexEntry
from pytest_agentgate.git.repo import Author, BaseRepo
from pytest_agentgate.land.leader import Lead
from pytest_agentgate.land.queue import Entry, LandingQueue, Outcome
from pytest_agentgate.land.retest import Retested
from pytest_agentgate.land.target import LocalBranch
from pytest_agentgate.store import oplog
from pytest_agentgate.store.attempts import list_attempts
from pytest_agentgate.store.record import Record

KEY = "same-gate"
AUTHOR = Author("queue-test", "q@agentgate.invalid")


class Bench:
    """A bare repository, its target, its queue, and attempts made as change commits."""

    def __init__(self, service: Path, tmp_path: Path, batch_max: int = 8) -> None:
        self.path = tmp_path / "bare.git"
        git(tmp_path, "clone", "-q", "--bare", str(service), str(self.path))
        self.repo = BaseRepo(self.path, None)
        self.target = LocalBranch(self.repo, "main", oplog.OpLog(self.repo.common_dir))
        self.queue = LandingQueue(self.repo, self.target, batch_max=batch_max)
        self.base = self.repo.history.resolve_commit("refs/heads/main")
        self.retests: list[str] = []

    def attempt(self, name: str, files: dict[str, str]) -> Entry:
        index = self.repo.index(None, self.repo.private_dir / f"idx-{name}")
        index.read_tree(self.base)
        index.stage_entries(
            [IndexEntry("100644", self.repo.hash_blob(t.encode()), p) for p, t in files.items()]
        )
        commit = self.repo.commit_tree(index.write_tree(), [self.base], f"{name}\n", AUTHOR)
        return Entry(
            seq=0, uid=f"uid-{name}", key=KEY, change_commit=commit,
            record=Record(f"task {name}", name, self.base, self.repo.tree_of(commit),
                          uid=f"uid-{name}"),
            pid=os.getpid(),
        )  # fmt: skip

    def retest(self, fails_with: Sequence[str] = ()) -> object:
        """A re-test that passes unless the tree holds every path of ``fails_with``."""

        def run(tree: str, tip: str, bases: Sequence[str], **_: object) -> Retested:
            self.retests.append(tree)
            paths = set(self.repo.tree_paths(tree))
            if fails_with and set(fails_with) <= paths:
                return Retested(False, "tests failed: test_together", "E  assert 1 == 2")
            return Retested(True)

        return run

    def lead(self, entries: Sequence[Entry], fails_with: Sequence[str] = ()) -> list[Outcome]:
        queued = [self.queue.enqueue(e) for e in entries]
        with self.target.lock():
            self.queue.lead(KEY, self.retest(fails_with))  # type: ignore[arg-type]
        found = [self.queue.verdict(e.uid) for e in queued]
        assert all(f is not None for f in found)
        return found  # type: ignore[return-value]

    def first_parents(self) -> list[str]:
        return git(
            self.path, "log", "--first-parent", "--format=%s", f"{self.base}..main"
        ).splitlines()


def test_a_batch_shares_one_retest_and_lands_one_commit_per_attempt(
    service: Path, tmp_path: Path
) -> None:
    b = Bench(service, tmp_path)
    # Attempt 0 lands first, on its own: the other seven then need merges.
    moved = b.lead([b.attempt("a0", {"a0.txt": "0"})])
    assert moved[0].kind == "fast-forward" and b.retests == []
    outcomes = b.lead([b.attempt(f"a{i}", {f"a{i}.txt": str(i)}) for i in range(1, 8)])
    assert [o.status for o in outcomes] == ["promoted"] * 7
    assert len(b.retests) == 1  # one gate run for seven merges
    assert [o.batch.split(" ", 1)[1] for o in outcomes] == [f"({k} of 7)" for k in range(1, 8)]
    # One merge commit per attempt, in arrival order: git log and revert stay per attempt.
    assert b.first_parents() == [
        f"agentgate: merge task a{i} (by a{i})" for i in range(7, 0, -1)
    ] + ["a0"]
    assert outcomes[-1].new == b.repo.refs.value("refs/heads/main")
    records = {a.task: a for a in list_attempts(b.repo)}
    assert records["task a7"].trailers["Batch"].endswith("(7 of 7)")
    assert records["task a7"].trailers["Retest"] == "passed"
    assert records["task a3"].trailers["Retest"] == "batched"  # below the top: not tested alone
    moves = [r for r in b.target.log.read() if r.op == "promote"]
    assert [m.note for m in moves] == ["fast-forward", "batch"]
    fsck(b.path)


def test_a_leader_waits_for_gates_that_began_with_its_batch_not_for_later_ones(
    service: Path, tmp_path: Path
) -> None:
    """Found measuring 16 agents under ``-n 4``: a leader that waited for every attempt being
    judged held its batch back by a whole gate for one whose gate had just begun. It waits
    for one whose gate began with the batch's own; one that began a gate later lands in the
    next batch instead."""
    import threading
    import time

    b = Bench(service, tmp_path)
    b.lead([b.attempt("first", {"first.txt": "0"})])  # the target moves: the rest need merges
    began = b.queue.announce("uid-early", KEY)  # its gate begins with the leader's own
    mine = dataclasses.replace(b.attempt("mine", {"mine.txt": "1"}), began=began)
    early, late = b.attempt("early", {"early.txt": "2"}), b.attempt("late", {"late.txt": "3"})
    time.sleep(0.7)
    b.queue.announce("uid-late", KEY)  # begins 0.7 gate-durations later

    def arrive(entry: Entry, after_s: float) -> None:
        time.sleep(after_s)
        b.queue.enqueue(entry)
        b.queue.arrived(entry.uid)

    arrivals = [threading.Thread(target=arrive, args=(early, 0.3)),
                threading.Thread(target=arrive, args=(late, 0.8))]  # fmt: skip
    queued = b.queue.enqueue(mine)
    for thread in arrivals:
        thread.start()
    with b.target.lock():
        b.queue.lead(KEY, b.retest(), gate_s=1.0)  # type: ignore[arg-type]
    for thread in arrivals:
        thread.join()
    with b.target.lock():
        b.queue.lead(KEY, b.retest(), gate_s=1.0)  # type: ignore[arg-type]
    found = {e.agent: b.queue.verdict(e.uid) for e in (queued, early, late)}
    assert all(o is not None and o.status == "promoted" for o in found.values()), found
    batch_of = {agent: o.batch.split(" ", 1)[0] for agent, o in found.items() if o}
    assert batch_of["mine"] == batch_of["early"]  # waited for: it began with the batch
    assert batch_of["late"] != batch_of["mine"]  # not waited for: it began a gate later
    fsck(b.path)


def test_a_failing_batch_is_bisected_to_its_culprit(service: Path, tmp_path: Path) -> None:
    """a5 breaks the tests only together with a2: bisection over arrival-order prefixes finds
    a5 in about log2(8) extra runs; the prefix before it lands; the rest land next."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    outcomes = b.lead(
        [b.attempt(f"a{i}", {f"a{i}.txt": str(i)}) for i in range(1, 9)],
        fails_with=("a2.txt", "a5.txt"),
    )
    verdicts = {o.batch or o.status: o for o in outcomes}
    assert [o.status for o in outcomes] == ["promoted"] * 4 + ["rejected"] + ["promoted"] * 3
    culprit = outcomes[4]
    assert culprit.check == "retest" and "test_together" in culprit.reason
    assert "merged after 'task a1' by a1, 'task a2' by a2" in culprit.reason
    assert len(b.retests) <= 1 + 3 + 1  # the batch, log2(8) prefixes, then the rest
    on_main = set(git(b.path, "ls-tree", "--name-only", "main").splitlines())
    assert {f"a{i}.txt" for i in range(9) if i != 5} <= on_main and "a5.txt" not in on_main
    assert verdicts  # every attempt has its verdict
    fsck(b.path)


def test_a_conflict_is_set_aside_and_judged_alone(service: Path, tmp_path: Path) -> None:
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    outcomes = b.lead(
        [
            b.attempt("x", {"same.txt": "x\n"}),
            b.attempt("y", {"same.txt": "y\n"}),  # conflicts with x
            b.attempt("z", {"z.txt": "z\n"}),
        ]
    )
    assert [o.status for o in outcomes] == ["promoted", "conflict", "promoted"]
    assert "same.txt" in outcomes[1].reason
    assert len(b.retests) == 1


def test_nothing_to_land_is_not_a_merge(service: Path, tmp_path: Path) -> None:
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    b.lead([b.attempt("same", {"s.txt": "s"})])
    tip = b.repo.refs.value("refs/heads/main")
    retests = len(b.retests)
    (outcome,) = b.lead([b.attempt("again", {"s.txt": "s"})])  # the very same change
    assert outcome.status == "promoted" and outcome.kind == "already"
    assert "already on the target" in outcome.reason and tip and tip[:12] in outcome.reason
    assert b.repo.refs.value("refs/heads/main") == tip and len(b.retests) == retests


def test_a_waiter_that_leads_twice_keeps_what_both_turns_landed_for_others(
    service: Path, tmp_path: Path
) -> None:
    """A turn of leading can end without the waiter's own verdict (another machine's leader
    took its attempt). The waiter then leads again; its summary of the other machines'
    attempts it landed holds the first turn's as well as the last one's."""
    b = Bench(service, tmp_path)
    own = b.attempt("own", {"own.txt": "own\n"})
    leader, turns = b.queue.leader, []

    class FirstTurnLandsAnotherMachines:
        """The leader part, with a first turn that lands one attempt of another machine and
        leaves the waiter's own undecided; the real leader takes every later turn."""

        def run(self, lead: Lead) -> None:
            turns.append(lead)
            if len(turns) == 1:
                lead.landed_for_others.append({"uid": "uid-of-another-machine", "task": "t"})
                return
            leader.run(lead)

    b.queue.leader = FirstTurnLandsAnotherMachines()  # type: ignore[assignment]
    found = b.queue.land(own.record, own.change_commit, KEY, b.retest())  # type: ignore[arg-type]
    assert len(turns) == 2 and found.status == "promoted", found
    assert [d["uid"] for d in found.landed_for_others] == ["uid-of-another-machine"]


def test_batch_max_one_tests_every_merge_alone(service: Path, tmp_path: Path) -> None:
    b = Bench(service, tmp_path, batch_max=1)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    outcomes = b.lead([b.attempt(f"a{i}", {f"a{i}.txt": str(i)}) for i in range(1, 5)])
    assert [o.status for o in outcomes] == ["promoted"] * 4
    assert len(b.retests) == 4 and all(not o.batch for o in outcomes)


LEADER = """
import sys
from pathlib import Path
from pytest_agentgate.store import oplog
from pytest_agentgate.land.queue import LandingQueue
from pytest_agentgate.land.retest import Retested
from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.land.target import LocalBranch
repo = BaseRepo(Path(sys.argv[1]), None)
target = LocalBranch(repo, "main", oplog.OpLog(repo.common_dir))
queue = LandingQueue(repo, target)
with target.lock():
    queue.lead("same-gate", lambda tree, tip, bases, **_: Retested(True))
"""


@pytest.mark.parametrize("point", ["merge-written", "pending", "moved", "recorded"])
def test_a_leader_killed_mid_batch_loses_nothing(service: Path, tmp_path: Path, point: str) -> None:
    """A leader SIGKILLed before the move, between its pending lines and the move, right
    after the move, or once it has written the batch's records (before its verdicts): the
    next holder lands each attempt exactly once, with its record. ``recorded`` was found
    by a trial: the next leader wrote the records again from the pending lines."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    entries = [b.queue.enqueue(b.attempt(f"k{i}", {f"k{i}.txt": str(i)})) for i in range(3)]
    env = {**os.environ, "AGENTGATE_FAULT": point}
    died = subprocess.run([sys.executable, "-c", LEADER, str(b.path)], env=env, check=False)
    assert died.returncode == -signal.SIGKILL
    with b.target.lock():
        b.queue.lead(KEY, b.retest())  # type: ignore[arg-type]
    outcomes = [b.queue.verdict(e.uid) for e in entries]
    assert [o.status if o else None for o in outcomes] == ["promoted"] * 3
    assert all(o is not None and o.record_ref and o.kind != "already" for o in outcomes)
    on_main = git(b.path, "ls-tree", "--name-only", "main").splitlines()
    assert {"k0.txt", "k1.txt", "k2.txt"} <= set(on_main)
    merges = [s for s in b.first_parents() if s.startswith("agentgate: merge task k")]
    assert sorted(merges) == [
        f"agentgate: merge task k{i} (by k{i})" for i in range(3)
    ]  # once each
    recorded = [a.task for a in list_attempts(b.repo)]
    assert sorted(t for t in recorded if t.startswith("task k")) == [
        "task k0",
        "task k1",
        "task k2",
    ]
    fsck(b.path)


WAITER = """
import sys
from pathlib import Path
from pytest_agentgate.store import oplog
from pytest_agentgate.land.queue import LandingQueue
from pytest_agentgate.land.retest import Retested
from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.land.target import LocalBranch
repo = BaseRepo(Path(sys.argv[1]), None)
target = LocalBranch(repo, "main", oplog.OpLog(repo.common_dir))
queue = LandingQueue(repo, target)
try:
    queue.land({"uid": "w", "task": "waiter", "agent": "w", "base": sys.argv[3]}, sys.argv[2],
               "same-gate", lambda tree, tip, bases, **_: Retested(True))
except KeyboardInterrupt:
    sys.exit(42)
"""


def test_a_waiter_interrupted_as_its_entry_is_written_withdraws_it(
    service: Path, tmp_path: Path
) -> None:
    """Found as a rare failure of the test below: a Ctrl-C landing just after the entry was
    written, before the waiter began to wait, left the entry queued for a leader to land."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    tip = b.repo.refs.value("refs/heads/main")
    mine = b.attempt("w", {"w.txt": "w"})
    waiter = subprocess.run(
        [sys.executable, "-c", WAITER, str(b.path), mine.change_commit, b.base],
        env={**os.environ, "AGENTGATE_FAULT": "enqueued:int"},
        start_new_session=True,  # the fault's SIGINT goes to the waiter's group alone
        check=False,
        timeout=60,
    )
    assert waiter.returncode == 42
    assert not any(e.uid == "w" for e in b.queue.entries())
    with b.target.lock():
        b.queue.lead(KEY, b.retest())  # type: ignore[arg-type]
    assert b.repo.refs.value("refs/heads/main") == tip  # nothing landed after it gave up


def test_an_interrupted_waiter_withdraws_before_it_reports(service: Path, tmp_path: Path) -> None:
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    tip = b.repo.refs.value("refs/heads/main")
    mine = b.attempt("w", {"w.txt": "w"})
    with b.target.lock():  # a leader busy elsewhere
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, str(b.path), mine.change_commit, b.base]
        )
        wait_for(lambda: any(e.uid == "w" for e in b.queue.entries()), what="the waiter's entry")
        waiter.send_signal(signal.SIGINT)
    assert waiter.wait(timeout=30) == 42
    assert not any(e.uid == "w" for e in b.queue.entries())
    assert b.repo.refs.value("refs/heads/main") == tip  # nothing landed after it gave up


# -- whole runs -------------------------------------------------------------------------

AGENT = """
import pathlib, time
import pytest

@pytest.mark.gated(task="change {n}")
def test_change_{n}(agent_workspace):
    (agent_workspace.path / "change-{n}.txt").write_text("{n}\\n")
    # The agents finish together, {together} at a time (as agents started at once would): a
    # barrier, so the test does not depend on how fast this machine starts processes.
    barrier = pathlib.Path({barrier!r})
    arrived = len(list(barrier.iterdir()))  # in rounds of {together}: wait for this round
    (barrier / "{n}").touch()
    deadline = time.monotonic() + 30
    need = {together} * (arrived // {together} + 1)
    while len(list(barrier.iterdir())) < need and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def agent(n: int, tmp_path: Path, together: int) -> str:
    barrier = tmp_path / "barrier"
    barrier.mkdir(exist_ok=True)
    return AGENT.format(n=n, barrier=str(barrier), together=together)


GATE = (
    f'{sys.executable} -c "import pathlib, os, time; '
    "p = pathlib.Path(os.environ['GATE_LOG']); time.sleep(0.3); "
    "p.open('a').write('run\\\\n')\""
)


def logs(tmp_path: Path) -> Path:
    """The gate's run log, in a directory bound writable into the sandbox."""
    folder = tmp_path / "logs"
    folder.mkdir()
    return folder / "gate.log"


def _gate_runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def eight_processes(
    service: Path, tmp_path: Path, log: Path, gate: str, *extra: str
) -> list[subprocess.Popen[str]]:
    """Eight pytest processes started together, each landing its own change through ``gate``
    (which logs its runs to ``log``)."""
    procs = []
    for n in range(8):
        suite = tmp_path / f"suite-{n}"
        suite.mkdir()
        (suite / "test_agent.py").write_text(agent(n, tmp_path, 8))
        procs.append(
            spawn_pytest(
                suite, f"--agentgate-repo={service}", "--agentgate-promote",
                f"--agentgate-gate-exit-code={gate}", "--agentgate-gate-env=GATE_LOG",
                *extra, f"--agentgate-sandbox-bind={log.parent}:rw",
                f"--basetemp={tmp_path / f'tmp-{n}'}", env={"GATE_LOG": str(log)},
            )
        )  # fmt: skip
    return procs


def test_eight_processes_land_everything_with_few_retests(service: Path, tmp_path: Path) -> None:
    log = logs(tmp_path)
    procs = eight_processes(service, tmp_path, log, GATE)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, outputs
    on_main = set(git(service, "ls-tree", "--name-only", "main").splitlines())
    assert {f"change-{n}.txt" for n in range(8)} <= on_main
    assert _gate_runs(log) <= 8 + 4, f"{_gate_runs(log)} gate runs"
    assert git(service, "status", "--porcelain") == ""
    fsck(service)


MOVES_MAIN = """
import subprocess
import pytest

@pytest.mark.gated(task="queued change")
def test_change(agent_workspace):
    (agent_workspace.path / "queued.txt").write_text("q\\n")
    # The target moves while the agent works: the attempt will need a merge (the queue).
    service = {service!r}
    run = lambda *a: subprocess.run(["git", "-C", service, *a], check=True,
                                    capture_output=True, text=True).stdout.strip()
    tree = run("rev-parse", "main^{{tree}}")
    moved = run("-c", "user.name=p", "-c", "user.email=p@e", "commit-tree", tree, "-p", "main",
                "-m", "a person")
    run("update-ref", "refs/heads/main", moved)
"""


def test_a_queued_attempt_s_intent_lasts_until_its_entry_is_written(
    service: Path, tmp_path: Path
) -> None:
    """Found under load (13 gate runs where the queue keeps 10): an attempt that needs a
    merge gave up its intent when its landing began, and wrote its entry only after its
    merge preview, so a leader gathering a batch in between saw neither and re-tested
    without it. Killed just as its entry is written, its intent is still there."""
    git(service, "checkout", "-q", "--detach")  # the person's commit moves main alone
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_agent.py").write_text(MOVES_MAIN.format(service=str(service)))
    proc = spawn_pytest(
        suite, f"--agentgate-repo={service}", "--agentgate-target=main", "--agentgate-promote",
        "--agentgate-gate-exit-code=true", f"--basetemp={tmp_path / 'tmp'}",
        env={"AGENTGATE_FAULT": "enqueued"},
    )  # fmt: skip
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == -9, out  # killed at the fault point
    folder = service / ".git" / "agentgate" / "queue" / "refs%2Fheads%2Fmain"
    assert list(folder.glob("*.entry")), "the attempt did not reach the queue"
    assert list(folder.glob("*.intent")), "its intent was gone before its entry was written"


def test_xdist_workers_share_the_queue(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    log = logs(tmp_path)
    pytester.makepyfile(**{f"test_agent_{n}": agent(n, tmp_path, 4) for n in range(8)})
    os.environ["GATE_LOG"] = str(log)
    try:
        result = pytester.runpytest_subprocess(
            "-n", "4", f"--agentgate-repo={service}", "--agentgate-promote",
            f"--agentgate-gate-exit-code={GATE}", "--agentgate-gate-env=GATE_LOG",
            f"--agentgate-sandbox-bind={log.parent}:rw",
            "--agentgate-report=" + str(tmp_path / "report.json"),
        )  # fmt: skip
    finally:
        del os.environ["GATE_LOG"]
    result.assert_outcomes(passed=8)
    rows = json.loads((tmp_path / "report.json").read_text())["attempts"]
    assert sorted(r["verdict"] for r in rows) == ["promoted"] * 8
    assert _gate_runs(log) <= 8 + 4, f"{_gate_runs(log)} gate runs"
    fsck(service)


def test_one_culprit_among_eight_processes(service: Path, tmp_path: Path) -> None:
    """Change 5 breaks the tests only together with change 2: it alone is rejected."""
    check = tmp_path / "check.py"
    check.write_text(
        textwrap.dedent(
            """
            import os, pathlib, sys, time
            pathlib.Path(os.environ["GATE_LOG"]).open("a").write("run\\n")
            time.sleep(0.3)
            here = pathlib.Path(".")
            sys.exit(1 if (here / "change-2.txt").exists() and (here / "change-5.txt").exists() else 0)
            """
        )
    )
    log = logs(tmp_path)
    procs = eight_processes(
        service, tmp_path, log, f"{sys.executable} {check}", f"--agentgate-sandbox-bind={check}"
    )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    on_main = set(git(service, "ls-tree", "--name-only", "main").splitlines())
    assert not {"change-2.txt", "change-5.txt"} <= on_main
    landed = {n for n in range(8) if f"change-{n}.txt" in on_main}
    assert len(landed) == 7, outputs
    assert sorted(codes) == [0] * 7 + [1], outputs
    fsck(service)


def test_an_entry_that_cannot_merge_does_not_stop_the_queue(service: Path, tmp_path: Path) -> None:
    """A queued change the leader cannot merge (its commit is gone) gets an error; the
    attempts behind it still land."""
    from dataclasses import replace

    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    broken = replace(b.attempt("gone", {"g.txt": "g"}), change_commit="1" * 40)
    outcomes = b.lead([broken, b.attempt("fine", {"f.txt": "f"})])
    assert outcomes[0].status == "error" and "could not merge" in outcomes[0].reason
    assert outcomes[1].status == "promoted"


def test_an_entry_whose_process_is_gone_never_lands(service: Path, tmp_path: Path) -> None:
    """Nobody would report it: a queued attempt whose process died is dropped, not landed."""
    from dataclasses import replace

    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    orphan = b.queue.enqueue(replace(b.attempt("orphan", {"o.txt": "o"}), pid=int(dead.stdout)))
    (mine,) = b.lead([b.attempt("mine", {"m.txt": "m"})])
    assert mine.status == "promoted"
    assert b.queue.verdict(orphan.uid) is None and not any(
        e.uid == orphan.uid for e in b.queue.entries()
    )
    assert "o.txt" not in git(b.path, "ls-tree", "--name-only", "main")


def test_a_leader_reads_the_log_only_after_a_leader_died_leading(
    service: Path, tmp_path: Path
) -> None:
    """The pending lines of a leader that died are in the operations log, which grows with
    every move: a leader reads it only when the last one did not finish (its mark stayed)."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])
    reads: list[int] = []
    original = b.target.log.read

    def counted() -> object:
        reads.append(1)
        return original()

    b.target.log.read = counted  # type: ignore[method-assign]
    b.lead([b.attempt("a1", {"a1.txt": "1"})])
    assert reads == [] and not (b.queue.folder / "leading").exists()
    (b.queue.folder / "leading").write_text("99999999")  # a leader that died leading
    b.lead([b.attempt("a2", {"a2.txt": "2"})])
    assert reads and not (b.queue.folder / "leading").exists()


def test_a_known_conflict_is_decided_before_the_gate_runs(service: Path, tmp_path: Path) -> None:
    """The tip moved to a change the attempt conflicts with: the merge preview, milliseconds,
    decides it before the gate command (seconds) runs; nothing runs for it."""
    from pytest_agentgate import Engine, GateSpec
    from pytest_agentgate.sandbox.containment import Settings

    log = tmp_path / "gate-runs"
    e = Engine.open(
        service, "main", promote=True, workdir=tmp_path / "work", sandbox=Settings(mode="none"),
        gate=GateSpec(commands=(f"sh -c 'echo run >> {log}'",), results_mode="exit-code"),
    )  # fmt: skip
    first, second = e.fork(task="one"), e.fork(task="two")
    (first.path / "ledger" / "api.py").write_text("ONE = 1\n")
    (second.path / "ledger" / "api.py").write_text("TWO = 2\n")
    assert e.run_attempt(first, task="one").verdict.status == "promoted"
    runs = log.read_text().count("run")
    verdict = e.run_attempt(second, task="two").verdict
    assert verdict.status == "conflict" and "ledger/api.py" in verdict.reason
    assert "no gate command was run" in verdict.reason
    assert log.read_text().count("run") == runs
    e.close()
    fsck(service)


def test_a_retry_after_a_conflict_starts_on_the_target_s_tip(service: Path, tmp_path: Path) -> None:
    """From the same base a retry meets the same conflict and spends another try: after a
    conflict, a retry that starts afresh starts on the tip, and lands."""
    from pytest_agentgate import Engine, GateSpec

    e = Engine.open(service, "main", promote=True, workdir=tmp_path / "work",
                    gate=GateSpec(outcome_is_enough=True))  # fmt: skip
    ws = e.fork(task="notes")
    (ws.path / "ledger" / "api.py").write_text("AGENT = 1\n")
    (service / "ledger" / "api.py").write_text("PERSON = 1\n")  # a person's commit meanwhile
    git(service, "commit", "-qam", "by hand")
    tip = git(service, "rev-parse", "main")
    last = e.run_attempt(ws, task="notes")
    assert last.verdict.status == "conflict", last.verdict
    said = e.prepare_retry(ws, "restart", last)
    assert ws.base == tip and "target's tip" in said
    assert (ws.path / "ledger" / "api.py").read_text() == "PERSON = 1\n"
    (ws.path / "ledger" / "api.py").write_text("PERSON = 1\nAGENT = 1\n")
    assert e.run_attempt(ws, task="notes").verdict.status == "promoted"
    assert git(service, "show", "main:ledger/api.py") == "PERSON = 1\nAGENT = 1"
    e.close()
    fsck(service)


def test_attempts_allowed_to_remove_other_tests_never_share_a_re_test(service: Path) -> None:
    """One batch's re-test judges all its attempts by one spec: an attempt whose marker lets
    it remove a test, batched with one whose marker does not, was rejected for losing that
    test (the real failure hidden). Attempts with other allowances are batched apart."""
    from pytest_agentgate import Engine, GateSpec

    e = Engine.open(service, "main", gate=GateSpec(commands=("python -m pytest -q",)))
    plain = GateSpec(commands=("python -m pytest -q",))
    removes = dataclasses.replace(plain, allow_removed=("tests/test_ledger.py::test_add",))
    assert e.lander.batch_key(plain) != e.lander.batch_key(removes)
    assert e.lander.batch_key(removes) == e.lander.batch_key(dataclasses.replace(removes))
    e.close()


def test_a_person_s_commit_while_the_gate_runs_is_reported(service: Path, tmp_path: Path) -> None:
    """The target moves outside agentgate after the preflight read it (a person's commit
    while the gate ran): the landing merges over it, and the attempt and the operations log
    say the target moved outside agentgate."""
    from pytest_agentgate import Engine, GateSpec
    from pytest_agentgate.store import oplog

    e = Engine.open(service, "main", promote=True, workdir=tmp_path / "work",
                    gate=GateSpec(outcome_is_enough=True))  # fmt: skip
    assert land(service, {"first.txt": "1"}, task="first").verdict.status == "promoted"
    ws = e.fork(task="mine")
    (ws.path / "mine.txt").write_text("mine")

    def person_commits(step: str) -> None:
        if step == "promote":
            (service / "person.txt").write_text("by hand\n")
            git(service, "add", "person.txt")
            git(service, "commit", "-qm", "a person's commit")

    e.on_step = person_commits
    found = e.run_attempt(ws, task="mine")
    person = git(service, "rev-parse", "main^1")
    assert found.verdict.status == "promoted", found.verdict
    assert git(service, "log", "-1", "--format=%s", person) == "a person's commit"
    assert found.external_move, "the person's commit was not reported"
    moves = [r for r in oplog.read(e.repo.common_dir) if r.op == "external-move"]
    assert [r.new for r in moves] == [person]
    e.close()
    fsck(service)


@pytest.mark.parametrize("gate", ["no gate command", "re-tests off"])
def test_every_merge_lands_through_the_queue(service: Path, gate: str) -> None:
    """One landing path: a merge that needs no re-test (only checks, or re-tests turned
    off) is a batch of one in the queue like any other, not a second way to move the
    target; its record says it was not re-tested, and the queue is left empty."""
    from pytest_agentgate import Engine, GateSpec

    spec = (
        GateSpec(checks=(lambda ws: True,))
        if gate == "no gate command"
        else GateSpec(commands=("true",), exit_code=("true",), timeout=60)
    )
    e = Engine.open(
        service, "main", promote=True, workdir=service.parent / "work", gate=spec,
        retest=gate != "re-tests off",
    )  # fmt: skip
    steps: list[str] = []
    e.on_step = steps.append
    first, second = e.fork(task="first"), e.fork(task="second")
    (first.path / "a.txt").write_text("a\n")
    (second.path / "b.txt").write_text("b\n")
    assert e.run_attempt(first, task="first").verdict.status == "promoted"
    assert "queue" not in steps  # a fast-forward needs no queue
    landed = e.run_attempt(second, task="second")
    assert landed.verdict.status == "promoted", landed.verdict
    assert "queue" in steps and landed.move is not None and landed.move.kind == "merge"
    assert landed.move.retested is False
    record = git(service, "log", "-1", "--format=%B", landed.record_ref)
    assert ("Retest: skipped" in record) == (gate == "re-tests off"), record
    assert "Retest: batched" not in record and "Retest: passed" not in record
    main = git(service, "rev-parse", "main")
    assert git(service, "rev-parse", f"{main}^2") == landed.change_commit  # the merge's parent
    assert sorted(p.name for p in e.queue.folder.glob("*.entry")) == []
    e.close()
    fsck(service)


def test_a_re_test_the_harness_failed_runs_again_and_never_rejects(
    service: Path, tmp_path: Path
) -> None:
    """Found under load: a re-test whose sandbox could not start the command (bwrap killed
    before it ran) failed as a broken tree does, and the bisection rejected the batch's
    last attempt. Such a failure says nothing of the tree: it runs once more; failing so
    again, the attempt it would blame gets an error of the run, never a rejection."""
    b = Bench(service, tmp_path)
    b.lead([b.attempt("a0", {"a0.txt": "0"})])  # the tip moves: the next ones are merges
    killed = "the sandbox could not start the command: bwrap exited -9"
    faults = [True]  # the next re-test is the harness's failure; then they pass

    def once(tree: str, tip: str, bases: Sequence[str], **_: object) -> Retested:
        b.retests.append(tree)
        return Retested(False, killed, fault=True) if faults and faults.pop() else Retested(True)

    queued = [b.queue.enqueue(b.attempt(n, {f"{n}.txt": n})) for n in ("x", "y")]
    with b.target.lock():
        b.queue.lead(KEY, once)  # type: ignore[arg-type]
    found = [b.queue.verdict(e.uid) for e in queued]
    assert [o.status if o else None for o in found] == ["promoted", "promoted"]
    assert len(b.retests) == 2  # the batch's top, then once more

    def always(tree: str, tip: str, bases: Sequence[str], **_: object) -> Retested:
        return Retested(False, killed, fault=True)

    queued = [b.queue.enqueue(b.attempt(n, {f"{n}.txt": n})) for n in ("p", "q")]
    with b.target.lock():
        b.queue.lead(KEY, always)  # type: ignore[arg-type]
    found = [b.queue.verdict(e.uid) for e in queued]
    assert [o.status if o else None for o in found] == ["error", "error"]
    assert all(o and "could not run, twice" in o.reason and killed in o.reason for o in found)
    on_main = set(git(b.path, "ls-tree", "--name-only", "main").splitlines())
    assert {"x.txt", "y.txt"} <= on_main and not {"p.txt", "q.txt"} & on_main
    fsck(b.path)
