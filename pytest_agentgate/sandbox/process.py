"""Running commands (agent steps, gate commands), each in a session of its own, supervised.

A contained command has bwrap as its supervisor (:mod:`pytest_agentgate.sandbox.bwrap_run`);
an uncontained one has :mod:`pytest_agentgate.sandbox.supervisor`, a child subreaper. Either
way, every process the command started is ended when it ends, and its exit status comes back
on a pipe the command cannot reach. Its output goes to a temporary file, so a chatty command
costs disk, not memory, and only its tail is kept.
"""

from __future__ import annotations

import contextlib
import io
import marshal
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple, Protocol

from .. import _faults
from .excerpt import pytest_failures
from .forkserver import BOOTSTRAP, supervisor_code, wait_or_reap_later

if TYPE_CHECKING:
    from .egress import Refusal
    from .supervisor import Cgroup

#: How many lines of a command's output an attempt record keeps.
TAIL_LINES = 40
#: The most of a command's output kept whole: past it, its first ``_HEAD_BYTES`` and its
#: end, with how much was left out between them (the log an attempt keeps, the tail a
#: record shows are cut from this).
LOG_BYTES = 4 << 20
_HEAD_BYTES = 256 * 1024
#: How long past its own timeout a supervisor may take before the plugin ends it.
_BACKSTOP_S = 30.0
#: How long a supervisor's sweep goes on killing what its command left before it reports
#: what is still there (a frozen process ignores SIGKILL until it is thawed).
_SWEEP_S = 10.0
#: How long a killed supervisor is waited for: a frozen process (a cgroup freezer) does
#: not end until it is thawed, and run_command must return all the same.
_GIVE_UP_S = 5.0
#: How often the plugin looks whether its command stopped a supervisor (see _read_report).
_NUDGE_S = 0.1
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
#: Terminal control sequences (colours, cursor moves, titles): never kept in a tail, a
#: record or an agent's feedback, where they are noise to a reader and to an agent alike.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def plain(text: str) -> str:
    """``text`` without terminal control sequences."""
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class CommandResult:
    """How a command ended, with the tail of what it printed (secrets masked)."""

    command: str
    returncode: int
    output: str
    duration_ms: float
    timed_out: bool = False
    #: Set when the plugin's own launch failed (the program could not be executed, the
    #: sandbox could not start, the exit status was lost): the harness failed, not the agent.
    launch_error: str = ""
    #: Processes the command left behind, ended by the supervisor when it ended. Contained,
    #: those seen as it ended: the namespace ends them all either way, and one the kernel
    #: was already ending may not be counted.
    survivors: int = 0
    #: Whether the command was contained by the sandbox, and how the processes were bounded.
    contained: bool = False
    #: How many bytes the command printed in all (``output`` holds at most ``LOG_BYTES``).
    output_bytes: int = 0
    #: Connections its network's allow-list refused (the first ones), and how many in all.
    refused: tuple[Refusal, ...] = ()
    refused_count: int = 0
    #: The launch failed before the command could run (its program could not be executed,
    #: its sandbox could not start): nothing the command would run has run.
    never_ran: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.launch_error

    def tail(self, lines: int = TAIL_LINES) -> str:
        """What a record and an agent's feedback show of the output: pytest's failures and
        its short summary when it printed them (whatever came after), else the last lines."""
        text = self.output.splitlines()
        return pytest_failures(text, lines) or "\n".join(text[-lines:])


def _kept(sink: IO[bytes], size: int) -> bytes:
    """What is kept of ``size`` bytes of output: all of it up to ``LOG_BYTES``, else its
    head and its end, with how much was left out between them."""
    sink.seek(0)
    if size <= LOG_BYTES:
        return sink.read()
    head = sink.read(_HEAD_BYTES)
    sink.seek(size - (LOG_BYTES - _HEAD_BYTES))
    end = sink.read()
    gap = size - len(head) - len(end)
    return head + f"\n[... {gap} bytes of output left out ...]\n".encode() + end


