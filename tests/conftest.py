from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def bwrap() -> str:
    """The working bwrap this machine has; a skip with its reason when none can start a
    sandbox here, and under CI=true a failure: CI must run the contained tests."""
    from pytest_agentgate import sandbox

    resolved = sandbox.resolve(sandbox.Settings(mode="auto"))
    if resolved.program is None:
        reason = f"no working bubblewrap sandbox: {resolved.reason}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the sandboxed tests must run)", pytrace=False)
        pytest.skip(reason)
    return resolved.program


@pytest.fixture(params=["bwrap", "none"])
def sandbox_mode(request: pytest.FixtureRequest) -> str:
    """Each containment this machine can give: bwrap (needs a working sandbox), and none."""
    if request.param == "bwrap":
        request.getfixturevalue("bwrap")
    return str(request.param)
