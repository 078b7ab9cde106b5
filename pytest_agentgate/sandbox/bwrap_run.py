"""A contained command with bwrap as its supervisor: no process of the plugin's between them.

bwrap already does what the Python supervisor does for an uncontained command, and does it
in C (a contained command then costs about bwrap's own start):

- its PID namespace ends every process the command started when the command ends: the
  namespace's first process (bwrap's, ``--die-with-parent``) is killed when bwrap's monitor
  exits, and with it every process left in the namespace, daemons that called ``setsid``
  included; the plugin waits for that first process to be gone (a pidfd) before it returns;
- ``--die-with-parent`` ties the monitor to the plugin: a SIGKILLed pytest leaves nothing of
  the command running;
- ``--json-status-fd`` reports the command's exit code on a pipe the command cannot reach
  (bwrap closes it inside), so the command cannot forge it.

What the plugin adds before bwrap has its options (bwrap reads them from a pipe, see
:func:`run`): it moves bwrap into the command's pids cgroup and sets the file-size limit
(RLIMIT_FSIZE); every process of the command is born under both.

A window is left: were the plugin killed in the milliseconds between bwrap's report of its
namespace and that namespace's first process tying itself to bwrap, the command would run
to its end, still contained, without a timeout.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Protocol

from .supervisor import GRACE_S, Cgroup, children_of, readable

#: In a bwrap command line, where the descriptor bwrap reports its status on goes.
STATUS_PLACEHOLDER = "@AGENTGATE_STATUS_FD@"
#: ... and the one it reads the seccomp program from (see :mod:`.seccomp`).
SECCOMP_PLACEHOLDER = "@AGENTGATE_SECCOMP_FD@"

#: How long bwrap may take to build the sandbox before the plugin gives up on it.
_SETUP_S = 30.0
#: How long the namespace may take to be gone once its command ended.
_TEARDOWN_S = 10.0
_CHILD_PID = re.compile(rb'"child-pid"\s*:\s*(\d+)')
_EXIT_CODE = re.compile(rb'"exit-code"\s*:\s*(-?\d+)')


def _split(argv: list[str], status_fd: int, seccomp_fd: int) -> tuple[list[str], bytes]:
    """bwrap's command line as bwrap starts (its name, ``--args``, the command) and its
    options, NUL-separated, with its descriptors filled in."""
    end = argv.index("--")
    options = argv[1:end]
    fill = {("--json-status-fd", STATUS_PLACEHOLDER): status_fd,
            ("--seccomp", SECCOMP_PLACEHOLDER): seccomp_fd}  # fmt: skip
    for at in range(1, len(options)):
        fd = fill.get((options[at - 1], options[at]))
        if fd is not None:
            options[at] = str(fd)
    return argv[end:], b"".join(os.fsencode(arg) + b"\0" for arg in options)


def _seccomp_pipe(argv: list[str]) -> int:
    """A pipe holding the seccomp program, when the command line asks for one: its read
    end, for bwrap (the write end is closed: bwrap reads to its end); else -1."""
    if SECCOMP_PLACEHOLDER not in argv:
        return -1
    from .seccomp import program

    read, write = os.pipe()
    try:
        os.write(write, program())
    finally:
        os.close(write)
    return read


class Launch(Protocol):
    """What a command is started with: where, its environment, how long it may take, where
    its output goes, its cgroup and the largest file it may write."""

    @property
    def cwd(self) -> Path: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def sink(self) -> IO[bytes]: ...
    @property
    def cgroup(self) -> Cgroup: ...
    @property
    def fsize_max(self) -> int | None: ...


def run(
    argv: list[str],
    launch: Launch,
    *,
    on_start: Callable[[subprocess.Popen[bytes]], None],
    ended: Callable[[], bool],
) -> dict[str, object]:
    """Run the bwrap command line ``argv``; return a report in the Python supervisor's shape
    (``returncode``, ``timed_out``, ``interrupted``, ``survivors``, ``sandbox_status``).

    bwrap starts with ``--args`` and the command: it reads its options from a pipe, and the
    plugin writes them only once bwrap is in the cgroup and under the file-size limit, so
    every process of the command is born bounded. Were the plugin killed before that, bwrap
    reads no options, and an empty root holds no program to run: nothing starts.

    ``on_start`` is called with bwrap's process as soon as it runs (for an interrupt to reach
    it); ``ended`` says, for a command that ended without a status, whether the plugin ended
    it (an interrupt), so that is what the report says.
    """
    cwd, env, timeout, sink = launch.cwd, launch.env, launch.timeout, launch.sink
    cgroup, fsize_max = launch.cgroup, launch.fsize_max
    status_r, status_w = os.pipe()
    args_r, args_w = os.pipe()
    seccomp_r = _seccomp_pipe(argv)
    command, options = _split(argv, status_w, seccomp_r)
    inside = cgroup.thread_in()
    try:
        proc = subprocess.Popen(
            [argv[0], "--args", str(args_r), *command],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            pass_fds=tuple(fd for fd in (status_w, args_r, seccomp_r) if fd >= 0),
            start_new_session=True,
            env=dict(env),
            cwd=cwd,
        )
    except OSError as exc:
        for fd in (status_r, args_w):
            os.close(fd)
        return {"returncode": None, "exec_error": f"{exc.strerror or exc}: {argv[0]}"}
    finally:
        if inside:
            cgroup.thread_out()
        os.close(status_w)
        os.close(args_r)
        if seccomp_r >= 0:
            os.close(seccomp_r)
    try:
        on_start(proc)
        problem = _bound(proc.pid, cgroup, fsize_max, moved=inside)
        problem = problem or _hand_over(args_w, options)
        os.close(args_w)  # its end is what bwrap reads up to
        args_w = -1
        if problem:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            return {"returncode": None, "exec_error": problem}
        return _supervise(proc, status_r, timeout, cgroup, ended)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        raise
    finally:
        os.close(status_r)
        if args_w >= 0:
            os.close(args_w)


def _hand_over(fd: int, data: bytes) -> str:
    """Write bwrap's options in one piece (the pipe is made big enough first): bwrap reads
    them to their end, so it gets all of them or, were the plugin killed, none."""
    import fcntl

    try:
        if len(data) >= 65536:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, len(data) + 1)
        written = os.write(fd, data)
    except OSError as exc:
        return f"could not hand bwrap its options: {exc}"
    if written != len(data):
        return "could not hand bwrap its options in one piece"
    return ""


def _supervise(
    proc: subprocess.Popen[bytes],
    status_r: int,
    timeout: float | None,
    cgroup: Cgroup,
    ended: Callable[[], bool],
) -> dict[str, object]:
    report: dict[str, object] = {"cgroup_problem": cgroup.problem}
    deadline = None if timeout is None else time.monotonic() + timeout
    status, _ = read_until(status_r, b"\n", deadline)
    found = _CHILD_PID.search(status)
    if found is None:  # bwrap failed before it made the sandbox (its error is in the output)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        report.update(returncode=proc.wait(), sandbox_status=status.decode("utf-8", "replace"))
        return report
    first = int(found[1])  # the namespace's first process: every other descends from it
    pidfd = _pidfd(first)
    try:
        try:
            more, done = read_until(status_r, None, deadline)
        except BaseException:
            _end(proc, pidfd, first, grace=GRACE_S)
            raise
        status += more
        timed_out = not done
        report["survivors"] = 0 if timed_out else len(_left_in(first, cgroup, proc.pid))
        if timed_out:
            _end(proc, pidfd, first, grace=GRACE_S)
        else:  # the command ended: what it left in the namespace goes with the namespace
            _signal_first(pidfd, signal.SIGKILL)
        status += _drain(status_r)
        _gone(pidfd)
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    code = proc.wait()
    reported = _EXIT_CODE.search(status)
    report.update(
        returncode=int(reported[1]) if reported else code,
        timed_out=timed_out,
        interrupted=ended() and b'"exit-code"' not in status,
        sandbox_status=status.decode("utf-8", "replace"),
    )
    return report


def _bound(pid: int, cgroup: Cgroup, fsize_max: int | None, *, moved: bool) -> str:
    """Put bwrap (every process of the command descends from it) under the command's
    bounds, unless it was born in its cgroup (``moved``); what could not be done, or ""."""
    if not moved:
        cgroup.add(pid)
    if fsize_max:
        import resource

        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (fsize_max, fsize_max))
        except OSError as exc:
            return f"could not set the sandbox's file-size limit: {exc}"
    return ""


def read_until(fd: int, stop: bytes | None, deadline: float | None) -> tuple[bytes, bool]:
    """What ``fd`` gives until ``stop`` was read or its end, waiting in ``select`` until
    ``deadline`` at most; and whether it got there (false: the deadline came first)."""
    chunks: list[bytes] = []
    while True:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not readable(fd, remaining):
            return b"".join(chunks), False
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        if stop is not None and stop in chunk:
            return b"".join(chunks), True


def _drain(fd: int) -> bytes:
    """What is left to read on ``fd`` without waiting."""
    chunks = []
    while readable(fd, 0):
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _pidfd(pid: int) -> int:
    """A descriptor of the namespace's first process ``pid``, which no later process with
    its number can be mistaken for; -1 when it is gone already (or the number is now
    another's: that process is not the first of a namespace)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return -1
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            first_here = any(line.startswith(b"NSpid:") and line.split()[-1] == b"1" for line in f)
    except OSError:
        first_here = False
    if not first_here:
        os.close(fd)
        return -1
    return fd


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children_of(todo.pop())
        found += kids
        todo += kids
    return found


def _left_in(first: int, cgroup: Cgroup, monitor: int) -> set[int]:
    """The processes still in the sandbox besides bwrap's own."""
    return (set(_descendants(first)) | set(cgroup.members())) - {first, monitor}


def _end(proc: subprocess.Popen[bytes], pidfd: int, first: int, *, grace: float) -> None:
    """End the sandbox before its command ended: SIGTERM to the command's processes and
    ``grace`` s for them to end (bwrap then reports), then SIGKILL to the namespace and to
    bwrap."""
    if grace > 0:
        for pid in _descendants(first):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
    _signal_first(pidfd, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _signal_first(pidfd: int, sig: int) -> None:
    """Signal the namespace's first process (SIGKILL to it ends the whole namespace)."""
    if pidfd >= 0:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            signal.pidfd_send_signal(pidfd, sig)


def _gone(pidfd: int) -> None:
    """Return once the namespace's first process has exited (it was sent SIGKILL): the
    kernel ends it only after every other process of the namespace, so nothing of the
    command runs on."""
    if pidfd >= 0:
        readable(pidfd, _TEARDOWN_S)