def mask_secrets(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace the values of secret-looking environment variables with ``***``."""
    env = os.environ if environ is None else environ
    values = sorted(
        {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 4},
        key=len,
        reverse=True,
    )
    for value in values:
        text = text.replace(value, "***")
    return text


def kill_group(pgid: int) -> None:
    """End a process group: SIGTERM, a short grace, then SIGKILL."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM (how CI cancels a job) into an interrupt while a command runs.

    The command has a session of its own, so the signal does not reach it; as an interrupt
    in the waiting process it does: the process group is ended, and pytest stops the run as
    it does for Ctrl-C.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Supervisor(Protocol):
    """A command's supervisor as the plugin holds it: bwrap or a supervisor interpreter (a
    ``Popen``), or a forked supervisor (:class:`.forkserver.Forked`)."""

    @property
    def pid(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> object: ...


class Running:
    """The supervisors of commands run at once (one per thread), so that an interrupt in
    the thread waiting for them ends them all instead of waiting for each to finish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[Supervisor] = set()
        self.ended = False

    def add(self, proc: Supervisor) -> None:
        with self._lock:
            self._procs.add(proc)
            ended = self.ended
        if ended:  # the run was interrupted while this command was starting
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def discard(self, proc: Supervisor) -> None:
        # Popen signals only a child it has not reaped: a finished one's pid, reused by
        # then, is never signalled, whenever this runs.
        with self._lock:
            self._procs.discard(proc)

    def end_all(self) -> None:
        """Ask every supervisor still running to end its command (each sweeps its own
        processes and reports); commands not yet started will not start."""
        with self._lock:
            self.ended = True
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)


@dataclass(frozen=True)
class Watch:
    """Who keeps track of a command's supervisor besides its caller: ``started`` collects
    its id (its session), for a last sweep should the supervisor itself be killed;
    ``running`` ends it with the others on an interrupt."""

    started: list[int] | None = None
    running: Running | None = None


@dataclass(frozen=True)
class Limits:
    """What every process of a command is born bounded by: how many processes its cgroup
    may hold, and the largest file it may write (None: no bound)."""

    pids_max: int | None = None
    fsize_max: int | None = None


_UNWATCHED, _UNBOUNDED = Watch(), Limits()


def run_command(
    command: str | Iterable[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float | None,
    watch: Watch = _UNWATCHED,
    wrap: Callable[[list[str]], list[str]] | None = None,
    limits: Limits = _UNBOUNDED,
) -> CommandResult:
    """Run ``command`` (a shell string or an argument list) and wait at most ``timeout`` s.

    ``wrap`` turns the argument list into the sandbox's command line. On timeout every
    process of the command is ended and ``timed_out`` is set; whatever it left running is
    ended when it ends, in every case.
    """
    started, running = watch.started, watch.running
    pids_max, fsize_max = limits.pids_max, limits.fsize_max
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    label = command if isinstance(command, str) else shlex.join(argv)  # as a shell reads it
    contained = wrap is not None
    begin = time.perf_counter()
    from .supervisor import Cgroup

    cgroup = Cgroup.create(pids_max)
    with tempfile.TemporaryFile() as sink:
        try:
            with terminate_as_interrupt():
                launch = _Launch(cwd, env, timeout, sink, cgroup, fsize_max, started, running)
                report = (
                    _run_contained(wrap(argv), launch)
                    if wrap is not None
                    else _run_supervised(argv, launch)
                )
        finally:
            # Whatever is still in the command's cgroup (its supervisor was killed before it
            # could sweep) goes now.
            stragglers = cgroup.remove()
        size = sink.seek(0, os.SEEK_END)
        output = _kept(sink, size).decode("utf-8", "replace")
    duration = (time.perf_counter() - begin) * 1000
    ended = _outcome(report, contained, output)
    return CommandResult(
        label,
        ended.code,
        mask_secrets(plain(output)),
        duration,
        bool(report.get("timed_out")),
        ended.problem,
        int(str(report.get("survivors") or 0)) + stragglers,
        contained,
        size,
        never_ran=ended.never_ran,
    )


@dataclass(frozen=True)
class _Launch:
    """What either supervisor is given to start one command with."""

    cwd: Path
    env: Mapping[str, str]
    timeout: float | None
    sink: IO[bytes]
    cgroup: Cgroup
    fsize_max: int | None
    started: list[int] | None
    running: Running | None


def _run_contained(line: list[str], launch: _Launch) -> dict[str, object]:
    """A contained command: bwrap is its supervisor (see :mod:`.bwrap_run`)."""
    from . import bwrap_run

    running = launch.running
    launched: list[subprocess.Popen[bytes]] = []

    def on_start(proc: subprocess.Popen[bytes]) -> None:
        launched.append(proc)
        _started(proc, launch)
        _faults.point("gate")

    try:
        return bwrap_run.run(
            line, launch, on_start=on_start, ended=lambda: running is not None and running.ended
        )
    finally:
        if running is not None and launched:
            running.discard(launched[0])


def _started(proc: Supervisor, launch: _Launch) -> None:
    """Make a supervisor just started known: for the last sweep, and to an interrupt."""
    if launch.started is not None:
        launch.started.append(proc.pid)
    if launch.running is not None:
        launch.running.add(proc)


def _run_supervised(argv: list[str], launch: _Launch) -> dict[str, object]:
    """An uncontained command: a supervisor (see :mod:`.supervisor`) forked by this process's
    server (:mod:`.forkserver`), or, where there is none, an interpreter of its own."""
    from . import forkserver

    forked = None
    if forkserver.available():
        forked = forkserver.start(launch.sink.fileno())
    if forked is None:
        return _run_spawned(argv, launch)
    _started(forked, launch)
    config = {
        "argv": argv, "cwd": str(launch.cwd), "env": dict(launch.env),
        "timeout": launch.timeout, "cgroup": launch.cgroup.path, "fsize_max": launch.fsize_max,
        "sweep_s": _SWEEP_S,
        "state": forkserver.caller_state(),
    }  # fmt: skip
    try:
        data = _await_report(
            forked, lambda: forked.configure(marshal.dumps(config)), forked.sock.fileno(), launch
        )
        if data is None:  # the supervisor outlived its own timeout: end it (and wait)
            _end_supervisor(forked)
            data = b""
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                forked.wait(_GIVE_UP_S)  # a frozen one does not end when killed (not our child)
    finally:
        forked.close()
    return _with_cgroup_problem(_report(data), launch.cgroup)


def _await_report(
    proc: Supervisor, send: Callable[[], None], fd: int, launch: _Launch
) -> bytes | None:
    """Configure the supervisor (``send``) and read its report on ``fd`` (None: it outlived
    the command's timeout); an interrupt or error on the way ends it (it sweeps) first."""
    try:
        send()
        _faults.point("gate")
        return _read_report(fd, launch.timeout, proc)
    except BaseException:
        _end_supervisor(proc)
        raise
    finally:
        if launch.running is not None:
            launch.running.discard(proc)


def _with_cgroup_problem(report: dict[str, object], cgroup: Cgroup) -> dict[str, object]:
    if cgroup.problem:
        report.setdefault("cgroup_problem", cgroup.problem)
    return report


def _run_spawned(argv: list[str], launch: _Launch) -> dict[str, object]:
    """An uncontained command under a supervisor interpreter of its own."""
    cgroup = launch.cgroup
    # A socket pair, not a pipe: a pipe's end can be opened again through /proc/<pid>/fd by
    # any process of the user that may read pytest's /proc, and a command could kill its
    # supervisor and write a passing report into pytest's end; a socket cannot be opened so.
    mine, theirs = socket.socketpair()
    status_r, status_w = mine.detach(), theirs.detach()
    inside = cgroup.thread_in()
    try:
        try:
            proc = _start_supervisor(status_w, launch.sink.fileno())
        finally:
            if inside:
                cgroup.thread_out()
        _started(proc, launch)

        def send() -> None:
            # Its bounds first (the command inherits them): set while the interpreter starts.
            if not inside:
                cgroup.add(proc.pid)
            problem = _limit_file_size(proc.pid, launch.fsize_max)
            assert proc.stdin is not None
            proc.stdin.write(_config(argv, launch, status_w, problem))
            proc.stdin.close()

        data = _await_report(proc, send, status_r, launch)
        if data is None:  # the supervisor outlived its own timeout: end it
            kill_group(proc.pid)
            data = b""
        wait_or_reap_later(proc, _GIVE_UP_S)
    finally:
        os.close(status_r)
    return _with_cgroup_problem(_report(data), cgroup)


def _limit_file_size(pid: int, fsize_max: int | None) -> str:
    """Set ``pid``'s RLIMIT_FSIZE (no file it or its children write grows past it)."""
    if not fsize_max:
        return ""
    import resource

    try:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (fsize_max, fsize_max))
    except OSError as exc:
        return f"could not set the file-size limit: {exc}"
    return ""


def _config(argv: list[str], launch: _Launch, status_w: int, problem: str) -> bytes:
    """What the supervisor reads on its stdin: its code, then its configuration (nothing of
    it is a file a command could change). A bound that could not be set is a launch error:
    the supervisor reports it without starting the command."""
    config = {
        "argv": argv, "cwd": str(launch.cwd), "env": dict(launch.env),
        "timeout": launch.timeout, "parent": os.getpid(), "status_fd": status_w,
        "sweep_s": _SWEEP_S,
        "out_fd": launch.sink.fileno(), "cgroup": launch.cgroup.path, "refuse": problem,
    }  # fmt: skip
    return supervisor_code() + marshal.dumps(config)


def _start_supervisor(status_w: int, out_fd: int) -> subprocess.Popen[bytes]:
    """Start the supervisor (it waits for its configuration on stdin). Its report comes back
    on ``status_w``, which is closed here whatever happens."""
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=out_fd,
            stderr=out_fd,
            pass_fds=(status_w, out_fd),
            start_new_session=True,
            env={"LC_ALL": "C.UTF-8"},
            cwd="/",  # the command's own folder is the supervisor's to enter, and to report
        )
    finally:
        os.close(status_w)


def _end_supervisor(proc: Supervisor) -> None:
    """Ask the supervisor to end the command (it sweeps its subtree), then make sure."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        wait_or_reap_later(proc, _GIVE_UP_S)


def _read_report(fd: int, timeout: float | None, proc: Supervisor) -> bytes | None:
    """Everything the supervisor reports, read until it closes its end (when it exits).

    Waits in ``poll``, not by polling: a command's end is seen at once. Every ``_NUDGE_S``
    the supervisor is looked at: its command may have stopped it (SIGSTOP, which it cannot
    block), and a stopped supervisor sees neither its deadline nor its command's end. One
    found stopped has its command's processes ended here (a loop that keeps stopping it
    would starve its own sweep), then is continued, and reports the command as an error.
    None when it is still running ``_BACKSTOP_S`` after the command's own timeout.
    """
    from .bwrap_run import read_until

    backstop = None if timeout is None else time.monotonic() + timeout + _BACKSTOP_S
    data = b""
    try:
        while backstop is None or time.monotonic() < backstop:
            look = time.monotonic() + _NUDGE_S
            more, ended = read_until(fd, None, look if backstop is None else min(backstop, look))
            data += more
            if ended:
                return data
            if _stopped(proc.pid) and _still_running(proc):  # running: the pid is still its
                end_descendants(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
    except ConnectionResetError:  # a forked supervisor killed before it read its configuration
        return b""
    return None


def _still_running(proc: Supervisor) -> bool:
    """Whether the supervisor has not exited (an unreaped child, or a pidfd, so its number
    is not another's while this holds)."""
    try:
        proc.wait(0)
    except subprocess.TimeoutExpired:
        return True
    return False


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal. Not when it is traced (``t``): a
    person running pytest under ``strace -f`` or a debugger stops it at every call."""
    return _state(pid) == b"T"


def end_descendants(pid: int) -> int:
    """SIGKILL every process below ``pid`` (its children, theirs, ...), again until none is
    left running or the rounds run out (a descendant may fork between the listing and the
    kill); return how many were ended."""
    from .supervisor import children_of

    ended: set[int] = set()
    for _ in range(50):
        found, todo = [], [pid]
        while todo:
            below = [p for p in children_of(todo.pop()) if p not in found]
            found += below
            todo += below
        alive = [p for p in found if _running(p)]
        if not alive:
            break
        for child in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        ended.update(alive)
    return len(ended)


#: What a supervisor's report holds, and of what type (anything else: no report).
_REPORT_FIELDS: dict[str, tuple[type, ...]] = {
    "returncode": (int, type(None)),
    "timed_out": (bool,),
    "interrupted": (bool,),
    "stopped": (bool,),
    "survivors": (int,),
    "unended": (int,),
    "subreaper": (bool,),
    "exec_error": (str, type(None)),
    "cgroup_problem": (str,),
}


def _report(data: bytes) -> dict[str, object]:
    """The supervisor's report (``marshal``), or nothing when it ended without one, or
    when what came is not exactly one report of the supervisor's shape: a second one on
    the channel was written by someone else, and the first may be the forgery."""
    reader = io.BytesIO(data)
    try:
        found = marshal.load(reader)
    except (EOFError, ValueError, TypeError):
        return {}
    if reader.read() or not isinstance(found, dict):
        return {}
    for key, value in found.items():
        if key not in _REPORT_FIELDS or not isinstance(value, _REPORT_FIELDS[key]):
            return {}
    return found


class _Ended(NamedTuple):
    """How a command ended: its exit code, what went wrong with the launch itself (if
    anything), and whether that stopped it before its program was executed."""

    code: int
    problem: str = ""
    never_ran: bool = False


def _outcome(report: Mapping[str, object], contained: bool, output: str) -> _Ended:
    """How the command ended, as its supervisor's report says."""
    if not report:
        return _Ended(
            -1, "the command's exit status was lost (its supervisor ended without reporting)"
        )
    if report.get("exec_error"):
        return _Ended(-1, f"could not start the command: {report['exec_error']}", never_ran=True)
    if report.get("unended"):  # the sweep could not end them: a pass would leave them
        return _Ended(
            -1,
            f"{report['unended']} of the command's processes could not be ended (a frozen "
            "process ignores SIGKILL)",
        )
    if report.get("interrupted"):  # whatever it exited with then, it did not finish
        return _Ended(
            -1, "the command was ended before it finished (its supervisor was told to stop)"
        )
    if report.get("stopped"):  # its end could not be placed before or after its deadline
        return _Ended(
            -1,
            "the command's supervisor was stopped or frozen while it ran, so its end and "
            "its timeout could not be watched: the command was ended",
        )
    code = report.get("returncode")
    # bwrap writes one JSON object per line; "exit-code" only once the command ran.
    ended_early = report.get("timed_out") or report.get("interrupted")
    if contained and not ended_early and '"exit-code"' not in str(report.get("sandbox_status")):
        why = next(
            (ln for ln in reversed(output.splitlines()) if ln.startswith("bwrap:")),
            f"bwrap exited {code}",
        )
        return _Ended(-1, f"the sandbox could not start the command: {why}", never_ran=True)
    if not isinstance(code, int):
        return _Ended(-1, "the command's exit status was lost")
    return _Ended(code)


def processes_in(root: Path) -> list[int]:
    """Processes whose working directory, root or an open file is in ``root``: not this one,
    nor one it runs under (the shell or runner that started pytest, which a person may have
    left in the folder), nor the PID namespace's init (no signal from inside ends it, and it
    may hold hundreds of descriptors, each a read)."""
    spared = {os.getpid(), 1, *_ancestors()}
    prefix = os.path.realpath(root)
    inside = (prefix, prefix + os.sep)
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit() or int(name) in spared:
            continue
        base = f"/proc/{name}"
        links = [f"{base}/cwd", f"{base}/root"]
        with contextlib.suppress(OSError):
            links += [f"{base}/fd/{fd}" for fd in os.listdir(f"{base}/fd")]
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target == inside[0] or target.startswith(inside[1]):
                found.append(int(name))
                break
    return found


def _ancestors() -> list[int]:
    """The processes this one runs under, its parent first, up to the namespace's init."""
    found: list[int] = []
    pid = os.getppid()
    while pid > 1 and pid not in found:
        found.append(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            break
        pid = int(stat[stat.rindex(b")") + 2 :].split()[1])
    return found


def end_processes_in(root: Path) -> int:
    """SIGKILL every process at work in ``root``; return how many could not be ended."""
    for _ in range(5):
        pids = processes_in(root)
        if not pids:
            return 0
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.005)
    return len([p for p in processes_in(root) if _running(p)])


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds no directory and runs no code)."""
    return _state(pid) not in (b"", b"Z", b"X")


def _state(pid: int) -> bytes:
    """Process ``pid``'s state letter in ``/proc`` (``R``, ``S``, ``T``, ``Z``, ...); empty
    when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return b""
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
