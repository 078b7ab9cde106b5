"""The queue's files: its entries, the waiters' verdicts, the attempts on their way, and what
was posted on a server, each a small file in the plugin's own directory, written whole.

The lowest layer of the queue (see :mod:`.queue`): it knows the files' names and formats,
not who leads or what a batch is."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

from .. import _faults
from ..git.repo import BaseRepo
from ..remote import server_records
from ..store import attempts, locks, pending, records
from ..store.files import write_whole as _write
from ..store.record import Record, Status
from .target import Target

MAX_ROUNDS = 20

#: How often a machine waiting for another's lease reads the server's queue (seconds).
SERVER_POLL_S = 0.2
#: The longest task or agent name a posted attempt may bring (it goes into commit messages).
POSTED_NAME_MAX = records.POSTED_NAME_MAX
#: The most of a gate's output another machine's verdict may bring (as a record keeps).
VERDICT_OUTPUT_MAX = 20_000


@dataclass(frozen=True)
class Entry:
    """One queued attempt: what the leader needs to land it and to write its record."""

    seq: int
    uid: str
    key: str
    change_commit: str
    #: What the attempt's record says, its status included (its task, agent and base: the
    #: entry's own fields are the queue's).
    record: Record
    pid: int
    known_objects: tuple[str, ...] = ()
    #: When the attempt's own gate began (seconds since the epoch; 0: unknown).
    began: float = 0.0
    #: Another machine's attempt, posted on the server: its queue commit, and that machine.
    posted: str = ""
    machine: str = ""

    @property
    def base(self) -> str:
        return self.record.base

    @property
    def agent(self) -> str:
        return self.record.agent

    @property
    def task(self) -> str:
        return self.record.task

    @property
    def label(self) -> str:
        return f"{self.task!r} by {self.agent}"

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "record": self.record.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        """The entry an entry file holds (``KeyError``, ``TypeError`` when it is not one;
        keys of no field, such as an older writer's, are left out)."""
        record = Record.from_json(data["record"])
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in data.items() if k in known}
        return cls(**{**kept, "known_objects": tuple(data["known_objects"]), "record": record})

    @property
    def foreign(self) -> bool:
        """Posted by another machine: its own gate is that machine's word, not ours."""
        return bool(self.machine)


class Judge(Protocol):
    """Judge another machine's posted attempt as this machine judges its own (protection,
    the harness, the limits): why it is refused, or None. ``declared`` is the record it
    posted."""

    def __call__(self, change_commit: str, base: str, declared: Record) -> str | None: ...


@dataclass
class Outcome:
    """A queued attempt's verdict, as the leader found it (written to the waiter's file)."""

    status: Status
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
    #: Other machines' attempts the waiter's process landed while it led (for its summary).
    landed_for_others: list[dict[str, str]] = field(default_factory=list)


#: One link of a batch's chain: (its entry, the commit that lands it, that commit's tree,
#: "merge" or "fast-forward").
Link = tuple[Entry, str, str, str]


