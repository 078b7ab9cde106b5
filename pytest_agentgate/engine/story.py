"""The one place that tells the engine's story in order: fork a workspace (or resume one),
let the agent work, then :meth:`Engine.run_attempt` judges and lands what it left
(:meth:`Engine._decide`: snapshot and the refusals that need no gate, the gate and its
grading, the merge preview and the landing), and writes the record.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace

from ..errors import AgentgateError, ConfigError
from ..git.repo import Author, BaseRepo
from ..judge import grader
from ..judge.baseline import HarnessBroken
from ..judge.gate import (
    Check,
    GateSpec,
    Verdict,
)
from ..land import clashes
from ..land.promote import Move
from ..land.remote_branch import RemoteBranch
from ..sandbox.process import terminate_as_interrupt
from ..store import attempts, checkpoints, records
from ..workspace import recycle as recycling
from ..workspace import snapshot as snapshots
from ..workspace import state as state_module
from ..workspace.fork import Workspace
from . import resume
from .attempt import Attempt
from .base import EngineBase
from .settings import NO_GATE


class Engine(EngineBase):
    """The lifecycle against one base repository and one target."""

    # -- what the settings say, by name --------------------------------------------------

    # -- the run ----------------------------------------------------------------------

    # -- the lifecycle, step by step ------------------------------------------------------

    def fork(
        self,
        task: str = "task",
        base: str | None = None,
        *,
        resume_from: str | None = None,
        mode: str = "full",
    ) -> Workspace:
        """A private workspace at ``base``, the pinned base, or the target's tip now.

        With ``resume_from`` (a checkpoint or a recorded attempt), the workspace starts from
        what it holds (``mode``: ``code`` or ``full``, see :meth:`resume_into`), at its base:
        an orchestrator can branch several children from one state.
        """
        self.start()
        if resume_from is not None:
            if mode not in ("code", "full"):
                raise ConfigError(
                    f"resume mode must be 'code' or 'full', got {mode!r}", source="mode"
                )
            source = self.resume_source(resume_from)
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
        try:
            attempt.state = state_module.capture(
                self.repo,
                attempt.path,
                paths,
                message=records.state_message(attempt.task),
                author=Author.for_agent(attempt.agent),
                parent=attempt.resumed_from,
                keep=state_module.Keep(self.settings.exclude, self.settings.max_state_bytes),
                skipped=attempt.state_excluded,
            )
        except state_module.StateTooLarge as exc:
            attempt.state_refused = str(exc)
            return None
        except (state_module.StateError, OSError, sqlite3.Error) as exc:
            return f"state could not be captured: {exc}"
        return None

    def prepare_retry(self, ws: Workspace, mode: str, last: Attempt) -> str:
        """Bring ``ws`` back for another try at its task after ``last`` was not accepted, and
        say what the try starts from.

        The workspace keeps its base (but after a conflict, a try that starts afresh starts on
        the target's tip): protection, the harness, the limits and the baseline
        stay those of the original base whatever a retry resumes, so an earlier try's edit
        to a protected file is judged again, never taken for the base. ``restart``: the base
        code (and the base state); ``code``: the code of the last checkpoint (else of the
        last try's snapshot) over the base, the agent's own git still at the base (it sees
        the earlier work as changes); ``full``: that code, its declared state and the
        agent's git state.
        """
        made = list(ws.checkpoints)
        if made:
            source = self.resume_source(made[-1])
        elif last.snapshot is not None:
            source = resume.ResumeSource(
                ws.base,
                last.snapshot.tree,
                last.state,
                None,
                last.record_commit or last.change_commit or last.snapshot.tree,
                "the last try's snapshot (it made no checkpoint)",
            )
        else:
            source = None
        conflicted = last.verdict is not None and last.verdict.status == "conflict"
        tip = self.repo.ref_value(self.target.ref) if conflicted else None
        if tip is not None and (mode == "restart" or source is None):
            # From the same base the try would meet the same conflict: it starts on the tip.
            recycling.recycle(ws, tip)
            ws.new_try()
            self.resume_into(ws, None, mode)
            return f"a fresh workspace at the target's tip {tip[:12]} (the last try conflicted)"
        recycling.recycle(ws, ws.base)
        ws.new_try()
        if mode == "restart" or source is None:
            self.resume_into(ws, None, mode)
            if source is None and mode != "restart":
                return f"a fresh workspace at the base (the last try left no snapshot to {mode!r} from)"
            return "a fresh workspace at the base, with the base state"
        return self.resume_into(ws, source, mode)

    def resume_source(self, spec: str) -> resume.ResumeSource:
        """What a checkpoint or a recorded attempt (a ref or an id) can resume from."""
        return resume.source_of(self.repo, spec)

    def resume_into(self, ws: Workspace, source: resume.ResumeSource | None, mode: str) -> str:
        """Write ``source`` into ``ws`` as ``mode`` says (:func:`.resume.write_into`)."""
        return resume.write_into(self.repo, ws, source, mode)

    def checkpoint(self, ws: Workspace, message: str) -> str:
        """Record ``ws``'s code, declared state and agent git state (see :mod:`.checkpoints`)."""
        author = Author.for_agent(ws.agent)
        snap = self.snapshot(ws)
        state = (
            state_module.capture(
                self.repo,
                ws.path,
                ws.state_declared,
                message=records.state_message(ws.task),
                author=author,
                keep=state_module.Keep(self.settings.exclude),
            )
            if ws.state_declared
            else None
        )
        point = checkpoints.write(
            self.repo,
            slug=attempts.slugify(ws.task or "task"),
            try_id=ws.try_id,
            base=ws.base,
            contents=checkpoints.Contents(
                snap.tree,
                state,
                checkpoints.capture_agent_git(
                    self.repo,
                    ws.path,
                    author,
                    max_files=self.settings.max_files,
                    max_bytes=self.settings.max_bytes,
                ),
            ),
            message=message,
            author=author,
        )
        ws.checkpoints.append(point.ref)
        return point.commit

    def state_held(
        self, ws: Workspace, declared: Sequence[str]
    ) -> contextlib.AbstractContextManager[None]:
        """Hold the declared state for one gated test (:func:`.resume.state_held`); put
        back afterwards unless its attempt was promoted (:meth:`put_back_state`)."""
        return resume.state_held(self.repo, ws, declared, self.settings.exclude)

    def put_back_state(self, ws: Workspace) -> None:
        """Declared state outside the workspace back to what it held before the test."""
        state_module.put_back(self.repo, ws.state_base, ws.state_declared)

    def resume(self, ws: Workspace, task: str) -> str | None:
        """Restore into ``ws`` the state of the newest earlier attempt at ``task`` that has one."""
        return resume.restore_last_state(self.repo, ws, task)

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
                attempt.target_before = self.repo.ref_value(self.target.ref)
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

    def _known_conflict(self, attempt: Attempt, spec: GateSpec) -> Verdict | None:
        """A conflict with the target's tip as it is now, found before any gate command runs
        (a merge preview costs milliseconds, a gate seconds): the gate is not spent on it.
        The preflight after the gate looks again, as the tip may move meanwhile."""
        snap = attempt.snapshot
        tip = self.repo.ref_value(self.target.ref)
        if snap is None or tip in (None, attempt.base) or spec.grading is not None:
            return None
        if not spec.commands or isinstance(self.target, RemoteBranch):
            return None  # nothing to save; a server's branch is read at the preflight
        found = self.repo.merge_preview(tip, _change_commit(self.repo, attempt))
        if not found.conflicts:
            return None
        attempt.preview = found
        clash = clashes.conflicting(self.repo, attempt.base, tip, found.conflicts)
        return Verdict(
            "conflict",
            f"preflight merge conflicts in: {', '.join(found.conflicts)} "
            f"(found before the gate ran: no gate command was run{'; ' + clash if clash else ''})",
            "preflight",
        )

    def _note_checks(self, attempt: Attempt, spec: GateSpec) -> None:
        """What the gate's checks tell beyond pass or fail: the per-test comparison, the
        passing tree's baseline (kept, free), the commands judged by exit code, flaky tests."""
        assert attempt.snapshot is not None
        for check in attempt.checks:
            if check.comparison is not None:
                attempt.results = check.comparison.as_dict()
            # Results of the base's tests on the attempt's code are not its tree's.
            whole = check.results_tree in ("", attempt.snapshot.tree)
            if check.ok and check.tests and check.name == "gate" and whole:
                self.baselines.keep(attempt.snapshot.tree, spec, check)
            if check.logs:
                attempt.logs += list(check.logs)
                attempt.results = {
                    **(attempt.results or {}),
                    "gate_log": [[name, size] for name, _, size in attempt.logs],
                }
            if check.changed_tests:
                attempt.results = {
                    **(attempt.results or {}),
                    "changed_tests": list(check.changed_tests),
                }
            if check.by_exit_code:
                attempt.results = {
                    **(attempt.results or {}),
                    "judged_by_exit_code": list(check.by_exit_code),
                }
            if check.flaky:
                attempt.results = {**(attempt.results or {}), "flaky_ids": list(check.flaky)}

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
        if (known := self._known_conflict(attempt, spec)) is not None:
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
        self._note_checks(attempt, spec)
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
        _change_commit(self.repo, attempt)
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


def _change_commit(repo: BaseRepo, attempt: Attempt) -> str:
    """The clean commit of the attempt's tree (its graded tree, if any) on its base, made
    once: the preview before the gate and the preflight after it merge the same one (a
    graded task has no preview before the gate: its commit is of the graded tree)."""
    assert attempt.snapshot is not None
    made = attempt.change_commit
    if made is None or attempt.graded_tree is not None:
        made = attempt.change_commit = repo.commit_tree(
            attempt.graded_tree or attempt.snapshot.tree,
            [attempt.base],
            records.change_message(attempt.task, attempt.agent),
            Author.for_agent(attempt.agent),
        )
    return made
