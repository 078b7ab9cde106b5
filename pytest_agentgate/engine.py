"""The gated lifecycle as plain Python: fork, snapshot, gate, preflight, promote, record.

The pytest plugin is a thin layer over :class:`Engine`; an orchestrator that is not pytest
drives the same calls::

    engine = Engine.open("../service", target="main", promote=True,
                         gate=GateSpec(commands=("python -m pytest -q",)))
    ws = engine.fork(task="Add total()")
    ...  # the agent edits ws.path
    attempt = engine.run_attempt(ws, task="Add total()", agent="agent-a")
    print(attempt.verdict.status, attempt.ref)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import (
    _git,
    attempts,
    baseline,
    checkout,
    grading,
    oplog,
    pending,
    promote,
    results,
    sandbox,
    workspace,
)
from . import state as state_module
from .errors import AgentgateError, ConfigError, GitError, RevisionNotFound
from .gate import Check, CheckResult, GateContext, GateSpec, Status, Verdict, judge, run_commands
from .promote import Move, PromoteOutcome
from .remote import RemoteTarget
from .removal import remove_tree
from .repo import Author, BaseRepo, MergePreview, check_branch_name
from .workspace import DEFAULT_EXCLUDE, DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, Snapshot, Workspace

ISOLATIONS = ("shared", "sealed")


def _either_passed(
    base: Mapping[str, str] | None, tip: Mapping[str, str] | None
) -> dict[str, str] | None:
    """One baseline from two: a test is required when it passed on either."""
    if base is None or tip is None:
        return dict(base) if base is not None else (dict(tip) if tip is not None else None)
    merged = {**tip, **base}
    for test in set(base) | set(tip):
        if results.PASSED in (base.get(test), tip.get(test)):
            merged[test] = results.PASSED
    return merged


def _program_exists(program: str) -> bool:
    """Whether a gate's program can be found as the gate will look for it (on PATH, or a
    path; a relative path is the checkout's business and is left to the launch)."""
    import os
    import shutil

    if "/" in program:
        return not os.path.isabs(program) or os.access(program, os.X_OK)
    return shutil.which(program) is not None


def _reports(command: results.Command, spec: GateSpec) -> bool:
    """Whether a gate command reports per-test results (a pytest run, or a results file)."""
    argv = results.argv_of(command)
    return spec.results_file is not None or (argv is not None and results.is_pytest(argv))


class HarnessBroken(AgentgateError):
    """The gate cannot judge anything: it does not run on the base, or runs no test there."""

    def __init__(self, base: str, reason: str, output: str = "") -> None:
        self.base = base
        self.reason = reason
        self.output = output
        super().__init__(f"the gate cannot run on the base {base[:12]}: {reason}")


NO_GATE = (
    "no gate: promotion needs a gate command (--agentgate-gate CMD), a check "
    "(checks=[...] on the marker), or gate=[] on the marker to say the test's own outcome is enough"
)


