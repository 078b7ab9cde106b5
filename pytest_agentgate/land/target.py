"""Where attempts land: a branch here, a scratch ref of a dry run, or a branch on a server.

Three kinds of target, one protocol (:class:`Target`), so the engine and promotion never ask
which kind they have (the other two are in :mod:`.dry_run` and :mod:`.remote_branch`):

- :class:`LocalBranch`: ``refs/heads/<b>`` of the base repository, moved by ``update-ref NEW
  OLD``; when it is checked out there, its files follow (journalled, see :mod:`.checkout`).
- :class:`~.dry_run.DryRunRef`: ``refs/agentgate/dryruns/<run>/<b>``, reset to its source's tip once per run,
  so later attempts of a run are judged against what would have landed; no branch moves.
- :class:`~.remote_branch.RemoteBranch`: ``refs/heads/<b>`` on a server, moved by a push with a lease (the
  server's compare-and-swap); judged against the plugin's own tracking ref of it.

A target is given the operations log when it is made and logs every move itself (the idea of
dulwich's refs container, which is handed its reflog writer), with a ``pending`` line before
a move that carries a record, so no move is ever without its log line or its record. The
protocol's shape follows pytest-xdist's scheduler protocol: a small set of methods the caller
drives, each kind free in how it does them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from .. import _faults
from ..errors import AgentgateError, WorktreeBlocked
from ..git import transport
from ..git import worktree as checkout
from ..git.repo import BaseRepo
from ..store import locks, oplog
from ..store.record import Record

if TYPE_CHECKING:
    from ..remote.server_queue import ServerQueue
    from ..remote.server_records import Server

#: Where each run's scratch ref lives: ``refs/agentgate/dryruns/<run>/<branch>``.
DRYRUN_PREFIX = "refs/agentgate/dryruns/"


def dryrun_ref(branch: str, run_id: str) -> str:
    """The scratch ref of one run's dry run of ``branch``."""
    return f"{DRYRUN_PREFIX}{(run_id or 'none')[:16]}/{branch}"


TRACKING_PREFIX = "refs/agentgate/remote/"


@dataclass(frozen=True)
class MoveNote:
    """What the operations log says of a move, besides the ref and the ids.

    ``record`` (what the attempt record will say) makes the move write a ``pending`` line
    before it, settled by the next run if this process dies before the record exists.
    """

    op: str  # promote, rollback, revert, dryrun-reset
    agent: str = ""
    task: str = ""
    kind: str = ""  # fast-forward, merge, rollback, revert, batch
    record: Record | None = None
    #: For a batch: one (commit, record) per attempt it lands, the commit being that
    #: attempt's own place in the chain the move brings (a pending line each).
    batch: tuple[tuple[str, Record], ...] = ()
    #: The objects the move adds, when the caller knows them (spares counting them).
    known_objects: Sequence[str] | None = None
    #: Count the objects and bytes the move adds (a git process, for a merge).
    measure: bool = True
    #: More refs the same atomic push sets, for a branch on a server (the shared queue's).
    server_updates: tuple[transport.RefUpdate, ...] = ()
    begin: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class MoveResult:
    """A compare-and-swap's outcome: moved or not; and a problem after a move that stands
    (the checked-out files lag, the log line failed)."""

    moved: bool
    problem: str | None = None


class Target(Protocol):
    """What the engine needs of wherever attempts land."""

    repo: BaseRepo
    #: The branch's short name (``main``).
    branch: str
    #: The local ref attempts are forked from, judged against and merged onto.
    ref: str
    #: Whether a landing is real (a branch moves) or a dry run.
    promotes: bool
    #: Where the target writes the line of every move it makes.
    log: oplog.OpLog

    @property
    def label(self) -> str:
        """The target as people read it: ``main``, ``dryrun/main``, ``origin/main``."""
        ...

    @property
    def moved_ref(self) -> str:
        """What a move moves, as the operations log names it."""
        ...

    def tip(self) -> str | None:
        """The tip now (fetched from the server for a remote branch); None when it is gone."""
        ...

    def tip_under_lock(self, guess: str) -> str | None:
        """The tip to merge onto, with the lock held. A local ref may be presumed at
        ``guess`` (its compare-and-swap checks that); a remote one is fetched."""
        ...

    def start(self, run_id: str) -> list[str]:
        """Begin a run: settle what earlier runs left; reset a dry run's scratch ref once per
        run. Returns what was settled."""
        ...

    def records(self) -> Server | None:
        """The server attempt records are pushed to (a remote target's), or None."""
        ...

    def lease(self, waiting: Callable[[], bool] | None = None) -> AbstractContextManager[None]:
        """Be the one batch leader for this branch across machines while it is held (a
        server's lease, see :mod:`.lease`); nothing for a branch here. ``waiting`` is
        called while another machine holds it (see :meth:`.Lease.hold`)."""
        ...

    def server_queue(self) -> ServerQueue | None:
        """The server's half of the landing queue (a remote target's), or None."""
        ...

    def busy(self) -> bool:
        """Whether a batch leader is at work now (this machine's holds the lock; another
        machine's, the server's lease): a fast-forward would wait for its whole batch and
        then need a merge, so the attempt is better queued for that batch."""
        ...

    def lock(self) -> AbstractContextManager[float]:
        """The plugin's lock for this target; yields the wait in ms."""
        ...

    def lock_unless(self, done: Callable[[], bool]) -> AbstractContextManager[float | None]:
        """The plugin's lock for this target, or nothing (None) as soon as ``done()``: a
        queued attempt's verdict, read without waiting for the next batch's leader."""
        ...

    def move(
        self,
        new: str,
        old: str,
        message: str,
        note: MoveNote,
        after_move: Callable[[], bool] | None = None,
    ) -> MoveResult:
        """Compare-and-swap from ``old`` to ``new``, logged. ``after_move`` runs right after
        the ref moved, before anything follows (the record is written there); it returns
        whether the record was written. Raises :class:`PushRefused` when a server refuses."""
        ...


