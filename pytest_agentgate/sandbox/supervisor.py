"""The supervisor: a small process between the plugin and every command it runs for an agent.

Run as ``python -I -S _supervisor.py`` with its configuration (the command's argument list,
environment, timeout, descriptors) in ``marshal`` format on standard input, where no other
process can read it; its report goes back the same way. It imports only modules built into
the interpreter (no ``subprocess``, no ``json``): its start-up is the cost of every command.
It imports nothing of the package (it must start fast and trust nothing on ``sys.path``),
and it is never pytest itself: a child subreaper collects every orphan of its subtree with
``waitpid(-1)``, which inside pytest would steal the exit statuses that ``subprocess``
waits for.

What it guarantees, sandbox or not:

- it is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a descendant that calls ``setsid``
  or double-forks is still its child; when the command ends (pass, fail or timeout) every
  process left in its subtree is killed and reaped before the supervisor reports;
- with a pids cgroup it may create, the command's processes are capped and the sweep also
  reads the cgroup, so nothing is missed;
- it dies with the plugin (``PR_SET_PDEATHSIG``; forked by the server, it watches the
  plugin on a pidfd): a SIGKILLed pytest leaves no gate running;
- the command's exit status reaches the plugin on a pipe only the supervisor holds, so the
  command cannot forge it; a supervisor killed before it reports is a lost status, which the
  plugin judges an error.
"""

from __future__ import annotations

# The interpreter's own modules, not ``signal`` and ``ctypes``: those two import ``enum``,
# ``struct`` and more, about 11 ms of the start-up every command pays.
import _ctypes
import marshal
import os
import sys
import time

TYPE_CHECKING = False  # not ``typing``'s: importing typing costs as much again
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable
    from types import ModuleType
else:
    import _signal as signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 0.5
#: Where the cgroup v1 pids hierarchy is mounted.
_PIDS_V1 = "/sys/fs/cgroup/pids"


class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # not subscriptable at run time
    _type_ = "i"


class _Function(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


class _Process:
    """The symbols of the running program (libc among them), as ``ctypes.CDLL(None)``."""

    _handle = _ctypes.dlopen(None, 0)  # type: ignore[arg-type]  # None: the program itself


_found: dict[str, _Function] = {}


def _libc(name: str) -> _Function:
    """A function of the C library, looked up once (a fork server's supervisors find it
    ready)."""
    if name not in _found:
        _found[name] = _Function((name, _Process()))  # type: ignore[arg-type]  # a CDLL in all but name
    return _found[name]


def _prctl(option: int, value: int) -> bool:
    try:
        return int(_libc("prctl")(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError, TypeError):
        return False


#: ``rt_sigaction``'s number, where the supervisor knows it.
_RT_SIGACTION = {"x86_64": 13, "aarch64": 134}.get(os.uname().machine)
#: The real-time signals the C library keeps for its threads (cancellation, set*id): its
#: ``sigaction`` and ``sigprocmask`` refuse them, so no Python code can block or ignore
#: them, and their default ends the process: a command could kill its supervisor with one,
#: and with no cgroup its processes would run on unswept.
_LIBC_SIGNALS = (32, 33)


def _set_libc_signals(ignored: bool) -> bool:
    """Ignore :data:`_LIBC_SIGNALS` (or give them back their default) through the system
    call itself, under the C library. The supervisor never cancels a thread nor changes its
    ids, so it needs neither; a command gets the default back before it starts (an ignored
    signal stays ignored across ``exec``)."""
    if _RT_SIGACTION is None:
        return False
    # struct kernel_sigaction: handler, flags, restorer, mask (x86_64 and aarch64 alike).
    action = (1 if ignored else 0).to_bytes(8, sys.byteorder) + bytes(24)
    try:
        call = _libc("syscall")
        return all(int(call(_RT_SIGACTION, sig, action, None, 8)) == 0 for sig in _LIBC_SIGNALS)
    except (OSError, AttributeError, TypeError):
        return False


def children_of(pid: int) -> list[int]:
    """The direct children of process ``pid`` (of this one: orphans of its subtree are
    reparented to it, a subreaper)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []  # gone: no children (the scan below is for kernels without the file)
    except OSError:
        tasks = []
    listed = False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(p) for p in f.read().split()]
            listed = True
        except OSError:
            continue
    if listed:
        return found
    for name in os.listdir("/proc"):  # kernels without the children file: scan
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(b")") + 2 :].split()[1]) == pid:
            found.append(int(name))
    return found


def readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` has something to read (or its end) within ``timeout`` s (None: wait).
    ``poll``, not ``select``: a process holding over 1,024 descriptors is no error."""
    import math
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else math.ceil(max(0.0, timeout) * 1000)))


