#!/usr/bin/env python3
"""Benchmark: the plugin's engine operations against the raw git commands doing the same work.

Builds synthetic repositories (about 100, 5,000 and 50,000 files in nested directories, with a
history of some dozens of commits), then times each operation through the engine and through
the bare git commands that are its floor, in the same run, interleaved, and prints one table:
median of N runs each, their ratio and their difference in ms.

    python bench/run.py            # the full run (several minutes on 2 cores)
    python bench/run.py --quick    # a smoke run of seconds
    python bench/run.py --json results.json

No number here is asserted anywhere: the tests prove behaviour, this script measures cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_agentgate.engine import Engine, EngineSettings
from pytest_agentgate.engine.pool import WorkspacePool
from pytest_agentgate.git import runner as _git
from pytest_agentgate.git.repo import Author, BaseRepo
from pytest_agentgate.judge import gate
from pytest_agentgate.judge.gate import GateSpec
from pytest_agentgate.land import promote, target
from pytest_agentgate.land.queue import LandingQueue
from pytest_agentgate.land.retest import no_retest
from pytest_agentgate.sandbox import containment as sandbox
from pytest_agentgate.store import oplog
from pytest_agentgate.workspace import fork as workspace
from pytest_agentgate.workspace import recycle as recycling
from pytest_agentgate.workspace import snapshot as snapshots

ARTICLE = [
    ("fork", "161-183 ms"),
    ("preflight (deep merge)", "179 ms"),
    ("push of a tree", "about 1,030 ms"),
    ("rollback", "1,028 ms"),
]
AGENT = Author("bench-agent", "bench@agentgate.invalid")


@dataclass
class Row:
    size: int
    operation: str
    plugin_ms: float
    floor_ms: float
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.plugin_ms / self.floor_ms if self.floor_ms else float("nan")


# -- building repositories -------------------------------------------------------------


def build_repo(path: Path, files: int, commits: int) -> BaseRepo:
    """A bare repository on ``main``: ``files`` files, then ``commits`` commits of 20 edits each."""
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True)
    stream: list[bytes] = []
    names = [f"pkg{i % 40:02d}/mod{i % 13:02d}/sub{i % 5}/file{i:05d}.py" for i in range(files)]
    mark = 0

    def blob(text: str) -> int:
        nonlocal mark
        mark += 1
        data = text.encode()
        stream.append(b"blob\nmark :%d\ndata %d\n%s\n" % (mark, len(data), data))
        return mark

    def commit(changes: dict[str, int], message: str, when: int) -> None:
        nonlocal mark
        mark += 1
        msg = message.encode()
        head = b"commit refs/heads/main\nmark :%d\ncommitter Bench <b@e> %d +0000\ndata %d\n%s\n" % (
            mark, when, len(msg), msg
        )  # fmt: skip
        stream.append(
            head + b"".join(b"M 100644 :%d %s\n" % (m, n.encode()) for n, m in changes.items())
        )

    initial = {name: blob(_content(name, 0)) for name in names}
    commit(initial, "initial", 1_700_000_000)
    for c in range(1, commits + 1):
        changed = {names[(c * 97 + k * 31) % files]: 0 for k in range(min(20, files))}
        commit({n: blob(_content(n, c)) for n in changed}, f"change {c}", 1_700_000_000 + c * 60)
    subprocess.run(
        ["git", "fast-import", "--quiet"], cwd=path, input=b"".join(stream), check=True,
        env={**os.environ, "GIT_DIR": str(path)},
    )  # fmt: skip
    return BaseRepo(path, None)


def _content(name: str, version: int) -> str:
    return f'"""{name}"""\n\n\ndef value():\n    return {version}\n\n\nNAME = "{name}"\n'


# -- timing -----------------------------------------------------------------------------


def raw_git(repo: BaseRepo, *args: str, work_tree: Path | None = None, index: Path | None = None,
            input: bytes | None = None) -> str:  # fmt: skip
    """The floor: git itself, with nothing of ours around it but subprocess."""
    env = {**os.environ, "GIT_DIR": str(repo.git_dir)}
    if work_tree is not None:
        env["GIT_WORK_TREE"] = str(work_tree)
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    env.setdefault("GIT_COMMITTER_NAME", "floor")
    env.setdefault("GIT_COMMITTER_EMAIL", "floor@e")
    env.setdefault("GIT_AUTHOR_NAME", "floor")
    env.setdefault("GIT_AUTHOR_EMAIL", "floor@e")
    proc = subprocess.run(["git", *args], env=env, input=input, capture_output=True, check=True)
    return proc.stdout.decode().strip()


def bare_bwrap(line: list[str]) -> list[str]:
    """The sandbox's bwrap command line without the descriptors only the plugin fills in
    (its status pipe and its seccomp program): bwrap alone, the same view."""
    out: list[str] = []
    skip = False
    for at, arg in enumerate(line):
        if skip:
            skip = False
        elif arg in ("--json-status-fd", "--seccomp") and "--" not in line[:at]:
            skip = True
        else:
            out.append(arg)
    return out


def clock(fn: Callable[[], object]) -> float:
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1000


Step = Callable[[dict], object]


#: How long a kept checkout rests before it is reused in the measured rows (a second and a
#: little: as after any gate that runs that long); none in a --quick smoke run.
AGE_S = 1.05
#: The operations log's length for the row of a repository with a history (about 2,500
#: gated tests' worth of moves).
LOG_LINES = 10_000


def pair(
    runs: int, setup: Callable[[int], dict], plugin: Step, floor: Step, teardown: Step | None = None
) -> tuple[float, float]:
    """Median ms of ``plugin`` and ``floor`` over ``runs`` rounds, each on a fresh ``setup``."""
    p_ms: list[float] = []
    f_ms: list[float] = []
    for i in range(runs):
        for first in ("plugin", "floor") if i % 2 == 0 else ("floor", "plugin"):
            state = setup(i)
            try:
                if first == "plugin":
                    p_ms.append(clock(lambda: plugin(state)))
                else:
                    f_ms.append(clock(lambda: floor(state)))
            finally:
                if teardown:
                    teardown(state)
    return statistics.median(p_ms), statistics.median(f_ms)


# -- the operations -----------------------------------------------------------------------


class Bench:
    def __init__(
        self, repo: BaseRepo, size: int, runs: int, disk: Path, memory: Path | None
    ) -> None:
        self.repo, self.size, self.runs, self.disk, self.memory = repo, size, runs, disk, memory
        self.base = repo.history.resolve_commit("main")
        self.rows: list[Row] = []
        self.counter = 0
        self.hashed: dict[int, int] = {}

    def add(self, operation: str, plugin_ms: float, floor_ms: float, note: str = "") -> None:
        row = Row(self.size, operation, plugin_ms, floor_ms, note)
        self.rows.append(row)
        print(_format(row), flush=True)

    def scratch(self, prefix: str) -> Path:
        self.counter += 1
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=self.disk))

    def commit_on_base(self, files: dict[str, str], parent: str | None = None) -> str:
        """A commit on ``parent`` (default: the base) changing ``files``, built without a checkout."""
        parent = parent or self.base
        index = self.scratch("idx") / "index"
        raw_git(self.repo, "read-tree", parent, index=index)
        for name, text in files.items():
            oid = raw_git(self.repo, "hash-object", "-w", "--stdin", input=text.encode())
            raw_git(
                self.repo,
                "update-index",
                "--add",
                "--cacheinfo",
                f"100644,{oid},{name}",
                index=index,
            )
        tree = raw_git(self.repo, "write-tree", index=index)
        shutil.rmtree(index.parent)
        # Through the engine, as an attempt's commit is made: the engine then knows its tree.
        return self.repo.commit_tree(tree, [parent], "bench\n", AGENT)

    def names(self, count: int) -> list[str]:
        listing = raw_git(self.repo, "ls-tree", "-r", "--name-only", self.base).splitlines()
        step = max(1, len(listing) // max(1, count))
        return listing[::step][:count]

    # fork -------------------------------------------------------------------------------

    def fork(self) -> None:
        roots = [("disk", self.disk)] + ([("tmpfs", self.memory)] if self.memory else [])
        for label, root in roots:
            made: list[Path] = []

            def plugin(_s: dict, root: Path = root) -> None:
                ws = workspace.fork(self.repo, self.base, "main", root)
                made.append(ws.path)
                made.append(ws.index)

            def floor(_s: dict, root: Path = root) -> None:
                path = Path(tempfile.mkdtemp(dir=root))
                made.append(path)
                idx = root / f"floor-index-{len(made)}"
                made.append(idx)
                raw_git(
                    self.repo, "read-tree", "--reset", "-u", self.base, work_tree=path, index=idx
                )

            def cleanup(_s: dict) -> None:
                for p in made:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(
                        missing_ok=True
                    )
                made.clear()

            p, f = pair(self.runs, lambda i: {}, plugin, floor, cleanup)
            self.add(f"fork ({label})", p, f, "floor: read-tree -u into a private index")

        # A fork with recycling on, as a pytest run has it: a workspace an agent edited 10
        # files in and left junk in, handed back, then a fork onto a base that moved 10
        # files. The pool recycles it where that costs less than a fresh checkout there,
        # else checks out fresh; the recycling alone is timed too (no target: the pool
        # only uses it where it pays). Both against a fresh checkout on the same root.
        moved = self.commit_on_base({n: "moved\n" for n in self.names(10)})
        bases = [self.base, moved]
        for label, root in roots:
            uncontained = sandbox.Settings(mode="none")
            pool = WorkspacePool(self.repo, root, sandbox.resolve(uncontained), uncontained,
                                 branch="main", recycle=True)  # fmt: skip

            def used(ws: workspace.Workspace, i: int) -> None:
                for name in self.names(10):
                    (ws.path / name).write_text(f"agent edit {i}\n")
                (ws.path / "scratch.tmp").write_text("junk")

            for i in range(3):  # the pool learns what either way costs here
                ws = pool.fork(bases[i % 2], "bench")
                used(ws, i)
                pool.release(ws)
            alone = workspace.fork(self.repo, self.base, "main", root)
            p_ms, r_ms, f_ms = [], [], []
            for i in range(self.runs):
                target = bases[(i + 1) % 2]
                got: list[workspace.Workspace] = []
                p_ms.append(clock(lambda: got.append(pool.fork(target, "bench"))))
                used(got[0], i)
                pool.release(got[0])
                used(alone, i)
                r_ms.append(clock(lambda: recycling.recycle(alone, target)))
                path = Path(tempfile.mkdtemp(dir=root))
                idx = root / "recycle-floor-index"
                f_ms.append(clock(lambda: raw_git(self.repo, "read-tree", "--reset", "-u", target,
                                                  work_tree=path, index=idx)))  # fmt: skip
                shutil.rmtree(path)
                idx.unlink()
            workspace.remove(alone)
            pool.close()
            self.add(f"fork, recycling on ({label})", statistics.median(p_ms), statistics.median(f_ms),
                     "floor: a fresh checkout there; the pool recycles where that costs less")  # fmt: skip
            self.add(f"recycling alone ({label})", statistics.median(r_ms), statistics.median(f_ms),
                     "the same workspace reset and proven; target <= 5% of a fresh one on disk")  # fmt: skip

    def sealed(self) -> None:
        """A sealed fork (a pack of the base commit's own objects) beside a shared one."""
        root = self.disk
        made: list[workspace.Workspace] = []

        def sealed(_s: dict) -> None:
            made.append(workspace.fork(self.repo, self.base, "main", root, sealed=True))

        def shared(_s: dict) -> None:
            made.append(workspace.fork(self.repo, self.base, "main", root))

        def cleanup(_s: dict) -> None:
            while made:
                workspace.remove(made.pop())

        p, f = pair(self.runs, lambda i: {}, sealed, shared, cleanup)
        self.add("fork, sealed (disk)", p, f, "floor: the shared fork (alternates)")

    # containment ------------------------------------------------------------------------

    def containment(self) -> None:
        """What the supervisor and the sandbox cost per command (the size does not matter)."""

        contained = sandbox.resolve(sandbox.Settings())
        uncontained = sandbox.resolve(sandbox.Settings(mode="none"))
        ws = workspace.fork(self.repo, self.base, "main", self.disk)
        ws.private = self.scratch("private")
        gate_root = self.scratch("gates")
        tree = self.repo.tree_of(self.base)

        def floor(_s: dict) -> None:
            subprocess.run(["true"], cwd=ws.path, check=True)

        for label, box in (("supervisor", uncontained), ("supervisor + bwrap", contained)):
            if label.endswith("bwrap") and not box.active:
                print(f"  (no working bwrap: {box.reason}; the contained rows are skipped)")
                continue
            hidden = box.with_hidden(self.disk, self.repo.git_dir)

            def agent_run(_s: dict, hidden: sandbox.Sandbox = hidden) -> None:
                ws.sandbox = hidden
                assert ws.run(["true"]).ok

            p, f = pair(self.runs, lambda i: {}, agent_run, floor)
            self.add(f"agent run(), {label}", p, f, "floor: subprocess.run(['true'])")
            if box.active:
                mounts = sandbox.Mounts(ws.path, ws.private)
                for folder in (mounts.tmp, mounts.home):
                    folder.mkdir(parents=True, exist_ok=True)
                line = box.wrap(["true"], mounts, role=sandbox.Role("agent"))
                line = bare_bwrap(line)

                def bwrap_alone(_s: dict, line: list[str] = line) -> None:
                    subprocess.run(line, cwd=ws.path, check=True)

                p, f = pair(self.runs, lambda i: {}, bwrap_alone, floor)
                self.add(
                    "bwrap alone, the same view", p, f, "bwrap's own start: the contained floor"
                )
            context = gate.GateContext(gate_root, hidden)

            def gate_run(_s: dict, context: gate.GateContext = context) -> None:
                assert gate.run_commands(
                    self.repo, tree, GateSpec(commands=("true",), exit_code=("true",)), context
                ).ok

            def gate_floor(_s: dict) -> None:
                path, idx = Path(tempfile.mkdtemp(dir=self.disk)), self.disk / "gate-floor-index"
                raw_git(self.repo, "read-tree", "--reset", "-u", tree, work_tree=path, index=idx)
                subprocess.run(["true"], cwd=path, check=True)
                shutil.rmtree(path)
                idx.unlink()

            p, f = pair(self.runs, lambda i: {}, gate_run, gate_floor)
            self.add(f"gate command, {label}", p, f, "floor: checkout + subprocess.run + rm")
        workspace.remove(ws)

    def gate_checkouts(self) -> None:
        """A gate command on a reused checkout (reset to the next tree) beside a fresh one."""
        from pytest_agentgate.workspace.checkouts import GateCheckouts

        uncontained = sandbox.resolve(sandbox.Settings(mode="none"))
        spec = GateSpec(commands=("true",), exit_code=("true",))
        trees = [
            self.repo.tree_of(self.commit_on_base({n: f"reuse {i}\n" for n in self.names(10)}))
            for i in range(2)
        ]
        for where, root in (("disk", self.disk), ("tmpfs", self.memory)):
            if root is None:
                continue
            gate_root = Path(tempfile.mkdtemp(dir=root))
            kept = GateCheckouts(self.repo, gate_root)
            reused = gate.GateContext(gate_root, uncontained, checkouts=kept)
            fresh = gate.GateContext(gate_root, uncontained)
            # One run first, so every measured run finds a checkout to reuse.
            assert gate.run_commands(self.repo, trees[1], spec, reused).ok

            def plugin(s: dict, context: gate.GateContext = reused) -> None:
                assert gate.run_commands(self.repo, trees[s["i"] % 2], spec, context).ok

            def floor(s: dict, context: gate.GateContext = fresh) -> None:
                assert gate.run_commands(self.repo, trees[s["i"] % 2], spec, context).ok

            def aged(i: int) -> dict:
                # As after any gate that runs a second or more: git's file times are whole
                # seconds, so a checkout reused within the second its index was written in
                # has every file read again (git's guard against a same-second edit).
                time.sleep(AGE_S)
                return {"i": i}

            p, f = pair(self.runs, aged, plugin, floor)
            self.add(f"gate command, reused checkout ({where})", p, f,
                     "floor: the same gate on a fresh checkout; targets <= 25% disk, <= 50% tmpfs")  # fmt: skip
            if where == "tmpfs":
                p, f = pair(self.runs, lambda i: {"i": i}, plugin, floor)
                self.add("gate command, reused within the second (tmpfs)", p, f,
                         "floor: the same gate on a fresh checkout; every file read again")  # fmt: skip
            kept.close()
            shutil.rmtree(gate_root, ignore_errors=True)

    def results_cost(self) -> None:
        """Per-test results (JUnit written and parsed) and a baseline, beside a plain gate run."""

        tests = "".join(f"def test_{i}():\n    assert {i} == {i}\n\n" for i in range(20))
        commit = self.commit_on_base({"bench_tests/test_bench.py": tests})
        tree = self.repo.tree_of(commit)
        context = gate.GateContext(
            self.scratch("results"), sandbox.resolve(sandbox.Settings(mode="none"))
        )
        pytest_cmd = f"{sys.executable} -m pytest -q -p no:cacheprovider bench_tests"
        with_results = GateSpec(commands=(pytest_cmd,))
        plain = GateSpec(commands=(f"sh -c '{pytest_cmd}'",))  # a shell command: no results

        def run_plain(_s: dict) -> None:
            assert gate.run_commands(self.repo, tree, plain, context).ok

        def run_results(_s: dict) -> None:
            found = gate.run_commands(self.repo, tree, with_results, context)
            assert found.ok and found.tests and len(found.tests) == 20

        p, f = pair(self.runs, lambda i: {}, run_results, run_plain)
        self.add("pytest gate, per-test results", p, f, "floor: the same gate, exit code only")
        engine = Engine(self.repo, EngineSettings(target="main", workdir=self.disk, gate=with_results,
                                                  sandbox=sandbox.Settings(mode="none")))  # fmt: skip
        bases = [
            self.commit_on_base({"bench_tests/test_bench.py": tests + f"# {i}\n"})
            for i in range(self.runs * 2)
        ]

        def first_baseline(s: dict) -> None:
            assert engine.baseline(bases.pop(), with_results)

        p, f = pair(self.runs, lambda i: {}, first_baseline, run_plain)
        self.add("baseline, computed and stored", p, f, "floor: one plain gate run")
        again = bases[0]
        engine.baseline(again, with_results)
        reread = Engine(self.repo, EngineSettings(target="main", workdir=self.disk, gate=with_results,
                                                  sandbox=sandbox.Settings(mode="none")))  # fmt: skip

        def reused(_s: dict) -> None:
            reread.baselines._known.clear()
            assert reread.baseline(again, with_results)

        p, f = pair(self.runs, lambda i: {}, reused, run_plain)
        self.add("baseline, reused from git", p, f, "floor: one plain gate run")

    # snapshot ---------------------------------------------------------------------------

    def snapshot(self) -> None:
        root = self.memory or self.disk
        for changed in (10, 1000):
            count = min(changed, self.size)
            names = self.names(count)
            hashed: list[int] = []

            def setup(i: int, names: list[str] = names) -> dict:
                ws = workspace.fork(self.repo, self.base, "main", root)
                self.counter += (
                    1  # content unique to each side, so neither finds the other's objects
                )
                for name in names:
                    (ws.path / name).write_text(f"changed {self.counter} {name}\n")
                copy = ws.index.with_name(ws.index.name + ".floor")
                shutil.copyfile(ws.index, copy)
                return {"ws": ws, "copy": copy}

            def plugin(s: dict) -> None:
                # A gated test's snapshot (a checkpoint's: below).
                snap = snapshots.snapshot(s["ws"])
                hashed.append(snap.hashed)
                self.repo.commit_tree(snap.tree, [self.base], "snapshot\n", AGENT)

            p, f = pair(self.runs, setup, plugin, self._raw_snapshot, self._drop_workspace)
            self.hashed[count] = max(hashed)
            self.add(f"snapshot, {count} changed", p, f, f"objects hashed: {max(hashed)}")

    def _raw_snapshot(self, s: dict) -> None:
        """The floor of a snapshot: git add, write-tree and commit-tree on a copy of the index."""
        ws = s["ws"]
        raw_git(self.repo, "add", "-A", work_tree=ws.path, index=s["copy"])
        tree = raw_git(self.repo, "write-tree", index=s["copy"])
        raw_git(self.repo, "commit-tree", tree, "-p", self.base, "-m", "floor", input=b"")

    def _drop_workspace(self, s: dict) -> None:
        workspace.remove(s["ws"])
        s["copy"].unlink(missing_ok=True)

    def checkpoint(self) -> None:
        """A checkpoint (the code as a snapshot, the agent's .git as files, one commit and
        ref) beside the plain snapshot commit of the same 10 changed files."""
        from pytest_agentgate.store import checkpoints

        root = self.memory or self.disk
        names = self.names(min(10, self.size))

        def setup(i: int) -> dict:
            ws = workspace.fork(self.repo, self.base, "main", root)
            self.counter += 1
            for name in names:
                (ws.path / name).write_text(f"checkpoint {self.counter} {name}\n")
            copy = ws.index.with_name(ws.index.name + ".floor")
            shutil.copyfile(ws.index, copy)
            return {"ws": ws, "copy": copy, "i": i}

        def plugin(s: dict) -> None:
            ws = s["ws"]
            snap = snapshots.snapshot(ws)
            checkpoints.write(
                self.repo, slug="bench", try_id=f"t{self.counter}", base=self.base,
                contents=checkpoints.Contents(
                    snap.tree, None, checkpoints.capture_agent_git(self.repo, ws.path, AGENT)
                ),
                message="step", author=AGENT,
            )  # fmt: skip

        p, f = pair(self.runs, setup, plugin, self._raw_snapshot, self._drop_workspace)
        self.add("checkpoint, 10 changed", p, f, "floor: the snapshot commit alone (raw git)")

    # preflight --------------------------------------------------------------------------

    def preflight(self) -> None:
        a, b = self.names(2)
        target = self.commit_on_base({a: "target side\n"})
        clean = self.commit_on_base({b: "attempt side\n"})
        conflict = self.commit_on_base({a: "attempt side\n"})
        for label, attempt in (("clean", clean), ("conflicting", conflict)):
            p, f = pair(
                self.runs, lambda i: {},
                lambda s, at=attempt: self.repo.merge_preview(target, at),
                lambda s, at=attempt: subprocess.run(
                    ["git", "--git-dir", str(self.repo.git_dir), "merge-tree", "--write-tree", target, at],
                    capture_output=True, check=False),
            )  # fmt: skip
            self.add(f"preflight, {label}", p, f, "floor: git merge-tree --write-tree")

    # promote ----------------------------------------------------------------------------

    def promote(self) -> None:
        a, b = self.names(2)
        for kind in ("fast-forward", "fast-forward, objects known", "merge"):

            def setup(i: int, kind: str = kind) -> dict:
                ref = f"refs/heads/bench-{kind.replace(', ', '-').replace(' ', '-')}-{self.counter}-{i}"
                self.counter += 1
                attempt = self.commit_on_base({b: f"attempt {i}\n"})
                start = (
                    self.base
                    if kind.startswith("fast-forward")
                    else self.commit_on_base({a: f"moved {i}\n"})
                )
                raw_git(self.repo, "update-ref", ref, start)
                # What a snapshot knows it added (the engine passes it; a direct call may not).
                known = (
                    [c.new_oid for c in self.repo.diff_tree(self.base, attempt, trees=True)]
                    if kind.endswith("known")
                    else None
                )
                record = {"task": "bench", "agent": "bench", "base": self.base,
                          "tree": self.repo.tree_of(attempt)}  # fmt: skip
                return {
                    "ref": ref,
                    "attempt": attempt,
                    "start": start,
                    "known": known,
                    "record": record,
                }

            def plugin(s: dict, kind: str = kind) -> None:
                to = target.for_ref(self.repo, s["ref"])
                if kind == "merge":  # every merge lands through the queue: a batch of one
                    uid = uuid.uuid4().hex[:12]
                    record = {**s["record"], "uid": uid, "base": self.base}
                    landed = LandingQueue(self.repo, to).land(
                        record, s["attempt"], "bench", no_retest
                    )
                    assert landed.status in ("promoted", "passed"), landed
                    return
                out = promote.promote(
                    to, s["attempt"], self.base, reflog_message="bench",
                    expected_tip=s["start"],  # what the preflight read
                    known_objects=s["known"],
                )  # fmt: skip
                assert out.move is not None

            def floor(s: dict, kind: str = kind) -> None:
                new = s["attempt"]
                if kind == "merge":
                    tree = raw_git(
                        self.repo, "merge-tree", "--write-tree", s["start"], s["attempt"]
                    )
                    new = raw_git(
                        self.repo,
                        "commit-tree",
                        tree,
                        "-p",
                        s["start"],
                        "-p",
                        s["attempt"],
                        "-m",
                        "m",
                    )
                raw_git(self.repo, "update-ref", s["ref"], new, s["start"])

            def teardown(s: dict) -> None:
                raw_git(self.repo, "update-ref", "-d", s["ref"])

            p, f = pair(self.runs, setup, plugin, floor, teardown)
            floor_note = (
                "update-ref NEW OLD"
                if kind.startswith("fast-forward")
                else "merge-tree + commit-tree + update-ref"
            )
            what = "promote" if kind.startswith("fast-forward") else "land through the queue"
            self.add(f"{what}, {kind}", p, f, f"floor: {floor_note}; plugin adds lock + log")

    # rollback ---------------------------------------------------------------------------

    def rollback(self) -> None:
        def setup(i: int) -> dict:
            ref = f"refs/heads/bench-rollback-{self.counter}-{i}"
            self.counter += 1
            raw_git(
                self.repo, "update-ref", ref, self.commit_on_base({self.names(1)[0]: f"bad {i}\n"})
            )
            return {"ref": ref, "tip": raw_git(self.repo, "rev-parse", ref)}

        def plugin(s: dict) -> None:
            promote.rollback(
                self.repo, s["ref"], self.base, expect=s["tip"], author=AGENT, agent="bench"
            )

        def floor(s: dict) -> None:
            tree = raw_git(self.repo, "rev-parse", f"{self.base}^{{tree}}")
            new = raw_git(self.repo, "commit-tree", tree, "-p", s["tip"], "-m", "rollback")
            raw_git(self.repo, "update-ref", s["ref"], new, s["tip"])

        p, f = pair(
            self.runs,
            setup,
            plugin,
            floor,
            lambda s: raw_git(self.repo, "update-ref", "-d", s["ref"]),
        )
        self.add("rollback", p, f, "floor: commit-tree + update-ref NEW OLD")

    # the whole gated test -----------------------------------------------------------------

    def whole(self) -> None:
        root = self.memory or self.disk
        name = self.names(1)[0]

        def setup(i: int) -> dict:
            branch = f"bench-whole-{self.counter}-{i}"
            self.counter += 1
            raw_git(self.repo, "update-ref", f"refs/heads/{branch}", self.base)
            return {"branch": branch, "i": i, "cleanup": []}

        def plugin(s: dict, mode: str = "auto") -> None:
            engine = Engine(self.repo, EngineSettings(target=s["branch"], promote=True, workdir=root,
                                                      recycle=False,
                                                      gate=GateSpec(commands=("true",), exit_code=("true",)),
                                                      sandbox=sandbox.Settings(mode=mode)))  # fmt: skip
            ws = engine.fork(task="bench")
            (ws.path / name).write_text(f"agent {s['i']}\n")
            attempt = engine.run_attempt(ws, task="bench", agent="bench")
            assert attempt.verdict.status == "promoted", attempt.verdict
            s["cleanup"] += [ws]

        box = sandbox.resolve(sandbox.Settings())

        def floor(s: dict, contained: bool = False) -> None:
            ref = f"refs/heads/{s['branch']}"
            path, gate = Path(tempfile.mkdtemp(dir=root)), Path(tempfile.mkdtemp(dir=root))
            idx, gidx = root / f"w-{s['i']}", root / f"g-{s['i']}"
            s["cleanup"] += [path, gate, idx, gidx]
            raw_git(self.repo, "read-tree", "--reset", "-u", self.base, work_tree=path, index=idx)
            (path / name).write_text(f"floor {s['i']}\n")
            raw_git(self.repo, "add", "-A", work_tree=path, index=idx)
            tree = raw_git(self.repo, "write-tree", index=idx)
            commit = raw_git(self.repo, "commit-tree", tree, "-p", self.base, "-m", "attempt")
            raw_git(self.repo, "read-tree", "--reset", "-u", tree, work_tree=gate, index=gidx)
            command = ["true"]
            if contained and box.active:  # the same command under a bare bwrap, same view
                mounts = sandbox.Mounts(gate, gate)
                for folder in (mounts.tmp, mounts.home):
                    folder.mkdir(parents=True, exist_ok=True)
                command = box.wrap(command, mounts, role=sandbox.Role("gate"))
                command = bare_bwrap(command)
            subprocess.run(command, cwd=gate, check=True)
            raw_git(self.repo, "merge-tree", "--write-tree", self.base, commit)
            raw_git(self.repo, "update-ref", ref, commit, self.base)
            record = raw_git(self.repo, "commit-tree", tree, "-p", self.base, "-m", "record")
            raw_git(
                self.repo, "update-ref", f"refs/agentgate/floor/{s['branch']}", record, "0" * 40
            )

        def teardown(s: dict) -> None:
            for item in s["cleanup"]:
                if isinstance(item, workspace.Workspace):
                    workspace.remove(item)
                elif item.is_dir():
                    shutil.rmtree(item)
                else:
                    item.unlink(missing_ok=True)

        p, f = pair(self.runs, setup, plugin, lambda s: floor(s, True), teardown)
        self.add("whole gated test (gate: true)", p, f,
                 "floor: the same git commands, the gate under a bare bwrap; plugin: sandbox auto")  # fmt: skip
        p, f = pair(self.runs, setup, lambda s: plugin(s, "none"), floor, teardown)
        self.add("whole gated test, uncontained", p, f,
                 "the same, plugin with --agentgate-sandbox=none: its own costs over git's")  # fmt: skip

        self.whole_in_session(root, name, setup, lambda s: floor(s, True), teardown)

        self.whole_with_history(setup, plugin, lambda s: floor(s, True), teardown)

    def whole_with_history(
        self, setup: Callable[[int], dict], plugin: Step, floor: Step, teardown: Step
    ) -> None:
        """The whole gated test in a repository with a history: every gated test reads the
        operations log. A process parses it once, at its first gated test; the row is every
        one after."""
        log = oplog.OpLog(self.repo.common_dir)
        for n in range(LOG_LINES):
            log.append(oplog.OpRecord(op="promote", ref=f"refs/heads/elsewhere-{n % 50}",
                                      old="a" * 40, new="b" * 40, agent="bench", task="history"))  # fmt: skip
        first = setup(-2)
        plugin(first)
        teardown(first)
        p, f = pair(self.runs, setup, plugin, floor, teardown)
        self.add(f"whole gated test, {LOG_LINES:,} log lines", p, f,
                 "as the first row, the operations log holding a history of moves; "
                 "after the process's first gated test, which parses it once")  # fmt: skip

    def whole_in_session(
        self, root: Path, name: str, setup: Callable[[int], dict], floor: Step, teardown: Step
    ) -> None:
        """As in a pytest run: one engine for the session, with its defaults (workspaces and
        gate checkouts recycled), its target moving on with each test; one test first."""
        branch = f"bench-session-{self.counter}"
        raw_git(self.repo, "update-ref", f"refs/heads/{branch}", self.base)
        session = Engine(self.repo, EngineSettings(target=branch, promote=True, workdir=root,
                                                   gate=GateSpec(commands=("true",), exit_code=("true",)),
                                                   sandbox=sandbox.Settings()))  # fmt: skip

        def in_session(s: dict) -> None:
            ws = session.fork(task="bench")
            (ws.path / name).write_text(f"session {s['i']} {time.monotonic_ns()}\n")
            attempt = session.run_attempt(ws, task="bench", agent="bench")
            assert attempt.verdict.status == "promoted", attempt.verdict

        try:
            in_session({"i": -1})
            p, f = pair(self.runs, setup, in_session, floor, teardown)
        finally:
            session.close()
        self.add("whole gated test, in a session", p, f,
                 "the same floor; plugin: one engine, recycling on, as a pytest run has")  # fmt: skip


# -- whole-process measurements ---------------------------------------------------------


def plain_run(folder: str) -> tuple[list[str], dict[str, str]]:
    """A pytest run of one plain test in ``folder`` (written there): its command and its
    environment, bytecode caching on, as on a user's machine (compiling the plugin is not
    its cost)."""
    Path(folder, "test_plain.py").write_text("def test_plain():\n    assert True\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"], env


def import_overhead(runs: int) -> tuple[float, float]:
    """Median wall time of a pytest run of one plain test, with and without the plugin."""
    with tempfile.TemporaryDirectory() as tmp:
        base, env = plain_run(tmp)
        timings: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(runs * 2):
            label = "with" if i % 2 == 0 else "without"
            cmd = base if label == "with" else [*base, "-p", "no:agentgate"]
            timings[label].append(
                clock(
                    lambda: subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, check=True)
                )
            )
        return statistics.median(timings["with"]), statistics.median(timings["without"])


