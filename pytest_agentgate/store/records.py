"""Messages and trailers: every commit message the plugin writes, and reading them back.

One module writes and reads them all, so what a record says and what ``agentgate attempts``
reads from it cannot drift apart. Everything agent-named that enters a message is made one
line first (:func:`one_line`): a task or an agent name is data, never message syntax, and no
newline in one can forge a trailer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from .record import Record, Status, json_name, printable
from .schema import RECORD_VERSION

#: Characters that would end a line (or a trailer) in a commit message.
_LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


#: The most of a list a record's message shows (the rest is counted), and the most of an
#: output or transcript tail it keeps: a record's message stays small whatever the attempt
#: holds (10,000 graded tests, 5,000 files left out).
_SHOWN = 50
_MAX_TAIL = 16 << 10


def one_line(text: str) -> str:
    """``text`` as one line of plain words: control characters and line breaks become
    spaces, runs of whitespace one space, bytes that are not UTF-8 escaped. What enters a
    trailer or a subject is data, never message syntax."""
    return " ".join(_LINE_BREAKING.sub(" ", printable(text)).split())


def _listed(items: list[str]) -> str:
    """The first of ``items``, comma-separated, and how many more there are."""
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(one_line(i) for i in items[:_SHOWN]) + more


def _tail(text: str) -> str:
    """At most the last ``_MAX_TAIL`` characters of ``text``, from a line's start."""
    if len(text) <= _MAX_TAIL:
        return text
    cut = text[-_MAX_TAIL:]
    return "[...]\n" + cut[cut.find("\n") + 1 :]


def check_name(name: str, what: str = "agent name", source: str = "") -> str:
    """Refuse a name with a control character (a newline would forge trailers)."""
    from ..errors import ConfigError

    if _LINE_BREAKING.search(name):
        raise ConfigError(
            f"{what} {name!r} contains a control character (a newline, a tab...); use a plain name",
            value=name,
            source=source,
        )
    return name


def trailer_lines(trailers: dict[str, str | None]) -> str:
    """``Agentgate-<Key>: <value>`` lines, each value made :func:`one_line`, empty ones left out."""
    lines = []
    for key, value in trailers.items():
        clean = one_line(value or "")
        if clean:
            lines.append(f"Agentgate-{key}: {clean}\n")
    return "".join(lines)


