"""A dry run's target: a scratch ref of the run's own that starts at the real target's tip and
moves as the target would, so a dry run lands nothing yet shows what would have landed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError, GitError
from ..store import oplog

if TYPE_CHECKING:
    pass

#: Where each run's scratch ref lives: ``refs/agentgate/dryruns/<run>/<branch>``.
from .remote_branch import RemoteBranch
from .target import LocalBranch, MoveNote, dryrun_ref


class DryRunRef(LocalBranch):
    """``refs/agentgate/dryruns/<run>/<b>``: what would have landed this run; no branch moves.

    Each run has a scratch ref of its own, made from its source's tip (a local or a remote
    branch) by the first process of the run; every process of the run (pytest-xdist workers
    pass the same run id) then judges against what it accumulates, and two dry runs at once
    never reset each other's. (Before 0.2 one ``refs/agentgate/dryrun/<b>`` served every run:
    git refuses ``dryrun/<b>/<run>`` beside it, hence ``dryruns/``; ``agentgate prune``
    removes old scratch refs of either layout.)
    """

    promotes = False

    def __init__(
        self,
        source: LocalBranch | RemoteBranch,
        log: oplog.OpLog,
        *,
        agent: str = "agent",
        run_id: str = "",
    ) -> None:
        super().__init__(source.repo, source.branch, log, ref=dryrun_ref(source.branch, run_id))
        self.source = source
        #: Who the run's own start is logged as (the run's agent).
        self.agent = agent

    @property
    def label(self) -> str:
        return f"dryrun/{self.branch}"

    def start(self, run_id: str) -> list[str]:
        """Make this run's scratch ref at the source's tip, unless a process of the run did."""
        from ..store import pending

        self.ref = dryrun_ref(self.branch, run_id)
        with self.lock():
            settled = pending.settle(self.repo, self.ref)
            if self.tip() is not None:
                return settled  # another process of this run made it
            tip = self.source.tip()
            if tip is None:
                raise ConfigError(f"branch {self.branch!r} is gone from {self.source.label}")
            result = self.move(
                tip,
                self.repo.null_oid,
                "agentgate dry run starts",
                MoveNote("dryrun-reset", agent=self.agent, measure=False),
            )
            if not result.moved:
                raise GitError(["update-ref", self.ref], 1, "scratch ref made meanwhile")
            if result.problem:  # the ref stands, but the run must not go on unlogged
                raise OSError(result.problem)
        return settled

    def check_move(self, old: str, new: str) -> bool:
        return False  # nobody has a scratch ref checked out
