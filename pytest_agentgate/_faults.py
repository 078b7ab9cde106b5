"""Named fault points, so the adversarial suite can kill a real run at an exact moment.

``AGENTGATE_FAULT=<point>`` makes the process SIGKILL itself when it reaches ``<point>``;
``<point>:int`` sends SIGINT to its whole process group instead, as a Ctrl-C at a terminal does;
``<point>:enospc`` (or ``:eio``) makes the write at that point fail as a full (or failing) disk
would. Unset, a point costs one dict lookup.
Points: ``gate`` (a gate command is running), ``locked`` (the promotion lock is held),
``merge-written`` (merge objects written, ref not moved), ``pending`` (the operations log's
pending line of a move), ``moved`` (the ref moved, nothing recorded yet), ``record`` (the
attempt record is written), ``recorded`` (the ref moved and its records written, its pending
lines not yet settled nor a queue's verdicts written), ``oplog`` (a completed move's log line), ``journal`` (the
working-tree journal), ``worktree-sync`` (the ref moved, the checked-out files not yet
updated), ``enqueued`` (a queue entry is written, its waiter not yet waiting),
``verdict-read`` (another machine's leader's verdict was read here, its waiter not yet told).
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

ENV = "AGENTGATE_FAULT"


def point(name: str) -> None:
    wanted = os.environ.get(ENV)
    if wanted is None:
        return
    if wanted == name:
        os.kill(os.getpid(), signal.SIGKILL)
    elif wanted == f"{name}:int":
        os.killpg(os.getpgrp(), signal.SIGINT)
    else:
        fail(name)


def fail(name: str) -> None:
    """Only the write-failure modes of ``point`` (``<name>:enospc``, ``<name>:eio``)."""
    wanted = os.environ.get(ENV)
    if wanted in (f"{name}:enospc", f"{name}:eio"):
        code = errno.ENOSPC if wanted.endswith("enospc") else errno.EIO
        raise OSError(code, f"{os.strerror(code)} (injected at {name})")


#: What :func:`uninterrupted` holds: Ctrl-C, SIGTERM (how CI cancels a job), SIGHUP (a
#: terminal closed).
_HELD = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)  # put back in this order: Ctrl-C last


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block is done, however it ends, then
    deliver each as it would have been delivered (Ctrl-C raises ``KeyboardInterrupt``; a
    SIGTERM nobody handles ends the process, only now). A signal ignored, or handled
    outside Python, is left as it is.

    A ref move and the working-tree update that follow it finish together or not at all,
    and a lock file the plugin takes itself is never left behind by a signal. Outside the
    main thread signals cannot be handled, and the block runs as it is (there, a Python
    signal handler never runs; an unhandled SIGTERM ends the process as it would anyway).
    """
    import threading

    global _holding
    if threading.current_thread() is not threading.main_thread() or _holding:
        yield  # another thread's, or inside another such block: that one delivers it
        return
    received: list[int] = []
    previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int] = {}
    _holding = True
    try:
        for sig in _HELD:
            current = signal.getsignal(sig)
            if current is None or current == signal.SIG_IGN:
                continue
            previous[sig] = current
            signal.signal(sig, lambda signum, frame: received.append(signum))
        yield
    finally:
        _holding = False
        try:
            for held, handler in previous.items():  # Ctrl-C's last: one now is then handled
                signal.signal(held, handler)
        finally:
            _deliver(list(dict.fromkeys(received)))


def _deliver(numbers: list[int]) -> None:
    """Raise each held signal to its own handler, every one of them even when one's
    handler raises (the exceptions chain)."""
    if numbers:
        try:
            signal.raise_signal(numbers[0])
        finally:
            _deliver(numbers[1:])


#: Whether an :func:`uninterrupted` block holds its signals now (the main thread's; they nest).
_holding = False
