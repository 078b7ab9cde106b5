"""The pytest layer: options, ini keys, the ``gated`` marker, fixtures and the runtest wrapper.

This module is imported in every pytest run of every suite that has the plugin installed, so
it imports only pytest and the standard library; the engine (and with it filelock) is loaded
the first time a gated test is collected, and no git runs before that.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from ._constants import RUN_MARKER

if TYPE_CHECKING:
    from .engine import Attempt, Engine
    from .gate import GateSpec
    from .workspace import Workspace

MARKER = "gated"
MARKER_HELP = (
    "gated(task, *, agent=None, gate=None, checks=(), protect=(), allow_removed=(), "
    "max_changed_lines=None, "
    "state=(), resume=False): "
    "an agent task whose workspace (fixture agent_workspace) is snapshotted, gated by the "
    "test outcome, checks and gate commands, preflight-merged and promoted to the target"
)
ACTIVE_ENV = "AGENTGATE_ACTIVE"
#: The run's exit code when an attempt could not be judged (an ``error`` verdict: the gate
#: could not start, the sandbox failed, a write failed), beside pytest's own codes: 1 is then
#: left to rejected attempts (and failing tests), 4 to settings and a broken harness found
#: before any agent ran.
EXIT_HARNESS_ERROR = 6
AGENT_ENV = "AGENTGATE_AGENT"


class Option(NamedTuple):
    """One setting: its command-line flag, its ini key, its help and how to parse it."""

    name: str
    help: str
    kind: str = "string"  # string, linelist, bool, float, int
    default: Any = None
    metavar: str | None = None
    env: str | None = None  # an environment variable that sets it, below the command line

    @property
    def flag(self) -> str:
        return "--agentgate-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "agentgate_" + self.name


OPTIONS = (
    Option(
        "repo",
        "the repository the agents edit (default: the one around the rootdir)",
        metavar="PATH",
    ),
    Option(
        "target",
        "the branch attempts are promoted to (default: the checked-out branch)",
        metavar="BRANCH",
    ),
    Option(
        "base", "fork every workspace from this commit instead of the target's tip", metavar="REV"
    ),
    Option(
        "remote",
        "the target lives on this remote of the repository: promote by push with a lease",
        metavar="NAME",
    ),
    Option(
        "gate",
        "a command that must exit 0 in a clean checkout of the attempt; repeatable (ini: one per line)",
        "linelist",
        metavar="CMD",
    ),
    Option(
        "gate_timeout",
        "seconds a gate command may run before its process group is killed",
        "float",
        600.0,
        "SECONDS",
    ),
    Option(
        "promote",
        "move the target for real (default: a dry run onto refs/agentgate/dryrun/<target>)",
        "bool",
        False,
    ),
    Option(
        "no_retest", "do not re-run the gate on a merge onto a target that moved", "bool", False
    ),
    Option(
        "agent",
        "the agent's name on attempts and log records (default: $AGENTGATE_AGENT or 'agent')",
        metavar="NAME",
        env=AGENT_ENV,
    ),
    Option("report", "write a JSON report of every attempt to this path", metavar="PATH"),
    Option(
        "markdown",
        "append a Markdown table of the attempts to this file (default: $GITHUB_STEP_SUMMARY)",
        metavar="PATH",
        env="GITHUB_STEP_SUMMARY",
    ),
    Option(
        "workdir",
        "where workspaces and gate checkouts are made (default: pytest's temporary directory)",
        metavar="DIR",
    ),
    Option(
        "exclude",
        "globs never snapshotted (secrets); one per line in the ini file",
        "linelist",
        metavar="GLOB",
    ),
    Option(
        "protect",
        "a glob of paths an attempt may not change, added to the protected test harness "
        "(conftest.py, pytest configuration...); 'none' protects nothing; repeatable",
        "linelist",
        metavar="GLOB",
    ),
    Option(
        "unprotect",
        "lift one rule of the protected harness by its name (conftest.py, "
        "pyproject.toml:[tool.pytest.ini_options], __init__.py, pytest_plugins...); repeatable",
        "linelist",
        metavar="NAME",
    ),
    Option(
        "rerun_gate",
        "run a failing gate command again on the same tree up to N times (a test that then "
        "passes is flaky)",
        "int",
        0,
        "N",
    ),
    Option(
        "flaky",
        "what a flaky test does to its attempt: reject (default) or accept",
        default="reject",
        metavar="POLICY",
    ),
    Option(
        "gate_results",
        "the JUnit XML file a gate command that is not pytest writes, relative to its checkout",
        metavar="PATH",
    ),
    Option(
        "keep_runs",
        "with --agentgate-workdir: how many runs' directories to keep (default 3)",
        "int",
        3,
        "N",
    ),
    Option(
        "fresh_workspaces",
        "check out every workspace afresh instead of recycling the ones promoted attempts used",
        "bool",
        False,
    ),
    Option(
        "sandbox",
        "contain agent commands and gates: auto (bwrap when it works, else uncontained with a "
        "warning), bwrap (required), none",
        default="auto",
        metavar="MODE",
        env="AGENTGATE_SANDBOX",
    ),
    Option(
        "sandbox_bind",
        "a path to make visible in the sandbox, read-only, or writable as PATH:rw; repeatable",
        "linelist",
        metavar="PATH[:rw]",
    ),
    Option(
        "agent_network", "network for agent commands: none or host", default="none", metavar="NET"
    ),
    Option(
        "gate_network", "network for gate commands: none or host", default="none", metavar="NET"
    ),
    Option(
        "agent_env",
        "an environment variable agent commands may see (beyond PATH, locale, TERM, VIRTUAL_ENV, "
        "PYTHONPATH, PYTHONHASHSEED, AGENTGATE_*); repeatable",
        "linelist",
        metavar="NAME",
    ),
    Option(
        "gate_env",
        "an environment variable gate commands may see; repeatable",
        "linelist",
        metavar="NAME",
    ),
    Option("sandbox_pids", "most processes one command may run at once", "int", 512, "N"),
    Option(
        "sandbox_file_bytes",
        "largest file one command may write (its /tmp and its directory)",
        "int",
        1 << 30,
        "BYTES",
    ),
    Option(
        "allow_symlink",
        "a glob of paths where an attempt may add a symlink that leaves the tree; repeatable",
        "linelist",
        metavar="GLOB",
    ),
    Option(
        "isolation",
        "shared (the agent's .git borrows the base's objects) or sealed (only the base commit's)",
        default="shared",
        metavar="MODE",
    ),
    Option("max_files", "reject an attempt that changes more files than this", "int", 100_000, "N"),
    Option(
        "max_bytes", "reject an attempt that writes more bytes than this", "int", 1 << 30, "BYTES"
    ),
)
_BY_NAME = {option.name: option for option in OPTIONS}


# -- options ------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agentgate", "gate coding-agent changes behind tests")
    for option in OPTIONS:
        if option.kind == "bool":
            group.addoption(option.flag, action="store_true", default=None, help=option.help)
        elif option.kind == "linelist":
            group.addoption(
                option.flag, action="append", default=None, metavar=option.metavar, help=option.help
            )
        else:
            group.addoption(option.flag, default=None, metavar=option.metavar, help=option.help)
        ini_type = {"linelist": "linelist", "bool": "bool"}.get(option.kind, "string")
        parser.addini(option.ini, option.help, type=ini_type, default=None)  # type: ignore[arg-type]


def setting(config: pytest.Config, name: str) -> tuple[Any, str]:
    """A setting's value and where it came from: command line over environment over ini."""
    option = _BY_NAME[name]
    value = config.getoption(option.flag)
    source = f"command line {option.flag}"
    if value is None and option.env and os.environ.get(option.env):
        value, source = os.environ[option.env], f"environment {option.env}"
    if value is None:
        try:
            raw = config.getini(option.ini)
        except ValueError as exc:
            raise pytest.UsageError(f"agentgate: invalid ini {option.ini}: {exc}") from None
        if raw not in (None, "", []):
            value, source = raw, f"ini {option.ini}"
    if value is None:
        return option.default, "default"
    if option.kind in ("int", "float"):
        parse: Callable[[str], Any] = int if option.kind == "int" else float
        try:
            value = parse(str(value).strip())
        except ValueError:
            raise pytest.UsageError(
                f"agentgate: invalid {option.flag} {value!r} (from {source}): expected a "
                f"{'whole number' if option.kind == 'int' else 'number'}"
            ) from None
        if value <= 0:
            raise pytest.UsageError(
                f"agentgate: {option.flag} must be positive, got {value!r} (from {source})"
            )
    if option.kind == "bool" and isinstance(value, str):
        value = value.strip().lower() in ("1", "true", "yes", "on")
    return value, source


