"""Settings are declared once: each option in one declaration, each default value written
once (in ``_constants``) and read by name everywhere a setting gets its default."""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_agentgate import _constants
from pytest_agentgate.pytest_plugin.options import OPTIONS

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
            if name == "Option" and len(node.args) > 3:
                found.append(node.args[3])
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


def test_the_declared_defaults_are_the_option_table_s() -> None:
    table = {option.name: option.default for option in OPTIONS}
    assert table["lease_seconds"] == _constants.DEFAULT_LEASE_S
    assert table["batch_max"] == _constants.DEFAULT_BATCH_MAX
    assert table["gate_timeout"] == _constants.DEFAULT_GATE_TIMEOUT_S
    assert table["sandbox_pids"] == _constants.DEFAULT_PIDS_MAX


def test_each_option_is_declared_once() -> None:
    names = [option.name for option in OPTIONS]
    assert len(names) == len(set(names))
    flags = [option.flag for option in OPTIONS]
    assert len(flags) == len(set(flags))
    text = (PACKAGE / "pytest_plugin" / "options.py").read_text(encoding="utf-8")
    for name in names:
        assert text.count(f'"{name}"') == 1, name  # its one declaration