@dataclass
class Attempt:
    """One agent task's attempt, filled in as the lifecycle goes."""

    task: str
    agent: str
    workspace: Workspace
    test: str = ""
    snapshot: Snapshot | None = None
    commit: str | None = None  # the clean commit that would land (tree = snapshot)
    checks: list[CheckResult] = field(default_factory=list)
    preview: MergePreview | None = None
    target_before: str | None = None
    move: Move | None = None
    verdict: Verdict = field(default_factory=lambda: Verdict("error", "not judged yet"))
    ref: str | None = None  # refs/agentgate/attempts/<slug>/<n>
    record: str | None = None  # the record commit the ref points to
    retest_skipped: bool = False
    #: Set when the target was found moved by something other than the plugin.
    external_move: str | None = None
    #: The commit holding the declared state outside git (``state=``), if any was captured.
    state: str | None = None
    #: The state commit this attempt's workspace was resumed from (``resume=True``).
    resumed_from: str | None = None
    #: Names this attempt in its record and in a pending move's log line.
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: Set when the record could not be written (it is completed by the next run).
    record_problem: str | None = None
    #: Declared state paths left out of the capture because they look like secrets.
    state_excluded: list[str] = field(default_factory=list)
    #: The containment the attempt's commands ran in: ``bwrap`` or ``none (why)``.
    sandbox: str = ""
    #: Per-test counts against the base (passed, failed, skipped, new, lost, with the ids).
    results: dict[str, object] | None = None
    #: For a graded task: the tree that was graded (and lands, on FULL), and the results of
    #: the graded tests on the base with the graded files (what a re-test is held to).
    graded_tree: str | None = None
    graded_baseline: dict[str, str] | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.workspace.path

    @property
    def base(self) -> str:
        return self.workspace.base

    @property
    def changed_paths(self) -> tuple[str, ...]:
        return self.snapshot.changed_paths if self.snapshot else ()

    def as_dict(self) -> dict[str, object]:
        return {
            "uid": self.uid,
            "task": self.task,
            "agent": self.agent,
            "test": self.test,
            "verdict": self.verdict.status,
            "reason": self.verdict.reason,
            "check": self.verdict.check,
            "base": self.base,
            "attempt_ref": self.ref,
            "attempt_commit": self.record,
            "tree": self.snapshot.tree if self.snapshot else None,
            "target_old": self.move.old if self.move else self.target_before,
            "target_new": self.move.new if self.move else self.target_before,
            "promotion": self.move.kind if self.move else None,
            "retested": bool(self.move and self.move.retested),
            "retest_skipped": self.retest_skipped,
            "external_move": self.external_move,
            "state": self.state,
            "resumed_from": self.resumed_from,
            "sandbox": self.sandbox,
            "results": self.results,
            "record_problem": self.record_problem,
            "changed_paths": list(self.changed_paths),
            "timings_ms": {k: round(v, 3) for k, v in self.timings.items()},
        }