class _LogsMoves:
    """The operations-log half every target shares: pending lines, move lines."""

    repo: BaseRepo
    ref: str
    log: oplog.OpLog

    @property
    def moved_ref(self) -> str:
        return self.ref

    def lock(self) -> AbstractContextManager[float]:
        return locks.ref_lock(self.repo, self.ref)

    def lock_unless(self, done: Callable[[], bool]) -> AbstractContextManager[float | None]:
        return locks.ref_lock_unless(self.repo, self.ref, done)

    def records(self) -> Server | None:
        return None

    def lease(self, waiting: Callable[[], bool] | None = None) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def server_queue(self) -> ServerQueue | None:
        return None

    def busy(self) -> bool:
        # A leader here holding the lock is landing a batch: the tip moves under it, so a
        # fast-forward waiting for the lock would need a merge all the same. Queued now, it
        # joins the batch that leader is gathering (whose tree an early re-test may be
        # testing already), rather than costing that batch a second re-test.
        return locks.held(self.repo, self.ref)

    def _pending(self, old: str, new: str, note: MoveNote) -> list[str]:
        """Append the ``pending`` lines of a move about to happen (one per record it
        carries); their ids.

        Raises ``OSError`` when one cannot be written: the move must then not happen (the
        lines already written are abandoned).
        """
        wanted = list(note.batch) or ([(new, note.record)] if note.record is not None else [])
        uids: list[str] = []
        try:
            for commit, record in wanted:
                uid = uuid.uuid4().hex
                self.log.append(
                    oplog.OpRecord(
                        op="pending",
                        ref=self.ref,
                        old=old,
                        new=commit,
                        agent=record.agent,
                        task=record.task,
                        pending=uid,
                        # Whose move it is: a waiter's attempt landed by a leader is the
                        # waiter's (its pid), so settling it waits while the waiter lives.
                        record=replace(record, pid=record.pid or os.getpid()).to_json(),
                    ),
                    fault="pending",
                )
                uids.append(uid)
        except BaseException:
            self._settle(uids, "pending-abandoned")
            raise
        if uids:
            _faults.point("pending")
        return uids

    def _settle(self, uids: Sequence[str], op: str) -> None:
        """Mark pending moves done or abandoned; best effort (the next run settles them)."""
        for uid in uids:
            with contextlib.suppress(OSError):
                self.log.append(
                    oplog.OpRecord(op=op, ref=self.ref, old=None, new=None, pending=uid)
                )

    def _logged(self, old: str, new: str, note: MoveNote, problem: str | None) -> str | None:
        """Log a move that happened; say why when the line could not be written.

        Counting is best effort, and so is the line: a move is never undone by its log.
        """
        objects = size = 0
        if note.measure:
            try:
                if note.known_objects is not None:
                    objects, size = self.repo.measure([new, *note.known_objects])
                else:
                    objects, size = self.repo.count_new_objects(new, old)
            except AgentgateError:
                objects, size = -1, -1
        try:
            self.log.append(
                oplog.OpRecord(
                    op=note.op,
                    ref=self.moved_ref,
                    old=old if old and old.strip("0") else None,
                    new=new,
                    agent=note.agent,
                    task=note.task,
                    objects=objects,
                    bytes=size,
                    duration_ms=round((time.perf_counter() - note.begin) * 1000, 3)
                    if note.measure
                    else 0.0,
                    note=note.kind + (f"; {problem}" if problem else ""),
                )
            )
        except OSError as exc:
            return f"the operations log line of this move could not be written ({exc})"
        return None

    def _moved(
        self,
        old: str,
        new: str,
        note: MoveNote,
        uid: Sequence[str],
        recorded: list[bool],
        problem: str | None,
    ) -> MoveResult:
        logged = self._logged(old, new, note, problem)
        if all(recorded):  # else the next run completes the record from the pending line
            self._settle(uid, "pending-done")
        found = [p for p in (problem, logged) if p]
        return MoveResult(True, "; ".join(found) if found else None)