# -- the marker ---------------------------------------------------------------------------


class MarkerSpec(NamedTuple):
    """A validated ``@pytest.mark.gated(...)``."""

    task: str
    agent: str | None = None
    gate: tuple[str, ...] | None = None
    checks: tuple[Callable[[Any], Any], ...] = ()
    protect: tuple[str, ...] = ()
    max_changed_lines: int | None = None
    state: tuple[str, ...] = ()
    resume: bool = False
    allow_removed: tuple[str, ...] = ()
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] | None = None
    tests_from: str | None = None


def gated(
    task: str,
    *,
    agent: str | None = None,
    gate: Any = None,
    checks: Any = (),
    protect: Any = (),
    max_changed_lines: int | None = None,
    state: Any = (),
    resume: bool = False,
    allow_removed: Any = (),
    fail_to_pass: Any = (),
    pass_to_pass: Any = None,
    tests_from: str | None = None,
) -> MarkerSpec:
    if not isinstance(task, str) or not task.strip():
        raise TypeError(f"task must be a non-empty string, got {task!r}")
    if agent is not None and (not isinstance(agent, str) or not agent.strip()):
        raise TypeError(f"agent must be a non-empty string, got {agent!r}")
    if agent is not None and any(ord(c) < 32 or ord(c) == 127 for c in agent):
        raise TypeError(f"agent must be a plain name without control characters, got {agent!r}")
    if gate is not None:
        if isinstance(gate, str) or not all(isinstance(c, str) and c.strip() for c in gate):
            raise TypeError(f"gate must be a list of command strings, got {gate!r}")
        gate = tuple(gate)
    if isinstance(checks, str) or not all(callable(c) for c in checks):
        raise TypeError(f"checks must be a list of callables, got {checks!r}")
    if isinstance(protect, str) or not all(isinstance(p, str) for p in protect):
        raise TypeError(f"protect must be a list of glob strings, got {protect!r}")
    if max_changed_lines is not None and (
        isinstance(max_changed_lines, bool)
        or not isinstance(max_changed_lines, int)
        or max_changed_lines < 0
    ):
        raise TypeError(f"max_changed_lines must be a non-negative int, got {max_changed_lines!r}")
    if isinstance(state, str) or not all(isinstance(p, str) and p.strip() for p in state):
        raise TypeError(f"state must be a list of paths, got {state!r}")
    for path in state:
        if Path(path).is_absolute() or ".." in Path(path).parts:
            raise TypeError(f"state paths are relative to the workspace, without '..': {path!r}")
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be True or False, got {resume!r}")
    if resume and not state:
        raise TypeError("resume=True needs state=[...] naming what to resume from")
    if isinstance(allow_removed, str) or not all(
        isinstance(t, str) and t.strip() for t in allow_removed
    ):
        raise TypeError(f"allow_removed must be a list of test ids or globs, got {allow_removed!r}")
    for name, ids in (("fail_to_pass", fail_to_pass), ("pass_to_pass", pass_to_pass or ())):
        if isinstance(ids, str) or not all(isinstance(t, str) and "::" in t for t in ids):
            raise TypeError(f"{name} must be a list of pytest node ids (path::test), got {ids!r}")
    if tests_from is not None and (not isinstance(tests_from, str) or not tests_from.strip()):
        raise TypeError(f"tests_from must be a revision, got {tests_from!r}")
    if (pass_to_pass is not None or tests_from) and not fail_to_pass:
        raise TypeError("pass_to_pass= and tests_from= grade a task: name its fail_to_pass= tests")
    return MarkerSpec(
        task.strip(),
        agent,
        gate,
        tuple(checks),
        tuple(protect),
        max_changed_lines,
        tuple(state),
        resume,
        tuple(allow_removed),
        tuple(fail_to_pass),
        None if pass_to_pass is None else tuple(pass_to_pass),
        tests_from,
    )