class Engine:
    """The lifecycle against one base repository and one target branch."""

    def __init__(
        self,
        repo: BaseRepo,
        target: str,
        *,
        promote: bool = False,
        base: str | None = None,
        workdir: Path | None = None,
        gate: GateSpec | None = None,
        retest: bool = True,
        exclude: Sequence[str] = DEFAULT_EXCLUDE,
        max_files: int = DEFAULT_MAX_FILES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        agent: str = "agent",
        recycle: bool = True,
        remote: str | None = None,
        sandbox_settings: sandbox.Settings | None = None,
        isolation: str = "shared",
        allow_symlinks: Sequence[str] = (),
    ) -> None:
        self.repo = repo
        self.target = target
        self.promote_enabled = promote
        self.pinned_base = base
        self.workdir = workdir or Path(tempfile.gettempdir()) / "agentgate"
        self.gate = gate or GateSpec()
        self.retest = retest
        self.exclude = tuple(exclude)
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.agent = attempts.check_name(agent, "agent name", "agent")
        self.recycle = recycle
        #: The target on a server (``--agentgate-remote``), promoted by push with a lease.
        self.remote = RemoteTarget(repo, remote, target) if remote else None
        if isolation not in ISOLATIONS:
            raise ConfigError(
                f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}",
                value=isolation,
                source="isolation",
            )
        self.isolation = isolation
        self.allow_symlinks = tuple(allow_symlinks)
        settings = sandbox_settings or sandbox.Settings()
        #: The containment in force (probed once): bwrap, or none and why.
        self.sandbox = sandbox.resolve(settings)
        self.agent_role = sandbox.Role(
            "agent", settings.agent_network == "host", settings.agent_env
        )
        self.gate_role = sandbox.Role("gate", settings.gate_network == "host", settings.gate_env)
        self._private: Path | None = None
        self._baselines: dict[str, dict[str, str]] = {}
        #: What the start of the run completed for earlier runs (records of pending moves).
        self.settled: list[str] = []
        self._pool: list[Workspace] = []
        self._known_tips: set[str] = set()
        self._started = False

    @classmethod
    def open(
        cls,
        repo: str | Path,
        target: str | None = None,
        *,
        base: str | None = None,
        sources: dict[str, str] | None = None,
        **kwargs: object,
    ) -> Engine:
        """Open the repository, check names and git's version, and resolve the base.

        ``sources`` maps ``repo``/``target``/``base`` to where each value came from, so an
        error can name it (``--agentgate-target``, ``ini agentgate_target``...).
        """
        where = sources or {}
        _git.require_version()
        base_repo = BaseRepo.open(repo, where.get("repo", "repo"))
        if target is None:
            target = base_repo.head_branch()
            if target is None:
                raise ConfigError(
                    f"{base_repo.label} has no branch checked out (detached HEAD or bare); "
                    "name the target with --agentgate-target BRANCH",
                    source=where.get("target", "target"),
                )
        check_branch_name(target, where.get("target", "target"))
        remote = kwargs.get("remote")
        if isinstance(remote, str) and remote:
            server = RemoteTarget(base_repo, remote, target)
            server.check(where.get("remote", "remote"))
            if server.fetch() is None:
                raise ConfigError(
                    f"branch {target!r} does not exist on remote {remote!r}",
                    value=target,
                    source=where.get("target", "target"),
                )
        elif base_repo.resolve(f"refs/heads/{target}") is None:
            if base_repo.resolve("HEAD") is None and not base_repo.refs("refs/heads/"):
                raise ConfigError(
                    f"{base_repo.label} has no commits yet; commit something first",
                    value=target,
                    source=where.get("repo", "repo"),
                )
            raise ConfigError(
                f"branch {target!r} does not exist in {base_repo.label}; "
                "name an existing branch with --agentgate-target",
                value=target,
                source=where.get("target", "target"),
            )
        pinned = None
        if base:
            try:
                pinned = base_repo.commit(base, where.get("base", "base"))
            except RevisionNotFound as exc:
                if base_repo.is_shallow():
                    raise ConfigError(
                        f"{base!r} does not name a commit in {base_repo.label}, which is a shallow "
                        "clone: deepen it with 'git fetch --unshallow' (or --deepen N) and run again",
                        value=base,
                        source=exc.source,
                    ) from exc
                raise
        engine = cls(base_repo, target, base=pinned, **kwargs)  # type: ignore[arg-type]
        return engine

    # -- where things land ------------------------------------------------------------

    @property
    def ref(self) -> str:
        """The ref attempts are judged against and promoted to: the branch (or, for a
        remote target, the plugin's tracking ref of it), or the dry-run scratch ref."""
        if self.remote is not None and self.promote_enabled:
            return self.remote.tracking
        return promote.target_ref(self.target, dry_run=not self.promote_enabled)

    def _target_tip(self) -> str:
        """The target's tip now: fetched from the server for a remote target."""
        if self.remote is not None:
            tip = self.remote.fetch()
            if tip is None:
                raise ConfigError(
                    f"branch {self.target!r} is gone from remote {self.remote.remote!r}"
                )
            return tip
        return self.repo.commit(f"refs/heads/{self.target}", "target")

    def start(self, run_id: str | None = None) -> None:
        """Begin a run: in a dry run, reset the scratch ref to the target's tip once per run.

        Every process of one run (pytest-xdist workers) passes the same ``run_id``, so the
        first one resets the scratch ref and the others judge against what it accumulates.
        """
        if self._started:
            return
        self._started = True
        if self.promote_enabled and self.remote is not None:
            with promote.target_lock(self.repo, self.ref):
                self.remote.fetch()
                self.settled = pending.settle(self.repo, self.ref)
            return
        if self.promote_enabled:
            # A run killed (or whose disk filled) between moving the target and writing its
            # record, or updating its checked-out files, left a pending line or a journal:
            # finish both before anything else moves.
            with promote.target_lock(self.repo, self.ref):
                self.settled = pending.settle(self.repo, self.ref)
                checkout.recover_worktree(self.repo, self.ref)
            return
        run_id = run_id or uuid.uuid4().hex
        marker = self.repo.private_dir / "dryrun" / f"{self.target.replace('/', '%2F')}.run"
        marker.parent.mkdir(exist_ok=True)
        with promote.target_lock(self.repo, self.ref):
            try:
                seen = marker.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                seen = ""
            if seen == run_id:
                return
            self.settled = pending.settle(self.repo, self.ref)
            tip = self._target_tip()
            current = self.repo.ref_value(self.ref)
            if current != tip:
                if not self.repo.update_ref(self.ref, tip, current, "agentgate dry run starts"):
                    raise GitError(["update-ref", self.ref], 1, "scratch ref moved while resetting")
                oplog.append(
                    self.repo.common_dir,
                    oplog.OpRecord(
                        op="dryrun-reset", ref=self.ref, old=current, new=tip, agent=self.agent
                    ),
                )
            marker.write_text(run_id + "\n", encoding="utf-8")

    # -- the lifecycle, step by step ------------------------------------------------------

    def fork(self, task: str = "task", base: str | None = None) -> Workspace:
        """A private workspace at ``base``, the pinned base, or the target's tip now."""
        self.start()
        if base or self.pinned_base:
            at = base or self.pinned_base
        elif self.remote is not None and self.promote_enabled:
            at = self._target_tip()
        else:
            at = self.repo.commit(self.ref, "target")
        assert at is not None
        name = attempts.slugify(task)[:30]
        while self.recycle and self._pool:
            used = self._pool.pop()
            try:
                return self._contain(workspace.recycle(used, at, name))
            except workspace.RecycleFailed:
                workspace.remove(used)
        private = self.private_root() / secrets.token_hex(16)
        private.mkdir(mode=0o700)
        ws = workspace.fork(
            self.repo,
            at,
            self.target,
            self.workdir,
            name,
            sealed=self.isolation == "sealed",
            private=private,
        )
        return self._contain(ws)

    def _contain(self, ws: Workspace) -> Workspace:
        ws.sandbox = self._sandbox_now()
        ws.role = self.agent_role
        return ws

    def _sandbox_now(self) -> sandbox.Sandbox:
        """The sandbox with what it must hide today (the workdir can be set after opening)."""
        hidden = [self.workdir, self.repo.git_dir, self.repo.common_dir]
        if self.repo.worktree is not None:
            hidden.append(self.repo.worktree)
        if self._private is not None:
            hidden.append(self._private)
        return replace(self.sandbox.with_hidden(*hidden), base_tree=self.repo.worktree)

    def private_root(self) -> Path:
        """The run's private directory: gate checkouts and each command's /tmp and $HOME.

        Mode 0700, an unguessable name, hidden in the sandbox with the whole workdir.
        """
        if self._private is None or self._private.parent != self.workdir:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._private = Path(tempfile.mkdtemp(prefix=".private-", dir=self.workdir))
            self._private.chmod(0o700)
        return self._private

    def gate_context(self) -> GateContext:
        return GateContext(self.private_root(), self._sandbox_now(), self.gate_role)

    def release(self, ws: Workspace) -> None:
        """Hand a workspace back once its attempt is recorded: pooled for reuse, or removed."""
        if self.recycle:
            ws.end_processes()
            self._pool.append(ws)
        else:
            workspace.remove(ws)

    def close(self) -> None:
        """Remove the pooled workspaces (they hold nothing but a copy of a base)."""
        while self._pool:
            workspace.remove(self._pool.pop())
        if self._private is not None:
            remove_tree(self._private)
            self._private = None

    def snapshot(self, ws: Workspace) -> Snapshot:
        return workspace.snapshot(
            ws,
            exclude=self.exclude,
            max_files=self.max_files,
            max_bytes=self.max_bytes,
            allow_symlinks=self.allow_symlinks,
        )

    def judge(
        self, attempt: Attempt, spec: GateSpec, extra_checks: Sequence[Check] = ()
    ) -> list[CheckResult]:
        assert attempt.snapshot is not None
        base = self.baseline(attempt.base, spec)
        return judge(
            self.repo, attempt.snapshot, spec, attempt, self.gate_context(), extra_checks, base
        )

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
                if argv is not None and not _program_exists(argv[0]):
                    raise ConfigError(
                        f"gate program {argv[0]!r} not found (gate command {command!r}); "
                        "fix the command or install the program",
                        value=command,
                        source="gate",
                    )
        tip = self.repo.ref_value(self.ref) if self.remote is None else None
        if self.promote_enabled and tip and checkout.checked_out(self.repo, self.ref):
            # Under the target's lock: another run may be updating those very files (and
            # holding git's index lock) right now.
            with promote.target_lock(self.repo, self.ref):
                dirty = checkout.dirty_paths(self.repo)
            if dirty:
                from .errors import DirtyWorktree

                raise DirtyWorktree(self.repo.worktree, dirty)
        base = self.pinned_base or tip or self._target_tip()
        warnings = []
        seen: set[tuple[results.Command, ...]] = set()
        for spec in specs:
            if spec.grading is not None:  # a task that grades nothing is found now
                self.grading_plan(base, spec)
                continue
            if spec.commands in seen:
                continue
            seen.add(spec.commands)
            found = self.baseline(base, spec)
            failing = results.failing(found or {})
            if failing:
                warnings.append(
                    f"the base {base[:12]} fails {len(failing)} test(s) of its own gate, not "
                    f"required of the attempts: {', '.join(failing[:10])}"
                    + (" ..." if len(failing) > 10 else "")
                )
        return warnings

    def _baseline_key(self, tree: str, spec: GateSpec) -> str:
        from .gate import environment_plugins

        role = self.gate_role
        named = [f"{n}={os.environ.get(n, '')}" for n in role.env_names]  # hashed into the key
        return baseline.key(
            tree,
            spec.commands,
            spec.results_file,
            [self.sandbox.label, str(role.network), *named, *environment_plugins(),
             *baseline.installed()],
        )  # fmt: skip

    def baseline(self, base: str, spec: GateSpec) -> dict[str, str] | None:
        """The gate's per-test results on ``base``'s tree: from git, or computed once now.

        None when the gate reports no per-test results (no pytest command, no results file).
        Raises :class:`HarnessBroken` when the gate cannot run on the base at all, or runs no
        test there: no attempt can be judged against that.
        """
        if not spec.commands or not any(_reports(c, spec) for c in spec.commands):
            return None
        return self._baseline_of(self.repo.tree_of(base), base, spec)

    def _baseline_of(self, tree: str, base: str, spec: GateSpec) -> dict[str, str] | None:
        name = self._baseline_key(tree, spec)
        found = self._baselines.get(name)
        if found is not None:
            return found

        def compute() -> dict[str, str] | None:
            run = run_commands(self.repo, tree, spec, self.gate_context(), "baseline", collect=True)
            if not run.ok:
                raise HarnessBroken(base, run.message, run.output)
            if not run.tests:
                raise HarnessBroken(base, "the gate ran no test on the base", run.output)
            return dict(run.tests)

        found = baseline.get_or_compute(self.repo, name, tree, compute)
        if found is not None:
            self._baselines[name] = found
        return found

    # -- grading ------------------------------------------------------------------------

    def grading_plan(
        self, base: str, spec: GateSpec
    ) -> tuple[GateSpec, dict[str, str], tuple[str, ...]]:
        """For a graded task: (the spec that runs the graded tests, the results on the base
        with the graded files applied, the pass-to-pass tests).

        Raises ``ConfigError`` when a fail-to-pass test already passes there: such a task
        grades nothing, and that is found before the agent works.
        """
        assert spec.grading is not None
        g = spec.grading
        tests_from = g.tests_from or base
        files = grading.test_files(self.repo, base, tests_from, g)
        tree = grading.graded_tree(self.repo, self.repo.tree_of(base), tests_from, files)
        import sys

        ids = [*g.fail_to_pass, *(g.pass_to_pass or ())]
        graded = replace(
            spec, commands=(grading.command(spec.commands, sys.executable, ids),), grading=None
        )
        found = self._baseline_of(tree, base, graded) or {}
        already = [t for t in g.fail_to_pass if found.get(t) == results.PASSED]
        if already:
            raise ConfigError(
                f"fail_to_pass test(s) already pass on the base (with the files of "
                f"{tests_from[:12]}): {', '.join(already)}; they grade nothing",
                value=already,
                source="fail_to_pass",
            )
        keep = g.pass_to_pass
        if keep is None:
            keep = tuple(
                sorted(
                    t for t, o in found.items() if o == results.PASSED and t not in g.fail_to_pass
                )
            )
        return graded, found, keep

    def _grade(self, attempt: Attempt, spec: GateSpec) -> tuple[Verdict | None, GateSpec]:
        """Grade the attempt; on FULL, its commit becomes the graded tree (see grading)."""
        assert spec.grading is not None and attempt.snapshot is not None
        g = spec.grading
        try:
            graded, attempt.graded_baseline, keep = self.grading_plan(attempt.base, spec)
        except ConfigError as exc:
            return Verdict("error", str(exc), "grade"), spec
        tests_from = g.tests_from or attempt.base
        files = grading.test_files(
            self.repo, attempt.base, tests_from, g, attempt.snapshot.changed_paths
        )
        tree = grading.graded_tree(self.repo, attempt.snapshot.tree, tests_from, files)
        run = run_commands(
            self.repo, tree, graded, self.gate_context(), "grade", collect=True, harness_fault=False
        )
        if not run.ok and not run.harness_error:
            return Verdict("rejected", run.message, "grade", run.output), spec
        if run.flaky and spec.flaky == "reject":
            flaky = ", ".join(run.flaky[:5])
            return Verdict(
                "rejected", f"flaky: {flaky} failed, then passed when run again", "grade"
            ), spec
        if run.tests is None:
            return Verdict(
                "error", run.message or "the graded tests reported nothing", "grade"
            ), spec
        outcomes = {t: results.PASSED if o == results.FLAKY else o for t, o in run.tests.items()}
        outcome = grading.grade(outcomes, g.fail_to_pass, keep)
        attempt.results = {**(attempt.results or {}), **outcome.as_dict()}
        attempt.graded_tree = tree
        if outcome.grade != grading.FULL:
            return Verdict("rejected", outcome.reason(), "grade", run.output), spec
        return None, graded

    def preflight(self, attempt: Attempt) -> MergePreview:
        """A deep three-way merge of the attempt with the target's current tip; moves nothing."""
        assert attempt.commit is not None
        tip = self.repo.commit(self.ref, "target")
        attempt.target_before = tip
        attempt.external_move = self.note_external_move(tip, attempt.agent)
        if tip == attempt.base:  # merging onto its own parent: the attempt's tree, clean
            return MergePreview(self.repo.tree_of(attempt.commit), ())
        return self.repo.merge_preview(tip, attempt.commit)

    def capture_state(self, attempt: Attempt, paths: Sequence[str]) -> str | None:
        """Commit the declared state the agent left into ``attempt.state``; say what failed."""
        try:
            attempt.state = state_module.capture(
                self.repo,
                attempt.path,
                paths,
                message=f"agentgate state: {attempt.task}\n",
                author=Author.for_agent(attempt.agent),
                parent=attempt.resumed_from,
                exclude=self.exclude,
                skipped=attempt.state_excluded,
            )
        except (state_module.StateError, OSError, sqlite3.Error) as exc:
            return f"state could not be captured: {exc}"
        return None

    def resume(self, ws: Workspace, task: str) -> str | None:
        """Restore into ``ws`` the state of the newest earlier attempt at ``task`` that has one."""
        slug = attempts.slugify(task)
        for earlier in attempts.list_attempts(self.repo):
            if earlier.ref.split("/")[3] == slug and earlier.trailers.get("State"):
                commit = earlier.trailers["State"]
                state_module.restore(self.repo, commit, ws.path, overwrite=True)
                ws.resumed_from = commit
                return commit
        return None

    def note_external_move(self, tip: str, agent: str) -> str | None:
        """Log (once) a target tip that no agentgate record accounts for.

        Judged by the plugin's own records, never by reflog text (anyone can write that): a
        tip is the plugin's when an attempt record names it as landed, or the operations log
        has it as the end of a promotion, rollback, revert or pending move. The tip found the
        first time the plugin meets a target is where it starts, not a move. An external move
        is not an error: promotion merges on top of it like any moved target, never over it.
        """
        if not self.promote_enabled or self.remote is not None or tip in self._known_tips:
            return None
        self._known_tips.add(tip)
        ours = ("promote", "rollback", "revert", "pending", "external-move")
        used_before = False
        for record in oplog.read(self.repo.common_dir):
            if record.ref != self.ref:
                continue
            used_before = True
            if record.new == tip and record.op in ours:
                return None
        if not used_before or tip in {a.landed for a in attempts.list_attempts(self.repo)}:
            return None
        entry = self.repo.last_reflog_entry(self.ref)
        how = entry[1] if entry is not None and entry[0] == tip else "no reflog entry"
        with contextlib.suppress(OSError):
            oplog.append(
                self.repo.common_dir,
                oplog.OpRecord(op="external-move", ref=self.ref, old=None, new=tip, note=how),
            )
        return how

    def _tip_results(self, tip: str, spec: GateSpec) -> dict[str, str] | None:
        """The results of the target's tip: stored by the landing that made it, else now."""
        if not any(_reports(c, spec) for c in spec.commands):
            return None
        try:
            return self._baseline_of(self.repo.tree_of(tip), tip, spec)
        except HarnessBroken:
            return None  # the tip cannot run this gate (a graded command): the base decides

    def _keep_baseline(self, tree: str, spec: GateSpec, tests: Mapping[str, str]) -> None:
        """Store results a passing gate already produced as ``tree``'s baseline (best effort)."""
        with contextlib.suppress(AgentgateError, OSError):
            baseline.store(self.repo, self._baseline_key(tree, spec), tree, tests)

    def land(self, attempt: Attempt, spec: GateSpec) -> PromoteOutcome:
        """Promote the attempt's commit onto the target (or the dry-run ref)."""
        assert attempt.commit is not None
        retest = None
        if spec.commands and self.retest:
            base_results = (
                attempt.graded_baseline
                if attempt.graded_tree is not None
                else self.baseline(attempt.base, spec)
            )

            def retest(tree: str, tip: str) -> tuple[bool, str, str]:
                # Held to what passed on the attempt's base and on the tip it merges onto: a
                # test another landing fixed must not break again in the merge.
                held = _either_passed(base_results, self._tip_results(tip, spec))
                result = run_commands(
                    self.repo, tree, spec, self.gate_context(), "retest", baseline=held
                )
                if result.ok and result.tests:  # the merged tree is a baseline for free
                    self._keep_baseline(tree, spec, result.tests)
                return result.ok, result.message, result.output

        elif spec.commands:
            attempt.retest_skipped = True
        verb = "promote" if self.promote_enabled else "dry-run promote"
        status: Status = "promoted" if self.promote_enabled else "passed"

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

        return promote.promote(
            self.repo,
            self.ref,
            attempt.commit,
            attempt.base,
            author=Author.for_agent(attempt.agent),
            message=f"agentgate: merge {attempts.one_line(attempt.task)}\n\n"
            + attempts.trailer_lines({"Agent": attempt.agent, "Task": attempt.task}),
            reflog_message=f"agentgate {verb}: {attempts.one_line(attempt.task)[:80]} by {attempt.agent}",
            retest=retest,
            agent=attempt.agent,
            task=attempt.task,
            expected_tip=attempt.target_before,
            known_objects=attempt.snapshot.new_objects if attempt.snapshot else None,
            remote=self.remote if self.promote_enabled else None,
            pending={**self.record_fields(attempt), "status": status},
            on_moved=on_moved,
        )

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
            "results": attempt.results,
            "graded_tree": attempt.graded_tree or "",
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
        if attempt.ref is not None:
            return attempt.ref
        v = attempt.verdict
        output = "" if v.accepted else (v.output or attempt.workspace.output_tail())
        ref, commit = attempts.write_record(
            self.repo,
            self.record_fields(attempt),
            status=v.status,
            reason=v.reason,
            check=v.check,
            output=output,
            landed=attempt.move.new if attempt.move and self.promote_enabled else None,
            known_objects=attempt.snapshot.new_objects if attempt.snapshot else (),
        )
        attempt.ref, attempt.record = ref, commit
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
    ) -> Attempt:
        """Judge what the agent left in ``ws`` and promote it if everything passes.

        ``test_failure`` is the reason the test body failed, if it did (that rejects).
        ``state`` names paths outside the code (a database, an artifact) to carry with the
        attempt. Whatever happens, the attempt is recorded; errors become an ``error`` verdict.
        """
        if agent is not None:
            attempts.check_name(agent, "agent name", "run_attempt(agent=...)")
        attempt = Attempt(task=task, agent=agent or self.agent, workspace=ws, test=test)
        attempt.sandbox = ws.sandbox.label
        attempt.resumed_from = ws.resumed_from
        attempt.timings["fork"] = ws.fork_ms
        spec = spec or self.gate
        ws.end_processes()
        try:
            attempt.verdict = self._decide(attempt, spec, test_failure, extra_checks, state)
        except AgentgateError as exc:
            attempt.verdict = Verdict("error", str(exc), "engine")
        except OSError as exc:  # a full disk, an I/O error: before the move, nothing moved
            moved = attempt.move is not None
            attempt.verdict = Verdict(
                "promoted" if moved and self.promote_enabled else "passed" if moved else "error",
                f"a write failed: {exc}" + ("" if moved else "; nothing moved"),
                "" if moved else "engine",
            )
        finally:
            clock = time.perf_counter()
            if attempt.target_before is None:  # decided before preflight read it
                attempt.target_before = self.repo.ref_value(self.ref)
            if attempt.record_problem is None:
                try:
                    self.record(attempt)
                except (AgentgateError, OSError) as exc:
                    attempt.record_problem = f"the attempt record could not be written: {exc}"
            attempt.timings["record"] = (time.perf_counter() - clock) * 1000
        return attempt

    def _decide(  # noqa: PLR0915 - the lifecycle, one step after another
        self,
        attempt: Attempt,
        spec: GateSpec,
        test_failure: str | None,
        extra_checks: Sequence[Check],
        state: Sequence[str] = (),
    ) -> Verdict:
        timings = attempt.timings
        clock = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[name] = (now - clock) * 1000
            clock = now

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
        if test_failure is not None:
            return Verdict("rejected", f"the test failed: {test_failure}", "test")
        if attempt.snapshot.tree == attempt.snapshot.base_tree:
            return Verdict("rejected", "no changes", "snapshot")
        if not spec.has_gate:
            return Verdict("error", NO_GATE, "gate")
        gate_spec = replace(spec, commands=()) if spec.grading is not None else spec
        try:
            attempt.checks = self.judge(attempt, gate_spec, extra_checks)
        except HarnessBroken as exc:
            return Verdict("error", str(exc), "baseline", exc.output)
        lap("gate")
        for check in attempt.checks:
            if check.comparison is not None:
                attempt.results = check.comparison.as_dict()
            if check.ok and check.tests and check.name == "gate":  # its tree's baseline, free
                self._keep_baseline(attempt.snapshot.tree, spec, check.tests)
            if check.flaky:
                attempt.results = {**(attempt.results or {}), "flaky_ids": list(check.flaky)}
        failed = next((c for c in attempt.checks if not c.ok), None)
        if failed is not None:
            if failed.harness_error:
                return Verdict("error", failed.message, failed.name, failed.output)
            return Verdict("rejected", failed.message, failed.name, failed.output)
        if spec.grading is not None:
            try:
                graded, spec = self._grade(attempt, spec)
            except HarnessBroken as exc:
                return Verdict("error", str(exc), "grade", exc.output)
            lap("grade")
            if graded is not None:
                return graded
        author = Author.for_agent(attempt.agent)
        attempt.commit = self.repo.commit_tree(
            attempt.graded_tree or attempt.snapshot.tree,
            [attempt.base],
            f"{attempts.one_line(attempt.task)}\n\n"
            + attempts.trailer_lines({"Agent": attempt.agent, "Task": attempt.task}),
            author,
        )
        attempt.preview = self.preflight(attempt)
        lap("preflight")
        if attempt.preview.conflicts:
            return Verdict(
                "conflict",
                f"preflight merge conflicts in: {', '.join(attempt.preview.conflicts)}",
                "preflight",
            )
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
        attempt.move = outcome.move
        if outcome.move is not None:
            self._known_tips.add(outcome.move.new)
        problem = outcome.move.problem if outcome.move else None
        return Verdict("promoted" if self.promote_enabled else "passed", problem or "", "")
