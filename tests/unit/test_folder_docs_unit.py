"""Each folder's docstring names its modules: the map a reader opens first stays true as
modules are added, split or moved."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_agentgate"
FOLDERS = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_the_folder_docstring_names_every_module(folder: Path) -> None:
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    unnamed = [m for m in modules if f"``{m}``" not in doc and f":mod:`.{m}`" not in doc]
    assert not unnamed, f"{folder.name}/__init__.py does not name {unnamed}"
