"""Settings are resolved once: the command line over the environment over the ini file over
the default; every bad value is a usage error naming the setting and its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_agentgate.engine import EngineSettings
from pytest_agentgate.engine.options import OPTIONS
from pytest_agentgate.pytest_plugin.marker import GatedMarker
from pytest_agentgate.pytest_plugin.settings import Settings


def settings(pytester: pytest.Pytester, *args: str) -> Settings:
    return Settings.from_config(pytester.parseconfig(*args))


def test_defaults(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    for option in OPTIONS:
        if option.env:
            monkeypatch.delenv(option.env, raising=False)
    s = settings(pytester)
    e = s.engine
    assert (e.promote, e.retest, e.agent, e.sandbox.mode, e.isolation) == (
        False, True, "agent", "auto", "shared"
    )  # fmt: skip
    assert e.gate.commands == () and s.run.workdir is None and s.run.keep_runs == 3
    assert e.exclude == EngineSettings().exclude  # not given: the engine's own


def test_command_line_over_environment_over_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\nagentgate_agent = from-ini\nagentgate_sandbox = none\n")
    monkeypatch.delenv("AGENTGATE_SANDBOX", raising=False)
    monkeypatch.delenv("AGENTGATE_AGENT", raising=False)
    assert settings(pytester).agent == "from-ini"
    monkeypatch.setenv("AGENTGATE_AGENT", "from-env")
    s = settings(pytester)
    assert s.agent == "from-env" and s.sources["agent"] == "environment AGENTGATE_AGENT"
    s = settings(pytester, "--agentgate-agent=from-flag", "--agentgate-sandbox=BWRAP")
    assert s.agent == "from-flag" and s.sources["agent"] == "command line --agentgate-agent"
    assert s.engine.sandbox.mode == "bwrap"  # choices are case-folded
    assert settings(pytester).engine.sandbox.mode == "none"


def test_lists_bools_and_numbers(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nagentgate_gate =\n    pytest -q\n    ruff check\nagentgate_promote = yes\n"
        "agentgate_max_files = 7\n"
    )
    s = settings(pytester, "--agentgate-protect=docs/*", "--agentgate-protect=  ")
    assert s.engine.promote is True and s.engine.max_files == 7
    gate = s.gate_spec()
    assert gate.commands == ("pytest -q", "ruff check")
    assert "conftest.py" in gate.harness and gate.protect == ("docs/*",)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agentgate-max-files=ten"], "invalid --agentgate-max-files 'ten' (from command line"),
        (["--agentgate-gate-timeout=0"], "--agentgate-gate-timeout '0' (from command line"),
        (["--agentgate-batch-max=-1"], "expected a number above 0"),
        (["--agentgate-rerun-gate=-1"], "expected 0 or more"),
        (["--agentgate-land=squish"], "expected one of merge, squash, rebase"),
        (["--agentgate-sandbox-bind=relative/path"], "must be an absolute path"),
        (["--agentgate-signing-key=/no/such/key"], "it is not a file"),
        (["--agentgate-sandbox=docker"], "expected one of auto, bwrap, none"),
        (["--agentgate-flaky=maybe"], "expected reject or accept"),
        (["--agentgate-isolation=vm"], "expected shared or sealed"),
        (["--agentgate-agent-network=lan"], "network must be none, host or allow:HOST"),
        (["--agentgate-gate-env=NOT-A-NAME"], "expected the name of an environment variable"),
        (["--agentgate-unprotect=conftest"], "the rules are"),
        (["--agentgate-agent=a\nb"], "control character"),
        (["--agentgate-report=/dev/null/r.json"], "its directory cannot be made"),
        (["--agentgate-keep-runs=-1"], "expected 0 or more"),
    ],
)
def test_bad_values_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    with pytest.raises(pytest.UsageError, match="agentgate: ") as found:
        settings(pytester, *args)
    assert message in str(found.value)


def test_protect_none_and_unprotect(pytester: pytest.Pytester) -> None:
    assert settings(pytester, "--agentgate-protect=none").gate_spec().harness == ()
    lifted = settings(pytester, "--agentgate-unprotect=conftest.py").gate_spec().harness
    assert "conftest.py" not in lifted and lifted


def test_the_marker_refines_the_run_gate_in_one_place(pytester: pytest.Pytester) -> None:
    s = settings(pytester, "--agentgate-gate=pytest -q", "--agentgate-protect=docs/*")
    run_gate = s.gate_spec()
    own = s.for_test(run_gate, GatedMarker("t", gate=("make check",), protect=("api/*",)), [], None)  # type: ignore[arg-type]
    assert own.commands == ("make check",) and own.protect == ("docs/*", "api/*")
    enough = s.for_test(run_gate, GatedMarker("t", gate=()), [], None)  # type: ignore[arg-type]
    assert enough.outcome_is_enough and enough.commands == ()
    inherited = s.for_test(run_gate, GatedMarker("t", max_changed_lines=3), [], None)  # type: ignore[arg-type]
    assert inherited.commands == ("pytest -q",) and inherited.max_changed_lines == 3


def test_engine_settings_carry_everything(pytester: pytest.Pytester, tmp_path: Path) -> None:
    s = settings(
        pytester, "--agentgate-promote", "--agentgate-target=dev", "--agentgate-sandbox=none",
        "--agentgate-agent-env=API_KEY", "--agentgate-exclude=*.db", "--agentgate-no-retest",
    )  # fmt: skip
    e = s.engine_settings(tmp_path)
    assert (e.target, e.promote, e.retest, e.workdir) == ("dev", True, False, tmp_path)
    assert e.sandbox.mode == "none" and e.sandbox.agent_env == ("API_KEY",)
    assert e.exclude == ("*.db",)


def test_gate_setup_reaches_the_gate(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nagentgate_gate_setup =\n    make version\n")
    s = settings(pytester, "--agentgate-gate=pytest -q")
    assert s.gate_spec().setup == ("make version",)
