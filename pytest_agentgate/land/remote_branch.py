"""A branch on a server as a target: moved by an atomic push with a lease on its old value,
the attempt's objects and records going in the same push, one leader across machines by the
server's lease, the server's queue for attempts waiting on another machine's leader."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from .. import _constants
from ..errors import AgentgateError, ConfigError, PushRefused
from ..git import transport
from ..git.repo import BaseRepo
from ..store import locks, oplog

if TYPE_CHECKING:
    from ..remote.lease import Lease
    from ..remote.server_queue import ServerQueue, Trust
    from ..remote.server_records import Server

#: Where each run's scratch ref lives: ``refs/agentgate/dryruns/<run>/<branch>``.
from .target import TRACKING_PREFIX, MoveNote, MoveResult, _LogsMoves


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
            self._urls = self.repo.place.remote_urls(self.remote)
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
        if self.repo.refs.value(self.moves_mirror) is None:
            return False
        try:
            chain = self.repo.history.first_parent_chain(self.moves_mirror, self.MOVES_LOOKBACK)
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

        last = self.repo.refs.value(self.moves_mirror)
        if last is not None and not self.repo.history.is_commit(last):
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
        tip = self.repo.refs.value(self.ref)
        if (
            tip is None
            or not self.repo.place.is_shallow()
            or self.repo.history.merge_base(base, tip)
        ):
            return
        for by in self.DEEPEN_STEPS:
            with locks.ref_lock(self.repo, f"fetch/{self.ref}"):
                transport.deepen(
                    self.repo, self.urls()[0], self.branch, self.ref, by, name=self.remote
                )
            tip = self.repo.refs.value(self.ref) or tip
            if self.repo.history.merge_base(base, tip) or not self.repo.place.is_shallow():
                return
        if not self.repo.history.merge_base(base, tip):
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
                    self.repo.refs.update(
                        self.moves_mirror, link.new, self.repo.refs.value(self.moves_mirror), "move"
                    )
        if not pushed.ok:
            self._settle(uid, "pending-abandoned")
            if pushed.refused is not None:
                raise PushRefused(self.label, pushed.refusal())
            if lease is not None:
                lease.confirm()  # the branch moved, or the lease was taken over: take it again
            return MoveResult(False)
        # Our own view follows; a compare-and-swap, like every ref the plugin moves.
        self.repo.refs.update(self.ref, new, old, message)
        recorded = [after_move()] if after_move is not None else []
        return self._moved(old, new, note, uid, recorded, None)


def _locked_out(pushed: transport.PushResult) -> set[str]:
    """The refs a refused push's server says it could not lock ("cannot lock ref 'R':
    'R/x' exists")."""
    said = " ".join(pushed.server_says) + " " + pushed.refusal()
    return set(re.findall(r"cannot lock ref '([^']+)'", said))
