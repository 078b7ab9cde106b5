"""The gated lifecycle as plain Python: fork, snapshot, gate, preflight, promote, record.

The pytest plugin is a thin layer over :class:`Engine`; an orchestrator that is not pytest
drives the same calls::

    engine = Engine.open("../service", "main", promote=True,
                         gate=GateSpec(commands=("python -m pytest -q",)))
    ws = engine.fork(task="Add total()")
    ...  # the agent edits ws.path
    attempt = engine.run_attempt(ws, task="Add total()", agent="agent-a")
    print(attempt.verdict.status, attempt.record_ref)

The engine holds the lifecycle only. Where attempts land is its :class:`~.target.Target`;
workspaces come from a :class:`~.pool.WorkspacePool`; what a test is held to from
:class:`~.baseline.Baselines`; the verdict from :mod:`.gate`; messages from :mod:`.records`.
Its settings are one frozen :class:`EngineSettings`, given whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import resume
from ._constants import DEFAULT_BATCH_MAX, DEFAULT_LEASE_S, DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES
from .attempt import Attempt, posted_checks
from .errors import AgentgateError, ConfigError, DirtyWorktree, RevisionNotFound
from .git import runner as _git
from .git import worktree as checkout
from .git.repo import Author, BaseRepo, MergePreview, check_branch_name
from .judge import grader, results
from .judge.baseline import Baselines, HarnessBroken, Stored, either_passed
from .judge.channel import unexpected
from .judge.gate import (
    Check,
    CheckResult,
    GateContext,
    GateSpec,
    Status,
    Verdict,
    check_limits,
    judge,
    no_results,
    run_commands,
)
from .land.external import ExternalMoves
from .land.promote import Move, PromoteOutcome, promote
from .land.queue import LandingQueue, Outcome
from .land.retest import BatchRetest, Retested
from .land.target import DryRunRef, LocalBranch, RemoteBranch, Target
from .pool import ISOLATIONS, WorkspacePool
from .remote import server_records
from .remote.server_queue import Trust
from .sandbox import containment as sandbox
from .sandbox.process import Running, terminate_as_interrupt
from .store import attempts, checkpoints, oplog, records, schema
from .workspace import fork as workspace
from .workspace import state as state_module
from .workspace.fork import DEFAULT_EXCLUDE, Snapshot, Workspace

__all__ = ["NO_GATE", "Attempt", "Engine", "EngineSettings", "HarnessBroken"]

NO_GATE = (
    "no gate: promotion needs a gate command (--agentgate-gate CMD), a check "
    "(checks=[...] on the marker), or gate=[] on the marker to say the test's own outcome is enough"
)


@dataclass(frozen=True)
class EngineSettings:
    """Everything an engine is configured with, resolved once (by the plugin from the
    command line, environment and ini; by a script directly)."""

    #: The branch attempts land on (``None``: the one checked out in the repository).
    target: str | None = None
    #: Move the target for real; without it, a dry run onto this run's scratch ref
    #: (``refs/agentgate/dryruns/<run>/<b>``).
    promote: bool = False
    #: The target lives on this remote of the repository: promote by push with a lease.
    remote: str | None = None
    #: Fork every workspace from this revision instead of the target's tip.
    base: str | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "agentgate")
    gate: GateSpec = field(default_factory=GateSpec)
    retest: bool = True
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES
    #: The most bytes an attempt's declared state may hold (beyond: rejected).
    max_state_bytes: int = DEFAULT_MAX_BYTES
    agent: str = "agent"
    recycle: bool = True
    sandbox: sandbox.Settings = field(default_factory=sandbox.Settings)
    isolation: str = "shared"
    allow_symlinks: tuple[str, ...] = ()
    #: Most attempts one re-test lands together (1: each merge is tested alone).
    batch_max: int = DEFAULT_BATCH_MAX
    #: Test a batch's merged tree while its attempts' own gates run (see :mod:`.early`).
    early_retest: bool = True
    push_state: bool = False
    lease_seconds: float = DEFAULT_LEASE_S
    #: An SSH private key this machine signs its posts on a server's queue with.
    signing_key: Path | None = None
    #: git's allowed-signers file: whose signed posts a leader here takes.
    allowed_signers: Path | None = None
    #: Take other machines' posts unsigned (anyone who can push could write one).
    unsigned_posts: bool = False
    #: Names this run (every process of one run shares it): a dry run's scratch ref is its own.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        records.check_name(self.agent, "agent name", "agent")
        if self.isolation not in ISOLATIONS:
            raise ConfigError(
                f"isolation must be one of {', '.join(ISOLATIONS)}, got {self.isolation!r}",
                value=self.isolation,
                source="isolation",
            )

    @classmethod
    def of(cls, **options: Any) -> EngineSettings:
        """Settings from keyword options (the fields of this class)."""
        if options.get("workdir") is None:
            options.pop("workdir", None)
        for name in ("exclude", "allow_symlinks"):
            if name in options:
                options[name] = tuple(options[name])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown engine setting(s): {', '.join(unknown)}")
        return cls(**options)


def _program_exists(program: str) -> bool:
    """Whether a gate's program can be found as the gate will look for it (on PATH, or a
    path; a relative path is the checkout's business and is left to the launch)."""
    import shutil

    if "/" in program:
        return not os.path.isabs(program) or os.access(program, os.X_OK)
    return shutil.which(program) is not None


