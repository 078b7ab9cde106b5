"""This run's directories under a user-chosen ``--agentgate-workdir``, and tidying old ones.

Each run gets ``run-<id>``, marked with a file held under a shared ``flock`` until the run
ends, so no prune (by another run or ``agentgate prune``) removes a live run.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._constants import RUN_MARKER


def run_dir_path(root: Path, run_id: str) -> Path:
    """Where this run's directory is under ``root`` (made by :func:`run_dir`)."""
    return root.resolve() / f"run-{run_id[:12]}"


def run_dir(root: Path, run_id: str, held: list[int]) -> Path:
    """This run's directory under a user-chosen workdir, marked so prune knows it is ours.

    The marker is held with a shared ``flock`` until the run ends (its descriptor goes into
    ``held``), so no prune (by another run or ``agentgate prune``) removes a live run.
    """
    import fcntl

    path = run_dir_path(root, run_id)
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / RUN_MARKER, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.utime(fd)
    held.append(fd)
    return path


def prune_old_runs(root: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` run directories under ``root`` (never a live one)."""
    from ..maintenance.prune import old_runs
    from ..sandbox.removal import remove_tree

    for path in old_runs(root.expanduser().resolve(), keep):
        remove_tree(path)


def release(held: list[int]) -> None:
    """Let go of the marks of this run's directories."""
    while held:
        os.close(held.pop())
