"""The leader's work: gather a batch, merge it onto the tip as a chain, re-test its top once,
bisect it when it fails, move the target once to the longest passing prefix.

A part of the queue (see :mod:`.queue`), given its files, its server posts, its recovery and
its early re-tests; one turn's arguments come as a :class:`Lead`."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from .. import _faults
from ..errors import AgentgateError, RefMoved
from ..git import transport
from ..store import attempts, records
from ..store.record import Record, Retest
from . import clashes, planning
from .landings import change_landed, judged_as_is, landing_commit
from .retest import BatchRetest, Retested
from .target import MoveNote

if TYPE_CHECKING:
    from ..remote.server_queue import ServerQueue

from .early import EarlyRetests
from .posting import ServerPosts
from .queue_folder import (
    MAX_ROUNDS,
    SERVER_POLL_S,
    Entry,
    Judge,
    Link,
    Outcome,
    QueueFiles,
    posting_of,
)
from .recovery import Recovery


@dataclass
class Lead:
    """One turn of leading, as the waiter that holds the target's lock asks for it: the
    batch key, how a batch is re-tested, and what comes back."""

    key: str
    retest: BatchRetest
    #: How long a gate takes (0: unknown): a batch with room waits a little for attempts
    #: whose gates began with its own.
    gate_s: float = 0.0
    #: How other machines' posted attempts are judged (None: none is taken).
    judge: Judge | None = None
    #: The leading waiter's own attempt: the turn ends once it is decided.
    own: str = ""
    #: Other machines' attempts this turn landed (for its process's summary).
    landed_for_others: list[dict[str, str]] = field(default_factory=list)


class Leader:
    """Batches of one target's queue, as the holder of its lock lands them."""

    def __init__(
        self,
        files: QueueFiles,
        posts: ServerPosts,
        recovery: Recovery,
        early: EarlyRetests,
        batch_max: int,
    ) -> None:
        self.files = files
        self.posts = posts
        self.recovery = recovery
        self.early = early
        self.batch_max = batch_max
        self.repo = files.repo
        self.target = files.target
        self._last_poll = 0.0

    def _gather(self, queued: list[Entry], gate_s: float) -> None:
        """Wait (a bounded time) for the attempts whose gates began with the batch's own
        to join it: they should arrive about when these did.

        Not for one whose gate began later (see :func:`.planning.gather`).
        """
        key = queued[0].key
        # By this machine's clock: another's may be skewed.
        plan = planning.gather([e.began for e in queued if not e.foreign], time.time(), gate_s)
        began_by, deadline = plan.began_by, time.monotonic() + plan.wait_s
        have = len(queued)
        while (
            have < self.batch_max
            and time.monotonic() < deadline
            and self.files.in_flight(key, began_by)
        ):
            time.sleep(0.01)
            have = sum(1 for e in self.files.entries() if e.key == key)

    def run(self, lead: Lead) -> None:
        """Land every queued attempt of ``lead.key``, batch after batch (until its own
        attempt is decided, with ``lead.own``). Call with the target's lock (and, for a
        branch on a server, its lease) held."""
        key, gate_s, own = lead.key, lead.gate_s, lead.own
        settle = self.files.mark_leading()
        self.recovery.sweep_answered()
        try:
            for _ in range(MAX_ROUNDS * 4):
                if own and self.files.verdict(own) is not None:
                    return  # decided: the next batch is a waiter's to lead
                queued = self.posts.queued(key, lead.judge)
                if not queued:
                    return
                if settle:
                    queued = self.recovery.settle_dead_leaders(queued)
                if gate_s > 0 and len(queued) < self.batch_max:
                    self._gather(queued, gate_s)
                    queued = self.posts.queued(key, lead.judge)
                    if settle:
                        queued = self.recovery.settle_dead_leaders(queued)
                queued = self.recovery.without_dead_owners(queued)
                if queued:
                    self._batch(queued[: self.batch_max], lead)
        finally:
            with contextlib.suppress(OSError):
                self.files.unmark_leading()

    def _batch(self, batch: list[Entry], lead: Lead) -> None:
        """Land ``batch`` (arrival order) onto the tip, re-tested once, bisected on failure."""
        for turn in range(MAX_ROUNDS):
            if turn:  # the move failed: some of them may be decided or taken back meanwhile
                batch = self._still_queued(batch)
                if not batch:
                    return
            tip = self.target.tip()  # read now, under the lock: never a stale tip
            if tip is None:
                raise RefMoved(self.target.ref, None, None)
            chain, aside, already = self.chain(tip, batch)
            for entry in already:
                self.recovery.already(entry, tip)
            if chain:
                landed = self._test_and_land(tip, chain, lead)
                if landed is None:
                    continue  # the target moved under us: merge the same batch again
            for entry in aside:  # judged alone, onto whatever landed
                self._batch_alone(entry, lead)
            return

    def _batch_alone(self, entry: Entry, lead: Lead) -> None:
        for _ in range(MAX_ROUNDS):
            tip = self.target.tip()
            assert tip is not None
            chain, aside, already = self.chain(tip, [entry])
            if already:
                self.recovery.already(entry, tip)
                return
            if aside:
                preview = self.repo.merge_preview(tip, entry.change_commit)
                clash = clashes.conflicting(self.repo, entry.base, tip, preview.conflicts)
                self.posts.decide(
                    entry,
                    Outcome(
                        "conflict",
                        f"merge conflicts in: {', '.join(preview.conflicts)}"
                        + (f" ({clash})" if clash else ""),
                        "promote",
                        conflicts=list(preview.conflicts),
                    ),
                )
                return
            if self._test_and_land(tip, chain, lead) is not None:
                return

    def chain(
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
                self.posts.decide(
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
        if entry.record.landing != "merge" and change_landed(
            self.repo, entry.change_commit, entry.base, tip
        ):
            # A squashed or replayed change is not the tip's ancestor: a merge preview
            # would not see it landed (a leader that died before its verdicts landed it).
            already.append(entry)
            return head
        if head == entry.base:
            tree = self.repo.tree_of(entry.change_commit)
        else:
            preview = self.repo.merge_preview(head, entry.change_commit)
            if preview.conflicts:
                aside.append(entry)
                return head
            if preview.tree == self.repo.tree_of(head):
                # Nothing to land is not a merge: on the tip already, or (an identical
                # change earlier in this batch) judged alone once the batch has landed.
                (already if head == tip else aside).append(entry)
                return head
            tree = preview.tree
        landed = landing_commit(self.repo, head, entry.change_commit, tree, entry.record)
        chain.append((entry, landed.commit, landed.tree, landed.kind))
        return landed.commit

    def _test_and_land(
        self, tip: str, chain: list[tuple[Entry, str, str, str]], lead: Lead
    ) -> str | None:
        """Re-test the chain's top (bisecting on failure) and land the longest passing
        prefix; the new tip, or None when the target moved meanwhile."""
        batch_id = uuid.uuid4().hex[:12]
        tested: dict[int, Retested] = {}

        def passes(k: int) -> bool:
            """Whether the tip plus the first ``k`` attempts passes (0: the tip itself)."""
            if k == 0:
                return True
            if planning.as_judged(tip, chain[:k]):
                return True  # exactly the attempts' own trees, judged by their gates here
            if k not in tested:
                tested[k] = self._prefix_test(tip, chain[:k], lead, top=k == len(chain))
                if tested[k].fault:  # the harness failed, not the tree: once more
                    tested[k] = self._prefix_test(tip, chain[:k], lead, top=False)
            return tested[k].ok

        good = self._longest_passing(tip, chain, passes, tested, batch_id)
        if good == 0:
            return tip
        landed = _Landed(
            tip, chain[:good], batch_id,
            retested=any(
                k in tested and tested[k].ok and not tested[k].skipped for k in range(1, good + 1)
            ),
            top_early=good in tested and tested[good].early,
            untested=any(t.skipped for t in tested.values()),
        )  # fmt: skip
        return self._move_batch(landed, lead)

    def _prefix_test(self, tip: str, links: list[Link], lead: Lead, *, top: bool) -> Retested:
        """Re-test the tip merged with ``links`` (the whole chain: ``top``, which may take
        the early re-test of exactly its tree)."""
        if top:
            return self._top_test(tip, links, lead)
        bases = [entry.base for entry, _, _, _ in links]
        self.early.decide(links[0][0].key, links[-1][2])
        return lead.retest(links[-1][2], tip, bases)

    def _move_batch(self, landed: _Landed, lead: Lead) -> str | None:
        """Move the target to the top of ``landed``'s chain, its records written right
        after the move and its waiters' verdicts with it; the new tip, or None when the
        target moved meanwhile."""
        landing, good = landed.links, landed.good
        top = landing[-1][1]
        # Another machine's attempts are recorded there, by the machine that reports them.
        records_of = [
            (commit, replace(e.record, pid=e.pid, batch=f"{landed.batch_id} ({i + 1} of {good})"))
            for i, (e, commit, _, _) in enumerate(landing)
            if not e.foreign
        ]
        # On a server: the verdicts of other machines' attempts, and the queue refs of ours
        # posted there, go in the same atomic push as the branch (each taken exactly once).
        note = MoveNote(
            "promote",
            agent=landing[-1][0].agent,
            task=f"batch of {good}: " + "; ".join(e.task for e, _, _, _ in landing)[:200],
            kind="batch" if good > 1 else landing[0][3],
            batch=tuple(records_of),
            server_updates=self._server_updates(landing, landed.outcome),
        )
        _faults.point("merge-written")
        # The move and its waiters' verdicts together: a Ctrl-C held through the move and
        # raised before the verdicts would leave each waiter to record its landed attempt
        # a second time, as interrupted.
        with _faults.uninterrupted():
            result = self.target.move(
                top,
                landed.tip,
                records.landing_reflog(
                    f"batch of {good}" if good > 1 else landing[0][0].task,
                    landing[-1][0].agent,
                    dry_run=not self.target.promotes,
                )
                + f" ({note.kind})",
                note,
                lambda: self._write_batch_records(landed),
            )
            if not result.moved:
                return None
            for i, (entry, _, _, _) in enumerate(landing):
                if not entry.foreign:  # (another machine's verdict went with the move)
                    self.files.unpost(entry.uid)
                    self.files.write_verdict(entry, landed.outcome(i, result.problem or ""))
                else:  # told in this leader's summary: every landing it made is named
                    told = {"task": entry.task, "agent": entry.agent, "machine": entry.machine}
                    lead.landed_for_others.append({**told, "uid": entry.uid, "new": top})
        return top

    def _write_batch_records(self, landed: _Landed) -> bool:
        """The records of this machine's attempts in ``landed`` (right after the move);
        False when one could not be written (the next run completes it)."""
        ok = True
        for i, (entry, commit, _tree, _kind) in enumerate(landed.links):
            if entry.foreign:
                continue
            try:
                landed.written[entry.uid] = self.files.published(
                    attempts.write_record(
                        self.repo,
                        landed.fields(i),
                        landed=commit if self.target.promotes else None,
                        known_objects=entry.known_objects,
                    ),
                    entry.uid,
                    landed.problems,
                )
            except (AgentgateError, OSError) as exc:
                landed.problems[entry.uid] = (
                    f"the target moved, but its attempt record could not be written ({exc}); "
                    "the next run or agentgate command completes it"
                )
                ok = False
        return ok

    def _longest_passing(
        self,
        tip: str,
        chain: Sequence[Link],
        passes: Callable[[int], bool],
        tested: Mapping[int, Retested],
        batch_id: str,
    ) -> int:
        """How many of the chain land: all when its top passes; else, bisecting over its
        prefixes, those before the first whose prefix fails, which is rejected (the
        attempts after it stay queued, for the next batch)."""
        lo, hi = planning.bisect(len(chain), passes)
        if not hi:
            return lo
        culprit = chain[hi - 1][0]
        why, output = tested[hi].why, tested[hi].output
        others = [e.label for e, _, _, _ in chain[: hi - 1]]
        # Who it clashes with: what landed since its base, or a neighbour before it here.
        if tested[hi].fault:
            # Twice the harness's failure, not the change's: an error of the run, which
            # rejects nothing (the attempts after it stay queued, as on a rejection).
            self.posts.decide(
                culprit,
                Outcome(
                    "error",
                    f"the re-test of its merge could not run, twice: {why}",
                    "retest",
                    output,
                    batch=batch_id,
                    tested_with=others,
                ),
            )
            return lo
        suspect = clashes.retest_suspects(
            self.repo, culprit.base, tip, output, [c for _, c, _, _ in chain[: hi - 1]]
        )
        self.posts.decide(
            culprit,
            Outcome(
                "rejected",
                why
                + (f" (merged after {', '.join(others)})" if others else "")
                + (f"; {suspect}" if suspect else ""),
                "retest",
                output,
                retested=True,
                batch=batch_id,
                tested_with=others,
            ),
        )
        return lo

    def _server_updates(
        self, landing: Sequence[Link], outcome: Callable[[int], Outcome]
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
            elif posted := self.files.post_of(entry.uid):
                updates.append(shared.take_back(entry.key, entry.uid, posted))
        return tuple(updates)

    def _top_test(self, tip: str, chain: list[Link], lead: Lead) -> Retested:
        """Re-test the chain's top, or take the early re-test of exactly its tree."""
        key, tree = chain[0][0].key, chain[-1][2]
        early = self.early.result(key, tree, lead.gate_s)
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
        return lead.retest(tree, tip, bases, reuse=reuse)

    def _still_queued(self, batch: list[Entry]) -> list[Entry]:
        """What of ``batch`` is still to land after a move that failed: not decided meanwhile
        (here or, for a posted one, by the server's queue)."""
        shared = self.target.server_queue()
        if shared is None:
            return [e for e in batch if self.files.verdict(e.uid) is None]
        try:
            listing = shared.listing()
            self.posts.sync_posted(shared, listing)
        except (AgentgateError, OSError):
            return [e for e in batch if not e.foreign and self.files.verdict(e.uid) is None]
        return [
            e
            for e in batch
            if (
                listing.queue.get(e.uid) == e.posted
                if e.foreign
                else self.files.verdict(e.uid) is None
            )
        ]

    def while_waiting(self, shared: ServerQueue, key: str) -> bool:
        """While another machine holds the lease: post this machine's queued attempts on the
        server (for that leader; the lease's wait keeps the heartbeat), and read the verdicts.
        Whether none of ``key`` is left to lead here."""
        now = time.monotonic()
        if now - self._last_poll < SERVER_POLL_S:
            return False
        self._last_poll = now
        try:
            listing = shared.listing()
            self.posts.sync_posted(shared, listing)
            for entry in self.recovery.without_dead_owners(self.files.entries()):
                if not self.files.post_of(entry.uid):
                    commit = shared.post(
                        entry.uid, entry.change_commit, entry.key, posting_of(entry)
                    )
                    if commit is not None:
                        self.files.mark_posted(entry.uid, commit, entry.key)
        except (AgentgateError, OSError):
            return False  # the server cannot be read now: wait for the lease, as before
        left = self.files.entries()
        if not left:
            shared.stop_waiting(listing)
        return not any(e.key == key for e in left)


@dataclass
class _Landed:
    """The passing prefix of a batch that one move lands, and what its records and its
    waiters' verdicts say."""

    tip: str
    links: list[Link]
    batch_id: str
    retested: bool
    top_early: bool
    #: Its batch lands without a re-test: each record says what its attempt said.
    untested: bool = False
    written: dict[str, tuple[str, str]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def good(self) -> int:
        return len(self.links)

    def batch_label(self, i: int) -> str:
        return f"{self.batch_id} ({i + 1} of {self.good})" if self.good > 1 else ""

    def fields(self, i: int) -> Record:
        """The record of link ``i``: the top of a batch was tested; a merge below it was
        not, by itself."""
        entry, _, _, kind = self.links[i]
        if i == self.good - 1 and self.retested:
            retest: Retest = "passed early" if self.top_early else "passed"
        else:
            head = self.tip if i == 0 else self.links[i - 1][1]
            batched = not judged_as_is(head, entry.base, kind) and not self.untested
            retest = "batched" if batched else entry.record.retest
        return replace(entry.record, batch=self.batch_label(i), retest=retest)

    def outcome(self, i: int, problem: str = "") -> Outcome:
        entry, commit, tree, kind = self.links[i]
        ref_commit = self.written.get(entry.uid)
        return Outcome(
            entry.record.status,
            problem,
            old=self.tip if i == 0 else self.links[i - 1][1],
            new=commit,
            kind=kind,
            tree=tree,
            retested=self.retested,
            batch=self.batch_label(i),
            record_ref=ref_commit[0] if ref_commit else None,
            record_commit=ref_commit[1] if ref_commit else None,
            record_problem=self.problems.get(entry.uid),
            tested_with=[e.label for e, _, _, _ in self.links if e is not entry],
        )
