"""The one place that tells the engine's story in order: fork a workspace (or resume one),
let the agent work, then :meth:`Engine.run_attempt` judges and lands what it left
(:meth:`Engine._decide`: snapshot and the refusals that need no gate, the gate and its
grading, the merge preview and the landing), and writes the record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Self

from ..errors import AgentgateError, ConfigError
from ..git.repo import BaseRepo, MergePreview
from ..judge import grader
from ..judge.baseline import HarnessBroken
from ..judge.gate import (
    Check,
    CheckResult,
    GateContext,
    GateSpec,
    Judging,
    Verdict,
    judge,
)
from ..land import clashes
from ..land.promote import Move
from ..sandbox.process import terminate_as_interrupt
from ..store import records, schema
from ..workspace import snapshot as snapshots
from ..workspace import state as state_module
from ..workspace.fork import Workspace
from ..workspace.snapshot import Snapshot
from . import parts, resume, tries
from .attempt import Attempt
from .landing import Lander
from .settings import NO_GATE, EngineSettings


class Engine:
    """The lifecycle against one base repository and one target, told in order over the
    parts it holds (:mod:`.parts`), its lander (:mod:`.landing`) and its tries
    (:mod:`.tries`)."""

    def __init__(
        self,
        repo: BaseRepo,
        settings: EngineSettings,
        *,
        pinned_base: str | None = None,
        **options: Any,
    ) -> None:
        if options:
            raise TypeError(f"unknown argument(s): {', '.join(sorted(options))}")
        self.parts = made = parts.assemble(repo, settings, pinned_base)
        self.repo, self.settings, self.pinned_base = repo, settings, pinned_base
        self.log, self.target, self.sandbox = made.log, made.target, made.sandbox
        self.pool, self.baselines, self.queue = made.pool, made.baselines, made.queue
        self.external, self.checks_by_test = made.external, made.checks_by_test
        #: What the start of the run completed for earlier runs (records of pending moves).
        self.settled: list[str] = []
        #: How long this process's last gate took (seconds; 0: none yet), for early re-tests.
        self._last_gate_s = 0.0
        self._started = False
        #: Told each step an attempt enters (snapshot, gate, queue...); None: nobody listens.
        self.on_step: Callable[[str], None] | None = None
        #: How a passed attempt lands: its record, the queue, the batch's re-test.
        self.lander = Lander(
            repo, self.target, self.queue, self.baselines, settings, self.pool,
            self.checks_by_test, self._step,
        )  # fmt: skip

    @classmethod
    def open(
        cls,
        repo: str | Path,
        target: str | None = None,
        *,
        sources: dict[str, str] | None = None,
        settings: EngineSettings | None = None,
        **options: Any,
    ) -> Self:
        """Open the repository, check names and git's version, resolve the base, and make
        the engine's parts (see :func:`.parts.opened`)."""
        base_repo, settings, pinned = parts.opened(repo, target, sources, settings, options)
        return cls(base_repo, settings, pinned_base=pinned)

    @property
    def gate(self) -> GateSpec:
        return self.settings.gate

    @property
    def agent(self) -> str:
        return self.settings.agent

    @property
    def workdir(self) -> Path:
        return self.pool.workdir

    @property
    def ref(self) -> str:
        """The ref attempts are judged against and promoted to (``target.ref``)."""
        return self.target.ref

    def start(self, run_id: str | None = None) -> None:
        """Begin a run: settle what earlier runs left; a dry run resets its scratch ref once.

        Every process of one run (pytest-xdist workers) passes the same ``run_id``, so the
        first one resets the scratch ref and the others judge against what it accumulates.
        """
        if self._started:
            return
        self._started = True
        schema.ensure_layout(self.repo)  # a newer layout is refused before anything is written
        self.settled = self.target.start(run_id or self.settings.run_id)
        # Attempts an earlier run here posted on a server and died waiting for: taken back,
        # or, when another machine's leader landed one meanwhile, recorded now.
        self.settled += self.queue.settle_posted()

    def close(self) -> None:
        """End this process's early re-tests; remove the kept workspaces and the run's
        private directory."""
        try:
            self.queue.early.close()
        finally:
            self.pool.close()

    def release(self, ws: Workspace) -> None:
        """Hand a workspace back once its attempt is recorded: kept for reuse, or removed."""
        self.pool.release(ws)

    def private_root(self) -> Path:
        return self.pool.private_root()

    def gate_context(self) -> GateContext:
        return self.pool.gate_context()

    def snapshot(self, ws: Workspace) -> Snapshot:
        """What ``ws`` holds as a tree (a checkpoint's, or the attempt's own)."""
        s = self.settings
        return snapshots.snapshot(
            ws,
            exclude=s.exclude,
            max_files=s.max_files,
            max_bytes=s.max_bytes,
            allow_symlinks=s.allow_symlinks,
        )

    def judge(
        self, attempt: Attempt, spec: GateSpec, extra_checks: Sequence[Check] = ()
    ) -> list[CheckResult]:
        assert attempt.snapshot is not None
        base = self.baselines.stored_of_commit(attempt.base, spec)
        return judge(
            self.repo,
            attempt.snapshot,
            spec,
            attempt,
            self.gate_context(),
            extra_checks,
            Judging(
                baseline=base.tests if base is not None else None,
                expected=base.fingerprint if base is not None and base.fingerprint else None,
            ),
            allow_symlinks=self.settings.allow_symlinks,
        )

    def baseline(self, base: str, spec: GateSpec) -> dict[str, str] | None:
        """The gate's per-test results on ``base``'s tree (see :class:`Baselines`)."""
        return self.baselines.of_commit(base, spec)

    def check_harness(self, specs: Sequence[GateSpec]) -> list[str]:
        """Before any agent works: can the gate judge anything at all? Returns warnings
        (see :func:`.parts.check_harness`)."""
        return parts.check_harness(self.parts, specs)

    def preflight(self, attempt: Attempt) -> MergePreview:
        """A deep three-way merge of the attempt with the target's current tip; moves nothing."""
        return parts.preflight(self.parts, attempt)

    def _step(self, attempt: Attempt, step: str) -> None:
        """The attempt enters ``step``: kept on it (an interrupt's record names it) and told
        to :attr:`on_step` (the plugin's progress line)."""
        attempt.step = step
        if self.on_step is not None:
            with contextlib.suppress(Exception):  # a display must never change a verdict
                self.on_step(step)

    def note_external_move(self, tip: str, agent: str = "") -> str | None:
        """Log (once) a target tip no agentgate record accounts for (:mod:`.land.external`)."""
        return self.external.note(tip)

    def fork(
        self,
        task: str = "task",
        base: str | None = None,
        *,
        resume_from: str | None = None,
        mode: str = "full",
    ) -> Workspace:
        """A private workspace at ``base``, the pinned base, or the target's tip now.

        With ``resume_from`` (a checkpoint, a recorded attempt, or ``"latest"``: the newest
        earlier attempt at ``task``, unless there is none or it landed), the workspace starts from
        what it holds (``mode``: ``code`` or ``full``, see :meth:`resume_into`), at its base:
        an orchestrator can branch several children from one state.
        """
        self.start()
        if resume_from is not None and mode not in ("code", "full"):
            raise ConfigError(f"resume mode must be 'code' or 'full', got {mode!r}", source="mode")
        source = self.resume_source(resume_from, task) if resume_from is not None else None
        if source is not None:
            ws = self.pool.fork(source.base, task)
            ws.task, ws.checkpointer = task, self.checkpoint
            self.resume_into(ws, source, mode)
            return ws
        at = base or self.pinned_base or self.target.tip()
        if at is None:
            raise ConfigError(f"the target {self.target.label} has no tip", source="target")
        ws = self.pool.fork(at, task)
        ws.task, ws.checkpointer = task, self.checkpoint
        return ws

    def capture_state(self, attempt: Attempt, paths: Sequence[str]) -> str | None:
        """Commit the declared state the agent left into ``attempt.state``; say what failed."""
        return tries.capture_state(self.repo, self.settings, attempt, paths)

    def prepare_retry(self, ws: Workspace, mode: str, last: Attempt) -> str:
        """Bring ``ws`` back for another try after ``last`` was not accepted; what the try
        starts from (see :func:`.tries.prepare_retry`)."""
        return tries.prepare_retry(self.repo, self.target.ref, ws, mode, last)

    def resume_source(self, spec: str, task: str) -> resume.ResumeSource | None:
        """What a checkpoint or a recorded attempt (a ref or an id) can resume from; for
        ``"latest"``, the newest earlier attempt at ``task`` unless it landed, else None."""
        if spec == resume.LATEST:
            return resume.latest_of(self.repo, task)
        return resume.source_of(self.repo, spec)

    def resume_into(self, ws: Workspace, source: resume.ResumeSource | None, mode: str) -> str:
        """Write ``source`` into ``ws`` as ``mode`` says (:func:`.resume.write_into`)."""
        return resume.write_into(self.repo, ws, source, mode)

    def checkpoint(self, ws: Workspace, message: str) -> str:
        """Record ``ws``'s code, declared state and agent git state (see :mod:`.checkpoints`)."""
        return tries.checkpoint(self.repo, self.settings, ws, message, self.snapshot(ws))

    def state_held(
        self, ws: Workspace, declared: Sequence[str]
    ) -> contextlib.AbstractContextManager[None]:
        """Hold the declared state for one gated test (:func:`.resume.state_held`); put
        back afterwards unless its attempt was promoted (:meth:`put_back_state`)."""
        return resume.state_held(self.repo, ws, declared, self.settings.exclude)

    def put_back_state(self, ws: Workspace) -> None:
        """Declared state outside the workspace back to what it held before the test."""
        state_module.put_back(self.repo, ws.state_base, ws.state_declared)

    # -- the whole story -----------------------------------------------------------------

    def run_attempt(
        self,
        ws: Workspace,
        *,
        task: str,
        agent: str | None = None,
        test: str = "",
        spec: GateSpec | None = None,
        test_failure: str | None = None,
        extra_checks: Sequence[Check] = (),
        state: Sequence[str] = (),
        agent_error: str | None = None,
    ) -> Attempt:
        """Judge what the agent left in ``ws`` and promote it if everything passes.

        ``test_failure`` is the reason the test body failed, if it did (that rejects);
        ``agent_error`` why its agent could not finish (a timeout: that is an ``error``).
        ``state`` names paths outside the code (a database, an artifact) to carry with the
        attempt. Whatever happens, the attempt is recorded; errors become an ``error`` verdict.
        """
        if agent is not None:
            records.check_name(agent, "agent name", "run_attempt(agent=...)")
        attempt = Attempt(task=task, agent=agent or self.agent, workspace=ws, test=test)
        attempt.sandbox = ws.sandbox.label
        attempt.resumed_from = ws.resumed_from
        attempt.try_number = ws.attempt
        attempt.checkpoints = list(ws.checkpoints)
        attempt.notes = dict(ws.notes)
        attempt.timings["fork"] = ws.fork_ms
        spec = spec or self.gate
        attempt.protect, attempt.max_changed_lines = spec.protect, spec.max_changed_lines
        attempt.landing = spec.landing
        ws.end_processes()
        try:
            with terminate_as_interrupt():
                attempt.verdict = self._decide(
                    attempt, spec, test_failure, extra_checks, state, agent_error
                )
        except AgentgateError as exc:
            attempt.verdict = Verdict("error", str(exc), "engine")
        except OSError as exc:  # a full disk, an I/O error: before the move, nothing moved
            moved = attempt.move is not None
            promotes = self.target.promotes
            attempt.verdict = Verdict(
                "promoted" if moved and promotes else "passed" if moved else "error",
                f"a write failed: {exc}" + ("" if moved else "; nothing moved"),
                "" if moved else "engine",
            )
        except BaseException as exc:
            # Ctrl-C, SIGTERM (CI cancelling the job), pytest-timeout's Failed: the record
            # says so, and where, never "not judged yet"; the interrupt then goes on.
            if attempt.move is None:
                how = (
                    "interrupted"
                    if isinstance(exc, KeyboardInterrupt)
                    else f"stopped ({type(exc).__name__}: {str(exc)[:80]})"
                )
                attempt.verdict = Verdict("error", f"{how} during {attempt.step}", "interrupt")
            else:  # it landed first (a leader landed it as it waited): the record says so
                attempt.verdict = Verdict(
                    "promoted" if self.target.promotes else "passed",
                    "landed; then interrupted before its test reported",
                    "",
                )
            raise
        finally:
            self.queue.arrived(attempt.uid)
            clock = time.perf_counter()
            if attempt.target_before is None:  # decided before preflight read it
                attempt.target_before = self.repo.refs.value(self.target.ref)
            if attempt.record_problem is None:
                try:
                    self.lander.record(attempt)
                except (AgentgateError, OSError, ValueError) as exc:
                    attempt.record_problem = f"the attempt record could not be written: {exc}"
            attempt.timings["record"] = (time.perf_counter() - clock) * 1000
        return attempt

    def _landed(self, attempt: Attempt, move: Move | None) -> None:
        """Keep the move that landed ``attempt``, and note a move outside agentgate that it
        merged over: one between the tip the preflight read and the tip the move replaced
        (a person's push while the gate ran), which the preflight could not have seen."""
        attempt.move = move
        if move is None:
            return
        self.external.known.add(move.new)
        before = attempt.target_before
        if not attempt.external_move and before is not None and move.old not in (before, None):
            attempt.external_move = self.external.between(before, move.old)

    def _decide(
        self,
        attempt: Attempt,
        spec: GateSpec,
        test_failure: str | None,
        extra_checks: Sequence[Check],
        state: Sequence[str] = (),
        agent_error: str | None = None,
    ) -> Verdict:
        """The lifecycle after the agent, in order: snapshot, the refusals that need no
        gate, the gate (and grading), the merge preview, the promotion."""
        lap = _Laps(attempt.timings)
        found = self._snapshot_and_refuse(attempt, spec, test_failure, state, agent_error, lap)
        if found is not None:
            return found
        found, spec = self._gate_and_grade(attempt, spec, extra_checks, lap)
        if found is not None:
            return found
        return self._preflight_and_promote(attempt, spec, lap)

    def _snapshot_and_refuse(
        self,
        attempt: Attempt,
        spec: GateSpec,
        test_failure: str | None,
        state: Sequence[str],
        agent_error: str | None,
        lap: _Laps,
    ) -> Verdict | None:
        """Snapshot what the agent left (and its state), then what is decided without a
        gate: a refused snapshot or state, the agent's or the test's failure, no change, no
        gate, a conflict the tip already shows."""
        # contain -> snapshot
        self._step(attempt, "snapshot")
        refused = None
        try:
            attempt.snapshot = self.snapshot(attempt.workspace)
        except snapshots.SnapshotRefused as exc:
            refused = Verdict("rejected", exc.reason, "snapshot")
        finally:
            lap("snapshot")
        # The state is what the agent left too, whatever the verdict: captured either way.
        problem = self.capture_state(attempt, state) if state else None
        if refused is not None:
            return refused
        assert attempt.snapshot is not None
        if problem is not None:
            return Verdict("error", problem, "state")
        if attempt.state_refused:
            return Verdict("rejected", attempt.state_refused, "state")
        if agent_error is not None:
            return Verdict("error", agent_error, "agent")
        if test_failure is not None:
            return Verdict("rejected", f"the test failed: {test_failure}", "test")
        ws = attempt.workspace
        if ws.network_strict and ws.refused_count:
            shown = ", ".join(ws.refused[:3]) + (", ..." if ws.refused_count > 3 else "")
            return Verdict(
                "rejected",
                f"the agent reached for {ws.refused_count} connection(s) its network's "
                f"allow-list refuses ({shown}); --agentgate-agent-network-strict rejects that",
                "network",
            )
        if attempt.snapshot.tree == attempt.snapshot.base_tree:
            return Verdict("rejected", "no changes", "snapshot")
        if not spec.has_gate:
            return Verdict("error", NO_GATE, "gate")
        if (known := parts.known_conflict(self.parts, attempt, spec)) is not None:
            return known
        return None

    def _gate_and_grade(
        self, attempt: Attempt, spec: GateSpec, extra_checks: Sequence[Check], lap: _Laps
    ) -> tuple[Verdict | None, GateSpec]:
        """Run the gate (announced to the queue first, so a leader may wait for it) and the
        grading; a verdict when they decide, and the spec the landing re-tests with."""
        timings, snapshot = attempt.timings, attempt.snapshot
        assert snapshot is not None  # taken by _snapshot_and_refuse
        # gate -> verdict
        self._step(attempt, "gate")
        if spec.commands and self.settings.retest and spec.grading is None:
            # A leader may wait for it.
            attempt.batch_key = self.lander.batch_key(spec)
            attempt.gate_began = self.queue.announce(
                attempt.uid,
                attempt.batch_key,
                tree=snapshot.tree,
                base=attempt.base,
            )
            self.queue.early.begin(
                attempt.uid,
                attempt.batch_key,
                self.lander.batch_retest(spec),
                last_gate_s=self._last_gate_s,
            )
        gate_spec = replace(spec, commands=()) if spec.grading is not None else spec
        try:
            attempt.checks = self.judge(attempt, gate_spec, extra_checks)
        except HarnessBroken as exc:
            return Verdict("error", str(exc), "baseline", exc.output), spec
        lap("gate")
        self._last_gate_s = timings["gate"] / 1000
        parts.note_checks(self.baselines, attempt, spec)
        failed = next((c for c in attempt.checks if not c.ok), None)
        if failed is not None:
            if failed.harness_error:
                return Verdict("error", failed.message, failed.name, failed.output), spec
            return Verdict("rejected", failed.message, failed.name, failed.output), spec
        if spec.grading is not None:
            self._step(attempt, "grading")
            try:
                graded = grader.grade(
                    self.repo,
                    self.baselines,
                    self.gate_context(),
                    attempt.base,
                    snapshot,
                    spec,
                )
            except HarnessBroken as exc:
                return Verdict("error", str(exc), "grade", exc.output), spec
            lap("grade")
            if graded.plan is not None:
                attempt.graded_baseline = graded.plan.on_base
            if graded.results:
                attempt.results = {**(attempt.results or {}), **graded.results}
                attempt.graded_tree = graded.tree
            if graded.verdict is not None:
                return graded.verdict, spec
            assert graded.plan is not None
            spec = graded.plan.spec
        return None, spec

    def _preflight_and_promote(self, attempt: Attempt, spec: GateSpec, lap: _Laps) -> Verdict:
        """The merge preview with the tip, then the landing (the queue's re-test on a
        moved tip); the record is written by :meth:`land` right after the move."""
        # preflight -> merge preview
        self._step(attempt, "preflight")
        parts.change_commit(self.repo, attempt)
        attempt.preview = self.preflight(attempt)
        lap("preflight")
        if attempt.preview.conflicts:
            tip = attempt.target_before or ""
            clash = clashes.conflicting(self.repo, attempt.base, tip, attempt.preview.conflicts)
            return Verdict(
                "conflict",
                f"preflight merge conflicts in: {', '.join(attempt.preview.conflicts)}"
                + (f" ({clash})" if clash else ""),
                "preflight",
            )
        # promote -> the target moves; record (written by land() right after the move)
        self._step(attempt, "promote")
        outcome = self.lander.land(attempt, spec)
        lap("promote")
        if outcome.conflicts:
            return Verdict(
                "conflict", f"merge conflicts in: {', '.join(outcome.conflicts)}", "promote"
            )
        if outcome.retest_failure is not None:
            return Verdict(
                "rejected",
                f"re-test on the merged tree failed: {outcome.retest_failure}",
                "retest",
                outcome.retest_output,
            )
        self._landed(attempt, outcome.move)
        if outcome.already is not None:
            return Verdict("promoted" if self.target.promotes else "passed", outcome.already, "")
        problem = outcome.move.problem if outcome.move else None
        return Verdict("promoted" if self.target.promotes else "passed", problem or "", "")


class _Laps:
    """Each step's wall time since the one before, in milliseconds, into ``timings``."""

    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings
        self.clock = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = (now - self.clock) * 1000
        self.clock = now
