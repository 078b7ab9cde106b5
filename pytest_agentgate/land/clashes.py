"""Which landed change an attempt clashes with, for the message that rejects it.

An attempt that conflicts, or whose merge fails its re-test, failed against what moved the
target after its base, not against its neighbours in a batch. That is the first-parent
history ``base..tip``: each commit a landing (its record's task and agent in its trailers) or
a person's push. For a conflict the commit is exact: the last one that changed a conflicting
path. For a re-test failure it is ranked: the files the failure names, then the words of its
``E`` lines (``add_entry``, a renamed function) that the commit's own patch added or removed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..errors import AgentgateError
from ..git.repo import BaseRepo, LogEntry
from ..store import records

#: How many commits since the base are looked at (a base far behind names the newest).
MOST = 30
_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*\.py")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
#: Words every patch and every traceback has: they say nothing about the clash.
_COMMON = frozenset(
    [
        "self",
        "none",
        "true",
        "false",
        "assert",
        "import",
        "from",
        "return",
        "def",
        "class",
        "with",
        "test",
        "tests",
        "pass",
        "error",
        "raise",
        "where",
    ]
)


def named(repo: BaseRepo, commit: str, subject: str, author: str) -> str:
    """``<commit> 'task' by agent`` of a landing (a person's commit: its subject and author)."""
    try:
        said = records.landing_said(repo.history.commit_message(commit))
    except AgentgateError:
        said = records.LandingSaid("", "", "")
    task, agent = said.task or subject, said.agent or author
    return f"{commit[:12]} {records.one_line(task)[:80]!r} by {records.one_line(agent)[:40]}"


def conflicting(repo: BaseRepo, base: str, tip: str, paths: Sequence[str]) -> str:
    """What landed since ``base`` that changed the conflicting ``paths`` ("" when nothing
    says: a base not in the tip's history)."""
    wanted = set(paths)
    for entry in _since(repo, base, tip):  # newest first: the change the attempt now meets
        hits = _changed(repo, entry.commit, _first_parent(repo, entry.commit)) & wanted
        if hits:
            hit = ", ".join(sorted(hits)[:3])
            return f"it clashes with {named(repo, entry.commit, entry.subject, entry.author)}, which changed {hit}"
    return ""


def retest_suspects(
    repo: BaseRepo, base: str, tip: str, output: str, before: Sequence[str] = ()
) -> str:
    """What most likely broke the merge whose re-test printed ``output``: a commit landed
    since ``base`` (up to ``tip``), or one of ``before`` (the commits merged before it in
    its batch); "" when there is none to name."""
    candidates = [(c, "", "", "was merged before it in its batch") for c in reversed(before)]
    candidates += [
        (e.commit, e.subject, e.author, "landed after its base") for e in _since(repo, base, tip)
    ]
    if not candidates:
        return ""
    files = set(_PATH.findall(output))
    words = _words(line for line in output.splitlines() if line.startswith("E "))
    best, score, why = candidates[0], 0, ""
    for candidate in candidates:
        parent = _first_parent(repo, candidate[0])
        shared_files = _changed(repo, candidate[0], parent) & files
        shared_words = words & _patch_words(repo, candidate[0], parent) if words else set()
        found = 2 * len(shared_files) + len(shared_words)
        if found > score:
            best, score = candidate, found
            why = (
                f"it changed {', '.join(sorted(shared_files)[:3])}"
                if shared_files
                else f"its patch has {', '.join(sorted(shared_words)[:3])}"
            )
    commit, subject, author, where = best
    who = named(repo, commit, subject, author)
    if score == 0:
        count = len(candidates)
        return f"nothing in the failure names a change; {count} merged or landed before it, the newest {who}"
    return f"it most likely clashes with {who}, which {where} ({why})"


def _since(repo: BaseRepo, base: str, tip: str) -> list[LogEntry]:
    """The newest ``MOST`` commits of ``base..tip`` along first parents (none when that
    cannot be read: a base not in the history here)."""
    try:
        return repo.history.first_parent_log(f"{base}..{tip}")[:MOST]
    except AgentgateError:
        return []


def _first_parent(repo: BaseRepo, commit: str) -> str:
    """What ``commit`` changed is read against: its first parent (for a merge, the tip it
    merged onto), or the empty tree ("" when it cannot be read)."""
    try:
        parents = repo.history.parents(commit)
    except AgentgateError:
        return ""
    return parents[0] if parents else repo.empty_tree()


def _changed(repo: BaseRepo, commit: str, parent: str) -> set[str]:
    """The paths ``commit`` changed against ``parent``."""
    try:
        return {change.path for change in repo.diff_tree(parent, commit)} if parent else set()
    except AgentgateError:
        return set()


def _words(lines: Iterable[str]) -> set[str]:
    return {w for line in lines for w in _WORD.findall(line) if w.lower() not in _COMMON}


def _patch_words(repo: BaseRepo, commit: str, parent: str) -> set[str]:
    """The words of the lines ``commit``'s patch against ``parent`` (for a merge, what it
    brought) added or removed, of its first 2,000 lines."""
    try:
        shown = repo.history.patch(parent, commit) if parent else ""
    except AgentgateError:
        return set()
    lines = shown.splitlines()[:2000]
    return _words(
        line[1:] for line in lines if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )
