"""The plugin's end of the fork server: an uncontained command's supervisor, forked warm.

A new interpreter per command costs a dozen milliseconds before it does anything; the
supervisor's own work is a fraction of one. So each process of the plugin starts one
supervisor interpreter, the server (:func:`.supervisor.serve`), the first time it runs an
uncontained command, and from then on asks it to fork a supervisor per command. The forked
supervisor is what the per-command one was: a child subreaper in a session of its own, in
the command's pids cgroup and under its file-size limit before the command starts (it moves
itself in: no RCU grace period to wait for), reporting on a socket the command cannot reach.

The forked supervisor also takes on the plugin's process state as it is when the command
starts (umask, resource limits, priority, CPUs), not as it was when the server started.

Nothing ties the server or a supervisor to the plugin by a death signal (one follows the
thread that started a process, and commands start from many). Each watches the plugin's
process on a pidfd. When the plugin ends, however it ends, the server exits and each
supervisor sweeps its command, and ends a server it finds left behind (stopped by a
command, say). So nothing a command does to the server reaches another command. A server
that is gone or does not answer is replaced for the next command. A fork of the plugin
keeps nothing of its servers (``os.register_at_fork``).

Where there is no ``pidfd_open`` (a process id alone cannot be signalled safely once the
server may have reaped it), every command gets an interpreter of its own instead.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import marshal
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .supervisor import readable

SUPERVISOR = str(Path(__file__).with_name("supervisor.py"))
#: The supervisor's start: its code comes compiled on standard input, ahead of its
#: configuration (no file to read, parse or compile per command, none anybody could swap).
BOOTSTRAP = (
    "# agentgate supervisor\n"  # its name in a process listing
    "import marshal,sys;"
    "exec(marshal.load(sys.stdin.buffer),{'__name__':'__main__','__file__':'supervisor'})"
)
_compiled: list[bytes] = []


def supervisor_code() -> bytes:
    """The supervisor compiled once per process (the same interpreter runs it)."""
    if not _compiled:
        source = Path(SUPERVISOR).read_bytes()
        _compiled.append(marshal.dumps(compile(source, SUPERVISOR, "exec", dont_inherit=True)))
    return _compiled[0]


#: How long the server may take to fork a supervisor and hear from it.
_START_S = 10.0


def available() -> bool:
    """Whether commands here can be supervised by forks of a server (Linux, pidfds)."""
    return sys.platform == "linux" and hasattr(os, "pidfd_open")


@dataclass(eq=False)  # held in sets by identity, as a Popen is
class Forked:
    """A supervisor forked for one command: its process id (its session's), a pidfd on it
    (safe to signal whoever reaped it) and the socket it is configured and reports on."""

    pid: int
    pidfd: int
    sock: socket.socket

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, sig)

    def configure(self, config: bytes) -> None:
        """Send the configuration; the supervisor reads it to its end, then starts. One that
        ended before it had all of it (killed) reports nothing: a lost status."""
        with contextlib.suppress(OSError):
            self.sock.sendall(config)
            self.sock.shutdown(socket.SHUT_WR)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the supervisor has exited (raises ``TimeoutExpired``, as Popen's)."""
        if not readable(self.pidfd, timeout):
            raise subprocess.TimeoutExpired("agentgate supervisor", timeout or 0.0)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


@dataclass
class _Server:
    proc: subprocess.Popen[bytes]
    ctl: socket.socket


_lock = threading.Lock()
_servers: list[_Server] = []


def start(out_fd: int) -> Forked | None:
    """A supervisor forked for one command with ``out_fd`` as its output, waiting for its
    configuration; None when no server could fork one (the caller starts an interpreter)."""
    failed: _Server | None = None
    for _ in range(2):
        server = _server(failed)
        if server is None:
            return None
        mine, theirs = socket.socketpair()
        try:
            with _lock:
                socket.send_fds(server.ctl, [b"c"], [theirs.fileno(), out_fd])
        except OSError:  # the server is gone: start another
            mine.close()
            failed = server
            continue
        finally:
            theirs.close()
        forked = _hear_from(mine)
        if forked is not None:
            return forked
        mine.close()
        # Gone, or alive but silent (stopped by a command, say): replaced. Its supervisors
        # are not its children in any way that matters: they watch the plugin, not it.
        failed = server
    return None


def caller_state() -> dict[str, object]:
    """What of this process a command it starts inherits, and the server (started earlier)
    may no longer have: umask, resource limits, priority, CPUs."""
    import resource

    state: dict[str, object] = {}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    state["umask"] = int(line.split()[1], 8)
                    break
    except (OSError, ValueError, IndexError):
        pass
    state["limits"] = [(n, resource.getrlimit(n)) for n in _limit_numbers()]
    with contextlib.suppress(OSError):
        state["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        state["cpus"] = sorted(os.sched_getaffinity(0))
    return state


@functools.cache
def _limit_numbers() -> tuple[int, ...]:
    import resource

    return tuple(
        getattr(resource, name)
        for name in dir(resource)
        if name.startswith("RLIMIT_") and isinstance(getattr(resource, name), int)
    )


def _hear_from(sock: socket.socket) -> Forked | None:
    """The forked supervisor as it says its process id; None if it ended first."""
    deadline = time.monotonic() + _START_S
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not readable(sock.fileno(), left):
            return None
        chunk = sock.recv(32)
        if not chunk:
            return None
        line += chunk
    try:
        pid = int(line)
        pidfd = os.pidfd_open(pid)
    except (ValueError, OSError):
        return None
    # Until it has its configuration the supervisor writes nothing more and does not exit:
    # a socket with nothing to read means the pidfd is on that supervisor, not a reuse.
    if readable(sock.fileno(), 0):
        os.close(pidfd)
        return None
    return Forked(pid, pidfd, sock)


def _server(failed: _Server | None) -> _Server | None:
    """This process's server, started if it has none or has only ``failed``, the one that
    could not fork a supervisor (once: another thread may have replaced it already)."""
    with _lock:
        current = _servers[0] if _servers else None  # a fork starts with none
        if current is not None and current is not failed and current.proc.poll() is None:
            return current
        if current is not None:
            _servers.remove(current)
            _stop(current, at_once=True)  # its supervisors go on without it
        try:
            started = _start_server()
        except OSError:
            return None
        _servers.append(started)
        return started


def _start_server() -> _Server:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fd = theirs.fileno()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(fd,),
            start_new_session=True,
            env={"LC_ALL": "C.UTF-8"},
            cwd="/",  # it holds no folder of anybody's
        )
    except OSError:
        mine.close()
        raise
    finally:
        theirs.close()
    assert proc.stdin is not None
    mine.settimeout(_START_S)  # a request to a server that stopped reading does not block
    try:
        proc.stdin.write(supervisor_code() + marshal.dumps({"serve": fd, "parent": os.getpid()}))
        proc.stdin.close()
    except OSError:
        mine.close()
        proc.kill()
        proc.wait()
        raise
    return _Server(proc, mine)


def _stop(server: _Server, *, at_once: bool = False) -> None:
    """Close the server's control socket (it exits on its own) and reap it; ``at_once``,
    for a server that failed (stopped, say: it would not exit), kill it first."""
    server.ctl.close()
    if at_once:
        with contextlib.suppress(ProcessLookupError):
            server.proc.kill()
    try:
        server.proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        wait_or_reap_later(server.proc, 2.0)


def wait_or_reap_later(proc: Waitable, within: float) -> None:
    """Wait ``within`` s for a killed process. A frozen one (a cgroup freezer) does not die
    until it is thawed, and nothing may wait on it for ever: a thread of its own reaps it
    whenever it ends."""
    try:
        proc.wait(within)
    except subprocess.TimeoutExpired:
        threading.Thread(target=proc.wait, name="agentgate-reap", daemon=True).start()


class Waitable(Protocol):
    """What :func:`wait_or_reap_later` needs: ``wait`` raising ``TimeoutExpired``, as Popen's."""

    def wait(self, timeout: float | None = None) -> object: ...


@atexit.register
def _stop_all() -> None:
    with _lock:
        mine = list(_servers)
        _servers.clear()
    for server in mine:
        _stop(server)


def _forget_in_child() -> None:
    """In a fork of this process: nothing of the parent's servers (the parent's end of a
    control socket held here would keep its server running after the parent ended), and a
    lock another thread may have held at the fork."""
    global _lock
    _lock = threading.Lock()
    for server in _servers:
        with contextlib.suppress(OSError):
            server.ctl.close()
    _servers.clear()


os.register_at_fork(after_in_child=_forget_in_child)
