"""Attempt records on the server of a remote target, so that any clone can read them.

With a remote target (``--agentgate-remote``), every attempt record is pushed to the server
under the name it has here, ``refs/agentgate/attempts/<slug>/<n>``. State refs and
checkpoints go too, only with ``--agentgate-push-state``: they can hold a whole database (a
checkpoint's parents are its state and the agent's git directory).

Attempt numbers are unique across machines because each is claimed on the server by
compare-and-swap: the record ref is pushed with the lease "must not exist there". When
another machine holds that number already, the record is renumbered here (the next number
above every one the server and this clone know for its task) and pushed again; the record
commit does not name its number, so only the ref changes, before anyone is told its name.

A push that fails (the network, the server's refusal) never blocks or undoes a landing: the
record stays here, its name goes on a list of this clone's that the next run against that
server pushes first. ``agentgate attempts|show|restore --remote NAME`` fetch the server's
records into ``refs/agentgate/servers/<NAME>/`` (only the objects this clone lacks) and read
them there.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import AgentgateError
from ..git import transport
from ..git.repo import BaseRepo
from ..store import attempts, locks, oplog
from ..workspace import state

#: Where a server's records are fetched to, per remote: ``<MIRROR><remote>/attempts/...``.
MIRROR = "refs/agentgate/servers/"
#: How many numbers a record tries on the server before it stays unpublished.
MAX_CLAIMS = 50


@dataclass(frozen=True)
class Server:
    """The server of a remote target: its remote's name (what messages call it, never the
    URL), where to fetch and push, and whether state (and checkpoints) travel too."""

    remote: str
    fetch_url: str
    push_url: str
    push_state: bool = False

    @property
    def mirror(self) -> str:
        """This clone's copy of the server's attempt records."""
        return f"{MIRROR}{self.remote}/attempts/"


def publish(repo: BaseRepo, server: Server, ref: str, commit: str) -> tuple[str, str | None]:
    """Push the attempt record ``ref`` (at ``commit``), and its state ref with
    ``push_state``, claiming its number on the server: (its name now, a problem or None).

    Renumbered here when the number is another machine's there. Never raises: a record that
    could not be pushed stays here, listed for the next run to push (see :func:`catch_up`).
    """
    try:
        for _ in range(MAX_CLAIMS):
            updates = [transport.RefUpdate(ref, commit, repo.null_oid)]
            state_ref = state.ref_for(ref)
            state_commit = repo.refs.value(state_ref) if server.push_state else None
            if state_commit:
                updates.append(transport.RefUpdate(state_ref, state_commit, repo.null_oid))
            pushed = transport.push(repo, server.push_url, updates, name=server.remote)
            if pushed.ok:
                _unlist(repo, server, ref)
                return ref, None
            refused = pushed.refused
            in_the_way = refused is not None and "cannot lock ref" in (
                f"{refused.summary} {refused.reason} {' '.join(pushed.server_says)}"
            )
            if refused is not None and not in_the_way:
                raise AgentgateError(f"the server refused it: {pushed.refusal()}")
            # Lost, or its name is in the way of a ref there (git refuses "<n>" beside
            # "<n>/x"): the number is taken there, by another machine's attempt or by this one.
            slug = ref[len(attempts.PREFIX) :].rsplit("/", 1)[0]
            folder = f"{attempts.PREFIX}{slug}/"
            there = transport.list_refs(repo, server.fetch_url, [f"{folder}*"], name=server.remote)
            if there.get(ref) == commit:
                _unlist(repo, server, ref)
                return ref, None  # pushed before (by a run that could not say so)
            ref = _renumber(repo, server, ref, commit, _highest(there, folder))
        raise AgentgateError(f"no free attempt number on {server.remote} in {MAX_CLAIMS} tries")
    except (AgentgateError, OSError) as exc:
        _list(repo, server, ref)
        return ref, (
            f"recorded here as {ref}, but not pushed to {server.remote} ({exc}); the next run "
            "against it pushes it"
        )


def publish_ref(repo: BaseRepo, server: Server, ref: str, commit: str) -> str | None:
    """Push one ref that no other machine can name (a checkpoint's: its try's id is random)
    with the lease "must not exist"; a problem or None. Never raises."""
    try:
        pushed = transport.push(
            repo,
            server.push_url,
            [transport.RefUpdate(ref, commit, repo.null_oid)],
            name=server.remote,
        )
        if pushed.ok:
            return None
        if pushed.refused is not None:
            return f"{ref} was not pushed to {server.remote}: {pushed.refusal()}"
        there = transport.list_refs(repo, server.fetch_url, [ref], name=server.remote)
        if there.get(ref) == commit:
            return None
        return f"{ref} was not pushed to {server.remote}: another commit holds that name there"
    except (AgentgateError, OSError) as exc:
        return f"{ref} was not pushed to {server.remote} ({exc})"


def catch_up(repo: BaseRepo, server: Server) -> list[str]:
    """Push the records earlier runs could not; say what happened to each."""
    notes = []
    for ref in _listed(repo, server):
        commit = repo.refs.value(ref)
        if commit is None:  # pruned meanwhile: nothing to push
            _unlist(repo, server, ref)
            continue
        now, problem = publish(repo, server, ref, commit)
        notes.append(
            problem
            if problem is not None
            else f"pushed the record {now} to {server.remote}, which an earlier run could not"
        )
    return notes


def fetch_records(repo: BaseRepo, server: Server, *, with_state: bool = False) -> str:
    """The server's attempt records (and with ``with_state`` its state refs) fetched into
    this clone's copy of them; the prefix to list them under."""
    specs = [f"+{attempts.PREFIX}*:{server.mirror}*"]
    if with_state:
        specs.append(f"+{state.PREFIX}*:{MIRROR}{server.remote}/state/*")
    with locks.ref_lock(repo, f"fetch/{server.mirror}"):
        transport.fetch_refs(repo, server.fetch_url, specs, name=server.remote)
    return server.mirror