def marker_spec(item: pytest.Item) -> MarkerSpec | None:
    """The test's validated marker, or None; raises ``TypeError`` naming what is wrong."""
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return None
    return gated(*mark.args, **mark.kwargs)


# -- run state ----------------------------------------------------------------------------


class AgentgateRun:
    """Run state, registered as a plugin: the engine (made once), results for the summary."""

    def __init__(self, config: pytest.Config, run_id: str) -> None:
        self.config = config
        self.run_id = run_id
        self.engine_: Engine | None = None
        self.rows: list[Mapping[str, Any]] = []
        self.held: list[int] = []  # locks that mark this run's directory as live
        self.warnings: list[str] = []
        self.seen: set[object] = set()

    def preflight(self, engine: Engine, items: list[pytest.Item]) -> None:
        """Check the harness before any agent works: a broken one stops the run (exit 4)."""
        from .errors import AgentgateError

        if not engine.gate.harness:
            self.warnings.append(
                "--agentgate-protect none: nothing is protected; an attempt may change the test "
                "harness (conftest.py, the pytest configuration) that judges it"
            )
        gates = (_gate_for(engine, item.stash[SPEC_KEY], []) for item in items)
        specs = list({spec.commands: spec for spec in gates}.values())
        try:
            self.warnings += engine.check_harness(specs)
        except AgentgateError as exc:
            output = getattr(exc, "output", "")
            tail = "\n" + "\n".join("    " + line for line in output.splitlines()) if output else ""
            raise pytest.UsageError(f"agentgate: {exc}{tail}") from exc

    def engine(self) -> Engine:
        """The engine for this run, opened (and every setting checked) on first use."""
        if self.engine_ is None:
            self.engine_ = open_engine(self.config, self.run_id, self.held)
            self.engine_.start(self.run_id)
        return self.engine_

    # hooks implemented by the run state itself

    @pytest.hookimpl(trylast=True)
    def pytest_agentgate_checks(self, item: pytest.Item, attempt: Attempt) -> list[Any] | None:
        spec = item.stash.get(SPEC_KEY, None)
        return list(spec.checks) if spec else None

    @pytest.hookimpl(trylast=True)
    def pytest_agentgate_verdict(self, item: pytest.Item, attempt: Attempt) -> None:
        row = attempt.as_dict()
        engine = self.engine()
        if not engine.promote_enabled:
            row["target"] = f"dryrun/{engine.target}"
        else:
            row["target"] = engine.remote.label if engine.remote is not None else engine.target
        item.user_properties.append(("agentgate", json.dumps(row)))
        grade = (attempt.results or {}).get("grade")
        if grade:
            item.user_properties.append(("agentgate_grade", grade))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # A test run again (pytest-rerunfailures) reports its item's properties again, with
        # the earlier attempts' rows in them: each attempt is counted once, by its id.
        for name, value in report.user_properties:
            if name == "agentgate" and report.when == "call":
                row = json.loads(str(value))
                if row.get("uid") not in self.seen:
                    self.seen.add(row.get("uid"))
                    self.rows.append(row)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["agentgate_run_id"] = self.run_id

    def pytest_unconfigure(self) -> None:
        while self.held:
            os.close(self.held.pop())

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows and not self.warnings:
            return
        from . import report

        terminalreporter.write_sep("=", "agentgate")
        for line in dict.fromkeys(self.warnings):
            terminalreporter.write_line(f"WARNING agentgate: {line}", yellow=True)
        for line in report.terminal_lines(self.rows):
            terminalreporter.write_line(line)
        for line in report.sandbox_warnings(self.rows):
            terminalreporter.write_line(line, yellow=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.engine_ is not None:
            self.engine_.close()
        if hasattr(self.config, "workerinput"):
            return
        if session.exitstatus == pytest.ExitCode.TESTS_FAILED and any(
            row.get("verdict") == "error" for row in self.rows
        ):
            session.exitstatus = EXIT_HARNESS_ERROR
        workdir, _ = setting(self.config, "workdir")
        if workdir:
            from .prune import old_runs
            from .removal import remove_tree

            keep, _ = setting(self.config, "keep_runs")
            for path in old_runs(Path(workdir).expanduser().resolve(), int(keep)):
                remove_tree(path)
        path, _ = setting(self.config, "report")
        if path:
            from . import report

            promote, _ = setting(self.config, "promote")
            report.write_json(
                Path(path),
                self.rows,
                {
                    "run_id": self.run_id,
                    "promote": bool(promote),
                    "exitstatus": int(session.exitstatus),
                },
            )
        markdown, _ = setting(self.config, "markdown")
        if markdown and self.rows:
            from . import report

            with open(markdown, "a", encoding="utf-8") as out:
                out.write("### agentgate\n\n" + report.markdown(self.rows) + "\n")


RUN_KEY = pytest.StashKey[AgentgateRun]()
SPEC_KEY = pytest.StashKey[MarkerSpec]()
WS_KEY = pytest.StashKey["Workspace"]()
ATTEMPT_KEY = pytest.StashKey["Attempt"]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    _check_config_not_hijacked(config)
    worker = getattr(config, "workerinput", None)
    run_id = worker.get("agentgate_run_id") if worker else None
    run = AgentgateRun(config, run_id or uuid.uuid4().hex)
    config.stash[RUN_KEY] = run
    config.pluginmanager.register(run, "agentgate-run")


def _globs(values: list[str] | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in values or () if v.strip())


def harness_rules(config: pytest.Config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the harness rules in force, the extra protected globs), from protect and unprotect.

    ``--agentgate-protect GLOB`` adds to the defaults; ``--agentgate-protect none`` protects
    nothing at all; ``--agentgate-unprotect NAME`` lifts one default rule by its name.
    """
    from .harness import DEFAULT_HARNESS, unknown_rules

    protect, _ = setting(config, "protect")
    unprotect, source = setting(config, "unprotect")
    globs, lifted = _globs(protect), _globs(unprotect)
    if globs == ("none",):
        return (), ()
    unknown = unknown_rules(lifted)
    if unknown:
        raise pytest.UsageError(
            f"agentgate: invalid --agentgate-unprotect {unknown[0]!r} (from {source}): the rules "
            f"are {', '.join(DEFAULT_HARNESS)}"
        )
    return tuple(r for r in DEFAULT_HARNESS if r not in lifted), globs


def _run_dir(root: Path, run_id: str, held: list[int]) -> Path:
    """This run's directory under a user-chosen workdir, marked so prune knows it is ours.

    The marker is held with a shared ``flock`` until the run ends (its descriptor goes into
    ``held``), so no prune (by another run or ``agentgate prune``) removes a live run.
    """
    import fcntl

    path = root.resolve() / f"run-{run_id[:12]}"
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / RUN_MARKER, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.utime(fd)
    held.append(fd)
    return path


def _check_config_not_hijacked(config: pytest.Config) -> None:
    """Refuse a run whose configuration pytest took from the gated repository by mistake.

    pytest looks for its configuration before plugins' options exist, so in
    ``--agentgate-repo PATH`` (a space, not ``=``) it takes PATH for a test path and may read
    the gated repository's ini file instead of the suite's own: gates and settings vanish.
    """
    args = list(config.invocation_params.args)
    for name in ("repo", "workdir"):
        flag = f"--agentgate-{name}"
        if flag not in args or args.index(flag) + 1 >= len(args) or config.inipath is None:
            continue
        value = Path(args[args.index(flag) + 1]).resolve()
        invoked = config.invocation_params.dir.resolve()
        inipath = config.inipath.resolve()
        if value in inipath.parents and value not in invoked.parents and value != invoked:
            raise pytest.UsageError(
                f"agentgate: pytest read its configuration from {inipath}, inside the {flag} "
                f"path, because the value followed a space; write {flag}={args[args.index(flag) + 1]}"
            )


def gate_spec(config: pytest.Config) -> GateSpec:
    """The run's gate, as the settings give it (the marker refines it per test)."""
    from .gate import GateSpec

    commands, _ = setting(config, "gate")
    timeout, _ = setting(config, "gate_timeout")
    rules, extra_globs = harness_rules(config)
    results_file, _ = setting(config, "gate_results")
    rerun, _ = setting(config, "rerun_gate")
    flaky, flaky_source = setting(config, "flaky")
    if flaky not in ("reject", "accept"):
        raise pytest.UsageError(
            f"agentgate: invalid --agentgate-flaky {flaky!r} (from {flaky_source}): "
            "expected reject or accept"
        )
    return GateSpec(
        commands=tuple(c for c in (commands or ()) if c.strip()),
        timeout=float(timeout),
        harness=rules,
        protect=extra_globs,
        results_file=results_file or None,
        rerun=int(rerun),
        flaky=flaky,
    )


def open_engine(config: pytest.Config, run_id: str, held: list[int]) -> Engine:
    """Build the engine from the settings; every bad value is a usage error (exit code 4)."""
    from .engine import Engine
    from .errors import AgentgateError

    repo, repo_source = setting(config, "repo")
    target, target_source = setting(config, "target")
    base, base_source = setting(config, "base")
    remote, remote_source = setting(config, "remote")
    promote, _ = setting(config, "promote")
    no_retest, _ = setting(config, "no_retest")
    agent, agent_source = setting(config, "agent")
    if agent and any(ord(c) < 32 or ord(c) in (127, 0x85, 0x2028, 0x2029) for c in agent):
        raise pytest.UsageError(
            f"agentgate: invalid --agentgate-agent {agent!r} (from {agent_source}): it contains a "
            "control character (a newline, a tab...); use a plain name"
        )
    workdir, workdir_source = setting(config, "workdir")
    exclude, _ = setting(config, "exclude")
    fresh, _ = setting(config, "fresh_workspaces")
    max_files, _ = setting(config, "max_files")
    max_bytes, _ = setting(config, "max_bytes")
    kwargs: dict[str, Any] = {"sandbox_settings": sandbox_settings(config)}
    isolation, isolation_source = setting(config, "isolation")
    if isolation not in ("shared", "sealed"):
        raise pytest.UsageError(
            f"agentgate: invalid --agentgate-isolation {isolation!r} (from {isolation_source}): "
            "expected shared or sealed"
        )
    kwargs["isolation"] = isolation
    allow, _ = setting(config, "allow_symlink")
    kwargs["allow_symlinks"] = tuple(a.strip() for a in allow or () if a.strip())
    if exclude is not None:
        kwargs["exclude"] = tuple(exclude)
    for name in ("report", "markdown"):
        path, source = setting(config, name)
        if path and not _writable_parent(Path(path)):
            raise pytest.UsageError(
                f"agentgate: cannot write --agentgate-{name} {path!r} (from {source}): its directory "
                "does not exist or is not writable"
            )
    if workdir:
        root = Path(workdir).expanduser()
        if root.exists() and not root.is_dir():
            raise pytest.UsageError(
                f"agentgate: --agentgate-workdir {workdir!r} (from {workdir_source}) is not a directory"
            )
    try:
        engine = Engine.open(
            repo or config.rootpath,
            target,
            base=base,
            sources={
                "repo": repo_source if repo else "pytest's rootdir",
                "target": target_source,
                "base": base_source,
                "remote": remote_source,
            },
            promote=bool(promote),
            retest=not no_retest,
            workdir=None,
            gate=gate_spec(config),
            agent=agent or "agent",
            max_files=int(max_files),
            max_bytes=int(max_bytes),
            recycle=not fresh,
            remote=remote or None,
            **kwargs,
        )
    except AgentgateError as exc:
        raise pytest.UsageError(f"agentgate: {exc}") from exc
    if workdir:
        try:
            engine.workdir = _run_dir(Path(workdir).expanduser(), run_id, held)
        except OSError as exc:
            raise pytest.UsageError(
                f"agentgate: cannot use --agentgate-workdir {workdir!r} (from {workdir_source}): {exc}"
            ) from exc
    return engine


def _env_names(config: pytest.Config, name: str) -> tuple[str, ...]:
    values, source = setting(config, name)
    names = tuple(v.strip() for v in values or () if v.strip())
    for value in names:
        if not value.replace("_", "a").isalnum() or value[0].isdigit():
            raise pytest.UsageError(
                f"agentgate: invalid --agentgate-{name.replace('_', '-')} {value!r} (from {source}): "
                "expected the name of an environment variable"
            )
    return names


def sandbox_settings(config: pytest.Config) -> Any:
    """The sandbox as the settings ask for it; bad values are usage errors naming their source."""
    from .errors import ConfigError
    from .sandbox import MODES, NETWORKS, Bind, Settings

    mode, mode_source = setting(config, "sandbox")
    mode = str(mode).strip().lower()
    if mode not in MODES:
        raise pytest.UsageError(
            f"agentgate: invalid --agentgate-sandbox {mode!r} (from {mode_source}): "
            f"expected one of {', '.join(MODES)}"
        )
    networks = {}
    for role in ("agent", "gate"):
        value, source = setting(config, f"{role}_network")
        value = str(value).strip().lower()
        if value not in NETWORKS:
            raise pytest.UsageError(
                f"agentgate: invalid --agentgate-{role}-network {value!r} (from {source}): "
                f"expected one of {', '.join(NETWORKS)}"
            )
        networks[role] = value
    binds, bind_source = setting(config, "sandbox_bind")
    try:
        parsed = tuple(Bind.parse(b.strip(), bind_source) for b in binds or () if b.strip())
    except ConfigError as exc:
        raise pytest.UsageError(f"agentgate: {exc}") from None
    pids, _ = setting(config, "sandbox_pids")
    file_bytes, _ = setting(config, "sandbox_file_bytes")
    return Settings(
        mode=mode,
        binds=parsed,
        agent_network=networks["agent"],
        gate_network=networks["gate"],
        agent_env=_env_names(config, "agent_env"),
        gate_env=_env_names(config, "gate_env"),
        pids_max=int(pids),
        file_bytes=int(file_bytes),
    )


def _writable_parent(path: Path) -> bool:
    parent = path.resolve().parent
    return parent.is_dir() and os.access(parent, os.W_OK)


# -- collection ---------------------------------------------------------------------------


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """Never collect tests from workspaces: they hold copies of the gated repository."""
    if (collection_path / RUN_MARKER).is_file():
        return True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    """Turn a malformed ``gated`` marker into a collection error that names the test."""
    report = yield
    if report.outcome != "passed" or not report.result:
        return report
    problems = []
    for node in report.result:
        if not isinstance(node, pytest.Item):
            continue
        try:
            spec = marker_spec(node)
        except TypeError as exc:
            problems.append(f"{node.nodeid}: invalid @pytest.mark.gated: {exc}")
            continue
        if spec is None:
            continue
        if "agent_workspace" not in getattr(node, "fixturenames", ()):
            problems.append(
                f"{node.nodeid}: a @pytest.mark.gated test must use the agent_workspace fixture "
                "(its workspace is what gets gated)"
            )
            continue
        node.stash[SPEC_KEY] = spec
    if problems:
        report.outcome = "failed"
        report.longrepr = "\n".join(problems)
        report.result = []
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ACTIVE_ENV) != "1":
        return
    skip = pytest.mark.skip(reason="agentgate: gated tests do not run inside a gate command")
    for item in items:
        if SPEC_KEY in item.stash:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Open the repository once the tests that will run are known (after -k, -m, --lf...).

    A bad setting then stops the run with exit code 4, before any test runs; a run whose
    selection holds no gated test never opens it, never runs git.
    """
    config = session.config
    if config.option.collectonly or os.environ.get(ACTIVE_ENV) == "1":
        return
    gated_items = [item for item in session.items if SPEC_KEY in item.stash]
    if gated_items:
        run = config.stash[RUN_KEY]
        engine = run.engine()
        # The check runs gates (the baselines): in the run's own directory, as the tests will.
        # pytest's tmpdir plugin keeps its factory on the config; there is no public getter.
        _default_workdir(config, engine, getattr(config, "_tmp_path_factory", None))
        run.preflight(engine, gated_items)


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def agentgate(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """The engine for this run: the base repository, the target, the gate."""
    run = request.config.stash[RUN_KEY]
    engine = run.engine()
    _default_workdir(request.config, engine, tmp_path_factory)
    return engine


def _default_workdir(
    config: pytest.Config, engine: Engine, factory: pytest.TempPathFactory | None
) -> None:
    """Without --agentgate-workdir, workspaces and gate checkouts go under pytest's basetemp
    (pytest keeps its last three), marked so that pytest never collects tests from them."""
    workdir, _ = setting(config, "workdir")
    if workdir or factory is None:
        return
    engine.workdir = factory.getbasetemp() / "agentgate"
    engine.workdir.mkdir(exist_ok=True)
    (engine.workdir / RUN_MARKER).touch()


@pytest.fixture
def agent_workspace(request: pytest.FixtureRequest, agentgate: Engine) -> Iterator[Workspace]:
    """A private workspace at the base commit for this test's agent task."""
    from . import workspace as ws_module

    item = request.node
    spec = item.stash.get(SPEC_KEY, None)
    if spec is None:
        pytest.fail(
            f"{item.nodeid}: agent_workspace needs the test to be marked "
            "@pytest.mark.gated(task=...)",
            pytrace=False,
        )
    ws = agentgate.fork(task=spec.task)
    if spec.resume:
        agentgate.resume(ws, spec.task)
    item.stash[WS_KEY] = ws
    try:
        yield ws
    finally:
        attempt = item.stash.get(ATTEMPT_KEY, None)
        if attempt is not None and attempt.verdict.accepted:
            agentgate.release(ws)  # recycled for the next test, unless --agentgate-fresh-workspaces
        else:
            ws_module.discard_index(ws)  # the files stay for inspection


