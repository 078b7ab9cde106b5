"""Engine settings are named: an unknown one is an error, never ignored."""

from __future__ import annotations

import pytest

from pytest_agentgate import EngineSettings


def test_unknown_engine_options_are_named() -> None:
    with pytest.raises(TypeError, match="unknown engine setting"):
        EngineSettings.of(target="main", promte=True)
