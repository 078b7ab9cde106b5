from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import make_service

# pytester's in-process runs drop modules first imported during a run. Importing the whole
# engine here keeps one copy of each module (and of each exception class) for the session.
import pytest_agentgate.cli
import pytest_agentgate.demo
import pytest_agentgate.engine
import pytest_agentgate.prune  # noqa: F401

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
