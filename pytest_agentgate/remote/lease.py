"""The server's lease on a branch: one batch leader at a time across machines.

Each machine's landing queue (:mod:`.queue`) batches its own attempts under a local lock. With
a target on a server, two machines' leaders would each re-test a batch at once, and the one
that lost the push race would merge and re-test again. So a leader first takes the branch's
lease on the server, ``refs/agentgate/lease/<branch>``: a commit (empty tree) whose message
names its holder and when it expires, created or replaced by compare-and-swap push. Others
wait (reading the ref on the server, with a pause that grows) until it is released or has
expired, then take it over. The holder renews it while its batch runs, and every move it
makes renews it in the same ``--atomic`` push as the branch, with its own lease check: a
leader whose lease was taken over cannot land (its push fails whole) and takes the lease
again before it tries again.

Expiry tolerates clock skew: a lease is taken over only once it has been expired for a
margin, a quarter of its length and at least a second, by the taker's clock; and one that
has not changed for a whole length plus that margin (by the waiter's own clock) is taken over
whatever expiry it claims: a live holder renews it with a new commit, and anyone who can push
could write one that claims to last for ever.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import AgentgateError, NotNeeded
from ..git import transport
from ..git.repo import Author

if TYPE_CHECKING:
    from ..git.repo import BaseRepo

PREFIX = "refs/agentgate/lease/"
#: How long a wait for another machine's lease may last before it is an error.
WAIT_LIMIT_S = 3600.0
#: The longest pause between reads of a lease while this machine's attempts wait for its
#: holder's verdicts (else a second).
WAITING_PAUSE_S = 0.3
_AUTHOR = Author("agentgate", "agentgate@localhost")


def margin(seconds: float) -> float:
    """How long past its expiry a lease is still honoured (clock skew between machines)."""
    return max(1.0, seconds / 4)


@dataclass(frozen=True)
class LeaseInfo:
    holder: str
    expires: float


class LeaseLost(AgentgateError):
    """The lease was taken over (it expired while this leader held it)."""


class Lease:
    """The lease of one branch on one server, as one process holds it."""

    def __init__(
        self, repo: BaseRepo, url: str, branch: str, *, seconds: float, name: str = "the remote"
    ) -> None:
        self.repo, self.url, self.branch, self.name = repo, url, branch, name
        self.seconds = seconds
        self.ref = f"{PREFIX}{branch}"
        #: Where the server's lease is fetched to, to read who holds it.
        self.mirror = f"refs/agentgate/remote/{name}/lease/{branch}"
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        #: The lease commit this process holds on the server, or None.
        self.held: str | None = None
        self._lock = threading.Lock()
        self._depth = 0
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()
        #: Why the last :meth:`hold` went on without a lease ("" when it held one).
        self.unavailable = ""
        #: More refs each renewal sets (forced), in the same push: this machine's heartbeat
        #: on the server's queue, so that its posted attempts live exactly as long as it does.
        self.riders: Callable[[], Sequence[transport.RefUpdate]] | None = None
        #: Called while another holds the lease, whatever waits: this machine's heartbeat
        #: is kept for its posted attempts (its other processes wait behind this one).
        self.on_wait: Callable[[], None] | None = None

    # -- what the server holds ------------------------------------------------------------

    def read(self) -> tuple[str | None, LeaseInfo | None]:
        """(the lease commit on the server, who holds it until when), or (None, None) when
        there is none; (its commit, None) when it could not be read."""
        there = transport.list_refs(self.repo, self.url, [self.ref], name=self.name).get(self.ref)
        if there is None:
            return None, None
        if not self.repo.has_object(there):
            from ..store import locks

            # It may be gone or replaced meanwhile (released, renewed): then it is read
            # again; never taken for expired because it could not be read.
            with contextlib.suppress(AgentgateError), locks.ref_lock(self.repo, self.mirror):
                transport.fetch_refs(
                    self.repo, self.url, [f"+{self.ref}:{self.mirror}"], name=self.name
                )
            if not self.repo.has_object(there):
                return there, None
        try:
            text = self.repo.history.commit_message(there)
        except AgentgateError:  # not a commit (a blob, a tree): no lease anyone holds
            return there, LeaseInfo("?", 0.0)
        fields: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition(": ")
            if sep and key.startswith("Agentgate-"):
                fields.setdefault(key, value.strip())
        try:
            expires = float(fields.get("Agentgate-Expires", "0"))
        except ValueError:
            expires = 0.0
        if math.isnan(expires):  # no time is after it
            expires = 0.0
        return there, LeaseInfo(fields.get("Agentgate-Holder", "?"), expires)

    def held_elsewhere(self) -> bool:
        """Whether another holder's lease is on the server and not expired (one read)."""
        there, info = self.read()
        if there is None or info is None or info.holder == self.holder:
            return False
        return time.time() <= info.expires + margin(self.seconds)

    def _commit(self) -> str:
        tree = self.repo.empty_tree()
        message = (
            f"agentgate lease on {self.branch}\n\nAgentgate-Holder: {self.holder}\n"
            f"Agentgate-Expires: {time.time() + self.seconds:.3f}\n"
        )
        return self.repo.commit_tree(tree, [], message, _AUTHOR)

    @contextmanager
    def pushing(self) -> Iterator[None]:
        """Hold while a move's push carries the lease's renewal: the renewer waits, so the
        two never renew from the same lease commit (the loser would think it lost)."""
        with self._lock:
            yield

    def renewal(self) -> transport.RefUpdate:
        """The ref update that renews the held lease (for a move's atomic push; call it
        within :meth:`pushing`)."""
        if self.held is None:
            raise LeaseLost(f"no lease held on {self.name}/{self.branch}")
        return transport.RefUpdate(self.ref, self._commit(), self.held)

    def renewed(self, update: transport.RefUpdate) -> None:
        """The push carrying ``update`` landed: the lease held is its new commit (call it
        within :meth:`pushing`)."""
        self.held = update.new

    # -- taking and giving back -------------------------------------------------------------

    def _take(self, waiting: Callable[[], bool] | None = None) -> None:
        deadline = time.monotonic() + WAIT_LIMIT_S
        pause = 0.05
        #: When each lease commit was first seen here: a holder renews with a new commit,
        #: so one that stays longer than a lease lasts is not renewed, whatever it claims
        #: (a hand-written lease "until the year 3000" is honoured for one length).
        first_seen: dict[str, float] = {}
        while True:
            there, info = self.read()
            if there is not None and info is None:
                seen = first_seen.setdefault(there, time.monotonic())
                if time.monotonic() - seen <= self.seconds + margin(self.seconds):
                    time.sleep(pause)  # changed while it was read: read it again
                    continue
                info = LeaseInfo("?", 0.0)  # never readable for a whole length: not held
            if info is not None and info.holder == self.holder:
                self.held = there  # ours already (a renewal this process could not confirm)
                return
            stale = there is not None and time.monotonic() - first_seen.setdefault(
                there, time.monotonic()
            ) > self.seconds + margin(self.seconds)
            if info is None or stale or time.time() > info.expires + margin(self.seconds):
                new = self._commit()
                pushed = transport.push(
                    self.repo, self.url,
                    [transport.RefUpdate(self.ref, new, there or self.repo.null_oid)], name=self.name,
                )  # fmt: skip
                if pushed.ok:
                    self.held = new
                    return
                if pushed.refused is not None:
                    raise AgentgateError(
                        f"the server refused the lease {self.ref}: {pushed.refusal()}"
                    )
                pause = 0.05  # another machine took it first: read again now
                continue
            if time.monotonic() > deadline:
                raise AgentgateError(
                    f"waited {WAIT_LIMIT_S:.0f} s for the lease on {self.name}/{self.branch}, "
                    f"held by {info.holder}"
                )
            if self.on_wait is not None:
                with contextlib.suppress(AgentgateError, OSError):
                    self.on_wait()
            if waiting is not None and waiting():
                raise NotNeeded
            wait = min(pause, max(0.05, info.expires + margin(self.seconds) - time.time()))
            wait = min(wait, max(0.05, self.seconds + margin(self.seconds)))
            time.sleep(wait)
            # A waiter whose attempts wait on the server's queue reads its verdicts often.
            pause = min(pause * 1.5, WAITING_PAUSE_S if waiting is not None else 1.0)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            with self._lock:
                held = self.held
                if held is None:
                    return
                update = transport.RefUpdate(self.ref, self._commit(), held)
                riders = list(self.riders()) if self.riders is not None else []
                try:
                    pushed = transport.push(self.repo, self.url, [update, *riders], name=self.name)
                except AgentgateError:
                    continue  # the next renewal, or the move's own, tries again
                if pushed.ok:
                    self.held = update.new
                else:
                    self.held = None  # taken over: a move now fails, and takes it again
                    return

    def confirm(self) -> None:
        """After a push that failed whole: still hold the lease, or take it again (it was
        taken over: it expired while this leader worked). The caller holds :meth:`hold`."""
        there, _ = self.read()
        with self._lock:
            if there is not None and there == self.held:
                return  # the branch moved, not the lease
            self.held = None
        if self._depth:
            self._take()

    @contextmanager
    def hold(self, waiting: Callable[[], bool] | None = None) -> Iterator[None]:
        """Hold the lease for a batch (re-entrant in one process), renewed meanwhile;
        given back at the end. While another holds it, ``waiting`` is called between reads:
        when it returns True, :class:`NotNeeded` is raised (nothing is left to lead)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        try:
            self._take(waiting)
        except NotNeeded:
            raise
        except (AgentgateError, OSError, ValueError) as exc:
            # The server will not hold a lease (a hook refusing refs/agentgate/*, or it
            # cannot be reached): the move goes on without one, as safe (the branch's own
            # compare-and-swap) but not one leader across machines. A refusal of the move
            # itself is then the server's to say, as before.
            self.unavailable = str(exc)
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0
            return
        self.unavailable = ""
        self._depth = 1
        self._stop.clear()
        self._renewer = threading.Thread(
            target=self._renew_loop, name="agentgate-lease", daemon=True
        )
        self._renewer.start()
        try:
            yield
        finally:
            self._depth = 0
            self._stop.set()
            self._renewer.join()
            with self._lock:
                held, self.held = self.held, None
            if held is not None:  # best effort: an unreleased lease expires
                with contextlib.suppress(AgentgateError):
                    transport.push(
                        self.repo, self.url, [transport.RefUpdate(self.ref, "", held)],
                        name=self.name,
                    )  # fmt: skip
