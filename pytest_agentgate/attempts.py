"""Attempt records: one commit per attempt under ``refs/agentgate/attempts/<slug>/<n>``.

The record commit has the snapshot as its tree and the base as its parent, so ``git show``
on the ref shows exactly what the agent changed. Its message carries the verdict and the tail
of the failing output; it is never part of the target's history.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .errors import AttemptNotFound, GitError

if TYPE_CHECKING:
    from .repo import Author, BaseRepo

PREFIX = "refs/agentgate/attempts/"


#: Characters that would end a line (or a trailer) in a commit message.
_LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` as one line of plain words: control characters and line breaks become
    spaces, runs of whitespace one space. What enters a trailer or a subject is data, never
    message syntax."""
    return " ".join(_LINE_BREAKING.sub(" ", text).split())


def check_name(name: str, what: str = "agent name", source: str = "") -> str:
    """Refuse a name with a control character (a newline would forge trailers)."""
    from .errors import ConfigError

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
    """Lowercase letters, digits and dashes, from the task text."""
    slug = re.sub(r"[^a-z0-9]+", "-", task.lower()).strip("-")[:limit].strip("-")
    return slug or "task"


def format_message(
    *,
    task: str,
    status: str,
    reason: str,
    check: str,
    output: str,
    agent: str,
    test: str,
    base: str,
    landed: str | None,
    excluded: Sequence[str] = (),
    state: str | None = None,
    sandbox: str = "",
    uid: str = "",
    results: Mapping[str, Any] | None = None,
    retest: str = "",
    graded_tree: str = "",
) -> str:
    """The record's message: a subject, why, the output tail, then ``Agentgate-*`` trailers."""
    subject = one_line(f"agentgate {status}: {task}")[:200]
    body = [subject, ""]
    if reason:
        body += [f"Reason: {one_line(reason)}", ""]
    if excluded:
        names = ", ".join(one_line(name) for name in excluded)
        body += [f"Left out of the snapshot (secrets): {names}", ""]
    if results and results.get("grade"):
        body += [f"Grade: {results['grade']}"]
        for kind in ("fail_to_pass", "pass_to_pass"):
            for graded, outcome in dict(results.get(kind) or {}).items():
                body += [f"  {kind}: {one_line(str(graded))} {outcome}"]
        body += [""]
    if results and "passed" in results:
        counts = ", ".join(
            f"{results.get(k, 0)} {k}" for k in ("passed", "failed", "skipped", "new", "lost")
        )
        body += [f"Tests: {counts}"]
        for label, key in (("Lost", "lost_ids"), ("Failed", "failed_ids")):
            if results.get(key):
                body += [f"{label}: " + ", ".join(one_line(str(t)) for t in results[key][:50])]
        body += [""]
    if output.strip():
        body += ["Output (last lines):", *("    " + line for line in output.splitlines()), ""]
    # Empty values are left out by trailer_lines. Commit dates have whole seconds; Recorded
    # orders attempts recorded within one second.
    trailers: dict[str, str | None] = {
        "Verdict": status,
        "Agent": agent,
        "Task": task,
        "Test": test,
        "Base": base,
        "Check": check,
        "Landed": landed,
        "State": state,
        "Sandbox": sandbox,
        "Id": uid,
        "Retest": retest,
        "Graded-Tree": graded_tree,
        "Recorded": datetime.now(UTC).isoformat(timespec="microseconds"),
    }
    return "\n".join(body) + "\n" + trailer_lines(trailers)


def write_ref(repo: BaseRepo, slug: str, commit: str, message: str) -> str:
    """Create ``refs/agentgate/attempts/<slug>/<n>`` with the next free ``n``.

    ``n`` is claimed by compare-and-swap against "does not exist", so two processes never
    get the same number and a number is never reused while its ref exists.
    """
    taken = [row[0].rsplit("/", 1)[-1] for row in repo.refs(f"{PREFIX}{slug}/")]
    n = max((int(x) for x in taken if x.isdigit()), default=0) + 1
    for _ in range(10_000):
        ref = f"{PREFIX}{slug}/{n}"
        if repo.update_ref(ref, commit, None, message):
            return ref
        n += 1
    raise GitError(
        ["update-ref", f"{PREFIX}{slug}/<n>"], 1, "no free attempt number in 10,000 tries"
    )