def _pids_v1(cgroup_file: str) -> tuple[list[str], str | None]:
    """The lines of ``cgroup_file`` (a ``/proc/.../cgroup``), and where they say its task is
    in the cgroup v1 pids hierarchy, as a path under it (``""`` at its root; None: in none)."""
    with open(cgroup_file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, controllers, at = line.split(":", 2)
        if "pids" in controllers.split(","):
            return lines, at.rstrip("/")
    return lines, None


class Cgroup:
    """A pids cgroup of one command's own: its process cap, and the list of its processes.

    The plugin makes it (where it may: as root, or in a delegated cgroup) and removes it,
    killing whatever is still in it. The command's first process (the supervisor, or bwrap)
    is in it before the command starts, so every process the command starts is in it, also
    one that killed its supervisor.
    """

    def __init__(self, path: str = "", problem: str = "") -> None:
        self.path = path
        self.problem = problem
        self._home = ""

    def thread_in(self) -> bool:
        """Move the calling thread in, where the hierarchy holds threads one by one (cgroup
        v1): a process it starts is then born inside. A thread that moves itself waits for
        no RCU grace period, as moving another process does (milliseconds). False where it
        cannot: the caller then moves the process it started (:meth:`add`)."""
        if not self.path or not os.path.exists(f"{self.path}/tasks"):
            return False
        try:
            _, where = _pids_v1("/proc/thread-self/cgroup")
            if where is None:
                return False
            self._home = f"{_PIDS_V1}{where}"
            with open(f"{self.path}/tasks", "w", encoding="ascii") as f:
                f.write("0")
        except (OSError, ValueError):
            return False
        return True

    def thread_out(self) -> None:
        """Move the calling thread back where :meth:`thread_in` found it."""
        for home in (self._home, _PIDS_V1):
            try:
                with open(f"{home}/tasks", "w", encoding="ascii") as f:
                    f.write("0")
                return
            except OSError:
                continue

    @classmethod
    def create(cls, pids_max: int | None) -> Cgroup:
        if pids_max is None:
            return cls(problem="no process cap asked for")
        try:
            return cls(cls._make(pids_max))
        except (OSError, ValueError) as exc:
            return cls(problem=f"no pids cgroup could be made: {exc}")

    @staticmethod
    def _make(pids_max: int) -> str:
        root = where = ""
        lines, v1 = _pids_v1("/proc/self/cgroup")
        if v1 is not None:
            root, where = _PIDS_V1, v1
        else:
            for line in lines:
                if line.startswith("0::"):
                    root, where = "/sys/fs/cgroup", line[3:]
            if not root:
                raise ValueError("no pids controller")
            with open(f"{root}{where.rstrip('/')}/cgroup.controllers", encoding="utf-8") as f:
                if "pids" not in f.read().split():
                    raise ValueError("the pids controller is not enabled for this cgroup")
        parent = f"{root}{where.rstrip('/')}"
        if parent not in _SWEPT:
            _SWEPT.add(parent)
            _remove_abandoned(parent)
        path = f"{parent}/agentgate-{os.getpid()}-{time.monotonic_ns()}-{_pid_namespace()}"
        os.mkdir(path, 0o755)
        try:
            with open(f"{path}/pids.max", "w", encoding="ascii") as f:
                f.write(str(pids_max))
        except OSError:
            os.rmdir(path)
            raise
        return path

    def add(self, pid: int) -> None:
        """Move process ``pid`` in (the children it starts from then on are born in it)."""
        if self.path:
            try:
                with open(f"{self.path}/cgroup.procs", "w", encoding="ascii") as f:
                    f.write(str(pid))
            except OSError as exc:
                self.problem = f"could not join the pids cgroup: {exc}"
                self.remove()
                self.path = ""

    def leave(self) -> None:
        """Move this process back out to the parent cgroup (before removing this one)."""
        if self.path:
            try:
                with open(f"{os.path.dirname(self.path)}/cgroup.procs", "w", encoding="ascii") as f:
                    f.write(str(os.getpid()))
            except OSError:
                pass

    def _folders(self) -> list[str]:
        """This cgroup and every cgroup made below it (a command that may write here can
        make one and move into it), deepest first."""
        found = [self.path]
        for at, dirs, _ in os.walk(self.path):
            found += [os.path.join(at, d) for d in dirs]
        return found[::-1]

    def members(self) -> list[int]:
        if not self.path:
            return []
        found: list[int] = []
        for folder in self._folders():
            try:
                with open(f"{folder}/cgroup.procs", encoding="ascii") as f:
                    found += [int(p) for p in f.read().split() if int(p) != os.getpid()]
            except OSError:
                continue
        return found

    def remove(self) -> int:
        """Kill everything still in the cgroup and below it, then remove it, deepest
        first; return how many were killed."""
        if not self.path:
            return 0
        killed: set[int] = set()
        empty_tries = 0
        for _ in range(500):
            left = self.members()
            if not left:
                for folder in self._folders():
                    try:
                        os.rmdir(folder)
                    except FileNotFoundError:
                        continue
                    except OSError:
                        break
                if not os.path.isdir(self.path):
                    return len(killed)
                empty_tries += 1
                if empty_tries > 20:  # nothing in it, yet it stays: not ours to wait on
                    return len(killed)
            killed |= set(left)
            _signal_all(left, signal.SIGKILL)
            time.sleep(0.002)
        return len(killed)


#: Parents whose abandoned command cgroups this process removed already.
_SWEPT: set[str] = set()


def _remove_abandoned(parent: str) -> None:
    """Remove the command cgroups that runs killed before they could remove their own
    (``agentgate-<pid>-<time>-<pid namespace>`` of a process that is gone), ending what is
    still in one: a command that keeps its supervisor stopped while pytest is SIGKILLed
    outlives both, and only its cgroup still knows its processes. A run of another PID namespace
    cannot be looked up here, so its cgroup is removed only once empty, as is one named
    without its namespace; a cgroup whose run is still there is not touched."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    here = _pid_namespace()
    if os.path.realpath("/proc/self") != f"/proc/{os.getpid()}":
        here = ""  # this /proc is another PID namespace's: no run can be looked up in it
    for name in names:
        fields = name.split("-")
        if len(fields) not in (3, 4) or fields[0] != "agentgate" or not fields[1].isdigit():
            continue
        if os.path.exists(f"/proc/{fields[1]}"):
            continue  # its run may still be at work
        path = f"{parent}/{name}"
        if len(fields) == 4 and here and fields[3] == here:
            Cgroup(path).remove()
            continue
        try:
            os.rmdir(path)
        except OSError:
            pass


def _pid_namespace() -> str:
    """This process's PID namespace, as its inode number ("" where it cannot be read)."""
    try:
        return os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    except OSError:
        return ""


def _reap() -> None:
    _reap_ready(-1)  # every child that has ended; none of them is waited for


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def sweep(cgroup: Cgroup, within: float = 10.0) -> tuple[int, int]:
    """Kill and reap every process left in the subtree: how many there were, and how many
    were still there after ``within`` s (a frozen process ignores SIGKILL until thawed)."""
    killed: set[int] = set()
    left: set[int] = set()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = set(children_of(os.getpid())) | set(cgroup.members())
        if not left:
            break
        killed |= left
        _signal_all(sorted(left), signal.SIGKILL)
        time.sleep(0.002)
        _reap()
    _reap()
    return len(killed), len(left)


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        pass
    return b"".join(chunks)


def _spawn(argv: list[str], cwd: str, env: dict[str, str], out_fd: int) -> int:
    """fork + exec of ``argv`` with stdout and stderr on ``out_fd``, stdin empty, no other
    descriptor open, and every signal at its default, none blocked. Raises ``OSError`` when
    the program could not be executed (the errno comes back on a close-on-exec pipe), with
    ``filename`` the folder when that was what could not be entered."""
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing here may raise past os._exit
        step = b"d"
        try:
            for sig in _RESTORED:
                signal.signal(sig, signal.SIG_DFL)
            _set_libc_signals(ignored=False)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            os.chdir(cwd)
            step = b"e"
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
            if err_w > 3:
                os.closerange(3, err_w)
            os.closerange(err_w + 1, 1 << 16)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(err_w, step + str(exc.errno or 0).encode())
        finally:
            os._exit(127)
    os.close(err_w)
    failed = _read_all(err_r)
    os.close(err_r)
    if failed:
        os.waitpid(pid, 0)
        code = int(failed[1:])
        raise OSError(code, os.strerror(code), cwd if failed[:1] == b"d" else argv[0])
    return pid


def main() -> int:
    """One command, its configuration on standard input (the per-command supervisor)."""
    config = marshal.loads(sys.stdin.buffer.read())
    os.close(0)
    if "serve" in config:
        return serve(int(config["serve"]), int(config["parent"]))
    status_fd = int(config["status_fd"])
    _prctl(PR_SET_DUMPABLE, 0)  # see _serve_one
    subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(config["parent"]):  # the plugin died before the death signal was set
        Cgroup(config.get("cgroup") or "").remove()
        return 1
    # The plugin moved this process into the cgroup and set its file-size limit before it
    # sent the configuration: the command and all it starts inherit both.
    parent = int(config["parent"])
    return supervise(config, status_fd, {"subreaper": subreaper}, lambda: os.getppid() != parent)


def serve(ctl_fd: int, plugin: int) -> int:
    """The fork server: a supervisor per command, forked from this warm interpreter.

    Each request on ``ctl_fd`` (a Unix socket) is one byte with two descriptors: the
    command's own socket and its output. The forked supervisor says its process id on that
    socket, reads its configuration to the end, takes on the plugin's process state and
    bounds (umask, limits, cgroup, file-size limit), supervises the command and reports on
    it, then exits. Forking costs a fraction of a millisecond where a new interpreter costs
    a dozen.

    The server and each supervisor watch the plugin's process (``plugin``, its pid) on a
    pidfd, not through a death signal: when it ends, however it ends, the server exits and
    every supervisor sweeps its command. Nothing a command does to the server (kill it,
    stop it) reaches the commands of others.
    """
    import _socket
    import gc
    import resource
    import select
    import warnings  # noqa: F401 - what os.execvpe imports: once here, not once per command

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the supervisors
    _prctl(PR_SET_CHILD_SUBREAPER, 0)  # looks prctl up (this process stays no subreaper)
    _prctl(PR_SET_DUMPABLE, 0)  # its control socket is no command's to open (see _serve_one)
    try:
        watch = os.pidfd_open(plugin)
    except OSError:
        return 1
    if os.getppid() != plugin:  # the plugin ended before the pidfd was open
        return 1
    gc.freeze()  # nothing here is garbage: collections would copy the forks' pages
    gc.disable()
    ctl = _socket.socket(fileno=ctl_fd)
    me = os.getpid()
    kids: dict[int, int] = {}  # the supervisors forked, as pidfds (the kernel reaps them)
    while True:
        if watch in select.select([ctl.fileno(), watch], [], [])[0]:
            _wake(kids)
            return 0  # the plugin has ended
        message, ancillary, _, _ = ctl.recvmsg(1, _socket.CMSG_SPACE(8))
        if not message:
            _wake(kids)
            return 0
        fds = [
            int.from_bytes(data[at : at + 4], sys.byteorder, signed=True)
            for level, kind, data in ancillary
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
            for at in range(0, len(data) - len(data) % 4, 4)
        ]
        try:
            pid = os.fork() if len(fds) == 2 else -1
        except OSError:
            pid = -1
        if pid == 0:
            code = 1
            try:
                ctl.close()
                code = _serve_one(me, watch, fds[0], fds[1], (resource, select))
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        if pid > 0:
            for gone in [fd for fd in kids if readable(fd, 0)]:
                os.close(gone)
                del kids[gone]
            try:
                kids[os.pidfd_open(pid)] = pid
            except OSError:
                pass


def _wake(kids: dict[int, int]) -> None:
    """Continue every supervisor still there: one its command stopped cannot see the
    plugin end (its watcher is stopped with it) until it runs again."""
    for fd in kids:
        try:
            signal.pidfd_send_signal(fd, signal.SIGCONT)
        except OSError:
            pass


def _serve_one(
    server: int, watch: int, sock: int, out_fd: int, modules: tuple[ModuleType, ModuleType]
) -> int:
    """A supervisor forked by :func:`serve`: one command, start to report, on ``sock``."""
    resource, select = modules
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()  # a session of its own, as the per-command supervisor has
    os.dup2(out_fd, 1)  # its own errors go with the command's output
    os.dup2(out_fd, 2)
    # Not dumpable: a process of the same user may then neither open its descriptors
    # through /proc (the report channel, where a passing report could be written) nor copy
    # them (pidfd_getfd) nor read its memory, short of CAP_SYS_PTRACE. The command it
    # starts is dumpable again (execve resets it).
    _prctl(PR_SET_DUMPABLE, 0)
    subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    os.write(sock, b"%d\n" % os.getpid())
    config = marshal.loads(_read_config(sock, watch, select))
    try:
        os.chdir(config["cwd"])  # where the command runs (a bad one is the spawn's to report)
    except OSError:
        pass
    config["out_fd"] = out_fd
    report: dict[str, object] = {"subreaper": subreaper}
    _take_state(config.get("state") or {}, resource)
    cgroup = config.get("cgroup") or ""
    if cgroup and not _join(cgroup):
        report["cgroup_problem"] = "could not join the pids cgroup"
        config["cgroup"] = ""
    fsize = config.get("fsize_max")
    if fsize and not config.get("refuse"):
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        except (OSError, ValueError) as exc:
            config["refuse"] = f"could not set the file-size limit: {exc}"

    def watch_plugin() -> None:
        """Once the plugin has ended: end a server it left (one a command stopped stays
        stopped), then this supervisor's command, swept as on a timeout."""
        import _thread

        def wait() -> None:
            readable(watch, None)
            if os.getppid() == server:
                os.kill(server, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGTERM)

        _thread.start_new_thread(wait, ())

    return supervise(config, sock, report, lambda: readable(watch, 0), watch_plugin)


def _read_config(sock: int, watch: int, select: ModuleType) -> bytes:
    """The configuration, to its end; nothing (and so no command) once the plugin has ended:
    a fork of the plugin may hold its end of ``sock`` open."""
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(watch, select.POLLIN)
    while True:
        if any(fd == watch for fd, _ in poller.poll()):
            return b""
        chunk = os.read(sock, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _take_state(state: dict[str, object], resource: ModuleType) -> None:
    """The plugin's process state as it was when it started the command (the server's is
    as it was when the server started): umask, resource limits, priority, CPUs."""
    if "umask" in state:
        os.umask(int(state["umask"]))  # type: ignore[call-overload]
    for number, limits in state.get("limits", ()):  # type: ignore[attr-defined]
        try:
            resource.setrlimit(number, limits)
        except (OSError, ValueError):
            pass
    try:
        if "nice" in state:
            os.setpriority(os.PRIO_PROCESS, 0, int(state["nice"]))  # type: ignore[call-overload]
        cpus = state.get("cpus")
        if isinstance(cpus, list) and cpus:
            os.sched_setaffinity(0, cpus)
    except OSError:
        pass


def _join(path: str) -> bool:
    """Move this (single-threaded) process into the cgroup at ``path``: by its one thread
    where the hierarchy lists threads (cgroup v1, no RCU grace period to wait for)."""
    for name, value in (("tasks", "0"), ("cgroup.procs", str(os.getpid()))):
        if os.path.exists(f"{path}/{name}"):
            try:
                with open(f"{path}/{name}", "w", encoding="ascii") as f:
                    f.write(value)
            except OSError:
                return False
            return True
    return False


#: The signals that end the wait for a command: the plugin's stop (SIGTERM), an interrupt,
#: and every other one whose default would end or stop the supervisor. Only its command, or
#: something else of this user, sends those: taken as a stop, the command is swept and is an
#: error, where the default would have left it running, unswept and past its timeout. Left
#: out: what cannot be blocked, SIGCONT (taken apart: see _WAKES), what is ignored by
#: default, and the signals the C library keeps for itself.
_STOPS = tuple(
    sorted(
        set(signal.valid_signals())
        - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT, signal.SIGCHLD}
        - {signal.SIGURG, signal.SIGWINCH}
    )
)
#: What the wait takes, synchronously: the stops, a child's end, and SIGCONT. They stay
#: blocked from before the command starts to the report, so none can land between two
#: statements (a handler that raised there lost the report) and none is taken while the
#: command starts. A blocked SIGCONT still continues the process, and stays pending: it is
#: how the supervisor learns it was stopped (SIGSTOP cannot be blocked), and a supervisor
#: that was stopped cannot tell when its command ended, so its command is an error.
_WAKES = (*_STOPS, signal.SIGCHLD, signal.SIGCONT)
#: How far past its command's deadline the supervisor may first look again before the
#: command's end can no longer be placed before the deadline: a wait that runs looks at it
#: within milliseconds, one frozen (a cgroup freezer stops it without a signal) does not.
_HELD_S = 0.25
#: The signals a command starts with at their default, unblocked, however pytest itself was
#: started: the supervisor's interpreter ignores SIGPIPE (``yes | head`` would fail) and
#: SIGXFSZ (a write past the file-size limit would be an error the command could go on
#: from), and a pytest started as a background job of a script ignores SIGINT and SIGQUIT,
#: one under ``nohup`` SIGHUP. The command is the same wherever the run was started.
_RESTORED = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


def _wait(child: int, timeout: object) -> tuple[int | None, bool, str]:
    """Wait for the command: its exit code (None if it did not end), whether it timed out,
    and what ended the wait from outside (``"interrupted"``: the supervisor was told to
    stop; ``"stopped"``: it was stopped and continued, so the command's end cannot be
    placed before or after its deadline). A command that has ended by the time its
    deadline is looked at, with the supervisor never stopped, has ended, not timed out."""
    deadline = None if timeout is None else time.monotonic() + max(float(timeout), 0.001)  # type: ignore[arg-type]
    while True:
        code, children = _reap_ready(child)
        now = time.monotonic()
        late = deadline is not None and now >= deadline
        if signal.SIGCONT in signal.sigpending():  # it was stopped since the command started
            return code, late, "stopped"
        if deadline is not None and now >= deadline + _HELD_S:
            # This wait was held far past the deadline (frozen by a cgroup freezer, which
            # sends no signal): an end it finds now may have come after the deadline.
            return code, True, "stopped"
        if code is not None or not children:
            return code, False, ""
        if late:
            return None, True, ""
        left = None if deadline is None else deadline - time.monotonic()
        taken = signal.sigwaitinfo(_WAKES) if left is None else signal.sigtimedwait(_WAKES, left)
        if taken is None or taken.si_signo == signal.SIGCHLD:
            continue
        if taken.si_signo == signal.SIGCONT:
            late = deadline is not None and time.monotonic() >= deadline
            return None, late, "stopped"
        return None, False, "interrupted"


def _reap_ready(child: int) -> tuple[int | None, bool]:
    """Reap every child that has ended (the command, and what a subreaper inherits): the
    command's exit code if it was among them, and whether any child is left."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code, False
        if pid == 0:
            return code, True
        if pid == child:
            code = os.waitstatus_to_exitcode(status)


def _start(argv: list[str], config: dict[str, object]) -> tuple[int, str]:
    """The command started: its pid, or what could not be done (its folder entered, its
    program run)."""
    try:
        return _spawn(argv, str(config["cwd"]), config["env"], int(config["out_fd"])), ""  # type: ignore[arg-type,call-overload]
    except OSError as exc:
        what = "its folder" if exc.filename == config["cwd"] else "the program"
        return -1, f"{what}: {exc.strerror or exc}: {exc.filename}"


def supervise(
    config: dict[str, object],
    status_fd: int,
    report: dict[str, object],
    plugin_gone: Callable[[], bool],
    watch: Callable[[], None] | None = None,
) -> int:
    """Run the configured command to its end, sweep what it left, report on ``status_fd``.
    ``plugin_gone`` says whether the plugin has ended (then its cgroup is removed here);
    ``watch``, started before the command, ends the wait when the plugin ends."""
    argv: list[str] = config["argv"]  # type: ignore[assignment]
    cgroup = Cgroup(str(config.get("cgroup") or ""))

    def finish(**fields: object) -> int:
        if plugin_gone():  # the plugin cannot remove the cgroup: removed for it
            cgroup.leave()
            cgroup.remove()
        report.update(fields)
        os.write(status_fd, marshal.dumps(report))
        return 0

    if config.get("refuse"):  # a bound the plugin could not set: the command does not start
        return finish(returncode=None, exec_error=str(config["refuse"]))
    # Blocked before anything starts (see _WAKES); the command starts with none blocked.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an ignored one would reap the command
    _set_libc_signals(ignored=True)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _WAKES)
    problem = ""
    if watch is not None:  # before the command: one that cannot be watched does not start
        try:
            watch()  # its thread keeps the stops blocked: they come to this one
        except (RuntimeError, OSError) as exc:
            problem = f"its supervisor could not watch the plugin: {exc}"
    child = -1
    if not problem:
        child, problem = _start(argv, config)
    if problem:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return finish(returncode=None, exec_error=problem)
    code, timed_out, cut = _wait(child, config.get("timeout"))
    if code is None or cut:  # timed out or ended from outside: a grace period, then the sweep
        _signal_all(sorted(set(children_of(os.getpid())) | set(cgroup.members())), signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            try:
                pid, status = os.waitpid(child, os.WNOHANG)
            except ChildProcessError:  # reaped by the wait the stop cut short
                break
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.005)
    survivors, unended = sweep(cgroup, float(config.get("sweep_s") or 10.0))  # type: ignore[arg-type]
    if code is None:
        try:
            _, status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
    return finish(
        returncode=code,
        timed_out=timed_out,
        interrupted=cut == "interrupted",
        stopped=cut == "stopped",
        survivors=survivors,
        unended=unended,
    )


if __name__ == "__main__":
    sys.exit(main())
