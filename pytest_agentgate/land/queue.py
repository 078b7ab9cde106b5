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
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .. import _constants, _faults
from ..errors import AgentgateError, NotNeeded, RefMoved
from ..git import transport
from ..git.repo import Author, BaseRepo
from ..remote import server_records
from ..store import attempts, locks, pending, records
from ..store.files import write_whole as _write
from ..store.oplog import OpRecord
from .early import EarlyRetests
from .retest import BatchRetest, Retested
from .target import MoveNote, Target

if TYPE_CHECKING:
    from ..remote.server_queue import Listing, Posted, ServerQueue

MAX_ROUNDS = 20
#: How much later than a batch's own (as a share of a gate's duration) an attempt's gate may
#: have begun for the batch's leader to wait for it.
GATHER_SHARE = 0.3
#: ... or this many seconds, whichever is more: a loaded machine spreads gates' starts.
GATHER_FLOOR_S = 0.5

#: How often a machine waiting for another's lease reads the server's queue (seconds).
SERVER_POLL_S = 0.2
#: The longest task or agent name a posted attempt may bring (it goes into commit messages).
POSTED_NAME_MAX = 200
#: The most of a gate's output another machine's verdict may bring (as a record keeps).
VERDICT_OUTPUT_MAX = 20_000


@dataclass(frozen=True)
class Entry:
    """One queued attempt: what the leader needs to land it and to write its record."""

    seq: int
    uid: str
    key: str
    change_commit: str
    base: str
    agent: str
    task: str
    #: What the attempt's record says (see ``Engine.record_fields``), with its status.
    record: dict[str, object]
    pid: int
    known_objects: tuple[str, ...] = ()
    #: When the attempt's own gate began (seconds since the epoch; 0: unknown).
    began: float = 0.0
    #: Another machine's attempt, posted on the server: its queue commit, and that machine.
    posted: str = ""
    machine: str = ""

    @property
    def label(self) -> str:
        return f"{self.task!r} by {self.agent}"

    @property
    def foreign(self) -> bool:
        """Posted by another machine: its own gate is that machine's word, not ours."""
        return bool(self.machine)


class Judge(Protocol):
    """Judge another machine's posted attempt as this machine judges its own (protection,
    the harness, the limits): why it is refused, or None. ``declared`` is what it posted."""

    def __call__(
        self, change_commit: str, base: str, declared: Mapping[str, object]
    ) -> str | None: ...


@dataclass
class Outcome:
    """A queued attempt's verdict, as the leader found it (written to the waiter's file)."""

    status: str  # promoted / passed (landed), rejected, conflict, error
    reason: str = ""
    check: str = ""
    output: str = ""
    old: str = ""
    new: str = ""
    kind: str = ""
    tree: str = ""
    retested: bool = False
    batch: str = ""
    record_ref: str | None = None
    record_commit: str | None = None
    record_problem: str | None = None
    lock_wait_ms: float = 0.0
    tested_with: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


