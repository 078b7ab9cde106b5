"""Bytecode the plugin gives a gate command (``judge/bytecode.py``): used by the real Python
and pytest of a command, only for bytes the trusted tree holds, never taken from what a
command wrote, never for a file outside the environment every command sees, and whole or
not at all when the disk refuses a write."""

from __future__ import annotations

import importlib.util
import marshal
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import git, write

from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.judge.bytecode import Bytecode, Tags, env_roots
from pytest_agentgate.workspace.fork import checkout_tree

TAGS = Tags.here()
MOD = "def value():\n    return 1\n"
TEST = textwrap.dedent(
    """
    from pkg.mod import value


    def test_value():
        assert value() == 1


    def test_fails_here():
        import os
        assert os.environ.get("FAIL_ONE") != "1"
    """
)


def make_project(root: Path, tests: dict[str, str]) -> Path:
    """A package of one module and the test modules ``tests``, committed on main."""
    repo = root / "project"
    write(repo, {"pkg/__init__.py": "", "pkg/mod.py": MOD, **tests})
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


@pytest.fixture
def project(tmp_path: Path) -> BaseRepo:
    return BaseRepo.open(make_project(tmp_path, {"tests/test_mod.py": TEST}))


def branch(repo: BaseRepo, name: str, files: dict[str, str]) -> str:
    """The tree of a commit on ``name`` that changes ``files`` from main."""
    root = repo.worktree
    assert root is not None
    git(root, "checkout", "-q", "-b", name)
    write(root, files)
    git(root, "commit", "-qam", name)
    git(root, "checkout", "-q", "main")
    return repo.tree_of(name)


def run_pytest(checkout: Path, folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    environ.update(PYTHONPYCACHEPREFIX=str(folder), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "no:randomly", "tests"],
        cwd=checkout, env=environ, capture_output=True, text=True, check=False,
    )  # fmt: skip


def pycs(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.rglob("*.pyc")}


def flags(path: Path) -> bytes:
    return path.read_bytes()[4:8]


def learnt(repo: BaseRepo, root: Path, tree: str) -> tuple[Bytecode, Path, Path]:
    """A Bytecode that watched one cold run of ``tree``'s tests; its folder; its checkout."""
    bytecode = Bytecode(repo)
    checkout = checkout_tree(repo, tree, root, name="first")
    folder = root / "first-pyc"
    assert run_pytest(checkout, folder).returncode == 0
    bytecode.learn(folder, checkout)
    return bytecode, folder, checkout


def test_the_next_command_runs_the_bytecode_given_and_its_tracebacks_name_its_checkout(
    project: BaseRepo, tmp_path: Path
) -> None:
    tree = project.tree_of("main")
    bytecode, _, _ = learnt(project, tmp_path, tree)
    # Compiled for the checkout of an earlier command, at another path.
    bytecode.fill(
        tmp_path / "other-pyc", checkout_tree(project, tree, tmp_path, "other"), tree, tree, []
    )
    checkout = checkout_tree(project, tree, tmp_path, name="second")
    folder = tmp_path / "second-pyc"
    written = bytecode.fill(folder, checkout, tree, tree, env_roots([Path(sys.prefix)], []))
    given = pycs(folder)
    plain = given[f"mod{TAGS.plain}"]
    rewritten = given[f"test_mod{TAGS.rewritten}"]
    assert written >= 3 and flags(plain) == flags(rewritten) == b"\x03\x00\x00\x00"
    inodes = {name: path.stat().st_ino for name, path in given.items()}
    ran = run_pytest(checkout, folder, FAIL_ONE="1")
    assert ran.returncode == 1, ran.stdout
    # Used as given: neither Python nor pytest found them stale and wrote their own.
    after = pycs(folder)
    assert {n: after[n].stat().st_ino for n in inodes} == inodes
    # The failure is shown from this checkout's file (the rewritten code was compiled for
    # another path and retargeted), with its source line.
    assert f"{checkout}/tests/test_mod.py" in ran.stdout or "tests/test_mod.py:" in ran.stdout
    assert 'assert os.environ.get("FAIL_ONE") != "1"' in ran.stdout
    assert "other-" not in ran.stdout


