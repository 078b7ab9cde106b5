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


def found(added: Sequence[str], removed: Sequence[str] = (), commands: Sequence[str] = ()):
    trees = {"base": BASE, "new": tuple(p for p in BASE if p not in removed) + tuple(added)}
    return _own_shadowing(
        [*added, *removed], "base", "new", trees.__getitem__, lambda t, p: None, commands
    )


@pytest.mark.parametrize(
    ("added", "named"),
    [
        (["tests/ledger/__init__.py"], "tests/ledger (shadows the tree's module 'ledger'"),
        (["tests/ledger.py"], "tests/ledger.py (shadows"),
        (["tests/sub/test_x.py", "tests/sub/ledger.py"], "tests/sub/ledger.py (shadows"),
        (["tests/setup.py"], "tests/setup.py (shadows the tree's module 'setup'"),
        (["ledger/store/__init__.py"], "ledger/store (is imported instead of ledger/store.py)"),
        (["ledger/store.cpython-311-x86_64-linux-gnu.so"], "is imported instead of"),
        (["ledger/store.abi3.so"], "is imported instead of"),
    ],
)
def test_what_takes_the_place_of_the_tree_s_own(added: list[str], named: str) -> None:
    assert any(named in line for line in found(added)), found(added)


def test_a_folder_the_gate_puts_on_its_path_is_looked_at_too() -> None:
    assert found(["lib/ledger.py"]) == []
    assert found(["lib/ledger.py"], commands=["PYTHONPATH=lib python -m pytest"])


@pytest.mark.parametrize(
    "added",
    [
        ["ledger.py"],  # beside the package: the package is imported first
        ["tests/fixtures/cases.json", "tests/data/__init__.py"],  # not the tree's names
        ["tests/docs/notes.md"],  # no module there
        ["tests/sub/conftest.py"],  # conftest.py has its own rule
        ["ledger/sub/__init__.py", "ledger/extra.py"],
        ["ledger/store.pyi"],  # read by type checkers, never imported
    ],
)
def test_honest_layouts_shadow_nothing(added: list[str]) -> None:
    assert found(added) == []


def test_a_module_turned_into_a_package_shadows_nothing() -> None:
    assert found(["ledger/report/__init__.py"], removed=["ledger/report.py"]) == []
