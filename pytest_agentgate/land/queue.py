"""The landing queue: passed attempts that need a merge wait for one leader, who lands them in
batches, re-tests each batch once, and bisects a batch that fails.

Per repository and target, across processes and pytest-xdist workers, with nothing but files
and two ``flock`` locks in the plugin's own directory:

- an attempt *enqueues* itself (an entry file, named by its arrival number, under the short
  queue lock), then blocks on the target's lock: the kernel wakes it when the holder lets
  go, so waiting costs no polling and no git;
- whoever holds the target's lock is the *leader*: it takes every queued attempt whose
  re-test is the same as its own (the batch key: gate commands, environment, sandbox), in
  arrival order, up to ``batch_max``; merges them one after another onto the tip it reads
  now (an attempt that conflicts with the batch so far is set aside and judged alone
  afterwards); runs the gate once on the top tree; and on a pass moves the target once, to
  the top of a chain of merge commits, one per attempt;
- a batch that fails is bisected over its arrival-order prefixes (the tip plus the first
  k attempts), so what lands is always exactly a tree that was tested: the first attempt
  whose prefix fails is rejected, the passing prefix lands, the rest stay queued;
- the leader writes each waiter's verdict to a file beside its entry; a waiter that gets the
  lock reads it and is done, or, finding none (the leader died, or had another batch key),
  leads itself. An interrupted waiter withdraws its entry under the lock.

Records first, as for a single promotion: a pending line per attempt (carrying the record,
and the waiter's pid as its owner) before the move, the records right after it. A leader that
dies leaves the lock to the next holder, who finishes what the pending lines say landed and
queues again what did not. The batching follows bors-ng's batches with bisection, as an idea.

The queue is built from parts it holds, each a module with a narrow interface: the queue's
files (:mod:`.queue_folder`), a server's queue (:mod:`.posting`), what dead processes left
(:mod:`.recovery`), the leader's batches (:mod:`.leader`), and the decisions they take, pure
functions over plain values (:mod:`.planning`); here, the waiter, and one turn of leading.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import _constants
from ..errors import AgentgateError, NotNeeded
from ..git.repo import BaseRepo
from ..store.record import Record
from .early import EarlyRetests
from .leader import Lead, Leader
from .posting import ServerPosts
from .queue_folder import MAX_ROUNDS, Entry, Judge, Outcome, QueueFiles
from .recovery import Recovery
from .retest import BatchRetest
from .target import Target

__all__ = ["Entry", "Judge", "LandingQueue", "Outcome"]


class LandingQueue:
    """The queue of one target: the waiter's side (:meth:`land`, :meth:`withdraw`) and the
    entry to the leader's (:meth:`lead`), built from the parts it holds."""

    def __init__(
        self,
        repo: BaseRepo,
        target: Target,
        *,
        batch_max: int = _constants.DEFAULT_BATCH_MAX,
        early: bool = False,
    ) -> None:
        self.repo = repo
        self.target = target
        self.batch_max = max(1, batch_max)
        self.files = QueueFiles(repo, target)
        self.posts = ServerPosts(self.files)
        self.recovery = Recovery(self.files, self.posts)
        #: Batches' trees tested while their attempts' own gates run (see :mod:`.early`).
        self.early = EarlyRetests(self, enabled=early)
        self.leader = Leader(self.files, self.posts, self.recovery, self.early, self.batch_max)

    # -- the queue's files, as waiters and early re-tests read them ------------------------

    @property
    def folder(self) -> Path:
        return self.files.folder

    def entries(self) -> list[Entry]:
        return self.files.entries()

    def intents(self, key: str | None) -> list[tuple[str, dict[str, object]]]:
        return self.files.intents(key)

    def enqueue(self, new: Entry) -> Entry:
        return self.files.enqueue(new)

    def verdict(self, uid: str) -> Outcome | None:
        return self.files.verdict(uid)

    def announce(self, uid: str, key: str, *, tree: str = "", base: str = "") -> float:
        return self.files.announce(uid, key, tree=tree, base=base)

    def arrived(self, uid: str) -> None:
        self.files.arrived(uid)

    def discard(self, uid: str) -> None:
        self.files.discard(uid)

    def settle_posted(self) -> list[str]:
        return self.recovery.settle_posted()

    # -- the waiter -----------------------------------------------------------------------

    def land(
        self,
        record: Record | Mapping[str, object],
        change_commit: str,
        key: str,
        retest: BatchRetest,
        *,
        known_objects: Sequence[str] = (),
        gate_s: float = 0.0,
        began: float = 0.0,
        judge: Judge | None = None,
    ) -> Outcome:
        """Queue one attempt and wait for its verdict (leading when nobody else does).

        ``record`` is what its record will say (a :class:`~..store.record.Record`, or its
        JSON: its id, task, agent and base with it); ``key`` says which attempts share a
        re-test (and so a batch); ``retest`` is the gate this process runs when it leads.
        """
        said = record if isinstance(record, Record) else Record.from_json(record)
        entry = Entry(
            seq=0,
            uid=said.uid,
            key=key,
            change_commit=change_commit,
            record=said,
            pid=os.getpid(),
            known_objects=tuple(known_objects),
            began=began,
        )
        uid = said.uid
        try:
            # Inside the try: an interrupt just after the entry is written still withdraws it.
            entry = self.enqueue(entry)
            self.arrived(uid)  # queued: a leader gathering a batch sees its entry now
            self.posts.post(entry)
            written = self.folder / f"{uid}.verdict"

            def has_verdict() -> bool:
                return written.exists() and self.verdict(uid) is not None

            begin = time.perf_counter()
            # Over every turn this waiter leads: a turn may end without its own verdict.
            landed_for_others: list[dict[str, str]] = []
            for _ in range(MAX_ROUNDS):
                # The verdict is read as soon as the leader writes it, not once the lock is
                # free: that leader may go on to the next batch, a whole re-test more.
                with self.target.lock_unless(has_verdict) as waited:
                    found = self.verdict(entry.uid)
                    if found is None and waited is not None:
                        landed_for_others += self.lead(
                            key, retest, gate_s=gate_s, judge=judge, own=uid
                        )
                        found = self.verdict(entry.uid)
                    if found is not None:
                        found.lock_wait_ms = (time.perf_counter() - begin) * 1000
                        found.landed_for_others = landed_for_others
                        self.files.forget(entry)
                        return found
            raise AgentgateError(
                f"the queue gave no verdict for {entry.label} after {MAX_ROUNDS} turns"
            )
        except BaseException:
            with contextlib.suppress(BaseException):
                self.withdraw(entry)
            raise

    def withdraw(self, entry: Entry) -> None:
        """An interrupted (Ctrl-C, a timeout) or failed waiter's entry: under the lock,
        either the leader already landed it (its verdict stands: the record says so; or a
        leader killed after its records, before its verdicts, left its record, which is the
        verdict now), or it leaves the queue now, so nothing lands after its test reports."""
        with self.target.lock():
            if self.verdict(entry.uid) is not None:
                return
            files = self.files
            mine = files.landed_record(entry.uid) if self.target.server_queue() is None else None
            if mine is not None:
                files.write_verdict(entry, files.recorded(entry, mine, mine.landed))
            elif self.posts.take_back(entry):
                files.forget(entry)

    # -- the leader's side --------------------------------------------------------------

    def lead(
        self,
        key: str,
        retest: BatchRetest,
        *,
        gate_s: float = 0.0,
        judge: Judge | None = None,
        own: str = "",
    ) -> list[dict[str, str]]:
        """Land every queued attempt of this batch key, batch after batch. Call with the
        target's lock held (:meth:`land` does). With ``gate_s`` (how long a gate takes), a
        batch with room first waits briefly for attempts about to finish their own gate.

        With ``own`` (the leader's own attempt), it stops after the batch that decided that
        one: its test reports now, and a waiter still without a verdict leads the next batch
        (each waiter that finds the lock free and no verdict leads). Returns the other
        machines' attempts it landed (for its process's summary)."""
        if not any(e.key == key for e in self.entries()):
            return []
        lead = Lead(key, retest, gate_s, judge, own)
        # One leader across machines too, for a branch on a server (its lease). While
        # another machine holds it, this one's attempts wait on the server's queue, for
        # that leader to take into its batches (see :mod:`.server_queue`).
        shared = self.target.server_queue()
        waiting = None if shared is None else (lambda: self.leader.while_waiting(shared, key))
        try:
            with self.target.lease(waiting):
                self.leader.run(lead)
        except NotNeeded:
            pass  # another machine's leader decided every one of them
        return lead.landed_for_others
