"""The release installs: ``python -m build`` makes an sdist and a wheel that ``twine check``
passes, and the wheel, installed into a fresh virtual environment the way the CI recipe
installs it, runs ``agentgate demo``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "ci" / "github-actions.yml"


def _run(*args: str | Path, cwd: Path, timeout: float = 300) -> str:
    # The outer run's settings must not reach the tools (a pytest they start would read them).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def _source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored), copied:
    building writes its egg-info and build folders beside the sources, never in the
    checkout the rest of the suite is reading."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for rel in filter(None, listed.split("\0")):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("release")
    source = _source_copy(root / "source")
    out = root / "dist"
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source, cwd=root)
    return out


def test_build_makes_an_sdist_and_a_wheel_that_twine_check_passes(dist: Path) -> None:
    from pytest_agentgate import __version__

    names = sorted(p.name for p in dist.iterdir())
    assert names == [
        f"pytest_agentgate-{__version__}-py3-none-any.whl",
        f"pytest_agentgate-{__version__}.tar.gz",
    ]
    said = _run(sys.executable, "-m", "twine", "check", "--strict", *dist.iterdir(), cwd=dist)
    assert said.count("PASSED") == 2, said
    with zipfile.ZipFile(next(dist.glob("*.whl"))) as wheel:
        inside = wheel.namelist()
        metadata = wheel.read(f"pytest_agentgate-{__version__}.dist-info/METADATA").decode()
        entry_points = wheel.read(
            f"pytest_agentgate-{__version__}.dist-info/entry_points.txt"
        ).decode()
    assert "pytest_agentgate/py.typed" in inside  # typed for its users' mypy
    assert not [n for n in inside if n.startswith(("tests/", "bench/", "docs/"))]
    assert "License-Expression: MIT" in metadata and "Requires-Dist: pytest>=8.0" in metadata
    assert "agentgate = pytest_agentgate.pytest_plugin.hooks" in entry_points  # pytest11
    assert "agentgate = pytest_agentgate.cli.main:main" in entry_points


def _install_line() -> str:
    steps = yaml.safe_load(RECIPE.read_text())["jobs"]["agents"]["steps"]
    return str(next(step for step in steps if step.get("name") == "Install")["run"]).strip()


def test_the_wheel_installs_as_the_ci_recipe_installs_it_and_runs_the_demo(
    dist: Path, tmp_path: Path
) -> None:
    """In a fresh virtual environment, the recipe's install line finds the wheel by name in
    the project's agents/wheels/; the installed command and plugin are the wheel's, not the
    checkout's, and ``agentgate demo`` passes."""
    project = tmp_path / "project"
    (project / "agents" / "wheels").mkdir(parents=True)
    shutil.copy2(next(dist.glob("*.whl")), project / "agents" / "wheels")
    (project / "agents" / "requirements.txt").write_text("")
    _run(sys.executable, "-m", "venv", tmp_path / "env", cwd=tmp_path)
    python = tmp_path / "env" / "bin" / "python"
    line = _install_line()
    assert line.startswith("python -m pip install ") and "pytest-agentgate" in line.split()
    _run(python, *line.split()[1:], cwd=project)
    where = _run(python, "-c", "import pytest_agentgate; print(pytest_agentgate.__file__)",
                 cwd=tmp_path)  # fmt: skip
    assert where.startswith(str(tmp_path / "env")), where
    said = _run(tmp_path / "env" / "bin" / "agentgate", "demo", cwd=tmp_path)
    assert "the story held in" in said and "git fsck --strict: clean" in said, said[-2000:]
    plugins = _run(python, "-m", "pytest", "--version", "--version", cwd=tmp_path)
    assert "pytest-agentgate" in plugins, plugins  # pytest loads it from the wheel
