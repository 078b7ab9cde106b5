"""Projects as they are: the gates users already run (tox, nox, uv, make) and a version file
setuptools-scm writes at build time, each on a small fixture project, in the default sandbox.

For each recipe the same three things hold, as ``docs/gate.md`` promises: an honest change
lands with its tests counted one by one through the wrapper; a change that breaks the code
and renames the failing tests away is rejected by those tests' results, not waved through by
the wrapper's exit code; and the wrapper's own recipe file is harness, so an attempt that
rewrites it to run nothing is rejected by name.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import SERVICE, git, write

from pytest_agentgate import Engine, GateSpec

STORE = textwrap.dedent(SERVICE["ledger/store.py"]).lstrip("\n")
BROKEN_STORE = STORE.replace("self._rows.append(amount)", "pass")
TESTS = textwrap.dedent(SERVICE["tests/test_ledger.py"])
#: The failing tests renamed so pytest no longer collects them, one trivial test added.
HIDDEN_TESTS = (
    TESTS.replace("def test_handle", "def _handle").replace("def test_build", "def _build")
    + "\n\ndef test_nothing():\n    pass\n"
)
BIN = Path(sys.executable).parent
RECIPES = Path(__file__).resolve().parents[1] / "examples" / "recipes"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
#: Each recipe: the gate command as docs/recipes.md spells it, and the file it reads.
GATES = {
    "tox": ("tox -q -e py", "tox.ini"),
    "nox": ("nox -s tests", "noxfile.py"),
    "uv": ("uv run --no-project python -m pytest -q -p no:cacheprovider tests", ""),
    "make": ("make test", "Makefile"),
}
SCM_SETUP = (
    "env SETUPTOOLS_SCM_PRETEND_VERSION=1.2.3 python -m setuptools_scm --force-write-version-files"
)
SCM_TEST = (
    "from ledger._version import version\n\n\ndef test_version():\n    assert version == '1.2.3'\n"
)
GATE = "python -m pytest -q -p no:cacheprovider tests"


def tool(name: str) -> str:
    """The path of ``name`` beside this interpreter (the test extras install it) or on PATH;
    a skip with the reason when it is missing, and under CI=true a failure."""
    found = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        reason = f"{name} is not installed (pip install -e '.[test]' brings it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the recipe must be tested)", pytrace=False)
        pytest.skip(reason)
    return found


def gate_spec(*commands: str, **more: object) -> GateSpec:
    """The recipe's commands as written, with this interpreter's folder first on PATH (as an
    activated environment has it), so ``python``, ``tox`` and ``nox`` are the test extras'."""
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return GateSpec(commands=commands, env={"PATH": path}, timeout=120, **more)  # type: ignore[arg-type]


def recipe(name: str) -> tuple[dict[str, str], str, str]:
    """The files a project using ``name`` commits, its gate command, and its recipe file."""
    gate, recipe_file = GATES[name]
    tool(gate.split()[0])
    if not recipe_file:  # uv: a project file it would sync, which --no-project leaves alone
        return {"pyproject.toml": '[project]\nname = "ledger"\nversion = "0"\n'}, gate, ""
    return {recipe_file: (RECIPES / recipe_file).read_text()}, gate, recipe_file


def project(service: Path, files: dict[str, str], message: str) -> Path:
    write(service, files)
    git(service, "add", "-A")
    git(service, "commit", "-qm", message)
    return service


def attempt(e: Engine, files: dict[str, str], task: str) -> object:
    ws = e.fork(task=task)
    write(ws.path, files)
    return e.run_attempt(ws, task=task)