class LocalBranch(_LogsMoves):
    """A ref of the base repository (a branch, normally): moved by ``update-ref NEW OLD``.

    When the base repository has the branch checked out, its files follow every move, and a
    move that would lose a person's edit or untracked file is refused before the ref moves.
    """

    promotes = True

    def __init__(self, repo: BaseRepo, branch: str, log: oplog.OpLog, *, ref: str = "") -> None:
        self.repo = repo
        self.branch = branch
        self.ref = ref or f"refs/heads/{branch}"
        self.log = log

    @property
    def label(self) -> str:
        return self.branch

    def tip(self) -> str | None:
        return self.repo.refs.value(self.ref)

    def tip_under_lock(self, guess: str) -> str | None:
        checkout.recover_worktree(self.repo, self.ref)
        # Optimistic: presume the tip is still ``guess``; the compare-and-swap checks it, so
        # the common fast-forward costs one git call. A checked-out target is read first:
        # its files must be checked against the real tip.
        return self.tip() if checkout.checked_out(self.repo, self.ref) else guess

    def start(self, run_id: str) -> list[str]:
        # A run killed (or whose disk filled) between moving the target and writing its
        # record, or updating its checked-out files, left a pending line or a journal:
        # finish both before anything else moves.
        from ..store import pending

        with self.lock():
            settled = pending.settle(self.repo, self.ref)
            checkout.recover_worktree(self.repo, self.ref)
        return settled

    def check_move(self, old: str, new: str) -> bool:
        """Raise unless the ref can go from ``old`` to ``new`` (a commit or a tree) losing
        nothing; return whether its files must follow."""
        return check_move(self.repo, self.ref, old, new)

    def move(
        self,
        new: str,
        old: str,
        message: str,
        note: MoveNote,
        after_move: Callable[[], bool] | None = None,
    ) -> MoveResult:
        follow = self.check_move(old, new)
        uid = self._pending(old, new, note)
        recorded: list[bool] = []
        journal = checkout.journal_path(self.repo, self.ref)
        problem = None
        with _faults.uninterrupted():
            if follow:
                tmp = journal.with_suffix(".tmp")
                try:
                    _faults.point("journal")
                    tmp.write_text(
                        json.dumps({"ref": self.ref, "old": old, "new": new}), encoding="utf-8"
                    )
                    os.replace(tmp, journal)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    self._settle(uid, "pending-abandoned")
                    raise
            try:
                moved = self.repo.refs.update(self.ref, new, old, message, reflog=True)
            except BaseException:
                if follow:
                    journal.unlink(missing_ok=True)
                self._settle(uid, "pending-abandoned")
                raise
            if not moved:
                if follow:
                    journal.unlink(missing_ok=True)
                self._settle(uid, "pending-abandoned")
                return MoveResult(False)
            if after_move is not None:
                _faults.point("moved")
                recorded.append(after_move())
                _faults.point("recorded")
            if follow:
                try:
                    _faults.point("worktree-sync")
                    checkout.sync_worktree(self.repo, old, new)
                    journal.unlink(missing_ok=True)
                except (AgentgateError, OSError) as exc:
                    problem = (
                        f"the checked-out files were not updated ({exc}); the next run finishes it"
                    )
            # Its pending lines settled and its log line written before a Ctrl-C held
            # meanwhile is raised: else the next run took the move for a dead one's.
            return self._moved(old, new, note, uid, recorded, problem)


def check_move(repo: BaseRepo, ref: str, old: str, new: str) -> bool:
    """Raise unless ``ref`` can go from ``old`` to ``new`` (a commit or a tree) losing nothing.

    Returns whether the base repository's working tree has ``ref`` checked out (its files
    must then follow). A dry run of a rollback or revert makes exactly these checks, so it
    refuses what a real one would refuse.
    """
    linked = checkout.linked_checkout(repo, ref)
    if linked is not None:
        raise WorktreeBlocked(
            linked,
            "checked out elsewhere",
            message=f"{ref} is checked out in the worktree {str(linked)!r}, whose files a move would "
            "leave behind; check out another branch there, then run again. Nothing was moved",
        )
    follow = checkout.checked_out(repo, ref)
    if follow:
        checkout.check_worktree(repo, old, new)
    return follow


def for_ref(repo: BaseRepo, ref: str, log: oplog.OpLog | None = None) -> LocalBranch:
    """The local target that moves ``ref`` (a branch, or any ref of the base repository)."""
    branch = ref[len("refs/heads/") :] if ref.startswith("refs/heads/") else ref
    return LocalBranch(repo, branch, log or oplog.OpLog(repo.common_dir), ref=ref)
