"""Honest work is never refused for how its gate is spelled: each spelling projects write,
on a src layout whose package is not installed, is promoted with the per-test results the
same command gives when typed in the checkout.

Each case once failed: ``-o pythonpath=src`` read ``src`` from a configuration file the
plugin put above the checkout; a wrapper that sets ``PYTHONPATH`` itself lost the results
collector; a shell-wrapped pytest reported a per-run folder as its rootdir, so a baseline
made in another run did not match; grading dropped the gate's own environment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import SERVICE, git, write

from pytest_agentgate import Engine, GateSpec
from pytest_agentgate.errors import ConfigError
from pytest_agentgate.sandbox.containment import Bind, Settings

PY = sys.executable
PATH_ENV = {"PATH": f"{os.path.dirname(PY)}{os.pathsep}{os.environ['PATH']}"}
STORE = textwrap.dedent(SERVICE["ledger/store.py"]).lstrip("\n")
HONEST = {"src/ledger/store.py": '"""Where the ledger keeps its rows."""\n' + STORE}
QUIET = "-q -p no:cacheprovider"


def src_repo(root: Path, extra: dict[str, str] | None = None) -> Path:
    """The ledger service in a src layout, not installed: only the gate's own path
    settings make ``ledger`` importable."""
    repo = root / "service"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    files = {("src/" + k if k.startswith("ledger/") else k): v for k, v in SERVICE.items()}
    write(repo, {**files, **(extra or {})})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "src layout")
    return repo


def engine(
    repo: Path, command: str, sandbox: str, env: dict[str, str] | None = None,
    reads: tuple[Path, ...] = (), **spec: object,
) -> Engine:  # fmt: skip
    gate = GateSpec(commands=(command,), timeout=120, env=env or dict(PATH_ENV), **spec)  # type: ignore[arg-type]
    return Engine.open(
        repo, "main", promote=True, workdir=repo.parent / "work", gate=gate,
        sandbox=Settings(mode=sandbox, reads=reads),
    )  # fmt: skip


def by_hand(repo: Path, command: str) -> int:
    """The number of tests the command passes when typed in the checkout."""
    done = subprocess.run(
        ["sh", "-c", command], check=False, cwd=repo, capture_output=True, text=True,
        env={**os.environ, **PATH_ENV},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return int(re.findall(r"(\d+) passed", done.stdout)[-1])


def promoted(
    repo: Path, command: str, sandbox: str, files: dict[str, str] = HONEST, **how: object
) -> object:
    e = engine(repo, command, sandbox, **how)  # type: ignore[arg-type]
    ws = e.fork(task="docstring")
    write(ws.path, files)
    done = e.run_attempt(ws, task="docstring")
    e.close()
    assert done.verdict.status == "promoted", (done.verdict.reason, done.verdict.output[-800:])
    return done


MAKEFILE = f"test:\n\tPYTHONPATH=src python -m pytest {QUIET} tests\n"
SPELLINGS = {
    "-o pythonpath=src": (f"{PY} -m pytest {QUIET} -o pythonpath=src tests", {}),
    "pythonpath in pyproject": (
        f"{PY} -m pytest {QUIET} tests",
        {"pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["src"]\n'},
    ),
    "env PYTHONPATH=src": (f"env PYTHONPATH=src {PY} -m pytest {QUIET} tests", {}),
    "--import-mode=importlib": (
        f"{PY} -m pytest {QUIET} --import-mode=importlib -o pythonpath=src tests",
        {},
    ),
    "sh -c with PYTHONPATH": (f"sh -c 'PYTHONPATH=src python -m pytest {QUIET} tests'", {}),
    "a Makefile": ("make test", {"Makefile": MAKEFILE}),
    "echo first, then pytest": (
        f"sh -c 'echo starting; PYTHONPATH=src python -m pytest {QUIET} tests'",
        {},
    ),
    "-c FILE": (
        f"{PY} -m pytest {QUIET} -c ci/pytest.ini tests",
        {"ci/pytest.ini": "[pytest]\npythonpath = ../src\n"},
    ),
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_an_honest_change_is_promoted_however_its_gate_is_spelled(
    tmp_path: Path, sandbox_mode: str, spelling: str
) -> None:
    command, files = SPELLINGS[spelling]
    repo = src_repo(tmp_path, files)
    passed = by_hand(repo, command)
    done = promoted(repo, command, sandbox_mode)
    assert done.results["passed"] == passed  # type: ignore[attr-defined]


def project_venv(root: Path) -> Path:
    """The project's own virtual environment, the plugin's not in it: pytest and what it
    needs, linked in from this one (no download), and no other plugin."""
    import importlib.metadata as md
    import sysconfig

    venv = root / "project-venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    for name in ("pytest", "pluggy", "iniconfig", "packaging", "pygments"):
        dist = md.distribution(name)
        for top in {str(f).split("/")[0] for f in dist.files or ()} - {"..", "bin"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    return venv


def test_a_pytest_in_the_project_s_own_environment_is_given_its_plugins(
    tmp_path: Path, sandbox_mode: str
) -> None:
    """The plugin runs from one environment, the project's tests in their own: its pytest
    was given the plugin's environment's plugins by name (``-p agentgate``), which are not
    there, and the gate could not run on the base."""
    venv = project_venv(tmp_path)
    command = f"{venv}/bin/python -m pytest {QUIET} -o pythonpath=src tests"
    repo = src_repo(tmp_path)
    passed = by_hand(repo, command)
    done = promoted(repo, command, sandbox_mode, reads=(venv,))
    assert done.results["passed"] == passed  # type: ignore[attr-defined]


def test_a_python_a_version_manager_s_shim_runs_is_found_in_the_sandbox(
    tmp_path: Path, bwrap: str
) -> None:
    """``python`` on PATH is a shim (pyenv, rbenv, asdf) that runs the manager's own program
    beside it: the sandbox showed the shims' folder alone, the shim found nothing to run,
    and the gate could not run on the base."""
    manager = tmp_path / "home" / ".manager"
    (manager / "libexec").mkdir(parents=True)
    (manager / "shims").mkdir()
    (manager / "libexec" / "run").write_text(f'#!/bin/sh\nexec {PY} "$@"\n')
    (manager / "shims" / "python").write_text(
        '#!/bin/sh\nexec "$(dirname "$0")/../libexec/run" "$@"\n'
    )
    for program in (manager / "libexec" / "run", manager / "shims" / "python"):
        program.chmod(0o755)
    command = f"python -m pytest {QUIET} -o pythonpath=src tests"
    repo = src_repo(tmp_path)
    path = {"PATH": f"{manager / 'shims'}{os.pathsep}{os.environ['PATH']}"}
    promoted(repo, command, "bwrap", env=path)


TOX = f"""[tox]
env_list = py
[testenv]
skip_install = true
system_site_packages = true
pass_env = AGENTGATE_RESULTS, PYTEST_PLUGINS, PYTHONPATH
setenv = PYTHONPATH = src{{:}}{{env:PYTHONPATH:}}
commands = python -m pytest {QUIET} tests
"""


def test_tox_with_setenv_pythonpath(tmp_path: Path, bwrap: str) -> None:
    """tox's setenv: kept as documented (src before what it is given), per-test results
    come back; replacing PYTHONPATH in an environment without this plugin is an error that
    says what to write instead, found before any agent works."""
    repo = src_repo(tmp_path, {"tox.ini": TOX})
    done = promoted(repo, "tox -q -e py", "auto")
    assert done.results["passed"] == 2  # type: ignore[attr-defined]
    replaced = TOX.replace("src{:}{env:PYTHONPATH:}", "src")
    repo = src_repo(tmp_path / "replaced", {"tox.ini": replaced})
    e = engine(repo, "tox -q -e py", "auto")
    with pytest.raises(Exception, match=r"could not load the results collector.*src\{:\}"):
        e.baseline(git(repo, "rev-parse", "main"), e.gate)
    e.close()


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_baseline_made_in_another_run_matches(
    tmp_path: Path, sandbox_mode: str, wrapped: bool
) -> None:
    """The fingerprint holds nothing that differs between runs: the base's results made by
    one engine judge an attempt in another."""
    command = f"{PY} -m pytest {QUIET} -o pythonpath=src tests"
    if wrapped:
        command = f"sh -c 'echo hi; PYTHONPATH=src python -m pytest {QUIET} tests'"
    repo = src_repo(tmp_path)
    first = engine(repo, command, sandbox_mode)
    first.baseline(git(repo, "rev-parse", "main"), first.gate)
    first.close()
    second = engine(repo, command, sandbox_mode)
    ws = second.fork(task="docstring")
    write(ws.path, HONEST)
    done = second.run_attempt(ws, task="docstring")
    second.close()
    assert done.verdict.status == "promoted", done.verdict.reason


def test_grading_runs_the_gates_own_command_and_environment(
    tmp_path: Path, sandbox_mode: str
) -> None:
    from pytest_agentgate.judge.grading import Grading

    tests = textwrap.dedent(SERVICE["tests/test_ledger.py"]) + (
        "\n\ndef test_total():\n    from ledger.store import Store\n"
        "    s = Store()\n    s.add_entry(2)\n    s.add_entry(3)\n    assert s.total() == 5\n"
    )
    repo = src_repo(tmp_path, {"tests/test_ledger.py": tests})
    fixed = (
        HONEST["src/ledger/store.py"] + "\n    def total(self):\n        return sum(self._rows)\n"
    )
    for command in (
        f"env PYTHONPATH=src {PY} -m pytest {QUIET} tests",
        f"sh -c 'PYTHONPATH=src python -m pytest {QUIET} tests'",
    ):
        grading = Grading(
            ("tests/test_ledger.py::test_total",), ("tests/test_ledger.py::test_handle",)
        )
        e = engine(repo, command, sandbox_mode, grading=grading)
        ws = e.fork(task="add total")
        write(ws.path, {"src/ledger/store.py": fixed})
        done = e.run_attempt(ws, task="add total")
        e.close()
        assert done.verdict.status == "promoted", (command, done.verdict.reason)
        assert done.results["grade"] == "FULL"
        # Only the graded tests ran: test_build was never selected.
        assert set(done.results["pass_to_pass"]) == {"tests/test_ledger.py::test_handle"}
        git(repo, "reset", "-q", "--hard", "HEAD~1")  # the next command grades the same task


def test_a_writable_bind_holding_the_base_repository_is_refused_before_any_agent(
    tmp_path: Path, bwrap: str
) -> None:
    repo = src_repo(tmp_path)
    bind = Bind.parse(f"{tmp_path}:rw", "--agentgate-sandbox-bind")
    with pytest.raises(ConfigError, match=r"sandbox-bind .*:rw holds .*drop :rw"):
        Engine.open(
            repo, "main", promote=True, workdir=repo.parent / "work",
            gate=GateSpec(commands=(f"{PY} -m pytest tests",)),
            sandbox=Settings(mode="auto", binds=(bind,)),
        )  # fmt: skip
    # Read-only, the same folder works.
    readonly = Bind.parse(str(tmp_path), "--agentgate-sandbox-bind")
    e = Engine.open(
        repo, "main", promote=True, workdir=repo.parent / "work",
        gate=GateSpec(commands=(f"{PY} -m pytest {QUIET} -o pythonpath=src tests",), timeout=120),
        sandbox=Settings(mode="auto", binds=(readonly,)),
    )  # fmt: skip
    ws = e.fork(task="docstring")
    write(ws.path, HONEST)
    assert e.run_attempt(ws, task="docstring").verdict.status == "promoted"


FORGER = """
import os, socket


