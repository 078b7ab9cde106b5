"""The whole gate log of an attempt: each gate command's output, kept beside its record.

A record's message shows the part of the output that names the cause (pytest's failures and
short summary); what a person needs beyond that (a ``--showlocals`` dump, a long traceback,
the passing run before it) is here, whole up to ``sandbox.process.LOG_BYTES`` a command, and
past that its head and its end with the size left out said. It lies in git as a commit
whose files are the logs (git stores them compressed), named
``refs/agentgate/logs/<slug>/<n>`` beside the record ``refs/agentgate/attempts/<slug>/<n>``.
``agentgate show --log`` prints it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..git.repo import Author, BaseRepo

PREFIX = "refs/agentgate/logs/"
_ATTEMPTS = "refs/agentgate/attempts/"


def ref_for(record_ref: str) -> str:
    """``refs/agentgate/attempts/<slug>/<n>`` -> ``refs/agentgate/logs/<slug>/<n>``."""
    return PREFIX + record_ref.removeprefix(_ATTEMPTS)


def _name(number: int, command: str) -> str:
    """A log's file name: its order, and the command in a few plain words."""
    words = re.sub(r"[^A-Za-z0-9._-]+", "-", command).strip("-")[:60] or "command"
    return f"{number:02d}-{words}.log"


def write(
    repo: BaseRepo,
    record_ref: str,
    record_commit: str,
    logs: Sequence[tuple[str, str, int]],
    author: Author,
) -> str | None:
    """Keep ``logs`` beside the record (created once, by compare-and-swap); the log ref, or
    None when there was nothing to keep."""
    from ..git.repo import TreeEntry

    if not logs:
        return None
    entries = []
    for number, (command, text, size) in enumerate(logs, 1):
        head = f"$ {command}\n# {size} bytes printed\n\n"
        oid = repo.hash_blob((head + text).encode("utf-8", "backslashreplace"))
        entries.append(TreeEntry("100644", "blob", oid, _name(number, command)))
    tree = repo.mktree(entries)
    commit = repo.commit_tree(tree, [record_commit], "agentgate gate log\n", author)
    ref = ref_for(record_ref)
    repo.refs.update(ref, commit, None, "agentgate gate log")
    return ref


def read(repo: BaseRepo, record_ref: str) -> list[tuple[str, bytes]]:
    """The logs kept beside a record: (file name, bytes), in order; empty when none."""
    commit = repo.refs.value(ref_for(record_ref))
    if commit is None:
        return []
    found = []
    for entry in sorted(repo.ls_tree(commit), key=lambda e: e.path):
        data = repo.read_blob(entry.oid)
        if data is not None:
            found.append((entry.path, data))
    return found
