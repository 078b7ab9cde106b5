"""Settings are declared once: each option in one declaration (``engine/options.py``) that
names the field it fills, each field filled by one setting, each default value written once
(in ``_constants``) and read by name everywhere a setting gets its default; no face copies a
setting into a value by hand."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pytest_agentgate import _constants
from pytest_agentgate.cli import common as cli
from pytest_agentgate.engine import EngineSettings
from pytest_agentgate.engine.options import BY_NAME, OPTIONS, Option
from pytest_agentgate.engine.resolving import Given, one, resolve
from pytest_agentgate.errors import SettingError
from pytest_agentgate.judge.spec import GateSpec
from pytest_agentgate.pytest_plugin.settings import RunSettings, Settings
from pytest_agentgate.sandbox import containment
from pytest_agentgate.sandbox.agent_command import AgentCommand

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_agentgate"
DEFAULTS = {
    name: value
    for name, value in vars(_constants).items()
    if name.startswith("DEFAULT_") and isinstance(value, int | float)
}


def _value(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift):
            return ast.literal_eval(node.left) << ast.literal_eval(node.right)
        return None


def default_sites(tree: ast.AST) -> list[ast.AST]:
    """Where a setting gets its default: parameter defaults, dataclass fields, an Option's
    default and argparse's ``default=``."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
        elif isinstance(node, ast.ClassDef):
            found += [s.value for s in node.body if isinstance(s, ast.AnnAssign) and s.value]
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "Option" and len(node.args) > 4:
                found.append(node.args[4])
            found += [k.value for k in node.keywords if k.arg == "default"]
    return found


def test_every_default_value_is_written_once() -> None:
    written: dict[str, list[str]] = {}
    # By value and type: a float 3.0 elsewhere is not the whole number of runs kept.
    values = {(type(v), v): n for n, v in DEFAULTS.items() if not isinstance(v, bool)}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_constants.py":
            continue
        for node in default_sites(ast.parse(path.read_text(encoding="utf-8"))):
            value = _value(node)
            key = (type(value), value)
            if isinstance(value, int | float) and not isinstance(value, bool) and key in values:
                where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
                written.setdefault(values[key], []).append(where)
    assert written == {}, f"a default written again instead of named: {written}"


#: The value each group of fields belongs to.
VALUES: dict[str, Any] = {
    "run": RunSettings,
    "engine": EngineSettings,
    "gate": GateSpec,
    "sandbox": containment.Settings,
    "command": AgentCommand,
}
#: Engine fields no setting fills: the face decides them (where, which run), or they are
#: values of their own, filled field by field.
ENGINE_OWN = {"workdir", "run_id", "gate", "sandbox"}
#: Gate fields a test's marker fills (``Settings.for_test``), or the judge while it runs.
GATE_OWN = {
    "checks", "allow_removed", "select", "additions", "skip", "unrequired", "grading",
    "max_changed_lines", "outcome_is_enough", "env", "results_mode",
}  # fmt: skip
#: The command's own arguments that share a setting's name: which repository, branch,
#: remote or agent a command looks at or acts as, not a setting of a gated run.
COMMAND_OWN = {"repo", "target", "remote", "agent"}


def _default_of(value: Any, name: str) -> Any:
    found = {f.name: f for f in dataclasses.fields(value)}[name]
    if found.default is not dataclasses.MISSING:
        return found.default
    return found.default_factory()  # type: ignore[misc]


def test_each_option_fills_one_field_of_a_real_value_and_each_field_has_one_option() -> None:
    filled: dict[str, list[str]] = {}
    for option in OPTIONS:
        assert option.group in VALUES, option
        fields = {f.name for f in dataclasses.fields(VALUES[option.group])}
        assert option.field in fields, f"{option.name} fills {option.into}, which is no field"
        filled.setdefault(option.into, []).append(option.name)
    assert {into: names for into, names in filled.items() if len(names) > 1} == {}
    own = {"engine": ENGINE_OWN, "gate": GATE_OWN, "run": set(), "sandbox": set()}
    # The agent command is parsed from its template (or a preset's); only how its usage is
    # read is a setting of its own.
    own["command"] = {f.name for f in dataclasses.fields(AgentCommand)} - {"usage_fields"}
    for group, value in VALUES.items():
        fields = {f.name for f in dataclasses.fields(value)}
        unfilled = fields - {o.field for o in OPTIONS if o.group == group} - own[group]
        assert unfilled == set(), f"{group} fields no setting fills: {unfilled}"


def test_each_declared_default_is_the_default_of_the_field_it_fills() -> None:
    """The table's default (the help and the docs show it) is what a value made without the
    setting holds, resolved through the declaration: the two cannot drift apart."""
    for option in OPTIONS:
        declared = one(option, Given(option.default))
        held = _default_of(VALUES[option.group], option.field)
        assert declared == held or (declared is None and held in (None, ())), option.name


