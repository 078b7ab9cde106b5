"""Gate checkouts kept for the next gate run, instead of a fresh checkout of every file.

A kept checkout is brought to the next tree with :func:`~.workspace.reset_checkout`: only the
paths that differ are rewritten, everything untracked or ignored is removed (a ``.pyc`` or a
cache one gate left must never run in the next tree), and the result is verified as a
snapshot would see it; a checkout that cannot be proven clean is removed and a fresh one is
made. On a large repository that turns each gate command's checkout (and each re-test's,
inside the target's lock) from writing every file into writing the change.

The proof that a returned checkout holds exactly its tree (:func:`~.workspace.prove_clean`:
one stat pass, the removal of what the command left, a walk for what git never lists) is
made in a background thread as soon as its command has ended, when nothing can run in it any
more: the next gate then pays only for writing the difference.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GitError
from ..git.repo import BaseRepo
from ..sandbox.removal import remove_later
from .fork import checkout_with_index
from .recycle import RecycleFailed, prove_clean, reset_checkout
from .reuse import ReuseCosts


@dataclass
class _Kept:
    """A kept checkout: its folder, its index, the tree it holds, and its proof on the way."""

    path: Path
    index: Path
    tree: str
    #: When it was first checked out (no file in it may be older).
    made: float
    thread: threading.Thread | None = None
    #: True: proven to hold ``tree``; False: not (reset whole); None: not to be reused.
    proven: list[bool | None] = field(default_factory=lambda: [None])
    #: What the proof took, in ms (a reuse's cost, though off the next gate's path).
    proof_ms: list[float] = field(default_factory=lambda: [0.0])

    def prove(self, repo: BaseRepo) -> None:
        def run() -> None:
            begin = time.perf_counter()
            try:
                # Nothing runs in it: the supervisor's sweep ended every process of the
                # command, and a command whose supervisor was killed (the sweep may not have
                # run) lost its status, which spoils the checkout (never kept).
                self.proven[0] = prove_clean(
                    repo.index(self.path, self.index),
                    self.path,
                    repo.gitlinks(self.tree),
                    made=self.made,
                )
            except BaseException:  # any failure: the checkout is not reused, never an error
                self.proven[0] = None
            self.proof_ms[0] = (time.perf_counter() - begin) * 1000

        self.thread = threading.Thread(target=run, name="agentgate-checkout", daemon=True)
        self.thread.start()

    def settled(self) -> bool | None:
        if self.thread is not None:
            self.thread.join()
        return self.proven[0]


class GateCheckouts:
    """The checkouts one run keeps under its private directory (``keep`` at most).

    With ``costs``, a checkout is kept only while reusing one (bringing it over, and its
    proof, though that is off the next gate's path: on two cores it is not free) has cost
    no more than a fresh checkout (see :class:`~.reuse.ReuseCosts`); without, always."""

    def __init__(
        self, repo: BaseRepo, root: Path, *, keep: int = 4, costs: ReuseCosts | None = None
    ) -> None:
        self.repo = repo
        self.root = root
        self.keep = keep
        self.costs = costs
        self._free: list[_Kept] = []
        self._lock = threading.Lock()
        #: Checkouts in use whose command ended badly: removed, never kept.
        self._spoiled: set[Path] = set()
        #: How many checkouts were reused rather than made afresh (for the benchmark), and
        #: how many of those were brought over by the paths that differ alone.
        self.reused = 0
        self.brought_over = 0

    @contextmanager
    def checkout(self, tree: str, name: str) -> Iterator[Path]:
        """A clean checkout of exactly ``tree`` for one command; kept afterwards for reuse
        unless the command's run raised (then removed)."""
        with self._lock:
            found = self._free.pop() if self._free else None
        taken: tuple[Path, Path] | None = None
        made = time.time() - 1  # file times are whole seconds where git writes them
        begin = time.perf_counter()
        if found is not None:
            made = found.made
            proven = found.settled()
            try:
                if proven is None:
                    raise RecycleFailed(found.path, "its proof failed")
                by_difference = reset_checkout(
                    self.repo, found.path, found.index, tree, current=found.tree, proven=proven
                )
                taken = (found.path, found.index)
                self.reused += 1
                self.brought_over += by_difference
                self._note("recycled", begin, found.proof_ms[0])
            except (RecycleFailed, GitError, OSError):
                _remove((found.path, found.index))
        if taken is None:
            made, begin = time.time() - 1, time.perf_counter()
            taken = checkout_with_index(self.repo, tree, self.root, name)
            self._note("fresh", begin)
        kept = False
        try:
            yield taken[0]
            with self._lock:
                spoiled = taken[0] in self._spoiled
                self._spoiled.discard(taken[0])
                if not spoiled and len(self._free) < self.keep and self._reuse_pays():
                    entry = _Kept(*taken, tree, made)
                    entry.prove(self.repo)  # its command has ended: nothing runs in it now
                    self._free.append(entry)
                    kept = True
        finally:
            if not kept:
                _remove(taken)

    def _note(self, way: str, begin: float, more_ms: float = 0.0) -> None:
        if self.costs is not None:
            with self._lock:  # gates run side by side (--agentgate-gate-jobs)
                self.costs.note(way, (time.perf_counter() - begin) * 1000 + more_ms)

    def _reuse_pays(self) -> bool:
        return self.costs is None or self.costs.recycle_next()

    def spoil(self, path: Path) -> None:
        """The command in the checkout at ``path`` ended badly (its status lost, a timeout):
        that checkout is removed afterwards, never reused."""
        with self._lock:
            self._spoiled.add(path)

    def close(self) -> None:
        """Remove every kept checkout (once its proof, if under way, has ended)."""
        with self._lock:
            free, self._free = self._free, []
        for entry in free:
            entry.settled()
            _remove((entry.path, entry.index))


def _remove(taken: tuple[Path, Path]) -> None:
    """Best effort, in the background (nothing runs in it, nothing will use it again): what
    cannot be removed stays for the run's clean-up, never an error of the gate that happens
    to come next."""
    with contextlib.suppress(Exception):
        taken[1].unlink(missing_ok=True)
        remove_later(taken[0])
