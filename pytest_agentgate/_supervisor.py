"""The supervisor: a small process between the plugin and every command it runs for an agent.

Run as ``python -I -S _supervisor.py`` with its configuration (the command's argument list,
environment, timeout, descriptors) as JSON on standard input, where no other process can
read it. It imports nothing of the package (it must start fast and trust nothing on
``sys.path``), and it is never pytest itself: a child subreaper collects every orphan of its
subtree with ``waitpid(-1)``, which inside pytest would steal the exit statuses that
``subprocess`` waits for.

What it guarantees, sandbox or not:

- it is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a descendant that calls ``setsid``
  or double-forks is still its child; when the command ends (pass, fail or timeout) every
  process left in its subtree is killed and reaped before the supervisor reports;
- with a pids cgroup it may create, the command's processes are capped and the sweep also
  reads the cgroup, so nothing is missed;
- it dies with the plugin (``PR_SET_PDEATHSIG``): a SIGKILLed pytest leaves no gate running;
- the command's exit status reaches the plugin on a pipe only the supervisor holds, so the
  command cannot forge it; a supervisor killed before it reports is a lost status, which the
  plugin judges an error.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 0.5
#: In the command line, where the sandbox's status descriptor goes (chosen here, when free).
STATUS_PLACEHOLDER = "@AGENTGATE_STATUS_FD@"


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """This process's direct children (orphans of its subtree are reparented to it)."""
    me = os.getpid()
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        tasks = []
    listed = False
    for tid in tasks:
        try:
            with open(f"/proc/{me}/task/{tid}/children", "rb") as f:
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
        if int(stat[stat.rindex(b")") + 2 :].split()[1]) == me:
            found.append(int(name))
    return found


class Cgroup:
    """A pids cgroup of the command's own, when this process may make one (root, delegated)."""

    def __init__(self, pids_max: int | None) -> None:
        self.path = ""
        self.parent = ""
        self.problem = "no process cap asked for"
        if pids_max is None:
            return
        try:
            self.parent, self.path = self._make(pids_max)
            self.problem = ""
        except (OSError, ValueError) as exc:
            self.problem = f"no pids cgroup could be made: {exc}"

    @staticmethod
    def _make(pids_max: int) -> tuple[str, str]:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
        root = where = ""
        for line in lines:
            _, controllers, at = line.split(":", 2)
            if "pids" in controllers.split(","):
                root, where = "/sys/fs/cgroup/pids", at
                break
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
        path = f"{parent}/agentgate-{os.getpid()}-{time.monotonic_ns()}"
        os.mkdir(path, 0o755)
        try:
            with open(f"{path}/pids.max", "w", encoding="ascii") as f:
                f.write(str(pids_max))
            with open(f"{path}/cgroup.procs", "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
        except OSError:
            os.rmdir(path)
            raise
        return parent, path

    def members(self) -> list[int]:
        if not self.path:
            return []
        try:
            with open(f"{self.path}/cgroup.procs", encoding="ascii") as f:
                return [int(p) for p in f.read().split() if int(p) != os.getpid()]
        except OSError:
            return []

    def close(self) -> None:
        if not self.path:
            return
        with (
            contextlib.suppress(OSError),
            open(f"{self.parent}/cgroup.procs", "w", encoding="ascii") as f,
        ):
            f.write(str(os.getpid()))
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.01)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def sweep(cgroup: Cgroup) -> int:
    """Kill and reap every process left in the subtree; return how many there were."""
    killed: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = set(_children()) | set(cgroup.members())
        if not left:
            break
        killed |= left
        _signal_all(sorted(left), signal.SIGKILL)
        time.sleep(0.002)
        _reap()
    _reap()
    return len(killed)


class _Stop(Exception):
    """A signal that ends the wait: SIGALRM (the timeout), SIGTERM or SIGINT (the plugin)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def _read_all(fd: int) -> bytes:
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    return b"".join(chunks)


def main() -> int:  # noqa: PLR0915 - one straight story, start to report
    config = json.loads(sys.stdin.buffer.read())
    os.close(0)
    status_fd = int(config["status_fd"])
    argv: list[str] = config["argv"]
    subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(config["parent"]):  # the plugin died before the death signal was set
        return 1
    cgroup = Cgroup(config.get("pids_max"))
    report: dict[str, object] = {
        "subreaper": subreaper,
        "pids_cgroup": bool(cgroup.path),
        "pids_problem": cgroup.problem,
    }

    def finish(**fields: object) -> int:
        cgroup.close()
        report.update(fields)
        os.write(status_fd, (json.dumps(report) + "\n").encode())
        return 0

    # The sandbox's own status (did it start the command, with which exit code) comes on a
    # pipe of the supervisor's, never on one the command could write.
    if config.get("fsize_max"):  # inherited by the command: no file it writes grows past it
        import resource

        limit = int(config["fsize_max"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    json_r = -1
    pass_fds: tuple[int, ...] = ()
    if STATUS_PLACEHOLDER in argv:
        json_r, json_w = os.pipe()
        os.set_inheritable(json_w, True)
        pass_fds = (json_w,)
        argv = [str(json_w) if arg == STATUS_PLACEHOLDER else arg for arg in argv]
    try:
        proc = subprocess.Popen(
            argv,
            cwd=config["cwd"],
            env=config["env"],
            stdin=subprocess.DEVNULL,
            stdout=int(config["out_fd"]),
            stderr=subprocess.STDOUT,
            close_fds=True,
            pass_fds=pass_fds,
        )
    except OSError as exc:
        return finish(returncode=None, exec_error=f"{exc.strerror or exc}: {argv[0]}")
    if pass_fds:
        os.close(pass_fds[0])
    code: int | None = None
    timed_out = interrupted = False
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
        signal.signal(sig, _stop)
    if config.get("timeout") is not None:
        signal.setitimer(signal.ITIMER_REAL, max(float(config["timeout"]), 0.001))
    try:
        while code is None:
            pid, status = os.waitpid(-1, 0)
            if pid == proc.pid:
                code = os.waitstatus_to_exitcode(status)
    except _Stop as stop:
        timed_out = stop.args[0] == signal.SIGALRM
        interrupted = not timed_out
    except ChildProcessError:
        pass
    signal.setitimer(signal.ITIMER_REAL, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
        signal.signal(sig, signal.SIG_IGN)
    if code is None:  # timed out or ended from outside: a grace period, then the sweep
        _signal_all(sorted(set(_children()) | set(cgroup.members())), signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.005)
    survivors = sweep(cgroup)
    if code is None:
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(proc.pid, 0)
            code = os.waitstatus_to_exitcode(status)
    if json_r >= 0:
        lines = _read_all(json_r).decode("utf-8", "replace").splitlines()
        report["sandbox_status"] = [json.loads(x) for x in lines if x.strip().startswith("{")]
    return finish(
        returncode=code, timed_out=timed_out, interrupted=interrupted, survivors=survivors
    )


if __name__ == "__main__":
    sys.exit(main())
