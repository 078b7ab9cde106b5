"""The server's half of the landing queue: one queue across machines for a branch on a server.

Each machine's landing queue (:mod:`.queue`) batches its own processes' attempts. With a
target on a server, a machine whose leader waits for another machine's lease (:mod:`.lease`)
*posts* its queued attempts there, as refs ``refs/agentgate/queue/<branch>/<uid>``: a commit
(the empty tree) whose one parent is the attempt's change commit and whose message holds
what a leader needs of it (the batch key, the base, the task, the agent). The lease holder
takes them into its batches beside its own, and trusts nothing in them, since anyone who can
push can write one: it re-judges protection, the harness and the limits with its own
settings, and re-tests every posted attempt (never a fast-forward on the poster's word).

A leader's verdict on a posted attempt is a ref ``refs/agentgate/verdicts/<branch>/<uid>``,
written in the same atomic push that deletes the queue ref by compare-and-swap (so an attempt
is taken once: by one leader, or back by its poster) and, for a landing, moves the branch.
The poster reads its verdict there, and believes a landing only when its change is in the
server's branch.

A machine renews ``refs/agentgate/alive/<branch>/<machine>`` while it waits; a leader drops
the posted attempts of a machine whose heartbeat has not changed for a lease length plus the
margin (it died waiting), as a local leader drops those of a dead process.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import AgentgateError
from ..git import transport
from ..git.repo import Author
from ..store import locks

if TYPE_CHECKING:
    from ..git.repo import BaseRepo
    from .server_records import Server

QUEUE = "refs/agentgate/queue/"
VERDICTS = "refs/agentgate/verdicts/"
ALIVE = "refs/agentgate/alive/"
#: The first line of a posted attempt's message (what a leader looks for before the JSON).
POSTED_TITLE = "agentgate queued attempt"
VERDICT_TITLE = "agentgate verdict"
_UID = re.compile(r"[0-9a-f]{8,64}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,80}")
_AUTHOR = Author("agentgate", "agentgate@localhost")
#: A posted attempt larger than this is not read (anyone who can push can write one).
MAX_MESSAGE = 256 * 1024
#: The version of what posted attempts and verdicts say: a newer one is left alone (its
#: machine leads it itself once it holds the lease), never misread.
FORMAT = 1


@dataclass(frozen=True)
class Trust:
    """How this machine signs what it posts, and which posts it believes.

    Anyone who can push can post an attempt, so a leader takes a post only when it is
    signed (git's SSH signatures) by a key of ``allowed_signers`` (git's allowed-signers
    file), unless a person opted into unsigned posts. A machine posts only what it can sign
    (or with that opt-in); otherwise it waits for the lease and leads its own attempts."""

    signing_key: Path | None = None
    allowed_signers: Path | None = None
    unsigned: bool = False

    @property
    def posts(self) -> bool:
        return self.signing_key is not None or self.unsigned


@dataclass(frozen=True)
class Posted:
    """An attempt on the server's queue, as its ref says (nothing in it is trusted)."""

    uid: str
    commit: str
    change_commit: str
    data: Mapping[str, object]
    machine: str
    #: Who signed it, as the allowed-signers file names them (None: nobody it names).
    signer: str | None = None


@dataclass
class Listing:
    """One look at the server's queue: what is posted, decided, and who is waiting."""

    queue: dict[str, str] = field(default_factory=dict)  # uid -> queue commit
    refs: dict[str, str] = field(default_factory=dict)  # every queue ref -> its commit
    verdicts: dict[str, str] = field(default_factory=dict)  # uid -> verdict commit
    alive: dict[str, str] = field(default_factory=dict)  # machine -> heartbeat commit
    #: Refs git cannot write there, a ref below each name being in the way (a D/F clash).
    blocked: set[str] = field(default_factory=set)


