"""The subcommands that judge: ``land`` (a recorded attempt judged again and landed) and
``audit`` (the commits of a branch no passing gate judged)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, cast

from .common import Refused, UsageProblem, add_settings, open_repo, settings_of, target_branch

if TYPE_CHECKING:
    from ..engine import Engine
    from ..git.repo import BaseRepo
    from ..store.attempts import AttemptInfo
    from ..store.record import Landing
    from ..workspace.fork import Workspace


#: The settings ``land`` takes, as the plugin's of the same names.
LAND_SETTINGS = ("gate", "gate_exit_code", "gate_timeout", "sandbox", "land")


def add_judging_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The ``audit`` and ``land`` subcommands' arguments."""
    p = sub.add_parser(
        "audit", parents=[common], help="commits on a branch whose tree no passing gate judged"
    )
    p.add_argument("--target", help="the branch (default: the one checked out)")
    span = p.add_mutually_exclusive_group()
    span.add_argument(
        "--since", metavar="REV",
        help="only commits after REV (default: those after the base of the first recorded attempt)",
    )  # fmt: skip
    span.add_argument("--all", action="store_true", help="the branch's whole history")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser(
        "land", parents=[common],
        help="judge a recorded attempt again (gate, preflight, re-test) and promote it, "
        "without running its agent",
    )  # fmt: skip
    p.add_argument("attempt", help="the attempt (a ref, <slug>/<n>, a prefix, or its commit)")
    p.add_argument("--target", help="the branch to land on (default: the one checked out)")
    # The gate and where it runs, as the plugin's settings of the same names (``--land``
    # not given: as the attempt was to land, by its record).
    add_settings(
        p,
        *LAND_SETTINGS,
        notes={"land": "not given here: as the attempt was to land, by its record"},
    )
    p.add_argument("--dry-run", action="store_true", help="judge and report, but move nothing")
    p.set_defaults(func=cmd_land)


#: The checks whose verdict ``agentgate land`` can judge again, by exact name (a Python
#: check named ``gate_policy`` is not the gate): the gate's, its baseline's and the merge's.
LANDABLE = ("gate", "baseline", "retest", "preflight", "conflict")


def cmd_land(args: argparse.Namespace) -> int:
    """Judge a recorded attempt again and promote it: for one that failed through a flaky
    gate, or on a base that has since been fixed. Its change is merged onto the target as it
    is now and judged there (against the tip's own results, with the tip's harness, its own
    protection and limits), then moved by compare-and-swap, as in a run; the result is a
    new attempt record whose base is that tip."""
    import tempfile

    from ..engine import Engine
    from ..judge.gate import GateSpec
    from ..sandbox.containment import Settings
    from ..store.attempts import find

    chosen = settings_of(args, *LAND_SETTINGS)
    gate = chosen.of("gate")
    if not gate.get("commands"):
        raise UsageProblem("land needs a gate: --gate CMD or --gate-exit-code CMD")
    repo = open_repo(args)
    earlier = find(repo, args.attempt)
    check = earlier.check
    landable = check in LANDABLE or check.startswith(tuple(f"{c}: " for c in LANDABLE))
    if earlier.verdict in ("promoted", "passed") or not landable or earlier.record.graded_tree:
        raise Refused(
            f"{earlier.record_ref} ({earlier.verdict}, by {check or 'its test'!r}) is not one "
            "land judges again: land runs the gate, the harness, the protection and the "
            "limits, not the test body, its checks, its grading, its agent or its state; "
            "run its test again instead"
        )
    said = earlier.record
    landing = cast("Landing", gate.pop("landing", None) or said.landing)
    target = target_branch(repo, args)
    with tempfile.TemporaryDirectory(prefix="agentgate-land-") as workdir:
        engine = Engine.open(
            repo.worktree or repo.git_dir,
            target,
            # A dry run moves nothing either way; the real target is what it is judged on
            # (a dry run's engine would make a scratch ref of its own).
            promote=True,
            workdir=Path(workdir),
            gate=GateSpec(
                **gate,
                protect=said.protect,
                max_changed_lines=said.max_changed_lines,
                landing=landing,
            ),
            sandbox=Settings(**chosen.of("sandbox")),
        )
        try:
            ws = _onto_the_tip(engine, earlier)
            if args.dry_run:
                return _would_land(engine, ws, earlier, target, landing)
            attempt = engine.run_attempt(ws, task=earlier.task, agent=earlier.agent)
        finally:
            engine.close()
    verdict = attempt.verdict
    print(
        f"{earlier.record_ref} judged again: {verdict.status}"
        + (f": {verdict.reason}" if verdict.reason else "")
    )
    if attempt.record_ref:
        print(f"recorded as {attempt.record_ref}")
    if attempt.move is not None:
        print(f"{target}: {attempt.move.old[:12]} -> {attempt.move.new[:12]} ({attempt.move.kind})")
    return 0 if verdict.accepted else 1


