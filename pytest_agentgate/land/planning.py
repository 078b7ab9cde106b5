"""The queue's decisions as pure functions over plain values: which attempts a batch waits
for, which prefix of a failing batch lands, which chain needs no re-test. No git, no files,
no clock of their own: the leader reads the world and acts; these decide, and are tested
in milliseconds (``tests/unit/test_planning_unit.py``), the way pytest-xdist tests its
schedulers apart from its workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from .landings import judged_as_is

if TYPE_CHECKING:
    from .queue_folder import Link

#: A batch waits for attempts whose gate began within this share of a gate's duration of
#: its own latest, or within ``GATHER_FLOOR_S``, whichever is more (a loaded machine spreads
#: the starts of gates begun together).
GATHER_SHARE = 0.3
GATHER_FLOOR_S = 0.5
#: The longest a batch waits, and the shortest (seconds; between them, 1.5 gates).
GATHER_MAX_S = 30.0
GATHER_MIN_S = 0.2


class Gather(NamedTuple):
    """How a batch waits: for attempts whose gate began by ``began_by`` (seconds since the
    epoch), for at most ``wait_s`` seconds."""

    began_by: float
    wait_s: float


def gather(began: Sequence[float], now: float, gate_s: float) -> Gather:
    """The wait of a batch whose own attempts' gates began at ``began`` (this machine's;
    0: unknown), its gate taking ``gate_s``: the attempts about to finish a gate begun with
    theirs are worth waiting for; one begun later is not (the whole batch would wait most of
    a gate to spare it a re-test it can have on its own meanwhile)."""
    latest = max((b or now - gate_s) for b in began) if began else now - gate_s
    return Gather(
        latest + max(GATHER_FLOOR_S, GATHER_SHARE * gate_s),
        min(GATHER_MAX_S, max(GATHER_MIN_S, 1.5 * gate_s)),
    )


class Bisected(NamedTuple):
    """What of a chain lands: its first ``good`` links; ``culprit`` (1-based) the first whose
    prefix failed (0: none did, the whole chain passed)."""

    good: int
    culprit: int


def bisect(n: int, passes: Callable[[int], bool]) -> Bisected:
    """The longest passing prefix of a chain of ``n`` links, given ``passes(k)`` (the tip
    plus the first ``k`` links passes; ``passes(0)`` is taken as true): the whole chain when
    its top passes, else a binary search for the first failing prefix, about ``log2(n)``
    more calls. (A prefix can pass while a shorter one fails, when a later change fixes an
    earlier one's break: the search lands a passing prefix, never a failing one.)"""
    if n == 0 or passes(n):
        return Bisected(n, 0)
    lo, hi = 0, n  # prefix lo passes, prefix hi fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return Bisected(lo, hi)


def as_judged(tip: str, links: Sequence[Link]) -> bool:
    """Whether each of ``links`` (from ``tip`` up) lands exactly its attempt's own tree,
    each one judged here by its own gate: then their top needs no re-test."""
    head = tip
    for entry, commit, _tree, kind in links:
        if entry.foreign or not judged_as_is(head, entry.base, kind):
            return False
        head = commit
    return True