def import_instructions() -> tuple[int, int] | None:
    """Instructions executed by a pytest run of one plain test, with and without the plugin,
    counted by valgrind (None where it is not installed). The wall times of such runs on a
    shared 2-core machine move by more than the plugin costs; the counts repeat (the hash
    seed fixed), so this is the figure the 5 ms target is held to, at the rate the run
    without the plugin executes them."""
    if shutil.which("valgrind") is None:
        return None
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        base, env = plain_run(tmp)
        env["PYTHONHASHSEED"] = "0"
        subprocess.run(base, cwd=tmp, env=env, capture_output=True, check=True)  # bytecode
        for extra in ([], ["-p", "no:agentgate"]):
            out = Path(tmp, "callgrind.out")
            done = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *base, *extra],
                cwd=tmp, env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            found = [line for line in done.stderr.splitlines() if "Collected :" in line]
            counts.append(int(found[-1].split(":")[-1].strip()))
    return counts[0], counts[1]


def plugin_load_ms(
    with_ms: float, without_ms: float, instructions: tuple[int, int] | None
) -> float:
    """What loading the plugin costs a run: by instructions where they were counted (printed
    here), else by the wall times' difference."""
    if instructions is None:
        return with_ms - without_ms
    with_n, without_n = instructions
    share = (with_n - without_n) / without_n
    print(f"the same by instructions (valgrind): {with_n:,} with the plugin, {without_n:,} "
          f"without (+{share:.1%}: {share * without_ms:+.1f} ms at the run's rate)")  # fmt: skip
    return share * without_ms


