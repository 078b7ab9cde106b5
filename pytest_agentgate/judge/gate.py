"""The checks that decide an attempt, and the verdict they make.

Order matters and is fixed: the test's own outcome, the protected harness and the diff limits,
checks written in Python, then gate commands, each in a clean checkout of the exact tree being
judged, judged by their per-test results against the base's where they report any. The first
check that fails decides; later ones are not run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import os
import secrets
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..sandbox.containment import ALLOWED_ENV, Mounts, Role, python_paths, run_contained
from ..sandbox.process import CommandResult, Running, Watch
from ..sandbox.removal import remove_later
from ..workspace.fork import checkout_tree
from . import boundary, harness, notes, results, tamper
from .base_tests import gone, split_tests
from .bytecode import new_folder
from .channel import INSIDE, Channel, Report, unexpected
from .environment import plugins_of
from .pycfiles import env_roots
from .spec import DEFAULT_GATE_TIMEOUT, Check, CheckResult, GateContext, GateSpec, Judging, Verdict

if TYPE_CHECKING:
    from ..git.repo import BaseRepo
    from ..workspace.snapshot import Snapshot

__all__ = [
    "DEFAULT_GATE_TIMEOUT",
    "Check",
    "CheckResult",
    "GateContext",
    "GateSpec",
    "Judging",
    "Verdict",
    "check_limits",
    "judge",
    "run_check",
    "run_commands",
]


#: A gate run with nothing to hold it to (the default of :func:`run_commands`).
_GATE = Judging()


def check_limits(
    repo: BaseRepo, snap: Snapshot, spec: GateSpec, allow_symlinks: Sequence[str] = ()
) -> CheckResult:
    """The protected harness, protected paths and the changed-line budget."""
    changed = snap.changed_paths
    broken = harness.violations(
        spec.harness, changed, snap.base_tree, snap.tree, _Trees(repo), allow_symlinks,
        [*(results.display(c) for c in spec.commands), *spec.setup],
    )  # fmt: skip
    touched = [p for p in changed if any(fnmatch.fnmatchcase(p, g) for g in spec.protect)]
    if broken or touched:
        what = [*broken, *(p for p in touched if not any(b.startswith(p) for b in broken))]
        note = (
            "; the test harness is the base's (lift a rule with --agentgate-unprotect NAME)"
            if broken
            else ""
        )
        return CheckResult(
            False, f"changes protected paths: {', '.join(what)}{note}", name="protect"
        )
    if spec.max_changed_lines is not None:
        lines = repo.changed_lines(snap.base_tree, snap.tree)
        if lines > spec.max_changed_lines:
            return CheckResult(
                False,
                f"changes {lines} lines, over max_changed_lines={spec.max_changed_lines}",
                name="max_changed_lines",
            )
    return CheckResult(True, name="limits")


@dataclass(frozen=True)
class _Trees:
    """The harness rules' view of the repository's trees (see :class:`.harness.Trees`)."""

    repo: BaseRepo

    def read(self, tree: str, path: str) -> bytes | None:
        return self.repo.read_blob(f"{tree}:{path}")

    def paths(self, tree: str) -> Sequence[str]:
        return self.repo.tree_paths(tree)

    def links(self, tree: str, paths: Sequence[str]) -> set[str]:
        found = (self.repo.tree_entry(tree, p) for p in paths)
        return {e.path for e in found if e is not None and e.is_link}

    def attributes(
        self, tree: str, paths: Sequence[str], names: Sequence[str]
    ) -> Mapping[str, tuple[str, ...]]:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="agentgate-attr-") as tmp:
            index = self.repo.index(None, Path(tmp) / "index")
            index.read_tree(tree)
            return index.attributes(paths, names)


def run_check(check: Check, attempt: Any) -> CheckResult:
    """Run one Python check; an exception it raises is a failed check, not a crash.

    A check that answers anything but a bool or a :class:`CheckResult` (or builds a
    CheckResult wrongly) is the harness's error, named, never a pass.
    """
    name = getattr(check, "__name__", repr(check))
    try:
        answer = check(attempt)
    except TypeError as exc:
        if "CheckResult(ok" in str(exc):
            return CheckResult(False, f"check {name}: {exc}", name=name, harness_error=True)
        return CheckResult(False, f"check {name} raised TypeError: {exc}", name=name)
    except Exception as exc:
        return CheckResult(False, f"check {name} raised {type(exc).__name__}: {exc}", name=name)
    if isinstance(answer, CheckResult):
        return answer if answer.name else dataclasses.replace(answer, name=name)
    if isinstance(answer, bool):
        return CheckResult(answer, "" if answer else f"check {name} returned False", name=name)
    return CheckResult(
        False,
        f"check {name} returned {answer!r}; return a bool or a CheckResult",
        name=name,
        harness_error=True,
    )


def run_commands(
    repo: BaseRepo,
    tree: str,
    spec: GateSpec,
    context: GateContext | Path,
    how: Judging = _GATE,
    running: Running | None = None,
) -> CheckResult:
    """Run each gate command in its own clean checkout of ``tree``; the first failure decides.

    Each command runs in the sandbox when there is one, with the gate's environment, and
    nothing it started outlives it. A simple command is exec'd by the plugin, so a program
    that cannot start (or an exit status that was lost) is a harness error, never the agent's
    failure. Every pytest a command starts, however it is wrapped, reports per-test results
    on the command's channel (:mod:`.channel`), which decide with ``how.baseline``: exit 1
    with only the base's own failures still passes; exit 0 with a test lost does not; and
    what pytest loaded must be what it loaded on the base (``how.expected``, the base's
    fingerprint). A command from which no results came back is judged by its exit code:
    under ``context.require_results`` that is an error unless the command was declared so
    (:meth:`GateSpec.by_exit_code`). ``how.collect`` runs every command to the end and
    returns what they reported (for a baseline, or a graded run); a command that fails is
    then the harness's fault unless ``how.harness_fault`` says otherwise (an attempt's
    graded run).

    A failing command runs again on the same tree up to ``spec.rerun`` times. A test that
    failed and then passed is flaky: under ``spec.flaky == "reject"`` that rejects, under
    ``"accept"`` the passing run counts; either way it is named. On a baseline, a flaky test
    is kept as ``flaky``: not required of attempts, not blamed on them.

    With ``running``, another thread can end the commands (:meth:`Running.end_all`): the
    queue's leader does, for an early re-test that is no longer wanted.
    """
    if isinstance(context, Path):
        context = GateContext(context)
    run = _Run(repo, tree, spec, context, how)
    label, baseline, collect = how.label, how.baseline, how.collect

    def judge_command(command: results.Command, running: Running | None = None) -> _Judged:
        """One command, run again while it fails (``spec.rerun``)."""
        history: dict[str, list[str]] = {}
        runs = 0
        while True:
            if running is not None and running.ended:
                raise KeyboardInterrupt  # the gate was interrupted: start nothing more
            runs += 1
            ran = run.one(spec.commands.index(command), command, running)
            for test, outcome in (ran.tests or {}).items():
                history.setdefault(test, []).append(outcome)
            if runs > spec.rerun:
                break
            if collect:  # a baseline runs again while tests fail, to tell flaky from broken
                if ran.failure is not None or not ran.tests or not results.failing(ran.tests):
                    break
            elif ran.failure is None or ran.failure.harness_error:
                break
        now_flaky = sorted(
            t for t, seen in history.items()
            if seen[-1] == results.PASSED and any(o in (results.FAILED, results.ERROR) for o in seen)
        )  # fmt: skip
        if ran.failure is None and runs > 1 and not now_flaky and not collect:
            now_flaky = [f"{label}: {results.display(command)}"]  # it failed, then passed
        return ran, now_flaky

    if spec.jobs > 1 and len(spec.commands) > 1:
        # At once, each in its own checkout; judged below in the commands' order, so the
        # first failing command decides, as when they run one after another.
        outcomes = _at_once(judge_command, spec.commands, spec.jobs, running or Running())
    else:
        outcomes = []
        for command in spec.commands:
            outcomes.append(judge_command(command, running))
            if outcomes[-1][0].failure is not None:
                break
    return _gathered(spec, label, outcomes, baseline, collect)


def _gathered(
    spec: GateSpec,
    label: str,
    outcomes: Sequence[_Judged],
    baseline: Mapping[str, str] | None,
    collect: bool,
) -> CheckResult:
    """The gate's result from each command's, in the commands' order: the first failure
    decides; a flaky test rejects under ``spec.flaky == "reject"``; else it passed, with
    every command's per-test results merged and compared with ``baseline``."""
    tests: dict[str, str] = {}
    flaky: list[str] = []
    fingerprint: set[str] = set()
    by_exit_code: list[str] = []
    logs = tuple(ran.log for ran, _ in outcomes if ran.log is not None)
    reported = False
    for command, (ran, now_flaky) in zip(spec.commands, outcomes, strict=False):
        fingerprint |= ran.fingerprint
        if ran.tests is not None:
            reported = True
            tests.update(ran.tests)
            if collect:
                tests.update({t: results.FLAKY for t in now_flaky})
        elif not ran.refused:
            by_exit_code.append(results.display(command))
        flaky += now_flaky
        if ran.failure is not None:
            return dataclasses.replace(
                ran.failure,
                tests=tests if reported else None,
                flaky=tuple(flaky),
                fingerprint=frozenset(fingerprint),
                by_exit_code=tuple(by_exit_code),
                logs=logs,
            )
        if now_flaky and spec.flaky == "reject" and not collect:
            return CheckResult(
                False,
                f"flaky: {', '.join(now_flaky[:5])} failed, then passed when run again "
                "(--agentgate-flaky=reject)",
                name=f"{label}: {results.display(command)}",
                tests=tests,
                flaky=tuple(flaky),
                logs=logs,
            )
    comparison = _compare(spec, tests, baseline) if reported else None
    return CheckResult(
        True,
        name="gate",
        tests=tests if reported else None,
        comparison=comparison,
        flaky=tuple(flaky),
        fingerprint=frozenset(fingerprint),
        by_exit_code=tuple(by_exit_code),
        logs=logs,
    )


