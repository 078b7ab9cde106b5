"""The tested bytes are the landed bytes: nothing a gate runs may change a tracked file of
the checkout its verdict is about.

A setup step (a version file written by setuptools-scm, a build) or a gate command runs the
attempt's code with the checkout writable, and could rewrite the very module it then tests:
the tests would pass on bytes that never land. So every tracked file's identity is taken
before the first command and compared after each one: its inode, size, mode and both times.
A write, a rename over it, a deletion or a link to it changes one of them, and the change
time cannot be set back by an unprivileged process, so a file changed and put back before
the command ended is still found. What is found rejects the attempt, naming the paths.
Untracked and ignored files (caches, a generated version file) are the command's to write.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

#: (inode, size, mode, modification time, change time), or None for a path not there.
Identity = tuple[int, int, int, int, int] | None


def identities(checkout: Path, paths: Iterable[str]) -> dict[str, Identity]:
    """Each tracked path's identity in ``checkout`` now (never following a link)."""
    root = os.fspath(checkout)
    found: dict[str, Identity] = {}
    for path in paths:
        try:
            st = os.lstat(os.path.join(root, path))
        except OSError:
            found[path] = None
            continue
        found[path] = (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
    return found


def changed(checkout: Path, before: Mapping[str, Identity]) -> list[str]:
    """The tracked paths whose identity is not what ``before`` held."""
    now = identities(checkout, list(before))
    return sorted(p for p, was in before.items() if now[p] != was)


def reason(paths: Sequence[str], what: str) -> str:
    """Why an attempt whose ``what`` changed ``paths`` cannot be judged on that run."""
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return (
        f"{what} changed tracked file(s) of the tree it judges: {shown} (tamper evidence: "
        "the bytes a gate tests must be the bytes that land; a step may write only what git "
        "ignores or the tree does not hold)"
    )
