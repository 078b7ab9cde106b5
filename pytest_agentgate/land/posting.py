"""Attempts on a server's queue: posting this machine's, taking them back, believing another
machine's verdicts, and judging the attempts other machines posted before a batch takes them.

A part of the queue (see :mod:`.queue`), given the queue's files; recovery and the leader
hold it."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

from .. import _faults
from ..errors import AgentgateError
from ..store import records
from ..store.record import STATUSES, Status

if TYPE_CHECKING:
    from ..remote.server_queue import Listing, Posted, ServerQueue

from .landings import change_landed, lands
from .queue_folder import (
    POSTED_NAME_MAX,
    VERDICT_OUTPUT_MAX,
    Entry,
    Judge,
    Outcome,
    QueueFiles,
    posting_of,
)


class ServerPosts:
    """The queue's side of a branch on a server (:mod:`..remote.server_queue`)."""

    def __init__(self, files: QueueFiles) -> None:
        self.files = files
        self.repo = files.repo
        self.target = files.target
        #: What the judge said of each posted attempt (by its queue commit): None, passed.
        self._judged: dict[str, str | None] = {}

    def sync_posted(self, shared: ServerQueue, listing: Listing) -> None:
        """This machine's posted attempts that another machine's leader decided: their
        verdicts, read from the server (and believed only as far as the server's branch
        shows them); one whose post is gone without a verdict is this machine's again."""
        waiting = {e.uid: e for e in self.files.entries()}
        for path in self.files.folder.glob("*.posted"):
            uid = path.name[: -len(".posted")]
            commit = self.files.post_of(uid)
            entry = waiting.get(uid)
            key = self.files.posted_key(uid)
            if entry is None:  # decided here meanwhile, or its process gone
                if key and shared.still_posted(listing, key, uid, commit):
                    shared.push([shared.take_back(key, uid, commit)])
                self.files.unpost(uid)
                continue
            if shared.still_posted(listing, entry.key, uid, commit):
                continue  # still waiting there
            said = shared.verdicts(listing, [uid]).get(uid)
            outcome = self.believe(entry, said[1]) if said is not None else None
            if outcome is not None:
                self.files.write_verdict(entry, outcome)
                _faults.point("verdict-read")  # another machine's verdict read, not yet told
                assert said is not None
                shared.push([shared.clear_verdict(uid, said[0])])
            self.files.unpost(uid)

    def believe(self, entry: Entry, said: Mapping[str, object]) -> Outcome | None:
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
        if status not in STATUSES:
            return None
        outcome = Outcome(
            status,  # type: ignore[arg-type]  # one of STATUSES
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
        tip = self.target.tip()
        if tip is None:
            return None
        if status in ("rejected", "conflict", "error"):
            # Not believed when the change is in the branch after all: a verdict written
            # over the real one must not make a landed attempt report a failure.
            return None if self.landed_in(entry, tip) else outcome
        if outcome.kind == "already":
            preview = self.repo.merge_preview(tip, entry.change_commit)
            if preview.conflicts or preview.tree != self.repo.tree_of(tip):
                return None
            return replace(outcome, status=entry.record.status, new=tip)
        new = outcome.new
        try:
            landed = (
                self.repo.has_object(new)
                and lands(self.repo, new, entry.change_commit)
                and self.repo.history.is_ancestor(new, tip)
            )
        except AgentgateError:
            landed = False
        if not landed:
            return None
        return replace(outcome, status=entry.record.status)

    def take_back(self, entry: Entry) -> bool:
        """Take this machine's attempt back from the server's queue, if it was posted there;
        False when another machine's leader has taken it (its verdict is read instead)."""
        commit = self.files.post_of(entry.uid)
        shared = self.target.server_queue() if commit else None
        if shared is None:
            return True
        if shared.push([shared.take_back(entry.key, entry.uid, commit)]):
            self.files.unpost(entry.uid)
            return True
        try:
            listing = shared.listing()
        except AgentgateError:
            return False
        if shared.still_posted(listing, entry.key, entry.uid, commit):
            return False  # the server could not be written: it stays posted
        self.sync_posted(shared, listing)
        if self.files.verdict(entry.uid) is not None or self.files.post_of(entry.uid):
            return False
        # Gone without a verdict one can believe: landed all the same when the branch holds
        # its change (a verdict that could not be written, or was deleted), so not withdrawn.
        tip = self.target.tip()
        if tip is not None and self.landed_in(entry, tip):
            self.files.write_verdict(
                entry,
                Outcome(
                    entry.record.status,
                    "landed by another machine's leader (its verdict is not on the server)",
                    old="",
                    new=tip,
                    kind="landed",
                ),
            )
            return False
        return True

    def landed_in(self, entry: Entry, tip: str) -> bool:
        """Whether the target's history up to ``tip`` holds the entry's landing."""
        try:
            return change_landed(self.repo, entry.change_commit, entry.base, tip) is not None
        except AgentgateError:
            return False

    def decide(self, entry: Entry, outcome: Outcome) -> None:
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
        if self.take_back(entry):
            self.files.write_verdict(entry, outcome)

    def post(self, entry: Entry) -> None:
        """For a branch on a server, post a queued attempt there at once: a leader on
        another machine that begins a batch now takes it in, rather than re-testing one
        without it (the machines' gates run at the same time, so their attempts arrive
        together). Best effort: a waiter that cannot post leads, or posts while it waits."""
        shared = self.target.server_queue()
        if shared is None:
            return
        with contextlib.suppress(AgentgateError, OSError):
            commit = shared.post(entry.uid, entry.change_commit, entry.key, posting_of(entry))
            if commit is not None:
                self.files.mark_posted(entry.uid, commit, entry.key)

    def entry_of(self, posted: Posted, key: str) -> Entry:
        status: Status = "promoted" if self.target.promotes else "passed"
        return Entry(
            seq=0,
            uid=posted.uid,
            key=key,
            change_commit=posted.change_commit,
            # Recorded by the machine that posted it: this one writes no record of it. It
            # lands as its own machine's settings say (an older poster's: as a merge).
            record=records.record_of_posting(posted.data, posted.uid, status),
            pid=0,
            posted=posted.commit,
            machine=posted.machine,
        )

    def judge_posted(self, entry: Entry, judge: Judge) -> str | None:
        """Why a posted attempt is refused (None: it may be batched): anyone who can push
        can post one, so its change must stand on a base of the target's history, and pass
        protection, the harness and the limits as this machine's own would."""
        try:
            records.check_name(entry.agent, "agent name", "a posted attempt")
            parents = self.repo.history.parents(entry.change_commit)
        except AgentgateError as exc:
            return str(exc)
        if parents != [entry.base]:
            return "its change commit's parent is not the base it names"
        tip = self.repo.refs.value(self.target.ref)
        if tip is None or not self.repo.history.is_ancestor(entry.base, tip):
            # Perhaps a tip this machine has not fetched yet (another machine landed it).
            tip = self.target.tip()
            if tip is None or not self.repo.history.is_ancestor(entry.base, tip):
                return f"its base {entry.base[:12]} is not in {self.target.label}'s history"
        return judge(entry.change_commit, entry.base, entry.record)

    def foreign(
        self, shared: ServerQueue, listing: Listing, key: str, judge: Judge | None
    ) -> list[Entry]:
        if judge is None:
            return []  # nothing to judge them with: their own machine leads them
        here = {e.uid for e in self.files.entries()}
        found = []
        for posted in shared.posted(listing, here, key):
            if posted.machine == shared.machine:
                # Posted from here, but no attempt here waits for it (it was decided, or its
                # process died between posting and noting it): taken back.
                shared.push([shared.take_back(key, posted.uid, posted.commit)])
                continue
            if not shared.can_decide(listing, posted.uid):
                continue  # its verdict could not be written: left to its own machine
            entry = self.entry_of(posted, key)
            if not shared.waiting(listing, posted.machine):
                self.decide(
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
                self._judged[posted.commit] = untrusted or self.judge_posted(entry, judge)
            refused = self._judged[posted.commit]
            if refused:
                self.decide(
                    entry,
                    Outcome("rejected", f"the queue's leader refused it: {refused}", "queue"),
                )
                continue
            found.append(entry)
        return found

    def queued(self, key: str, judge: Judge | None) -> list[Entry]:
        """The attempts of ``key`` to batch: this machine's, in arrival order, then those
        other machines posted on the server (judged here first), in the order they came."""
        shared = self.target.server_queue()
        listing = None
        if shared is not None:
            try:
                listing = shared.listing()
                self.sync_posted(shared, listing)  # (it may decide some of this machine's)
            except (AgentgateError, OSError):
                listing = None  # the server cannot be read now: this machine's batch goes on
        local = [e for e in self.files.entries() if e.key == key]
        if shared is None or listing is None:
            return local
        try:
            return local + self.foreign(shared, listing, key, judge)
        except (AgentgateError, OSError):
            return local
