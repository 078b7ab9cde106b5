"""Moves of a target that no agentgate record accounts for (a person's push, a commit by
hand): noted once each in the operations log and on the attempt that met them, never an
error (a landing merges on top of such a move, never over it)."""

from __future__ import annotations

import contextlib

from ..git.repo import BaseRepo
from ..store import attempts, oplog
from .remote_branch import RemoteBranch
from .target import LocalBranch, Target

#: The operations whose lines account for a tip.
_OURS = ("promote", "rollback", "revert", "pending", "external-move")


class ExternalMoves:
    """The tips of one target this run has already judged, and how to judge a new one."""

    def __init__(self, repo: BaseRepo, target: Target, log: oplog.OpLog) -> None:
        self.repo, self.target, self.log = repo, target, log
        self.known: set[str] = set()

    def note(self, tip: str) -> str | None:
        """Log (once) a target tip that no agentgate record accounts for; say how it came.

        Judged by the plugin's own records, never by reflog text (anyone can write that): a
        tip is the plugin's when an attempt record names it as landed, or the operations log
        has it as the end of a promotion, rollback, revert or pending move. The tip found the
        first time the plugin meets a target is where it starts, not a move.
        """
        if not isinstance(self.target, LocalBranch | RemoteBranch) or not self.target.promotes:
            return None
        if tip in self.known:
            return None
        self.known.add(tip)
        ref = self.target.ref
        # A server's branch: its moves are logged by the branch's name there, its pending
        # lines by the local mirror.
        refs = {ref, self.target.moved_ref}
        used_before = False
        for line in self.log.read():
            if line.ref not in refs:
                continue
            used_before = True
            if line.new == tip and line.op in _OURS:
                return None
        if not used_before or tip in {a.landed for a in attempts.list_attempts(self.repo)}:
            return None
        if isinstance(self.target, RemoteBranch) and self.target.moved_here(tip):
            return None  # another machine's landing (the server's chain of moves says so)
        if isinstance(self.target, RemoteBranch):
            how = f"pushed to {self.target.remote} outside agentgate (no record of it)"
        else:
            entry = self.repo.refs.last_reflog_entry(ref)
            how = entry[1] if entry is not None and entry[0] == tip else "no reflog entry"
        with contextlib.suppress(OSError):
            self.log.append(
                oplog.OpRecord(op="external-move", ref=ref, old=None, new=tip, note=how)
            )
        return how

    def between(self, before: str, after: str) -> str | None:
        """The newest move outside agentgate from ``before`` to ``after`` along the target's
        first parents (a person's push that a landing then merged over), noted; or None."""
        for entry in self.repo.history.first_parent_log(f"{before}..{after}"):
            how = self.note(entry.commit)
            if how:
                return how
        return None
