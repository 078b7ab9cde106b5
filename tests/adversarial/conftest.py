"""Fixtures shared by the adversarial tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import AGENTS


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """A test suite of two gated tests (see ``helpers.AGENTS``), in its own directory."""
    path = tmp_path / "suite"
    path.mkdir()
    (path / "test_agents.py").write_text(AGENTS)
    return path
