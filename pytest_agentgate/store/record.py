"""The one record of an attempt: what its record commit will say besides the verdict's why.

The engine makes it once the gate has judged; the landing queue's entries, the ``pending``
lines of a move, and a batch's records all carry the same frozen value, and
:func:`.attempts.write_record` writes it. On disk (an entry file, a pending line) it is the
JSON of :meth:`Record.to_json`, read back by :meth:`Record.from_json`, which takes what an
older version wrote and what a damaged file holds without raising: a record a later run
completes must never be lost to a field it cannot read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

#: An attempt's verdict.
Status = Literal["promoted", "passed", "rejected", "conflict", "error"]
#: What re-tested the tree that landed: its gate (``passed``), an early re-test of exactly
#: that tree (``passed early``), the re-test of a batch above it (``batched``), nothing
#: (``skipped``: re-tests off), or no merge to re-test (``""``).
Retest = Literal["", "passed", "passed early", "batched", "skipped"]
#: How a passing attempt lands on a target that moved past its base: a merge commit, one
#: squashed commit with the record's trailers, or its commit replayed on the tip. (On the
#: base itself a merge and a rebase are a fast-forward; a squash is its own commit.)
Landing = Literal["merge", "squash", "rebase"]
STATUSES: tuple[str, ...] = get_args(Status)
RETESTS: tuple[str, ...] = get_args(Retest)
LANDINGS: tuple[str, ...] = get_args(Landing)

#: The record's fields under their JSON names where those differ (``try`` is a keyword).
_JSON_NAMES = {"try_number": "try"}


def json_name(field: str) -> str:
    """The name a field of :class:`Record` has in its JSON object."""
    return _JSON_NAMES.get(field, field)


@dataclass(frozen=True)
class Record:
    """What an attempt's record says besides its verdict's reason, check and output."""

    task: str
    agent: str
    base: str
    tree: str
    uid: str = ""
    test: str = ""
    status: Status = "promoted"
    #: Paths left out of the snapshot (secrets) and of the declared state.
    excluded: tuple[str, ...] = ()
    #: The commit of the declared state the attempt left (None: none declared).
    state: str | None = None
    sandbox: str = ""
    #: The tail of what the agent's commands printed.
    transcript: str = ""
    #: The per-test counts and grades (see :func:`.records.format_message`).
    results: Mapping[str, Any] | None = None
    graded_tree: str = ""
    try_number: int = 1
    protect: tuple[str, ...] = ()
    max_changed_lines: int | None = None
    #: The folder of the try's checkpoints (``refs/agentgate/checkpoints/<this>/<k>``).
    checkpoints: str = ""
    retest: Retest = ""
    #: Its place in the batch that landed it (``<batch> (i of n)``).
    batch: str = ""
    #: Connections the agent's network allow-list refused (``host:port at time``).
    refused: tuple[str, ...] = ()
    landing: Landing = "merge"
    #: Whose move it is (a waiter's attempt landed by a leader is the waiter's): settling
    #: its pending line waits while that process lives. None: the writer's own.
    pid: int | None = None

    def __post_init__(self) -> None:
        # Bytes that are not UTF-8 (a file name, a test id, a program's output) reach the
        # plugin as lone surrogates: escaped here, once, every writer of the record (its
        # commit message, a pending line, a server's posting) gets text it can encode.
        for f in fields(self):
            value = getattr(self, f.name)
            clean = escaped(value)
            if clean is not value:
                object.__setattr__(self, f.name, clean)

    def to_json(self) -> dict[str, object]:
        """Its JSON object (lists for tuples; ``pid`` only when set)."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "pid" and value is None:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[_JSON_NAMES.get(f.name, f.name)] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Record:
        """The record ``data`` holds, each field checked for its type (a field of the wrong
        type, or an unknown status, is taken as absent; unknown keys are ignored)."""
        raw = {name: data.get(_JSON_NAMES.get(name, name)) for name in _FIELD_NAMES}
        return cls(
            task=_text(raw["task"]),
            agent=_text(raw["agent"]) or "agent",
            base=_text(raw["base"]),
            tree=_text(raw["tree"]),
            uid=_text(raw["uid"]),
            test=_text(raw["test"]),
            status=raw["status"] if raw["status"] in STATUSES else "promoted",  # type: ignore[arg-type]
            excluded=_texts(raw["excluded"]),
            state=raw["state"] if isinstance(raw["state"], str) and raw["state"] else None,
            sandbox=_text(raw["sandbox"]),
            transcript=_text(raw["transcript"]),
            results=dict(raw["results"]) if isinstance(raw["results"], Mapping) else None,
            graded_tree=_text(raw["graded_tree"]),
            try_number=_int(raw["try_number"]) or 1,
            protect=_texts(raw["protect"]),
            max_changed_lines=_int(raw["max_changed_lines"]),
            checkpoints=_text(raw["checkpoints"]),
            retest=raw["retest"] if raw["retest"] in RETESTS else "",  # type: ignore[arg-type]
            batch=_text(raw["batch"]),
            refused=_texts(raw["refused"]),
            landing=raw["landing"] if raw["landing"] in LANDINGS else "merge",  # type: ignore[arg-type]
            pid=_int(raw["pid"]),
        )


_FIELD_NAMES = tuple(f.name for f in fields(Record))
#: What a commit message cannot hold as it is: a lone surrogate (a byte that was not UTF-8)
#: and NUL (git refuses a message holding one).
_UNWRITABLE = re.compile("[\ud800-\udfff\x00]")


def printable(text: str) -> str:
    """``text`` with each lone surrogate written as the byte or code point it stands for
    (``\\xff`` for a byte Python decoded with ``surrogateescape``), and NUL as ``\\x00``:
    always encodable, always a message git takes."""
    if not _UNWRITABLE.search(text):
        return text
    return _UNWRITABLE.sub(
        lambda m: (
            f"\\x{ord(m[0]) - 0xDC00:02x}"
            if 0xDC80 <= ord(m[0]) <= 0xDCFF
            else f"\\x{ord(m[0]):02x}"
            if m[0] == "\x00"
            else f"\\u{ord(m[0]):04x}"
        ),
        text,
    )


def escaped(value: Any) -> Any:
    """``value`` with :func:`printable` applied to every string in it, at any depth (the
    same object when nothing needed it)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, tuple | list):
        items = [escaped(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items)
    if isinstance(value, Mapping):
        pairs = [(escaped(k), escaped(v)) for k, v in value.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items(), strict=True)):
            return value
        return dict(pairs)
    return value


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _texts(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(v for v in value if isinstance(v, str))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