def _forge():
    path = os.environ.get("AGENTGATE_RESULTS")
    if path:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        for line in ('{"kind": "hello", "pid": 1}',
                     '{"kind": "test", "id": "tests/test_ledger.py::test_handle", "outcome": "passed"}',
                     '{"kind": "end", "exitstatus": 0}'):
            s.sendall(line.encode() + b"\\n")


_forge()
"""


@pytest.mark.parametrize("package", [False, True])
@pytest.mark.parametrize("name", ["pytest_agentgate", "_pytest", "sitecustomize"])
def test_the_runner_cannot_be_shadowed_on_a_path_no_rule_reads(
    tmp_path: Path, name: str, package: bool
) -> None:
    """A Makefile puts src on PYTHONPATH, which no rule reads: a package named like the
    runner, this plugin or a module Python imports at start, in a folder that is no
    package, is refused wherever it is."""
    repo = src_repo(tmp_path, {"Makefile": MAKEFILE})
    e = engine(repo, "make test", "none")
    ws = e.fork(task="shadow")
    broken = HONEST["src/ledger/store.py"].replace("self._rows.append(amount)", "pass")
    place = f"src/{name}.py" if name == "sitecustomize" else f"src/{name}/__init__.py"
    # With src/__init__.py too: a folder the attempt makes a package is on PYTHONPATH as
    # readily (a review found the exemption read the attempt's packages).
    extra = {"src/__init__.py": ""} if package else {}
    write(ws.path, {"src/ledger/store.py": broken, place: FORGER, **extra})
    done = e.run_attempt(ws, task="shadow")
    e.close()
    assert done.verdict.status == "rejected", done.verdict
    assert f"shadows the module {name!r}" in done.verdict.reason
