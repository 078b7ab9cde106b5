"""Attempt records: one commit per attempt under ``refs/agentgate/attempts/<slug>/<n>``.

The record commit has the snapshot as its tree and the base as its parent, so ``git show``
on the ref shows exactly what the agent changed. Its message carries the verdict and the tail
of the failing output; it is never part of the target's history.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import AttemptNotFound, GitError, RecordMismatch
from .record import Record
from .records import (
    check_name,
    format_message,
    one_line,
    parse_trailers,
    record_reflog,
    slugify,
    trailer_lines,
)

if TYPE_CHECKING:
    from ..git.repo import Author, BaseRepo

PREFIX = "refs/agentgate/attempts/"

__all__ = [
    "PREFIX",
    "AttemptInfo",
    "check_name",
    "check_readable",
    "find",
    "format_message",
    "list_attempts",
    "one_line",
    "parse_trailers",
    "slugify",
    "trailer_lines",
    "write_record",
    "write_ref",
]


def write_ref(repo: BaseRepo, slug: str, commit: str, message: str) -> str:
    """Create ``refs/agentgate/attempts/<slug>/<n>`` with the next free ``n``.

    ``n`` is claimed by compare-and-swap against "does not exist", so two processes never
    get the same number and a number is never reused while its ref exists.
    """
    taken = [name.rsplit("/", 1)[-1] for name in repo.refs.names(f"{PREFIX}{slug}/")]
    n = max([int(x) for x in taken if x.isdigit()] + [high_water(repo, slug)], default=0) + 1
    for _ in range(10_000):
        ref = f"{PREFIX}{slug}/{n}"
        # The new ref is its own claim; the high-water file only has to outlive the refs
        # that go, and whatever removes one (prune, a renumbering) raises it first.
        if repo.refs.update(ref, commit, None, message):
            return ref
        n += 1
    raise GitError(
        ["update-ref", f"{PREFIX}{slug}/<n>"], 1, "no free attempt number in 10,000 tries"
    )


def _high_water_file(repo: BaseRepo, slug: str) -> Path:
    return repo.private_dir / "numbers" / slug


def high_water(repo: BaseRepo, slug: str) -> int:
    """The highest attempt number of ``slug`` whose ref was removed (0: none known), kept
    beside the refs so that a number freed by ``prune`` is never claimed again."""
    try:
        return int(_high_water_file(repo, slug).read_text(encoding="ascii").strip() or 0)
    except (OSError, ValueError):
        return 0


def raise_high_water(repo: BaseRepo, slug: str, n: int) -> None:
    """Keep ``n`` as claimed (written by replacing the file; a failure to write it only
    loses the guard against reuse after prune, which :func:`prune` writes again first)."""
    if n <= high_water(repo, slug):
        return
    path = _high_water_file(repo, slug)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{slug}.{os.getpid()}")
        tmp.write_text(str(n), encoding="ascii")
        os.replace(tmp, path)


@dataclass(frozen=True)
class AttemptInfo:
    """One recorded attempt, as listed by ``agentgate attempts``."""

    #: ``refs/agentgate/attempts/<slug>/<n>``.
    record_ref: str
    #: The record commit it points to.
    record_commit: str
    date: str
    subject: str
    trailers: dict[str, str]

    @cached_property
    def record(self) -> Record:
        """What its record says, as the one :class:`Record` every writer writes (its
        trailers read by :func:`.records.record_of_trailers`): read that, never a trailer
        by its name."""
        from .records import record_of_trailers

        return record_of_trailers(self.trailers)

    @property
    def check(self) -> str:
        """What decided its verdict (``gate: ...``, ``preflight``; empty for a pass)."""
        return self.trailers.get("Check", "")

    @property
    def verdict(self) -> str:
        return self.trailers.get("Verdict", "")

    @property
    def task(self) -> str:
        return self.trailers.get("Task", "")

    @property
    def agent(self) -> str:
        return self.trailers.get("Agent", "")

    @property
    def base(self) -> str:
        return self.trailers.get("Base", "")

    @property
    def landed(self) -> str:
        return self.trailers.get("Landed", "")

    def as_dict(self) -> dict[str, str]:
        return {
            "ref": self.record_ref,
            "commit": self.record_commit,
            "date": self.date,
            "task": self.task,
            "agent": self.agent,
            "verdict": self.verdict,
            "base": self.base,
            "landed": self.landed,
        }


def list_attempts(repo: BaseRepo, prefix: str = PREFIX) -> list[AttemptInfo]:
    """Every attempt, newest first, read with one ``git for-each-ref``.

    With ``prefix``, the records held there (a server's, fetched into this clone), named as
    they are on the server (``refs/agentgate/attempts/...``)."""
    fields = (
        "refname",
        "objectname",
        "objecttype",
        "committerdate:iso-strict",
        "subject",
        "trailers:only,unfold",
    )
    rows = [
        AttemptInfo(PREFIX + ref[len(prefix) :], commit, date, subject, parse_trailers(trailers))
        for ref, commit, kind, date, subject, trailers in repo.refs.records(prefix, fields)
        # Anything else under the prefix (a blob, a tag, a commit with no date) is no record:
        # anyone who can push to a server can put one there.
        if kind == "commit" and date
    ]
    rows.sort(
        key=lambda a: (a.trailers.get("Recorded", a.date), _number(a.record_ref)), reverse=True
    )
    return rows


def _number(ref: str) -> int:
    tail = ref.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def find(repo: BaseRepo, name: str, prefix: str = PREFIX, *, readable: bool = True) -> AttemptInfo:
    """An attempt by full ref, by ``<slug>/<n>``, by a unique prefix of either, or by commit
    (with ``prefix``: among the records held there, see :func:`list_attempts`).

    With ``readable`` (for what acts on a record: land, restore, revert, a resume), one
    written in a newer record schema is refused (:class:`~.schema.TooNew`) rather than
    misread, and so is one whose Base trailer is not its own parent
    (:class:`~.errors.RecordMismatch`): what acts on it reads the base from the trailer,
    what ``show`` prints is the commit's own diff."""
    found = _find(repo, name, prefix)
    return check_readable(repo, found) if readable else found


def check_readable(repo: BaseRepo, found: AttemptInfo) -> AttemptInfo:
    """``found``, unless it is written in a newer record schema or its Base trailer is not
    its own parent (see :func:`find`)."""
    from .schema import check_record

    check_record(found.record_ref, found.trailers)
    parents = repo.history.parents(found.record_commit)
    if parents != [found.base]:
        raise RecordMismatch(found.record_ref, found.base, parents)
    return found


def _find(repo: BaseRepo, name: str, prefix: str) -> AttemptInfo:
    attempts = list_attempts(repo, prefix)
    for attempt in attempts:
        ref = attempt.record_ref
        if name in (ref, ref[len(PREFIX) :], attempt.record_commit):
            return attempt
    short = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    matches = [a for a in attempts if a.record_ref[len(PREFIX) :].startswith(short)]
    # Its id (what a squash commit's Agentgate-Id trailer says), or the commit that landed it.
    matches += [
        a for a in attempts if name in (a.trailers.get("Id"), a.landed) and a not in matches
    ]
    if re.fullmatch(r"[0-9a-f]{4,40}", name):
        # A commit id, or a name that starts like one: both are candidates, and two
        # candidates are ambiguous (a record named after another's commit hijacks nothing).
        matches += [a for a in attempts if a.record_commit.startswith(name) and a not in matches]
    if len(matches) == 1:
        return matches[0]
    raise AttemptNotFound(name, [m.record_ref for m in matches])


def record_commit(repo: BaseRepo, tree: str, base: str, message: str, author: Author) -> str:
    """The record commit: the snapshot tree on the base, message as given."""
    return repo.commit_tree(tree, [base], message, author)


def write_record(
    repo: BaseRepo,
    record: Record,
    *,
    reason: str = "",
    check: str = "",
    output: str = "",
    landed: str | None = None,
    known_objects: Sequence[str] = (),
) -> tuple[str, str]:
    """Write one attempt's record: the commit of ``record`` (its verdict is
    ``record.status``; ``reason``, ``check`` and ``output`` say why), its ref, the state
    ref beside it, and the log line. Returns (ref, commit).

    The one writer of records: in the normal course, after a batch's move, and when a
    later run completes the record of a move whose process died or could not write it
    (see ``pending``).
    """
    import time

    from ..git.repo import Author
    from . import oplog, state_refs

    message = format_message(record, reason=reason, check=check, output=output, landed=landed)
    begin = time.perf_counter()
    from .. import _faults

    _faults.point("record")
    author = Author.for_agent(record.agent)
    commit = record_commit(repo, record.tree, record.base, message, author)
    objects, size = repo.measure([commit, *known_objects])
    ref = write_ref(repo, slugify(record.task), commit, record_reflog(record))
    if record.state:
        state_refs.write_ref(repo, ref, record.state)
    # The record itself is written; its log line is a convenience.
    with contextlib.suppress(OSError):
        oplog.append(
            repo.common_dir,
            oplog.OpRecord(
                op="attempt",
                ref=ref,
                old=None,
                new=commit,
                agent=record.agent,
                task=record.task,
                objects=objects,
                bytes=size,
                duration_ms=round((time.perf_counter() - begin) * 1000, 3),
                note=record.status,
            ),
        )
    return ref, commit
