"""An uncontained command's supervisor is forked by a server the plugin starts once per
process: a command tries to outlive it, kill it, or use it, and a killed plugin tries to
leave it running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Sleeper, alive

from pytest_agentgate.sandbox import forkserver
from pytest_agentgate.sandbox.process import Limits, processes_in, run_command

pytestmark = pytest.mark.skipif(not forkserver.available(), reason="no pidfds: no fork server")

ENV = {"PATH": os.environ["PATH"]}


def _server_pid() -> int:
    run_command(["true"], cwd=Path("/"), env=ENV, timeout=10)
    (server,) = forkserver._servers
    return server.proc.pid


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def _left(sleeper: Sleeper, within: float = 2.0) -> list[int]:
    """The sleeper's processes still running once ``within`` s have passed (or none are)."""
    deadline = time.monotonic() + within
    while sleeper.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return sleeper.alive()


@contextlib.contextmanager
def _ending(sleeper: Sleeper) -> Iterator[None]:
    """Kill whatever of ``sleeper`` is still running once the block is done, pass or fail."""
    try:
        yield
    finally:
        for pid in sleeper.alive():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["KILL", "STOP"])
def test_killing_or_stopping_the_server_disturbs_no_command(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each supervisor watches the plugin, not the server: a command that kills or stops the
    server ends no other command (one that ended them, and so passed, found this), and the
    next command gets a new server."""
    import threading

    monkeypatch.setattr(forkserver, "_START_S", 0.5)
    server = _server_pid()
    found: dict[str, object] = {}
    other = "trap 'echo signalled; exit 0' TERM; sleep 1 & wait; echo finished"

    def innocent() -> None:
        found["result"] = run_command(other, cwd=tmp_path, env=ENV, timeout=60)

    worker = threading.Thread(target=innocent)
    worker.start()
    time.sleep(0.3)
    try:
        attack = run_command(
            f"kill -{how} $(cut -d' ' -f4 /proc/$PPID/stat); echo done", cwd=tmp_path, env=ENV,
            timeout=60,
        )  # fmt: skip
        worker.join(30)
        after = run_command("echo still here", cwd=tmp_path, env=ENV, timeout=30)
        replaced = _server_pid()
    finally:
        if alive(server):
            os.kill(server, signal.SIGKILL)
    assert attack.ok and attack.output == "done\n", attack
    result = found["result"]
    assert result.ok and result.output == "finished\n", result  # type: ignore[attr-defined]
    assert after.ok and after.output == "still here\n", after
    assert replaced != server


@pytest.mark.parametrize("server", [True, False])
def test_a_command_told_to_stop_is_never_a_pass(
    tmp_path: Path, server: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM to its supervisor ends a command early: whatever it exits with then (a trap's
    0 here), it did not finish, and the result says so. Sent as the command starts, it once
    came before the supervisor's handlers and killed it (1 time in 7): the command then ran
    on unsupervised. Each of 30 tries must be a sweep."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    found = {
        run_command(
            "trap 'exit 0' TERM; kill -TERM $PPID; sleep 5 & wait",
            cwd=tmp_path,
            env=ENV,
            timeout=60,
        ).launch_error
        for _ in range(30)
    }
    assert found == {"the command was ended before it finished (its supervisor was told to stop)"}


def test_run_command_reports_supervisors_killed_early_and_never_raises(tmp_path: Path) -> None:
    """Supervisors killed before they read their configuration (their server killed by
    another command) are lost statuses, never an exception out of run_command."""
    import threading
    from collections import Counter

    big = {**ENV, **{f"BIG{i}": "x" * 10_000 for i in range(20)}}  # slow to read
    me, stop, seen = os.getpid(), time.monotonic() + 2, Counter[str]()

    def killer() -> None:
        kill = f"S=$(cut -d' ' -f4 /proc/$PPID/stat); [ $S != {me} ] && kill -9 $S; true"
        while time.monotonic() < stop:
            run_command(kill, cwd=tmp_path, env=ENV, timeout=10)

    def victim() -> None:
        while time.monotonic() < stop:
            try:
                r = run_command("true", cwd=tmp_path, env=big, timeout=10)
                seen["ok" if r.ok else "lost" if r.launch_error else f"code {r.returncode}"] += 1
            except Exception as exc:
                seen[repr(exc)] += 1

    threads = [threading.Thread(target=killer)] + [
        threading.Thread(target=victim) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(seen) <= {"ok", "lost"} and seen["ok"] > 0, seen


def test_a_fork_of_the_plugin_holds_no_server_and_no_lock(tmp_path: Path) -> None:
    """A fork made while another thread held the server's lock: the child's first command
    runs (the lock is the child's own), and the child holds no control socket of the
    parent's (which kept the parent's server, and its commands, alive after it)."""
    forkserver._server(None)
    with forkserver._lock:
        child = os.fork()
        if child == 0:
            code = 1
            try:
                ok = run_command("echo child", cwd=tmp_path, env=ENV, timeout=10).ok
                mine = all(_parent(s.proc.pid) == os.getpid() for s in forkserver._servers)
                code = 0 if ok and mine else 2
            finally:
                os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the fork's first command hung on the parent's lock")
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_command_gets_the_plugin_s_umask_and_limits_of_now(tmp_path: Path) -> None:
    """The server was started earlier: what the plugin set since (a fixture's umask, a
    lower limit) still reaches the command, as it did with an interpreter per command."""
    import resource

    _server_pid()
    old_mask = os.umask(0o077)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, soft), hard))
    try:
        result = run_command("umask; ulimit -n", cwd=tmp_path, env=ENV, timeout=10)
    finally:
        os.umask(old_mask)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert result.output.split() == ["0077", str(min(512, soft))], result


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
        "head -c 100000 /dev/zero > big.bin", cwd=tmp_path, env=ENV, timeout=30,
        limits=Limits(fsize_max=1000),
    )  # fmt: skip
    assert not capped.ok and (tmp_path / "big.bin").stat().st_size <= 1000
    assert forkserver._servers == before


KILLED_PLUGIN = """
import os, sys, threading, time
from pathlib import Path
from pytest_agentgate.sandbox import forkserver
from pytest_agentgate.sandbox.process import run_command
env = {"PATH": os.environ["PATH"]}
run_command(["true"], cwd=Path("/"), env=env, timeout=10)
print(forkserver._servers[0].proc.pid, flush=True)
if sys.argv[2] == "fork" and os.fork() == 0:  # a child that holds what the parent held
    time.sleep(60)
    os._exit(0)
if sys.argv[2] == "stop-own":  # the command stops its own supervisor
    run_command(sys.argv[1] + " & sleep 0.2; kill -STOP $PPID; sleep 300", cwd=Path("/"),
                env=env, timeout=600)
if sys.argv[2] == "stop":  # another command stops the server first
    threading.Thread(target=run_command, args=(sys.argv[1] + " & sleep 300",),
                     kwargs=dict(cwd=Path("/"), env=env, timeout=None)).start()
    time.sleep(0.5)
    run_command("kill -STOP $(cut -d' ' -f4 /proc/$PPID/stat)", cwd=Path("/"), env=env, timeout=10)
    time.sleep(300)
run_command(sys.argv[1] + " & sleep 300", cwd=Path("/"), env=env, timeout=600)
"""


@pytest.mark.parametrize("how", ["plain", "fork", "stop", "stop-own"])
def test_a_plugin_killed_mid_command_leaves_nothing_of_it_running(how: str) -> None:
    """Also when a fork of it lives on, or a command stopped its server: each supervisor
    sees the plugin end on a pidfd and ends its command (and a server left stopped). One
    its own command stopped is continued by the server as the plugin ends."""
    sleeper = Sleeper()
    plugin = subprocess.Popen(
        [sys.executable, "-c", KILLED_PLUGIN, sleeper.command, how],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert plugin.stdout is not None
    try:
        server = int(plugin.stdout.readline())
        deadline = time.monotonic() + 20
        while not sleeper.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sleeper.alive()
        time.sleep(0.5)  # the stop, where there is one, is made by now
        plugin.send_signal(signal.SIGKILL)
        plugin.wait()
        assert _gone(server)
        deadline = time.monotonic() + 5
        while sleeper.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not sleeper.alive()
    finally:
        plugin.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(plugin.pid, signal.SIGKILL)  # the fork, where there is one


@pytest.mark.parametrize("server", [True, False])
def test_a_missing_folder_or_program_is_a_launch_error_that_names_it(
    tmp_path: Path, server: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never an exception out of run_command (the interpreter per command raised one for a
    missing folder) and never the shell's name for what was missing."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    gone = tmp_path / "gone"
    result = run_command("true", cwd=gone, env=ENV, timeout=10)
    assert not result.ok and result.launch_error.endswith(
        f"its folder: No such file or directory: {gone}"
    )
    result = run_command(["no-such-program-here"], cwd=tmp_path, env=ENV, timeout=10)
    assert not result.ok and result.launch_error.endswith(
        "the program: No such file or directory: no-such-program-here"
    )


@pytest.mark.parametrize("server", [True, False])
def test_a_timeout_as_the_command_exits_is_still_swept_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """The timeout's signal landing just after the wait reaped the command: the sweep's own
    wait found no child and the supervisor died unswept (14 times in 400); landing after the
    wait, before the timer was cleared, it raised there and the report was lost (3 times in
    1,800 on two loaded cores, through the full suite's load as well)."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    found = set()
    for i in range(120):
        timeout = 0.05 + (i % 9 - 4) / 1000
        result = run_command("exec sleep 0.05", cwd=tmp_path, env=ENV, timeout=timeout)
        found.add("ok" if result.ok else "timed out" if result.timed_out else result.launch_error)
    assert found <= {"ok", "timed out"}, found


def test_a_plugin_holding_many_descriptors_still_runs_commands(tmp_path: Path) -> None:
    """Over 1,024 descriptors open in the plugin: select() refused them (ValueError)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the descriptor limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        result = run_command("echo hi", cwd=tmp_path, env=ENV, timeout=10)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert result.ok and result.output == "hi\n", result


@pytest.mark.parametrize("server", [True, False])
@pytest.mark.parametrize("sig", ["ALRM", "HUP", "USR1", "QUIT", "TSTP", "PIPE"])
def test_a_command_that_signals_its_supervisor_is_swept_and_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: str, server: bool
) -> None:
    """A signal whose default ends or stops the supervisor, sent by its own command: SIGALRM
    (once the timeout's own signal) and SIGHUP killed it, and the command and a child in a
    session of its own ran on after run_command returned (no cgroup to end them); SIGTSTP
    stopped it past the timeout. Each is now a stop: swept, and an error."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    sleeper = Sleeper()
    started = time.monotonic()
    result = run_command(
        f"setsid {sleeper.command} & sleep 0.2; kill -{sig} $PPID; exec {sleeper.command}",
        cwd=tmp_path, env=ENV, timeout=10,
    )  # fmt: skip
    try:
        assert not result.ok, result
        assert time.monotonic() - started < 8, "it ran on to its timeout"
        assert "ended before it finished" in result.launch_error, result
        assert _left(sleeper) == [], "left running after run_command returned"
    finally:
        for pid in sleeper.alive():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("server", [True, False])
def test_a_command_starts_with_no_signal_blocked_or_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """The supervisor's interpreter ignores SIGPIPE and SIGXFSZ; a command inherited both
    (``yes | head -n1`` reported a broken pipe and exited 1, a write past the file-size limit
    was an error it could go on from). A pytest started as a script's background job ignores
    SIGINT and SIGQUIT, one under ``nohup`` SIGHUP, and one may start with signals blocked:
    its commands inherited those too, so this test failed when the suite was run that way."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGQUIT, signal.SIGHUP)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        result = run_command(
            "grep -E '^Sig(Blk|Ign):' /proc/self/status; yes | head -n1 >/dev/null",
            cwd=tmp_path, env=ENV, timeout=10,
        )  # fmt: skip
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert result.ok, result
    lines = dict(line.split(":\t") for line in result.output.split("\n") if ":\t" in line)
    assert int(lines["SigBlk"], 16) == 0 and int(lines["SigIgn"], 16) == 0, result.output
    assert "Broken pipe" not in result.output, result.output


@pytest.mark.parametrize("server", [True, False])
def test_a_command_that_stops_its_supervisor_is_ended_swept_and_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """SIGSTOP cannot be blocked: a supervisor its command stopped never saw its deadline,
    so a 1 s timeout ended at the plugin's backstop, 31 s later, and with no cgroup a child
    in a session of its own ran on. The plugin looks for a stopped supervisor, ends what is
    below it and continues it; a supervisor that was stopped reports its command an error."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    sleeper = Sleeper()
    started = time.monotonic()
    result = run_command(
        f"setsid {sleeper.command} & kill -STOP $PPID; exec {sleeper.command}",
        cwd=tmp_path, env=ENV, timeout=1,
    )  # fmt: skip
    with _ending(sleeper):
        assert time.monotonic() - started < 6, "it ran on to the plugin's backstop"
        assert not result.ok and "supervisor was stopped" in result.launch_error, result
        assert _left(sleeper) == [], "left running after run_command returned"


@pytest.mark.parametrize("server", [True, False])
def test_a_command_that_keeps_its_supervisor_stopped_past_its_timeout_is_no_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """A loop that stopped the supervisor again after each nudge kept it from seeing its
    deadline; the command exited 0 after its 1 s timeout, the supervisor woke to find it
    ended and reported a pass. A supervisor that was stopped cannot place its command's end
    before or after the deadline: its command is an error."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    result = run_command(
        "sup=$PPID; (while :; do kill -STOP $sup; sleep 0.01; done) & sleep 1.5; exit 0",
        cwd=tmp_path, env=ENV, timeout=1,
    )  # fmt: skip
    assert not result.ok, result
    assert "supervisor was stopped" in result.launch_error, result


@pytest.mark.parametrize("server", [True, False])
def test_a_stop_loop_in_a_session_of_its_own_cannot_starve_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """Busy loops stopping the supervisor, from sessions of their own, left it no time to
    sweep: with three, a 1 s timeout ran 20 to 30 s, to the plugin's backstop, and the
    status was lost. The plugin ends the processes below a supervisor it finds stopped."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    sleeper = Sleeper()
    started = time.monotonic()
    result = run_command(
        "sup=$PPID; export sup; "
        + "setsid sh -c 'while :; do kill -STOP $sup; done' & " * 3
        + f"exec {sleeper.command}",
        cwd=tmp_path, env=ENV, timeout=1,
    )  # fmt: skip
    try:
        assert time.monotonic() - started < 5, "it ran on to the plugin's backstop"
        assert not result.ok, result
        assert not processes_in(tmp_path), "left running in the command's folder"
        assert _left(sleeper) == [], "left running after run_command returned"
    finally:
        for pid in sleeper.alive() + processes_in(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("server", [True, False])
def test_a_command_with_no_timeout_that_stops_its_supervisor_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """With no timeout nothing continued a stopped supervisor: run_command waited forever
    for a command that had stopped it and exited."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    started = time.monotonic()
    result = run_command("kill -STOP $PPID; exit 0", cwd=tmp_path, env=ENV, timeout=None)
    assert time.monotonic() - started < 5
    assert not result.ok and "supervisor was stopped" in result.launch_error, result


@pytest.mark.parametrize("server", [True, False])
def test_the_c_library_s_own_signals_do_not_kill_the_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """Signals 32 and 33 are the C library's: its calls will not block or ignore them, and
    their default killed the supervisor; the status was lost, and with no cgroup a child in
    a session of its own ran on after run_command returned."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    sleeper = Sleeper()
    result = run_command(
        f"setsid {sleeper.command} & sleep 0.2; kill -32 $PPID; kill -33 $PPID; "
        f"exec {sleeper.command}",
        cwd=tmp_path, env=ENV, timeout=1,
    )  # fmt: skip
    with _ending(sleeper):
        assert result.timed_out and not result.ok, result
        assert "lost" not in result.launch_error, result
        assert _left(sleeper) == [], "left running after run_command returned"


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def ice() -> Iterator[Path]:
    """A freezer cgroup's folder for the command to make and use; thawed, emptied and
    removed afterwards, whatever happened."""
    if not (FREEZER / "tasks").exists() or not os.access(FREEZER, os.W_OK):
        pytest.skip("no cgroup v1 freezer this process may write")
    import uuid

    folder = FREEZER / f"agentgate-test-{uuid.uuid4().hex[:12]}"
    yield folder
    with contextlib.suppress(OSError):
        (folder / "freezer.state").write_text("THAWED")
    for _ in range(50):
        with contextlib.suppress(OSError):
            for task in (folder / "tasks").read_text().split():
                (FREEZER / "tasks").write_text(task)
            folder.rmdir()
            return
        time.sleep(0.1)


def _freeze(ice: Path, who: str) -> str:
    """Shell that moves every thread of process ``who`` into ``ice`` and freezes it."""
    return (
        f"for t in $(ls /proc/{who}/task); do echo $t > {ice}/tasks; done; "
        f"echo FROZEN > {ice}/freezer.state"
    )


@pytest.mark.parametrize("server", [True, False])
def test_a_command_that_freezes_its_supervisor_past_its_timeout_is_no_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool, ice: Path
) -> None:
    """A cgroup freezer holds a process without a signal: no SIGCONT to find, and no stopped
    state for the plugin to see. Frozen past its command's 1 s deadline and thawed after
    the command exited 0, the supervisor reaped that exit and called it a pass. An end it
    finds when it looks again long after the deadline may have come after it: an error."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    result = run_command(
        f"mkdir {ice}; {_freeze(ice, '$PPID')}; "
        f"(sleep 2.5; echo THAWED > {ice}/freezer.state) & sleep 1.5; exit 0",
        cwd=tmp_path, env=ENV, timeout=1,
    )  # fmt: skip
    assert not result.ok, result
    assert result.timed_out or "frozen" in result.launch_error, result


@pytest.mark.parametrize("server", [True, False])
def test_a_supervisor_frozen_across_its_deadline_for_half_a_second_is_no_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool, ice: Path
) -> None:
    """Frozen at 0.9 s, its command exiting 0 at 1.2 s, thawed at 1.4 s (a 1 s timeout):
    the supervisor first looked again 0.4 s past the deadline, within the half second it
    then allowed, and the command passed 20 times in 20. It allows a quarter second."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    result = run_command(
        f"mkdir {ice}; sup=$PPID; (sleep 0.9; {_freeze(ice, '$sup')}; sleep 0.5; "
        f"echo THAWED > {ice}/freezer.state) & sleep 1.2; exit 0",
        cwd=tmp_path, env=ENV, timeout=1,
    )  # fmt: skip
    assert not result.ok, result


@pytest.mark.parametrize("server", [True, False])
def test_a_supervisor_frozen_for_good_does_not_hold_run_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool, ice: Path
) -> None:
    """A supervisor frozen by its command (a cgroup freezer) ignores SIGKILL until it is
    thawed: past the backstop run_command killed it and then waited for it without end."""
    from pytest_agentgate.sandbox import process

    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    monkeypatch.setattr(process, "_BACKSTOP_S", 1.0)
    monkeypatch.setattr(process, "_GIVE_UP_S", 1.0, raising=False)
    started = time.monotonic()
    result = run_command(
        f"mkdir {ice}; {_freeze(ice, '$PPID')}; exit 0", cwd=tmp_path, env=ENV, timeout=1
    )
    assert time.monotonic() - started < 15, "run_command waited on a frozen supervisor"
    assert not result.ok, result


@pytest.mark.parametrize("server", [True, False])
def test_a_process_the_sweep_cannot_end_makes_the_command_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool, ice: Path
) -> None:
    """A frozen process ignores SIGKILL: a command that froze a child of its own and exited
    0 passed, the sweep having spent its time killing it in vain."""
    from pytest_agentgate.sandbox import process

    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    monkeypatch.setattr(process, "_SWEEP_S", 1.0, raising=False)
    result = run_command(
        f"mkdir {ice}; sleep 30 & child=$!; {_freeze(ice, '$child')}; sleep 0.2; exit 0",
        cwd=tmp_path, env=ENV, timeout=10,
    )  # fmt: skip
    assert not result.ok, result
    assert "could not be ended" in result.launch_error, result


