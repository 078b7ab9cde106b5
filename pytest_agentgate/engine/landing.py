"""How a passed attempt lands: its record's fields and message, the queue it waits in (a
batch's re-test with the baselines of its bases), and how another machine's posted attempt
is judged before a batch takes it.

A part the engine holds (:class:`Lander`), given the engine's parts it uses."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ..errors import AgentgateError
from ..git.repo import BaseRepo
from ..judge import results
from ..judge.baseline import Baselines, Stored, either_passed
from ..judge.channel import unexpected
from ..judge.gate import (
    Check,
    GateSpec,
    Judging,
    Verdict,
    check_limits,
    run_commands,
)
from ..land.landings import Landed, landing_commit
from ..land.promote import Move, PromoteOutcome, promote
from ..land.queue import LandingQueue, Outcome
from ..land.retest import BatchRetest, Retested, no_retest
from ..land.target import Target
from ..remote import server_records
from ..sandbox.process import TAIL_LINES, Running
from ..store import attempts, checkpoints, records
from ..store.record import Record, Retest, Status
from ..workspace import snapshot as snapshots
from ..workspace.fork import Workspace
from .attempt import Attempt, posted_checks
from .pool import WorkspacePool
from .settings import EngineSettings


class Lander:
    """The engine's landing: records, the queue, the batch re-test."""

    def __init__(
        self,
        repo: BaseRepo,
        target: Target,
        queue: LandingQueue,
        baselines: Baselines,
        settings: EngineSettings,
        pool: WorkspacePool,
        checks_by_test: Mapping[str, tuple[Check, ...]],
        step: Callable[[Attempt, str], None],
    ) -> None:
        self.repo = repo
        self.target = target
        self.queue = queue
        self.baselines = baselines
        self.settings = settings
        self.pool = pool
        #: The Python checks of each test of this run (the engine's, filled as tests run).
        self.checks_by_test = checks_by_test
        #: Tell the engine an attempt enters a step (the queue).
        self._step = step

    def land(self, attempt: Attempt, spec: GateSpec) -> PromoteOutcome:
        """Land the attempt's change commit on the target (or the dry-run ref): a
        fast-forward when the target is still at its base, else through the queue, the one
        way a merge lands (a batch of one when nothing else waits)."""
        assert attempt.change_commit is not None
        self._check_linear(attempt)
        retest, key = self._retest_for(attempt, spec)
        promotes = self.target.promotes
        status: Status = "promoted" if promotes else "passed"
        # The queue is for merges: a target still at the attempt's base (as the preflight
        # just read it) is a fast-forward, which needs no re-test and no waiting. Should the
        # target have moved meanwhile, the attempt joins the queue after all. Another
        # machine leading now would make a fast-forward wait for its whole batch, and then
        # need a merge: it joins that leader's batch. A queued attempt's intent stays until
        # its entry is written (the queue removes it then), so a leader gathering a batch
        # waits for it rather than starting without it.
        if attempt.target_before != attempt.base or self.target.busy():
            return self._land_queued(attempt, spec, status, retest, key)
        self.queue.arrived(attempt.uid)  # judged: no leader need wait for it any more

        def on_moved(move: Move) -> bool:
            """The target moved: write the record now, before the checked-out files follow."""
            attempt.move = move
            attempt.verdict = Verdict(status)
            try:
                self.record(attempt)
            except (AgentgateError, OSError, ValueError) as exc:
                attempt.record_problem = (
                    f"the target moved, but its attempt record could not be written ({exc}); "
                    "the next run or agentgate command completes it"
                )
                return False
            return True

        pending = self.record_of(attempt, status)
        landed: str | Landed = attempt.change_commit
        if pending.landing == "squash":  # one commit of its own, on the base too
            tree = self.repo.tree_of(attempt.change_commit)
            landed = landing_commit(self.repo, attempt.base, attempt.change_commit, tree, pending)
        outcome = promote(
            self.target,
            landed,
            attempt.base,
            reflog_message=records.landing_reflog(
                attempt.task, attempt.agent, dry_run=not promotes
            ),
            expected_tip=attempt.target_before,
            known_objects=attempt.snapshot.new_objects if attempt.snapshot else None,
            pending=pending,
            on_moved=on_moved,
        )
        if outcome.needs_queue:
            return self._land_queued(attempt, spec, status, retest, key)
        return outcome

    def _check_linear(self, attempt: Attempt) -> None:
        """A squash or a rebase needs the attempt's base in the target's history: off it
        (a pinned base on another branch), the commits between are not the tip's ancestors,
        and the next merge would take an older merge base, bringing back or clashing with
        changes the attempt never made. A merge keeps the base as a parent and does not."""
        tip = attempt.target_before
        if attempt.landing == "merge" or not tip or tip == attempt.base:
            return
        if not self.repo.history.is_ancestor(attempt.base, tip):
            raise AgentgateError(
                f"--agentgate-land={attempt.landing} needs the attempt's base in "
                f"{self.target.label}'s history, and {attempt.base[:12]} is not in it (a "
                "--agentgate-base on another branch?): land it as a merge "
                "(--agentgate-land=merge), or fork from the target"
            )

    def _retest_for(self, attempt: Attempt, spec: GateSpec) -> tuple[BatchRetest, str]:
        """How a merge of the attempt is re-tested in the queue, and the batch key of the
        attempts that may share that re-test. Untested merges (no gate command, or re-tests
        off) batch only with each other; a graded attempt, held to its own graded baseline,
        is a batch of one."""
        if not (spec.commands and self.settings.retest):
            if spec.commands:
                attempt.retest_skipped = True
            return no_retest, f"untested-{self.batch_key(spec)}"
        if attempt.graded_tree is not None:
            return self._graded_retest(attempt, spec), f"graded-{attempt.uid}"
        return self.batch_retest(spec), attempt.batch_key or self.batch_key(spec)

    def _graded_retest(self, attempt: Attempt, spec: GateSpec) -> BatchRetest:
        """The re-test of a graded attempt's merge: held to what passed in its graded run on
        its base and on the tip it merges onto (a test another landing fixed must not break
        again in the merge)."""
        base_results = attempt.graded_baseline

        def graded_retest(
            tree: str,
            tip: str,
            bases: Sequence[str],
            *,
            ahead: bool = False,
            running: Running | None = None,
            reuse: Retested | None = None,
        ) -> Retested:
            on_tip = self.baselines.of_tip(tip, spec)
            held = either_passed(base_results, on_tip.tests if on_tip else None)
            expected = self._expected(spec, on_tip, [attempt.base])
            # The merge's harness is the tip's: its bytes are the trusted ones (a tip run
            # ahead is not landed yet: none are).
            trusted = None if ahead else self.repo.tree_of(tip)
            return self._retest_tree(tree, spec, held, expected, running, trusted)

        return graded_retest

    def _land_queued(
        self, attempt: Attempt, spec: GateSpec, status: Status, retest: BatchRetest, key: str
    ) -> PromoteOutcome:
        """Land through the queue: one re-test for a batch of attempts that share this gate
        (see :mod:`.queue`); the verdict may come from another process that led."""
        assert attempt.change_commit is not None
        self._step(attempt, "queue")
        gate_s = attempt.timings.get("gate", 0.0) / 1000
        try:
            found = self._queue_land(attempt, spec, status, retest, key, gate_s)
            attempt.landed_for_others = list(found.landed_for_others)
        except BaseException:
            # Interrupted while it waited: a leader (here, or another machine's) may have
            # landed it just before. Then the move stands, and its record says so (the
            # leader here wrote it; for another machine's landing it is written here).
            landed = self.queue.verdict(attempt.uid)
            if landed is not None:
                if landed.status in ("promoted", "passed"):
                    if landed.kind != "already":
                        attempt.move = self._move_of(landed)
                    attempt.record_ref = landed.record_ref
                    attempt.record_commit = landed.record_commit
                self.queue.discard(attempt.uid)
            # Else it was withdrawn, or (the server out of reach) it is still posted there:
            # its entry stays, for the next run here to take back.
            raise
        return self._queued_outcome(attempt, found)

    def batch_retest(self, spec: GateSpec) -> BatchRetest:
        """How this run re-tests a merged tree of ``spec``'s batches (see :mod:`.queue`)."""

        def batch_retest(
            tree: str,
            tip: str,
            bases: Sequence[str],
            *,
            ahead: bool = False,
            running: Running | None = None,
            reuse: Retested | None = None,
        ) -> Retested:
            # Held to what passed on every attempt's base and on the tip: a test another
            # landing fixed must not break again in the merge. A run ahead stands on a tip
            # not tested yet: the queue checks the tip's own results against it afterwards.
            on_tip = None if ahead else self.baselines.of_tip(tip, spec)
            held = on_tip.tests if on_tip is not None else None
            for base in dict.fromkeys(bases):
                held = either_passed(self.baselines.of_commit(base, spec), held)
            expected = self._expected(spec, on_tip, bases)
            if reuse is not None and _reusable(reuse, held, expected, spec):
                return reuse  # run early, on exactly this tree: as good as running it now
            # The merge's harness is the tip's: its bytes are the trusted ones (a tip run
            # ahead is not landed yet: none are).
            trusted = None if ahead else self.repo.tree_of(tip)
            return self._retest_tree(tree, spec, held, expected, running, trusted)

        return batch_retest

    def _retest_tree(
        self,
        tree: str,
        spec: GateSpec,
        held: Mapping[str, str] | None,
        expected: frozenset[str] | None,
        running: Running | None,
        trusted: str | None,
    ) -> Retested:
        """Run the gate on a merged tree, held to ``held``; a pass is kept as that tree's
        baseline (it comes for free). Bytecode is compiled from ``trusted``'s bytes only."""
        how = Judging("retest", held, expected, trusted=trusted)
        result = run_commands(self.repo, tree, spec, self.pool.gate_context(), how, running)
        if result.ok and result.tests:
            self.baselines.keep(tree, spec, result)
        return Retested(
            result.ok, result.message, result.output, result.tests,
            fingerprint=result.fingerprint, fault=not result.ok and result.never_ran,
        )  # fmt: skip

    def _expected(
        self, spec: GateSpec, on_tip: Stored | None, bases: Sequence[str]
    ) -> frozenset[str] | None:
        """What the gate's pytest must load on a merged tree: what it loaded on the tip it
        lands on (a person may have changed the configuration there), else on a base."""
        if on_tip is not None and on_tip.fingerprint:
            return on_tip.fingerprint
        for base in bases:
            found = self.baselines.stored_of_commit(base, spec)
            if found is not None and found.fingerprint:
                return found.fingerprint
        return None

    def _queue_land(
        self,
        attempt: Attempt,
        spec: GateSpec,
        status: Status,
        batch_retest: BatchRetest,
        key: str,
        gate_s: float,
    ) -> Outcome:
        assert attempt.change_commit is not None
        return self.queue.land(
            self.record_of(attempt, status),
            attempt.change_commit,
            key,
            batch_retest,
            known_objects=attempt.snapshot.new_objects if attempt.snapshot else (),
            gate_s=gate_s,
            began=attempt.gate_began,
            judge=lambda change, base, declared: self.judge_posted(spec, change, base, declared),
        )

    def _move_of(self, found: Outcome) -> Move:
        return Move(
            self.target.moved_ref,
            found.old,
            found.new,
            found.kind,
            found.tree,
            found.retested,
            found.lock_wait_ms,
            found.reason or None,
        )

    def _queued_outcome(self, attempt: Attempt, found: Outcome) -> PromoteOutcome:
        """What the queue's verdict means for the attempt."""
        attempt.batch = found.batch
        if found.status == "conflict":
            return PromoteOutcome(None, conflicts=tuple(found.conflicts))
        if found.status == "rejected":
            return PromoteOutcome(None, retest_failure=found.reason, retest_output=found.output)
        if found.status == "error":
            raise AgentgateError(found.reason)
        if found.kind == "already":
            return PromoteOutcome(None, already=found.reason)
        move = self._move_of(found)
        attempt.move = move
        attempt.record_ref, attempt.record_commit = found.record_ref, found.record_commit
        attempt.record_problem = found.record_problem
        return PromoteOutcome(move)

    def judge_posted(
        self, spec: GateSpec, change_commit: str, base: str, declared: Record
    ) -> str | None:
        """Why another machine's posted attempt may not join this gate's batch (None: it
        may): its tree judged as this run judges its own agents' files, protection, the
        harness and the limits this run's own, made stricter (never looser) by what the
        attempt declared of its own test's."""
        s = self.settings
        try:
            snap = snapshots.tree_snapshot(
                self.repo, base, self.repo.tree_of(change_commit), exclude=s.exclude,
                max_files=s.max_files, max_bytes=s.max_bytes, allow_symlinks=s.allow_symlinks,
            )  # fmt: skip
        except snapshots.SnapshotRefused as exc:
            return exc.reason
        if not snap.changes:
            return "no changes"
        protect = (*spec.protect, *declared.protect)
        limit, declared_limit = spec.max_changed_lines, declared.max_changed_lines
        if declared_limit is not None:
            limit = declared_limit if limit is None else min(limit, declared_limit)
        found = check_limits(
            self.repo, snap, replace(spec, protect=tuple(dict.fromkeys(protect)),
                                     max_changed_lines=limit),
            s.allow_symlinks,
        )  # fmt: skip
        if not found.ok:
            return found.message
        test = declared.test
        return posted_checks(self.repo, snap, test, self.checks_by_test.get(test, ()),
                             self.pool.private_root())  # fmt: skip

    def batch_key(self, spec: GateSpec) -> str:
        """Which attempts may share a re-test: the same gate, environment and sandbox, and
        the same tests allowed to go (one batch's re-test judges every attempt in it so)."""
        import hashlib

        material = repr(
            (self.baselines.key("batch", spec), spec.timeout, spec.rerun, spec.flaky, spec.env,
             sorted(spec.allow_removed))
        )  # fmt: skip
        return hashlib.sha256(material.encode()).hexdigest()[:24]

    def record_of(self, attempt: Attempt, status: Status) -> Record:
        """The attempt's record, with ``status`` as its verdict: enough to write it later."""
        snap = attempt.snapshot
        retest: Retest = (
            "passed"
            if attempt.move is not None and attempt.move.retested
            else "skipped"
            if attempt.retest_skipped
            else ""
        )
        return Record(
            uid=attempt.uid,
            task=attempt.task,
            agent=attempt.agent,
            test=attempt.test,
            status=status,
            base=attempt.base,
            tree=snap.tree if snap else self.repo.tree_of(attempt.base),
            excluded=(*(snap.excluded if snap else ()), *attempt.state_excluded),
            state=attempt.state,
            sandbox=attempt.sandbox,
            transcript=_transcript_tail(attempt.workspace),
            refused=_refused(attempt.workspace),
            results=attempt.results,
            graded_tree=attempt.graded_tree or "",
            try_number=attempt.try_number,
            protect=tuple(attempt.protect),
            max_changed_lines=attempt.max_changed_lines,
            # The folder of the try's checkpoints (refs/agentgate/checkpoints/<this>/<k>).
            checkpoints=attempt.checkpoints[-1].removeprefix(checkpoints.PREFIX).rsplit("/", 1)[0]
            if attempt.checkpoints
            else "",
            retest=retest,
            landing=attempt.landing,
        )

    def record(self, attempt: Attempt) -> str:
        """Write the attempt's record commit and its ref, now that the verdict is final.

        Written once: a promotion writes it right after the target moved (see :meth:`land`).
        """
        if attempt.record_ref is not None:
            return attempt.record_ref
        v = attempt.verdict
        output = "" if v.accepted else (v.output or attempt.workspace.output_tail())
        ref, commit = attempts.write_record(
            self.repo,
            self.record_of(attempt, v.status),
            reason=v.reason,
            check=v.check,
            output=output,
            landed=attempt.move.new if attempt.move and self.target.promotes else None,
            known_objects=attempt.snapshot.new_objects if attempt.snapshot else (),
        )
        self._keep_logs(attempt, ref, commit)
        server = self.target.records()
        if server is not None:  # on the server too, its number claimed there
            ref, problem = server_records.publish(self.repo, server, ref, commit)
            problems = [problem] if problem else []
            if server.push_state:  # a checkpoint carries its state and the agent's git
                for point in attempt.checkpoints:
                    found = self.repo.refs.value(point)
                    if found is not None:
                        problems.append(
                            server_records.publish_ref(self.repo, server, point, found) or ""
                        )
            problems = [p for p in problems if p]
            if problems and attempt.record_problem is None:
                attempt.record_problem = "; ".join(problems)
        attempt.record_ref, attempt.record_commit = ref, commit
        return ref

    def _keep_logs(self, attempt: Attempt, ref: str, commit: str) -> None:
        """The whole gate log beside the record; its loss is said, never raised (the record
        holds the part that names the cause)."""
        from ..git.repo import Author
        from ..store import logs

        kept = list(attempt.logs)
        for number, (raw, size) in enumerate(attempt.workspace.transcripts, 1):
            kept.append((f"agent transcript {number}", raw.decode("utf-8", "replace"), size))
        try:
            logs.write(self.repo, ref, commit, kept, Author.for_agent(attempt.agent))
        except (AgentgateError, OSError, ValueError) as exc:
            if attempt.record_problem is None:
                attempt.record_problem = f"the gate log could not be kept beside the record: {exc}"


