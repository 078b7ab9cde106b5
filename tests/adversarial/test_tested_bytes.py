"""The tested bytes are the landed bytes: nothing a gate runs may change a tracked file of
the checkout its verdict is about, even when the file is put back before the step ends.

The attacks once landed a broken tree: the setuptools-scm recipe with ``version_file``
pointed at the broken module and the good code as its template (the setup step wrote the
good module in the gate checkout, the tests passed, the broken module landed); and a setup
script that imports the agent's package, whose import rewrites another file.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import git, write
from test_judging import BROKEN_STORE, GOOD_STORE
from test_project_recipes import GATE, RECIPES, SCM_SETUP, SCM_TEST, gate_spec

from pytest_agentgate import Engine
from pytest_agentgate.sandbox.containment import Settings

#: Each test judges attempts on the service's base: its results are computed once a worker.
pytestmark = pytest.mark.shared_baselines


def scm_project(service: Path) -> tuple[Path, str]:
    pytest.importorskip("setuptools_scm")
    pyproject = (RECIPES / "pyproject-setuptools-scm.toml").read_text()
    write(
        service,
        {
            "pyproject.toml": pyproject,
            ".gitignore": "ledger/_version.py\n__pycache__/\n",
            "tests/test_version.py": SCM_TEST,
        },
    )
    git(service, "add", "-A")
    git(service, "commit", "-qm", "version from setuptools-scm")
    return service, pyproject


def engine(repo: Path, sandbox: str, *setup: str, env: dict[str, str] | None = None) -> Engine:
    spec = gate_spec(GATE, setup=setup)
    spec = dataclasses.replace(spec, env={**spec.env, **(env or {})})
    return Engine.open(
        repo, "main", promote=True, workdir=repo.parent / "work", gate=spec,
        sandbox=Settings(mode=sandbox),
    )  # fmt: skip


def attempt(e: Engine, files: dict[str, str], task: str) -> object:
    ws = e.fork(task=task)
    write(ws.path, files)
    return e.run_attempt(ws, task=task)


def test_a_setup_step_that_rewrites_a_tracked_module_rejects(
    service: Path, sandbox_mode: str
) -> None:
    repo, pyproject = scm_project(service)
    e = engine(repo, sandbox_mode, SCM_SETUP)
    template = GOOD_STORE.replace("\n", "\\n").replace('"', '\\"')
    cheat = pyproject.replace(
        'version_file = "ledger/_version.py"',
        f'version_file = "ledger/store.py"\nversion_file_template = "{template}"',
    )
    before = git(repo, "rev-parse", "main")
    done = attempt(e, {"pyproject.toml": cheat, "ledger/store.py": BROKEN_STORE}, "scm cheat")
    verdict = done.verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    assert "setup changed tracked file(s)" in verdict.reason and "ledger/store.py" in verdict.reason
    assert git(repo, "rev-parse", "main") == before
    honest = attempt(e, {"ledger/extra.py": "X = 1\n"}, "honest")
    assert honest.verdict.status == "promoted", honest.verdict  # type: ignore[attr-defined]
    e.close()


REWRITER = """
import os

_here = os.path.dirname(os.path.abspath(__file__))
_store = os.path.join(_here, "store.py")
with open(_store) as f:
    _text = f.read()
if "pass" in _text and "append" not in _text:
    with open(_store, "w") as f:
        f.write(_text.replace("pass", "self._rows.append(amount)"))
"""


@pytest.mark.parametrize("when", ["setup", "gate"])
def test_an_import_that_rewrites_another_file_rejects(
    service: Path, sandbox_mode: str, when: str
) -> None:
    """The agent's package rewrites its broken module when imported: by a setup script that
    imports it, or by the gate's own tests before the module is first imported."""
    setup = (f"{sys.executable} -c 'import ledger'",) if when == "setup" else ()
    e = engine(service, sandbox_mode, *setup)
    files = {"ledger/__init__.py": REWRITER, "ledger/store.py": BROKEN_STORE}
    done = attempt(e, files, f"rewrite on import ({when})")
    verdict = done.verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    assert "changed tracked file(s)" in verdict.reason and "ledger/store.py" in verdict.reason
    e.close()


def test_a_file_changed_and_put_back_is_still_found(service: Path, sandbox_mode: str) -> None:
    """A test that rewrites a module and restores its bytes before the run ends."""
    e = engine(service, sandbox_mode)
    sneaky = textwrap.dedent(
        """
        import pathlib


        def test_touch():
            store = pathlib.Path(__file__).parents[1] / "ledger" / "store.py"
            text = store.read_bytes()
            store.write_bytes(b"")
            store.write_bytes(text)
        """
    )
    done = attempt(e, {"tests/test_touch.py": sneaky}, "put back")
    verdict = done.verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    assert "ledger/store.py" in verdict.reason
    e.close()


