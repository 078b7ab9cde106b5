"""The layers hold: lint-imports keeps its contracts, nothing outside the git layer builds a
git command line, and each contract really breaks when the rule it states is broken."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_agentgate"
GIT_LAYER = PACKAGE / "git"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]' brings it")
    return subprocess.run(
        [exe, "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
    )


def test_the_import_contracts_are_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "16 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("git/repo.py", "from .. import engine as _e  # noqa", "folders: faces > engine"),
        ("judge/gate.py", "from .. import engine as _e  # noqa", "folders: faces > engine"),
        (
            "land/target.py",
            "import pytest as _p  # noqa",
            "the engine and below work without pytest",
        ),
        (
            "cli/main.py",
            "from ..pytest_plugin import hooks as _p  # noqa",
            "the command does not load the pytest plugin",
        ),
        ("store/records.py", "from . import attempts as _a  # noqa", "inside store/"),
        ("git/index.py", "from . import repo as _r  # noqa", "inside git/"),
        ("judge/results.py", "from . import gate as _g  # noqa", "inside judge/"),
        ("sandbox/supervisor.py", "from . import process as _p  # noqa", "inside sandbox/"),
        ("engine/parts.py", "from . import story as _s  # noqa", "inside engine/"),
        ("land/queue_folder.py", "from . import leader as _l  # noqa", "inside land/"),
        ("workspace/fork.py", "from . import snapshot as _s  # noqa", "inside workspace/"),
        ("remote/lease.py", "from . import server_queue as _q  # noqa", "inside remote/"),
        (
            "pytest_plugin/options.py",
            "from . import settings as _s  # noqa",
            "inside pytest_plugin/",
        ),
        ("cli/common.py", "from . import main as _m  # noqa", "inside cli/"),
    ],
)
def test_each_contract_breaks_when_its_rule_is_broken(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    shutil.copytree(
        PACKAGE, tmp_path / "pytest_agentgate", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    broken = tmp_path / "pytest_agentgate" / module
    broken.write_text(broken.read_text() + f"\n{line}\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert f"{contract}" in result.stdout and "BROKEN" in result.stdout


def _builds_git_command(node: ast.AST) -> str | None:
    """What in ``node`` starts git, if anything: a call of the git layer's runner (``_git``,
    a repository's ``_run``, its place's ``run``), or a list whose first element is the
    string ``git``."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("_run", "git", "run"):
            owner = func.value
            named = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if func.attr != "run" or named in ("_git", "place"):
                return f"a call of .{func.attr}()"
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        first = node.elts[0]
        if isinstance(first, ast.Constant) and first.value == "git":
            return "an argument list starting with 'git'"
    return None


def test_no_module_outside_the_git_layer_builds_a_git_command_line() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if GIT_LAYER in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            what = _builds_git_command(node)
            if what is not None:
                found.append(f"{path.name}:{getattr(node, 'lineno', '?')}: {what}")
    assert found == []


def test_the_check_finds_a_git_command_line() -> None:
    """The scan above is not vacuous: it finds each form it looks for."""
    for source in (
        "repo._run('rev-parse', 'HEAD')",
        "_git.run(['status'], _git.NO_REPOSITORY)",
        "subprocess.run(['git', 'status'])",
        "repo.git('log')",
        "repo.place.run('status')",
        "place.run('log')",
    ):
        assert any(_builds_git_command(n) for n in ast.walk(ast.parse(source))), source
