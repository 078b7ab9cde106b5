"""Moving a target: promotion, rollback and revert, each by compare-and-swap under a lock.

The lock (one ``filelock`` per repository and target, in the plugin's own directory) keeps the
plugin's own writers in line; the old value on ``git update-ref`` is what makes every move
safe against anybody else. When the target is checked out in the base repository, its files
follow the ref (see :mod:`pytest_agentgate.checkout`); a remote target moves by a push with a
lease (see :mod:`pytest_agentgate.remote`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from . import _faults, oplog
from .attempts import one_line, trailer_lines
from .checkout import (
    check_worktree,
    checked_out,
    journal_path,
    linked_checkout,
    recover_worktree,
    sync_worktree,
)
from .errors import (
    AgentgateError,
    GateFailed,
    MergeConflict,
    NothingToRevert,
    NothingToRollBack,
    RefMoved,
    WorktreeBlocked,
)
from .remote import RemoteTarget
from .repo import Author, BaseRepo

LOCK_POLL_S = 0.002
MAX_RETRIES = 20


@dataclass(frozen=True)
class Move:
    """A ref move that happened: which ref, from where, to where."""

    ref: str
    old: str
    new: str
    kind: str  # fast-forward, merge, rollback, revert
    tree: str
    retested: bool = False
    lock_wait_ms: float = 0.0
    #: A problem after the ref moved (the checked-out files lag); the move itself stands.
    problem: str | None = None


def target_ref(branch: str, dry_run: bool) -> str:
    return f"refs/agentgate/dryrun/{branch}" if dry_run else f"refs/heads/{branch}"


@contextmanager
def target_lock(repo: BaseRepo, ref: str) -> Iterator[float]:
    """Hold the plugin's lock for ``ref``; yields how long the wait took, in ms.

    filelock's lock is an ``flock`` the operating system drops when the holder dies, so a
    killed process never leaves it held. It polls; the interval is short so that the worst
    wait under contention stays close to the holder's own time.
    """
    from filelock import FileLock

    folder = repo.private_dir / "locks"
    folder.mkdir(exist_ok=True)
    name = ref.replace("/", "%2F")
    begin = time.perf_counter()
    lock = FileLock(str(folder / f"{name}.lock"), timeout=-1)
    lock.acquire(poll_interval=LOCK_POLL_S)
    try:
        _faults.point("locked")
        yield (time.perf_counter() - begin) * 1000
    finally:
        lock.release()


def check_move(repo: BaseRepo, ref: str, old: str, new: str) -> bool:
    """Raise unless ``ref`` can go from ``old`` to ``new`` (a commit or a tree) losing nothing.

    Returns whether the base repository's working tree has ``ref`` checked out (its files
    must then follow). A dry run makes exactly these checks, so it refuses what a real run
    would refuse.
    """
    linked = linked_checkout(repo, ref)
    if linked is not None:
        raise WorktreeBlocked(
            linked,
            "checked out elsewhere",
            message=f"{ref} is checked out in the worktree {str(linked)!r}, whose files a move would "
            "leave behind; check out another branch there, then run again. Nothing was moved",
        )
    follow = checked_out(repo, ref)
    if follow:
        check_worktree(repo, old, new)
    return follow


def move_target(
    repo: BaseRepo,
    ref: str,
    new: str,
    old: str,
    message: str,
    *,
    update_worktree: bool = True,
    after_move: Callable[[], None] | None = None,
) -> tuple[bool, str | None]:
    """Compare-and-swap ``ref`` from ``old`` to ``new`` and bring a checked-out tree along.

    Returns (moved, problem): moved is False when the ref was not at ``old`` (nothing
    changed); problem says why the checked-out files could not follow a ref that did move
    (the journal stays, the next run finishes the update). Raises :class:`DirtyWorktree` or
    :class:`WorktreeBlocked` before moving anything. ``after_move`` runs right after the ref
    moved, before the files follow (the attempt record is written there).
    """
    follow = check_move(repo, ref, old, new) if update_worktree else False
    journal = journal_path(repo, ref)
    with _faults.uninterrupted():
        if follow:
            tmp = journal.with_suffix(".tmp")
            try:
                _faults.point("journal")
                tmp.write_text(json.dumps({"ref": ref, "old": old, "new": new}), encoding="utf-8")
                os.replace(tmp, journal)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        try:
            moved = repo.update_ref(ref, new, old, message, reflog=True)
        except BaseException:
            if follow:
                journal.unlink(missing_ok=True)
            raise
        if moved and after_move is not None:
            _faults.point("moved")
            after_move()
        if not follow:
            return moved, None
        if not moved:
            journal.unlink(missing_ok=True)
            return False, None
        try:
            _faults.point("worktree-sync")
            sync_worktree(repo, old, new)
        except (AgentgateError, OSError) as exc:
            return True, f"the checked-out files were not updated ({exc}); the next run finishes it"
        journal.unlink(missing_ok=True)
    return True, None


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


def promote(
    repo: BaseRepo,
    ref: str,
    commit: str,
    base: str,
    *,
    author: Author,
    message: str,
    reflog_message: str,
    retest: Retest | None = None,
    agent: str = "",
    task: str = "",
    expected_tip: str | None = None,
    remote: RemoteTarget | None = None,
    known_objects: Sequence[str] | None = None,
    pending: Mapping[str, object] | None = None,
    on_moved: Callable[[Move], bool] | None = None,
) -> PromoteOutcome:
    """Land ``commit`` (whose parent is ``base``) on ``ref``: fast-forward or merge.

    Under the lock, the ref is re-read. At ``base`` (or missing, for a fresh dry-run ref)
    it fast-forwards; otherwise ``commit`` is merged onto the ref's tip and, when ``retest``
    is given, the merged tree is re-tested before the ref moves. A lost compare-and-swap
    (someone outside the lock moved the ref) starts over; nothing is ever overwritten.
    ``expected_tip`` (what a preflight just read) is tried first as the ref's old value.
    ``known_objects`` (what the snapshot added over ``base``) spares the log's object count
    a git process when the move is a fast-forward.
    With ``remote``, the branch lives on a server: its tip is fetched, and the move is a push
    with a lease (the server's compare-and-swap); ``ref`` is then the local tracking ref.

    Records first: before each compare-and-swap a ``pending`` line (with ``pending``, what
    the record will say) is appended to the operations log; if that fails, nothing moves.
    Right after the move ``on_moved`` writes the attempt record, then the files follow and
    the move's own log line is written. A process that dies (or whose disk fills) anywhere
    in between leaves a pending line that the next run settles (see :mod:`.pending`).
    """
    begin = time.perf_counter()
    with target_lock(repo, ref) as waited:
        if remote is not None:
            tip: str | None = remote.fetch()
        else:
            recover_worktree(repo, ref)
            # Optimistic first round: presume the target is still at the base. The
            # compare-and-swap itself checks that, so the common fast-forward costs one git
            # call. A checked-out target is read first: its files must be checked against
            # the real tip.
            tip = repo.ref_value(ref) if checked_out(repo, ref) else expected_tip or base
        for _ in range(MAX_RETRIES):
            if tip is None:
                raise RefMoved(ref, base, None)
            if tip == base:
                new, kind, tree, retested = commit, "fast-forward", repo.tree_of(commit), False
            else:
                preview = repo.merge_preview(tip, commit)
                if preview.conflicts:
                    return PromoteOutcome(None, conflicts=preview.conflicts)
                retested = False
                if retest is not None:
                    ok, why, output = retest(preview.tree, tip)
                    retested = True
                    if not ok:
                        return PromoteOutcome(None, retest_failure=why, retest_output=output)
                new = repo.commit_tree(preview.tree, [tip, commit], message, author)
                kind, tree = "merge", preview.tree
                _faults.point("merge-written")
            where = f"{remote.remote}:refs/heads/{remote.branch}" if remote is not None else ref
            landed = Move(where, tip, new, kind, tree, retested, waited)
            uid = pending_line(repo, ref, tip, new, agent, task, pending)

            recorded: list[bool] = []

            def after_move(landed: Move = landed, recorded: list[bool] = recorded) -> None:
                if on_moved is not None:
                    recorded.append(on_moved(landed))

            if remote is not None:
                moved, problem = remote.push(new, tip, f"{reflog_message} ({kind})"), None
                if moved:
                    after_move()
            else:
                moved, problem = move_target(
                    repo, ref, new, tip, f"{reflog_message} ({kind})", after_move=after_move
                )
            if moved:
                move = Move(where, tip, new, kind, tree, retested, waited, problem)
                known = [new, *known_objects] if known_objects is not None and tip == base else None
                logged = _log(repo, "promote", move, agent, task, begin, known)
                if all(recorded):  # else the next run completes the record from this line
                    settle_line(repo, ref, uid, "pending-done")
                if logged is not None:
                    move = Move(
                        where, tip, new, kind, tree, retested, waited, _join(problem, logged)
                    )
                return PromoteOutcome(move)
            settle_line(repo, ref, uid, "pending-abandoned")
            tip = remote.fetch() if remote is not None else repo.ref_value(ref)
    raise RefMoved(ref, base, repo.ref_value(ref))


def pending_line(
    repo: BaseRepo,
    ref: str,
    old: str | None,
    new: str,
    agent: str,
    task: str,
    record: Mapping[str, object] | None,
) -> str:
    """Append the ``pending`` line of a move about to happen; return its id ("" for none).

    Raises ``OSError`` when it cannot be written: the move must then not happen.
    """
    if record is None:
        return ""
    uid = uuid.uuid4().hex
    oplog.append(
        repo.common_dir,
        oplog.OpRecord(
            op="pending",
            ref=ref,
            old=old,
            new=new,
            agent=agent,
            task=task,
            pending=uid,
            record={**record, "pid": os.getpid()},
        ),
        fault="pending",
    )
    _faults.point("pending")
    return uid


def settle_line(repo: BaseRepo, ref: str, uid: str, op: str) -> None:
    """Mark a pending move done or abandoned; best effort (the next run settles it anyway)."""
    if not uid:
        return
    with contextlib.suppress(OSError):
        oplog.append(
            repo.common_dir, oplog.OpRecord(op=op, ref=ref, old=None, new=None, pending=uid)
        )


def _join(*problems: str | None) -> str | None:
    found = [p for p in problems if p]
    return "; ".join(found) if found else None


def _log(
    repo: BaseRepo,
    op: str,
    move: Move,
    agent: str,
    task: str,
    begin: float,
    known: Sequence[str] | None = None,
) -> str | None:
    """Log a move that happened; say why when the line could not be written.

    Counting is best effort, and so is the line: a move is never undone by its log.
    """
    try:
        if known is not None:
            objects, size = repo.measure(known)
        else:
            objects, size = repo.count_new_objects(move.new, move.old)
    except AgentgateError:
        objects, size = -1, -1
    try:
        oplog.append(
            repo.common_dir,
            oplog.OpRecord(
                op=op,
                ref=move.ref,
                old=move.old,
                new=move.new,
                agent=agent,
                task=task,
                objects=objects,
                bytes=size,
                duration_ms=round((time.perf_counter() - begin) * 1000, 3),
                note=move.kind + (f"; {move.problem}" if move.problem else ""),
            ),
        )
    except OSError as exc:
        return f"the operations log line of this move could not be written ({exc})"
    return None


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
) -> Move:
    """A new commit on ``ref`` whose tree is exactly ``to``'s tree; history is kept."""
    begin = time.perf_counter()
    tree = repo.tree_of(to)
    with target_lock(repo, ref):
        recover_worktree(repo, ref)
        # With --expect the compare-and-swap checks the tip; without, read it first.
        tip = expect if expect is not None else repo.ref_value(ref)
        if tip is None:
            raise RefMoved(ref, expect, tip)
        if repo.tree_of(tip) == tree:
            actual = repo.ref_value(ref)
            if actual != tip:
                raise RefMoved(ref, expect, actual)
            raise NothingToRollBack(ref, tree)
        message = (
            f"agentgate rollback to {to[:12]}\n\n"
            f"Restores the tree of {to} ({tree}).\n\n"
            + trailer_lines({"Agent": agent, "Rollback-To": to})
        )
        if dry_run:
            actual = repo.ref_value(ref)
            if actual != tip:
                raise RefMoved(ref, expect, actual)
            check_move(repo, ref, tip, tree)
            return Move(ref, tip, "", "rollback", tree)
        new = repo.commit_tree(tree, [tip], message, author)
        moved, problem = move_target(
            repo, ref, new, tip, f"agentgate rollback to {to[:12]} by {agent}"
        )
        if not moved:
            raise RefMoved(ref, tip, repo.ref_value(ref))
        move = Move(ref, tip, new, "rollback", tree, problem=problem)
        logged = _log(repo, "rollback", move, agent, f"rollback to {to}", begin)
        return Move(ref, tip, new, "rollback", tree, problem=_join(problem, logged))


def revert(
    repo: BaseRepo,
    ref: str,
    attempt_commit: str,
    attempt_base: str,
    *,
    expect: str | None,
    author: Author,
    agent: str,
    task: str,
    retest: Retest | None = None,
    dry_run: bool = False,
) -> Move:
    """Undo one attempt's change on top of the current target, keeping later work.

    The inverse change is merged with ``git merge-tree`` by giving it a synthetic history
    whose merge base is the attempt's own tree, so the result is "tip + (base - attempt)".
    """
    begin = time.perf_counter()
    with target_lock(repo, ref):
        recover_worktree(repo, ref)
        tip = repo.ref_value(ref)
        if tip is None or (expect is not None and tip != expect):
            raise RefMoved(ref, expect, tip)
        helper = Author("agentgate", "agentgate@localhost")
        pivot = repo.commit_tree(repo.tree_of(attempt_commit), [], "revert pivot\n", helper)
        ours = repo.commit_tree(repo.tree_of(tip), [pivot], "revert ours\n", helper)
        theirs = repo.commit_tree(repo.tree_of(attempt_base), [pivot], "revert theirs\n", helper)
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
            check_move(repo, ref, tip, preview.tree)
            return Move(ref, tip, "", "revert", preview.tree)
        message = (
            f"agentgate revert: {one_line(task)}\n\nReverts the change of attempt {attempt_commit}.\n\n"
            + trailer_lines({"Agent": agent, "Reverts": attempt_commit})
        )
        new = repo.commit_tree(preview.tree, [tip], message, author)
        moved, problem = move_target(
            repo, ref, new, tip, f"agentgate revert {attempt_commit[:12]} by {agent}"
        )
        if not moved:
            raise RefMoved(ref, tip, repo.ref_value(ref))
        move = Move(ref, tip, new, "revert", preview.tree, problem=problem)
        logged = _log(repo, "revert", move, agent, task, begin)
        return Move(ref, tip, new, "revert", preview.tree, problem=_join(problem, logged))