def _onto_the_tip(engine: Engine, earlier: AttemptInfo) -> Workspace:
    """A workspace at the target's tip holding the earlier attempt's change merged onto it
    (a person's fix of the base since is kept); a conflict refuses, nothing written."""
    from ..engine.resume import ResumeSource
    from ..errors import MergeConflict

    ws = engine.fork(task=earlier.task)
    merged = engine.repo.merge_preview(ws.base, earlier.record_commit)
    if merged.conflicts:
        engine.release(ws)
        raise MergeConflict(list(merged.conflicts), "land")
    label = f"{earlier.record_ref} merged onto {ws.base[:12]}"
    engine.resume_into(
        ws, ResumeSource(ws.base, merged.tree, None, None, earlier.record_commit, label), "code"
    )
    return ws


def _would_land(
    engine: Engine, ws: Workspace, earlier: AttemptInfo, target: str | None, landing: str
) -> int:
    """``land --dry-run``: the gate's word and the merge preview, and nothing written (no
    record, no ref moved, no scratch ref; baselines are kept as any gate run keeps them)."""
    from ..engine.attempt import Attempt
    from ..git.repo import Author

    attempt = Attempt(task=earlier.task, agent=earlier.agent, workspace=ws)
    attempt.snapshot = engine.snapshot(ws)
    failed = next((c for c in engine.judge(attempt, engine.gate) if not c.ok), None)
    if failed is not None:
        print(f"{earlier.record_ref} would not land: {failed.message} ({failed.name})")
        return 1
    attempt.change_commit = engine.repo.commit_tree(
        attempt.snapshot.tree, [attempt.base], "agentgate: land --dry-run",
        Author.for_agent(earlier.agent),
    )  # fmt: skip
    tip = engine.target.tip()
    if tip is not None and tip != attempt.base:
        conflicts = engine.repo.merge_preview(tip, attempt.change_commit).conflicts
        if conflicts:
            shown = ", ".join(conflicts)
            print(f"{earlier.record_ref} would not land: merge conflicts in {shown}")
            return 1
    if tip == attempt.base:
        how = "a squash of its own" if landing == "squash" else "fast-forward"
    else:
        how = f"{landing}, then re-tested"
    where = target or engine.target.label
    print(f"{earlier.record_ref} would land on {where} ({how}); nothing was written")
    return 0


def _first_recorded_base(repo: BaseRepo, branch_ref: str) -> str | None:
    """The oldest commit of the branch's first-parent history that a recorded attempt was
    based on: where the plugin began to watch it (what came before, no gate judged)."""
    from ..store.attempts import list_attempts

    bases = {a.base for a in list_attempts(repo) if a.base}
    history = [e.commit for e in repo.history.first_parent_log(branch_ref)]
    oldest = [commit for commit in reversed(history) if commit in bases]
    return oldest[0] if oldest else None


def cmd_audit(args: argparse.Namespace) -> int:
    """List each commit on the target whose tree no passing gate judged; exit 1 if any.

    A tree counts as judged when an attempt record says it landed there (a fast-forward to
    the gated snapshot, or a merge whose record says its re-test passed), or it is such a
    tree again (a rollback restores one byte for byte). A person's push, a merge landed
    without a re-test, a move outside the plugin: each is listed.
    """
    from ..errors import AgentgateError
    from ..store.attempts import list_attempts

    repo = open_repo(args)
    branch = target_branch(repo, args)
    judged: set[str] = set()
    for attempt in list_attempts(repo):
        if attempt.verdict != "promoted" or not attempt.landed:
            continue
        try:
            landed_tree = repo.tree_of(attempt.landed)
            # A fast-forward landed the gated snapshot itself; a merge counts only when its
            # record says a re-test of exactly that tree passed (its own, or an early one
            # begun beside the gates); a merge of checks alone ran no gate on it.
            retested = attempt.record.retest in ("passed", "passed early")
            if landed_tree == repo.tree_of(attempt.record_commit) or retested:
                judged.add(landed_tree)
        except AgentgateError:  # a landed commit pruned or gone: nothing to count
            continue
    since = repo.history.resolve_commit(args.since, "--since") if args.since else None
    if since is None and not args.all:
        since = _first_recorded_base(repo, f"refs/heads/{branch}")
    span = f"{since}..refs/heads/{branch}" if since else f"refs/heads/{branch}"
    history = repo.history.first_parent_log(span)
    untested = [
        {"commit": e.commit, "tree": e.tree, "author": e.author, "subject": e.subject}
        for e in history
        if e.tree not in judged
    ]
    if args.json:
        print(json.dumps(untested, indent=2))
    else:
        for row in untested:
            print(
                f"{row['commit'][:12]}  {row['author']:<20}  {row['subject']}  (no passing gate record)"
            )
        total = len(history)
        print(
            f"{total - len(untested)} of {total} commits on {branch} have a tree a passing gate judged"
        )
    return 1 if untested else 0
