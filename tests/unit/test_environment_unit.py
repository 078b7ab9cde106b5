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


def test_this_environment_s_plugins_are_importlib_s() -> None:
    from importlib.metadata import entry_points

    assert environment.plugins() == tuple(sorted({e.name for e in entry_points(group="pytest11")}))


def _environment(root, plugins, cfg="home = /usr/bin\n"):  # type: ignore[no-untyped-def]
    """A virtual environment's folders: its interpreter, its config, its plugins."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("")
    (root / "bin" / "python").chmod(0o755)
    if cfg is not None:
        (root / "pyvenv.cfg").write_text(cfg)
    info = root / "lib" / "python3.11" / "site-packages" / "plug-1.0.dist-info"
    info.mkdir(parents=True)
    lines = "".join(f"{name} = {name}_module\n" for name in plugins)
    (info / "entry_points.txt").write_text(f"[console_scripts]\nx = y\n\n[pytest11]\n{lines}")
    return root


def test_a_pytest_of_another_environment_is_given_that_environment_s_plugins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A project's tests run in its own virtual environment, the plugin from another: the
    gate's pytest was given this environment's plugins by name, which are not there."""
    other = _environment(tmp_path / "project-venv", ["cov", "django"])
    checkout = tmp_path / "checkout"
    assert environment.plugins_of(str(other / "bin" / "python"), None, checkout) == (
        "cov", "django",
    )  # fmt: skip
    on_path = environment.plugins_of("python", str(other / "bin"), checkout)
    assert on_path == ("cov", "django")
    # With the system's packages, those of the interpreter it was made from too.
    base = _environment(tmp_path / "base", ["timeout"], cfg=None)
    both = _environment(
        tmp_path / "both",
        ["cov"],
        cfg=f"home = {base / 'bin'}\ninclude-system-site-packages = true\n",
    )
    assert environment.plugins_of(str(both / "bin" / "python"), None, checkout) == (
        "cov",
        "timeout",
    )


def test_an_interpreter_inside_the_checkout_is_given_no_plugin(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A virtual environment a setup step made in the checkout holds what the attempt's own
    packaging installed: none of its entry points is trusted."""
    checkout = tmp_path / "checkout"
    _environment(checkout / ".venv", ["planted"])
    assert environment.plugins_of(".venv/bin/python", None, checkout) == ()
    assert environment.plugins_of(str(checkout / ".venv/bin/python"), None, checkout) == ()


def test_an_interpreter_whose_environment_cannot_be_told_loads_its_plugins_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    shims = tmp_path / ".pyenv" / "shims"
    shims.mkdir(parents=True)
    (shims / "python").write_text('#!/bin/sh\nexec pyenv exec python "$@"\n')
    (shims / "python").chmod(0o755)
    assert environment.plugins_of("python", str(shims), tmp_path / "checkout") is None
    # This environment's own interpreter: this environment's plugins.
    import sys

    assert environment.plugins_of(sys.executable, None, tmp_path) == environment.plugins()
