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


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block is done, then deliver it.

    A ref move and the working-tree update that follows it finish together or not at all;
    an interrupt that arrives in between is raised as ``KeyboardInterrupt`` right after.
    Outside the main thread signals cannot be handled, and the block runs as it is.
    """
    import threading

    global _holding
    if threading.current_thread() is not threading.main_thread() or _holding:
        yield  # another thread's, or inside another such block: that one delivers it
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    _holding = True
    try:
        yield
    finally:
        _holding = False
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


#: Whether an :func:`uninterrupted` block holds Ctrl-C now (the main thread's; they nest).
_holding = False