# -- running a gated test -----------------------------------------------------------------


def _gate_for(engine: Engine, spec: MarkerSpec, checks: list[Any]) -> GateSpec:
    from dataclasses import replace

    gate = engine.gate
    return replace(
        gate,
        commands=gate.commands if spec.gate is None else spec.gate,
        outcome_is_enough=spec.gate == (),
        checks=tuple(checks),
        protect=(*gate.protect, *spec.protect),
        max_changed_lines=spec.max_changed_lines,
        allow_removed=spec.allow_removed,
        grading=_grading_for(engine, spec),
    )


def _grading_for(engine: Engine, spec: MarkerSpec) -> Any:
    if not spec.fail_to_pass:
        return None
    from .errors import RevisionNotFound
    from .grading import Grading

    tests_from = None
    if spec.tests_from:
        try:
            tests_from = engine.repo.commit(spec.tests_from, "tests_from")
        except RevisionNotFound as exc:
            raise pytest.UsageError(f"agentgate: {exc}") from exc
    return Grading(spec.fail_to_pass, spec.pass_to_pass, tests_from)


def _failure_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    ws = item.stash.get(WS_KEY, None)
    spec = item.stash.get(SPEC_KEY, None)
    if ws is None or spec is None:
        return (yield)
    failure: BaseException | None = None
    try:
        result = yield
    except pytest.skip.Exception:
        raise  # a skipped test is no attempt
    except (Exception, pytest.fail.Exception) as exc:  # fail(), xfail() and timeouts too
        failure = exc
    attempt = _judge(item, ws, spec, failure)
    if failure is not None:
        item.add_report_section("call", "agentgate", _rejection_message(item, attempt))
        raise failure
    if not attempt.verdict.accepted:
        pytest.fail(_rejection_message(item, attempt), pytrace=False)
    return result