def for_remote(repo: BaseRepo, remote: str, *, push_state: bool = False) -> Server:
    """The server of a configured remote (what ``--remote NAME`` names)."""
    transport.check_remote(repo, remote, "--remote")
    fetch_url, push_url = repo.place.remote_urls(remote)
    return Server(remote, fetch_url, push_url, push_state)


# -- renumbering ----------------------------------------------------------------------

#: Numbers above this are nobody's: a ref there by that name was written by hand (anyone
#: who can push can), and counting it would push every later number past what git takes.
MAX_NUMBER = 10**9


def _highest(there: dict[str, str], folder: str) -> int:
    """The highest attempt number the server holds in ``folder`` (``ls-remote`` matches a
    pattern against the end of a name, so a ref elsewhere may be listed: it is not counted),
    and a name in the way (``<n>/x``) counts as ``n``."""
    found = 0
    for ref in there:
        if not ref.startswith(folder):
            continue
        head = ref[len(folder) :].split("/", 1)[0]
        if head.isdigit() and head == str(int(head)) and int(head) <= MAX_NUMBER:
            found = max(found, int(head))
    return found


def _renumber(repo: BaseRepo, server: Server, ref: str, commit: str, above: int) -> str:
    """Move the record at ``ref`` to the next number above ``above`` and every number this
    clone knows for its task (each claimed here by compare-and-swap); its state ref too."""
    slug = ref[len(attempts.PREFIX) :].rsplit("/", 1)[0]
    local = [n.rsplit("/", 1)[1] for n in repo.refs.names(f"{attempts.PREFIX}{slug}/")]
    n = max([above, attempts.high_water(repo, slug), *(int(x) for x in local if x.isdigit())]) + 1
    message = f"agentgate: renumbered, {ref} was taken on {server.remote}"
    while not repo.refs.update(f"{attempts.PREFIX}{slug}/{n}", commit, None, message):
        n += 1
    new = f"{attempts.PREFIX}{slug}/{n}"
    attempts.raise_high_water(repo, slug, n)
    state_commit = repo.refs.value(state.ref_for(ref))
    if state_commit:
        repo.refs.update(state.ref_for(new), state_commit, None, message)
        repo.refs.delete(state.ref_for(ref), state_commit, message)
    repo.refs.delete(ref, commit, message)
    _unlist(repo, server, ref)
    with contextlib.suppress(OSError):
        oplog.append(
            repo.common_dir,
            oplog.OpRecord(op="renumber", ref=new, old=None, new=commit, note=message),
        )
    return new


# -- the list of records not pushed yet -----------------------------------------------------


def _list_file(repo: BaseRepo, server: Server) -> Path:
    return repo.private_dir / "unpublished" / server.remote


def _listed(repo: BaseRepo, server: Server) -> list[str]:
    try:
        text = _list_file(repo, server).read_text(encoding="utf-8")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.startswith(attempts.PREFIX)]


def _rewrite(repo: BaseRepo, server: Server, add: str | None, drop: str | None) -> None:
    """Change the list under its lock (xdist workers write it at once), whole, by rename."""
    path = _list_file(repo, server)
    with contextlib.suppress(OSError), locks.ref_lock(repo, f"unpublished/{server.remote}"):
        refs = [r for r in _listed(repo, server) if r not in (add, drop)]
        if add is not None:
            refs.append(add)
        if not refs and not path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text("".join(f"{r}\n" for r in refs), encoding="utf-8")
        os.replace(tmp, path)


def _list(repo: BaseRepo, server: Server, ref: str) -> None:
    _rewrite(repo, server, ref, None)


def _unlist(repo: BaseRepo, server: Server, ref: str) -> None:
    if ref in _listed(repo, server):
        _rewrite(repo, server, None, ref)


__all__ = ["MIRROR", "Server", "catch_up", "fetch_records", "for_remote", "publish"]