def test_each_option_is_declared_once_and_no_face_declares_one_again() -> None:
    names = [option.name for option in OPTIONS]
    assert len(names) == len(set(names)) and len({o.flag for o in OPTIONS}) == len(names)
    declared: list[str] = []
    again: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            called = getattr(node.func, "id", getattr(node.func, "attr", ""))
            literal = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if called == "Option":
                assert path.name == "options.py" and path.parent.name == "engine", path
                declared += [v for v in literal[:1] if isinstance(v, str)]
            elif called in ("add_argument", "addoption"):
                for flag in (v for v in literal if isinstance(v, str) and v.startswith("--")):
                    name = flag.removeprefix("--agentgate-").removeprefix("--").replace("-", "_")
                    if name in BY_NAME and name not in COMMAND_OWN:
                        again.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {flag}")
    assert sorted(declared) == sorted(names)
    assert again == [], "declared again instead of added from the table"


def test_no_face_copies_a_setting_into_a_value_by_hand() -> None:
    """The faces build the engine's settings, its gate and its sandbox from the table's
    groups: a keyword naming a field a setting fills is a hand copy (as `engine_settings()`
    was, field by field)."""
    fills = {
        "EngineSettings": {o.field for o in OPTIONS if o.group == "engine"},
        "GateSpec": {o.field for o in OPTIONS if o.group == "gate"},
        "Settings": {o.field for o in OPTIONS if o.group == "sandbox"},
    }
    # ``agentgate land`` judges an attempt again as its record says it was to be judged.
    from_the_record = {"judging.py": {"protect", "landing"}}
    copies = []
    for folder in ("pytest_plugin", "cli"):
        for path in sorted((PACKAGE / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") in fills:
                    named = {k.arg for k in node.keywords} & fills[node.func.id]  # type: ignore[attr-defined]
                    named -= from_the_record.get(path.name, set())
                    if named:
                        copies.append(f"{path.name}:{node.lineno} {sorted(named)}")
    assert copies == []
    assert {f.name for f in dataclasses.fields(Settings)} == {
        "rootpath",
        "run",
        "engine",
        "sources",
    }


def test_the_plugin_and_the_command_resolve_a_setting_alike() -> None:
    """One declaration, two faces: the command's ``--gate-timeout`` is checked as the
    plugin's ``--agentgate-gate-timeout`` is, and names itself as the command spells it."""
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_settings(parser, "gate", "gate_timeout", "sandbox")
    args = parser.parse_args(["--gate", "pytest -q", "--gate-timeout", "30", "--sandbox", "NONE"])
    chosen = cli.settings_of(args, "gate", "gate_timeout", "sandbox")
    assert chosen.of("gate") == {"commands": ("pytest -q",), "timeout": 30.0}
    assert chosen.of("sandbox") == {"mode": "none"}
    args = parser.parse_args(["--gate-timeout", "-5"])
    with pytest.raises(cli.UsageProblem, match=r"invalid --gate-timeout '-5' \(from command line"):
        cli.settings_of(args, "gate_timeout")
    with pytest.raises(SettingError, match="--agentgate-gate-timeout '-5'"):
        resolve({"gate_timeout": Given("-5", "here")})


def test_a_gate_command_named_twice_runs_once_and_zero_is_taken_where_it_means_none() -> None:
    """Found by a review: the table kept a command given twice (it ran twice), and the
    command's ``prune --keep-runs 0`` (every old run removed) was refused."""
    twice = resolve({"gate": Given(["pytest -q", "pytest -q"]), "gate_exit_code": Given(["ruff"])})
    assert twice.of("gate")["commands"] == ("pytest -q", "ruff")
    assert resolve({"keep_runs": Given("0")}).value("keep_runs") == 0
    assert resolve({"rerun_gate": Given("0")}).value("rerun_gate") == 0
    with pytest.raises(SettingError, match="expected a number above 0"):
        resolve({"batch_max": Given("0")})


def test_resolving_fills_what_settings_read_together() -> None:
    gate = resolve({"gate": Given(["pytest -q"]), "gate_exit_code": Given(["ruff check ."])})
    assert gate.of("gate")["commands"] == ("pytest -q", "ruff check .")
    assert gate.of("gate")["exit_code"] == ("ruff check .",)
    nothing = resolve({"protect": Given(["none"])}).of("gate")
    assert nothing == {"protect": (), "harness": ()}
    preset = resolve({"agent": Given("codex")}, environ={})
    command = preset.of("run")["agent_command"]
    assert command.preset == "codex" and "OPENAI_API_KEY" in preset.of("sandbox")["agent_env"]
    assert str(preset.of("sandbox")["agent_network"]).startswith("allow:")
    told = resolve(
        {"agent": Given("codex"), "agent_network": Given("none", "command line")}, environ={}
    )
    assert str(told.of("sandbox")["agent_network"]) == "none"  # a person's word wins


def test_a_setting_not_given_keeps_the_default_of_what_it_fills() -> None:
    assert resolve({}).groups == {"run": {}, "engine": {}, "gate": {}, "sandbox": {}}
    usage = resolve({"agent_usage": Given(["tokens=usage.total"])}).groups
    assert "command" not in usage  # nothing to fold it into without a command
    assert resolve({}).value("no_retest") is True  # the field it fills is retest
    assert isinstance(BY_NAME["gate"], Option)
