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
from collections.abc import Iterator
from contextlib import contextmanager

from . import _faults
from .repo import BaseRepo


@contextmanager
def ref_lock(repo: BaseRepo, ref: str) -> Iterator[float]:
    """Hold the plugin's lock for ``ref``; yields how long the wait took, in ms.

    A Ctrl-C while waiting interrupts the wait (``KeyboardInterrupt``), holding nothing.
    """
    folder = repo.private_dir / "locks"
    folder.mkdir(exist_ok=True)
    path = folder / f"{ref.replace('/', '%2F')}.lock"
    begin = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            _faults.point("locked")
            yield (time.perf_counter() - begin) * 1000
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
