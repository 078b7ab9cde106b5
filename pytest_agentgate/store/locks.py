"""The plugin's lock per (repository, ref): its own writers, one at a time.

An ``flock`` on a file in the plugin's own directory, taken blocking: the kernel wakes the
next waiter the moment the holder lets go (nothing polls), and drops the lock when the
holder dies, so a killed process never leaves it held. The compare-and-swap on every ref
move is what makes a move safe against everybody else; this lock only keeps the plugin's
own processes (pytest-xdist workers, parallel jobs, the command) from working against each
other.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .. import _faults
from ..git.repo import BaseRepo

#: How often a waiter that may be done without the lock looks again (seconds: the first
#: look, doubling up to the last). Each look is a ``stat`` and a non-blocking ``flock``.
UNLESS_POLL_S = (0.002, 0.02)


@contextmanager
def ref_lock(repo: BaseRepo, ref: str) -> Iterator[float]:
    """Hold the plugin's lock for ``ref``; yields how long the wait took, in ms.

    A Ctrl-C while waiting interrupts the wait (``KeyboardInterrupt``), holding nothing.
    """
    begin = time.perf_counter()
    fd = _open(repo, ref)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            _faults.point("locked")
            yield (time.perf_counter() - begin) * 1000
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def ref_lock_unless(repo: BaseRepo, ref: str, done: Callable[[], bool]) -> Iterator[float | None]:
    """Hold the plugin's lock for ``ref``, or give up waiting as soon as ``done()`` is true:
    yields how long the wait took (ms), or None when ``done()`` ended it, holding nothing.

    For a queued attempt: its verdict may come while another process holds the lock for
    the next batch, and it must not wait a whole re-test to read it. The blocking ``flock``
    has no way to be woken by that, so this looks, cheaply, a few dozen times a second.
    """
    begin = time.perf_counter()
    fd = _open(repo, ref)
    try:
        pause = UNLESS_POLL_S[0]
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if done():
                    yield None
                    return
                time.sleep(pause)
                pause = min(pause * 2, UNLESS_POLL_S[1])
                continue
            try:
                _faults.point("locked")
                yield (time.perf_counter() - begin) * 1000
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return
    finally:
        os.close(fd)


def held(repo: BaseRepo, ref: str) -> bool:
    """Whether another process holds the lock for ``ref`` now (a hint: it may be let go
    the moment after)."""
    fd = _open(repo, ref)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _open(repo: BaseRepo, ref: str) -> int:
    folder = repo.private_dir / "locks"
    folder.mkdir(exist_ok=True)
    path = folder / f"{ref.replace('/', '%2F')}.lock"
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
