"""The checks a leader runs itself on another machine's posted attempt.

A posted attempt says which test made it; when this run has that test, its Python checks
(``checks=[...]`` on the marker) run here on the posted tree, in a checkout of its own, as
they would have on the poster's machine: a post cannot skip them by being made elsewhere.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from .judge.gate import Check, run_check
from .sandbox.removal import remove_tree
from .workspace.fork import checkout_tree

if TYPE_CHECKING:
    from .git.repo import BaseRepo
    from .workspace.fork import Snapshot, Workspace


class _Checkout:
    """What a check reads of an attempt's workspace: its files and its base."""

    def __init__(self, path: Path, base: str) -> None:
        self.path, self.base = path, base


def posted_checks(
    repo: BaseRepo, snap: Snapshot, test: str, checks: Sequence[Check], root: Path
) -> str | None:
    """Why the posted attempt ``snap`` fails one of its test's ``checks`` (None: it passes
    them all, or this run has none of that test)."""
    if not checks:
        return None
    from .attempt import Attempt

    where = checkout_tree(repo, snap.tree, root, name=f"posted-{secrets.token_hex(8)}")
    try:
        workspace = cast("Workspace", _Checkout(where, snap.base))
        attempt = Attempt(task="", agent="", workspace=workspace, test=test, snapshot=snap)
        for check in checks:
            found = run_check(check, attempt)
            if not found.ok:
                return f"its test's check {found.name} failed here: {found.message}"
    finally:
        remove_tree(where)
    return None
