"""Tidying: old attempt refs, the operations log, and the run directories workspaces live in.

An attempt whose commit landed on a branch is never removed: it is the readable story of
what is in that branch. Only refs are deleted (each by compare-and-swap, each logged); the
objects stay until git's own gc decides, so a mistaken prune is undone from the log.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from .._constants import DEFAULT_KEEP_RUNS, RUN_MARKER
from ..git.repo import BaseRepo
from ..sandbox.removal import remove_tree
from ..store import oplog
from ..store.attempts import PREFIX as ATTEMPTS_PREFIX
from ..store.attempts import AttemptInfo, list_attempts, raise_high_water
from ..store.logs import ref_for as log_ref_for
from ..workspace.state import ref_for as state_ref_for

if TYPE_CHECKING:
    from ..remote.server_records import Server


@dataclass
class PruneReport:
    removed: list[str] = field(default_factory=list)
    kept_landed: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0
    rotated: str | None = None
    workspaces: list[Path] = field(default_factory=list)
    #: Old dry runs' scratch refs removed.
    scratch: list[str] = field(default_factory=list)
    #: On a server: the shared queue's old refs removed (posted, verdicts, heartbeats).
    leftovers: list[str] = field(default_factory=list)


def _landed_on(repo: BaseRepo, commit: str) -> str | None:
    """A branch that contains ``commit``, or None."""
    return repo.refs.branch_containing(commit)


def prune(
    repo: BaseRepo,
    *,
    cutoff: datetime,
    keep_last: int = 0,
    rotate_bytes: int = 1 << 20,
    workspaces: Path | None = None,
    keep_runs: int = DEFAULT_KEEP_RUNS,
    dry_run: bool = False,
    agent: str = "person",
) -> PruneReport:
    report = PruneReport()
    for position, attempt in enumerate(list_attempts(repo)):
        landed = attempt.landed
        if landed and repo.history.resolve(landed):
            branch = _landed_on(repo, landed)
            if branch:
                report.kept_landed.append((attempt.record_ref, f"landed on {branch}"))
                report.kept += 1
                continue
        date = datetime.fromisoformat(attempt.date)
        if position < keep_last or date >= cutoff:
            report.kept += 1
            continue
        if not dry_run:
            begin = time.perf_counter()
            # Its number stays claimed: a later attempt at the task never gets it again.
            slug, _, number = attempt.record_ref[len(ATTEMPTS_PREFIX) :].rpartition("/")
            if number.isdigit():
                raise_high_water(repo, slug, int(number))
            if not repo.refs.delete(attempt.record_ref, attempt.record_commit):
                report.kept += 1
                continue
            state_commit = attempt.record.state
            if state_commit:
                repo.refs.delete(state_ref_for(attempt.record_ref), state_commit)
            log_commit = repo.refs.value(log_ref_for(attempt.record_ref))
            if log_commit is not None:  # its gate log goes with it
                repo.refs.delete(log_ref_for(attempt.record_ref), log_commit)
            oplog.append(
                repo.common_dir,
                oplog.OpRecord(
                    op="prune", ref=attempt.record_ref, old=attempt.record_commit, new=None,
                    agent=agent, task=attempt.task,
                    duration_ms=round((time.perf_counter() - begin) * 1000, 3),
                ),
            )  # fmt: skip
        report.removed.append(attempt.record_ref)
    _prune_scratch_refs(repo, cutoff, dry_run, agent, report)
    report.rotated = _rotate(repo, rotate_bytes, dry_run)
    if workspaces is not None:
        report.workspaces = old_runs(workspaces, keep_runs)
        if not dry_run:
            for path in report.workspaces:
                remove_tree(path)
    return report


def prune_remote(
    repo: BaseRepo,
    server: Server,
    *,
    cutoff: datetime,
    keep_last: int = 0,
    dry_run: bool = False,
    agent: str = "person",
) -> PruneReport:
    """The same rules on a server's records (every machine's): an attempt that landed on a
    branch of the server stays; so do the newest ``keep_last`` and those after ``cutoff``;
    and so does each task's highest-numbered record, so that no machine is ever handed a
    number again (numbers are claimed there by "must not exist"). Each removal is a push
    deleting the ref only if it still holds that record (its state ref beside it), logged.
    """
    from ..git import transport
    from ..remote.server_records import MIRROR, fetch_records

    prefix = fetch_records(repo, server)
    heads = f"{MIRROR}{server.remote}/heads/"
    transport.fetch_refs(repo, server.fetch_url, [f"+refs/heads/*:{heads}*"], name=server.remote)
    rows = list_attempts(repo, prefix)
    highest: dict[str, int] = {}
    for attempt in rows:
        slug, _, number = attempt.record_ref[len(ATTEMPTS_PREFIX) :].rpartition("/")
        if number.isdigit():
            highest[slug] = max(highest.get(slug, 0), int(number))
    there = transport.list_refs(repo, server.fetch_url, ["refs/agentgate/state/*"])
    report = PruneReport()
    for position, attempt in enumerate(rows):
        slug, _, number = attempt.record_ref[len(ATTEMPTS_PREFIX) :].rpartition("/")
        landed = attempt.landed
        branch = (
            repo.refs.branch_containing(landed, heads)
            if landed and repo.history.resolve(landed)
            else None
        )
        if branch:
            report.kept_landed.append((attempt.record_ref, f"landed on {server.remote}/{branch}"))
        elif number.isdigit() and int(number) == highest.get(slug):
            report.kept_landed.append((attempt.record_ref, "its task's highest number"))
        elif position < keep_last or datetime.fromisoformat(attempt.date) >= cutoff:
            pass
        else:
            if not dry_run and not _delete_there(repo, server, attempt, there, agent):
                report.kept += 1
                continue
            report.removed.append(attempt.record_ref)
            continue
        report.kept += 1
    report.leftovers += _queue_leftovers(repo, server, cutoff, dry_run, agent)
    return report


def _queue_leftovers(
    repo: BaseRepo, server: Server, cutoff: datetime, dry_run: bool, agent: str
) -> list[str]:
    """The shared queue's refs older than ``cutoff`` (see :mod:`.server_queue`): attempts
    posted by a machine that stopped waiting, verdicts nobody read, heartbeats of machines
    gone. Each is deleted only if it still holds what was read (compare-and-swap)."""
    from ..git import transport
    from ..remote.server_records import MIRROR

    mirror = f"{MIRROR}{server.remote}/leftovers/"
    kinds = ("queue", "verdicts", "alive")
    transport.fetch_refs(
        repo, server.fetch_url, [f"+refs/agentgate/{k}/*:{mirror}{k}/*" for k in kinds],
        name=server.remote,
    )  # fmt: skip
    # Never younger than a wait may last: a machine may be waiting on a posted attempt now.
    from ..remote.lease import WAIT_LIMIT_S

    cutoff = min(cutoff, datetime.now(cutoff.tzinfo) - timedelta(seconds=WAIT_LIMIT_S))
    removed = []
    for ref, commit, date in repo.refs.rows(
        mirror, "%(refname)%00%(objectname)%00%(creatordate:iso-strict)"
    ):
        if not date or datetime.fromisoformat(date) >= cutoff:
            continue
        there = "refs/agentgate/" + ref[len(mirror) :]
        if not dry_run:
            pushed = transport.push(
                repo, server.push_url, [transport.RefUpdate(there, "", commit)],
                name=server.remote,
            )  # fmt: skip
            if not pushed.ok:
                continue  # changed there meanwhile (taken, renewed): kept
            repo.refs.delete(ref, commit)
            with contextlib.suppress(OSError):
                oplog.append(
                    repo.common_dir,
                    oplog.OpRecord(
                        op="prune", ref=f"{server.remote}:{there}", old=commit, new=None,
                        agent=agent,
                    ),
                )  # fmt: skip
        removed.append(there)
    return removed


def _delete_there(
    repo: BaseRepo,
    server: Server,
    attempt: AttemptInfo,
    there: dict[str, str],
    agent: str,
) -> bool:
    """Delete one record on the server if it still holds it (its state ref too); logged."""
    from ..git import transport

    begin = time.perf_counter()
    updates = [transport.RefUpdate(attempt.record_ref, "", attempt.record_commit)]
    state_ref = state_ref_for(attempt.record_ref)
    if state_ref in there:
        updates.append(transport.RefUpdate(state_ref, "", there[state_ref]))
    if not transport.push(repo, server.push_url, updates, name=server.remote).ok:
        return False  # it changed there meanwhile: kept
    with contextlib.suppress(OSError):
        oplog.append(
            repo.common_dir,
            oplog.OpRecord(
                op="prune", ref=f"{server.remote}:{attempt.record_ref}",
                old=attempt.record_commit, new=None, agent=agent, task=attempt.task,
                duration_ms=round((time.perf_counter() - begin) * 1000, 3),
            ),
        )  # fmt: skip
    return True


#: A scratch ref used this recently may belong to a run still going: never pruned.
SCRATCH_GRACE_S = 600


def _prune_scratch_refs(
    repo: BaseRepo, cutoff: datetime, dry_run: bool, agent: str, report: PruneReport
) -> None:
    """Remove dry runs' scratch refs last used before ``cutoff`` (and not in the last ten
    minutes): each run's, under ``refs/agentgate/dryruns/``."""
    from ..land.target import DRYRUN_PREFIX

    last_used: dict[str, datetime] = {}
    for line in oplog.read(repo.common_dir):
        if line.ref.startswith(DRYRUN_PREFIX) and line.time:
            with contextlib.suppress(ValueError):
                last_used[line.ref] = max(
                    last_used.get(line.ref, datetime.min.replace(tzinfo=UTC)),
                    datetime.fromisoformat(line.time),
                )
    recent = datetime.now(UTC).timestamp() - SCRATCH_GRACE_S
    for prefix in (DRYRUN_PREFIX,):
        for ref, value in repo.refs.rows(prefix):
            used = last_used.get(ref)
            if used is not None and (used >= cutoff or used.timestamp() >= recent):
                continue
            if not dry_run:
                if not repo.refs.delete(ref, value, "agentgate prune: an old dry run"):
                    continue
                oplog.append(
                    repo.common_dir,
                    oplog.OpRecord(op="prune", ref=ref, old=value, new=None, agent=agent,
                                   task="an old dry run's scratch ref"),
                )  # fmt: skip
            report.scratch.append(ref)


def _rotate(repo: BaseRepo, limit: int, dry_run: bool) -> str | None:
    path = oplog.log_path(repo.common_dir)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size <= limit:
        return None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f"{path.name}.{stamp}")
    if not dry_run:
        # A rename is atomic: writers holding the old file finish their line in it, the
        # next append creates a fresh log. Readers read rotated files first.
        os.rename(path, target)
    return target.name


def old_runs(root: Path, keep: int) -> list[Path]:
    """Run directories under ``root`` (only those a run marked), oldest beyond ``keep``.

    A run still going holds a shared lock on its marker; it is never listed.
    """
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if p.is_dir() and (p / RUN_MARKER).is_file()]
    runs.sort(key=lambda p: (p / RUN_MARKER).stat().st_mtime, reverse=True)
    return [p for p in runs[keep:] if not _live(p / RUN_MARKER)]


def _live(marker: Path) -> bool:
    import fcntl

    fd = os.open(marker, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock
    return False
