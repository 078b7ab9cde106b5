"""An uncontained command's supervisor is forked by a server the plugin starts once per
process: a command tries to outlive it, kill it, or use it, and a killed plugin tries to
leave it running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import Sleeper, alive

from pytest_agentgate.sandbox import forkserver
from pytest_agentgate.sandbox.process import processes_in, run_command

pytestmark = pytest.mark.skipif(not forkserver.available(), reason="no pidfds: no fork server")

ENV = {"PATH": os.environ["PATH"]}


def _server_pid() -> int:
    run_command(["true"], cwd=Path("/"), env=ENV, timeout=10)
    (server,) = [s for s in forkserver._servers if s.owner == os.getpid()]
    return server.proc.pid


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_a_command_that_kills_the_server_ends_only_itself(tmp_path: Path) -> None:
    sleeper = Sleeper()
    server = _server_pid()
    kill = f"{sleeper.command} & kill -9 $(cut -d' ' -f4 /proc/$PPID/stat); sleep 30"
    result = run_command(kill, cwd=tmp_path, env=ENV, timeout=60)
    assert not result.ok and result.duration_ms < 20_000, result
    assert _gone(server)
    assert not sleeper.alive()
    again = run_command("echo still here", cwd=tmp_path, env=ENV, timeout=10)
    assert again.ok and again.output == "still here\n", again
    assert _server_pid() != server


def test_the_server_holds_no_folder_a_command_ran_in(tmp_path: Path) -> None:
    """Removing a workspace ends every process at work in it: the server is not one of them."""
    server = _server_pid()
    assert run_command("echo > file", cwd=tmp_path, env=ENV, timeout=10).ok
    assert server not in processes_in(tmp_path) and alive(server)
    assert os.readlink(f"/proc/{server}/cwd") == "/"


def test_commands_at_once_from_many_threads_each_get_their_own_report(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(n: int) -> tuple[int, str]:
        result = run_command(f"echo {n}; exit {n % 7}", cwd=tmp_path, env=ENV, timeout=30)
        return result.returncode, result.output

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(40)))
    assert results == [(n % 7, f"{n}\n") for n in range(40)]


def test_without_the_server_each_command_has_an_interpreter_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where pidfds are missing, the per-command supervisor does all the same."""
    monkeypatch.setattr(forkserver, "available", lambda: False)
    before = list(forkserver._servers)
    sleeper = Sleeper()
    escape = f'setsid sh -c "exec {sleeper.command}" < /dev/null > /dev/null 2>&1 &'
    result = run_command(f"{escape} echo started", cwd=tmp_path, env=ENV, timeout=30)
    assert result.ok and result.survivors >= 1, result
    assert not sleeper.alive()
    capped = run_command(
        "head -c 100000 /dev/zero > big.bin", cwd=tmp_path, env=ENV, timeout=30, fsize_max=1000
    )
    assert not capped.ok and (tmp_path / "big.bin").stat().st_size <= 1000
    assert forkserver._servers == before


KILLED_PLUGIN = """
import os, sys
from pathlib import Path
from pytest_agentgate.sandbox import forkserver
from pytest_agentgate.sandbox.process import run_command
env = {"PATH": os.environ["PATH"]}
run_command(["true"], cwd=Path("/"), env=env, timeout=10)
print(forkserver._servers[0].proc.pid, flush=True)
run_command(sys.argv[1] + " & sleep 300", cwd=Path("/"), env=env, timeout=600)
"""


def test_a_plugin_killed_mid_command_leaves_nothing_of_it_running() -> None:
    sleeper = Sleeper()
    plugin = subprocess.Popen(
        [sys.executable, "-c", KILLED_PLUGIN, sleeper.command], stdout=subprocess.PIPE, text=True
    )
    assert plugin.stdout is not None
    server = int(plugin.stdout.readline())
    deadline = time.monotonic() + 20
    while not sleeper.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sleeper.alive()
    plugin.send_signal(signal.SIGKILL)
    plugin.wait()
    plugin.stdout.close()
    assert _gone(server)
    deadline = time.monotonic() + 5
    while sleeper.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not sleeper.alive()


def test_a_server_too_slow_to_answer_is_kept_and_the_command_runs_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replacing a server ends the supervisors it forked (their commands with them): one that
    is alive but slow (stopped here) is left to the commands that use it."""
    server = _server_pid()
    monkeypatch.setattr(forkserver, "_START_S", 0.3)
    os.kill(server, signal.SIGSTOP)
    try:
        result = run_command("echo without it", cwd=tmp_path, env=ENV, timeout=30)
    finally:
        os.kill(server, signal.SIGCONT)
    assert result.ok and result.output == "without it\n", result
    assert _server_pid() == server  # the same server, answering again
