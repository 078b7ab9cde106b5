"""What the engine is made of, and the steps that stand alone: opening it (the repository,
the target, the pool, the queue, the baselines), a snapshot, a gate's judgement, the check
of the harness before a run, the merge preview."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Self

from .._constants import RUN_START
from ..errors import ConfigError, DirtyWorktree, RevisionNotFound
from ..git import runner as _git
from ..git import worktree as checkout
from ..git.repo import BaseRepo, MergePreview, check_branch_name
from ..judge import grader, results
from ..judge.baseline import Baselines
from ..judge.gate import (
    Check,
    CheckResult,
    GateContext,
    GateSpec,
    Judging,
    judge,
)
from ..judge.notes import no_results
from ..land.external import ExternalMoves
from ..land.queue import LandingQueue
from ..land.remote_branch import RemoteBranch
from ..land.target import LocalBranch, Target
from ..sandbox import containment as sandbox
from ..store import oplog, schema
from ..workspace import snapshot as snapshots
from ..workspace.fork import Workspace
from ..workspace.snapshot import Snapshot
from .attempt import Attempt
from .landing import Lander
from .pool import WorkspacePool
from .settings import EngineSettings, make_target, program_exists


class EngineBase:
    """The engine's parts and its single steps; :class:`~.story.Engine` tells them in order."""

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
        # What the sandbox hides against what a person bound writable: refused now, before
        # any agent works, not at its first command.
        self.pool.sandbox_now()
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
        #: How a passed attempt lands: its record, the queue, the batch's re-test.
        self.lander = Lander(
            repo,
            self.target,
            self.queue,
            self.baselines,
            settings,
            self.pool,
            self.checks_by_test,
            self._step,
        )

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
        if settings.base == RUN_START:
            # A ref named run-start is not meant: the option's word wins, as documented.
            pinned = server.tip() if settings.remote else base_repo.resolve(f"refs/heads/{branch}")
        elif settings.base:
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
                if argv and not program_exists(argv[0]):
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
