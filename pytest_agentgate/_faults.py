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
from collections.abc import Iterator
from contextlib import contextmanager

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
_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block is done, then deliver each as it
    would have been delivered (Ctrl-C raises ``KeyboardInterrupt``; a SIGTERM nobody
    handles ends the process, only now).

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
    previous = {}
    for sig in _HELD:
        try:
            previous[sig] = signal.signal(sig, lambda signum, frame: received.append(signum))
        except (OSError, ValueError):
            continue
    _holding = True
    try:
        yield
    finally:
        _holding = False
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, and cannot be put back
                signal.signal(sig, handler)
    for number in dict.fromkeys(received):
        if number == signal.SIGINT and previous.get(signal.SIGINT) is signal.default_int_handler:
            raise KeyboardInterrupt
        signal.raise_signal(number)


#: Whether an :func:`uninterrupted` block holds Ctrl-C now (the main thread's; they nest).
_holding = False