FORGE = """
import ctypes, marshal, os, sys
sup = int(sys.argv[1])
forged = marshal.dumps({"returncode": 0, "timed_out": False, "survivors": int(sys.argv[2])
                        if sys.argv[2].isdigit() else sys.argv[2]})
for fd in os.listdir(f"/proc/{sup}/fd"):
    kind = os.readlink(f"/proc/{sup}/fd/{fd}")
    if kind.startswith("pipe:"):
        try:
            out = os.open(f"/proc/{sup}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
    elif kind.startswith("socket:"):  # pidfd_getfd, which Python does not name
        out = ctypes.CDLL(None, use_errno=True).syscall(438, os.pidfd_open(sup), int(fd), 0)
        if out < 0:
            continue
    else:
        continue
    try:
        os.write(out, forged)
    except OSError:
        pass
"""


@pytest.mark.parametrize("server", [True, False])
@pytest.mark.parametrize("survivors", ["0", "x"])
def test_a_report_written_into_the_supervisor_s_channel_is_not_believed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool, survivors: str
) -> None:
    """A command wrote a passing report into its supervisor's report channel (opened
    through /proc, or copied with pidfd_getfd) and exited 3: the first report read was the
    forgery, and the command passed; one whose survivors were not a number raised out of
    run_command. A channel that carries more than one report, or one not of the
    supervisor's shape, is a lost status. (As root the command can still reach the channel;
    as another user the supervisor is not dumpable, and it cannot.)"""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    (tmp_path / "forge.py").write_text(FORGE)
    result = run_command(
        f"{sys.executable} forge.py $PPID {survivors}; exit 3", cwd=tmp_path, env=ENV, timeout=10
    )
    assert not result.ok, result
    assert result.returncode != 0, result