def test_a_module_the_attempt_changed_gets_no_bytecode_and_runs_from_its_source(
    project: BaseRepo, tmp_path: Path
) -> None:
    base = project.tree_of("main")
    bytecode, _, _ = learnt(project, tmp_path, base)
    changed = branch(project, "attempt", {"pkg/mod.py": "def value():\n    return 2\n"})
    checkout = checkout_tree(project, changed, tmp_path, name="attempt")
    folder = tmp_path / "attempt-pyc"
    bytecode.fill(folder, checkout, changed, base, [])
    assert f"mod{TAGS.plain}" not in pycs(folder)
    assert f"test_mod{TAGS.rewritten}" in pycs(folder)  # the test module is the base's
    ran = run_pytest(checkout, folder)
    assert ran.returncode == 1 and "assert 2 == 1" in ran.stdout, ran.stdout


def test_nothing_is_given_without_a_trusted_tree(project: BaseRepo, tmp_path: Path) -> None:
    tree = project.tree_of("main")
    bytecode, _, _ = learnt(project, tmp_path, tree)
    checkout = checkout_tree(project, tree, tmp_path, name="second")
    folder = tmp_path / "second-pyc"
    bytecode.fill(folder, checkout, tree, None, [])
    assert pycs(folder) == {}


GOOD = "def value():\n    return 1\n"


def test_bytecode_a_command_planted_in_its_folder_never_reaches_another(
    project: BaseRepo, tmp_path: Path
) -> None:
    """An attempt's command wrote, where its folder maps the module, an unchecked-hash pyc
    (it runs without a look at the source) of other code. Only the name is learnt: the next
    command gets the module compiled from the trusted blob."""
    tree = project.tree_of("main")
    bytecode, folder, first = learnt(project, tmp_path, tree)
    planted = next(p for p in folder.rglob(f"mod{TAGS.plain}"))
    evil = marshal.dumps(compile("def value():\n    return 'planted'\n", "mod.py", "exec"))
    planted.write_bytes(importlib.util.MAGIC_NUMBER + b"\x01\x00\x00\x00" + b"\0" * 8 + evil)
    bytecode.learn(folder, first)
    checkout = checkout_tree(project, tree, tmp_path, name="second")
    given = tmp_path / "second-pyc"
    bytecode.fill(given, checkout, tree, tree, [])
    data = pycs(given)[f"mod{TAGS.plain}"].read_bytes()
    assert b"planted" not in data and flags(pycs(given)[f"mod{TAGS.plain}"]) == b"\x03\x00\x00\x00"
    assert run_pytest(checkout, given).returncode == 0


def test_a_name_a_command_wrote_for_a_file_outside_the_environment_shows_nothing_of_it(
    project: BaseRepo, tmp_path: Path
) -> None:
    """A command can name any file by the folders it makes in its bytecode folder; the
    plugin (which can read more than the command) must not compile a secret into the next
    command's view."""
    secret = tmp_path / "private" / "secret.py"
    write(secret.parent, {"secret.py": "TOKEN = 'do-not-show-me'\n"})
    link_root = tmp_path / "env"
    (link_root / "lib").mkdir(parents=True)
    (link_root / "lib" / "ok.py").write_text("X = 'shown'\n")
    (link_root / "lib" / "leak.py").symlink_to(secret)
    (link_root / "lib" / "linked").symlink_to(secret.parent, target_is_directory=True)
    tree = project.tree_of("main")
    bytecode, folder, first = learnt(project, tmp_path, tree)
    leaks = (secret, link_root / "lib" / "leak.py", link_root / "lib" / "linked" / "secret.py")
    for source in (*leaks, link_root / "lib" / "ok.py"):
        where = folder.joinpath(*source.parts[1:-1])
        where.mkdir(parents=True, exist_ok=True)
        (where / f"{source.stem}{TAGS.plain}").write_bytes(b"anything")
    bytecode.learn(folder, first)
    checkout = checkout_tree(project, tree, tmp_path, name="second")
    given = tmp_path / "second-pyc"
    bytecode.fill(given, checkout, tree, tree, env_roots([link_root], []))
    names = pycs(given)
    assert f"ok{TAGS.plain}" in names  # inside the environment: given
    assert f"secret{TAGS.plain}" not in names and f"leak{TAGS.plain}" not in names
    assert not any(b"do-not-show-me" in p.read_bytes() for p in names.values())
    # A folder that holds a hidden one is not the environment's to show.
    assert env_roots([link_root], [link_root / "lib"]) == []
    assert env_roots([link_root / "lib"], [link_root]) == []