@dataclass(frozen=True)
class AttemptInfo:
    """One recorded attempt, as listed by ``agentgate attempts``."""

    ref: str
    commit: str
    date: str
    subject: str
    trailers: dict[str, str]

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
            "ref": self.ref,
            "commit": self.commit,
            "date": self.date,
            "task": self.task,
            "agent": self.agent,
            "verdict": self.verdict,
            "base": self.base,
            "landed": self.landed,
        }


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


def list_attempts(repo: BaseRepo) -> list[AttemptInfo]:
    """Every attempt, newest first, read with one ``git for-each-ref``."""
    fields = (
        "refname",
        "objectname",
        "committerdate:iso-strict",
        "subject",
        "trailers:only,unfold",
    )
    fmt = "%00".join(f"%({name})" for name in fields) + "%01"
    out = repo.git(
        "for-each-ref", "--sort=-creatordate", f"--format={fmt}", "--end-of-options", PREFIX
    ).out
    rows = []
    for chunk in out.split("\x01"):
        parts = chunk.strip("\n").split("\0")
        if len(parts) < 5:
            continue
        ref, commit, date, subject, trailers = parts[:5]
        rows.append(AttemptInfo(ref, commit, date, subject, parse_trailers(trailers)))
    rows.sort(key=lambda a: (a.trailers.get("Recorded", a.date), _number(a.ref)), reverse=True)
    return rows


def _number(ref: str) -> int:
    tail = ref.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def find(repo: BaseRepo, name: str) -> AttemptInfo:
    """An attempt by full ref, by ``<slug>/<n>``, by a unique prefix of either, or by commit."""
    attempts = list_attempts(repo)
    for attempt in attempts:
        if name in (attempt.ref, attempt.ref[len(PREFIX) :], attempt.commit):
            return attempt
    short = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    matches = [a for a in attempts if a.ref[len(PREFIX) :].startswith(short)]
    if not matches and re.fullmatch(r"[0-9a-f]{4,40}", name):
        matches = [a for a in attempts if a.commit.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    raise AttemptNotFound(name, [m.ref for m in matches])


def record_commit(repo: BaseRepo, tree: str, base: str, message: str, author: Author) -> str:
    """The record commit: the snapshot tree on the base, message as given."""
    return repo.commit_tree(tree, [base], message, author)


def write_record(
    repo: BaseRepo,
    fields: Mapping[str, Any],
    *,
    status: str,
    reason: str = "",
    check: str = "",
    output: str = "",
    landed: str | None = None,
    known_objects: Sequence[str] = (),
) -> tuple[str, str]:
    """Write one attempt's record from ``fields`` (see :func:`record_fields`): the commit, its
    ref, the state ref beside it, and the log line. Returns (ref, commit).

    The same function writes a record in the normal course and when a later run completes
    the record of a move whose process died or could not write it (see ``pending``).
    """
    import time

    from . import oplog, state
    from .repo import Author

    message = format_message(
        task=str(fields["task"]),
        status=status,
        reason=reason,
        check=check,
        output=output,
        agent=str(fields["agent"]),
        test=str(fields.get("test", "")),
        base=str(fields["base"]),
        landed=landed,
        excluded=tuple(fields.get("excluded", ())),
        state=fields.get("state") or None,
        sandbox=str(fields.get("sandbox", "")),
        uid=str(fields.get("uid", "")),
        results=fields.get("results") or None,
        retest=str(fields.get("retest") or ""),
        graded_tree=str(fields.get("graded_tree") or ""),
    )
    begin = time.perf_counter()
    from . import _faults

    _faults.point("record")
    author = Author.for_agent(str(fields["agent"]))
    commit = record_commit(repo, str(fields["tree"]), str(fields["base"]), message, author)
    objects, size = repo.measure([commit, *known_objects])
    ref = write_ref(repo, slugify(str(fields["task"])), commit, message)
    if fields.get("state"):
        state.write_ref(repo, ref, str(fields["state"]))
    # The record itself is written; its log line is a convenience.
    with contextlib.suppress(OSError):
        oplog.append(
            repo.common_dir,
            oplog.OpRecord(
                op="attempt",
                ref=ref,
                old=None,
                new=commit,
                agent=str(fields["agent"]),
                task=str(fields["task"]),
                objects=objects,
                bytes=size,
                duration_ms=round((time.perf_counter() - begin) * 1000, 3),
                note=status,
            ),
        )
    return ref, commit