@dataclass(frozen=True)
class _Ran:
    """One run of one gate command: its failure (None: it passed), the per-test results it
    reported (None: none came back, it was judged by its exit code), and its fingerprint."""

    failure: CheckResult | None
    tests: dict[str, str] | None
    fingerprint: frozenset[str] = frozenset()
    #: Sessions reported, but their report could not be believed (not judged by exit code).
    refused: bool = False
    #: The command's output: (the command, what was kept of it, its size in bytes).
    log: tuple[str, str, int] | None = None


_Judged = tuple[_Ran, list[str]]


def _at_once(
    judge: Callable[[results.Command, Running], _Judged],
    commands: Sequence[results.Command],
    jobs: int,
    running: Running,
) -> list[_Judged]:
    """Judge ``commands`` at once, ``jobs`` at a time, each in its own thread."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="agentgate-gate")
    try:
        outcomes = list(pool.map(lambda c: judge(c, running), commands))
    except BaseException:
        # Ctrl-C, a timeout of the test: end the commands still running (each sweeps its
        # processes) rather than wait for each to finish, and start no more.
        running.end_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return outcomes


@contextlib.contextmanager
def _checkout_for(repo: BaseRepo, tree: str, context: GateContext, name: str) -> Iterator[Path]:
    """A clean checkout of exactly ``tree`` for one command: a kept one reset to it (see
    :mod:`.checkouts`), or a fresh one removed afterwards."""
    if context.checkouts is not None:
        with context.checkouts.checkout(tree, name) as path:
            yield path
        return
    path = checkout_tree(repo, tree, context.private_root, name=name)
    try:
        yield path
    finally:
        remove_later(path)  # its command has ended: the verdict need not wait for it


def _pytest_argv(argv: list[str], plugins: Sequence[str]) -> list[str]:
    """A pytest the plugin starts itself: only its environment's ``plugins`` (an entry point
    planted in the checkout loads nothing), no colour."""
    argv = list(argv)
    for plugin in plugins:
        argv += ["-p", plugin]
    # Naming a plugin and its submodule (xdist, xdist.looponfail) warns that the module was
    # imported before it could be rewritten: a base with filterwarnings=error would then
    # fail its own gate for the plugin's way of loading, not for its tests.
    argv += ["-W", "ignore::pytest.PytestAssertRewriteWarning", "--color=no"]
    return argv


def _would_have(env: Mapping[str, str], role: Role) -> dict[str, str]:
    """What of ``PYTHONPATH`` and ``PYTEST_PLUGINS`` the command's environment would hold."""
    found = {}
    for name in ("PYTHONPATH", "PYTEST_PLUGINS"):
        if name in env:
            found[name] = env[name]
        elif name in os.environ and (name in ALLOWED_ENV or name in role.env_names):
            found[name] = os.environ[name]
    return found


