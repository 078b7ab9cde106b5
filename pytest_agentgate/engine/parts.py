"""What the engine is made of, and the steps that stand alone: opening it (the repository,
the settings, the base), assembling its parts (the target, the pool, the queue, the
baselines), the check of the harness before a run, the merge previews before and after the
gate, and what the gate's checks tell beyond pass or fail.

Functions over the parts, which :class:`~.story.Engine` holds and calls in order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._constants import RUN_START
from ..errors import ConfigError, DirtyWorktree, RevisionNotFound
from ..git import runner as _git
from ..git import worktree as checkout
from ..git.repo import Author, BaseRepo, MergePreview, check_branch_name
from ..judge import grader, results
from ..judge.baseline import Baselines
from ..judge.gate import Check, GateSpec, Verdict
from ..judge.notes import no_results
from ..land import clashes
from ..land.external import ExternalMoves
from ..land.queue import LandingQueue
from ..land.remote_branch import RemoteBranch
from ..land.target import LocalBranch, Target
from ..sandbox import containment as sandbox
from ..store import oplog, records
from .attempt import Attempt
from .pool import WorkspacePool
from .settings import EngineSettings, make_target, program_exists


@dataclass
class Parts:
    """The engine's parts, made once from its repository and settings."""

    repo: BaseRepo
    settings: EngineSettings
    #: The commit every workspace forks from, when one was pinned (``base=``).
    pinned_base: str | None
    #: The operations log; the target writes every move it makes there.
    log: oplog.OpLog
    target: Target
    #: The containment in force (probed once): bwrap, or none and why.
    sandbox: sandbox.Sandbox
    pool: WorkspacePool
    baselines: Baselines
    #: Attempts that need a re-tested merge land through it, in batches.
    queue: LandingQueue
    #: The target's tips this run has judged, and its moves outside agentgate.
    external: ExternalMoves
    #: The Python checks of each test of this run, by its id: a leader runs them on
    #: another machine's posted attempt of the same test.
    checks_by_test: dict[str, tuple[Check, ...]] = field(default_factory=dict)


def assemble(repo: BaseRepo, settings: EngineSettings, pinned_base: str | None) -> Parts:
    """The parts the settings ask for (the sandbox probed, its binds checked now, before
    any agent works)."""
    if settings.target is None:
        raise ConfigError("the engine needs a target branch", source="target")
    log = oplog.OpLog(repo.common_dir)
    target = make_target(repo, settings, log)
    contained = sandbox.resolve(settings.sandbox)
    pool = WorkspacePool(
        repo,
        settings.workdir,
        contained,
        settings.sandbox,
        branch=settings.target,
        isolation=settings.isolation,
        recycle=settings.recycle,
        require_results=target.promotes,
    )
    # What the sandbox hides against what a person bound writable: refused now, before
    # any agent works, not at its first command.
    pool.sandbox_now()
    baselines = Baselines(repo, pool.gate_context, contained, pool.gate_role)
    queue = LandingQueue(
        repo,
        target,
        batch_max=settings.batch_max,
        # Not for a branch on a server: another machine's leader batches this machine's
        # attempts with its own, a tree no early re-test here could have tested (two
        # machines spent 14 gate runs on 8 agents with it, against 11 or 12 without).
        early=settings.early_retest and not isinstance(target, RemoteBranch),
    )
    external = ExternalMoves(repo, target, log)
    return Parts(
        repo, settings, pinned_base, log, target, contained, pool, baselines, queue, external
    )


