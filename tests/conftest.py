# ruff: noqa: E402 (the package's bytecode is written before the package is imported)
from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _write_bytecode() -> None:
    """Write the package's bytecode before any process of the run imports it.

    The suite starts hundreds of Python processes (pytester's subprocess runs, the command
    line, fork servers, benchmark smoke runs), each importing the plugin. Where
    PYTHONDONTWRITEBYTECODE is set, as on this project's machines and CI, an editable install
    has no bytecode, and each of them compiled every module again: a third of the suite's
    CPU time. The xdist controller writes it once; a module edited since is written again.
    """
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    import compileall

    compileall.compile_dir(Path(__file__).parent.parent / "pytest_agentgate", quiet=2)


_write_bytecode()

from helpers import git, make_service

import pytest_agentgate.cli.demo

# pytester's in-process runs drop modules first imported during a run. Importing the whole
# engine here keeps one copy of each module (and of each exception class) for the session.
import pytest_agentgate.cli.main
import pytest_agentgate.engine
import pytest_agentgate.maintenance.prune  # noqa: F401

pytest_plugins = ["pytester"]

# A suite started in the background of a shell without job control inherits SIGINT ignored,
# and so would every process it starts: the tests that interrupt a run with SIGINT (as
# Ctrl-C does) would see it ignored. Each worker takes Python's own handler back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Two workers a core for ``-n auto``: most of a test's time is spent waiting for the git,
    pytest and sandbox processes it starts, so one worker a core leaves the cores idle."""
    return 2 * len(os.sched_getaffinity(0))


#: The files whose tests take longest (several machines, many processes, the benchmark's
#: smoke runs): started first, so that no worker is left running one alone at the end.
LONGEST_FIRST = (
    "test_bench_smoke.py", "test_remote.py", "test_queue.py", "test_ci_recipe.py",
    "test_early.py", "test_story.py", "test_staged_repair.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: order kept
    if shutil.which("git") is None:
        skip = pytest.mark.skip(reason="git is not installed")
        for item in items:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "shared_baselines(shared=True): the service's base results this worker computed for "
        "an earlier test reach the next one, as results kept in git reach the next run",
    )


@pytest.fixture(scope="session")
def baselines_kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding the base results this worker's tests computed (their refs)."""
    path = tmp_path_factory.mktemp("baselines") / "kept.git"
    git(path.parent, "init", "-q", "--bare", str(path))
    return path


#: Where the plugin keeps a base's results (``refs/agentgate/results/<key>``), both ways.
RESULTS = "+refs/agentgate/results/*:refs/agentgate/results/*"


@pytest.fixture
def service(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh ledger service repository (three modules and their tests) on branch main.

    In a module marked ``shared_baselines``, it holds the base results an earlier test of
    this worker computed: a result is keyed by the tree, the gate, the interpreter, the
    sandbox and the environment, so one computed for another repository of the same tree is
    the same (a run after the first reads it from git as well). The module's tests judge
    attempts on that base, not how its results are computed; each of its keys is still
    computed once by each worker."""
    repo = make_service(tmp_path / "service")
    marked = request.node.get_closest_marker("shared_baselines")
    shared = marked is not None and marked.kwargs.get("shared", (*marked.args, True)[0])
    if not shared:  # shared_baselines(False): a test of how they are computed or kept
        yield repo
        return
    kept = request.getfixturevalue("baselines_kept")
    git(repo, "fetch", "-q", "--no-tags", str(kept), RESULTS)
    yield repo
    # Only a saving: a test that left its repository unreadable shares nothing, and fails
    # (or not) for what it tested, not here.
    git(kept, "fetch", "-q", "--no-tags", str(repo), RESULTS, check=False)


@pytest.fixture(scope="session")
def bwrap() -> str:
    """The working bwrap this machine has; a skip with its reason when none can start a
    sandbox here, and under CI=true a failure: CI must run the contained tests."""
    from pytest_agentgate.sandbox import containment as sandbox

    resolved = sandbox.resolve(sandbox.Settings(mode="auto"))
    if resolved.program is None:
        reason = f"no working bubblewrap sandbox: {resolved.reason}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the sandboxed tests must run)", pytrace=False)
        pytest.skip(reason)
    return resolved.program


@pytest.fixture(params=["bwrap", "none"])
def sandbox_mode(request: pytest.FixtureRequest) -> str:
    """Each containment this machine can give: bwrap (needs a working sandbox), and none."""
    if request.param == "bwrap":
        request.getfixturevalue("bwrap")
    return str(request.param)


@pytest.fixture(scope="session")
def signing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """For two machines, ``left`` and ``right``: the flags that sign each one's posts on a
    server's queue with a key of its own, and check others' against both keys."""
    if shutil.which("ssh-keygen") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("ssh-keygen is not installed (CI=true: signed posts must be tested)")
        pytest.skip("ssh-keygen is not installed")
    import subprocess

    root = tmp_path_factory.mktemp("signing")
    allowed = root / "allowed_signers"
    lines, flags = [], {}
    for who in ("left", "right"):
        key = root / who
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(key)], check=True
        )
        lines.append(f"{who} " + " ".join(Path(f"{key}.pub").read_text().split()[:2]))
        flags[who] = [f"--agentgate-signing-key={key}", f"--agentgate-allowed-signers={allowed}"]
    allowed.write_text("\n".join(lines) + "\n")
    return flags