class LandingQueue:
    """The queue of one target."""

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
        self._gate_s = 0.0
        #: Batches' trees tested while their attempts' own gates run (see :mod:`.early`).
        self.early = EarlyRetests(self, enabled=early)
        #: How the leader judges other machines' posted attempts (None: it takes none).
        self._judge: Judge | None = None
        #: Other machines' attempts this process's leader landed (for its summary).
        self.landed_for_others: list[dict[str, str]] = []
        #: What the judge said of each posted attempt (by its queue commit): None, passed.
        self._judged: dict[str, str | None] = {}
        self._last_poll = 0.0

    @property
    def folder(self) -> Path:
        """The queue's directory (named by the target's ref, which a dry run sets at start)."""
        return self.repo.private_dir / "queue" / self.target.ref.replace("/", "%2F")

    # -- the waiter's side --------------------------------------------------------------

    def land(
        self,
        *,
        uid: str,
        key: str,
        change_commit: str,
        base: str,
        agent: str,
        task: str,
        record: Mapping[str, object],
        known_objects: Sequence[str] = (),
        retest: BatchRetest,
        gate_s: float = 0.0,
        began: float = 0.0,
        judge: Judge | None = None,
    ) -> Outcome:
        """Queue one attempt and wait for its verdict (leading when nobody else does).

        ``key`` says which attempts share a re-test (and so a batch); ``record`` is what its
        record will say; ``retest`` is the gate this process runs when it leads.
        """
        entry = Entry(
            seq=0,
            uid=uid,
            key=key,
            change_commit=change_commit,
            base=base,
            agent=agent,
            task=task,
            record=dict(record),
            pid=os.getpid(),
            known_objects=tuple(known_objects),
            began=began,
        )
        try:
            # Inside the try: an interrupt just after the entry is written still withdraws it.
            entry = self.enqueue(entry)
            self.arrived(uid)  # queued: a leader gathering a batch sees its entry now
            self._post(entry)
            written = self.folder / f"{uid}.verdict"

            def has_verdict() -> bool:
                return written.exists() and self.verdict(uid) is not None

            begin = time.perf_counter()
            for _ in range(MAX_ROUNDS):
                # The verdict is read as soon as the leader writes it, not once the lock is
                # free: that leader may go on to the next batch, a whole re-test more.
                with self.target.lock_unless(has_verdict) as waited:
                    found = self.verdict(entry.uid)
                    if found is None and waited is not None:
                        self.lead(key, retest, gate_s=gate_s, judge=judge, own=uid)
                        found = self.verdict(entry.uid)
                    if found is not None:
                        found.lock_wait_ms = (time.perf_counter() - begin) * 1000
                        self._forget(entry)
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
            mine = self._landed_record(entry.uid) if self.target.server_queue() is None else None
            if mine is not None:
                self._write_verdict(entry, self._recorded(entry, mine, mine.landed))
            elif self._take_back(entry):
                self._forget(entry)

    def discard(self, uid: str) -> None:
        """Forget ``uid``'s entry and verdict here, whatever they said (its waiter read
        them)."""
        with self._queue_lock():
            for path in self.folder.glob(f"*-{uid}.entry"):
                path.unlink(missing_ok=True)
            (self.folder / f"{uid}.verdict").unlink(missing_ok=True)
            self._unpost(uid)

    def _forget(self, entry: Entry) -> None:
        """Remove ``entry`` and its verdict (by its id: it may not know its number yet)."""
        self.discard(entry.uid)

    def enqueue(self, new: Entry) -> Entry:
        """Give ``new`` the next arrival number and write its entry (under the queue lock)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._queue_lock():
            seq_file = self.folder / "seq"
            try:
                seq = int(seq_file.read_text(encoding="ascii").strip() or 0) + 1
            except (FileNotFoundError, ValueError):
                seq = 1
            _write(seq_file, str(seq))
            entry = replace(new, seq=seq)
            _write(self._entry_path(entry.seq, entry.uid), json.dumps(asdict(entry)))
        _faults.point("enqueued")  # the entry is written, its waiter not yet waiting
        return entry

    def verdict(self, uid: str) -> Outcome | None:
        """The verdict the leader left for ``uid``, if it has one yet."""
        try:
            data = json.loads((self.folder / f"{uid}.verdict").read_text(encoding="utf-8"))
            return Outcome(**data)
        except (OSError, ValueError, TypeError):
            return None  # none yet, or none this version can read (its waiter then leads)

    # -- attempts on their way ------------------------------------------------------------

    def announce(self, uid: str, key: str, *, tree: str = "", base: str = "") -> float:
        """An attempt of ``key`` is being judged and may soon need a merge: a leader making
        a batch of attempts whose gates began with this one's waits for it, rather than
        re-testing without it; an early re-test merges its ``tree`` (on ``base``) into the
        batch it tests. Returns when its gate began (for :meth:`land`)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        began = time.time()
        intent = {"key": key, "pid": os.getpid(), "since": began, "tree": tree, "base": base}
        _write(self.folder / f"{uid}.intent", json.dumps(intent))
        return began

    def intents(self, key: str | None) -> list[tuple[str, dict[str, object]]]:
        """The attempts of ``key`` (None: of any) being judged now (by live processes), in
        the order their gates began: (uid, what it announced)."""
        found = []
        for path in self.folder.glob("*.intent"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if key not in (None, data.get("key")):
                    continue
                if not pending.pid_alive(int(data.get("pid", 0))):
                    path.unlink(missing_ok=True)  # a process that died judging
                    continue
                data["since"] = float(data.get("since", 0))
                found.append((data["since"], path.stem, data))
            except (OSError, ValueError, TypeError, AttributeError):
                continue
        return [(uid, data) for _, uid, data in sorted(found, key=lambda f: (f[0], f[1]))]

    def arrived(self, uid: str) -> None:
        """The attempt is judged (queued, landed or rejected): nobody need wait for it."""
        (self.folder / f"{uid}.intent").unlink(missing_ok=True)

    def _in_flight(self, key: str, began_by: float) -> int:
        """How many attempts of ``key`` are being judged whose gate began by ``began_by``."""
        return sum(1 for _, data in self.intents(key) if float(str(data["since"])) <= began_by)

    def _gather(self, queued: list[Entry], gate_s: float) -> None:
        """Wait (a bounded time) for the attempts whose gates began with the batch's own
        to join it: they should arrive about when these did.

        Not for one whose gate began later (by more than ``GATHER_SHARE`` of a gate's
        duration, or ``GATHER_FLOOR_S``): waiting for it would hold every attempt of the
        batch back by most of a
        gate, to save it a re-test it can have on its own meanwhile.
        """
        key = queued[0].key
        now = time.time()
        # By this machine's clock: another's may be skewed.
        latest = (
            max((e.began or now - gate_s) for e in queued if not e.foreign)
            if any(not e.foreign for e in queued)
            else now - gate_s
        )
        began_by = latest + max(GATHER_FLOOR_S, GATHER_SHARE * gate_s)
        deadline = time.monotonic() + min(30.0, max(0.2, 1.5 * gate_s))
        have = len(queued)
        while (
            have < self.batch_max and time.monotonic() < deadline and self._in_flight(key, began_by)
        ):
            time.sleep(0.01)
            have = sum(1 for e in self.entries() if e.key == key)

    # -- the leader's side --------------------------------------------------------------

    def lead(
        self,
        key: str,
        retest: BatchRetest,
        *,
        gate_s: float = 0.0,
        judge: Judge | None = None,
        own: str = "",
    ) -> None:
        """Land every queued attempt of this batch key, batch after batch. Call with the
        target's lock held (:meth:`land` does). With ``gate_s`` (how long a gate takes), a
        batch with room first waits briefly for attempts about to finish their own gate.

        With ``own`` (the leader's own attempt), it stops after the batch that decided that
        one: its test reports now, and a waiter still without a verdict leads the next batch
        (each waiter that finds the lock free and no verdict leads)."""
        self._gate_s = gate_s
        self._judge = judge
        if not any(e.key == key for e in self.entries()):
            return
        # One leader across machines too, for a branch on a server (its lease). While
        # another machine holds it, this one's attempts wait on the server's queue, for
        # that leader to take into its batches (see :mod:`.server_queue`).
        shared = self.target.server_queue()
        waiting = None if shared is None else (lambda: self._while_waiting(shared, key))
        try:
            with self.target.lease(waiting):
                self._lead(key, retest, gate_s, own)
        except NotNeeded:
            return  # another machine's leader decided every one of them

    def _lead(self, key: str, retest: BatchRetest, gate_s: float, own: str = "") -> None:
        settle = self._mark_leading()
        self._sweep_answered()
        try:
            for _ in range(MAX_ROUNDS * 4):
                if own and self.verdict(own) is not None:
                    return  # decided: the next batch is a waiter's to lead
                queued = self._queued(key)
                if not queued:
                    return
                if settle:
                    queued = self._settle_dead_leaders(queued)
                if gate_s > 0 and len(queued) < self.batch_max:
                    self._gather(queued, gate_s)
                    queued = self._queued(key)
                    if settle:
                        queued = self._settle_dead_leaders(queued)
                queued = self._without_dead_owners(queued)
                if queued:
                    self._batch(queued[: self.batch_max], retest)
        finally:
            with contextlib.suppress(OSError):
                (self.folder / "leading").unlink(missing_ok=True)

    def _sweep_answered(self) -> None:
        """Forget the entries that have a verdict and no waiter left to read it (it died
        after its verdict was written: its record is the leader's). Found by a trial: they
        stayed in the queue's folder for good. Not for a branch on a server: a dead
        poster's verdict from another machine is read at its machine's next run, to record
        it (:meth:`settle_posted`)."""
        if self.target.server_queue() is not None:
            return
        for path in self.folder.glob("*.entry"):
            uid = path.stem.split("-", 1)[-1]
            if not (self.folder / f"{uid}.verdict").exists():
                continue
            try:
                pid = int(json.loads(path.read_text(encoding="utf-8"))["pid"])
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if not pending.pid_alive(pid):
                self.discard(uid)

    def _mark_leading(self) -> bool:
        """Mark that a leader is at work (gone when it finishes); whether an earlier one may
        have died leading, so that its pending lines must be read: its mark is still there,
        or no mark can be written (then every round reads them, as nobody would know)."""
        mark = self.folder / "leading"
        left = mark.exists()
        try:
            _write(mark, str(os.getpid()))
        except OSError:
            return True
        return left

    def _without_dead_owners(self, queued: list[Entry]) -> list[Entry]:
        """Drop the entries whose process is gone: nobody would report them, so nothing of
        theirs lands (what a dead leader already landed was finished just before)."""
        alive = []
        for entry in queued:
            if entry.foreign or pending.pid_alive(entry.pid):  # posted: its heartbeat said
                alive.append(entry)
            else:
                self._drop_dead(entry)
        return alive

    def settle_posted(self) -> list[str]:
        """At a run's start: this machine's posted attempts whose process is gone. Each is
        taken back from the server, or, when another machine's leader decided it meanwhile,
        recorded as it decided (nobody else would: that leader records its own machine's
        attempts only). What the server cannot be asked about now stays for the next run."""
        if self.target.server_queue() is None or not any(self.folder.glob("*.posted")):
            return []
        settled = []
        with self.target.lock():
            for entry in self.entries():
                if entry.foreign or pending.pid_alive(entry.pid) or not self._post_of(entry.uid):
                    continue
                if (note := self._drop_dead(entry)) is not None:
                    settled.append(note)
        return settled

    def _drop_dead(self, entry: Entry) -> str | None:
        """A dead process's entry: taken back (from the server too, if it was posted) and
        forgotten, or recorded as another machine's leader decided it; what became of a
        posted one (None: nothing to say, or no verdict known yet)."""
        posted = bool(self._post_of(entry.uid))
        if self._take_back(entry):
            self._forget(entry)
            return f"took back {entry.label}, posted by a run that stopped" if posted else None
        return self._settle_posted(entry)

    def _settle_posted(self, entry: Entry) -> str | None:
        """Record a dead process's posted attempt as another machine's leader decided it
        (its verdict, read here); None while no verdict is known."""
        found = self.verdict(entry.uid)
        if found is None:
            return None
        landed = found.status in ("promoted", "passed") and found.kind != "already"
        problems: dict[str, str] = {}
        ref, _ = self._published(
            attempts.write_record(
                self.repo,
                {**entry.record, "batch": found.batch},
                status=found.status,
                reason=found.reason or "decided by another machine's leader after it stopped",
                check=found.check,
                output=found.output,
                landed=found.new if landed and self.target.promotes else None,
                known_objects=entry.known_objects,
            ),
            entry.uid,
            problems,
        )
        self.discard(entry.uid)
        return f"recorded {entry.label} as {found.status} ({ref}), decided after its run stopped"

    def entries(self) -> list[Entry]:
        """The queued attempts that have no verdict yet, in arrival order."""
        with self._queue_lock():
            found = []
            for path in sorted(self.folder.glob("*.entry")):
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    entry = Entry(**{**data, "known_objects": tuple(data["known_objects"])})
                except (OSError, ValueError, TypeError, KeyError):
                    continue
                if not (self.folder / f"{entry.uid}.verdict").exists():
                    found.append(entry)
            return sorted(found, key=lambda e: e.seq)

    def _settle_dead_leaders(self, queued: list[Entry]) -> list[Entry]:
        """Entries an earlier leader died landing: finish them from its pending lines.

        With the target's lock held no mover is at work, so an open pending line for one of
        these entries is a dead leader's: on the target, the attempt landed (its record is
        written now); not on it, nothing moved and the entry stays queued.
        """
        log = self.target.log
        open_lines = {
            str(line.record.get("uid")): line
            for line in pending.open_lines(log.read(), self.target.ref)
        }
        left = []
        tip = self.target.tip()
        for entry in queued:
            line = open_lines.get(entry.uid)
            if line is None:
                left.append(entry)
                continue
            if line.new and tip and self.repo.is_ancestor(line.new, tip):
                found: dict[str, str] = {}
                written = self._landed_record(entry.uid)  # killed after its records
                ref, commit = (
                    (written.record_ref, written.record_commit)
                    if written is not None
                    else self._published(
                        attempts.write_record(
                            self.repo,
                            line.record,
                            status=str(line.record.get("status", "promoted")),
                            landed=line.new if self.target.promotes else None,
                        ),
                        entry.uid,
                        found,
                    )
                )
                log.append(
                    OpRecord("pending-done", self.target.ref, None, None, pending=line.pending)
                )
                self._decide(
                    entry,
                    Outcome(
                        str(line.record.get("status", "promoted")),
                        "landed by a leader that then stopped; completed by the next",
                        new=line.new,
                        old=line.old or "",
                        kind="merge",
                        record_ref=ref,
                        record_commit=commit,
                        record_problem=found.get(entry.uid),
                    ),
                )
            else:
                log.append(
                    OpRecord("pending-abandoned", self.target.ref, None, None, pending=line.pending)
                )
                left.append(entry)
        return left

    def _batch(self, batch: list[Entry], retest: BatchRetest) -> None:
        """Land ``batch`` (arrival order) onto the tip, re-tested once, bisected on failure."""
        for turn in range(MAX_ROUNDS):
            if turn:  # the move failed: some of them may be decided or taken back meanwhile
                batch = self._still_queued(batch)
                if not batch:
                    return
            tip = self.target.tip()  # read now, under the lock: never a stale tip
            if tip is None:
                raise RefMoved(self.target.ref, None, None)
            chain, aside, already = self._chain(tip, batch)
            for entry in already:
                self._already(entry, tip)
            if chain:
                landed = self._test_and_land(tip, chain, retest)
                if landed is None:
                    continue  # the target moved under us: merge the same batch again
            for entry in aside:  # judged alone, onto whatever landed
                self._batch_alone(entry, retest)
            return

    def _batch_alone(self, entry: Entry, retest: BatchRetest) -> None:
        for _ in range(MAX_ROUNDS):
            tip = self.target.tip()
            assert tip is not None
            chain, aside, already = self._chain(tip, [entry])
            if already:
                self._already(entry, tip)
                return
            if aside:
                preview = self.repo.merge_preview(tip, entry.change_commit)
                self._decide(
                    entry,
                    Outcome(
                        "conflict",
                        f"merge conflicts in: {', '.join(preview.conflicts)}",
                        "promote",
                        conflicts=list(preview.conflicts),
                    ),
                )
                return
            if self._test_and_land(tip, chain, retest) is not None:
                return

    def _chain(
        self, tip: str, batch: Sequence[Entry]
    ) -> tuple[list[tuple[Entry, str, str, str]], list[Entry], list[Entry]]:
        """Merge ``batch`` one after another onto ``tip``: (the chain of (entry, commit,
        tree, kind)), the entries set aside (conflicts), the entries already on the tip)."""
        chain: list[tuple[Entry, str, str, str]] = []
        aside: list[Entry] = []
        already: list[Entry] = []
        head = tip
        for entry in batch:
            try:
                head = self._link(tip, head, entry, chain, aside, already)
            except AgentgateError as exc:  # one entry that cannot merge must not stop the rest
                self._decide(
                    entry, Outcome("error", f"the queue could not merge it: {exc}", "promote")
                )
        return chain, aside, already

    def _link(
        self,
        tip: str,
        head: str,
        entry: Entry,
        chain: list[tuple[Entry, str, str, str]],
        aside: list[Entry],
        already: list[Entry],
    ) -> str:
        """Add ``entry`` to the chain that ends at ``head`` (or set it aside); the new head."""
        if head == entry.base:
            chain.append(
                (
                    entry,
                    entry.change_commit,
                    self.repo.tree_of(entry.change_commit),
                    "fast-forward",
                )
            )
            return entry.change_commit
        preview = self.repo.merge_preview(head, entry.change_commit)
        if preview.conflicts:
            aside.append(entry)
            return head
        if preview.tree == self.repo.tree_of(head):
            # Nothing to land is not a merge: on the tip already, or (an identical
            # change earlier in this batch) judged alone once the batch has landed.
            (already if head == tip else aside).append(entry)
            return head
        merge = self.repo.commit_tree(
            preview.tree,
            [head, entry.change_commit],
            records.merge_message(entry.task, entry.agent),
            Author.for_agent(entry.agent),
        )
        chain.append((entry, merge, preview.tree, "merge"))
        return merge

    def _test_and_land(
        self, tip: str, chain: list[tuple[Entry, str, str, str]], retest: BatchRetest
    ) -> str | None:
        """Re-test the chain's top (bisecting on failure) and land the longest passing
        prefix; the new tip, or None when the target moved meanwhile."""
        batch_id = uuid.uuid4().hex[:12]
        tested: dict[int, Retested] = {}

        def passes(k: int) -> bool:
            """Whether the tip plus the first ``k`` attempts passes (0: the tip itself)."""
            if k == 0:
                return True
            if all(kind == "fast-forward" and not e.foreign for e, _, _, kind in chain[:k]):
                return True  # exactly the attempt's own tree, judged by its own gate here
            if k not in tested:
                if k == len(chain):
                    tested[k] = self._top_test(tip, chain, retest)
                else:
                    bases = [entry.base for entry, _, _, _ in chain[:k]]
                    self.early.decide(chain[0][0].key, chain[k - 1][2])
                    tested[k] = retest(chain[k - 1][2], tip, bases)
            return tested[k].ok

        good = self._longest_passing(chain, passes, tested, batch_id)
        if good == 0:
            return tip
        landing = chain[:good]
        top = landing[-1][1]
        retested = any(k in tested and tested[k].ok for k in range(1, good + 1))
        # Another machine's attempts are recorded there, by the machine that reports them.
        records_of = [
            (commit, {**e.record, "pid": e.pid, "batch": f"{batch_id} ({i + 1} of {good})"})
            for i, (e, commit, _, _) in enumerate(landing)
            if not e.foreign
        ]
        written: dict[str, tuple[str, str]] = {}
        problems: dict[str, str] = {}

        def after_move() -> bool:
            ok = True
            for i, (entry, commit, _tree, kind) in enumerate(landing):
                if entry.foreign:
                    continue
                top_tested = i == good - 1 and retested
                fields = {
                    **entry.record,
                    "batch": f"{batch_id} ({i + 1} of {good})" if good > 1 else "",
                    # The top of a batch was tested; a merge below it was not, by itself.
                    "retest": (
                        "passed early" if good in tested and tested[good].early else "passed"
                    )
                    if top_tested
                    else "batched"
                    if kind == "merge"
                    else entry.record.get("retest", ""),
                }
                try:
                    written[entry.uid] = self._published(
                        attempts.write_record(
                            self.repo,
                            fields,
                            status=str(entry.record.get("status", "promoted")),
                            landed=commit if self.target.promotes else None,
                            known_objects=entry.known_objects,
                        ),
                        entry.uid,
                        problems,
                    )
                except (AgentgateError, OSError) as exc:
                    problems[entry.uid] = (
                        f"the target moved, but its attempt record could not be written ({exc}); "
                        "the next run or agentgate command completes it"
                    )
                    ok = False
            return ok

        def outcome(i: int, problem: str = "") -> Outcome:
            entry, commit, tree, kind = landing[i]
            ref_commit = written.get(entry.uid)
            return Outcome(
                str(entry.record.get("status", "promoted")),
                problem,
                old=tip if i == 0 else landing[i - 1][1],
                new=commit,
                kind=kind,
                tree=tree,
                retested=retested,
                batch=f"{batch_id} ({i + 1} of {good})" if good > 1 else "",
                record_ref=ref_commit[0] if ref_commit else None,
                record_commit=ref_commit[1] if ref_commit else None,
                record_problem=problems.get(entry.uid),
                tested_with=[e.label for e, _, _, _ in landing if e is not entry],
            )

        # On a server: the verdicts of other machines' attempts, and the queue refs of ours
        # posted there, go in the same atomic push as the branch (each taken exactly once).
        note = MoveNote(
            "promote",
            agent=landing[-1][0].agent,
            task=f"batch of {good}: " + "; ".join(e.task for e, _, _, _ in landing)[:200],
            kind="batch" if good > 1 else landing[0][3],
            batch=tuple(records_of),
            server_updates=self._server_updates(landing, outcome),
        )
        _faults.point("merge-written")
        # The move and its waiters' verdicts together: found by a trial, a Ctrl-C held
        # through the move was raised before the verdicts, and each waiter, finding none,
        # recorded its landed attempt a second time, as interrupted.
        with _faults.uninterrupted():
            result = self.target.move(
                top,
                tip,
                records.landing_reflog(
                    f"batch of {good}" if good > 1 else landing[0][0].task,
                    landing[-1][0].agent,
                    dry_run=not self.target.promotes,
                )
                + f" ({note.kind})",
                note,
                after_move,
            )
            if not result.moved:
                return None
            for i, (entry, _, _, _) in enumerate(landing):
                if not entry.foreign:  # (another machine's verdict went with the move)
                    self._unpost(entry.uid)
                    self._write_verdict(entry, outcome(i, result.problem or ""))
                else:  # told in this leader's summary: every landing it made is named
                    told = {"task": entry.task, "agent": entry.agent, "machine": entry.machine}
                    self.landed_for_others.append({**told, "uid": entry.uid, "new": top})
        return top

    def _longest_passing(
        self,
        chain: Sequence[_Link],
        passes: Callable[[int], bool],
        tested: Mapping[int, Retested],
        batch_id: str,
    ) -> int:
        """How many of the chain land: all when its top passes; else, bisecting over its
        prefixes, those before the first whose prefix fails, which is rejected (the
        attempts after it stay queued, for the next batch)."""
        n = len(chain)
        if passes(n):
            return n
        lo, hi = 0, n  # prefix lo passes, prefix hi fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if passes(mid):
                lo = mid
            else:
                hi = mid
        culprit = chain[hi - 1][0]
        why, output = tested[hi].why, tested[hi].output
        others = [e.label for e, _, _, _ in chain[: hi - 1]]
        self._decide(
            culprit,
            Outcome(
                "rejected",
                why + (f" (merged after {', '.join(others)})" if others else ""),
                "retest",
                output,
                retested=True,
                batch=batch_id,
                tested_with=others,
            ),
        )
        return lo

    def _server_updates(
        self, landing: Sequence[_Link], outcome: Callable[[int], Outcome]
    ) -> tuple[transport.RefUpdate, ...]:
        """What a landing's push sets on the server besides the branch: the verdicts of
        other machines' attempts, and the queue refs of this machine's posted ones taken."""
        shared = self.target.server_queue()
        if shared is None:
            return ()
        updates: list[transport.RefUpdate] = shared.heartbeats()
        for i, (entry, commit, _, _) in enumerate(landing):
            if entry.foreign:
                updates += shared.verdict_updates(
                    entry.key, entry.uid, entry.posted, asdict(outcome(i)), commit
                )
            elif posted := self._post_of(entry.uid):
                updates.append(shared.take_back(entry.key, entry.uid, posted))
        return tuple(updates)

    def _top_test(self, tip: str, chain: list[_Link], retest: BatchRetest) -> Retested:
        """Re-test the chain's top, or take the early re-test of exactly its tree."""
        key, tree = chain[0][0].key, chain[-1][2]
        early = self.early.result(key, tree, self._gate_s)
        # Judged here now, one way or another: from now on no early run of this tree,
        # written before or after, answers for it (a tree seen failing must not land on
        # an early pass of a run that overlapped).
        self.early.decide(key, tree)
        bases = [entry.base for entry, _, _, _ in chain]
        reuse = (
            None
            if early is None
            else Retested(
                early.ok,
                early.why,
                early.output,
                early.tests,
                early=True,
                fingerprint=early.fingerprint,
            )
        )
        return retest(tree, tip, bases, reuse=reuse)

    def _published(
        self, written: tuple[str, str], uid: str, problems: dict[str, str]
    ) -> tuple[str, str]:
        """A record just written, pushed to a remote target's server (its number claimed
        there: it may come back renumbered); a failure to push goes into ``problems``."""
        server = self.target.records()
        if server is None:
            return written
        ref, problem = server_records.publish(self.repo, server, *written)
        if problem:
            problems[uid] = problem
        return ref, written[1]

    def _already(self, entry: Entry, tip: str) -> None:
        """Nothing to land is not a merge: no commit, no move, no re-test. Unless this very
        attempt landed it: a leader that stopped (SIGKILL) after its move and records, before
        its verdicts, left its record: the verdict says so, and no second record is made."""
        mine = self._landed_record(entry.uid)
        if mine is not None:
            self._decide(entry, self._recorded(entry, mine, mine.landed or tip))
            return
        self._decide(
            entry,
            Outcome(
                str(entry.record.get("status", "promoted")),
                f"its change was already on the target, at {tip[:12]}: nothing moved",
                old=tip,
                new=tip,
                kind="already",
                tree=self.repo.tree_of(tip),
            ),
        )

    def _recorded(self, entry: Entry, mine: attempts.AttemptInfo, new: str) -> Outcome:
        """The verdict of an attempt a leader landed and recorded, then stopped (SIGKILL)
        before it wrote the verdict: its record says what it is."""
        return Outcome(
            str(entry.record.get("status", "promoted")),
            "landed by a leader that stopped before its verdict; completed by the next",
            new=new,
            kind="merge",
            record_ref=mine.record_ref,
            record_commit=mine.record_commit,
        )

    def _landed_record(self, uid: str) -> attempts.AttemptInfo | None:
        """The record of attempt ``uid`` that says it landed (promoted, or passed in a dry
        run), if one was written."""
        return next(
            (
                a
                for a in attempts.list_attempts(self.repo)
                if a.trailers.get("Id") == uid and a.verdict in ("promoted", "passed")
            ),
            None,
        )

    def _decide(self, entry: Entry, outcome: Outcome) -> None:
        """Give the waiter its verdict (the leader's own included): on the server for
        another machine's attempt; here for ours, once its post on the server (if any) is
        taken back, so that no other machine's leader decides it too."""
        if entry.foreign:
            shared = self.target.server_queue()
            if shared is not None:  # a lost race: another leader, or its poster, took it
                shared.push(
                    shared.verdict_updates(
                        entry.key, entry.uid, entry.posted, asdict(outcome), None
                    )
                )
            return
        if self._take_back(entry):
            self._write_verdict(entry, outcome)

    def _write_verdict(self, entry: Entry, outcome: Outcome) -> None:
        _write(self.folder / f"{entry.uid}.verdict", json.dumps(asdict(outcome)))

    # -- the server's queue (a branch on a server: see :mod:`.server_queue`) ---------------

    def _queued(self, key: str) -> list[Entry]:
        """The attempts of ``key`` to batch: this machine's, in arrival order, then those
        other machines posted on the server (judged here first), in the order they came."""
        shared = self.target.server_queue()
        listing = None
        if shared is not None:
            try:
                listing = shared.listing()
                self._sync_posted(shared, listing)  # (it may decide some of this machine's)
            except (AgentgateError, OSError):
                listing = None  # the server cannot be read now: this machine's batch goes on
        local = [e for e in self.entries() if e.key == key]
        if shared is None or listing is None:
            return local
        try:
            return local + self._foreign(shared, listing, key)
        except (AgentgateError, OSError):
            return local

    def _foreign(self, shared: ServerQueue, listing: Listing, key: str) -> list[Entry]:
        if self._judge is None:
            return []  # nothing to judge them with: their own machine leads them
        here = {e.uid for e in self.entries()}
        found = []
        for posted in shared.posted(listing, here, key):
            if posted.machine == shared.machine:
                # Posted from here, but no attempt here waits for it (it was decided, or its
                # process died between posting and noting it): taken back.
                shared.push([shared.take_back(key, posted.uid, posted.commit)])
                continue
            if not shared.can_decide(listing, posted.uid):
                continue  # its verdict could not be written: left to its own machine
            entry = self._entry_of(posted, key)
            if not shared.waiting(listing, posted.machine):
                self._decide(
                    entry,
                    Outcome(
                        "error",
                        "its machine stopped waiting for it (no heartbeat for a lease length)",
                        "queue",
                    ),
                )
                continue
            if posted.commit not in self._judged:
                untrusted = shared.untrusted(posted)
                self._judged[posted.commit] = untrusted or self._judge_posted(entry, posted)
            refused = self._judged[posted.commit]
            if refused:
                self._decide(
                    entry,
                    Outcome("rejected", f"the queue's leader refused it: {refused}", "queue"),
                )
                continue
            found.append(entry)
        return found

    def _entry_of(self, posted: Posted, key: str) -> Entry:
        def text(name: str) -> str:
            value = posted.data.get(name)
            if not isinstance(value, str):
                return ""
            return "".join(ch for ch in value if ch.isprintable())[:POSTED_NAME_MAX]

        status = "promoted" if self.target.promotes else "passed"
        agent, task = text("agent") or "agent", text("task") or "task"
        return Entry(
            seq=0,
            uid=posted.uid,
            key=key,
            change_commit=posted.change_commit,
            base=text("base"),
            agent=agent,
            task=task,
            record={"uid": posted.uid, "agent": agent, "task": task, "status": status},
            pid=0,
            posted=posted.commit,
            machine=posted.machine,
        )

    def _judge_posted(self, entry: Entry, posted: Posted) -> str | None:
        """Why a posted attempt is refused (None: it may be batched): anyone who can push
        can post one, so its change must stand on a base of the target's history, and pass
        protection, the harness and the limits as this machine's own would."""
        assert self._judge is not None
        try:
            records.check_name(entry.agent, "agent name", "a posted attempt")
            parents = self.repo.parents(entry.change_commit)
        except AgentgateError as exc:
            return str(exc)
        if parents != [entry.base]:
            return "its change commit's parent is not the base it names"
        tip = self.repo.ref_value(self.target.ref)
        if tip is None or not self.repo.is_ancestor(entry.base, tip):
            # Perhaps a tip this machine has not fetched yet (another machine landed it).
            tip = self.target.tip()
            if tip is None or not self.repo.is_ancestor(entry.base, tip):
                return f"its base {entry.base[:12]} is not in {self.target.label}'s history"
        return self._judge(entry.change_commit, entry.base, posted.data)

    def _sync_posted(self, shared: ServerQueue, listing: Listing) -> None:
        """This machine's posted attempts that another machine's leader decided: their
        verdicts, read from the server (and believed only as far as the server's branch
        shows them); one whose post is gone without a verdict is this machine's again."""
        waiting = {e.uid: e for e in self.entries()}
        for path in self.folder.glob("*.posted"):
            uid = path.name[: -len(".posted")]
            commit = self._post_of(uid)
            entry = waiting.get(uid)
            key = self._posted_key(uid)
            if entry is None:  # decided here meanwhile, or its process gone
                if key and shared.still_posted(listing, key, uid, commit):
                    shared.push([shared.take_back(key, uid, commit)])
                self._unpost(uid)
                continue
            if shared.still_posted(listing, entry.key, uid, commit):
                continue  # still waiting there
            said = shared.verdicts(listing, [uid]).get(uid)
            outcome = self._believe(entry, said[1]) if said is not None else None
            if outcome is not None:
                self._write_verdict(entry, outcome)
                _faults.point("verdict-read")  # another machine's verdict read, not yet told
                assert said is not None
                shared.push([shared.clear_verdict(uid, said[0])])
            self._unpost(uid)

    def _believe(self, entry: Entry, said: Mapping[str, object]) -> Outcome | None:
        """The verdict another machine's leader wrote for ``entry``, if it holds: a landing
        only when the server's branch has the attempt's change (anyone who can push can
        write a verdict)."""

        def text(name: str) -> str:
            value = said.get(name, "")
            if not isinstance(value, str):
                return ""
            return value[: VERDICT_OUTPUT_MAX if name == "output" else POSTED_NAME_MAX * 10]

        def texts(name: str) -> list[str]:
            value = said.get(name, [])
            return (
                [v for v in value if isinstance(v, str)][:1000] if isinstance(value, list) else []
            )

        status = text("status")
        outcome = Outcome(
            status,
            text("reason"),
            text("check"),
            text("output"),
            old=text("old"),
            new=text("new"),
            kind=text("kind"),
            tree=text("tree"),
            retested=said.get("retested") is True,
            batch=text("batch"),
            tested_with=texts("tested_with"),
            conflicts=texts("conflicts"),
        )
        if status not in ("promoted", "passed", "rejected", "conflict", "error"):
            return None
        tip = self.target.tip()
        if tip is None:
            return None
        if status in ("rejected", "conflict", "error"):
            # Not believed when the change is in the branch after all: a verdict written
            # over the real one must not make a landed attempt report a failure.
            return None if self.repo.is_ancestor(entry.change_commit, tip) else outcome
        if outcome.kind == "already":
            preview = self.repo.merge_preview(tip, entry.change_commit)
            if preview.conflicts or preview.tree != self.repo.tree_of(tip):
                return None
            return replace(outcome, status=str(entry.record.get("status", status)), new=tip)
        new = outcome.new
        try:
            landed = (
                self.repo.has_object(new)
                and self.repo.is_ancestor(entry.change_commit, new)
                and self.repo.is_ancestor(new, tip)
            )
        except AgentgateError:
            landed = False
        if not landed:
            return None
        return replace(outcome, status=str(entry.record.get("status", status)))

    def _while_waiting(self, shared: ServerQueue, key: str) -> bool:
        """While another machine holds the lease: post this machine's queued attempts on the
        server (for that leader; the lease's wait keeps the heartbeat), and read the verdicts.
        Whether none of ``key`` is left to lead here."""
        now = time.monotonic()
        if now - self._last_poll < SERVER_POLL_S:
            return False
        self._last_poll = now
        try:
            listing = shared.listing()
            self._sync_posted(shared, listing)
            for entry in self._without_dead_owners(self.entries()):
                if not self._post_of(entry.uid):
                    commit = shared.post(entry.uid, entry.change_commit, entry.key, _posting(entry))
                    if commit is not None:
                        self._mark_posted(entry.uid, commit, entry.key)
        except (AgentgateError, OSError):
            return False  # the server cannot be read now: wait for the lease, as before
        left = self.entries()
        if not left:
            shared.stop_waiting(listing)
        return not any(e.key == key for e in left)

    def _post(self, entry: Entry) -> None:
        """For a branch on a server, post a queued attempt there at once: a leader on
        another machine that begins a batch now takes it in, rather than re-testing one
        without it (the machines' gates run at the same time, so their attempts arrive
        together). Best effort: a waiter that cannot post leads, or posts while it waits."""
        shared = self.target.server_queue()
        if shared is None:
            return
        with contextlib.suppress(AgentgateError, OSError):
            commit = shared.post(entry.uid, entry.change_commit, entry.key, _posting(entry))
            if commit is not None:
                self._mark_posted(entry.uid, commit, entry.key)

    def _take_back(self, entry: Entry) -> bool:
        """Take this machine's attempt back from the server's queue, if it was posted there;
        False when another machine's leader has taken it (its verdict is read instead)."""
        commit = self._post_of(entry.uid)
        shared = self.target.server_queue() if commit else None
        if shared is None:
            return True
        if shared.push([shared.take_back(entry.key, entry.uid, commit)]):
            self._unpost(entry.uid)
            return True
        try:
            listing = shared.listing()
        except AgentgateError:
            return False
        if shared.still_posted(listing, entry.key, entry.uid, commit):
            return False  # the server could not be written: it stays posted
        self._sync_posted(shared, listing)
        if self.verdict(entry.uid) is not None or self._post_of(entry.uid):
            return False
        # Gone without a verdict one can believe: landed all the same when the branch holds
        # its change (a verdict that could not be written, or was deleted), so not withdrawn.
        tip = self.target.tip()
        if tip is not None and self.repo.is_ancestor(entry.change_commit, tip):
            self._write_verdict(
                entry,
                Outcome(
                    str(entry.record.get("status", "promoted")),
                    "landed by another machine's leader (its verdict is not on the server)",
                    old="",
                    new=tip,
                    kind="landed",
                ),
            )
            return False
        return True

    def _still_queued(self, batch: list[Entry]) -> list[Entry]:
        """What of ``batch`` is still to land after a move that failed: not decided meanwhile
        (here or, for a posted one, by the server's queue)."""
        shared = self.target.server_queue()
        if shared is None:
            return [e for e in batch if self.verdict(e.uid) is None]
        try:
            listing = shared.listing()
            self._sync_posted(shared, listing)
        except (AgentgateError, OSError):
            return [e for e in batch if not e.foreign and self.verdict(e.uid) is None]
        return [
            e
            for e in batch
            if (listing.queue.get(e.uid) == e.posted if e.foreign else self.verdict(e.uid) is None)
        ]

    def _post_of(self, uid: str) -> str:
        """The commit this machine posted ``uid`` as on the server's queue ("" if none)."""
        return self._posted_note(uid)[0]

    def _posted_key(self, uid: str) -> str:
        """The batch key (the folder) ``uid`` was posted under ("" if unknown)."""
        return self._posted_note(uid)[1]

    def _posted_note(self, uid: str) -> tuple[str, str]:
        try:
            words = (self.folder / f"{uid}.posted").read_text(encoding="ascii").split()
        except (OSError, ValueError):
            return "", ""
        return (words[0] if words else "", words[1] if len(words) > 1 else "")

    def _mark_posted(self, uid: str, commit: str, key: str = "") -> None:
        _write(self.folder / f"{uid}.posted", f"{commit} {key}".strip())

    def _unpost(self, uid: str) -> None:
        (self.folder / f"{uid}.posted").unlink(missing_ok=True)

    # -- files ----------------------------------------------------------------------------

    def _entry_path(self, seq: int, uid: str) -> Path:
        return self.folder / f"{seq:012d}-{uid}.entry"

    @contextmanager
    def _queue_lock(self) -> Iterator[None]:
        with locks.ref_lock(self.repo, f"queue/{self.target.ref}"):
            yield


#: One link of a batch's chain: (its entry, the commit that lands it, that commit's tree,
#: "merge" or "fast-forward").
_Link = tuple[Entry, str, str, str]


def _posting(entry: Entry) -> dict[str, object]:
    """What the server's queue says of an attempt: what a leader on another machine needs
    to merge it, and what it declared of its limits (the leader adds its own)."""
    return {
        "key": entry.key,
        "base": entry.base,
        "agent": entry.agent,
        "task": entry.task,
        "test": entry.record.get("test", ""),
        "began": entry.began,
        "protect": entry.record.get("protect", []),
        "max_changed_lines": entry.record.get("max_changed_lines"),
    }
