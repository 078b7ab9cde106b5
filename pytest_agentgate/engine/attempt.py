"""One agent task's attempt, as the lifecycle fills it in (the engine's result type).

An attempt has three names people confuse, so each says what it is:

- ``change_commit``: the clean commit of the agent's tree on its base, the one that lands
  (fast-forwarded, or merged onto a moved target);
- ``record_commit``: the readable record of the attempt (the same tree, with the verdict,
  the failing output and trailers in its message), never part of the target's history;
- ``record_ref``: ``refs/agentgate/attempts/<slug>/<n>``, which points at the record.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..git.repo import MergePreview
from ..judge.gate import Check, CheckResult, Verdict, run_check
from ..land.promote import Move
from ..sandbox.removal import remove_tree
from ..store.record import Landing
from ..workspace.fork import Workspace, checkout_tree
from ..workspace.snapshot import Snapshot

if TYPE_CHECKING:
    from ..git.repo import BaseRepo


@dataclass
class Attempt:
    """One agent task's attempt, filled in as the lifecycle goes."""

    task: str
    agent: str
    workspace: Workspace
    test: str = ""
    snapshot: Snapshot | None = None
    #: The clean commit that would land (its tree is the snapshot's, its parent the base).
    change_commit: str | None = None
    checks: list[CheckResult] = field(default_factory=list)
    preview: MergePreview | None = None
    target_before: str | None = None
    move: Move | None = None
    verdict: Verdict = field(default_factory=lambda: Verdict("error", "not judged yet"))
    #: ``refs/agentgate/attempts/<slug>/<n>``, once recorded.
    record_ref: str | None = None
    #: The record commit that ``record_ref`` points to.
    record_commit: str | None = None
    retest_skipped: bool = False
    #: Set when the target was found moved by something other than the plugin.
    external_move: str | None = None
    #: The commit holding the declared state outside git (``state=``), if any was captured.
    state: str | None = None
    #: What this attempt's workspace was resumed from: a checkpoint or a record
    #: (``resume_from``, a retry's ``resume=``), or None.
    resumed_from: str | None = None
    #: Names this attempt in its record and in a pending move's log line.
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: Set when the record could not be written (it is completed by the next run).
    record_problem: str | None = None
    #: Declared state paths left out of the capture because they look like secrets.
    state_excluded: list[str] = field(default_factory=list)
    #: Other machines' attempts this attempt's process landed as their queue's leader.
    landed_for_others: list[dict[str, str]] = field(default_factory=list)
    #: The containment the attempt's commands ran in: ``bwrap`` or ``none (why)``.
    sandbox: str = ""
    #: Per-test counts against the base (passed, failed, skipped, new, lost, with the ids).
    results: dict[str, object] | None = None
    #: For a graded task: the tree that was graded (and lands, on FULL), and the results of
    #: the graded tests on the base with the graded files (what a re-test is held to).
    graded_tree: str | None = None
    graded_baseline: dict[str, str] | None = None
    #: The batch the attempt landed in (``<id> (<k> of <n>)``), when it shared a re-test.
    batch: str = ""
    #: When its own gate began (seconds since the epoch; 0: not announced to the queue).
    gate_began: float = 0.0
    #: Which attempts may share its re-test (see ``Engine._batch_key``), once known.
    batch_key: str = ""
    #: Which try within its test this was (1-based; see ``retries=`` on the marker).
    try_number: int = 1
    #: The step of the lifecycle under way (what an interrupted attempt's record names).
    step: str = "snapshot"
    #: Why its declared state was not captured (too large), when it was not.
    state_refused: str = ""
    #: The test's own rules it was judged by beyond the run's (``protect=`` globs and
    #: ``max_changed_lines``), kept in its record so ``agentgate land`` holds it to them.
    protect: tuple[str, ...] = ()
    #: How it lands when it passes: merge, squash or rebase (``--agentgate-land``).
    landing: Landing = "merge"
    max_changed_lines: int | None = None
    #: The refs of the checkpoints the try made, in order.
    checkpoints: list[str] = field(default_factory=list)
    #: What the agent noted of this try (``agent_workspace.note``).
    notes: dict[str, object] = field(default_factory=dict)
    #: Each budgeted field: [used over the test's tries so far, the limit].
    budget: dict[str, list[float]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    #: Each gate command's output as kept: (the command, the text, its size in bytes).
    logs: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.workspace.path

    @property
    def base(self) -> str:
        return self.workspace.base

    @property
    def changed_paths(self) -> tuple[str, ...]:
        return self.snapshot.changed_paths if self.snapshot else ()

    def as_dict(self) -> dict[str, object]:
        """The report row (the JSON report, junit properties): stable keys users parse."""
        return {
            "uid": self.uid,
            "task": self.task,
            "agent": self.agent,
            "test": self.test,
            "verdict": self.verdict.status,
            "reason": self.verdict.reason,
            "check": self.verdict.check,
            "base": self.base,
            "attempt_ref": self.record_ref,
            "attempt_commit": self.record_commit,
            "tree": self.snapshot.tree if self.snapshot else None,
            "target_old": self.move.old if self.move else self.target_before,
            "target_new": self.move.new if self.move else self.target_before,
            "promotion": self.move.kind if self.move else None,
            "retested": bool(self.move and self.move.retested),
            "retest_skipped": self.retest_skipped,
            "external_move": self.external_move,
            "state": self.state,
            "resumed_from": self.resumed_from,
            "try": self.try_number,
            "checkpoints": list(self.checkpoints),
            "notes": dict(self.notes),
            "budget": {k: list(v) for k, v in self.budget.items()},
            "sandbox": self.sandbox,
            "refused": list(self.workspace.refused),
            "results": self.results,
            "batch": self.batch,
            "record_problem": self.record_problem,
            "landed_for_others": list(self.landed_for_others),
            "changed_paths": list(self.changed_paths),
            "timings_ms": {k: round(v, 3) for k, v in self.timings.items()},
        }


# -- another machine's posted attempt, checked here ------------------------------------


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
    where = checkout_tree(repo, snap.tree, root, name=f"posted-{secrets.token_hex(8)}")
    try:
        workspace = cast(Workspace, _Checkout(where, snap.base))
        attempt = Attempt(task="", agent="", workspace=workspace, test=test, snapshot=snap)
        for check in checks:
            found = run_check(check, attempt)
            if not found.ok:
                return f"its test's check {found.name} failed here: {found.message}"
    finally:
        remove_tree(where)
    return None