def test_no_rewritten_bytecode_where_the_configuration_may_ask_for_the_pass_hook(
    project: BaseRepo, tmp_path: Path
) -> None:
    tree = project.tree_of("main")
    bytecode, _, _ = learnt(project, tmp_path, tree)
    hooked = branch(
        project,
        "hooked",
        {"pytest.ini": "[pytest]\npythonpath = .\nenable_assertion_pass_hook = true\n"},
    )
    checkout = checkout_tree(project, hooked, tmp_path, name="hooked")
    folder = tmp_path / "hooked-pyc"
    bytecode.fill(folder, checkout, hooked, hooked, [])
    names = pycs(folder)
    assert f"mod{TAGS.plain}" in names and f"test_mod{TAGS.rewritten}" not in names


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.judge.bytecode import Bytecode
repo = BaseRepo.open(Path({repo!r}))
bytecode = Bytecode(repo)
bytecode.learn(Path({folder!r}), Path({first!r}))
tree = repo.tree_of("main")
resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))
print(bytecode.fill(Path({given!r}), Path({checkout!r}), tree, tree, []))
"""


def test_a_write_the_disk_refuses_leaves_no_partial_bytecode(
    project: BaseRepo, tmp_path: Path
) -> None:
    """Each file is whole or absent: a truncated .pyc makes Python's import fail (marshal
    cannot read it) instead of compiling the source. Files over 300 bytes cannot be written
    here (EFBIG, as a full disk refuses them with ENOSPC)."""
    tree = project.tree_of("main")
    _, folder, first = learnt(project, tmp_path, tree)
    checkout = checkout_tree(project, tree, tmp_path, name="second")
    given = tmp_path / "second-pyc"
    script = FULL_DISK.format(
        tests=str(Path(__file__).parent.parent), repo=str(project.worktree), folder=str(folder),
        first=str(first), given=str(given), checkout=str(checkout),
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    for path in given.rglob("*.pyc"):
        marshal.loads(path.read_bytes()[16:])  # whole
    assert run_pytest(checkout, given).returncode == 0


SPY = textwrap.dedent(
    """
    import pkg.mod


    def test_given():
        # A checked-hash pyc is the plugin's: a command compiling for itself writes a
        # timestamped one.
        with open(pkg.mod.__cached__, "rb") as pyc:
            assert pyc.read(8)[4:] == b"\\x03\\x00\\x00\\x00"
    """
)


def test_a_gate_command_runs_the_base_modules_from_given_bytecode_and_a_changed_one_from_source(
    tmp_path: Path, sandbox_mode: str
) -> None:
    """Through the engine, contained and not: the base's run is cold and teaches which
    modules the gate imports; the next attempt's gate runs them from the bytecode given;
    an attempt that changed the module runs it from its own source."""
    from pytest_agentgate import Engine, GateSpec
    from pytest_agentgate.sandbox.containment import Settings

    repo = make_project(tmp_path, {"tests/test_spy.py": SPY})
    e = Engine.open(
        repo, "main", workdir=tmp_path / "work", sandbox=Settings(mode=sandbox_mode),
        gate=GateSpec(commands=(f"{sys.executable} -m pytest -q -p no:cacheprovider tests",)),
    )  # fmt: skip
    # The base's run is cold, fails the spy, and runs again (to tell flaky from broken):
    # the second run is given the bytecode the first one's names asked for.
    ws = e.fork(task="a readme")
    write(ws.path, {"README.md": "hello\n"})
    warm = e.run_attempt(ws, task="a readme")
    ws = e.fork(task="a changed module")
    write(ws.path, {"pkg/mod.py": MOD + "\nX = 1\n"})
    changed = e.run_attempt(ws, task="a changed module")
    e.close()
    assert warm.verdict.status == "passed", warm.verdict
    assert warm.checks[-1].tests == {"tests/test_spy.py::test_given": "passed"}
    assert changed.verdict.status == "rejected"
    assert changed.checks[-1].tests == {"tests/test_spy.py::test_given": "failed"}


def test_what_a_run_of_the_base_itself_compiled_is_taken_not_compiled_again(
    project: BaseRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A baseline runs the base's own bytes: the bytecode it wrote (CPython's timestamped
    ``.pyc``, pytest's hash-based one) is kept, checked against those bytes, so the next
    command is given it without the plugin compiling anything."""
    from pytest_agentgate.judge import bytecode as module

    tree = project.tree_of("main")
    bytecode = Bytecode(project)
    first = checkout_tree(project, tree, tmp_path, name="first")
    folder = tmp_path / "first-pyc"
    assert run_pytest(first, folder).returncode == 0
    # The run's own .pyc of the package's module is stamped with a time and size that are
    # not its source's: that one is not taken (it may stand for other bytes).
    stale = folder.joinpath(*first.parts[1:], "pkg", f"__init__{TAGS.plain}")
    stale.write_bytes(stale.read_bytes()[:8] + b"\x01\x00\x00\x00" + stale.read_bytes()[12:])
    bytecode.learn(folder, first, base_run=tree, env_roots=env_roots([Path(sys.prefix)], []))
    seen: list[str] = []
    real = module.compiled
    monkeypatch.setattr(module, "compiled", lambda *a: seen.append(a[1]) or real(*a))
    checkout = checkout_tree(project, tree, tmp_path, name="second")
    given = tmp_path / "second-pyc"
    bytecode.fill(given, checkout, tree, tree, env_roots([Path(sys.prefix)], []))
    mine = given.joinpath(*checkout.parts[1:])
    assert (mine / "pkg" / f"mod{TAGS.plain}").exists()
    assert (mine / "tests" / f"test_mod{TAGS.rewritten}").exists()
    # Taken, not compiled; the stale one compiled here from the base's bytes instead.
    assert [name for name in seen if checkout.name in name] == [str(checkout / "pkg/__init__.py")]
    assert all(flags(p) == b"\x03\x00\x00\x00" for p in given.rglob("*.pyc"))
    assert len(list(given.rglob("*.pyc"))) > 50  # the environment's modules too
    assert run_pytest(checkout, given).returncode == 0


def test_bytecode_an_attempt_s_run_wrote_is_never_taken(
    project: BaseRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run, not of the trusted tree (an attempt's): only its names are learnt; the
    next command's bytecode is the plugin's own compile of the base's bytes."""
    from pytest_agentgate.judge import bytecode as module

    tree = project.tree_of("main")
    bytecode = Bytecode(project)
    first = checkout_tree(project, tree, tmp_path, name="first")
    folder = tmp_path / "first-pyc"
    assert run_pytest(first, folder).returncode == 0
    bytecode.learn(folder, first)  # no base_run: an attempt's
    seen: list[str] = []
    real = module.compiled
    monkeypatch.setattr(module, "compiled", lambda *a: seen.append(a[1]) or real(*a))
    bytecode.fill(
        tmp_path / "second-pyc", checkout_tree(project, tree, tmp_path, "s"), tree, tree, []
    )
    assert any(name.endswith("pkg/mod.py") for name in seen), seen
