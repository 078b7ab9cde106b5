"""The moves that are not merges: a fast-forward, a rollback, a revert, each by
compare-and-swap under the target's lock. Every merge lands through the queue
(:mod:`.queue`), re-tested there, a batch of one when nothing else waits.

What moves, and how, is the :class:`~pytest_agentgate.land.target.Target`'s business (a branch
here, a dry run's scratch ref, a branch on a server); this module decides *what* the new tip
is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..errors import (
    GateFailed,
    MergeConflict,
    NothingToRevert,
    NothingToRollBack,
    NotNeeded,
    RefMoved,
)
from ..git.repo import Author, BaseRepo
from ..git.worktree import recover_worktree
from ..store import records
from ..store.record import Record
from .landings import Landed
from .remote_branch import RemoteBranch
from .target import LocalBranch, MoveNote, Target, check_move, for_ref

MAX_RETRIES = 20


@dataclass(frozen=True)
class Move:
    """A ref move that happened: what moved, from where, to where."""

    #: What moved, as the operations log names it (``refs/heads/main``, ``origin:refs/heads/main``).
    moved_ref: str
    old: str
    new: str
    kind: str  # fast-forward, merge, rollback, revert
    tree: str
    retested: bool = False
    lock_wait_ms: float = 0.0
    #: A problem after the ref moved (the checked-out files lag); the move itself stands.
    problem: str | None = None


# -- promotion ------------------------------------------------------------------------

#: Re-test of a merged tree (given it and the tip it merges onto): returns (passed, why it
#: failed, output tail).
Retest = Callable[[str, str], tuple[bool, str, str]]


@dataclass(frozen=True)
class PromoteOutcome:
    """What promotion did: a move, or why it did not move (conflict or failed re-test)."""

    move: Move | None
    conflicts: tuple[str, ...] = ()
    retest_failure: str | None = None
    retest_output: str = ""
    #: Nothing moved and nothing was wrong: its change was already on the target.
    already: str | None = None
    #: Nothing moved: the target is no longer at the base, and the caller merges.
    needs_queue: bool = False


def promote(
    target: Target,
    commit: str | Landed,
    base: str,
    *,
    reflog_message: str,
    expected_tip: str | None = None,
    known_objects: Sequence[str] | None = None,
    pending: Record | None = None,
    on_moved: Callable[[Move], bool] | None = None,
) -> PromoteOutcome:
    """Fast-forward ``target`` to ``commit`` (whose parent is ``base``), or say that it
    needs the queue: every merge lands through the landing queue (:mod:`.queue`). A
    :class:`~.landings.Landed` commit (a squash made on the base) keeps its kind.

    Under the target's lock, the tip is read; only at ``base`` does the target move, by
    compare-and-swap (a lost race with a move at ``base`` starts over; nothing is ever
    overwritten). Another machine leading (the server's lease held) would make this wait for
    its whole batch and then need a merge: that is the queue's too. ``expected_tip`` (what a
    preflight just read) is tried first as the old value. ``known_objects`` (what the
    snapshot added over ``base``) spares the log's object count a git process.

    Records first: with ``pending`` (what the record will say, its task and agent the
    move's in the operations log) the target writes a
    ``pending`` line before the compare-and-swap; right after the move ``on_moved`` writes
    the attempt record, then the files follow and the move's log line is written (see
    :class:`~pytest_agentgate.land.target.Target`).
    """
    repo = target.repo
    begin = time.perf_counter()
    kind = commit.kind if isinstance(commit, Landed) else "fast-forward"
    commit = commit.commit if isinstance(commit, Landed) else commit
    with target.lock() as waited:
        tip = target.tip_under_lock(expected_tip or base)
        for _ in range(MAX_RETRIES):
            if tip is None:
                raise RefMoved(target.ref, base, None)
            if tip != base:
                return PromoteOutcome(None, needs_queue=True)
            tree = repo.tree_of(commit)
            landed = Move(target.moved_ref, tip, commit, kind, tree, False, waited)

            def after_move(landed: Move = landed) -> bool:
                return on_moved(landed) if on_moved is not None else True

            note = MoveNote(
                "promote", agent=pending.agent if pending else "",
                task=pending.task if pending else "", kind=kind, record=pending,
                known_objects=known_objects, begin=begin,
            )  # fmt: skip
            try:
                with target.lease(lambda: True):
                    reflog = f"{reflog_message} ({kind})"
                    result = target.move(commit, tip, reflog, note, after_move)
            except NotNeeded:
                return PromoteOutcome(None, needs_queue=True)
            if result.moved:
                return PromoteOutcome(replace(landed, problem=result.problem))
            tip = target.tip()
    raise RefMoved(target.ref, base, target.tip())


# -- undo -----------------------------------------------------------------------------


def rollback(
    repo: BaseRepo,
    ref: str,
    to: str,
    *,
    expect: str | None,
    author: Author,
    agent: str,
    dry_run: bool = False,
    target: LocalBranch | RemoteBranch | None = None,
) -> Move:
    """A new commit on ``ref`` whose tree is exactly ``to``'s tree; history is kept.

    On a server's branch (``target`` a :class:`RemoteBranch`) the tip is fetched under the
    lock and the move is the server's compare-and-swap, as for a promotion."""
    begin = time.perf_counter()
    tree = repo.tree_of(to)
    target = target or for_ref(repo, ref)
    with target.lock():
        actual = _tip(repo, target)
        # With --expect the compare-and-swap checks the tip; without, read it first.
        tip = expect if expect is not None else actual
        if tip is None:
            raise RefMoved(_name(target), expect, tip)
        if repo.tree_of(tip) == tree:
            if actual != tip:
                raise RefMoved(_name(target), expect, actual)
            raise NothingToRollBack(target.label, tree)
        message = records.rollback_message(to, tree, agent)
        if dry_run:
            if actual != tip:
                raise RefMoved(_name(target), expect, actual)
            if isinstance(target, LocalBranch):
                check_move(repo, ref, tip, tree)
            return Move(target.moved_ref, tip, "", "rollback", tree)
        new = repo.commit_tree(tree, [tip], message, author)
        result = target.move(
            new,
            tip,
            records.rollback_reflog(to, agent),
            # The tree is ``to``'s, already stored: the move adds its commit and nothing else.
            MoveNote(
                "rollback", agent, f"rollback to {to}", "rollback", known_objects=(), begin=begin
            ),
        )
        if not result.moved:
            raise RefMoved(_name(target), tip, _tip(repo, target))
        return Move(target.moved_ref, tip, new, "rollback", tree, problem=result.problem)


