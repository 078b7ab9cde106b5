"""Fetching from and pushing to a server, as named git operations (the git layer).

A push is judged per ref from ``--porcelain``, never from the wording of stderr as a whole:
each ref the server did not take is classified as a lost race (the lease, our
compare-and-swap, did not hold: somebody moved the branch), or a refusal (the server's
policy: a hook, a protected branch, permissions), whose reason is kept with what the server
said. A run that printed no verdict for a ref (the connection failed), or whose outcome the server
did not report (``[remote failure]``: the update may have happened), is a :class:`GitError`;
the caller must then not assume that nothing moved.

Error messages name the remote, never its URL (a URL can carry credentials).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError, GitError
from . import runner as _git

if TYPE_CHECKING:
    from .repo import BaseRepo

#: How ``push --porcelain`` gives a lost lease, per ref: the branch was not where we expected.
_LOST_LEASE = ("stale info", "fetch first", "non-fast-forward", "already exists")
#: How the server says its own compare-and-swap failed (the ref moved after it advertised it).
_SERVER_LOST = ("but expected", "reference already exists")


@dataclass(frozen=True)
class RefUpdate:
    """One ref a push sets: ``new`` (a commit) at ``ref`` on the server, only if it is at
    ``expect`` there (``None``: no lease; the ZERO id: it must not exist)."""

    ref: str
    new: str
    expect: str | None
    #: Replace whatever is there (no lease): for refs that only ever hold the latest word.
    force: bool = False


@dataclass(frozen=True)
class RefStatus:
    """What the server said about one ref: ``ok``, ``lost`` (a race) or ``refused``."""

    ref: str
    outcome: str
    summary: str = ""
    reason: str = ""


@dataclass(frozen=True)
class PushResult:
    """Per-ref verdicts of one push, and the server's own messages (``remote:`` lines)."""

    statuses: tuple[RefStatus, ...]
    server_says: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(s.outcome == "ok" for s in self.statuses)

    @property
    def lost_race(self) -> bool:
        """Nothing refused, and at least one lease did not hold: try again on the new tip."""
        return not self.refused and any(s.outcome == "lost" for s in self.statuses)

    @property
    def refused(self) -> RefStatus | None:
        """The first ref the server refused on policy, if any."""
        return next((s for s in self.statuses if s.outcome == "refused"), None)

    def refusal(self) -> str:
        """The server's reason for a refusal, in its own words where it gave some."""
        refused = self.refused
        if refused is None:
            return ""
        said = "; ".join(self.server_says)
        return f"{refused.summary} {refused.reason}".strip() + (f": {said}" if said else "")


def check_remote(repo: BaseRepo, remote: str, source: str = "") -> None:
    """Raise :class:`ConfigError` unless ``remote`` is a configured remote of ``repo``."""
    if not remote or remote.startswith("-") or "/" in remote:
        raise ConfigError(f"{remote!r} is not a remote name", value=remote, source=source)
    if not repo.place.config_value(f"remote.{remote}.url"):
        raise ConfigError(
            f"{repo.label} has no remote named {remote!r}; add it with "
            f"'git remote add {remote} URL'",
            value=remote,
            source=source,
        )


def fetch_branch(
    repo: BaseRepo,
    url: str,
    branch: str,
    into: str,
    *,
    name: str = "the remote",
    also: Sequence[str] = (),
) -> str | None:
    """Fetch ``branch`` from ``url`` into the local ref ``into``; its tip, or None if absent.

    The URL, not a remote's name, so git updates no ``refs/remotes/*`` of the user's;
    ``name`` is what an error calls it. ``also``: more refspecs for the same fetch (globs,
    so that one the server lacks is no error), read at the same moment as the branch.
    """
    result = repo._run(
        "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules",
        *(["--prune"] if also else []),  # what the server no longer has under them goes
        "--end-of-options", url, f"+refs/heads/{branch}:{into}", *also,
        ok=(0, 128),
    )  # fmt: skip
    if result.returncode != 0:
        if "couldn't find remote ref" in result.stderr:
            return None
        raise _git.failure(["fetch", name], result.returncode, result.stderr)
    return repo.refs.value(into)


def deepen(
    repo: BaseRepo, url: str, branch: str, into: str, by: int, *, name: str = "the remote"
) -> None:
    """Fetch ``by`` more commits of history behind every shallow boundary (``--deepen``),
    with ``branch`` into ``into``: for a shallow clone that needs a merge base."""
    result = repo._run(
        "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules",
        f"--deepen={by}", "--end-of-options", url, f"+refs/heads/{branch}:{into}",
        ok=(0, 128),
    )  # fmt: skip
    if result.returncode != 0:
        raise _git.failure(["fetch --deepen", name], result.returncode, result.stderr)