def peak_memory(repo_path: Path, workdir: Path) -> float:
    """Peak RSS (MiB) of a pytest process running one gated test against ``repo_path``."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_gated.py").write_text(textwrap.dedent(
            """
            import pytest

            @pytest.mark.gated(task="bench memory", gate=["true"], results="exit-code")
            def test_memory(agent_workspace):
                (agent_workspace.path / "agent.txt").write_text("x")
            """
        ))  # fmt: skip
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--agentgate-repo={repo_path}",
               "--agentgate-target=main", f"--agentgate-workdir={workdir}", "test_gated.py"]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(
                f"the gated run for the memory measurement failed: {proc.returncode}"
            )
        return usage.ru_maxrss / 1024


LOCK_WORKER = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from pytest_agentgate.land import target
from pytest_agentgate.land.queue import LandingQueue
from pytest_agentgate.land.retest import no_retest
from pytest_agentgate.engine.pool import WorkspacePool
from pytest_agentgate.git.index import IndexEntry
from pytest_agentgate.git.repo import Author, BaseRepo
repo = BaseRepo(Path(sys.argv[1]), None)
ref, base, me = sys.argv[2], repo.history.resolve_commit("main"), sys.argv[3]
waits = []
for k in range(5):
    idx = repo.index(None, Path(tempfile.mkdtemp()) / "index")
    idx.read_tree(base)
    oid = repo.hash_blob(f"{me} {k}".encode())
    idx.stage_entries([IndexEntry("100644", oid, f"lock/{me}-{k}.txt")])
    tree = idx.write_tree()
    commit = repo.commit_tree(tree, [base], "w", Author("a", "a@e"))
    uid = f"{me}-{k}"  # every merge lands through the queue
    out = LandingQueue(repo, target.for_ref(repo, ref)).land(
        {"uid": uid, "task": "lock bench", "agent": "a", "base": base, "tree": tree}, commit,
        "lock", no_retest)
    waits.append(out.lock_wait_ms)
print(json.dumps(waits))
"""


