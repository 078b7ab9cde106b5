"""What a dead waiter or a dead leader left in the queue, settled by the next leader: entries
whose waiter died, moves whose records were not written, verdicts nobody will read.

A part of the queue (see :mod:`.queue`), given its files and its server posts."""

from __future__ import annotations

import json
from dataclasses import replace

from ..store import attempts, pending
from ..store.oplog import OpRecord
from ..store.record import Record
from .posting import ServerPosts
from .queue_folder import Entry, Outcome, QueueFiles, landed_kind


class Recovery:
    """How a leader finds and finishes what the processes before it left undone."""

    def __init__(self, files: QueueFiles, posts: ServerPosts) -> None:
        self.files = files
        self.posts = posts
        self.repo = files.repo
        self.target = files.target

    def sweep_answered(self) -> None:
        """Forget the entries that have a verdict and no waiter left to read it (it died
        after its verdict was written: its record is the leader's), else they would stay in
        the queue's folder for good. Not for a branch on a server: a dead
        poster's verdict from another machine is read at its machine's next run, to record
        it (:meth:`settle_posted`)."""
        if self.target.server_queue() is not None:
            return
        for path in self.files.folder.glob("*.entry"):
            uid = path.stem.split("-", 1)[-1]
            if not (self.files.folder / f"{uid}.verdict").exists():
                continue
            try:
                pid = int(json.loads(path.read_text(encoding="utf-8"))["pid"])
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if not pending.pid_alive(pid):
                self.files.discard(uid)

    def without_dead_owners(self, queued: list[Entry]) -> list[Entry]:
        """Drop the entries whose process is gone: nobody would report them, so nothing of
        theirs lands (what a dead leader already landed was finished just before)."""
        alive = []
        for entry in queued:
            if entry.foreign or pending.pid_alive(entry.pid):  # posted: its heartbeat said
                alive.append(entry)
            else:
                self.drop_dead(entry)
        return alive

    def settle_posted(self) -> list[str]:
        """At a run's start: this machine's posted attempts whose process is gone. Each is
        taken back from the server, or, when another machine's leader decided it meanwhile,
        recorded as it decided (nobody else would: that leader records its own machine's
        attempts only). What the server cannot be asked about now stays for the next run."""
        if self.target.server_queue() is None or not any(self.files.folder.glob("*.posted")):
            return []
        settled = []
        with self.target.lock():
            for entry in self.files.entries():
                if (
                    entry.foreign
                    or pending.pid_alive(entry.pid)
                    or not self.files.post_of(entry.uid)
                ):
                    continue
                if (note := self.drop_dead(entry)) is not None:
                    settled.append(note)
        return settled

    def drop_dead(self, entry: Entry) -> str | None:
        """A dead process's entry: taken back (from the server too, if it was posted) and
        forgotten, or recorded as another machine's leader decided it; what became of a
        posted one (None: nothing to say, or no verdict known yet)."""
        posted = bool(self.files.post_of(entry.uid))
        if self.posts.take_back(entry):
            self.files.forget(entry)
            return f"took back {entry.label}, posted by a run that stopped" if posted else None
        return self._settle_posted(entry)

    def _settle_posted(self, entry: Entry) -> str | None:
        """Record a dead process's posted attempt as another machine's leader decided it
        (its verdict, read here); None while no verdict is known."""
        found = self.files.verdict(entry.uid)
        if found is None:
            return None
        landed = found.status in ("promoted", "passed") and found.kind != "already"
        problems: dict[str, str] = {}
        ref, _ = self.files.published(
            attempts.write_record(
                self.repo,
                replace(entry.record, batch=found.batch, status=found.status),
                reason=found.reason or "decided by another machine's leader after it stopped",
                check=found.check,
                output=found.output,
                landed=found.new if landed and self.target.promotes else None,
                known_objects=entry.known_objects,
            ),
            entry.uid,
            problems,
        )
        self.files.discard(entry.uid)
        return f"recorded {entry.label} as {found.status} ({ref}), decided after its run stopped"

    def settle_dead_leaders(self, queued: list[Entry]) -> list[Entry]:
        """Entries an earlier leader died landing: finish them from its pending lines.

        With the target's lock held no mover is at work, so an open pending line for one of
        these entries is a dead leader's: on the target, the attempt landed (its record is
        written now); not on it, nothing moved and the entry stays queued.
        """
        log = self.target.log
        open_lines = {
            Record.from_json(line.record).uid: line
            for line in pending.open_lines(log.read(), self.target.ref)
        }
        left = []
        tip = self.target.tip()
        for entry in queued:
            line = open_lines.get(entry.uid)
            if line is None:
                left.append(entry)
                continue
            if line.new and tip and self.repo.history.is_ancestor(line.new, tip):
                found: dict[str, str] = {}
                written = self.files.landed_record(entry.uid)  # killed after its records
                ref, commit = (
                    (written.record_ref, written.record_commit)
                    if written is not None
                    else self.files.published(
                        attempts.write_record(
                            self.repo,
                            Record.from_json(line.record),
                            landed=line.new if self.target.promotes else None,
                        ),
                        entry.uid,
                        found,
                    )
                )
                log.append(
                    OpRecord("pending-done", self.target.ref, None, None, pending=line.pending)
                )
                self.posts.decide(
                    entry,
                    Outcome(
                        Record.from_json(line.record).status,
                        "landed by a leader that then stopped; completed by the next",
                        new=line.new,
                        old=line.old or "",
                        kind=landed_kind(entry.record.landing),
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

    def already(self, entry: Entry, tip: str) -> None:
        """Nothing to land is not a merge: no commit, no move, no re-test. Unless this very
        attempt landed it: a leader that stopped (SIGKILL) after its move and records, before
        its verdicts, left its record: the verdict says so, and no second record is made."""
        mine = self.files.landed_record(entry.uid)
        if mine is not None:
            self.posts.decide(entry, self.files.recorded(entry, mine, mine.landed or tip))
            return
        self.posts.decide(
            entry,
            Outcome(
                entry.record.status,
                f"its change was already on the target, at {tip[:12]}: nothing moved",
                old=tip,
                new=tip,
                kind="already",
                tree=self.repo.tree_of(tip),
            ),
        )