class ServerQueue:
    """The shared queue of one branch on one server, as one machine's queue sees it."""

    def __init__(
        self,
        repo: BaseRepo,
        server: Server,
        branch: str,
        *,
        machine: str,
        seconds: float,
        trust: Trust | None = None,
    ) -> None:
        self.repo, self.server, self.branch = repo, server, branch
        self.trust = trust or Trust()
        self.machine = machine if _NAME.fullmatch(machine) else "machine"
        self.seconds = seconds
        self.queue_prefix = f"{QUEUE}{branch}/"
        self.verdict_prefix = f"{VERDICTS}{branch}/"
        self.alive_ref = f"{ALIVE}{branch}/{self.machine}"
        #: Where posted attempts and verdicts are fetched to, to read them.
        self.mirror = f"refs/agentgate/remote/{server.remote}/"
        self._parsed: dict[str, Posted | None] = {}
        #: Each queued attempt's ref on the server, by its uid (as listed or posted).
        self._refs: dict[str, str] = {}
        #: Refs git could not write there when last listed (a ref below each name).
        self._blocked: set[str] = set()
        #: The heartbeat commits this process wrote.
        self._mine: set[str] = set()
        #: When each heartbeat commit was first seen here (by this machine's clock).
        self._first_seen: dict[str, float] = {}
        #: When each heartbeat commit says it was written (None: it cannot be read).
        self._beats: dict[str, float | None] = {}
        self._beat = 0.0
        #: The server refused a post on policy (a hook on refs/agentgate/*): none again.
        self.refused = False

    # -- reading --------------------------------------------------------------------------

    def listing(self) -> Listing:
        """The queue, the verdicts and the heartbeats, as the server holds them now."""
        found = transport.list_refs(
            self.repo,
            self.server.fetch_url,
            [f"{self.queue_prefix}*", f"{self.verdict_prefix}*", f"{ALIVE}{self.branch}/*"],
            name=self.server.remote,
        )
        seen = Listing()
        twice: set[str] = set()
        for ref, oid in found.items():
            if ref.startswith(self.queue_prefix):
                key, _, uid = ref[len(self.queue_prefix) :].partition("/")
                if _UID.fullmatch(key) and _UID.fullmatch(uid):
                    seen.refs[ref] = oid
                    if uid in seen.queue:
                        twice.add(uid)  # one attempt in two folders: no leader takes it
                    seen.queue[uid] = oid
                    self._refs[uid] = ref
                continue
            for prefix, into, pattern in (
                (self.verdict_prefix, seen.verdicts, _UID),
                (f"{ALIVE}{self.branch}/", seen.alive, _NAME),
            ):
                name = ref[len(prefix) :] if ref.startswith(prefix) else ""
                if name and pattern.fullmatch(name):
                    into[name] = oid
                elif name and "/" in name and pattern.fullmatch(name.split("/")[0]):
                    # A ref below the name (``<uid>/x``) keeps git from writing the name
                    # itself: whatever would write it leaves it out (see :meth:`blocked`).
                    seen.blocked.add(f"{prefix}{name.split('/')[0]}")
        for uid in twice:
            del seen.queue[uid], self._refs[uid]
        now = time.monotonic()
        for oid in seen.alive.values():
            self._first_seen.setdefault(oid, now)
        self._blocked = set(seen.blocked)
        return seen

    def still_posted(self, listing: Listing, key: str, uid: str, commit: str) -> bool:
        """Whether the attempt this machine posted as ``commit`` under ``key`` is still
        there, under that very ref (the same uid written under another folder is not it)."""
        return listing.refs.get(self._ref(key, uid)) == commit

    def _ref(self, key: str, uid: str) -> str:
        return f"{self.queue_prefix}{key}/{uid}" if key else self._refs.get(uid, "")

    def can_decide(self, listing: Listing, uid: str) -> bool:
        """Whether a verdict for ``uid`` can be written there (no ref below its name)."""
        return f"{self.verdict_prefix}{uid}" not in listing.blocked

    def waiting(self, listing: Listing, machine: str) -> bool:
        """Whether ``machine`` still waits for its posted attempts: its heartbeat is there,
        was written within a lease length plus the skew margin (by the time it names), and
        has changed within that long here (a heartbeat written by hand to last for ever is
        honoured for one length). A machine renews it while it waits and while it leads, so
        a leader that died holding the lease left one too old by the time it is taken over."""
        from .lease import margin

        oid = listing.alive.get(machine)
        if oid is None:
            return False
        limit = self.seconds + margin(self.seconds)
        seen = self._first_seen.setdefault(oid, time.monotonic())
        if time.monotonic() - seen > limit:
            return False
        if oid not in self._beats and not self.repo.has_object(oid):
            with contextlib.suppress(AgentgateError):
                self._fetch(f"+{ALIVE}{self.branch}/*:{self.mirror}alive/{self.branch}/*")
            if not self.repo.has_object(oid):
                # Renewed since it was listed (the fetch brought the newer one): it lives.
                # One that stays unreadable is caught above, once unchanged for a length.
                return True
        if oid not in self._beats:
            self._beats[oid] = self._beat_time(oid)
        at = self._beats[oid]
        return at is not None and time.time() <= at + limit

    def _beat_time(self, oid: str) -> float | None:
        try:
            message = self.repo.history.commit_message(oid)
        except AgentgateError:
            return None
        for line in message.splitlines():
            key, _, value = line.partition(": ")
            if key == "At":
                try:
                    at = float(value)
                except ValueError:
                    return None
                return None if math.isnan(at) else at  # nan is no time
        return None

    def posted(self, listing: Listing, skip: set[str], key: str) -> list[Posted]:
        """The attempts posted for ``key`` (but ``skip``), read from their refs; those that
        cannot be read as one are left out (and left there: the poster, or prune, takes
        them). Only that key's folder is fetched: others' objects never travel here."""
        folder = f"{self.queue_prefix}{key}/"
        wanted = {
            u: c
            for u, c in listing.queue.items()
            if u not in skip and listing.refs.get(f"{folder}{u}") == c
        }
        if any(c not in self._parsed for c in wanted.values()):
            self._fetch(f"+{folder}*:{self.mirror}queue/{self.branch}/{key}/*")
        todo = [(u, c) for u, c in wanted.items() if c not in self._parsed]
        if len(todo) > 1:  # each signature is checked by a process of its own: at once
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
                parsed = pool.map(lambda t: self._parse(*t), todo)
                for (_, commit), item in zip(todo, parsed, strict=True):
                    self._parsed[commit] = item
        found = []
        for uid, commit in wanted.items():
            if commit not in self._parsed:
                self._parsed[commit] = self._parse(uid, commit)
            item = self._parsed[commit]
            if item is not None and item.uid == uid:
                found.append(item)
        return sorted(found, key=lambda p: _number(p.data.get("posted")))

    def _parse(self, uid: str, commit: str) -> Posted | None:
        if not self.repo.has_object(commit):
            return None
        try:
            parents = self.repo.history.parents(commit)
            message = self.repo.history.commit_message(commit)
        except AgentgateError:
            return None
        title, _, body = message.partition("\n")
        if title.strip() != POSTED_TITLE or len(parents) != 1 or len(body) > MAX_MESSAGE:
            return None
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
            return None
        if not isinstance(data, dict) or data.get("uid") != uid or _newer(data):
            return None
        machine = str(data.get("machine", ""))
        if not _NAME.fullmatch(machine):
            return None
        allowed = self.trust.allowed_signers
        signer = self.repo.signer(commit, allowed) if allowed is not None else None
        return Posted(uid, commit, parents[0], data, machine, signer)

    def untrusted(self, posted: Posted) -> str | None:
        """Why ``posted`` is not believed (None: it is signed by an allowed key, or this run
        takes unsigned posts)."""
        if self.trust.unsigned or posted.signer is not None:
            return None
        if self.trust.allowed_signers is None:
            return (
                "it cannot be checked: this leader has no --agentgate-allowed-signers to verify "
                "its signature against (or pass --agentgate-unsigned-posts)"
            )
        return (
            "it is not signed by a key --agentgate-allowed-signers names (anyone who can push "
            "can post an attempt)"
        )

    def verdicts(
        self, listing: Listing, uids: Sequence[str]
    ) -> dict[str, tuple[str, dict[str, object]]]:
        """The verdicts there are for ``uids``: (verdict commit, what it says)."""
        there = {u: listing.verdicts[u] for u in uids if u in listing.verdicts}
        if not there:
            return {}
        self._fetch(
            *(f"+{self.verdict_prefix}{u}:{self.mirror}verdicts/{self.branch}/{u}" for u in there),
            prune=False,
        )
        found: dict[str, tuple[str, dict[str, object]]] = {}
        for uid, commit in there.items():
            try:
                title, _, body = self.repo.history.commit_message(commit).partition("\n")
                if len(body) > MAX_MESSAGE:
                    continue
                data = json.loads(body) if title.strip() == VERDICT_TITLE else None
            except (AgentgateError, ValueError, RecursionError):
                continue
            if isinstance(data, dict) and data.get("uid") == uid and not _newer(data):
                found[uid] = (commit, data)
        return found

    def _fetch(self, *refspecs: str, prune: bool = True) -> None:
        with locks.ref_lock(self.repo, f"fetch/{self.mirror}queue/{self.branch}"):
            if prune:
                transport.fetch_refs(
                    self.repo, self.server.fetch_url, refspecs, name=self.server.remote
                )
            else:
                for spec in refspecs:  # one at a time: a verdict deleted meanwhile is no error
                    with contextlib.suppress(AgentgateError):
                        transport.fetch_refs(
                            self.repo, self.server.fetch_url, [spec], name=self.server.remote
                        )

    # -- writing --------------------------------------------------------------------------

    def post(
        self, uid: str, change_commit: str, key: str, data: Mapping[str, object]
    ) -> str | None:
        """Put an attempt on the server's queue (with this machine's heartbeat, in one
        push); its queue commit, or None when the server would not take it (one that
        refuses on policy is not asked again by this process)."""
        if self.refused or not self.trust.posts:
            return None
        if not (_UID.fullmatch(key) and _UID.fullmatch(uid)):
            return None
        body = json.dumps(
            {**data, "uid": uid, "machine": self.machine, "posted": time.time(), "format": FORMAT}
        )
        commit = self.repo.commit_tree(
            self.repo.empty_tree(), [change_commit], f"{POSTED_TITLE}\n{body}", _AUTHOR,
            signing_key=self.trust.signing_key,
        )  # fmt: skip
        ref = f"{self.queue_prefix}{key}/{uid}"
        updates = [transport.RefUpdate(ref, commit, self.repo.null_oid), *self.heartbeats()]
        try:
            pushed = transport.push(
                self.repo, self.server.push_url, updates, name=self.server.remote
            )
        except AgentgateError:
            return None
        if pushed.ok:
            self._beat = time.monotonic()
            self._refs[uid] = ref
            return commit
        self.refused = pushed.refused is not None
        return None

    def heartbeats(self) -> list[transport.RefUpdate]:
        """This machine's heartbeat, renewed, for a push that also does something else
        (none when a ref below its name keeps git from writing it: that push must not
        fail for it)."""
        if self.alive_ref in self._blocked:
            return []
        commit = self.repo.commit_tree(
            self.repo.empty_tree(), [], f"agentgate waiting\n\nAt: {time.time():.3f}\n", _AUTHOR
        )
        self._mine.add(commit)
        return [transport.RefUpdate(self.alive_ref, commit, None, force=True)]

    def keep_alive(self) -> None:
        """While this process waits for the lease however it waits: renew this machine's
        heartbeat if it has one there (its other processes' posted attempts wait behind
        this one, holding no lock, and must not be taken for a dead machine's); a look at
        most every third of a lease length."""
        if self.refused or time.monotonic() - self._beat < self.seconds / 3:
            return
        self._beat = time.monotonic()
        there = transport.list_refs(
            self.repo, self.server.fetch_url, [self.alive_ref], name=self.server.remote
        )
        beats = self.heartbeats() if self.alive_ref in there else []
        if beats:
            transport.push(self.repo, self.server.push_url, beats, name=self.server.remote)

    def verdict_updates(
        self, key: str, uid: str, posted: str, outcome: Mapping[str, object], landed: str | None
    ) -> list[transport.RefUpdate]:
        """The ref updates that decide the attempt posted as ``posted``: its queue ref
        deleted (compare-and-swap: taken once) and its verdict written (its parent the
        landed commit, if any, so that the poster fetching it has that commit)."""
        body = json.dumps({**outcome, "uid": uid, "format": FORMAT})
        verdict = self.repo.commit_tree(
            self.repo.empty_tree(), [landed] if landed else [], f"{VERDICT_TITLE}\n{body}",
            _AUTHOR,
        )  # fmt: skip
        return [
            self.take_back(key, uid, posted),
            transport.RefUpdate(f"{self.verdict_prefix}{uid}", verdict, None, force=True),
        ]

    def take_back(self, key: str, uid: str, commit: str) -> transport.RefUpdate:
        """The update that deletes a queue ref (compare-and-swap: only if it is still the
        attempt read, so that it is taken once)."""
        return transport.RefUpdate(self._ref(key, uid), "", commit)

    def clear_verdict(self, uid: str, commit: str) -> transport.RefUpdate:
        return transport.RefUpdate(f"{self.verdict_prefix}{uid}", "", commit)

    def push(self, updates: Sequence[transport.RefUpdate]) -> bool:
        """Push ``updates`` all or none; whether they landed (a lost race is False)."""
        if not updates:
            return True
        try:
            return transport.push(
                self.repo, self.server.push_url, updates, name=self.server.remote
            ).ok
        except AgentgateError:
            return False

    def stop_waiting(self, listing: Listing) -> None:
        """Nothing of this process waits any more: its heartbeat goes (best effort), only
        if it is still the one this process wrote: another process of this machine may
        have posted (and beaten) since, and must not lose its heartbeat."""
        there = listing.alive.get(self.machine)
        if there is not None and there in self._mine:
            with contextlib.suppress(AgentgateError):
                transport.push(
                    self.repo, self.server.push_url,
                    [transport.RefUpdate(self.alive_ref, "", there)], name=self.server.remote,
                )  # fmt: skip
        self._beat = 0.0


def _number(value: object) -> float:
    """A number a posted attempt gives (anything else, and nan, as 0: it sorts first)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return 0.0
    return float(value)


def _newer(data: Mapping[str, object]) -> bool:
    """Written by a newer version than this one reads (absent: the first)."""
    found = data.get("format", 1)
    return not isinstance(found, int) or found > FORMAT