def lock_waits(repo: BaseRepo, processes: int) -> list[float]:
    ref = "refs/heads/bench-lock"
    raw_git(repo, "update-ref", ref, repo.history.resolve_commit("main"))
    root = str(Path(__file__).resolve().parent.parent)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOCK_WORKER, str(repo.git_dir), ref, f"p{i}", root],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    waits: list[float] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        waits += json.loads(out)
    landed = raw_git(repo, "ls-tree", "--name-only", ref, "lock/").splitlines()
    if len(landed) != processes * 5:
        raise RuntimeError(f"lost promotions: {len(landed)} of {processes * 5} landed")
    return waits


# -- output ---------------------------------------------------------------------------------


def _format(row: Row) -> str:
    return (
        f"{row.size:>7}  {row.operation:<30} {row.plugin_ms:>10.1f} {row.floor_ms:>10.1f} "
        f"{row.ratio:>6.2f}x {row.plugin_ms - row.floor_ms:>+9.1f}  {row.note}"
    )


#: Each row's target (issue "fixed costs back to the floor"): a ratio to its floor, the
#: floor plus some milliseconds, or another row's figure plus some milliseconds.
TARGETS: dict[str, tuple[str, float, str]] = {
    "whole gated test (gate: true)": ("ratio", 1.3, ""),
    "whole gated test, uncontained": ("ratio", 1.3, ""),
    "whole gated test, in a session": ("ratio", 1.3, ""),
    f"whole gated test, {LOG_LINES:,} log lines": ("ratio", 1.3, ""),
    "checkpoint, 10 changed": ("ratio", 1.3, ""),
    "fork, recycling on (disk)": ("ratio", 1.3, ""),
    "fork, recycling on (tmpfs)": ("ratio", 1.3, ""),
    "snapshot, 10 changed": ("ratio", 1.3, ""),
    "snapshot, 100 changed": ("ratio", 1.3, ""),
    # What a gated test's landing does: the snapshot tells the move what it added. A direct
    # promote() call without it counts the new objects for the log: one git process more.
    "promote, fast-forward, objects known": ("plus", 2.0, ""),
    "agent run(), supervisor": ("plus", 15.0, ""),
    "agent run(), supervisor + bwrap": ("row plus", 5.0, "bwrap alone, the same view"),
}