def list_refs(
    repo: BaseRepo, url: str, patterns: Sequence[str], *, name: str = "the remote"
) -> dict[str, str]:
    """The server's refs matching ``patterns`` (``ls-remote``: names and ids, no objects)."""
    result = repo._run("ls-remote", "--refs", "--end-of-options", url, *patterns, ok=(0, 128))
    if result.returncode != 0:
        raise _git.failure(["ls-remote", name], result.returncode, result.stderr)
    found = {}
    for line in result.out.splitlines():
        oid, _, ref = line.partition("\t")
        if ref:
            found[ref] = oid
    return found


def fetch_refs(
    repo: BaseRepo, url: str, refspecs: Sequence[str], *, name: str = "the remote"
) -> None:
    """Fetch ``refspecs`` from ``url``, pruning what the server no longer has under them;
    only the objects this repository lacks travel."""
    result = repo._run(
        "fetch", "--quiet", "--no-tags", "--prune", "--no-write-fetch-head",
        "--no-recurse-submodules", "--end-of-options", url, *refspecs,
        ok=(0, 128),
    )  # fmt: skip
    if result.returncode != 0:
        raise _git.failure(["fetch", name], result.returncode, result.stderr)


def push(
    repo: BaseRepo,
    url: str,
    updates: Sequence[RefUpdate],
    *,
    atomic: bool = True,
    name: str = "the remote",
) -> PushResult:
    """Push ``updates`` to ``url`` (all or none with ``atomic``), each with its lease.

    Hooks of this repository never run (``--no-verify``); the server's do, and their refusal
    comes back as a :class:`RefStatus` with outcome ``refused``.
    """
    args = ["push", "--quiet", "--porcelain", "--no-verify"]
    if atomic:
        args.append("--atomic")
    for update in updates:
        if update.expect is not None:
            args.append(f"--force-with-lease={update.ref}:{update.expect}")
    args += [
        "--end-of-options", url,
        *(f"{'+' if u.force and u.new else ''}{u.new}:{u.ref}" for u in updates),
    ]  # fmt: skip
    result = repo._run(*args, ok=(0, 1, 128))
    said = tuple(
        line[len("remote:") :].strip()
        for line in result.stderr.splitlines()
        if line.startswith("remote:") and line[len("remote:") :].strip()
    )
    if result.returncode == 0:
        return PushResult(tuple(RefStatus(u.ref, "ok") for u in updates), said)
    found = parse_porcelain(result.out, [u.ref for u in updates], said)
    unknown = [s for s in found if s.outcome == "unknown"]
    if not found or unknown:
        why = f"{unknown[0].summary} ({unknown[0].reason})" if unknown else ""
        raise _git.failure(["push", name], result.returncode, why or result.stderr or result.out)
    return PushResult(tuple(found), said)


def parse_porcelain(out: str, refs: Sequence[str], said: Sequence[str] = ()) -> list[RefStatus]:
    """Per-ref verdicts from ``push --porcelain`` output (``flag TAB from:to TAB summary``),
    with what the server said (its ``remote:`` lines).

    A ref rejected only because another in the same atomic push was (``atomic push
    failed``) takes no blame: it counts as a lost race unless the push has a refusal. The
    server's own transaction failing (``atomic transaction failed``, ``failed to update
    ref``) is a lost race only when the server says its compare-and-swap failed ("is at X
    but expected Y"); a lock left on the server or a full disk there is a refusal, which
    trying again cannot fix.
    """
    server_lost = any(text in line for line in said for text in _SERVER_LOST)
    statuses = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or len(parts[0]) != 1:
            continue
        flag, spec, summary = parts[0], parts[1], parts[2]
        ref = spec.rsplit(":", 1)[-1]
        reason = ""
        if summary.endswith(")") and " (" in summary:
            summary, _, reason = summary[:-1].partition(" (")
        if flag != "!":
            statuses.append(RefStatus(ref, "ok", summary, reason))
        elif summary == "[remote failure]":
            statuses.append(RefStatus(ref, "unknown", summary, reason))
        elif _lost(summary, reason, server_lost):
            statuses.append(RefStatus(ref, "lost", summary, reason))
        else:
            statuses.append(RefStatus(ref, "refused", summary, reason))
    known = {s.ref for s in statuses}
    if statuses and any(r not in known for r in refs):
        raise GitError(["push"], 1, f"no verdict for every ref in: {out!r}")
    return statuses


def _lost(summary: str, reason: str, server_lost: bool) -> bool:
    """A lease that did not hold, or a ref that failed only because another in the same
    atomic push did: a race, not the server's policy."""
    if summary == "[rejected]":
        return reason in _LOST_LEASE or reason == "atomic push failed"
    if summary == "[remote rejected]" and reason in _SERVER_TRANSACTION:
        return server_lost
    return False


#: How the server says that its own ref update failed (for a reason it prints beside).
_SERVER_TRANSACTION = ("atomic transaction failed", "failed to update ref")