@pytest.mark.parametrize("name", ["tox", "nox", "uv", "make"])
def test_a_wrapper_gate_judges_each_test_and_guards_its_recipe(service: Path, name: str) -> None:
    files, gate, recipe_file = recipe(name)
    repo = project(service, files, f"gate through {name}")
    e = Engine.open(
        repo, "main", promote=True, workdir=repo.parent / "work",
        gate=gate_spec(gate),
    )  # fmt: skip
    honest = attempt(e, {"ledger/extra.py": "X = 1\n"}, "honest")
    assert honest.verdict.status == "promoted", honest.verdict  # type: ignore[attr-defined]
    record = git(repo, "log", "-1", "--format=%B", honest.record_ref)  # type: ignore[attr-defined]
    assert "Tests: 2 passed, 0 failed" in record, record
    tip = git(repo, "rev-parse", "main")
    hidden = attempt(
        e, {"ledger/store.py": BROKEN_STORE, "tests/test_ledger.py": HIDDEN_TESTS}, "hide"
    )
    assert hidden.verdict.status == "rejected", hidden.verdict  # type: ignore[attr-defined]
    assert "no longer pass" in hidden.verdict.reason  # type: ignore[attr-defined]
    if recipe_file:
        emptied = attempt(e, {"ledger/store.py": BROKEN_STORE, recipe_file: "\n"}, "empty recipe")
        assert emptied.verdict.status == "rejected", emptied.verdict  # type: ignore[attr-defined]
        assert recipe_file in emptied.verdict.reason, emptied.verdict  # type: ignore[attr-defined]
    assert git(repo, "rev-parse", "main") == tip
    e.close()


def test_tox_without_pass_env_says_how_to_keep_the_results_channel(service: Path) -> None:
    """tox starts its commands with an environment of its own: without ``pass_env`` no
    results come back, and the promoting run says so (and how to fix it) instead of judging
    by the exit code."""
    tox_ini = (RECIPES / "tox.ini").read_text()
    tox_ini = tox_ini.replace("pass_env = AGENTGATE_RESULTS, PYTEST_PLUGINS, PYTHONPATH\n", "")
    repo = project(service, {"tox.ini": tox_ini}, "tox without pass_env")
    e = Engine.open(
        repo, "main", promote=True, workdir=repo.parent / "work",
        gate=gate_spec(GATES["tox"][0]),
    )  # fmt: skip
    verdict = attempt(e, {"ledger/extra.py": "X = 1\n"}, "honest").verdict  # type: ignore[attr-defined]
    assert verdict.status == "error", verdict
    assert "no per-test results" in verdict.reason and "pass_env" in verdict.reason, verdict
    e.close()


def test_a_setuptools_scm_version_file_is_written_by_the_gate_setup(service: Path) -> None:
    """The version file is ignored and written at build time: each gate checkout gets it
    from the setup step, so the base and the attempt are judged with it; without the step the
    base cannot be judged, and an attempt that breaks the build's settings is rejected."""
    pytest.importorskip("setuptools_scm")
    pyproject = (RECIPES / "pyproject-setuptools-scm.toml").read_text()
    files = {
        "pyproject.toml": pyproject, ".gitignore": "ledger/_version.py\n",
        "tests/test_version.py": SCM_TEST,
    }  # fmt: skip
    repo = project(service, files, "version from setuptools-scm")
    e = Engine.open(
        repo, "main", promote=True, workdir=repo.parent / "work",
        gate=gate_spec(GATE, setup=(SCM_SETUP,)),
    )  # fmt: skip
    honest = attempt(e, {"ledger/extra.py": "X = 1\n"}, "honest")
    assert honest.verdict.status == "promoted", honest.verdict  # type: ignore[attr-defined]
    record = git(repo, "log", "-1", "--format=%B", honest.record_ref)  # type: ignore[attr-defined]
    assert "Tests: 3 passed, 0 failed" in record, record
    broken = pyproject.replace('version_file = "ledger/_version.py"', 'version_file = "v.py"')
    moved = attempt(e, {"pyproject.toml": broken}, "move the version file")
    assert moved.verdict.status == "rejected", moved.verdict  # type: ignore[attr-defined]
    assert "test_version" in moved.verdict.reason, moved.verdict  # type: ignore[attr-defined]
    e.close()
    without = Engine.open(
        repo, "main", promote=True, workdir=repo.parent / "work2",
        gate=gate_spec(GATE),
    )  # fmt: skip
    verdict = attempt(without, {"ledger/other.py": "Y = 1\n"}, "no setup").verdict  # type: ignore[attr-defined]
    assert verdict.status == "error", verdict  # the base's own tests cannot pass without it
    without.close()


