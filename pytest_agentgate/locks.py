"""The plugin's lock per (repository, ref): its own writers, one at a time.

filelock's lock is an ``flock`` the operating system drops when the holder dies, so a killed
process never leaves it held. It polls; the interval is short so that the worst wait under
contention stays close to the holder's own time. The compare-and-swap on every ref move is
what makes a move safe against everybody else; this lock only keeps the plugin's own
processes (pytest-xdist workers, parallel jobs, the command) from working against each other.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from . import _faults
from .repo import BaseRepo

LOCK_POLL_S = 0.002


@contextmanager
def ref_lock(repo: BaseRepo, ref: str) -> Iterator[float]:
    """Hold the plugin's lock for ``ref``; yields how long the wait took, in ms."""
    from filelock import FileLock

    folder = repo.private_dir / "locks"
    folder.mkdir(exist_ok=True)
    name = ref.replace("/", "%2F")
    begin = time.perf_counter()
    lock = FileLock(str(folder / f"{name}.lock"), timeout=-1)
    lock.acquire(poll_interval=LOCK_POLL_S)
    try:
        _faults.point("locked")
        yield (time.perf_counter() - begin) * 1000
    finally:
        lock.release()