def make_target(repo: BaseRepo, settings: EngineSettings, log: oplog.OpLog) -> Target:
    """The target the settings name: a branch here or on a server, or a dry run of either."""
    assert settings.target is not None
    source: LocalBranch | RemoteBranch = (
        RemoteBranch(
            repo,
            settings.remote,
            settings.target,
            log,
            push_state=settings.push_state,
            lease_seconds=settings.lease_seconds,
            trust=Trust(settings.signing_key, settings.allowed_signers, settings.unsigned_posts),
        )
        if settings.remote
        else LocalBranch(repo, settings.target, log)
    )
    if settings.promote:
        return source
    return DryRunRef(source, log, agent=settings.agent, run_id=settings.run_id)


class Engine:
    """The lifecycle against one base repository and one target."""

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
        if settings.target is None:
            raise ConfigError("the engine needs a target branch", source="target")
        self.repo = repo
        self.settings = settings
        #: The commit every workspace forks from, when one was pinned (``base=``).
        self.pinned_base = pinned_base
        #: The operations log; the target writes every move it makes there.
        self.log = oplog.OpLog(repo.common_dir)
        self.target: Target = make_target(repo, settings, self.log)
        #: The containment in force (probed once): bwrap, or none and why.
        self.sandbox = sandbox.resolve(settings.sandbox)
        self.pool = WorkspacePool(
            repo,
            settings.workdir,
            self.sandbox,
            settings.sandbox,
            branch=settings.target,
            isolation=settings.isolation,
            recycle=settings.recycle,
            require_results=self.target.promotes,
        )
        self.baselines = Baselines(
            repo, self.pool.gate_context, self.sandbox.label, self.pool.gate_role
        )
        #: Attempts that need a re-tested merge land through it, in batches.
        self.queue = LandingQueue(
            repo,
            self.target,
            batch_max=settings.batch_max,
            # Not for a branch on a server: another machine's leader batches this machine's
            # attempts with its own, a tree no early re-test here could have tested (two
            # machines spent 14 gate runs on 8 agents with it, against 11 or 12 without).
            early=settings.early_retest and not isinstance(self.target, RemoteBranch),
        )
        #: What the start of the run completed for earlier runs (records of pending moves).
        self.settled: list[str] = []
        #: How long this process's last gate took (seconds; 0: none yet), for early re-tests.
        self._last_gate_s = 0.0
        #: The target's tips this run has judged, and its moves outside agentgate.
        self.external = ExternalMoves(repo, self.target, self.log)
        self._started = False
        #: Told each step an attempt enters (snapshot, gate, queue...); None: nobody listens.
        self.on_step: Callable[[str], None] | None = None
        #: The Python checks of each test of this run, by its id: a leader runs them on
        #: another machine's posted attempt of the same test.
        self.checks_by_test: dict[str, tuple[Check, ...]] = {}

    @classmethod
    def open(
        cls,
        repo: str | Path,
        target: str | None = None,
        *,
        sources: dict[str, str] | None = None,
        settings: EngineSettings | None = None,
        **options: Any,
    ) -> Engine:
        """Open the repository, check names and git's version, and resolve the base.

        Settings come whole (``settings=``) or as keyword options (``promote=True,
        gate=GateSpec(...)``: the fields of :class:`EngineSettings`). ``sources`` maps
        ``repo``/``target``/``base``/``remote`` to where each value came from, so an error
        can name it (``--agentgate-target``, ``ini agentgate_target``...).
        """
        where = sources or {}
        if settings is None:
            settings = EngineSettings.of(target=target, **options)
        elif target is not None or options:
            changes: dict[str, Any] = dict(options)
            if target is not None:
                changes["target"] = target
            settings = replace(settings, **changes)
        _git.require_version()
        base_repo = BaseRepo.open(repo, where.get("repo", "repo"))
        branch = settings.target if settings.target is not None else base_repo.head_branch()
        if branch is None:
            raise ConfigError(
                f"{base_repo.label} has no branch checked out (detached HEAD or bare); "
                "name the target with --agentgate-target BRANCH",
                source=where.get("target", "target"),
            )
        check_branch_name(branch, where.get("target", "target"))
        settings = replace(settings, target=branch)
        if settings.remote:
            server = RemoteBranch(
                base_repo, settings.remote, branch, oplog.OpLog(base_repo.common_dir)
            )
            server.check(where.get("remote", "remote"))
            if server.tip() is None:
                raise ConfigError(
                    f"branch {branch!r} does not exist on remote {settings.remote!r}",
                    value=branch,
                    source=where.get("target", "target"),
                )
        elif base_repo.resolve(f"refs/heads/{branch}") is None:
            if base_repo.resolve("HEAD") is None and not base_repo.refs("refs/heads/"):
                raise ConfigError(
                    f"{base_repo.label} has no commits yet; commit something first",
                    value=branch,
                    source=where.get("repo", "repo"),
                )
            raise ConfigError(
                f"branch {branch!r} does not exist in {base_repo.label}; "
                "name an existing branch with --agentgate-target",
                value=branch,
                source=where.get("target", "target"),
            )
        pinned = None
        if settings.base:
            try:
                pinned = base_repo.resolve_commit(settings.base, where.get("base", "base"))
            except RevisionNotFound as exc:
                if base_repo.is_shallow():
                    raise ConfigError(
                        f"{settings.base!r} does not name a commit in {base_repo.label}, which "
                        "is a shallow clone: deepen it with 'git fetch --unshallow' (or --deepen "
                        "N) and run again",
                        value=settings.base,
                        source=exc.source,
                    ) from exc
                raise
        return cls(base_repo, settings, pinned_base=pinned)

    # -- what the settings say, by name --------------------------------------------------

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

    # -- the run ----------------------------------------------------------------------

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

    def release(self, ws: Workspace) -> None:
        """Hand a workspace back once its attempt is recorded: kept for reuse, or removed."""
        self.pool.release(ws)

    def private_root(self) -> Path:
        return self.pool.private_root()

    def gate_context(self) -> GateContext:
        return self.pool.gate_context()

    def snapshot(self, ws: Workspace) -> Snapshot:
        s = self.settings
        return workspace.snapshot(
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
            base.tests if base is not None else None,
            expected=base.fingerprint if base is not None and base.fingerprint else None,
            allow_symlinks=self.settings.allow_symlinks,
        )

    def baseline(self, base: str, spec: GateSpec) -> dict[str, str] | None:
        """The gate's per-test results on ``base``'s tree (see :class:`Baselines`)."""
        return self.baselines.of_commit(base, spec)

    def check_harness(self, specs: Sequence[GateSpec]) -> list[str]:
        """Before any agent works: can the gate judge anything at all? Returns warnings.

        Every gate program must exist; a promoting run's checked-out target must be clean
        enough to follow a move; and each gate's baseline on today's base is computed now, so
        a gate that cannot run there, or runs no test, stops the run before any agent time
        is spent (:class:`HarnessBroken`). Tests that fail on the base are only a warning:
        they are not required of the attempts.
        """
        for spec in specs:
            for command in spec.commands:
                argv = results.argv_of(command)
                if argv is not None:
                    argv = results.split_assignments(argv)[1]
                if argv and not _program_exists(argv[0]):
                    raise ConfigError(
                        f"gate program {argv[0]!r} not found (gate command {command!r}); "
                        "fix the command or install the program",
                        value=command,
                        source="gate",
                    )
        if isinstance(self.target, LocalBranch) and self.target.promotes:
            tip = self.target.tip()
            if tip and checkout.checked_out(self.repo, self.target.ref):
                # Under the target's lock: another run may be updating those very files (and
                # holding git's index lock) right now.
                with self.target.lock():
                    dirty = checkout.dirty_paths(self.repo)
                if dirty:
                    raise DirtyWorktree(self.repo.worktree, dirty)
        base = self.pinned_base or self.target.tip()
        if base is None:
            raise ConfigError(f"the target {self.target.label} has no tip", source="target")
        warnings = []
        seen: set[tuple[results.Command, ...]] = set()
        for spec in specs:
            if spec.grading is not None:  # a task that grades nothing is found now
                grader.plan(self.repo, self.baselines, base, spec)
                continue
            if spec.commands in seen:
                continue
            seen.add(spec.commands)
            stored = self.baselines.stored_of_commit(base, spec)
            found = stored.tests if stored is not None else None
            for command in stored.by_exit_code if stored is not None else ():
                if any(
                    spec.by_exit_code(c) for c in spec.commands if results.display(c) == command
                ):
                    continue
                if self.target.promotes:
                    raise ConfigError(no_results(command), value=command, source="gate")
                warnings.append(
                    f"gate command {command!r} reported no per-test results: judged by its exit "
                    "code only (a promoting run refuses it unless it is declared with "
                    "--agentgate-gate-exit-code)"
                )
            failing = results.failing(found or {})
            if failing:
                warnings.append(
                    f"the base {base[:12]} fails {len(failing)} test(s) of its own gate, not "
                    f"required of the attempts: {', '.join(failing[:10])}"
                    + (" ..." if len(failing) > 10 else "")
                )
        return warnings

    def preflight(self, attempt: Attempt) -> MergePreview:
        """A deep three-way merge of the attempt with the target's current tip; moves nothing."""
        assert attempt.change_commit is not None
        tip = self.repo.ref_value(self.target.ref)
        if tip is None:
            raise RevisionNotFound(self.target.ref, self.repo.label, "target")
        attempt.target_before = tip
        attempt.external_move = self.note_external_move(tip, attempt.agent)
        if tip == attempt.base:  # merging onto its own parent: the attempt's tree, clean
            return MergePreview(self.repo.tree_of(attempt.change_commit), ())
        if isinstance(self.target, RemoteBranch):  # a shallow clone: deepen for a merge base
            self.target.reach(attempt.base)
            tip = self.repo.ref_value(self.target.ref) or tip
        return self.repo.merge_preview(tip, attempt.change_commit)

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
                exclude=self.settings.exclude,
                skipped=attempt.state_excluded,
                max_bytes=self.settings.max_state_bytes,
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
            workspace.recycle(ws, tip)
            ws.new_try()
            self.resume_into(ws, None, mode)
            return f"a fresh workspace at the target's tip {tip[:12]} (the last try conflicted)"
        workspace.recycle(ws, ws.base)
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

    def _step(self, attempt: Attempt, step: str) -> None:
        """The attempt enters ``step``: kept on it (an interrupt's record names it) and told
        to :attr:`on_step` (the plugin's progress line)."""
        attempt.step = step
        if self.on_step is not None:
            with contextlib.suppress(Exception):  # a display must never change a verdict
                self.on_step(step)

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
                exclude=self.settings.exclude,
            )
            if ws.state_declared
            else None
        )
        point = checkpoints.write(
            self.repo,
            slug=attempts.slugify(ws.task or "task"),
            try_id=ws.try_id,
            base=ws.base,
            code_tree=snap.tree,
            state=state,
            agent_git=checkpoints.capture_agent_git(
                self.repo,
                ws.path,
                author,
                max_files=self.settings.max_files,
                max_bytes=self.settings.max_bytes,
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

    def note_external_move(self, tip: str, agent: str = "") -> str | None:
        """Log (once) a target tip no agentgate record accounts for (:mod:`.land.external`)."""
        return self.external.note(tip)

    def land(self, attempt: Attempt, spec: GateSpec) -> PromoteOutcome:
        """Promote the attempt's change commit onto the target (or the dry-run ref)."""
        assert attempt.change_commit is not None
        retest = None
        if spec.commands and self.settings.retest:
            base_results = (
                attempt.graded_baseline
                if attempt.graded_tree is not None
                else self.baselines.of_commit(attempt.base, spec)
            )

            def retest(tree: str, tip: str) -> tuple[bool, str, str]:
                # Held to what passed on the attempt's base and on the tip it merges onto: a
                # test another landing fixed must not break again in the merge.
                on_tip = self.baselines.of_tip(tip, spec)
                held = either_passed(base_results, on_tip.tests if on_tip else None)
                result = run_commands(
                    self.repo, tree, spec, self.gate_context(), "retest", baseline=held,
                    expected=self._expected(spec, on_tip, [attempt.base]),
                )  # fmt: skip
                if result.ok and result.tests:  # the merged tree is a baseline for free
                    self.baselines.keep(tree, spec, result)
                return result.ok, result.message, result.output

        elif spec.commands:
            attempt.retest_skipped = True
        promotes = self.target.promotes
        status: Status = "promoted" if promotes else "passed"
        # The queue is for merges: a target still at the attempt's base (as the preflight
        # just read it) is a fast-forward, which needs no re-test and no waiting. Should the
        # target have moved meanwhile, the attempt joins the queue after all.
        queued = retest is not None and attempt.graded_tree is None
        # Another machine leading now would make a fast-forward wait for its whole batch,
        # and then need a merge: it joins that leader's batch. A queued attempt's intent
        # stays until its entry is written (the queue removes it then), so a leader
        # gathering a batch waits for it rather than starting without it.
        if queued and (attempt.target_before != attempt.base or self.target.busy()):
            return self._land_queued(attempt, spec, status)
        self.queue.arrived(attempt.uid)  # judged: no leader need wait for it any more

        def on_moved(move: Move) -> bool:
            """The target moved: write the record now, before the checked-out files follow."""
            attempt.move = move
            attempt.verdict = Verdict(status)
            try:
                self.record(attempt)
            except (AgentgateError, OSError) as exc:
                attempt.record_problem = (
                    f"the target moved, but its attempt record could not be written ({exc}); "
                    "the next run or agentgate command completes it"
                )
                return False
            return True

        outcome = promote(
            self.target,
            attempt.change_commit,
            attempt.base,
            author=Author.for_agent(attempt.agent),
            message=records.merge_message(attempt.task, attempt.agent),
            reflog_message=records.landing_reflog(
                attempt.task, attempt.agent, dry_run=not promotes
            ),
            retest=retest,
            agent=attempt.agent,
            task=attempt.task,
            expected_tip=attempt.target_before,
            known_objects=attempt.snapshot.new_objects if attempt.snapshot else None,
            pending={**self.record_fields(attempt), "status": status},
            on_moved=on_moved,
            fast_forward_only=queued,
        )
        if outcome.needs_queue:
            return self._land_queued(attempt, spec, status)
        return outcome

    def _land_queued(self, attempt: Attempt, spec: GateSpec, status: Status) -> PromoteOutcome:
        """Land through the queue: one re-test for a batch of attempts that share this gate
        (see :mod:`.queue`); the verdict may come from another process that led."""
        assert attempt.change_commit is not None
        self._step(attempt, "queue")

        batch_retest = self._batch_retest(spec)
        gate_s = attempt.timings.get("gate", 0.0) / 1000
        try:
            found = self._queue_land(attempt, spec, status, batch_retest, gate_s)
            attempt.landed_for_others = list(self.queue.landed_for_others)
            self.queue.landed_for_others.clear()
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

    def _batch_retest(self, spec: GateSpec) -> BatchRetest:
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
            result = run_commands(
                self.repo, tree, spec, self.gate_context(), "retest", baseline=held,
                running=running, expected=expected,
            )  # fmt: skip
            if result.ok and result.tests:  # the merged tree is a baseline for free
                self.baselines.keep(tree, spec, result)
            return Retested(
                result.ok, result.message, result.output, result.tests,
                fingerprint=result.fingerprint,
            )  # fmt: skip

        return batch_retest

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
        gate_s: float,
    ) -> Outcome:
        assert attempt.change_commit is not None
        return self.queue.land(
            gate_s=gate_s,
            began=attempt.gate_began,
            uid=attempt.uid,
            key=attempt.batch_key or self._batch_key(spec),
            change_commit=attempt.change_commit,
            base=attempt.base,
            agent=attempt.agent,
            task=attempt.task,
            record={**self.record_fields(attempt), "status": status},
            known_objects=attempt.snapshot.new_objects if attempt.snapshot else (),
            retest=batch_retest,
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
        self, spec: GateSpec, change_commit: str, base: str, declared: Mapping[str, object]
    ) -> str | None:
        """Why another machine's posted attempt may not join this gate's batch (None: it
        may): its tree judged as this run judges its own agents' files, protection, the
        harness and the limits this run's own, made stricter (never looser) by what the
        attempt declared of its own test's."""
        s = self.settings
        try:
            snap = workspace.tree_snapshot(
                self.repo, base, self.repo.tree_of(change_commit), exclude=s.exclude,
                max_files=s.max_files, max_bytes=s.max_bytes, allow_symlinks=s.allow_symlinks,
            )  # fmt: skip
        except workspace.SnapshotRefused as exc:
            return exc.reason
        if not snap.changes:
            return "no changes"
        theirs = declared.get("protect")
        protect = (
            (*spec.protect, *(p for p in theirs if isinstance(p, str)))
            if isinstance(theirs, list)
            else spec.protect
        )
        limit = spec.max_changed_lines
        declared_limit = declared.get("max_changed_lines")
        if isinstance(declared_limit, int) and not isinstance(declared_limit, bool):
            limit = declared_limit if limit is None else min(limit, declared_limit)
        found = check_limits(
            self.repo, snap, replace(spec, protect=tuple(dict.fromkeys(protect)),
                                     max_changed_lines=limit),
            s.allow_symlinks,
        )  # fmt: skip
        if not found.ok:
            return found.message
        test = str(declared.get("test") or "")
        return posted_checks(self.repo, snap, test, self.checks_by_test.get(test, ()),
                             self.private_root())  # fmt: skip

    def _batch_key(self, spec: GateSpec) -> str:
        """Which attempts may share a re-test: the same gate, environment and sandbox, and
        the same tests allowed to go (one batch's re-test judges every attempt in it so)."""
        import hashlib

        material = repr(
            (self.baselines.key("batch", spec), spec.timeout, spec.rerun, spec.flaky, spec.env,
             sorted(spec.allow_removed))
        )  # fmt: skip
        return hashlib.sha256(material.encode()).hexdigest()[:24]

    def record_fields(self, attempt: Attempt) -> dict[str, object]:
        """What the attempt's record says besides its verdict: enough to write it later."""
        snap = attempt.snapshot
        return {
            "uid": attempt.uid,
            "task": attempt.task,
            "agent": attempt.agent,
            "test": attempt.test,
            "base": attempt.base,
            "tree": snap.tree if snap else self.repo.tree_of(attempt.base),
            "excluded": [*(snap.excluded if snap else ()), *attempt.state_excluded],
            "state": attempt.state,
            "sandbox": attempt.sandbox,
            "transcript": attempt.workspace.output_tail(),
            "results": attempt.results,
            "graded_tree": attempt.graded_tree or "",
            "try": attempt.try_number,
            "protect": list(attempt.protect),
            "max_changed_lines": attempt.max_changed_lines,
            # The folder of the try's checkpoints (refs/agentgate/checkpoints/<this>/<k>).
            "checkpoints": attempt.checkpoints[-1]
            .removeprefix(checkpoints.PREFIX)
            .rsplit("/", 1)[0]
            if attempt.checkpoints
            else "",
            "retest": "passed"
            if attempt.move is not None and attempt.move.retested
            else "skipped"
            if attempt.retest_skipped
            else "",
        }

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
            self.record_fields(attempt),
            status=v.status,
            reason=v.reason,
            check=v.check,
            output=output,
            landed=attempt.move.new if attempt.move and self.target.promotes else None,
            known_objects=attempt.snapshot.new_objects if attempt.snapshot else (),
        )
        server = self.target.records()
        if server is not None:  # on the server too, its number claimed there
            ref, problem = server_records.publish(self.repo, server, ref, commit)
            problems = [problem] if problem else []
            if server.push_state:  # a checkpoint carries its state and the agent's git
                for point in attempt.checkpoints:
                    found = self.repo.ref_value(point)
                    if found is not None:
                        problems.append(
                            server_records.publish_ref(self.repo, server, point, found) or ""
                        )
            problems = [p for p in problems if p]
            if problems and attempt.record_problem is None:
                attempt.record_problem = "; ".join(problems)
        attempt.record_ref, attempt.record_commit = ref, commit
        return ref

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
                    self.record(attempt)
                except (AgentgateError, OSError) as exc:
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
        return Verdict(
            "conflict",
            f"preflight merge conflicts in: {', '.join(found.conflicts)} "
            "(found before the gate ran: no gate command was run)",
            "preflight",
        )

    def _note_checks(self, attempt: Attempt, spec: GateSpec) -> None:
        """What the gate's checks tell beyond pass or fail: the per-test comparison, the
        passing tree's baseline (kept, free), the commands judged by exit code, flaky tests."""
        assert attempt.snapshot is not None
        for check in attempt.checks:
            if check.comparison is not None:
                attempt.results = check.comparison.as_dict()
            if check.ok and check.tests and check.name == "gate":
                self.baselines.keep(attempt.snapshot.tree, spec, check)
            if check.by_exit_code:
                attempt.results = {
                    **(attempt.results or {}),
                    "judged_by_exit_code": list(check.by_exit_code),
                }
            if check.flaky:
                attempt.results = {**(attempt.results or {}), "flaky_ids": list(check.flaky)}

    def _decide(  # noqa: PLR0915 - the lifecycle, one step after another
        self,
        attempt: Attempt,
        spec: GateSpec,
        test_failure: str | None,
        extra_checks: Sequence[Check],
        state: Sequence[str] = (),
        agent_error: str | None = None,
    ) -> Verdict:
        timings = attempt.timings
        clock = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[name] = (now - clock) * 1000
            clock = now

        # contain -> snapshot
        self._step(attempt, "snapshot")
        refused = None
        try:
            attempt.snapshot = self.snapshot(attempt.workspace)
        except workspace.SnapshotRefused as exc:
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
        if attempt.snapshot.tree == attempt.snapshot.base_tree:
            return Verdict("rejected", "no changes", "snapshot")
        if not spec.has_gate:
            return Verdict("error", NO_GATE, "gate")
        if (known := self._known_conflict(attempt, spec)) is not None:
            return known
        # gate -> verdict
        self._step(attempt, "gate")
        if spec.commands and self.settings.retest and spec.grading is None:
            # A leader may wait for it.
            attempt.batch_key = self._batch_key(spec)
            attempt.gate_began = self.queue.announce(
                attempt.uid,
                attempt.batch_key,
                tree=attempt.snapshot.tree,
                base=attempt.base,
            )
            self.queue.early.begin(
                attempt.uid,
                attempt.batch_key,
                self._batch_retest(spec),
                last_gate_s=self._last_gate_s,
            )
        gate_spec = replace(spec, commands=()) if spec.grading is not None else spec
        try:
            attempt.checks = self.judge(attempt, gate_spec, extra_checks)
        except HarnessBroken as exc:
            return Verdict("error", str(exc), "baseline", exc.output)
        lap("gate")
        self._last_gate_s = timings["gate"] / 1000
        self._note_checks(attempt, spec)
        failed = next((c for c in attempt.checks if not c.ok), None)
        if failed is not None:
            if failed.harness_error:
                return Verdict("error", failed.message, failed.name, failed.output)
            return Verdict("rejected", failed.message, failed.name, failed.output)
        if spec.grading is not None:
            self._step(attempt, "grading")
            try:
                graded = grader.grade(
                    self.repo,
                    self.baselines,
                    self.gate_context(),
                    attempt.base,
                    attempt.snapshot,
                    spec,
                )
            except HarnessBroken as exc:
                return Verdict("error", str(exc), "grade", exc.output)
            lap("grade")
            if graded.plan is not None:
                attempt.graded_baseline = graded.plan.on_base
            if graded.results:
                attempt.results = {**(attempt.results or {}), **graded.results}
                attempt.graded_tree = graded.tree
            if graded.verdict is not None:
                return graded.verdict
            assert graded.plan is not None
            spec = graded.plan.spec
        # preflight -> merge preview
        self._step(attempt, "preflight")
        _change_commit(self.repo, attempt)
        attempt.preview = self.preflight(attempt)
        lap("preflight")
        if attempt.preview.conflicts:
            return Verdict(
                "conflict",
                f"preflight merge conflicts in: {', '.join(attempt.preview.conflicts)}",
                "preflight",
            )
        # promote -> the target moves; record (written by land() right after the move)
        self._step(attempt, "promote")
        outcome = self.land(attempt, spec)
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


def _reusable(
    found: Retested,
    held: Mapping[str, str] | None,
    expected: frozenset[str] | None = None,
    spec: GateSpec | None = None,
) -> bool:
    """Whether an early re-test's ``found`` answers for the batch's re-test, which would be
    held to ``held`` (what passed on the batch's bases and on the tip it lands on; the early
    run knew neither that tip nor, for a batch of other attempts with the same top, those
    bases). A gate that reports no tests: its answer is the same either way. Else only a
    pass with no failing test at all (so its exit status was 0, whatever it is held to)
    that the comparison with ``held`` accepts as a re-test's would, nothing removed allowed:
    what passed there passes, a test new to it passes. A failure is never taken as is (held
    to other bases, it may have failed a test the batch may fail): the tree is run again.
    The second trial found a pass held to other bases that a re-test would have failed."""
    if found.tests is None:
        return not held
    if not found.ok or results.failing(found.tests):
        return False
    if (
        expected is not None
        and spec is not None
        and unexpected(found.fingerprint, expected, spec.harness)
    ):
        return False
    return results.compare(found.tests, held).ok