def _transcript_tail(ws: Workspace) -> str:
    """What the record shows of the agent's work: its transcripts rendered as steps (a
    preset's stream), else the tail of what its commands printed."""
    if not ws.transcripts:
        return ws.output_tail()
    from ..agents.transcript import steps_tail

    return steps_tail(ws.transcripts, TAIL_LINES)


def _refused(ws: Workspace) -> tuple[str, ...]:
    shown = tuple(ws.refused)
    if ws.refused_count > len(shown):
        shown += (f"{ws.refused_count - len(shown)} more",)
    return shown


def _reusable(
    found: Retested,
    held: Mapping[str, str] | None,
    expected: frozenset[str] | None = None,
    spec: GateSpec | None = None,
) -> bool:
    """Whether an early re-test's ``found`` answers for the batch's re-test, which would be
    held to ``held`` (what passed on the batch's bases and on the tip it lands on; the early
    run knew neither that tip nor, for a batch of other attempts with the same top, those
    bases). A gate that reports no tests: its pass is the same either way. Else only a
    pass with no failing test at all (so its exit status was 0, whatever it is held to)
    that the comparison with ``held`` accepts as a re-test's would, nothing removed allowed:
    what passed there passes, a test new to it passes. A failure is never taken as is (held
    to other bases, it may have failed a test the batch may fail): the tree is run again.
    A pass held to other bases is not enough either: a re-test held to these may fail it.
    Nor is a failure taken from a gate that reports no tests: a run ended half-way, or a
    sandbox that could not start, fails the same way as the code would."""
    if not found.ok:
        return False
    if found.tests is None:
        return not held
    if results.failing(found.tests):
        return False
    if (
        expected is not None
        and spec is not None
        and unexpected(found.fingerprint, expected, spec.harness)
    ):
        return False
    return results.compare(found.tests, held).ok