def over_target(rows: list[Row]) -> list[str]:
    """The rows over their target, one line each, with the target."""
    by = {(r.size, r.operation): r for r in rows}
    lines = []
    for row in rows:
        if row.operation not in TARGETS:
            continue
        kind, value, other = TARGETS[row.operation]
        if kind == "ratio":
            limit, said = row.floor_ms * value, f"<= {value}x the floor"
        elif kind == "plus":
            limit, said = row.floor_ms + value, f"<= the floor + {value:g} ms"
        else:
            base = by.get((row.size, other))
            if base is None:
                continue
            limit, said = base.plugin_ms + value, f"<= {other!r} + {value:g} ms"
        if row.plugin_ms > limit:
            lines.append(f"{row.size:>7}  {row.operation:<34} {row.plugin_ms:8.1f} ms, target {said} "
                         f"({limit:.1f} ms)")  # fmt: skip
    return lines


def header() -> str:
    return f"{'files':>7}  {'operation':<30} {'plugin ms':>10} {'floor ms':>10} {'ratio':>7} {'diff ms':>9}  note"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one small repository, each row measured once: a smoke run of seconds",
    )
    parser.add_argument("--json", type=Path, help="write one object per row to this file")
    parser.add_argument(
        "--runs", type=int, default=5, help="runs per measurement (median; default 5)"
    )
    parser.add_argument("--sizes", help="comma-separated file counts (default 100,5000,50000)")
    args = parser.parse_args(argv)
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([100] if args.quick else [100, 5000, 50000])
    )
    # A smoke run measures each row once: it shows every row works, not its figure.
    runs = 1 if args.quick else max(5, args.runs)
    global AGE_S
    AGE_S = 0.0 if args.quick else AGE_S
    commits = 6 if args.quick else 36
    _git.require_version()
    memory_root = (
        Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
    )
    began = time.perf_counter()
    print(f"pytest-agentgate benchmark: {platform.platform()}, Python {platform.python_version()}, "
          f"git {'.'.join(map(str, _git.version()))}, {os.cpu_count()} cores; median of {runs} runs")  # fmt: skip
    print(header())
    rows: list[Row] = []
    extra: dict[str, object] = {}
    with (
        tempfile.TemporaryDirectory(prefix="agentgate-bench-") as tmp_disk,
        tempfile.TemporaryDirectory(prefix="agentgate-bench-", dir=memory_root) as tmp_mem,
    ):
        disk, memory = Path(tmp_disk), Path(tmp_mem) if memory_root else None
        largest: Path | None = None
        for size in sizes:
            repo_path = disk / f"repo-{size}.git"
            build_repo(repo_path, size, commits)
            bench = Bench(BaseRepo(repo_path, None), size, runs, disk, memory)
            steps = [bench.fork, bench.sealed]
            if size == sizes[0]:
                steps += [bench.containment, bench.results_cost]
            for step in (
                *steps,
                bench.gate_checkouts,
                bench.snapshot,
                bench.checkpoint,
                bench.preflight,
                bench.promote,
                bench.rollback,
                bench.whole,
            ):
                step()
            rows += bench.rows
            extra[f"objects_hashed_{size}"] = bench.hashed
            largest = repo_path
        with_ms, without_ms = import_overhead(runs if args.quick else 15)
        counted = None if args.quick else import_instructions()
        waits = lock_waits(BaseRepo(largest, None), 2 if args.quick else 8) if largest else []
        rss = peak_memory(largest, memory or disk) if largest else 0.0
    print()
    print(f"pytest run with no gated test: {with_ms:.1f} ms with the plugin, {without_ms:.1f} ms without "
          f"({with_ms - without_ms:+.1f} ms)")  # fmt: skip
    print(f"lock wait, {2 if args.quick else 8} processes x 5 promotions: median {statistics.median(waits):.1f} ms, "
          f"worst {max(waits):.1f} ms")  # fmt: skip
    print(f"peak RSS of a gated pytest run on the {sizes[-1]}-file repository: {rss:.0f} MiB")
    print("objects hashed per snapshot: " + ", ".join(
        f"{size} files: " + ", ".join(f"{k} changed -> {v}" for k, v in extra[f'objects_hashed_{size}'].items())  # type: ignore[union-attr]
        for size in sizes))  # fmt: skip
    over = over_target(rows)
    if (load_ms := plugin_load_ms(with_ms, without_ms, counted)) > 5.0:
        over.append(
            f"{'':>7}  {'plugin load, no gated test':<34} {load_ms:+8.1f} ms, target <= +5 ms"
        )
    print(f"\nrows over their target: {len(over)}" + ("" if over else " (every row meets it)"))
    for line in over:
        print(line)
    print("\npublished figures of the first source article (over a network, not this machine):")
    for what, figure in ARTICLE:
        print(f"  {what:<24} {figure}")
    print(f"\ntotal {time.perf_counter() - began:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(
            [{"size": r.size, "operation": r.operation, "plugin_ms": round(r.plugin_ms, 3),
              "floor_ms": round(r.floor_ms, 3)} for r in rows], indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
