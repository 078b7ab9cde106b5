"""Gate checkouts kept for the next gate run, instead of a fresh checkout of every file.

A kept checkout is brought to the next tree with :func:`~.workspace.reset_checkout`: only the
paths that differ are rewritten, everything untracked or ignored is removed (a ``.pyc`` or a
cache one gate left must never run in the next tree), and the result is verified as a
snapshot would see it; a checkout that cannot be proven clean is removed and a fresh one is
made. On a large repository that turns each gate command's checkout (and each re-test's,
inside the target's lock) from writing every file into writing the change.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import GitError
from .removal import remove_tree
from .repo import BaseRepo
from .workspace import RecycleFailed, checkout_with_index, reset_checkout


class GateCheckouts:
    """The checkouts one run keeps under its private directory (``keep`` at most)."""

    def __init__(self, repo: BaseRepo, root: Path, *, keep: int = 4) -> None:
        self.repo = repo
        self.root = root
        self.keep = keep
        #: Kept checkouts: the folder, its index, and the tree it was last brought to.
        self._free: list[tuple[Path, Path, str]] = []
        self._lock = threading.Lock()
        #: How many checkouts were reused rather than made afresh (for the benchmark).
        self.reused = 0

    @contextmanager
    def checkout(self, tree: str, name: str) -> Iterator[Path]:
        """A clean checkout of exactly ``tree`` for one command; kept afterwards for reuse
        unless the command's run raised (then removed)."""
        with self._lock:
            found = self._free.pop() if self._free else None
        taken: tuple[Path, Path] | None = None
        if found is not None:
            path, index, current = found
            try:
                reset_checkout(self.repo, path, index, tree, current=current)
                taken = (path, index)
                self.reused += 1
            except (RecycleFailed, GitError, OSError):
                _remove((path, index))
        if taken is None:
            taken = checkout_with_index(self.repo, tree, self.root, name)
        kept = False
        try:
            yield taken[0]
            with self._lock:
                if len(self._free) < self.keep:
                    self._free.append((*taken, tree))
                    kept = True
        finally:
            if not kept:
                _remove(taken)

    def close(self) -> None:
        """Remove every kept checkout."""
        with self._lock:
            free, self._free = self._free, []
        for path, index, _tree in free:
            _remove((path, index))


def _remove(taken: tuple[Path, Path]) -> None:
    remove_tree(taken[0])
    taken[1].unlink(missing_ok=True)