def opened(
    repo: str | Path,
    target: str | None,
    sources: dict[str, str] | None,
    settings: EngineSettings | None,
    options: dict[str, Any],
) -> tuple[BaseRepo, EngineSettings, str | None]:
    """Open the repository, check names and git's version, and resolve the base: the
    repository, the settings with their target branch, and the pinned base (None: none).

    Settings come whole (``settings``) or as keyword ``options`` (``promote=True,
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
    branch = settings.target if settings.target is not None else base_repo.refs.head_branch()
    if branch is None:
        raise ConfigError(
            f"{base_repo.label} has no branch checked out (detached HEAD or bare); "
            "name the target with --agentgate-target BRANCH",
            source=where.get("target", "target"),
        )
    check_branch_name(branch, where.get("target", "target"))
    settings = replace(settings, target=branch)
    if settings.remote:
        server = RemoteBranch(base_repo, settings.remote, branch, oplog.OpLog(base_repo.common_dir))
        server.check(where.get("remote", "remote"))
        if server.tip() is None:
            raise ConfigError(
                f"branch {branch!r} does not exist on remote {settings.remote!r}",
                value=branch,
                source=where.get("target", "target"),
            )
    elif base_repo.history.resolve(f"refs/heads/{branch}") is None:
        if base_repo.history.resolve("HEAD") is None and not base_repo.refs.rows("refs/heads/"):
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
        pinned = (
            server.tip() if settings.remote else base_repo.history.resolve(f"refs/heads/{branch}")
        )
    elif settings.base:
        try:
            pinned = base_repo.history.resolve_commit(settings.base, where.get("base", "base"))
        except RevisionNotFound as exc:
            if base_repo.place.is_shallow():
                raise ConfigError(
                    f"{settings.base!r} does not name a commit in {base_repo.label}, which "
                    "is a shallow clone: deepen it with 'git fetch --unshallow' (or --deepen "
                    "N) and run again",
                    value=settings.base,
                    source=exc.source,
                ) from exc
            raise
    return base_repo, settings, pinned


def check_harness(parts: Parts, specs: Sequence[GateSpec]) -> list[str]:
    """Before any agent works: can the gate judge anything at all? Returns warnings.

    Every gate program must exist; a promoting run's checked-out target must be clean
    enough to follow a move; and each gate's baseline on today's base is computed now, so
    a gate that cannot run there, or runs no test, stops the run before any agent time
    is spent (:class:`HarnessBroken`). Tests that fail on the base are only a warning:
    they are not required of the attempts.
    """
    repo, target, baselines = parts.repo, parts.target, parts.baselines
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
    if isinstance(target, LocalBranch) and target.promotes:
        tip = target.tip()
        if tip and checkout.checked_out(repo, target.ref):
            # Under the target's lock: another run may be updating those very files (and
            # holding git's index lock) right now.
            with target.lock():
                dirty = checkout.dirty_paths(repo)
            if dirty:
                raise DirtyWorktree(repo.worktree, dirty)
    base = parts.pinned_base or target.tip()
    if base is None:
        raise ConfigError(f"the target {target.label} has no tip", source="target")
    warnings = []
    # Each baseline once: gates with the same commands set up otherwise have their own.
    seen: set[str] = set()
    tree = repo.tree_of(base)
    for spec in specs:
        if spec.grading is not None:  # a task that grades nothing is found now
            grader.plan(repo, baselines, base, spec)
            continue
        key = baselines.key(tree, spec)
        if key in seen:
            continue
        seen.add(key)
        stored = baselines.stored_of_commit(base, spec)
        found = stored.tests if stored is not None else None
        for command in stored.by_exit_code if stored is not None else ():
            if any(spec.by_exit_code(c) for c in spec.commands if results.display(c) == command):
                continue
            if target.promotes:
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


def preflight(parts: Parts, attempt: Attempt) -> MergePreview:
    """A deep three-way merge of the attempt with the target's current tip; moves nothing."""
    assert attempt.change_commit is not None
    tip = parts.repo.refs.value(parts.target.ref)
    if tip is None:
        raise RevisionNotFound(parts.target.ref, parts.repo.label, "target")
    attempt.target_before = tip
    attempt.external_move = parts.external.note(tip)
    if tip == attempt.base:  # merging onto its own parent: the attempt's tree, clean
        return MergePreview(parts.repo.tree_of(attempt.change_commit), ())
    if isinstance(parts.target, RemoteBranch):  # a shallow clone: deepen for a merge base
        parts.target.reach(attempt.base)
        tip = parts.repo.refs.value(parts.target.ref) or tip
    return parts.repo.merge_preview(tip, attempt.change_commit)


def known_conflict(parts: Parts, attempt: Attempt, spec: GateSpec) -> Verdict | None:
    """A conflict with the target's tip as it is now, found before any gate command runs
    (a merge preview costs milliseconds, a gate seconds): the gate is not spent on it.
    The preflight after the gate looks again, as the tip may move meanwhile."""
    repo, target = parts.repo, parts.target
    snap = attempt.snapshot
    tip = repo.refs.value(target.ref)
    if snap is None or tip in (None, attempt.base) or spec.grading is not None:
        return None
    if not spec.commands or isinstance(target, RemoteBranch):
        return None  # nothing to save; a server's branch is read at the preflight
    found = repo.merge_preview(tip, change_commit(repo, attempt))
    if not found.conflicts:
        return None
    attempt.preview = found
    clash = clashes.conflicting(repo, attempt.base, tip, found.conflicts)
    return Verdict(
        "conflict",
        f"preflight merge conflicts in: {', '.join(found.conflicts)} "
        f"(found before the gate ran: no gate command was run{'; ' + clash if clash else ''})",
        "preflight",
    )


def change_commit(repo: BaseRepo, attempt: Attempt) -> str:
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


def note_checks(baselines: Baselines, attempt: Attempt, spec: GateSpec) -> None:
    """What the gate's checks tell beyond pass or fail: the per-test comparison, the
    passing tree's baseline (kept, free), the commands judged by exit code, flaky tests."""
    assert attempt.snapshot is not None
    for check in attempt.checks:
        if check.comparison is not None:
            attempt.results = check.comparison.as_dict()
        # Results of the base's tests on the attempt's code are not its tree's.
        whole = check.results_tree in ("", attempt.snapshot.tree)
        if check.ok and check.tests and check.name == "gate" and whole:
            baselines.keep(attempt.snapshot.tree, spec, check)
        if check.logs:
            attempt.logs += list(check.logs)
            attempt.results = {
                **(attempt.results or {}),
                "gate_log": [[name, size] for name, _, size in attempt.logs],
            }
        noted = {
            "changed_tests": check.changed_tests,
            "judged_by_exit_code": check.by_exit_code,
            "flaky_ids": check.flaky,
        }
        for name, ids in noted.items():
            if ids:
                attempt.results = {**(attempt.results or {}), name: list(ids)}
