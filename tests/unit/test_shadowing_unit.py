"""Which new modules take the place of the tree's own (rule ``shadowing``), read from the
two trees' paths alone: the cases that must be found, and honest layouts that must not."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pytest_agentgate.judge.harness import _own_shadowing

BASE = (
    "ledger/__init__.py", "ledger/store.py", "ledger/report.py", "tests/test_ledger.py",
    "tests/helpers.py", "docs/conf.py", "conftest.py", "fixtures/cases.json", "setup.py",
)  # fmt: skip
SO = "cpython-311-x86_64-linux-gnu.so"


class Trees:
    """Two trees as the rules read them: their paths, no file contents, links by name."""

    def __init__(self, base: Sequence[str], new: Sequence[str], links: Sequence[str] = ()):
        self.trees = {"base": tuple(base), "new": tuple(new)}
        self.linked = set(links)

    def paths(self, tree: str) -> Sequence[str]:
        return self.trees[tree]

    def read(self, tree: str, path: str) -> bytes | None:
        return None

    def links(self, tree: str, paths: Sequence[str]) -> set[str]:
        return {p for p in paths if p in self.linked} if tree == "new" else set()

    def attributes(self, tree: str, paths: Sequence[str], names: Sequence[str]):  # type: ignore[no-untyped-def]
        return {}


def found(
    added: Sequence[str],
    removed: Sequence[str] = (),
    commands: Sequence[str] = (),
    base: Sequence[str] = (),
    links: Sequence[str] = (),
) -> list[str]:
    old = (*BASE, *base)
    trees = Trees(old, tuple(p for p in old if p not in removed) + tuple(added), links)
    return _own_shadowing([*added, *removed], "base", "new", trees, commands)


@pytest.mark.parametrize(
    ("added", "base", "named"),
    [
        (["tests/ledger/__init__.py"], [], "tests/ledger (shadows the tree's module 'ledger'"),
        (["tests/ledger.py"], [], "tests/ledger.py (shadows"),
        (["tests/setup.py"], [], "tests/setup.py (shadows the tree's module 'setup'"),
        (["ledger/store/__init__.py"], [], "ledger/store (is imported instead of ledger/store.py)"),
        ([f"ledger/store.{SO}"], [], "is imported instead of"),
        (["ledger/store.abi3.so"], [], "is imported instead of"),
        # A package's compiled __init__ beside the __init__.py it shows.
        ([f"ledger/__init__.{SO}"], [], f"ledger/__init__.{SO} (is imported instead of"),
        (["ledger/__init__.abi3.so"], [], "is imported instead of ledger/__init__.py"),
        # A package whose __init__ is compiled.
        ([f"ledger/store/__init__.{SO}"], [], "ledger/store (is imported instead of"),
        ([f"tests/ledger/__init__.{SO}"], [], "tests/ledger (shadows"),
        # A data folder of the base made a package.
        (["tests/ledger/__init__.py"], ["tests/ledger/sample.csv"], "tests/ledger (shadows"),
        (["ledger/store/__init__.py"], ["ledger/store/schema.sql"], "is imported instead of"),
        # The base's package is a namespace one: any regular package comes first.
        (["tests/ledger/__init__.py"], [], "tests/ledger (shadows"),
        # A top-level package outside the configured folders (a conftest puts it on the path).
        (["tests/inventory/__init__.py"], ["src/inventory/__init__.py"], "tests/inventory"),
        (["tests/billing.py"], ["svc/pyproject.toml", "svc/billing/__init__.py"], "tests/bill"),
        # A gate that changes into svc/ runs svc/tests: svc/ is where its code is imported from.
        (
            ["svc/tests/billing/__init__.py"],
            ["svc/billing/__init__.py", "svc/tests/test_billing.py"],
            "svc/tests/billing (shadows",
        ),
        # A module file beside a folder without __init__ comes first, at any depth.
        (["plugins.py"], ["plugins/calc.py"], "plugins.py (is imported instead of the folder"),
        (["ledger/core.py"], ["ledger/core/calc.py"], "ledger/core.py (is imported instead"),
        # A folder named like the tree's namespace package joins it, ahead of it.
        (["tests/plugins/calc.py"], ["plugins/calc.py"], "tests/plugins (joins the tree's"),
        # A helper at the top of one folder of tests, shadowed from another.
        (["tests/unit/helpers.py"], ["tests/unit/test_unit.py"], "tests/unit/helpers.py"),
        # The folder of a conftest.py is on the path too (tests in a package below it).
        (
            ["it/ledger/__init__.py"],
            ["it/conftest.py", "it/api/__init__.py", "it/api/test_api.py"],
            "it/ledger (shadows",
        ),
    ],
)
def test_what_takes_the_place_of_the_tree_s_own(
    added: list[str], base: list[str], named: str
) -> None:
    lines = found(added, base=base)
    assert any(named in line for line in lines), lines


def test_a_folder_the_gate_puts_on_its_path_is_looked_at_too() -> None:
    assert found(["lib/ledger.py"]) == []
    assert found(["lib/ledger.py"], commands=["PYTHONPATH=lib python -m pytest"])


@pytest.mark.parametrize(
    ("added", "base"),
    [
        (["ledger.py"], []),  # beside the package: the package is imported first
        (["tests/fixtures/cases.json", "tests/data/__init__.py"], []),  # not the tree's names
        (["tests/docs/notes.md"], []),  # no module there
        (["tests/sub/conftest.py"], []),  # conftest.py has its own rule
        (["ledger/sub/__init__.py", "ledger/extra.py"], []),
        (["ledger/store.pyi"], []),  # read by type checkers, never imported
        # A new test folder is not on the path of the base's tests (its modules are the
        # second session's, which judges nothing of the base).
        (["tests/sub/test_x.py", "tests/sub/ledger.py"], []),
        # Tests kept as a package: pytest puts the folder above them on the path.
        (["tests/ledger/__init__.py", "tests/ledger/test_store.py"], ["tests/__init__.py"]),
        # Tests inside the package: a submodule named like another top-level package.
        (["ledger/utils.py"], ["utils/__init__.py", "ledger/test_store.py"]),
        # Tests that mirror a namespace package: nothing of it is taken.
        (["tests/plugins/test_calc.py"], ["plugins/calc.py"]),
        (["tests/acme/core/test_engine.py"], ["acme/core/__init__.py", "acme/core/engine.py"]),
        # Packages no code is imported from: a benchmark's, a test's data, another service's.
        (["tests/utils.py"], ["benchmarks/utils/__init__.py"]),
        (["tests/worker/__init__.py"], ["services/worker/__init__.py"]),
        (["tests/app.py"], ["tests/data/sample/app/__init__.py"]),
    ],
)
def test_honest_layouts_shadow_nothing(added: list[str], base: list[str]) -> None:
    assert found(added, base=base) == []


def test_a_module_turned_into_a_package_shadows_nothing() -> None:
    assert found(["ledger/report/__init__.py"], removed=["ledger/report.py"]) == []


def test_a_data_folder_made_a_package_shadows_the_standard_library_too() -> None:
    """``tests/xml/`` held data in the base; an ``__init__.py`` there makes it the ``xml``
    the runner imports (the older rule took the folder for the base's)."""
    from pytest_agentgate.judge.harness import _shadowing

    base = (*BASE, "tests/xml/sample.xml")
    trees = {"base": base, "new": (*base, "tests/xml/__init__.py")}
    lines = _shadowing(
        ["tests/xml/__init__.py"], "base", "new", trees.__getitem__, lambda t, p: None
    )
    assert lines == ["tests/xml (shadows the module 'xml')"], lines
    trees["new"] = (*base, "tests/xml/more.xml")  # more data: no module
    assert (
        _shadowing(["tests/xml/more.xml"], "base", "new", trees.__getitem__, lambda t, p: None)
        == []
    )


def test_a_link_named_like_the_tree_s_module_is_followed() -> None:
    lines = found(["tests/ledger", "tests/_vendor/__init__.py"], links=["tests/ledger"])
    assert any(line.startswith("tests/ledger (shadows") for line in lines), lines


def test_a_namespace_package_of_the_tree_is_its_own() -> None:
    base = [p for p in BASE if p != "ledger/__init__.py"]
    trees = Trees(base, (*base, "tests/ledger/__init__.py"))
    lines = _own_shadowing(["tests/ledger/__init__.py"], "base", "new", trees)
    assert lines and lines[0].startswith("tests/ledger (shadows"), lines


def test_a_folder_named_like_a_namespace_package_of_src_joins_it() -> None:
    added = ["tests/acme/billing/__init__.py", "tests/acme/billing/calc.py"]
    base = ["src/acme/billing/__init__.py", "src/acme/billing/calc.py"]
    lines = found(added, base=base, commands=["PYTHONPATH=src python -m pytest"])
    assert any(line.startswith("tests/acme (joins the tree's namespace") for line in lines)
