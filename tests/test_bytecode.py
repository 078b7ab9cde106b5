"""Bytecode the plugin gives a gate command (``judge/bytecode.py``): used by the real Python
and pytest of a command, only for bytes the trusted tree holds, never taken from what a
command wrote, never for a file outside the environment every command sees, and whole or
not at all when the disk refuses a write."""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import pytest
from helpers import git, write

from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.judge.bytecode import Bytecode
from pytest_agentgate.judge.pycfiles import Tags, compiled, env_roots
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


@pytest.fixture(autouse=True)
def _fresh_process_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from a process that compiled nothing yet: none depends on the
    order the tests of a worker ran in."""
    from pytest_agentgate.judge import bytecode as module

    monkeypatch.setattr(module, "_COMPILED", module._Compiled())


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
    """Each .pyc below ``folder`` by its name (for the checkout's, which are unique) and by
    its path below ``folder``."""
    found = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*.pyc")}
    return {
        **{p.name: p for p in found.values() if "pkg" in p.parts or "tests" in p.parts},
        **found,
    }


def flags(path: Path) -> bytes:
    return path.read_bytes()[4:8]


def cold_run(repo: BaseRepo, root: Path, tree: str) -> tuple[Path, Path]:
    """A checkout of ``tree`` whose tests ran once, with no bytecode yet: it and the
    bytecode folder the run wrote."""
    checkout = checkout_tree(repo, tree, root, name="first")
    folder = root / "first-pyc"
    assert run_pytest(checkout, folder).returncode == 0
    return checkout, folder


def learnt(repo: BaseRepo, root: Path, tree: str) -> tuple[Bytecode, Path, Path]:
    """A Bytecode that watched one cold run of ``tree``'s tests; its folder; its checkout."""
    bytecode = Bytecode(repo)
    checkout, folder = cold_run(repo, root, tree)
    bytecode.learn(folder, checkout, tree)
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
    bytecode.learn(folder, first, tree)
    checkout = checkout_tree(project, tree, tmp_path, name="second")
    given = tmp_path / "second-pyc"
    bytecode.fill(given, checkout, tree, tree, [])
    data = pycs(given)[f"mod{TAGS.plain}"].read_bytes()
    assert b"planted" not in data and flags(pycs(given)[f"mod{TAGS.plain}"]) == b"\x03\x00\x00\x00"
    assert run_pytest(checkout, given).returncode == 0


def odd_environment(env: Path, secret: Path) -> tuple[Path, ...]:
    """An environment at ``env`` with ``lib/ok.py`` and the ways a file in it (or named as
    in it) may be one a command could not read itself: those files, ``secret`` first."""
    env.chmod(0o755)
    (env / "lib").mkdir(mode=0o755)
    (env / "lib" / "ok.py").write_text("X = 'shown'\n")
    (env / "lib" / "own.py").write_text("TOKEN = 'do-not-show-me'\n")
    (env / "lib" / "own.py").chmod(0o600)  # another user's: a command, no capability,
    if os.geteuid() == 0:  # cannot read it; the plugin, as root, could
        os.chown(env / "lib" / "own.py", 65534, 65534)
    else:
        (env / "lib" / "own.py").chmod(0o000)
    (env / "lib" / "leak.py").symlink_to(secret)
    (env / "lib" / "linked").symlink_to(secret.parent, target_is_directory=True)
    # A file anyone may read, in a folder only another user may pass through.
    (env / "lib" / "closed").mkdir(mode=0o700)
    (env / "lib" / "closed" / "hidden.py").write_text("TOKEN = 'do-not-show-me'\n")
    (env / "lib" / "closed" / "hidden.py").chmod(0o644)
    # And one in an open folder inside it, reached through a link that passes it by.
    (env / "lib" / "closed" / "open").mkdir(mode=0o755)
    (env / "lib" / "closed" / "open" / "deep.py").write_text("TOKEN = 'do-not-show-me'\n")
    (env / "lib" / "into").symlink_to(env / "lib" / "closed" / "open")
    if os.geteuid() == 0:
        os.chown(env / "lib" / "closed", 65534, 65534)
    else:
        (env / "lib" / "closed").chmod(0o000)
    return (
        secret, env / "lib/leak.py", env / "lib/linked/secret.py", env / "lib/own.py",
        env / "lib/closed/hidden.py", env / "lib/into/deep.py",
    )  # fmt: skip


def test_a_name_a_command_wrote_for_a_file_outside_the_environment_shows_nothing_of_it(
    project: BaseRepo, tmp_path: Path
) -> None:
    """A command can name any file by the folders it makes in its bytecode folder; the
    plugin (which can read more than the command) must not compile a secret into the next
    command's view: not one outside the environment, not one reached through a link, not
    one inside it that only another user may read."""
    secret = tmp_path / "private" / "secret.py"
    write(secret.parent, {"secret.py": "TOKEN = 'do-not-show-me'\n"})
    env = Path(tempfile.mkdtemp(prefix="agentgate-env-"))  # open to all, as an environment is
    try:
        leaks = odd_environment(env, secret)
        roots = env_roots([env], [])
        tree = project.tree_of("main")
        bytecode, folder, first = learnt(project, tmp_path, tree)
        for source in (*leaks, env / "lib" / "ok.py"):
            where = folder.joinpath(*source.parts[1:-1])
            where.mkdir(parents=True, exist_ok=True)
            (where / f"{source.stem}{TAGS.plain}").write_bytes(b"anything")
        # Learnt from an attempt's run, a name of the environment counts only for a module
        # this process imported itself; from a base's run, any module of the environment.
        bytecode.learn(folder, first, tree, env_roots=roots)
        checkout = checkout_tree(project, tree, tmp_path, name="second")
        assert bytecode.fill(tmp_path / "none-pyc", checkout, tree, tree, roots) == 3
        bytecode.learn(folder, first, tree, base_run=True, env_roots=roots)
        given = tmp_path / "second-pyc"
        bytecode.fill(given, checkout, tree, tree, roots)
        names = pycs(given)
        assert any(n.endswith(f"/ok{TAGS.plain}") for n in names)  # inside the environment
        assert not any(n.endswith(f"/{s.stem}{TAGS.plain}") for s in leaks for n in names)
        assert not any(b"do-not-show-me" in p.read_bytes() for p in names.values())
    finally:
        (env / "lib" / "closed").chmod(0o700)
        shutil.rmtree(env)
    # A folder that holds a hidden one is not the environment's to show; nor one that holds
    # a folder the sandbox masks (and shows the environment inside again, as $HOME).
    assert env_roots([tmp_path], [tmp_path / "lib"]) == []
    assert env_roots([tmp_path / "lib"], [tmp_path]) == []
    assert env_roots([tmp_path], [], [tmp_path / "home"]) == []
    assert env_roots([tmp_path / "home" / "venv"], [], [tmp_path / "home"]) == [
        str(tmp_path / "home" / "venv")
    ]


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
bytecode.learn(Path({folder!r}), Path({first!r}), repo.tree_of("main"))
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
    first, folder = cold_run(project, tmp_path, tree)
    # The run's own .pyc of the package's module is stamped with a time and size that are
    # not its source's: that one is not taken (it may stand for other bytes).
    stale = folder.joinpath(*first.parts[1:], "pkg", f"__init__{TAGS.plain}")
    stale.write_bytes(stale.read_bytes()[:8] + b"\x01\x00\x00\x00" + stale.read_bytes()[12:])
    bytecode.learn(folder, first, tree, base_run=True, env_roots=env_roots([Path(sys.prefix)], []))
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


def test_an_engine_opened_later_in_the_process_is_given_the_environment_compiled_once(
    project: BaseRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What this process compiled of the environment serves every engine of it: the first
    command of an engine opened later (an orchestrator's next repository, a suite's next
    test) is given those modules commands imported that this process imported itself, none
    compiled again. Which modules another engine's base run imported, and the bytecode that
    run wrote, stay that engine's."""
    from pytest_agentgate.judge import bytecode as module

    roots = env_roots([Path(sys.prefix), Path(sysconfig.get_paths()["stdlib"])], [])
    assert "tabnanny" not in sys.modules
    stdlib_only = str(Path(sysconfig.get_paths()["stdlib"]) / "tabnanny.py")
    tree = project.tree_of("main")
    earlier, folder, first = learnt(project, tmp_path, tree)
    # Its base's run imported a module this process never did (a name in its folder).
    planted = folder.joinpath(*Path(stdlib_only).parts[1:-1])
    planted.mkdir(parents=True, exist_ok=True)
    (planted / f"tabnanny{TAGS.plain}").write_bytes(b"not bytecode")
    kept_before = set(module._COMPILED.kept)
    earlier.learn(folder, first, tree, base_run=True, env_roots=roots)
    assert set(module._COMPILED.kept) == kept_before  # a run's bytecode: its engine's
    assert (stdlib_only, False) in earlier._env
    earlier.fill(
        tmp_path / "earlier-pyc", checkout_tree(project, tree, tmp_path, "e"), tree, tree, roots
    )
    # Its own runs are given what its base's run wrote (only the module whose bytecode was
    # no bytecode is compiled here); the next engine, nothing of that: it compiles here what
    # commands imported that this process imported too, once for all the engines after it.
    assert {key[0] for key in module._COMPILED.kept} == {stdlib_only}
    following = Bytecode(project)
    assert (
        following.fill(
            tmp_path / "f-pyc", checkout_tree(project, tree, tmp_path, "f"), tree, tree, roots
        )
        > 50
    )
    seen: list[str] = []
    real = module.compiled
    monkeypatch.setattr(module, "compiled", lambda *a: seen.append(a[1]) or real(*a))
    later = Bytecode(project)  # nothing learnt of its own yet
    checkout = checkout_tree(project, tree, tmp_path, name="later")
    given = tmp_path / "later-pyc"
    assert later.fill(given, checkout, tree, tree, roots) > 50
    assert not [path for path in seen if not path.startswith(str(checkout))]
    names = {p.as_posix() for p in given.rglob("*.pyc")}
    assert not [n for n in names if "/tabnanny." in n]  # another engine's choice: not shown
    assert run_pytest(checkout, given).returncode == 0


def test_bytecode_an_attempt_s_run_wrote_is_never_taken(
    project: BaseRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run, not of the trusted tree (an attempt's): only its names are learnt; the
    next command's bytecode is the plugin's own compile of the base's bytes."""
    from pytest_agentgate.judge import bytecode as module

    tree = project.tree_of("main")
    bytecode, _, _ = learnt(project, tmp_path, tree)  # no base_run: an attempt's
    seen: list[str] = []
    real = module.compiled
    monkeypatch.setattr(module, "compiled", lambda *a: seen.append(a[1]) or real(*a))
    bytecode.fill(
        tmp_path / "second-pyc", checkout_tree(project, tree, tmp_path, "s"), tree, tree, []
    )
    assert any(name.endswith("pkg/mod.py") for name in seen), seen


OPTIMIZED = """
import marshal, sys
sys.path.insert(0, {root!r})
from pytest_agentgate.judge.pycfiles import compiled
sys.stdout.buffer.write(marshal.dumps(compiled(b"def check():\\n    assert False\\n", "m.py", False)))
"""


def test_a_plugin_run_with_optimizations_gives_commands_their_asserts() -> None:
    """Found by a review: a plugin started with -O (or PYTHONOPTIMIZE) compiled with its own
    level, and gave commands (which run without it) bytecode with every assert stripped."""
    root = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run(
        [sys.executable, "-c", OPTIMIZED.format(root=root)], capture_output=True, check=True,
        env={**os.environ, "PYTHONOPTIMIZE": "2"},
    )  # fmt: skip
    space: dict[str, object] = {}
    exec(marshal.loads(done.stdout), space)
    with pytest.raises(AssertionError):
        space["check"]()  # type: ignore[operator]


def test_bytecode_a_base_s_run_wrote_serves_only_runs_judged_by_that_base(
    project: BaseRepo, tmp_path: Path
) -> None:
    """Found by a review: what a base's run wrote (its conftest can write anything) was
    kept by blob and given to every later tree holding that blob, after the conftest that
    wrote it was gone. It is given only to runs whose trusted tree is that base."""
    base = project.tree_of("main")
    bytecode = Bytecode(project)
    first, folder = cold_run(project, tmp_path, base)
    mod = folder.joinpath(*first.parts[1:], "pkg", f"mod{TAGS.plain}")
    planted = compile("def value():\n    return 'planted'\n", str(first / "pkg/mod.py"), "exec")
    source = (first / "pkg" / "mod.py").read_bytes()
    mod.write_bytes(mod.read_bytes()[:4] + b"\x03\0\0\0" + importlib.util.source_hash(source)
                    + marshal.dumps(planted))  # fmt: skip
    bytecode.learn(folder, first, base, base_run=True)
    later = branch(project, "later", {"pkg/__init__.py": "# a later base\n"})
    checkout = checkout_tree(project, later, tmp_path, name="later")
    given = tmp_path / "later-pyc"
    bytecode.fill(given, checkout, later, later, [])
    data = given.joinpath(*checkout.parts[1:], "pkg", f"mod{TAGS.plain}").read_bytes()
    assert b"planted" not in data
    assert run_pytest(checkout, given).returncode == 0


def test_a_folder_a_command_made_odd_teaches_nothing_and_breaks_nothing(
    project: BaseRepo, tmp_path: Path
) -> None:
    """Found by a review: the folder swapped for a link (the plugin walked where it led),
    nested past Python 3.11's recursion limit (the gate crashed), or full of names of files
    the tree does not hold (kept for the run, each later command paid for them)."""
    tree = project.tree_of("main")
    _, folder, first = learnt(project, tmp_path, tree)  # a folder of good names
    bytecode = Bytecode(project)
    odd = tmp_path / "odd"
    odd.mkdir()
    fd = os.open(odd, os.O_RDONLY)
    for _ in range(1200):  # deeper than a path may name: made one folder at a time
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.close(os.open(f"x{TAGS.plain}", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    mapped_checkout = odd.joinpath(*first.parts[1:])
    for n in range(300):
        (mapped_checkout / f"junk{n}").mkdir(parents=True)
        (mapped_checkout / f"junk{n}" / f"m{TAGS.plain}").write_bytes(b"")
    try:
        bytecode.learn(odd, first, tree)
    finally:
        _remove_deep(odd, 1200)  # else every later session's clean-up of it fails
    linked = tmp_path / "linked-pyc"
    linked.symlink_to(folder, target_is_directory=True)
    bytecode.learn(linked, first, tree, base_run=True, env_roots=[sys.prefix])
    assert (bytecode._local, bytecode._env, bytecode._kept) == (set(), set(), {})
    bytecode.learn(folder, first, tree)  # the same names, in a folder: learnt
    assert bytecode._local


def _remove_deep(top: Path, depth: int) -> None:
    """Remove a chain of ``depth`` folders named ``d`` below ``top`` from the bottom up,
    one folder at a time (a recursive removal, pytest's own included, fails on it)."""
    fds = [os.open(top, os.O_RDONLY)]
    for _ in range(depth):
        fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
    os.unlink(f"x{TAGS.plain}", dir_fd=fds[-1])
    os.close(fds.pop())
    while fds:
        os.rmdir("d", dir_fd=fds[-1])
        os.close(fds.pop())


def test_no_compile_off_the_main_thread_and_no_rewritten_bytecode_when_told() -> None:
    """The warning filters a compile changes are the process's: off the main thread (a gate
    command run beside others) nothing is compiled, the command compiles for itself."""
    import threading

    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(compiled(b"X = 1\n", "x.py", False)))
    thread.start()
    thread.join()
    assert found == [None] and compiled(b"X = 1\n", "x.py", False) is not None


def test_no_rewritten_bytecode_for_a_gate_that_may_ask_for_the_pass_hook(
    project: BaseRepo, tmp_path: Path
) -> None:
    tree = project.tree_of("main")
    bytecode, _, _ = learnt(project, tmp_path, tree)
    checkout = checkout_tree(project, tree, tmp_path, name="second")
    given = tmp_path / "second-pyc"
    bytecode.fill(given, checkout, tree, tree, [], rewrite=False)
    assert f"mod{TAGS.plain}" in pycs(given) and f"test_mod{TAGS.rewritten}" not in pycs(given)


OUTSIDE_PYTEST = """
import sys
sys.path.insert(0, {root!r})
from pytest_agentgate.judge.pycfiles import compiled
assert "_pytest" not in sys.modules  # loading the engine's parts loads no pytest
code = compiled(b"def test_x():\\n    assert 1 == 2\\n", "test_x.py", True)
assert code is not None and "_pytest.assertion.rewrite" in sys.modules
print("rewritten")
"""


def test_a_run_outside_pytest_compiles_test_modules_as_the_gate_s_pytest_rewrites_them() -> None:
    """The engine driven by the command (or a script) compiles a test module with pytest's
    own rewriter, imported then and only then: the attempts of a run stand on the one before
    (a dry run's scratch target moves), so what a base's run wrote serves only the first."""
    root = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run(
        [sys.executable, "-c", OUTSIDE_PYTEST.format(root=root)], capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "rewritten", done.stderr
