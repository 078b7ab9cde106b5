"""Real git repositories for the tests: a small service of three modules plus its tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test Person",
    "GIT_AUTHOR_EMAIL": "person@example.com",
    "GIT_COMMITTER_NAME": "Test Person",
    "GIT_COMMITTER_EMAIL": "person@example.com",
    "LC_ALL": "C",
}

SERVICE = {
    "ledger/__init__.py": "",
    "ledger/store.py": """
        class Store:
            def __init__(self):
                self._rows = []

            def add_entry(self, amount):
                self._rows.append(amount)

            def entries(self):
                return list(self._rows)
        """,
    "ledger/report.py": """
        from ledger.store import Store


        def build(amounts):
            store = Store()
            for amount in amounts:
                store.add_entry(amount)
            return store
        """,
    "ledger/api.py": """
        from ledger.report import build


        def handle(amounts):
            store = build(amounts)
            store.add_entry(0)
            return store.entries()
        """,
    "tests/test_ledger.py": """
        from ledger.api import handle
        from ledger.report import build


        def test_handle():
            assert handle([1, 2]) == [1, 2, 0]


        def test_build():
            assert build([3]).entries() == [3]
        """,
    ".gitignore": "__pycache__/\n*.pyc\n.pytest_cache/\n",
}


def git(repo: Path, *args: str, check: bool = True) -> str:
    env = {**os.environ, **GIT_ENV}
    for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(key, None)
    proc = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def make_service(path: Path, branch: str = "main", object_format: str = "sha1") -> Path:
    """A repository with the ledger service and its tests, one commit on ``branch``."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", branch, f"--object-format={object_format}")
    write(path, SERVICE)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "ledger service")
    return path


def fsck(repo: Path) -> str:
    return git(repo, "fsck", "--strict", "--no-progress")


def land(
    repo: Path, files: dict[str, str | None], task: str, agent: str = "agent", promote: bool = True
):
    """Run one attempt through the engine that writes (or, for None, deletes) ``files``."""
    from pytest_agentgate import Engine, GateSpec

    engine = Engine.open(
        repo,
        "main",
        promote=promote,
        workdir=repo.parent / "work",
        gate=GateSpec(outcome_is_enough=True),
    )
    ws = engine.fork(task=task)
    for rel, text in files.items():
        path = ws.path / rel
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return engine.run_attempt(ws, task=task, agent=agent)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for a reaper that is not us does not count)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return "\nState:\tZ" not in status


def spawn_pytest(
    cwd: Path, *args: str, env: dict[str, str] | None = None, **popen: object
) -> subprocess.Popen[str]:
    """A separate pytest process (another "machine" or CI job), with an environment free of
    the outer run's pytest and agentgate settings; output is captured as text."""
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


class Sleeper:
    """A long sleeper process, told apart from every other test's by a word of its own.

    ``command`` is a shell snippet whose sleeper's command line ends in ``<tag>-42``: the
    arithmetic is done by the shell, so only the sleeper (not the pytest process or shell
    that was given the snippet) carries the finished word. A PID namespace hides its pid from
    the test; its command line is still seen from here.
    """

    def __init__(self) -> None:
        import uuid

        self.tag = f"sleeper-{uuid.uuid4().hex[:8]}"
        self.command = f"python3 -c 'import time; time.sleep(300)' {self.tag}-$((6*7))"

    def alive(self) -> list[int]:
        """Live processes started from this sleeper's command, by their command line."""
        word = f"{self.tag}-42".encode()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if word in cmdline.split(b"\0") and alive(int(name)):
                found.append(int(name))
        return found


def wait_for(predicate: object, timeout: float = 30.0, what: str = "the condition") -> None:
    """Poll ``predicate`` (a callable) until it is true, failing after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


#: Two gated tests adding one file each: the suite the fault tests kill at named points.
AGENTS = """
import pytest

@pytest.mark.gated(task="first change")
def test_1_first(agent_workspace):
    (agent_workspace.path / "first.txt").write_text("first\\n")

@pytest.mark.gated(task="second change")
def test_2_second(agent_workspace):
    (agent_workspace.path / "second.txt").write_text("second\\n")
"""


@contextlib.contextmanager
def git_daemon(bare: Path) -> Iterator[str]:
    """``git daemon`` serving ``bare`` on a free loopback port, pushes enabled; its URL.
    Skips when the daemon is not installed."""
    import socket
    import time

    import pytest

    exec_path = subprocess.run(
        ["git", "--exec-path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not (Path(exec_path) / "git-daemon").exists():
        pytest.skip("git daemon is not installed (Debian: the git package ships it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", "--export-all",
         "--enable=receive-pack", f"--base-path={bare.parent}", str(bare.parent)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("git daemon did not start")
    try:
        yield f"git://127.0.0.1:{port}/{bare.name}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
