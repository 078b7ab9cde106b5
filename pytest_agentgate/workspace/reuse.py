"""Whether reusing a used checkout pays here: a workspace or a gate's checkout kept, reset
to the next tree and proven clean, against a fresh checkout of it.

Reuse is for a tree that costs more to write than to compare (a large one, a slow disk:
a tenth of a fresh checkout there); a small tree on a fast file system checks out fresh in
less time than it takes to prove a used checkout clean (a third, on tmpfs at 100 files).
"""

from __future__ import annotations

import statistics


class ReuseCosts:
    """What the last fresh checkouts and reuses of one kind cost, and so which way the next
    goes: reuse while that has cost no more than a fresh checkout did, a fresh checkout
    otherwise, the other way every :attr:`PROBE_EVERY` times in case the costs moved (the
    tree grew, the cache cooled)."""

    PROBE_EVERY = 16
    KEEP = 5

    def __init__(self) -> None:
        self._ms: dict[str, list[float]] = {"fresh": [], "recycled": []}
        self._asked = 0

    def note(self, way: str, ms: float) -> None:
        """Remember that a checkout made ``way`` (``fresh``, ``recycled``) took ``ms``."""
        kept = self._ms[way]
        kept.append(ms)
        del kept[: -self.KEEP]

    def recycle_next(self) -> bool:
        """Whether a checkout handed back should be kept for the next one to reuse."""
        self._asked += 1
        fresh, recycled = (statistics.median(v) if v else None for v in self._ms.values())
        if fresh is None or recycled is None:
            return True  # not both known yet: reuse is tried
        cheaper = recycled <= fresh
        return not cheaper if self._asked % self.PROBE_EVERY == 0 else cheaper
