"""Which landings a later move undid: a revert of an attempt, or a rollback past it.

An attempt's record says ``promoted`` for good; whether what it landed is still on the
target is read from the moves since, as the operations log holds them: a ``revert`` commit
names the attempt commit it reverts (``Agentgate-Reverts``), a ``rollback`` commit the
commit it restores (``Agentgate-Rollback-To``), which undoes every landing after that commit
and before the rollback.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import AgentgateError
from . import oplog
from .records import parse_trailers

if TYPE_CHECKING:
    from ..git.repo import BaseRepo
    from .attempts import AttemptInfo


def undone(repo: BaseRepo, attempts: Iterable[AttemptInfo]) -> dict[str, str]:
    """Each promoted attempt (by record ref) that a later move undid: what undid it
    (``reverted by <commit>`` or ``rolled back by <commit>``)."""
    landed = {a.record_ref: a for a in attempts if a.verdict == "promoted" and a.landed}
    if not landed:
        return {}
    found: dict[str, str] = {}
    for move in oplog.read(repo.common_dir):
        if move.op not in ("revert", "rollback") or not move.new:
            continue
        try:
            said = parse_trailers(repo.history.commit_message(move.new))
        except AgentgateError:
            continue  # a move whose commit is gone (pruned): nothing to read
        reverts, back_to = said.get("Reverts"), said.get("Rollback-To")
        for ref, attempt in landed.items():
            if ref in found:
                continue
            if move.op == "revert" and reverts == attempt.record_commit:
                found[ref] = f"reverted by {move.new[:12]}"
            elif (
                move.op == "rollback"
                and back_to
                and move.old
                and _between(repo, attempt.landed, back_to, move.old)
            ):
                found[ref] = f"rolled back by {move.new[:12]}"
    return found


def _between(repo: BaseRepo, commit: str, after: str, upto: str) -> bool:
    """Whether ``commit`` landed after ``after`` and by ``upto`` (the tip a rollback moved)."""
    try:
        return repo.history.is_ancestor(commit, upto) and not repo.history.is_ancestor(
            commit, after
        )
    except AgentgateError:
        return False