def _judge(
    item: pytest.Item, ws: Workspace, spec: MarkerSpec, failure: BaseException | None
) -> Attempt:
    run = item.config.stash[RUN_KEY]
    engine = run.engine()
    hook = item.config.hook
    agent, _ = setting(item.config, "agent")
    agent_name = spec.agent or agent or "agent"
    from .engine import Attempt

    probe = Attempt(task=spec.task, agent=agent_name, workspace=ws, test=item.nodeid)
    checks = [
        c for found in hook.pytest_agentgate_checks(item=item, attempt=probe) for c in (found or ())
    ]
    attempt = engine.run_attempt(
        ws,
        task=spec.task,
        agent=agent_name,
        test=item.nodeid,
        spec=_gate_for(engine, spec, checks),
        test_failure=_failure_text(failure) if failure is not None else None,
        state=spec.state,
    )
    item.stash[ATTEMPT_KEY] = attempt
    hook.pytest_agentgate_verdict(item=item, attempt=attempt)
    return attempt


def _rejection_message(item: pytest.Item, attempt: Attempt) -> str:
    import shlex

    verdict = attempt.verdict
    repo = attempt.workspace.repo
    lines = [
        f"agentgate {verdict.status}: {verdict.reason}",
        f"  check:   {verdict.check or '-'}",
        f"  attempt: {attempt.ref}  (read it: git -C {shlex.quote(repo.label)} show {attempt.ref})"
        if attempt.ref
        else f"  attempt: not recorded ({attempt.record_problem or 'no record'})",
        f"  workspace kept at {attempt.path}",
    ]
    if verdict.output.strip():
        lines += [
            "  output (last lines):",
            *("    " + line for line in verdict.output.splitlines()),
        ]
    return "\n".join(lines)