#: The per-Python nox recipe (docs/recipes.md): one session of the project's own noxfile,
#: in the gate's environment, with no installs, and the checkout's src/ first on the path.
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
NOX_PER_PYTHON = f"env PYTHONPATH=src nox --no-venv --no-install --force-python {PY} -s tests"
#: A src-layout package named like one the gate's environment has installed (mkdocs brings
#: Markdown), as packaging is installed beside pytest: the installed copy can shadow it.
SHADOWED = {
    "pyproject.toml": '[project]\nname = "markdown-lite"\nversion = "0"\n',
    "src/markdown/__init__.py": 'def markdown(text):\n    return f"<p>{text}</p>"\n',
    "tests/test_markdown.py": (
        "from markdown import markdown\n\n\ndef test_paragraph():\n"
        '    assert markdown("x") == "<p>x</p>"\n'
    ),
}
BROKEN_MARKDOWN = {"src/markdown/__init__.py": "def markdown(text):\n    return text\n"}


@pytest.mark.parametrize("pythonpath", ["src", "unset"])
def test_a_per_python_noxfile_is_gated_on_the_checkout_not_the_installed_copy(
    tmp_path: Path, pythonpath: str
) -> None:
    """A noxfile with a session per Python version and ``session.install`` runs, as the
    recipe spells it, without network: one session, no venv, no install; ``PYTHONPATH=src``
    makes the tests import the checkout's package. Without it they would import the
    installed copy of the same name, and a change that breaks the package would pass: the
    gate refuses to judge such a run, naming the package, where it came from and the fix."""
    tool("nox")
    pytest.importorskip("markdown")
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    noxfile = (RECIPES / "noxfile-per-python.py").read_text()
    project(repo, {**SHADOWED, "noxfile.py": noxfile}, "a src layout gated through nox")
    gate = (
        NOX_PER_PYTHON if pythonpath == "src" else NOX_PER_PYTHON.replace("env PYTHONPATH=src ", "")
    )
    e = Engine.open(repo, "main", promote=False, workdir=tmp_path / "work", gate=gate_spec(gate))
    honest = attempt(e, {"src/markdown/extra.py": "X = 1\n"}, "honest")
    broken = attempt(e, BROKEN_MARKDOWN, "break the package")
    e.close()
    if pythonpath == "src":
        assert honest.verdict.status == "passed", honest.verdict  # type: ignore[attr-defined]
        assert broken.verdict.status == "rejected", broken.verdict  # type: ignore[attr-defined]
        assert "test_paragraph" in broken.verdict.reason  # type: ignore[attr-defined]
        return
    for found in (honest, broken):  # the installed Markdown answered: nothing is judged
        verdict = found.verdict  # type: ignore[attr-defined]
        assert verdict.status == "error", verdict
        assert "imported the package 'markdown' from" in verdict.reason, verdict
        assert "site-packages" in verdict.reason and "PYTHONPATH=src" in verdict.reason


def test_the_recipes_page_shows_the_tested_recipes() -> None:
    """docs/recipes.md includes each tested file and spells each tested command."""
    text = DOCS.read_text()
    for gate, recipe_file in GATES.values():
        assert f"`{gate}`" in text, gate
        if recipe_file:
            assert f'--8<-- "examples/recipes/{recipe_file}"' in text, recipe_file
    assert SCM_SETUP in text and '--8<-- "examples/recipes/pyproject-setuptools-scm.toml"' in text
    assert NOX_PER_PYTHON.replace(PY, "3.12") in text
    assert '--8<-- "examples/recipes/noxfile-per-python.py"' in text
