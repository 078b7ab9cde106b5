"""A re-test of a merged tree: what the queue's leader and the early re-tests both run.

The one interface between the landing queue and early re-tests (:mod:`.early`), so that
neither imports the other's internals to run one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..sandbox.process import Running


@dataclass(frozen=True)
class Retested:
    """What a re-test found: passed or not, why not, its output's tail, and its per-test
    results (None when the gate reports none)."""

    ok: bool
    why: str = ""
    output: str = ""
    tests: Mapping[str, str] | None = None
    #: Run early, while the batch's attempts' own gates ran (see :mod:`.early`).
    early: bool = False
    #: What the gate's pytest loaded (see :meth:`.channel.Report.fingerprint`).
    fingerprint: frozenset[str] = frozenset()
    #: Nothing ran: the attempt lands without a re-test (no gate command to run, or
    #: re-tests turned off), so a merge is not a tested tree.
    skipped: bool = False
    #: It failed through the harness before the command ran (its program could not be
    #: executed, its sandbox could not start: ``CheckResult.never_ran``), so nothing of the
    #: tree ran; a command that ran and lost its exit status is the tree's failure, as the
    #: tree could have ended its own supervisor.
    fault: bool = False


def no_retest(
    tree: str,
    tip: str,
    bases: Sequence[str],
    *,
    ahead: bool = False,
    running: Running | None = None,
    reuse: Retested | None = None,
) -> Retested:
    """The re-test of a batch that lands untested: passes, and says that nothing ran."""
    return Retested(True, skipped=True)


class BatchRetest(Protocol):
    """A re-test of a merged tree that stands on ``tip``, holding the tests that passed on
    the ``bases`` of the attempts in it, and on ``tip`` too unless ``ahead`` (an early re-test,
    on a tip not yet tested: see :mod:`.early`). ``running`` lets another thread
    end it. With ``reuse`` (a result of exactly ``tree``, run early, held to other bases
    and no tip: see :mod:`.early`), nothing runs when that result answers as this re-test
    would; else the tree is run again."""

    def __call__(
        self,
        tree: str,
        tip: str,
        bases: Sequence[str],
        *,
        ahead: bool = False,
        running: Running | None = None,
        reuse: Retested | None = None,
    ) -> Retested: ...