def _name(target: LocalBranch | RemoteBranch) -> str:
    """The ref an error names: a local branch's ref, a server's ``remote/branch``."""
    return target.label if isinstance(target, RemoteBranch) else target.ref


def _tip(repo: BaseRepo, target: LocalBranch | RemoteBranch) -> str | None:
    """The tip now, with the target's lock held: a server's is fetched; a local branch's
    checked-out files first finish following an interrupted move."""
    if isinstance(target, RemoteBranch):
        return target.tip()
    recover_worktree(repo, target.ref)
    return repo.refs.value(target.ref)


@dataclass(frozen=True)
class Undo:
    """What a revert undoes (an attempt's landed ``commit`` and its ``base``), and the
    ``agent`` and ``task`` the revert is recorded under."""

    commit: str
    base: str
    agent: str
    task: str


def revert(
    repo: BaseRepo,
    ref: str,
    undo: Undo,
    *,
    expect: str | None,
    author: Author,
    retest: Retest | None = None,
    dry_run: bool = False,
    target: LocalBranch | RemoteBranch | None = None,
) -> Move:
    """Undo one attempt's change on top of the current target, keeping later work.

    The inverse change is merged with ``git merge-tree`` by giving it a synthetic history
    whose merge base is the attempt's own tree, so the result is "tip + (base - attempt)".
    """
    begin = time.perf_counter()
    attempt_commit, attempt_base, agent, task = undo.commit, undo.base, undo.agent, undo.task
    target = target or for_ref(repo, ref)
    with target.lock():
        tip = _tip(repo, target)
        if tip is None or (expect is not None and tip != expect):
            raise RefMoved(_name(target), expect, tip)
        helper = Author("agentgate", "agentgate@localhost")
        pivot = repo.commit_tree(repo.tree_of(attempt_commit), [], records.REVERT_PIVOT, helper)
        ours = repo.commit_tree(repo.tree_of(tip), [pivot], records.REVERT_OURS, helper)
        theirs = repo.commit_tree(
            repo.tree_of(attempt_base), [pivot], records.REVERT_THEIRS, helper
        )
        preview = repo.merge_preview(ours, theirs)
        if preview.conflicts:
            raise MergeConflict(preview.conflicts, "revert")
        if preview.tree == repo.tree_of(tip):
            raise NothingToRevert(attempt_commit)
        if retest is not None:
            ok, why, output = retest(preview.tree, tip)
            if not ok:
                raise GateFailed(why, output)
        if dry_run:
            if isinstance(target, LocalBranch):
                check_move(repo, ref, tip, preview.tree)
            return Move(target.moved_ref, tip, "", "revert", preview.tree)
        message = records.revert_message(task, attempt_commit, agent)
        new = repo.commit_tree(preview.tree, [tip], message, author)
        result = target.move(
            new,
            tip,
            records.revert_reflog(attempt_commit, agent),
            MoveNote("revert", agent, task, "revert", begin=begin),
        )
        if not result.moved:
            raise RefMoved(_name(target), tip, _tip(repo, target))
        return Move(target.moved_ref, tip, new, "revert", preview.tree, problem=result.problem)
