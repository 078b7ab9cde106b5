"""The pytest layer: options, fixtures and the runtest wrapper of a gated test.

This module is imported in every pytest run of every suite that has the plugin installed, so
it imports only pytest and the standard library (and :mod:`.settings` and :mod:`.marker`,
which do too); the engine (and with it filelock) is loaded the first time a gated test is
collected, and no git runs before that. The marker lives in :mod:`.marker`, the settings in
:mod:`.settings`, run directories in :mod:`.rundirs`, what a run reports in :mod:`.report`.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Generator, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .._constants import MARKER, MARKER_HELP, RUN_MARKER, RUN_START
from ..engine.options import BY_NAME
from .options import AGENT_ENV, OPTIONS, Option, add_options, one_setting

if TYPE_CHECKING:
    from ..engine import Engine
    from ..engine.attempt import Attempt
    from ..judge.gate import GateSpec
    from ..workspace.fork import Workspace
    from .marker import GatedMarker
    from .progress import Progress
    from .settings import Settings

__all__ = [
    "ACTIVE_ENV",
    "AGENT_ENV",
    "EXIT_HARNESS_ERROR",
    "MARKER",
    "OPTIONS",
    "AgentgateRun",
    "Option",
]

ACTIVE_ENV = "AGENTGATE_ACTIVE"
#: The run's exit code when an attempt could not be judged (an ``error`` verdict: the gate
#: could not start, the sandbox failed, a write failed), beside pytest's own codes: 1 is then
#: left to rejected attempts (and failing tests), 4 to settings and a broken harness found
#: before any agent ran.
EXIT_HARNESS_ERROR = 6


#: The collector this module loaded (its name, its module), registered as a plugin with it.
_COLLECTOR: tuple[str, Any] | None = None


def _load_the_gates_collector() -> None:
    """In a gate's pytest, the results collector its environment names, loaded from the
    channel's own folder when a wrapper replaced the ``PYTHONPATH`` that leads to it
    (``sh -c 'PYTHONPATH=src pytest'``, a Makefile, tox's ``setenv``).

    This plugin is loaded (as an entry point, or by ``-p``) before pytest imports the
    modules ``PYTEST_PLUGINS`` names, so the collector is then found where it was put, by
    its name of this command's own, which no tree can hold. Nothing happens outside a gate.
    """
    channel = os.environ.get("AGENTGATE_RESULTS")
    if not channel:
        return
    import sys

    for listed in os.environ.get("PYTEST_PLUGINS", "").split(","):
        name = listed.strip()
        if not name.startswith("agentgate_collector_") or name in sys.modules:
            continue
        path = os.path.join(os.path.dirname(channel), name + ".py")
        if not os.path.isfile(path):
            continue
        from importlib.util import module_from_spec, spec_from_file_location

        spec = spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            continue
        module = module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)  # it takes its name out of PYTEST_PLUGINS
        global _COLLECTOR
        _COLLECTOR = (name, module)


_load_the_gates_collector()


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    add_options(parser)
    global _COLLECTOR
    if _COLLECTOR is not None:
        # Called as this plugin registers, before pytest reads PYTEST_PLUGINS (which no
        # longer names the collector): registered here, as it would have been there. Once:
        # a pytest the gate's tests run in the same process (pytester) is not the gate's.
        name, module = _COLLECTOR
        _COLLECTOR = None
        if pluginmanager.get_plugin(name) is None:
            pluginmanager.register(module, name)


# -- run state ----------------------------------------------------------------------------


class AgentgateRun:
    """Run state, registered as a plugin: the settings and the engine (each made once), and
    the rows the summary and the reports are made of."""

    def __init__(self, config: pytest.Config, run_id: str) -> None:
        self.config = config
        self.run_id = run_id
        self._settings: Settings | None = None
        self.engine_: Engine | None = None
        self.rows: list[Mapping[str, Any]] = []
        #: The line on the terminal while a step is slow (None: not on a terminal).
        self.progress: Progress | None = None
        self.current_test = ""
        self.held: list[int] = []  # locks that mark this run's directory as live
        self.warnings: list[str] = []
        self.seen: set[object] = set()
        #: Under pytest-xdist, the tip the run started on (``run-start``) as the controller
        #: read it for its workers (None: not read).
        self.run_start_tip: str | None = None
        self.run_start_label = ""

    @property
    def settings(self) -> Settings:
        """Every setting, read and checked once, when the engine is made: a run without a
        gated test checks none (its end reads the few it needs, :meth:`_finish_setting`)."""
        if self._settings is None:
            from .settings import Settings

            self._settings = Settings.from_config(self.config)
        return self._settings

    def engine(self) -> Engine:
        """The engine for this run, made whole on first use (every setting checked)."""
        if self.engine_ is None:
            self.engine_ = self._open_engine()
            self.engine_.start(self.run_id)
            from .progress import Progress

            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            self.progress = Progress.for_terminal(bool(getattr(reporter, "isatty", False)))
            self.engine_.on_step = self.tell
            if reporter is not None:
                self.engine_.baselines.on_compute = lambda said: reporter.write_line(
                    f"agentgate: {said}"
                )
                pinned = self.engine_.pinned_base
                if self.settings.engine.base == RUN_START and pinned and not self._is_worker():
                    reporter.write_line(
                        f"agentgate: every agent of this run forks from "
                        f"{self.engine_.target.label} as it was when the run started, "
                        f"{pinned[:12]} (--agentgate-base=run-start)"
                    )
        return self.engine_

    def _is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def tell(self, step: str) -> None:
        """The running gated test enters ``step`` (for the progress line)."""
        if self.progress is not None:
            self.progress.step(self.current_test, step)

    def _workdir(self) -> Path:
        """Where this run's workspaces go: ``run-<id>`` under ``--agentgate-workdir``, or
        pytest's basetemp (pytest keeps its last three), marked so pytest never collects
        tests from it."""
        from . import rundirs

        chosen = self.settings.run.workdir
        if chosen is not None:
            return rundirs.run_dir_path(chosen, self.run_id)
        # pytest's tmpdir plugin keeps its factory on the config; there is no public getter.
        factory: pytest.TempPathFactory | None = getattr(self.config, "_tmp_path_factory", None)
        if factory is None:
            import tempfile

            return Path(tempfile.mkdtemp(prefix="agentgate-"))
        root = factory.getbasetemp() / "agentgate"
        root.mkdir(exist_ok=True)
        (root / RUN_MARKER).touch()
        return root

    def _open_engine(self) -> Engine:
        from ..engine import Engine
        from ..errors import AgentgateError
        from . import rundirs

        settings = self.settings
        workdir = self._workdir()
        opened = settings.engine_settings(workdir, self.run_id)
        worker = getattr(self.config, "workerinput", None)
        if worker and worker.get("agentgate_run_start") and opened.base == RUN_START:
            # Every worker forks from the tip the run (its controller) started on, not the
            # one it finds when it opens, after other workers have landed.
            opened = replace(opened, base=worker["agentgate_run_start"])
        try:
            engine = Engine.open(
                settings.run.repo or settings.rootpath,
                sources=settings.engine_sources(),
                settings=opened,
            )
        except AgentgateError as exc:
            raise pytest.UsageError(f"agentgate: {exc}") from exc
        if settings.run.workdir is not None:  # made (and held) once the engine stands
            try:
                rundirs.run_dir(settings.run.workdir, self.run_id, self.held)
            except OSError as exc:
                raise pytest.UsageError(
                    f"agentgate: cannot use --agentgate-workdir {str(settings.run.workdir)!r} (from "
                    f"{settings.sources.get('workdir')}): {exc}"
                ) from exc
        return engine

    def gate_for(self, item: pytest.Item, marker: GatedMarker, checks: list[Any]) -> GateSpec:
        engine = self.engine()
        return self.settings.for_test(engine.gate, marker, checks, engine.repo)

    def preflight(self, items: list[pytest.Item]) -> None:
        """Check the harness before any agent works: a broken one stops the run (exit 4)."""
        from ..errors import AgentgateError

        engine = self.engine()
        if not engine.gate.harness:
            self.warnings.append(
                "--agentgate-protect none: nothing is protected; an attempt may change the test "
                "harness (conftest.py, the pytest configuration) that judges it"
            )
        for item in items:  # a leader runs them on other machines' posts of these tests
            engine.checks_by_test[item.nodeid] = tuple(item.stash[MARKER_KEY].checks)
        gates = (self.gate_for(item, item.stash[MARKER_KEY], []) for item in items)
        # Alike gates once (thousands of tests share a few); gates of the same commands set
        # up otherwise (graded, given another environment) are each checked.
        specs = list({repr(spec): spec for spec in gates}.values())
        try:
            self.warnings += engine.check_harness(specs)
        except AgentgateError as exc:
            output = getattr(exc, "output", "")
            tail = "\n" + "\n".join("    " + line for line in output.splitlines()) if output else ""
            raise pytest.UsageError(f"agentgate: {exc}{tail}") from exc

    # hooks implemented by the run state itself

    @pytest.hookimpl(trylast=True)
    def pytest_agentgate_checks(self, item: pytest.Item, attempt: Attempt) -> list[Any] | None:
        marker = item.stash.get(MARKER_KEY, None)
        return list(marker.checks) if marker else None

    @pytest.hookimpl(trylast=True)
    def pytest_agentgate_verdict(self, item: pytest.Item, attempt: Attempt) -> None:
        row = attempt.as_dict()
        row["target"] = self.engine().target.label
        item.user_properties.append(("agentgate", json.dumps(row)))
        for name, value in attempt.notes.items():
            item.user_properties.append((f"agentgate_note_{name}", value))
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
        if self._finish_setting("base") == RUN_START and self.run_start():
            node.workerinput["agentgate_run_start"] = self.run_start()

    def run_start(self) -> str:
        """The target's tip this run started on (``--agentgate-base=run-start``), read once
        in the process that hands out the tests, without starting an engine there (nothing
        written, nothing checked but the repository and the target); "" when it cannot be
        read: the workers then read it themselves, and say why they cannot."""
        if self.run_start_tip is None:
            from ..engine import Engine
            from ..errors import AgentgateError

            self.run_start_tip = ""
            try:
                settings = self.settings
                opened = Engine.open(
                    settings.run.repo or settings.rootpath,
                    sources=settings.engine_sources(),
                    settings=settings.engine_settings(self._workdir(), self.run_id),
                )
            except (AgentgateError, pytest.UsageError):
                return ""
            try:
                self.run_start_tip = opened.pinned_base or ""
                self.run_start_label = opened.target.label
            finally:
                opened.close()
        return self.run_start_tip

    def pytest_unconfigure(self) -> None:
        from .rundirs import release

        release(self.held)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows and not self.warnings:
            return
        from . import report

        terminalreporter.write_sep("=", "agentgate")
        if self.run_start_tip and self.rows:  # (said at the start by a run without workers)
            terminalreporter.write_line(
                f"every agent of this run forked from {self.run_start_label} as it was when "
                f"the run started, {self.run_start_tip[:12]} (--agentgate-base=run-start)"
            )
        for line in dict.fromkeys(self.warnings):
            terminalreporter.write_line(f"WARNING agentgate: {line}", yellow=True)
        for line in report.terminal_lines(self.rows):
            terminalreporter.write_line(line)
        for line in report.sandbox_warnings(self.rows):
            terminalreporter.write_line(line, yellow=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        if self.engine_ is not None:
            self.engine_.close()
        if self._is_worker():
            return
        if session.exitstatus == pytest.ExitCode.TESTS_FAILED and any(
            row.get("verdict") == "error" for row in self.rows
        ):
            session.exitstatus = EXIT_HARNESS_ERROR
        workdir = self._finish_setting("workdir")
        if workdir:
            from .rundirs import prune_old_runs

            prune_old_runs(Path(workdir), int(self._finish_setting("keep_runs")))
        json_path = self._finish_setting("report")
        # The table is appended only when there is a row to show: a run without one does
        # not even read where it would go ($GITHUB_STEP_SUMMARY may name anything).
        markdown_path = self._finish_setting("markdown") if self.rows else None
        if json_path or markdown_path:
            from . import report

            report.write_all(
                self.rows,
                json_path=Path(json_path) if json_path else None,
                markdown_path=Path(markdown_path) if markdown_path else None,
                meta={
                    "run_id": self.run_id,
                    "promote": bool(self._finish_setting("promote")),
                    "exitstatus": int(session.exitstatus),
                },
            )

    def _finish_setting(self, name: str) -> Any:
        """A setting the end of a run needs: from the checked settings when the run made
        them, else resolved alone through its declaration (a run without a gated test
        checks nothing else)."""
        if self._settings is not None:
            option = BY_NAME[name]
            held = self._settings.run if option.group == "run" else self._settings.engine
            return getattr(held, option.field)
        return one_setting(self.config, name)


RUN_KEY = pytest.StashKey[AgentgateRun]()
MARKER_KEY = pytest.StashKey["GatedMarker"]()
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
        if not isinstance(node, pytest.Item) or node.get_closest_marker(MARKER) is None:
            continue
        from .marker import marker_of  # only where a test carries the marker

        try:
            marker = marker_of(node)
        except TypeError as exc:
            problems.append(f"{node.nodeid}: invalid @pytest.mark.gated: {exc}")
            continue
        if marker is None:
            continue
        if "agent_workspace" not in getattr(node, "fixturenames", ()):
            problems.append(
                f"{node.nodeid}: a @pytest.mark.gated test must use the agent_workspace fixture "
                "(its workspace is what gets gated)"
            )
            continue
        node.stash[MARKER_KEY] = marker
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
        if MARKER_KEY in item.stash:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Open the repository once the tests that will run are known (after -k, -m, --lf...).

    A bad setting then stops the run with exit code 4, before any test runs; a run whose
    selection holds no gated test never opens it, never runs git.
    """
    config = session.config
    if config.option.collectonly or os.environ.get(ACTIVE_ENV) == "1":
        return
    gated_items = [item for item in session.items if MARKER_KEY in item.stash]
    if gated_items:
        config.stash[RUN_KEY].preflight(gated_items)


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def agentgate(request: pytest.FixtureRequest) -> Engine:
    """The engine for this run: the base repository, the target, the gate."""
    return request.config.stash[RUN_KEY].engine()


@pytest.fixture
def agent_workspace(request: pytest.FixtureRequest, agentgate: Engine) -> Iterator[Workspace]:
    """A private workspace at the base commit for this test's agent task."""
    from ..workspace import fork as ws_module

    item = request.node
    marker = item.stash.get(MARKER_KEY, None)
    if marker is None:
        pytest.fail(
            f"{item.nodeid}: agent_workspace needs the test to be marked "
            "@pytest.mark.gated(task=...)",
            pytrace=False,
        )
    source = (
        agentgate.resume_source(marker.resume_from, marker.task) if marker.resume_from else None
    )
    ws = agentgate.fork(task=marker.task, base=source.base if source else None)
    settings = request.config.stash[RUN_KEY].settings
    ws.agent_command = settings.run.agent_command
    ws.agent_timeout = settings.run.agent_timeout
    ws.network_strict = settings.run.agent_network_strict
    ws.agent = marker.agent or settings.agent  # its task and checkpointer: set by fork()
    ws.attempt, ws.history = 1, []
    ws.feedback = _feedback_file(agentgate, ws)
    ws.on_step = request.config.stash[RUN_KEY].tell
    ws.new_try()  # a recycled workspace served another test: nothing of it carries over
    item.stash[WS_KEY] = ws
    with agentgate.state_held(ws, marker.state):  # the state before the test: captured first
        if source is not None:
            mode = "code" if marker.retry_mode == "code" else "full"
            agentgate.resume_into(ws, source, mode)  # .resumed_from says which
        try:
            yield ws
        finally:
            attempt = item.stash.get(ATTEMPT_KEY, None)
            if attempt is None or attempt.verdict.status != "promoted":
                # Declared state outside the workspace is the machine's: what the agent
                # left there stays only when its attempt landed.
                agentgate.put_back_state(ws)
            if attempt is not None and attempt.verdict.accepted:
                # Recycled for the next test (with --agentgate-fresh-workspaces: removed).
                agentgate.release(ws)
            else:
                ws_module.discard_index(ws)  # the files stay for inspection


# -- running a gated test -----------------------------------------------------------------


def _failure_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    ws = item.stash.get(WS_KEY, None)
    marker = item.stash.get(MARKER_KEY, None)
    if ws is None or marker is None:
        return (yield)
    run = item.config.stash[RUN_KEY]
    run.current_test = item.nodeid
    try:
        return (yield from _gated_call(item, ws, marker))
    finally:
        run.tell("")


def _gated_call(
    item: pytest.Item, ws: Workspace, marker: GatedMarker
) -> Generator[None, None, None]:
    failure: BaseException | None = None
    result = None  # a body that raised yields none: a retry that lands returns this
    try:
        result = yield
    except pytest.skip.Exception:
        raise  # a skipped test is no attempt
    except (Exception, pytest.fail.Exception) as exc:  # fail(), xfail() and timeouts too
        failure = exc
    attempt = _judge(item, ws, marker, failure)
    while _retried(attempt, ws, marker):
        item.add_report_section("call", f"agentgate try {ws.attempt}", _rejection_message(attempt))
        engine = item.config.stash[RUN_KEY].engine()
        ws.history.append(_history_entry(attempt, ws.attempt))
        ws.history[-1]["next_starts_from"] = engine.prepare_retry(ws, marker.retry_mode, attempt)
        ws.attempt += 1
        _write_feedback(ws)
        failure = None
        try:
            item.runtest()  # the test body again, with the same (brought back) workspace
        except pytest.skip.Exception:
            raise
        except (Exception, pytest.fail.Exception) as exc:
            failure = exc
        attempt = _judge(item, ws, marker, failure)
    if failure is not None:
        item.add_report_section("call", "agentgate", _rejection_message(attempt))
        raise failure
    if not attempt.verdict.accepted:
        pytest.fail(_rejection_message(attempt), pytrace=False)
    return result


#: The verdicts another try can change: a harness error or an interrupt is not retried.
RETRIED = ("rejected", "conflict")


def _retried(attempt: Attempt, ws: Workspace, marker: GatedMarker) -> bool:
    """Whether the test gets another try (``retries=`` on the marker, within ``budget=``)."""
    return (
        not attempt.verdict.accepted
        and attempt.verdict.status in RETRIED
        and ws.attempt <= marker.retries
        and not any(used >= limit for used, limit in attempt.budget.values())
    )


def _used(ws: Workspace, marker: GatedMarker) -> dict[str, float]:
    """The sums of the budgeted fields over the test's tries so far."""
    used = {name: 0.0 for name, _ in marker.budget}
    for notes in [*(h.get("notes") or {} for h in ws.history), ws.notes]:
        for name in used:
            value = notes.get(name) if isinstance(notes, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                try:
                    used[name] += float(value)
                except OverflowError:  # past any budget: spent
                    used[name] = float("inf")
    return used


def _history_entry(attempt: Attempt, number: int) -> dict[str, object]:
    from .report import OUTPUT_LINES

    verdict = attempt.verdict
    tail = "\n".join(
        (verdict.output or attempt.workspace.output_tail()).splitlines()[-OUTPUT_LINES:]
    )
    return {
        "attempt": number,
        "notes": dict(attempt.notes),
        "verdict": verdict.status,
        "reason": verdict.reason,
        "check": verdict.check,
        "attempt_ref": attempt.record_ref,
        "output": tail,
        "transcript": _transcript_tail(attempt),
    }


def _transcript_tail(attempt: Attempt) -> str:
    """The end of what the agent did in a try, as steps (a preset's transcript), for the
    next try's feedback; empty for a command that keeps none."""
    from ..agents.transcript import steps_tail
    from .report import OUTPUT_LINES

    return steps_tail(attempt.workspace.transcripts, OUTPUT_LINES)


def _feedback_file(engine: Engine, ws: Workspace) -> Path:
    """A file for this test's feedback, outside every workspace (inside, it would be
    snapshotted and land), written before each try."""
    import tempfile

    folder = engine.private_root() / "feedback"
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="feedback-", suffix=".md", dir=folder)
    os.close(fd)
    path = Path(name)
    _write_feedback(ws, path)
    return path


def _write_feedback(ws: Workspace, path: Path | None = None) -> None:
    from .report import feedback_text

    target = path or ws.feedback
    if target is not None:
        target.write_text(feedback_text(ws.task, ws.attempt, ws.history), encoding="utf-8")


def _judge(
    item: pytest.Item, ws: Workspace, marker: GatedMarker, failure: BaseException | None
) -> Attempt:
    from ..engine.attempt import Attempt
    from ..sandbox.agent_command import AgentSetupError, AgentTimedOut

    # The agent ran out of time or never started: an error of the run, which no retry spends.
    timed_out = isinstance(failure, AgentTimedOut | AgentSetupError)
    run = item.config.stash[RUN_KEY]
    engine = run.engine()
    hook = item.config.hook
    agent_name = ws.agent  # the test's agent, named once when its workspace was made
    probe = Attempt(task=marker.task, agent=agent_name, workspace=ws, test=item.nodeid)
    checks = [
        c for found in hook.pytest_agentgate_checks(item=item, attempt=probe) for c in (found or ())
    ]
    attempt = engine.run_attempt(
        ws,
        task=marker.task,
        agent=agent_name,
        test=item.nodeid,
        spec=run.gate_for(item, marker, checks),
        test_failure=_failure_text(failure) if failure is not None and not timed_out else None,
        state=marker.state,
        agent_error=str(failure) if timed_out else None,
    )
    used = _used(ws, marker)
    attempt.budget = {name: [used[name], limit] for name, limit in marker.budget}
    item.stash[ATTEMPT_KEY] = attempt
    hook.pytest_agentgate_verdict(item=item, attempt=attempt)
    return attempt


def _rejection_message(attempt: Attempt) -> str:
    from .report import rejection_message

    verdict = attempt.verdict
    return rejection_message(
        {**attempt.as_dict(), "reason": verdict.reason, "check": verdict.check},
        attempt.workspace.repo.label,
        verdict.output,
        str(attempt.path),
    )