@dataclass(frozen=True)
class _Run:
    """How every command of one gate run is run and judged (see :func:`run_commands`)."""

    repo: BaseRepo
    tree: str
    spec: GateSpec
    context: GateContext
    how: Judging

    @functools.cached_property
    def tracked(self) -> frozenset[str]:
        """The tree's files, once for every command and rerun of this gate run. A gitlink
        is a folder whose files come and go: they are not the tree's."""
        links = self.repo.gitlinks(self.tree)
        return frozenset(p for p in self.repo.tree_paths(self.tree) if p not in links)

    def one(self, index: int, command: results.Command, running: Running | None) -> _Ran:
        """One run of one gate command in a clean checkout."""
        context, spec = self.context, self.spec
        name = secrets.token_hex(16)
        with _checkout_for(self.repo, self.tree, context, name) as checkout:
            private = context.private_root / f"{name}.private"
            private.mkdir(mode=0o700)
            channel = Channel(private / "results").open()
            report: Report | None = None
            try:
                argv, assigned = self._argv(command, checkout)
                boundary.write(checkout)
                contained = context.sandbox.active
                above = boundary.above(checkout, private) if contained else None
                before = tamper.identities(checkout, self.tracked)
                failed_setup = self._setup(checkout, private, above, running)
                touched = tamper.changed(checkout, before) if self.spec.setup else []
                if failed_setup is None and touched:
                    failed_setup = self._tampered(touched, "the gate's setup", "setup")
                    if context.checkouts is not None:
                        context.checkouts.spoil(checkout)
                if failed_setup is not None:
                    return _Ran(failed_setup, None)
                pycache, pycache_inside = self._bytecode(checkout, private)
                env = self._environment(checkout, channel, assigned, pycache_inside)
                seen = ((channel.folder, INSIDE),) if contained else ()
                result = run_contained(
                    context.sandbox,
                    context.role,
                    argv if argv else results.display(command),
                    Mounts(checkout, private, ro_at=seen, above=above),
                    timeout=spec.timeout,
                    env=env,
                    watch=Watch(running=running),
                )
                touched = tamper.changed(checkout, before)
                report = channel.close()
                if context.bytecode is not None:
                    # A run of the trusted tree itself (the base's) that left its files as
                    # they were: what it compiled is the base's bytecode.
                    own = self.how.trusted == self.tree and not touched
                    context.bytecode.learn(
                        pycache, checkout, self.tree, base_run=own, env_roots=self.env_roots
                    )
                declared = self._read_declared(checkout)
                if touched:
                    if context.checkouts is not None:
                        context.checkouts.spoil(checkout)
                    shown = results.display(command)
                    return _Ran(self._tampered(touched, f"the gate command {shown}", shown), None)
                if context.checkouts is not None and (result.launch_error or result.timed_out):
                    # Its status lost (its supervisor killed: the sweep may not have run) or
                    # cut short: something may still write there. (Processes the sweep ended
                    # are gone; bwrap's own always counts as one.)
                    context.checkouts.spoil(checkout)
            finally:
                if report is None:
                    channel.close()
                remove_later(private)
        ran = self._judge(index, command, result, report, declared)
        shown = results.display(command)
        return dataclasses.replace(ran, log=(shown, result.output, result.output_bytes))

    def _argv(
        self, command: results.Command, checkout: Path
    ) -> tuple[list[str] | None, dict[str, str]]:
        """The command's words (None: a shell line) and the variables it assigns itself. A
        pytest gets the plugins of the environment its interpreter runs in, by name alone;
        where that cannot be told (a pyenv shim), it loads them as it would run by hand."""
        argv = results.argv_of(command)
        if argv is None:
            return None, {}
        assigned, argv = results.split_assignments(argv)
        path = assigned.get("PATH", self.spec.env.get("PATH"))
        plugins = plugins_of(argv[0], path, checkout) if argv else None
        if plugins is not None and results.is_pytest(argv):
            argv = _pytest_argv(argv, plugins)
            assigned["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        return argv, assigned

    def _bytecode(self, checkout: Path, private: Path) -> tuple[Path, Path]:
        """The command's bytecode folder, made now (after its setup steps), with what the
        plugin gives it written in: where it is here, and where the command sees it."""
        here, inside = new_folder(Mounts(checkout, private), self.context.sandbox.active)
        if self.context.bytecode is not None:
            self.context.bytecode.fill(
                here, checkout, self.tree, self.how.trusted, self.env_roots, self.rewrite
            )
        return here, inside

    @functools.cached_property
    def env_roots(self) -> list[str]:
        """Where the environment's modules may get bytecode (see :mod:`.bytecode`): what the
        sandbox shows, less what it hides, and less a folder holding what it masks."""
        sandbox = self.context.sandbox
        hidden = [*sandbox.hidden, *([sandbox.base_tree] if sandbox.base_tree else [])]
        return env_roots(python_paths(sandbox.base_tree), hidden, sandbox.masked())

    @functools.cached_property
    def rewrite(self) -> bool:
        """Whether test modules may be given rewritten bytecode: not when a command, a
        setup step or the gate's environment (its own, or a variable of the run's it is
        passed, as ``PYTEST_ADDOPTS``) may ask pytest for another shape of it."""
        said = [*(results.display(c) for c in self.spec.commands), *self.spec.setup]
        said += [f"{k}={v}" for k, v in self.spec.env.items()]
        said += [os.environ.get(n, "") for n in self.context.role.env_names]
        return not any("enable_assertion_pass_hook" in text for text in said)

    def _environment(
        self, checkout: Path, channel: Channel, assigned: Mapping[str, str], pycache: Path
    ) -> dict[str, str]:
        """The command's environment: the gate's, what the command assigns itself, the
        results channel, and what keeps its git and its pytest to the checkout."""
        env = {**self.spec.env, **assigned}
        env.update(
            channel.environment(
                _would_have(env, self.context.role),
                INSIDE if self.context.sandbox.active else None,
                only=self.spec.select,
                skip=self.spec.skip,
            )
        )
        # What the gate runs is the agent's code: give its git no inherited repository to
        # reach, and no way up out of the checkout (no .git there).
        env["GIT_CEILING_DIRECTORIES"] = str(checkout.parent)
        env["AGENTGATE_CHECKOUT"] = str(checkout)
        env["AGENTGATE_ACTIVE"] = "1"
        env.setdefault("NO_COLOR", "1")
        # Always the command's own folder: one the gate's environment named is one its setup
        # steps could write into as well.
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
        return env

    def _tampered(self, paths: Sequence[str], what: str, where: str) -> CheckResult:
        """A run whose ``what`` changed tracked files: the attempt's doing (on a baseline,
        the harness's: the base's own gate does it, which no attempt can be judged by)."""
        return CheckResult(
            False,
            tamper.reason(paths, what),
            name=f"{self.how.label}: {where}",
            harness_error=self.how.fault,
        )

    def _setup(
        self, checkout: Path, private: Path, above: Path | None, running: Running | None
    ) -> CheckResult | None:
        """Run the gate's setup commands in ``checkout``, in order; the first that fails
        decides (the attempt broke what the build generates, or the base did)."""
        for command in self.spec.setup:
            env = {**self.spec.env, "AGENTGATE_CHECKOUT": str(checkout), "NO_COLOR": "1"}
            env["GIT_CEILING_DIRECTORIES"] = str(checkout.parent)
            result = run_contained(
                self.context.sandbox, self.context.role, command,
                Mounts(checkout, private, above=above),
                timeout=self.spec.timeout, env=env, watch=Watch(running=running),
            )  # fmt: skip
            if not result.ok:
                how = "timed out" if result.timed_out else f"exited {result.returncode}"
                why = result.launch_error or how
                return CheckResult(
                    False, f"gate setup {why}: {command}", name=f"{self.how.label}: setup: {command}",
                    output=result.tail(), harness_error=bool(result.launch_error),
                )  # fmt: skip
        return None

    def _read_declared(self, checkout: Path) -> dict[str, str] | str | None:
        """The JUnit file a gate that is not pytest declared, read never through a link:
        its results, why it cannot be read, or None when none was declared."""
        if not self.spec.results_file:
            return None
        try:
            return results.parse_junit(results.read_inside(checkout, self.spec.results_file))
        except FileNotFoundError:
            return "wrote no results file"
        except (OSError, ET.ParseError) as exc:
            return f"left a results file that cannot be read ({exc})"

    def _judge(
        self,
        index: int,
        command: results.Command,
        result: CommandResult,
        report: Report,
        declared: dict[str, str] | str | None,
    ) -> _Ran:
        spec, shown = self.spec, results.display(command)
        where = f"{self.how.label}: {shown}"
        fail = functools.partial(CheckResult, False, name=where, output=result.tail())
        if result.launch_error:
            message = f"{result.launch_error} ({shown})" + notes.outside_view(self.context, result)
            return _Ran(fail(message, harness_error=True, never_ran=result.never_ran), None)
        found: dict[str, str] | None = None
        fingerprint: frozenset[str] = frozenset()
        if report.sessions:
            found, fingerprint = report.tests, report.fingerprint(index)
        elif isinstance(declared, dict):
            found = declared
        if result.timed_out:
            return _Ran(fail(f"gate timed out after {spec.timeout:g} s: {shown}"), found)
        if report.problem:
            failure = fail(report.problem, harness_error=self.how.fault)
            return _Ran(failure, None, fingerprint, refused=True)
        if isinstance(declared, str) and not report.sessions:
            return _Ran(
                fail(f"gate command {declared}: {shown}", harness_error=self.how.fault), None
            )
        if found is None:
            return self._by_exit_code(command, result, fail)
        strays = _strays(found, self.tracked)
        if strays:
            why = (
                "the gate ran tests from file(s) the tree it judges does not hold (written by "
                f"its setup, or by the gate itself): {', '.join(strays[:5])}"
            )
            return _Ran(fail(why), found, fingerprint)
        if self.how.expected is not None:
            odd = unexpected(fingerprint, self.how.expected, spec.harness, spec.additions)
            if odd:
                why = "the gate's pytest loaded what the base's run of it did not: "
                why += "; ".join(odd) + " (the test harness is the base's)"
                return _Ran(fail(why), found, fingerprint)
        return self._by_results(found, fingerprint, report, result, shown, fail)

    def _by_results(
        self,
        found: dict[str, str],
        fingerprint: frozenset[str],
        report: Report,
        result: CommandResult,
        shown: str,
        fail: Callable[..., CheckResult],
    ) -> _Ran:
        """Per-test results came back: they decide, with the exit statuses."""
        statuses = report.statuses if report.sessions else [result.returncode]
        # pytest's exit 1 means "some tests failed": the results say whether that is the
        # attempt's doing. Other codes (interrupted, internal or usage error, no tests) fail
        # whatever the results say. A wrapper that fails while its pytest passed failed.
        odd_status = next((c for c in statuses if c not in (0, 1)), None)
        wrapper_failed = result.returncode != 0 and all(c == 0 for c in statuses)
        if self.how.collect and odd_status is None and not wrapper_failed:
            return _Ran(None, found, fingerprint)
        verdict = _compare(self.spec, found, self.how.baseline)
        if self.spec.additions and 5 in statuses and not found and verdict.ok:
            odd_status = None  # its changed test modules hold no test now: none can fail
        accepted = odd_status is None and not wrapper_failed
        if accepted and 1 in statuses:
            accepted = _only_old_failures(found, self.how.baseline, self.spec.unrequired)
        if verdict.ok and accepted:
            return _Ran(None, found, fingerprint)
        # A re-test holds the merge to what passed on the attempt's base or on the tip it
        # merges onto: a test the tip alone has is not "a test of the base".
        before = (
            "before the merge (on its base or on the tip)" if self.how.label == "retest" else ""
        )
        reason = "" if self.how.collect else verdict.reason(before=before)
        if reason and self.spec.additions:
            reason = f"the attempt's own test files: {reason}"
        broken = report.collect_errors if report.sessions else {}
        if broken:
            # What could not be collected is the cause; the tests it held are what it cost.
            first = "; ".join(f"{where}: {line}" for where, line in list(broken.items())[:3])
            cause = f"{len(broken)} test file(s) could not be collected ({first})"
            reason = f"{cause}; so {reason}" if reason else cause
        if odd_status is not None:
            why = reason or f"the gate's pytest exited {odd_status}: {shown}"
            if reason:
                why += f" (the gate's pytest exited {odd_status})"
        elif wrapper_failed:
            why = f"gate command exited {result.returncode} after its pytest passed: {shown}"
        else:
            why = reason or f"gate command exited {result.returncode}: {shown}"
        failure = fail(why, comparison=verdict, harness_error=self.how.collect and self.how.fault)
        return _Ran(failure, found, fingerprint)

    def _by_exit_code(
        self, command: results.Command, result: CommandResult, fail: Callable[..., CheckResult]
    ) -> _Ran:
        """A command from which no per-test results came back: its exit code decides, unless
        results were required of it."""
        shown = results.display(command)
        # What the sandbox kept from the command (a shim's own program, an editable source)
        # is said in either case: it is the likelier cause.
        note = notes.hidden_editable(self.context.sandbox) + notes.outside_view(
            self.context, result
        )
        if not self.spec.by_exit_code(command) and self.context.require_results:
            why = notes.no_results(shown, result.output) + note
            return _Ran(fail(why, harness_error=True), None)
        if result.returncode != 0:
            why = f"gate command exited {result.returncode}: {shown}{note}"
            return _Ran(fail(why, harness_error=self.how.fault), None)
        return _Ran(None, None)


def _strays(found: Mapping[str, str], tracked: frozenset[str]) -> list[str]:
    """The files of the checkout that tests were reported from and the tree does not hold
    (a test id's file part; a path outside the checkout is not the tree's to hold)."""
    files = {t.partition("::")[0] for t in found}
    return sorted(
        f
        for f in files
        if f not in tracked and f not in (".", "") and not f.startswith(("/", "../"))
    )


def _compare(
    spec: GateSpec, found: Mapping[str, str], baseline: Mapping[str, str] | None
) -> results.Comparison:
    """``found`` against the base's results: the attempt's own test modules' session holds
    each of its tests to passing, any other compares test by test."""
    if spec.additions:
        return results.compare_additions(found, baseline)
    return results.compare(found, baseline, spec.allow_removed, spec.unrequired)


def _only_old_failures(
    found: Mapping[str, str], baseline: Mapping[str, str] | None, unrequired: Sequence[str] = ()
) -> bool:
    """Whether every failing test also fails on the base, or is one the comparison does not
    hold the attempt to (so exit 1 is not the attempt's). An exit 1 with no failing test
    reported is nobody's: pytest said some test failed, the report says none did, so the
    report is not the run's."""
    if not baseline or not results.failing(found):
        return False
    return all(
        baseline.get(t) in (results.FAILED, results.ERROR, results.FLAKY)
        or results.matches(t, unrequired)
        for t in results.failing(found)
    )


def judge(
    repo: BaseRepo,
    snap: Snapshot,
    spec: GateSpec,
    attempt: Any,
    context: GateContext | Path,
    extra_checks: Sequence[Check] = (),
    how: Judging = _GATE,
    *,
    allow_symlinks: Sequence[str] = (),
) -> list[CheckResult]:
    """Run the checks in order and return them up to and including the first failure.

    The gate commands are held to ``how.baseline`` and ``how.expected``; the snapshot's base
    is the tree whose bytes are trusted for bytecode."""
    found: list[CheckResult] = []
    limits = check_limits(repo, snap, spec, allow_symlinks)
    found.append(limits)
    if not limits.ok:
        return found
    for check in (*spec.checks, *extra_checks):
        outcome = run_check(check, attempt)
        found.append(outcome)
        if not outcome.ok:
            return found
    if spec.commands:
        trusted = how.trusted or snap.base_tree
        found.append(
            _sessions(repo, snap, spec, context, dataclasses.replace(how, trusted=trusted))
        )
    return found


def _sessions(
    repo: BaseRepo,
    snap: Snapshot,
    spec: GateSpec,
    context: GateContext | Path,
    how: Judging,
) -> CheckResult:
    """The gate commands on an attempt: the base's tests on its code, then its own added
    and changed test modules (see :mod:`.base_tests`); one session when it changed no test
    file, or when the spec says the attempt's tests judge (``tests_of="attempt"``)."""
    baseline = how.baseline
    if spec.tests_of != "base" or baseline is None:  # no per-test results to hold it to
        return run_commands(repo, snap.tree, spec, context, how)
    split = split_tests(repo, snap.base_tree, snap.tree, baseline, spec.allow_changed)
    if not split.split:
        return run_commands(repo, snap.tree, spec, context, how)
    first_spec = dataclasses.replace(spec, unrequired=split.not_required, skip=split.skipped)
    first = run_commands(repo, split.judged_tree, first_spec, context, how)
    first = dataclasses.replace(first, results_tree=split.judged_tree, changed_tests=split.changed)
    if not first.ok:
        return first
    second = CheckResult(True, name="gate", tests={})
    if split.modules:
        only = dataclasses.replace(spec, select=split.modules, additions=True)
        second = run_commands(repo, snap.tree, only, context, how)
    missing = gone(
        baseline, split.held, second.tests or {}, (*spec.allow_removed, *split.not_required)
    )
    if second.ok and missing:
        second = CheckResult(
            False,
            f"the attempt's own test files: {len(missing)} test(s) that passed on the base "
            f"are gone from them: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            + " (name a test a task may remove in allow_removed=)",
            name=f"gate: {results.display(spec.commands[0])}",
            tests=second.tests,
            logs=second.logs,
        )
    merged = dict(first.tests or {})
    for test, outcome in (second.tests or {}).items():
        if results.RANK.get(outcome, 0) >= results.RANK.get(merged.get(test, ""), 0):
            merged[test] = outcome
    reported = first.tests is not None or second.tests is not None
    comparison = (
        results.compare(merged, baseline, spec.allow_removed, split.not_required)
        if second.ok and reported
        else second.comparison
    )
    return dataclasses.replace(
        second if not second.ok else first,
        logs=(*first.logs, *second.logs),
        tests=merged if reported else None,
        comparison=comparison,
        flaky=(*first.flaky, *second.flaky),
        by_exit_code=tuple(dict.fromkeys((*first.by_exit_code, *second.by_exit_code))),
        results_tree=split.judged_tree,
        changed_tests=split.changed,
    )