FORGE_INTO_PYTEST = """
import marshal, os, signal, sys
def parent(pid):
    stat = open(f"/proc/{pid}/stat", "rb").read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])
def links(pid):
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return found
def supervisor(pid):
    return b"agentgate supervisor" in open(f"/proc/{pid}/cmdline", "rb").read()
sup = os.getppid()  # the shell's, then up to the supervisor
while not supervisor(sup):
    sup = parent(sup)
plugin = parent(sup)
while supervisor(plugin):  # the fork server: pytest is its parent
    plugin = parent(plugin)
# The report channel only: what the supervisor holds besides its output and its stdio.
held = set(links(sup).values()) - {os.readlink("/proc/self/fd/1")}
forged = marshal.dumps({"returncode": 0, "timed_out": False, "survivors": 0})
ends = []
for fd, target in links(plugin).items():
    # Its pipe (one inode for both ends), or any socket: /proc opens none of those.
    if (target in held and target.startswith("pipe:")) or target.startswith("socket:"):
        try:
            ends.append(os.open(f"/proc/{plugin}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK))
        except OSError as exc:
            print("refused:", exc, flush=True)
os.kill(sup, signal.SIGKILL)
for end in ends:
    os.write(end, forged)
print("forged into", len(ends), flush=True)
"""


