"""Running commands (agent steps, gate commands) in their own process group.

A command gets a new session, so a timeout kills it *and* everything it started; its output
goes to a temporary file, so a chatty command costs disk, not memory, and only its tail is kept.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import _faults

#: How many lines of a command's output an attempt record keeps.
TAIL_LINES = 40
_KEEP_BYTES = 256 * 1024
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)


@dataclass(frozen=True)
class CommandResult:
    """How a command ended, with the tail of what it printed (secrets masked)."""

    command: str
    returncode: int
    output: str
    duration_ms: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


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
def _terminate_as_exit() -> Iterator[None]:
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


def run_command(
    command: str | Iterable[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float | None,
    started: list[int] | None = None,
) -> CommandResult:
    """Run ``command`` (a shell string or an argument list) and wait at most ``timeout`` s.

    On timeout the whole process group is killed and ``timed_out`` is set. The group id is
    appended to ``started`` so the caller can end stragglers the command left behind.
    """
    shell = isinstance(command, str)
    argv: str | list[str] = command if isinstance(command, str) else list(command)
    label = command if isinstance(command, str) else " ".join(argv)
    begin = time.perf_counter()
    with tempfile.TemporaryFile() as sink:
        proc = subprocess.Popen(
            argv,
            shell=shell,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if started is not None:
            started.append(proc.pid)
        _faults.point("gate")
        timed_out = False
        with _terminate_as_exit():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:
                kill_group(proc.pid)
                proc.wait()
                raise
        if timed_out:
            kill_group(proc.pid)
            proc.wait()
        size = sink.seek(0, os.SEEK_END)
        sink.seek(max(0, size - _KEEP_BYTES))
        output = sink.read().decode("utf-8", "replace")
    duration = (time.perf_counter() - begin) * 1000
    return CommandResult(label, proc.returncode, mask_secrets(output), duration, timed_out)
