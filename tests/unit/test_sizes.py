"""Small modules with one job each: no module over 800 lines, no class over 500, no function
over 80. A unit past its limit fails, unless it is named below with its size (the list can
only shrink)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_agentgate"
LIMITS = {"module": 800, "class": 500, "function": 80}
#: A unit allowed over its limit, with its size (none is today): each one named here is a
#: split still to make, and may only shrink.
OVER: dict[str, int] = {}


def sizes() -> dict[str, tuple[str, int]]:
    """Every module, class and function of the package: (kind, lines), by name
    (``path``, ``path:Class``, ``path:Class.method``)."""
    found: dict[str, tuple[str, int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        text = path.read_text(encoding="utf-8")
        found[module] = ("module", text.count("\n") + 1)

        def visit(node: ast.AST, qual: str, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    name = f"{qual}.{child.name}" if qual else child.name
                    kind = "class" if isinstance(child, ast.ClassDef) else "function"
                    assert child.end_lineno is not None
                    found[f"{module}:{name}"] = (kind, child.end_lineno - child.lineno + 1)
                    visit(child, name)
                else:
                    visit(child, qual)

        visit(ast.parse(text, module), "")
    return found


def test_no_unit_is_over_its_limit_but_those_named() -> None:
    grown = {
        name: (lines, OVER.get(name))
        for name, (kind, lines) in sizes().items()
        if lines > max(LIMITS[kind], OVER.get(name, 0))
    }
    assert grown == {}, f"over their limit (lines, allowed): {grown}"


def test_the_named_exceptions_are_still_over() -> None:
    """A unit split below its limit leaves the list (so the list never hides a new one)."""
    found = sizes()
    stale = [n for n in OVER if n not in found or found[n][1] <= LIMITS[found[n][0]]]
    assert stale == []


#: Parameters a function may take (``self`` and ``cls`` not counted): a group of them that
#: travels together is a value (``Judging``, ``Mounts``, ``Watch``, ``Undo``...).
MOST_PARAMETERS = 8
#: The public entry points a person calls with a few of their keywords, where a value to
#: build first would make every call longer: named with their count, which may only shrink.
MANY_KEYWORDS = {
    "pytest_plugin/marker.py:gated": 18,  # the marker's own keywords, as a task is written
    "engine/story.py:Engine.run_attempt": 9,  # the engine's entry point, keyword-only
}


def parameter_counts() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()

        def visit(node: ast.AST, qual: str, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                name = f"{qual}.{child.name}" if qual and hasattr(child, "name") else ""
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    a = child.args
                    named = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                    count = len([n for n in named if n not in ("self", "cls")])
                    count += (a.vararg is not None) + (a.kwarg is not None)
                    found[f"{module}:{name or child.name}"] = count
                    visit(child, name or child.name)
                elif isinstance(child, ast.ClassDef):
                    visit(child, name or child.name)
                else:
                    visit(child, qual)

        visit(ast.parse(path.read_text(encoding="utf-8"), module), "")
    return found


def test_no_function_takes_more_than_eight_parameters_but_those_named() -> None:
    counts = parameter_counts()
    over = {
        name: (count, MANY_KEYWORDS.get(name))
        for name, count in counts.items()
        if count > max(MOST_PARAMETERS, MANY_KEYWORDS.get(name, 0))
    }
    assert over == {}, f"over {MOST_PARAMETERS} parameters (count, allowed): {over}"
    assert {n: counts.get(n) for n in MANY_KEYWORDS} == MANY_KEYWORDS  # each still there


def test_the_parameter_count_is_not_vacuous() -> None:
    assert parameter_counts()["judge/gate.py:run_commands"] == 6
    assert parameter_counts()["sandbox/containment.py:Sandbox.wrap"] == 4