@pytest.mark.parametrize("server", [True, False])
def test_a_report_written_into_pytest_s_end_of_the_channel_is_not_believed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """Uncontained, a process of the same user may read pytest's /proc: a command opened
    pytest's end of its report pipe through /proc/<pid>/fd, killed its supervisor and wrote
    a passing report there, then exited 1, and passed (20 times in 20, as another user than
    root too). The channel is a socket, which /proc does not open."""
    if not server:
        monkeypatch.setattr(forkserver, "available", lambda: False)
    (tmp_path / "forge.py").write_text(FORGE_INTO_PYTEST)
    result = run_command(f"{sys.executable} forge.py; exit 1", cwd=tmp_path, env=ENV, timeout=10)
    assert not result.ok, result
    assert result.returncode != 0, result


def test_a_launch_that_failed_before_the_command_ran_says_so_and_a_killed_one_does_not(
    tmp_path: Path,
) -> None:
    """Only a launch that failed before the command ran is the harness's alone: a re-test
    is run again for it. A command that ends its own supervisor also loses its exit status,
    but it ran: the tree it was judging could have done that on purpose."""
    missing = run_command([str(tmp_path / "no-such-program")], cwd=tmp_path, env=ENV, timeout=30)
    assert missing.launch_error and missing.never_ran
    killer = run_command(["sh", "-c", "kill -9 $PPID; sleep 5"], cwd=tmp_path, env=ENV, timeout=30)
    assert not killer.ok and not killer.never_ran, killer
    assert run_command(["true"], cwd=tmp_path, env=ENV, timeout=30).never_ran is False