@pytest.mark.shared_baselines(False)  # of how the base's results are computed
def test_the_base_that_rewrites_its_own_files_is_an_error_before_any_agent(
    service: Path,
) -> None:
    """No attempt can be judged by a gate that changes the base's own tracked files: the
    run says so when it computes the base's results, and blames no attempt."""
    write(
        service,
        {
            "tests/test_touch.py": "import os\n\n\ndef test_touch():\n    os.utime('ledger/api.py')\n"
        },
    )
    git(service, "add", "-A")
    git(service, "commit", "-qm", "a test that touches a file")
    e = engine(service, "none")
    with pytest.raises(Exception, match=r"changed tracked file\(s\).*ledger/api.py"):
        e.baseline(git(service, "rev-parse", "main"), e.gate)
    e.close()


WRITES_BYTECODE = """
import importlib.util, marshal, os, struct, sys

GOOD = {good!r}
open("ledger/_generated.py", "w").write("X = 1\\n")
source = "ledger/store.py"
st = os.stat(source)
header = struct.pack("<III", 0, int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)
os.makedirs("ledger/__pycache__", exist_ok=True)
with open(f"ledger/__pycache__/store.{{sys.implementation.cache_tag}}.pyc", "wb") as out:
    out.write(importlib.util.MAGIC_NUMBER + header + marshal.dumps(compile(GOOD, source, "exec")))
"""


WRITES_CACHED_BYTECODE = """
import importlib.util, marshal, os, sys

GOOD = {good!r}
open("ledger/_generated.py", "w").write("X = 1\\n")
source = os.path.abspath("ledger/store.py")
# An unchecked-hash pyc: Python runs it without looking at the source. Written where the
# gate's command reads bytecode from: its private /tmp when contained, the folder beside
# the checkout when not.
checkout = os.getcwd()
prefixes = [
    os.path.join(os.environ.get("TMPDIR", "/tmp"), ".agentgate-pycache"),
    os.path.join(os.path.dirname(checkout), os.path.basename(checkout) + ".pyc", ".agentgate-pycache"),
    # A folder the gate's environment names (its setup steps get that environment too).
    *([os.environ["PYTHONPYCACHEPREFIX"]] if "PYTHONPYCACHEPREFIX" in os.environ else []),
]
body = marshal.dumps(compile(GOOD, source, "exec"))
for prefix in prefixes:
    folder = prefix + os.path.dirname(source)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"store.{{sys.implementation.cache_tag}}.pyc"), "wb") as out:
            out.write(importlib.util.MAGIC_NUMBER + b"\\x01\\x00\\x00\\x00" + b"\\x00" * 8 + body)
    except OSError:
        pass  # not writable from where this one runs
"""


@pytest.mark.parametrize(
    "where", ["__pycache__", "the command's folder", "a folder the gate names"]
)
def test_bytecode_a_setup_step_writes_never_runs_in_place_of_the_source(
    service: Path, sandbox_mode: str, where: str
) -> None:
    """A setup step runs the attempt's code, which wrote the good store's bytecode:
    - into ``__pycache__``, stamped with the broken source's time and size (found by a
      review: Python ran it in place of the source that lands); the gate's command reads
      bytecode from a folder of its own;
    - as an unchecked-hash pyc where that folder maps the broken module (the setup step
      ran in the same private folder, and the broken module landed); the command's folder
      is made after the setup steps, under a name they could not guess;
    - where the gate's own environment names a bytecode folder, which its setup steps got
      too (found by a review): the command's own folder is always the one it uses."""
    write(service, {"ledger/gen.py": "open('ledger/_generated.py', 'w').write('X = 1\\n')\n"})
    git(service, "add", "-A")
    git(service, "commit", "-qm", "a generated file")
    named = f"/tmp/agentgate-named-pyc-{os.getpid()}-{sandbox_mode}"
    env = {"PYTHONPYCACHEPREFIX": named} if where == "a folder the gate names" else None
    e = engine(service, sandbox_mode, f"{sys.executable} -m ledger.gen", env=env)
    script = WRITES_BYTECODE if where == "__pycache__" else WRITES_CACHED_BYTECODE
    files = {"ledger/store.py": BROKEN_STORE, "ledger/gen.py": script.format(good=GOOD_STORE)}
    try:
        verdict = attempt(e, files, "bytecode").verdict  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(named, ignore_errors=True)
    assert verdict.status == "rejected", verdict
    assert "no longer pass" in verdict.reason, verdict.reason
    e.close()
