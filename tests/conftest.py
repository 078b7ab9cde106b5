from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import make_service

pytest_plugins = ["pytester"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if shutil.which("git") is None:
        skip = pytest.mark.skip(reason="git is not installed")
        for item in items:
            item.add_marker(skip)


@pytest.fixture
def service(tmp_path: Path) -> Path:
    """A fresh ledger service repository (three modules and their tests) on branch main."""
    return make_service(tmp_path / "service")
