"""The environment read from its folders says what importlib.metadata says, faster."""

from __future__ import annotations

import re
from importlib.metadata import distributions, packages_distributions

import pytest

from pytest_agentgate.judge import environment, harness


def test_every_distribution_is_listed_with_its_version() -> None:
    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    expected = {f"{normal(d.metadata['Name'])}=={d.version}" for d in distributions()}
    assert set(environment.versions()) == expected
    assert f"pytest=={pytest.__version__}" in environment.versions()


def test_every_importable_name_of_a_distribution_can_be_shadowed() -> None:
    names = environment.top_level_names(harness._module_name)
    importable = {n for n in packages_distributions() if n.isidentifier()}
    assert importable <= names, sorted(importable - names)
    # The editable install's package (a finder maps it), and pytest's own.
    assert {"pytest_agentgate", "_pytest", "pluggy", "iniconfig"} <= names
