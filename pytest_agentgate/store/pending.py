"""Moves in flight: settling the ``pending`` lines a killed or failing process left.

Before it moves a target, a promotion appends a ``pending`` line to the operations log with
what the attempt record will say; right after the move it writes that record; then a
``pending-done`` line. A process killed (or whose disk filled) anywhere in between leaves a
pending line without its end. The next run, or ``agentgate`` command, settles it here, under
the target's lock, from the target's own state: when the pending commit is on the target the
record is written as landed; when it is not, the record says that nothing moved. So there is
never a move without its record, nor a record that claims a move that did not happen.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from ..errors import AgentgateError
from ..git.repo import BaseRepo
from . import attempts, oplog
from .record import Record, Status

INTERRUPTED = "the run ended while promoting this attempt"


def open_lines(records: Iterable[oplog.OpRecord], ref: str | None = None) -> list[oplog.OpRecord]:
    """Pending lines (for ``ref``, or any) that no later line settles."""
    pending: dict[str, oplog.OpRecord] = {}
    for record in records:
        if record.op == "pending" and record.pending and (ref is None or record.ref == ref):
            pending[record.pending] = record
        elif record.op in ("pending-done", "pending-abandoned"):
            pending.pop(record.pending, None)
    return list(pending.values())


def stuck_lines(records: Iterable[oplog.OpRecord]) -> dict[str, str]:
    """The open pending lines a settling could not complete: pending id -> why (said once,
    in a ``pending-failed`` line; ``agentgate pending`` retries or sets them aside)."""
    records = list(records)
    still = {line.pending for line in open_lines(records)}
    return {
        r.pending: r.note or "unknown"
        for r in records
        if r.op == "pending-failed" and r.pending in still
    }


def _writer_alive(line: oplog.OpRecord) -> bool:
    """Whether the process that wrote ``line`` still runs here (it will settle it itself)."""
    if not isinstance(line.record, dict):
        return False
    pid = line.record.get("pid")
    if line.host != socket.gethostname() or not isinstance(pid, int):
        return False
    return pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether a process of this machine runs under ``pid`` (ours counts)."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has let go of everything (its locks too) and only waits for its parent to
    # read its status: dead (pytest-xdist keeps a SIGKILLed worker a zombie for a while,
    # and its queued attempt must not be landed as a live waiter's).
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True  # no /proc (macOS), or gone this instant: as kill(0) said
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def _on(repo: BaseRepo, commit: str, ref: str) -> bool:
    tip = repo.refs.value(ref)
    if tip is None:
        return False
    return tip == commit or repo.history.is_ancestor(commit, tip)


def settle(
    repo: BaseRepo,
    ref: str | None = None,
    *,
    publish: Callable[[str, str], tuple[str, str | None]] | None = None,
    retry: bool = False,
) -> list[str]:
    """Complete the records of unsettled moves (for ``ref``, or every ref); say what was done.

    Call with the target's lock held. A failure to settle one is reported once, never
    raised: a ``pending-failed`` line says why and keeps the line open with all its data,
    and later settlings pass it by until ``retry`` (``agentgate pending --retry``).
    ``publish`` pushes a record written here to a remote target's server (see
    :mod:`.server_records`).
    """
    everything = list(oplog.read(repo.common_dir))
    stuck = {} if retry else stuck_lines(everything)
    lines = [
        line
        for line in open_lines(everything, ref)
        if not _writer_alive(line) and line.pending not in stuck
    ]
    if not lines:
        return []
    recorded = {a.trailers.get("Id") for a in attempts.list_attempts(repo)}
    notes = []
    for line in lines:
        record = Record.from_json(line.record if isinstance(line.record, dict) else {})
        try:
            if record.uid not in recorded:
                moved = line.new is not None and _on(repo, line.new, line.ref)
                status: Status = record.status if moved else "error"
                written, commit = attempts.write_record(
                    repo,
                    replace(record, status=status),
                    reason="" if moved else f"{INTERRUPTED}; the target did not move",
                    check="" if moved else "promote",
                    landed=line.new if moved and status == "promoted" else None,
                )
                if publish is not None:
                    _, problem = publish(written, commit)
                    if problem:
                        notes.append(problem)
                notes.append(
                    f"completed the record of {record.task!r}: "
                    + (f"landed as {str(line.new)[:12]}" if moved else "it did not land")
                )
        except Exception as exc:  # one bad line never stops a run or another command
            why = f"{type(exc).__name__}: {exc}"
            notes.append(
                f"could not complete the record of {record.task!r} ({why}); its data is kept "
                f"in the operations log: 'agentgate pending' retries it or sets it aside"
            )
            with contextlib.suppress(OSError):
                oplog.append(
                    repo.common_dir,
                    oplog.OpRecord(
                        op="pending-failed", ref=line.ref, old=None, new=None,
                        pending=line.pending, note=why[:500],
                    ),
                )  # fmt: skip
            continue
        with contextlib.suppress(OSError):
            oplog.append(
                repo.common_dir,
                oplog.OpRecord(
                    op="pending-done", ref=line.ref, old=None, new=None, pending=line.pending
                ),
            )
    return notes


def settle_all(repo: BaseRepo) -> list[str]:
    """:func:`settle` every ref that has unsettled moves, and finish every interrupted update
    of checked-out files, each ref under its own lock.

    For commands that open a repository: the lock is taken only where there is something
    to do, so reading stays lock-free in the common case.
    """
    from ..git.worktree import JOURNAL_PREFIX, recover_worktree
    from .locks import ref_lock

    refs = {line.ref for line in open_lines(oplog.read(repo.common_dir))}
    for journal in repo.private_dir.glob(f"{JOURNAL_PREFIX}*.json"):
        refs.add(journal.name[len(JOURNAL_PREFIX) : -len(".json")].replace("%2F", "/"))
    notes: list[str] = []
    for ref in sorted(refs):
        with ref_lock(repo, ref):
            notes += settle(repo, ref)
            try:
                done = recover_worktree(repo, ref)
            except AgentgateError as exc:
                notes.append(str(exc))
                continue
            if done:
                notes.append(done)
    return notes
