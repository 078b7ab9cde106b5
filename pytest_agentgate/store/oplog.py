"""The append-only operations log: one JSON line per ref the plugin or the command moves.

It lives at ``<git-dir>/agentgate/oplog.jsonl``. Each record is written with a single
``write(2)`` on a descriptor opened with ``O_APPEND``, so records from many processes
(pytest-xdist workers, a CI job and a person at once) never interleave. A crash can at
worst leave a partial last line; the next writer starts its record on a new line and the
reader skips what does not parse, so no complete record is ever lost or misread.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FILE_NAME = "oplog.jsonl"
#: The journal's own lines: how a move's record was settled, not moves (``log --all``).
JOURNAL_OPS = frozenset({"pending", "pending-done", "pending-abandoned", "pending-failed"})


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One ref move."""

    op: str
    ref: str
    old: str | None
    new: str | None
    agent: str = ""
    task: str = ""
    objects: int = 0
    bytes: int = 0
    duration_ms: float = 0.0
    note: str = ""
    time: str = ""
    user: str = ""
    host: str = ""
    #: For ``pending`` lines and the lines that settle them: which move in flight.
    pending: str = ""
    #: For ``pending`` lines: what the attempt record will say, to write it later if need be.
    record: dict[str, object] = field(default_factory=dict)


_FIELDS = tuple(f.name for f in fields(OpRecord))
#: The JSON types each field's value may have on a line.
_KINDS: dict[str, type | tuple[type, ...]] = {
    "op": str, "ref": str, "old": str, "new": str, "agent": str, "task": str,
    "objects": int, "bytes": int, "duration_ms": (int, float), "note": str, "time": str,
    "user": str, "host": str, "pending": str, "record": dict,
}  # fmt: skip


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


def log_path(git_dir: Path) -> Path:
    """The log of a repository: ``git_dir`` is its common git directory (worktrees share it)."""
    return git_dir / "agentgate" / FILE_NAME


def append(git_dir: Path, record: OpRecord, fault: str = "oplog") -> OpRecord:
    """Append ``record`` (time, user and host filled in) and return what was written.

    Raises ``OSError`` when the line cannot be written whole (a full disk, an I/O error);
    whatever part of it reached the file is closed off as a torn line that readers skip.
    """
    stamped = replace(
        record,
        time=record.time or datetime.now(UTC).isoformat(timespec="milliseconds"),
        user=record.user or _user(),
        host=record.host or socket.gethostname(),
    )
    # Its fields as they are (``asdict`` would deep-copy the record's mapping for nothing).
    line = json.dumps(
        {name: getattr(stamped, name) for name in _FIELDS}, sort_keys=True, ensure_ascii=True
    )
    path = log_path(git_dir)
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # A leading newline closes a line a crashed writer left open; readers skip blanks.
        data = (
            ("\n" + line + "\n").encode("ascii")
            if _ends_open(fd)
            else (line + "\n").encode("ascii")
        )
        from .. import _faults

        _faults.fail(fault)
        written = os.write(fd, data)
        if written != len(data):  # disk full: never leave half a record without a newline
            with contextlib.suppress(OSError):
                os.write(fd, b"\n")
            raise OSError(28, f"the operations log took {written} of {len(data)} bytes")
    finally:
        os.close(fd)
    return stamped


def _ends_open(fd: int) -> bool:
    """Whether the file's last byte is not a newline (a crashed writer's torn line)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return False
    return os.pread(fd, 1, size - 1) != b"\n"


def read(git_dir: Path) -> Iterator[OpRecord]:
    """Every complete record, oldest first; torn or foreign lines are skipped.

    Each file's records are kept in this process once parsed, and only what was appended
    since is parsed again: every gated test reads the whole log (what accounts for a tip,
    which moves are in flight), and parsing all of it each time would make a test's cost
    grow with the repository's history (about 8 ms for every thousand lines).
    """
    for path in (*sorted(log_path(git_dir).parent.glob(FILE_NAME + ".*")), log_path(git_dir)):
        yield from _parsed(path)


@dataclass
class _Parsed:
    """What this process has parsed of one log file: the file (device, inode), how far
    (whole lines only), the bytes just before that point, and the records."""

    file: tuple[int, int]
    offset: int
    last: bytes
    records: list[OpRecord]


#: Bytes before the parsed end compared at each read: a file truncated, replaced or
#: rewritten at its end is parsed again from the start. The log is append-only: a line
#: edited in place further back is seen by the next process, not by this one.
_CHECKED = 4096
#: How many records this process keeps at most, of all the log files it read (about 300
#: bytes each): past that, the files read least recently are dropped, and parsed again
#: if read again.
_KEEP_RECORDS = 200_000
_parsed_files: dict[str, _Parsed] = {}
_parsing = threading.Lock()


def _parsed(path: Path) -> list[OpRecord]:
    """The records of one log file, as of now (a list no later append changes)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        with _parsing:
            st = os.fstat(fd)
            seen = _parsed_files.get(str(path))
            start = max(0, seen.offset - _CHECKED) if seen is not None else 0
            if (
                seen is None
                or seen.file != (st.st_dev, st.st_ino)
                or st.st_size < seen.offset
                or os.pread(fd, seen.offset - start, start) != seen.last
            ):
                seen = _Parsed((st.st_dev, st.st_ino), 0, b"", [])
            if st.st_size > seen.offset:
                data = os.pread(fd, st.st_size - seen.offset, seen.offset)
                whole = data.rfind(b"\n") + 1  # a line still being written waits its turn
                seen.records = seen.records + _records(data[:whole])
                seen.offset += whole
                seen.last = (seen.last + data[:whole])[-_CHECKED:]
            _parsed_files.pop(str(path), None)
            _parsed_files[str(path)] = seen  # the newest read last
            total = sum(len(p.records) for p in _parsed_files.values())
            for name in list(_parsed_files)[:-1]:
                if total <= _KEEP_RECORDS:
                    break
                total -= len(_parsed_files.pop(name).records)
            return seen.records
    finally:
        os.close(fd)


def _records(data: bytes) -> list[OpRecord]:
    """The records of whole lines. The values that repeat from line to line (names, refs,
    commits: one line's new tip is the next one's old) are held once: kept for the life
    of the process, a long log's records would otherwise take several times its size."""
    found = []
    for line in data.decode("ascii", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("op", "ref")
        ):
            continue
        # A field of the wrong type (a hand-edited or damaged line) is taken as absent:
        # one bad line never stops a command that reads the log.
        kept: dict[str, Any] = {"old": None, "new": None}
        for k, v in item.items():
            kinds = _KINDS.get(k)
            if kinds is not None and isinstance(v, kinds) and not isinstance(v, bool):
                kept[k] = sys.intern(v) if isinstance(v, str) and k in _REPEATED else v
        if not kept.get("record"):
            kept.pop("record", None)
        found.append(OpRecord(**kept))
    return found


_REPEATED = frozenset({"op", "ref", "old", "new", "agent", "task", "user", "host"})


class OpLog:
    """One repository's operations log, as an object to hand to whoever moves refs.

    A :class:`~pytest_agentgate.land.target.Target` is given one when it is made (as dulwich gives
    its refs container a reflog writer), so every move it makes is logged by construction.
    """

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = git_dir

    @property
    def path(self) -> Path:
        return log_path(self.git_dir)

    def append(self, record: OpRecord, fault: str = "oplog") -> OpRecord:
        return append(self.git_dir, record, fault)

    def read(self) -> Iterator[OpRecord]:
        return read(self.git_dir)