class QueueFiles:
    """The files of one target's queue: written and read here, decided elsewhere."""

    def __init__(self, repo: BaseRepo, target: Target) -> None:
        self.repo = repo
        self.target = target

    @property
    def folder(self) -> Path:
        """The queue's directory (named by the target's ref, which a dry run sets at start)."""
        return self.repo.private_dir / "queue" / self.target.ref.replace("/", "%2F")

    def discard(self, uid: str) -> None:
        """Forget ``uid``'s entry and verdict here, whatever they said (its waiter read
        them)."""
        with self._queue_lock():
            for path in self.folder.glob(f"*-{uid}.entry"):
                path.unlink(missing_ok=True)
            (self.folder / f"{uid}.verdict").unlink(missing_ok=True)
            self.unpost(uid)

    def forget(self, entry: Entry) -> None:
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
            _write(self._entry_path(entry.seq, entry.uid), json.dumps(entry.to_json()))
        _faults.point("enqueued")  # the entry is written, its waiter not yet waiting
        return entry

    def verdict(self, uid: str) -> Outcome | None:
        """The verdict the leader left for ``uid``, if it has one yet."""
        try:
            data = json.loads((self.folder / f"{uid}.verdict").read_text(encoding="utf-8"))
            return Outcome(**data)
        except (OSError, ValueError, TypeError):
            return None  # none yet, or none this version can read (its waiter then leads)

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

    def in_flight(self, key: str, began_by: float) -> int:
        """How many attempts of ``key`` are being judged whose gate began by ``began_by``."""
        return sum(1 for _, data in self.intents(key) if float(str(data["since"])) <= began_by)

    def entries(self) -> list[Entry]:
        """The queued attempts that have no verdict yet, in arrival order."""
        with self._queue_lock():
            found = []
            for path in sorted(self.folder.glob("*.entry")):
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    entry = Entry.from_json(data)
                except (OSError, ValueError, TypeError, KeyError):
                    continue
                if not (self.folder / f"{entry.uid}.verdict").exists():
                    found.append(entry)
            return sorted(found, key=lambda e: e.seq)

    def write_verdict(self, entry: Entry, outcome: Outcome) -> None:
        # What the waiter's own process adds after reading it stays out of the file (a
        # waiter of another version sharing the queue reads the fields it knows).
        said = {k: v for k, v in asdict(outcome).items() if k != "landed_for_others"}
        _write(self.folder / f"{entry.uid}.verdict", json.dumps(said))

    def _entry_path(self, seq: int, uid: str) -> Path:
        return self.folder / f"{seq:012d}-{uid}.entry"

    @contextmanager
    def _queue_lock(self) -> Iterator[None]:
        with locks.ref_lock(self.repo, f"queue/{self.target.ref}"):
            yield

    def post_of(self, uid: str) -> str:
        """The commit this machine posted ``uid`` as on the server's queue ("" if none)."""
        return self._posted_note(uid)[0]

    def posted_key(self, uid: str) -> str:
        """The batch key (the folder) ``uid`` was posted under ("" if unknown)."""
        return self._posted_note(uid)[1]

    def _posted_note(self, uid: str) -> tuple[str, str]:
        try:
            words = (self.folder / f"{uid}.posted").read_text(encoding="ascii").split()
        except (OSError, ValueError):
            return "", ""
        return (words[0] if words else "", words[1] if len(words) > 1 else "")

    def mark_posted(self, uid: str, commit: str, key: str = "") -> None:
        _write(self.folder / f"{uid}.posted", f"{commit} {key}".strip())

    def unpost(self, uid: str) -> None:
        (self.folder / f"{uid}.posted").unlink(missing_ok=True)

    def published(
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

    def landed_record(self, uid: str) -> attempts.AttemptInfo | None:
        """The record of attempt ``uid`` that says it landed (promoted, or passed in a dry
        run), if one was written."""
        return next(
            (
                a
                for a in attempts.list_attempts(self.repo)
                if a.record.uid == uid and a.verdict in ("promoted", "passed")
            ),
            None,
        )

    def recorded(self, entry: Entry, mine: attempts.AttemptInfo, new: str) -> Outcome:
        """The verdict of an attempt a leader landed and recorded, then stopped (SIGKILL)
        before it wrote the verdict: its record says what it is."""
        return Outcome(
            entry.record.status,
            "landed by a leader that stopped before its verdict; completed by the next",
            new=new,
            kind=landed_kind(entry.record.landing),
            record_ref=mine.record_ref,
            record_commit=mine.record_commit,
        )

    def unmark_leading(self) -> None:
        """The leader's work is done (or it gave up): no mark of it is left."""
        (self.folder / "leading").unlink(missing_ok=True)

    def mark_leading(self) -> bool:
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


def landed_kind(landing: str) -> str:
    """The kind of move a queue's landing made (a queue's move is never a fast-forward of
    its own: it lands onto a tip that moved)."""
    return landing if landing in ("squash", "rebase") else "merge"


def posting_of(entry: Entry) -> dict[str, object]:
    """What the server's queue says of an attempt: what a leader on another machine needs
    to merge it, and what it declared of its limits (the leader adds its own)."""
    return {"key": entry.key, "began": entry.began, **records.posting_of_record(entry.record)}