def slugify(task: str, limit: int = 60) -> str:
    """Lowercase letters, digits and dashes, from the task text. One too long is cut at a
    word's end and given a short hash of the whole task, so two long tasks that begin
    alike keep slugs of their own, and no word is cut in two."""
    slug = re.sub(r"[^a-z0-9]+", "-", task.lower()).strip("-")
    if len(slug) <= limit:
        return slug or "task"
    import hashlib

    digest = hashlib.sha256(task.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    head = slug[: limit - len(digest) - 1]
    if slug[len(head)] != "-" and "-" in head:
        head = head.rsplit("-", 1)[0]
    return f"{head.strip('-')}-{digest}"


def _indented(title: str, text: str) -> list[str]:
    """A titled block of the record's body, each line indented (none when ``text`` is empty)."""
    if not text.strip():
        return []
    return [title, *("    " + line for line in text.splitlines()), ""]


def _results_lines(results: Mapping[str, Any]) -> list[str]:
    """What a record's body says of the gate's results: the grade, the per-test counts,
    the commands judged by exit code, the gate log kept, the test files changed."""
    body: list[str] = []
    if results.get("grade"):
        body += [f"Grade: {results['grade']}"]
        for kind in ("fail_to_pass", "pass_to_pass"):
            graded = dict(results.get(kind) or {})
            # What did not pass first: those are what a reader of a rejection looks for.
            ordered = sorted(graded.items(), key=lambda item: item[1] == "passed")
            body += [
                f"  {kind}: {one_line(str(t))} {one_line(str(o))}" for t, o in ordered[:_SHOWN]
            ]
            if len(ordered) > _SHOWN:
                rest = [o for _, o in ordered[_SHOWN:]]
                counts = ", ".join(f"{rest.count(o)} {o}" for o in sorted(set(rest)))
                body += [f"  {kind}: {len(rest)} more ({one_line(counts)})"]
        body += [""]
    if "passed" in results:
        counts = ", ".join(
            f"{results.get(k, 0)} {k}" for k in ("passed", "failed", "skipped", "new", "lost")
        )
        body += [f"Tests: {counts}"]
        for label, key in (("Lost", "lost_ids"), ("Failed", "failed_ids")):
            if results.get(key):
                body += [f"{label}: " + _listed([str(t) for t in results[key]])]
        body += [""]
    if results.get("judged_by_exit_code"):
        shown = _listed([str(c) for c in results["judged_by_exit_code"]])
        body += [f"Judged by exit code: {shown}", ""]
    if results.get("gate_log"):
        kept = [  # as a pending line holds it: anything else is left out, never raised
            (str(entry[0]), entry[1])
            for entry in results["gate_log"]
            if isinstance(entry, list | tuple) and len(entry) == 2 and isinstance(entry[1], int)
        ]
        total = sum(size for _, size in kept)
        body += [
            f"Gate log: {len(kept)} command(s), {total} bytes printed "
            "(whole, beside this record: agentgate show --log)",
            "",
        ]
    if results.get("changed_tests"):
        changed = [str(p) for p in results["changed_tests"]]
        body += [f"Test files changed ({len(changed)}): {_listed(changed)}", ""]
    return body


def format_message(
    record: Record,
    *,
    reason: str = "",
    check: str = "",
    output: str = "",
    landed: str | None = None,
) -> str:
    """The message of ``record``'s commit: a subject, why (``reason``), the output tail,
    what the agent's commands printed (the tail of its transcript), then ``Agentgate-*``
    trailers (``check``: what decided; ``landed``: the commit that landed it)."""
    status, task, excluded, results = record.status, record.task, record.excluded, record.results
    subject = one_line(f"agentgate {status}: {task}")[:200]
    body = [subject, ""]
    if reason:
        body += [f"Reason: {one_line(reason)[:_MAX_TAIL]}", ""]
    if excluded:
        body += [f"Left out of the snapshot (secrets): {_listed(list(excluded))}", ""]
    if record.refused:
        body += [f"Connections the allow-list refused: {_listed(list(record.refused))}", ""]
    body += _results_lines(results or {})
    body += _indented("Output (last lines):", _tail(printable(output)))
    if record.transcript.strip() != output.strip():
        body += _indented("Agent transcript (last lines):", _tail(record.transcript))
    # Empty values are left out by trailer_lines. Commit dates have whole seconds; Recorded
    # orders attempts recorded within one second.
    own = {
        "Check": check,
        "Landed": landed,
        "Recorded": datetime.now(UTC).isoformat(timespec="microseconds"),
        "Schema": str(RECORD_VERSION),
    }
    trailers = {
        t.key: own[t.key] if t.field is None else t.write(getattr(record, t.field))
        for t in TRAILERS
    }
    return "\n".join(body) + "\n" + trailer_lines(trailers)


def _text(value: Any) -> str | None:
    return str(value) if value else None


def _same(text: str) -> object:
    return text


def _digits(text: str) -> object:
    return int(text) if text.isdigit() else None


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Trailer:
    """One ``Agentgate-*`` trailer of a record commit: the :class:`Record` field it
    carries (None: a value of the commit itself, given as it is written), how the field is
    written (None or empty: left out), and how it is read back into the field's JSON value
    (which :meth:`Record.from_json` checks)."""

    key: str
    field: str | None
    write: Callable[[Any], str | None] = _text
    read: Callable[[str], object] = _same


#: Every trailer of a record commit, in the order written: the one table both
#: :func:`format_message` and :func:`record_of_trailers` read (the verdict first, before
#: anything agent-named, since a reader takes the first of a key).
TRAILERS = (
    Trailer("Verdict", "status"),
    Trailer("Agent", "agent"),
    Trailer("Task", "task"),
    Trailer("Test", "test"),
    Trailer("Base", "base"),
    Trailer("Check", None),
    Trailer("Landed", None),
    Trailer("State", "state"),
    Trailer("Sandbox", "sandbox"),
    Trailer("Id", "uid"),
    Trailer("Retest", "retest"),
    Trailer("Graded-Tree", "graded_tree"),
    Trailer("Batch", "batch"),
    Trailer("Landing", "landing", lambda landing: landing if landing != "merge" else None),
    Trailer("Try", "try_number", lambda n: str(n) if n > 1 else None, _digits),
    Trailer("Checkpoints", "checkpoints"),
    # The rules it was judged by beyond the run's (JSON: a glob may hold any character).
    Trailer("Protect", "protect", lambda globs: json.dumps(list(globs)) if globs else None, _json),
    Trailer(
        "Max-Changed-Lines", "max_changed_lines", lambda n: None if n is None else str(n), _digits
    ),
    Trailer("Recorded", None),
    Trailer("Schema", None),
)


def parse_trailers(text: str) -> dict[str, str]:
    """The ``Agentgate-*`` trailers of a message's final trailer block (the first of a key
    wins: the plugin writes each once, and writes the verdict before anything agent-named)."""
    paragraphs = [p for p in text.strip("\n").split("\n\n") if p.strip()]
    found: dict[str, str] = {}
    for line in (paragraphs[-1] if paragraphs else "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.startswith("Agentgate-"):
            found.setdefault(key[len("Agentgate-") :], value.strip())
    return found


class LandingSaid(NamedTuple):
    """What a commit on a target says of itself: its task and agent (a landing's; empty for
    a person's commit), and the attempt's commit it squashes or replays (empty otherwise)."""

    task: str
    agent: str
    replays: str


def landing_said(message: str) -> LandingSaid:
    """The :class:`LandingSaid` of a commit's ``message`` (see :func:`squash_message`,
    :func:`rebased_message`, :func:`merge_message`)."""
    said = parse_trailers(message)
    replays = said.get("Squashed") or said.get("Rebased") or ""
    return LandingSaid(said.get("Task", ""), said.get("Agent", ""), replays)


def record_of_trailers(trailers: Mapping[str, str]) -> Record:
    """The :class:`Record` a record commit's trailers say (the inverse of the trailers
    :func:`format_message` writes, by the same table, :data:`TRAILERS`). What only the
    message's body holds (the output, the transcript, the results, what was left out or
    refused) and the snapshot's tree (the record commit's own) are not in it; a value that
    does not parse is taken as absent."""
    data: dict[str, object] = {"tree": ""}
    for t in TRAILERS:
        said = trailers.get(t.key)
        if t.field is not None and said:
            data[json_name(t.field)] = t.read(said)
    return Record.from_json(data)


#: What a server's queue posting says of an attempt's record (under the record's JSON
#: names): what a leader on another machine needs to merge it and judge it as its own.
POSTED = ("base", "agent", "task", "test", "protect", "max_changed_lines", "landing")
#: The longest agent, task or base name read from another machine's posting.
POSTED_NAME_MAX = 200


def posting_of_record(record: Record) -> dict[str, object]:
    """The part of a server's queue posting that is ``record``'s (see :data:`POSTED`)."""
    said = record.to_json()
    return {name: said[name] for name in POSTED}


def record_of_posting(data: Mapping[str, object], uid: str, status: Status) -> Record:
    """The :class:`Record` another machine's posting says (the inverse of
    :func:`posting_of_record`), as ``status`` with ``uid``. Anyone who can push can post:
    its names are cut to printable characters and :data:`POSTED_NAME_MAX`, a value of the
    wrong type is taken as absent, and the agent and task are never empty."""

    def name(key: str) -> str:
        value = data.get(key)
        if not isinstance(value, str):
            return ""
        return "".join(ch for ch in value if ch.isprintable())[:POSTED_NAME_MAX]

    said = {key: data.get(key) for key in POSTED}
    said.update(agent=name("agent") or "agent", task=name("task") or "task", base=name("base"))
    said.update(landing=name("landing"), tree="", uid=uid, status=status)
    return Record.from_json(said)


# -- the commits a landing writes -------------------------------------------------------


def change_message(task: str, agent: str) -> str:
    """The message of an attempt's change commit (what lands on a fast-forward)."""
    return f"{one_line(task)}\n\n" + trailer_lines({"Agent": agent, "Task": task})


def merge_message(task: str, agent: str) -> str:
    """The message of the merge commit that lands an attempt onto a moved target."""
    subject = f"agentgate: merge {one_line(task)[:120]} (by {one_line(agent)[:60]})"
    return f"{subject}\n\n" + trailer_lines({"Agent": agent, "Task": task})


def squash_message(record: Record, change_commit: str) -> str:
    """The message of the one commit a squash landing writes: the task as its subject, and
    the trailers that find its record (``agentgate show <Id>``) and say what it was judged
    on, so the target's history alone tells who made each change and under which gate."""
    trailers = {
        "Agent": record.agent,
        "Task": record.task,
        "Id": record.uid,
        "Test": record.test,
        "Base": record.base,
        "Try": str(record.try_number) if record.try_number > 1 else None,
        "Sandbox": record.sandbox,
        "Landing": "squash",
        "Squashed": change_commit,
    }
    return f"{one_line(record.task)}\n\n" + trailer_lines(trailers)


def rebased_message(message: str, change_commit: str) -> str:
    """A replayed commit's message: the attempt's commit's own, with one trailer naming the
    commit it replays (as ``git cherry-pick -x`` notes its source)."""
    kept = message.rstrip("\n")
    # Into its trailer block when it ends in one (the plugin's change commits do), else a
    # block of its own: a trailer glued to a subject is no trailer.
    joint = "\n" if parse_trailers(kept) else "\n\n"
    return kept + joint + trailer_lines({"Rebased": change_commit})


# A reflog message is one short line (git keeps it in a file of one line a move, and it may
# travel as a command-line argument): task and agent are cut, never the whole record.


def landing_reflog(task: str, agent: str, *, dry_run: bool) -> str:
    """The target's reflog message for a landing (the kind is appended by the move)."""
    verb = "dry-run promote" if dry_run else "promote"
    return f"agentgate {verb}: {one_line(task)[:80]} by {one_line(agent)[:60]}"


def record_reflog(record: Record) -> str:
    """The reflog message of an attempt's record ref (its message is the commit's)."""
    return f"agentgate record: {record.status} {one_line(record.task)[:80]}"


def rollback_message(to: str, tree: str, agent: str) -> str:
    return (
        f"agentgate rollback to {to[:12]}\n\n"
        f"Restores the tree of {to} ({tree}).\n\n"
        + trailer_lines({"Agent": agent, "Rollback-To": to})
    )


def rollback_reflog(to: str, agent: str) -> str:
    return f"agentgate rollback to {to[:12]} by {one_line(agent)[:60]}"


def revert_reflog(attempt_commit: str, agent: str) -> str:
    return f"agentgate revert {attempt_commit[:12]} by {one_line(agent)[:60]}"


#: The messages of the three helper commits a revert merges through (never on any branch).
REVERT_PIVOT = "revert pivot\n"
REVERT_OURS = "revert ours\n"
REVERT_THEIRS = "revert theirs\n"


def state_message(task: str) -> str:
    """The message of the commit holding an attempt's declared state."""
    return f"agentgate state: {one_line(task)}\n"


def baseline_message(tree: str) -> str:
    return f"agentgate baseline of tree {tree}\n"


def revert_message(task: str, attempt_commit: str, agent: str) -> str:
    return (
        f"agentgate revert: {one_line(task)}\n\nReverts the change of attempt {attempt_commit}.\n\n"
        + trailer_lines({"Agent": agent, "Reverts": attempt_commit})
    )
