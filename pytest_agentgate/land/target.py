"""Where attempts land: a branch here, a scratch ref of a dry run, or a branch on a server.

Three kinds of target, one protocol (:class:`Target`), so the engine and promotion never ask
which kind they have:

- :class:`LocalBranch`: ``refs/heads/<b>`` of the base repository, moved by ``update-ref NEW
  OLD``; when it is checked out there, its files follow (journalled, see :mod:`.checkout`).
- :class:`DryRunRef`: ``refs/agentgate/dryrun/<b>``, reset to its source's tip once per run,
  so later attempts of a run are judged against what would have landed; no branch moves.
- :class:`RemoteBranch`: ``refs/heads/<b>`` on a server, moved by a push with a lease (the
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
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .. import _constants, _faults
from ..errors import AgentgateError, ConfigError, GitError, PushRefused, WorktreeBlocked
from ..git import transport
from ..git import worktree as checkout
from ..git.repo import BaseRepo
from ..store import locks, oplog

if TYPE_CHECKING:
    from ..remote.lease import Lease
    from ..remote.server_queue import ServerQueue, Trust
    from ..remote.server_records import Server

#: Where each run's scratch ref lives: ``refs/agentgate/dryruns/<run>/<branch>``.
DRYRUN_PREFIX = "refs/agentgate/dryruns/"
#: The one scratch ref per branch of 0.1, which ``agentgate prune`` still removes.
OLD_DRYRUN_PREFIX = "refs/agentgate/dryrun/"


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
    record: Mapping[str, object] | None = None
    #: For a batch: one (commit, record) per attempt it lands, the commit being that
    #: attempt's own place in the chain the move brings (a pending line each).
    batch: tuple[tuple[str, Mapping[str, object]], ...] = ()
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
        # testing already). Before early re-tests this made -n 4 over 16 tests slower.
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
                        agent=str(record.get("agent", note.agent)),
                        task=str(record.get("task", note.task)),
                        pending=uid,
                        # Whose move it is: a waiter's attempt landed by a leader is the
                        # waiter's (its pid), so settling it waits while the waiter lives.
                        record={"pid": os.getpid(), **record},
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
        return self.repo.ref_value(self.ref)

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
                moved = self.repo.update_ref(self.ref, new, old, message, reflog=True)
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


class RemoteBranch(_LogsMoves):
    """``refs/heads/<b>`` on a server, moved by ``push --atomic --force-with-lease``.

    The server moves the branch only if it is still where this process last saw it, so
    clones on different machines can never overwrite each other's promotions. What the
    server holds is read with a fetch into ``refs/agentgate/remote/<remote>/<b>`` (the
    ``ref`` attempts are judged against), never into the user's remote-tracking refs. A
    push the server refuses on policy (a hook, a protected branch) raises
    :class:`PushRefused` at once: it is not a race, and trying again cannot help.
    """

    promotes = True

    def __init__(
        self,
        repo: BaseRepo,
        remote: str,
        branch: str,
        log: oplog.OpLog,
        *,
        push_state: bool = False,
        lease_seconds: float = _constants.DEFAULT_LEASE_S,
        trust: Trust | None = None,
    ) -> None:
        self.repo = repo
        self.remote = remote
        self.branch = branch
        #: How this machine signs its posts on the server's queue, and whose it believes.
        self.trust = trust
        self.ref = f"{TRACKING_PREFIX}{remote}/{branch}"
        self.log = log
        self.push_state = push_state
        self.lease_seconds = lease_seconds
        self._urls: tuple[str, str] | None = None
        self._lease: Lease | None = None
        self._queue: ServerQueue | None = None

    def lease(self, waiting: Callable[[], bool] | None = None) -> AbstractContextManager[None]:
        return self._the_lease().hold(waiting)

    def _the_lease(self) -> Lease:
        from ..remote.lease import Lease

        if self._lease is None:
            self._lease = Lease(
                self.repo, self.urls()[1], self.branch, seconds=self.lease_seconds,
                name=self.remote,
            )  # fmt: skip
        return self._lease

    def busy(self) -> bool:
        if super().busy():
            return True
        try:
            return self._the_lease().held_elsewhere()
        except AgentgateError:
            return False

    def server_queue(self) -> ServerQueue:
        import socket

        from ..remote.server_queue import ServerQueue

        if self._queue is None:
            # One name per clone: its host, and an id drawn once and kept in the clone (two
            # containers with one hostname and one path are still two machines).
            where = self._machine_id()
            host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:40] or "host"
            self._queue = ServerQueue(
                self.repo, self.records(), self.branch, machine=f"{host}-{where}",
                seconds=self.lease_seconds, trust=self.trust,
            )  # fmt: skip
            queue = self._queue
            lease = self._the_lease()
            lease.riders = queue.heartbeats
            lease.on_wait = queue.keep_alive
        return self._queue

    def _machine_id(self) -> str:
        """This clone's id, drawn once and kept in its private directory. One that cannot
        be read as one (cut short by a kill or a full disk) is drawn again, replaced whole;
        a clone that cannot keep one gets one from where it is."""
        import hashlib
        import uuid as uuids

        path = self.repo.private_dir / "machine-id"
        for _ in range(3):
            try:
                found = path.read_text(encoding="ascii").strip()
                if found.isalnum() and 8 <= len(found) <= 32:
                    return found
            except FileNotFoundError:
                pass
            except (OSError, UnicodeDecodeError):
                pass  # unreadable as an id: drawn again below
            drawn = path.with_name(f"machine-id.{uuids.uuid4().hex}")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                drawn.write_text(uuids.uuid4().hex[:12], encoding="ascii")
                if path.exists():
                    os.replace(drawn, path)  # replaced whole: a reader sees the old or the new
                else:
                    # The first process to draw wins; the others read its id next turn.
                    with contextlib.suppress(FileExistsError):
                        os.link(drawn, path)
            except OSError:
                break
            finally:
                drawn.unlink(missing_ok=True)
        return hashlib.sha256(str(self.repo.common_dir).encode()).hexdigest()[:10]

    @property
    def label(self) -> str:
        return f"{self.remote}/{self.branch}"

    @property
    def moved_ref(self) -> str:
        return f"{self.remote}:refs/heads/{self.branch}"

    def check(self, source: str = "") -> None:
        """Raise :class:`ConfigError` unless ``remote`` is a configured remote of the base."""
        transport.check_remote(self.repo, self.remote, source)

    def urls(self) -> tuple[str, str]:
        """(fetch URL, push URL): using URLs, not the remote's name, keeps git from updating
        the user's ``refs/remotes/<remote>/*`` on the side."""
        if self._urls is None:
            self._urls = self.repo.remote_urls(self.remote)
        return self._urls

    #: The server's chain of the plugin's moves of each branch (see :meth:`moved_here`).
    MOVES = "refs/agentgate/moves/"
    #: How many links back :meth:`moved_here` looks for a tip.
    MOVES_LOOKBACK = 2000

    @property
    def moves_mirror(self) -> str:
        return f"refs/agentgate/remote/{self.remote}/moves/{self.branch}"

    def tip(self) -> str | None:
        # One fetch at a time into the tracking ref: git's own ref lock would fail the
        # second of two at once (pytest-xdist workers), not wait for it. The chain of moves
        # comes in the same fetch: read at the same moment as the branch.
        moves = f"+{self.MOVES}*:refs/agentgate/remote/{self.remote}/moves/*"
        with locks.ref_lock(self.repo, f"fetch/{self.ref}"):
            return transport.fetch_branch(
                self.repo, self.urls()[0], self.branch, self.ref, name=self.remote,
                also=[moves],
            )  # fmt: skip

    def moved_here(self, tip: str) -> bool:
        """Whether the plugin moved the server's branch to ``tip``, on any machine: every
        move adds a link to ``refs/agentgate/moves/<branch>`` in the same atomic push (a
        commit whose last parent is the tip it moved to, and first the link before), so
        another machine's landing is never taken for a person's push. Read from what the
        last :meth:`tip` fetched; as trustworthy as the records (whoever can push can
        write one)."""
        if self.repo.ref_value(self.moves_mirror) is None:
            return False
        try:
            chain = self.repo.first_parent_chain(self.moves_mirror, self.MOVES_LOOKBACK)
        except AgentgateError:
            return False
        for _, parents in chain:
            if parents and parents[-1] == tip:
                return True
            if len(parents) < 2:
                return False  # the first link (its one parent is its tip): the chain ends
        return False

    def _link(self, new: str, note: MoveNote) -> transport.RefUpdate | None:
        """The next link of the chain of moves, for the push that moves the branch to
        ``new``."""
        from ..git.repo import Author

        last = self.repo.ref_value(self.moves_mirror)
        if last is not None and not self.repo.is_commit(last):
            last = None  # not a link (written by hand): the chain starts again, over it
        message = (
            f"agentgate {note.op} of {self.branch}\n\nAgentgate-Op: {note.op}\n"
            f"Agentgate-Kind: {note.kind or '-'}\n"
        )
        link = self.repo.commit_tree(
            self.repo.empty_tree(), [last, new] if last else [new], message,
            Author("agentgate", "agentgate@localhost"),
        )  # fmt: skip
        # Forced: only a mover of the branch adds a link, and its push moves the branch by
        # compare-and-swap, so no link of the plugin's can be lost; a chain changed by hand
        # (or deleted) must not make every move fail as a lost race.
        return transport.RefUpdate(f"{self.MOVES}{self.branch}", link, None, force=True)

    def tip_under_lock(self, guess: str) -> str | None:
        return self.tip()

    #: How far a shallow clone is deepened, step by step, to find a merge base.
    DEEPEN_STEPS = (50, 200, 1000)

    def reach(self, base: str) -> None:
        """In a shallow clone (the default of CI checkouts), fetch just enough history for
        ``base`` and the target's tip to have a merge base, or say which command to run."""
        tip = self.repo.ref_value(self.ref)
        if tip is None or not self.repo.is_shallow() or self.repo.merge_base(base, tip):
            return
        for by in self.DEEPEN_STEPS:
            with locks.ref_lock(self.repo, f"fetch/{self.ref}"):
                transport.deepen(
                    self.repo, self.urls()[0], self.branch, self.ref, by, name=self.remote
                )
            tip = self.repo.ref_value(self.ref) or tip
            if self.repo.merge_base(base, tip) or not self.repo.is_shallow():
                return
        if not self.repo.merge_base(base, tip):
            raise ConfigError(
                f"this shallow clone holds no common history of {base[:12]} and {self.label}, "
                f"even {sum(self.DEEPEN_STEPS):,} commits deeper: run `git fetch --unshallow "
                f"{self.remote}` (in CI, check out with fetch-depth: 0)",
                source="remote",
            )

    def records(self) -> Server:
        from ..remote.server_records import Server

        fetch_url, push_url = self.urls()
        return Server(self.remote, fetch_url, push_url, self.push_state)

    def start(self, run_id: str) -> list[str]:
        """Settle what earlier runs left (their records go to the server too), and push
        the records they could not."""
        from ..remote import server_records
        from ..store import pending

        server = self.records()
        with self.lock():
            self.tip()
            notes = pending.settle(
                self.repo,
                self.ref,
                publish=lambda r, c: server_records.publish(self.repo, server, r, c),
            )
        return notes + server_records.catch_up(self.repo, server)

    def move(
        self,
        new: str,
        old: str,
        message: str,
        note: MoveNote,
        after_move: Callable[[], bool] | None = None,
    ) -> MoveResult:
        # Every move holds the lease, a fast-forward too: a move made beside a leader's
        # batch would leave that batch's re-test standing on an old tip, wasted.
        with self.lease():
            return self._move(new, old, message, note, after_move)

    def _move(
        self,
        new: str,
        old: str,
        message: str,
        note: MoveNote,
        after_move: Callable[[], bool] | None,
    ) -> MoveResult:
        uid = self._pending(old, new, note)
        # A push that raises (the connection dropped, the server did not report, Ctrl-C) may
        # have landed: its pending line stays open, and the next run settles it from what
        # the server holds.
        updates = [transport.RefUpdate(f"refs/heads/{self.branch}", new, old)]
        lease = self._lease if self._lease is not None and self._lease.held else None
        with lease.pushing() if lease is not None else contextlib.nullcontext():
            if lease is not None:  # renewed in the same atomic push: a lost lease cannot land
                updates.append(lease.renewal())
            # The chain of moves too, unless the server would not hold a lease (it keeps
            # none of refs/agentgate/*: another machine's landing then reads as a move
            # outside agentgate there, as the docs on many machines say).
            # (A lease ref the server could not lock, a ref in its way, is no such policy.)
            why = self._lease.unavailable if self._lease is not None else ""
            refused = bool(why) and "cannot lock ref" not in why
            link = None if refused else self._link(new, note)
            # And the verdicts of other machines' attempts it lands, their queue refs taken.
            extras = [*note.server_updates, *([link] if link else [])]
            pushed = transport.push(
                self.repo, self.urls()[1], [*updates, *extras], name=self.remote
            )
            locked_out = _locked_out(pushed)
            blocked = {u.ref for u in extras} & locked_out
            if blocked and locked_out <= blocked:
                # The server would not write one of the queue's refs or the chain's (a ref
                # below its name is in the way): the move goes on without that one, and all
                # the rest (the verdicts, the queue refs taken) still in the same push.
                link = None if link is not None and link.ref in blocked else link
                kept = [*updates, *(u for u in extras if u.ref not in blocked)]
                pushed = transport.push(self.repo, self.urls()[1], kept, name=self.remote)
            if pushed.ok and lease is not None:
                lease.renewed(updates[1])
            if pushed.ok and link is not None:
                with contextlib.suppress(AgentgateError):
                    self.repo.update_ref(
                        self.moves_mirror, link.new, self.repo.ref_value(self.moves_mirror), "move"
                    )
        if not pushed.ok:
            self._settle(uid, "pending-abandoned")
            if pushed.refused is not None:
                raise PushRefused(self.label, pushed.refusal())
            if lease is not None:
                lease.confirm()  # the branch moved, or the lease was taken over: take it again
            return MoveResult(False)
        # Our own view follows; a compare-and-swap, like every ref the plugin moves.
        self.repo.update_ref(self.ref, new, old, message)
        recorded = [after_move()] if after_move is not None else []
        return self._moved(old, new, note, uid, recorded, None)


def _locked_out(pushed: transport.PushResult) -> set[str]:
    """The refs a refused push's server says it could not lock ("cannot lock ref 'R':
    'R/x' exists")."""
    said = " ".join(pushed.server_says) + " " + pushed.refusal()
    return set(re.findall(r"cannot lock ref '([^']+)'", said))


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
