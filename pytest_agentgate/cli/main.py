"""The ``agentgate`` command: read what agents did, undo what landed, keep things tidy.

``main(argv)`` parses with one argparse parser and dispatches to one function per
subcommand. Errors print one line naming the bad value and return non-zero (2 for usage).
Read-only subcommands (attempts, show, log) take no lock, unless an earlier run left a move
whose record it could not write: every subcommand that opens a repository settles those first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from .._constants import VERSION
from .common import (
    EXIT_REFUSED,
    EXIT_USAGE,
    Refused,
    UsageProblem,
    add_settings,
    author_of,
    expected_old,
    files_lagging,
    moved_branch,
    open_repo,
    records_ref,
    settings_of,
)
from .judging import add_judging_parsers

if TYPE_CHECKING:
    # Loaded when a subcommand runs, not to print --help.
    from ..maintenance.prune import PruneReport


def _duration(text: str) -> timedelta:
    match = re.fullmatch(r"(\d+)\s*([smhdw])", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit, like 30d, 12h, 2w"
        )
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[match[2]]
    return timedelta(**{unit: int(match[1])})


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


#: The settings ``revert`` takes to gate its result, as the plugin's of the same names.
REVERT_SETTINGS = ("gate", "gate_exit_code", "gate_timeout", "sandbox")
REMOTE_HELP = (
    "read the records on this remote's server (every machine's), fetched into this clone, "
    "instead of this clone's own"
)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--repo",
        default=".",
        help="the base repository (default: the one around the current directory)",
    )
    parser = argparse.ArgumentParser(
        prog="agentgate", description="Read, undo and tidy what gated agents did."
    )
    parser.add_argument("--version", action="version", version=f"agentgate {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_reading_parsers(sub, common)
    _add_moving_parsers(sub, common)
    _add_tidying_parsers(sub, common)
    add_judging_parsers(sub, common)
    p = sub.add_parser("demo", help="play the whole story in a throwaway repository")
    p.add_argument("--keep", type=Path, metavar="DIR", help="build the demo here and keep it")
    p.set_defaults(func=cmd_demo)
    return parser


def _add_reading_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The commands that only read: attempts, show, log."""
    p = sub.add_parser("attempts", parents=[common], help="list recorded attempts, newest first")
    p.add_argument("--task", help="only attempts whose task contains this text")
    p.add_argument("--agent", help="only this agent's attempts")
    p.add_argument("--verdict", choices=["promoted", "passed", "rejected", "conflict", "error"])
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--remote", metavar="NAME", help=REMOTE_HELP)
    p.set_defaults(func=cmd_attempts)

    p = sub.add_parser("show", parents=[common], help="an attempt's message, trailers and diff")
    p.add_argument("attempt", help="a ref, a unique prefix of <slug>/<n>, or a commit id")
    p.add_argument("--log", action="store_true", help="the whole output of each gate command")
    p.add_argument(
        "--transcript",
        action="store_true",
        help="the agent's whole transcript, as steps (a preset's stream or trajectory)",
    )
    p.add_argument("--remote", metavar="NAME", help=REMOTE_HELP)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("log", parents=[common], help="the operations log, newest first")
    p.add_argument("--agent", help="only this agent's operations")
    p.add_argument("--limit", type=_positive, default=None, help="at most N records")
    p.add_argument("--json", action="store_true", help="print JSON lines")
    p.add_argument(
        "--all", action="store_true",
        help="also the journal's lines (pending, pending-done) that settle a move's record",
    )  # fmt: skip
    p.set_defaults(func=cmd_log)

    p = sub.add_parser(
        "pending", parents=[common],
        help="moves whose record could not be completed: list them, retry, or set one aside",
    )  # fmt: skip
    what = p.add_mutually_exclusive_group()
    what.add_argument("--retry", action="store_true", help="try to complete every one again")
    what.add_argument(
        "--set-aside", metavar="ID",
        help="stop trying to complete this one (its line and data stay in the log)",
    )  # fmt: skip
    p.set_defaults(func=cmd_pending)


def _add_moving_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The commands that move a branch by hand: rollback, revert."""
    target_args = argparse.ArgumentParser(add_help=False)
    target_args.add_argument("--target", help="the branch (default: the one checked out)")
    target_args.add_argument("--expect", help="refuse unless the target is at this commit")
    target_args.add_argument("--agent", default="person", help="who is doing this (for the log)")
    target_args.add_argument(
        "--dry-run", action="store_true", help="say what would happen; change nothing"
    )
    target_args.add_argument(
        "--remote", metavar="NAME",
        help="move the branch on this remote's server (by its compare-and-swap), not here",
    )  # fmt: skip

    p = sub.add_parser(
        "rollback",
        parents=[common, target_args],
        help="a new commit whose tree is exactly REV's tree",
    )
    p.add_argument("--to", required=True, metavar="REV", help="the commit whose tree to restore")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser(
        "revert",
        parents=[common, target_args],
        help="undo one promoted attempt, keeping later ones",
    )
    p.add_argument("attempt", help="the promoted attempt to undo")
    add_settings(p, *REVERT_SETTINGS)  # gate the result, as the plugin's settings
    p.set_defaults(func=cmd_revert)


def _add_tidying_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The commands that remove or write files: prune, restore."""
    p = sub.add_parser("prune", parents=[common], help="remove old attempt refs, rotate the log")
    p.add_argument("--older-than", type=_duration, default=timedelta(days=30), metavar="AGE",
                   help="remove attempts older than this (default 30d)")  # fmt: skip
    p.add_argument("--keep-last", type=_positive, default=0, metavar="N",
                   help="always keep the newest N attempts")  # fmt: skip
    p.add_argument("--rotate-bytes", type=_positive, default=1 << 20, metavar="BYTES",
                   help="rotate the operations log when it is larger (default 1 MiB)")  # fmt: skip
    p.add_argument("--workspaces", type=Path, metavar="DIR",
                   help="also remove old run directories under this --agentgate-workdir")  # fmt: skip
    add_settings(p, "keep_runs")  # with --workspaces, as the plugin's setting
    p.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    p.add_argument("--agent", default="person", help="who is doing this (for the log)")
    p.add_argument(
        "--remote", metavar="NAME",
        help="prune the records on this remote's server (every machine's) by the same rules, "
        "keeping each task's highest number",
    )  # fmt: skip
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser(
        "restore", parents=[common],
        help="write an attempt's or a checkpoint's code (and its state) to a directory",
    )  # fmt: skip
    p.add_argument("attempt", help="the attempt or checkpoint (a ref, <slug>/<n>, or an id)")
    p.add_argument("--to", required=True, type=Path, metavar="DIR", help="where to write the files")
    p.add_argument(
        "--state", action="store_true", help="also write its declared state (state=[...])"
    )
    p.add_argument(
        "--state-root", type=Path, metavar="DIR",
        help="where state declared at absolute paths goes (default: DIR/.agentgate-state-root)",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="write over files that exist there")
    p.add_argument("--remote", metavar="NAME", help=REMOTE_HELP + " (an attempt, not a checkpoint)")
    p.set_defaults(func=cmd_restore)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    from ..errors import AgentgateError, ConfigError

    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (UsageProblem, ConfigError) as exc:
        print(f"agentgate {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (Refused, AgentgateError) as exc:
        print(f"agentgate {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except BrokenPipeError:
        return 0


def cmd_attempts(args: argparse.Namespace) -> int:
    from ..store.attempts import list_attempts
    from ..store.records import one_line

    repo = open_repo(args)
    rows = list_attempts(repo, records_ref(repo, args))
    if args.task:
        rows = [a for a in rows if args.task.lower() in a.task.lower()]
    if args.agent:
        rows = [a for a in rows if a.agent == args.agent]
    if args.verdict:
        rows = [a for a in rows if a.verdict == args.verdict]
    from ..store.undone import undone

    # A promotion stays one in its record; what undid it since is read from the moves.
    later = {} if args.remote else undone(repo, rows)
    if args.json:
        print(
            json.dumps(
                [{**a.as_dict(), "undone": later.get(a.record_ref, "")} for a in rows], indent=2
            )
        )
        return 0
    if not rows:
        filtered = args.task or args.agent or args.verdict
        print("no attempts match" if filtered else "no attempts recorded")
        return 0
    # What a record says is data, never terminal control: one line of printable text.
    table = [
        [
            one_line(v)
            for v in (
                a.record_ref[len("refs/agentgate/attempts/") :],
                f"{a.verdict} ({later[a.record_ref]})" if a.record_ref in later else a.verdict,
                a.agent, a.base[:12], a.record_commit[:12], a.date,
            )
        ]
        for a in rows
    ]  # fmt: skip
    heads = ["REF", "VERDICT", "AGENT", "BASE", "COMMIT", "DATE"]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(heads)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)) + "  TASK")
    for a, cells in zip(rows, table, strict=True):
        line = "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
        print(f"{line}  {one_line(a.task)}")
        folder = a.record.checkpoints or None
        if folder and not args.remote and re.fullmatch(r"[a-z0-9][a-z0-9-]*/[0-9a-f]{12}", folder):
            from ..store.checkpoints import PREFIX, read

            made = repo.refs.names(f"{PREFIX}{folder}/")
            for point_ref in sorted(made, key=lambda r: int(r.rsplit("/", 1)[1] or 0)):
                point = read(repo, point_ref)
                name = point_ref[len(PREFIX) :]
                print(f"  checkpoint {name:<42} {point.commit[:12]}  {point.message}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..store.attempts import find

    repo = open_repo(args)
    attempt = find(repo, args.attempt, records_ref(repo, args), readable=False)
    print(f"attempt {attempt.record_ref}" + (f" (on {args.remote})" if args.remote else ""))
    # Printable text and line breaks only: a record's message is data, never terminal control.
    if args.log or args.transcript:
        from ..store import logs

        kept = logs.read(repo, attempt.record_ref)
        transcripts = [(n, d) for n, d in kept if "-agent-transcript-" in n]
        if args.transcript:
            if not transcripts:
                raise Refused(f"{attempt.record_ref} has no agent transcript kept")
            kept = _rendered(transcripts)
        if not kept:
            raise Refused(f"{attempt.record_ref} has no gate log kept (no gate command ran)")
        for name, data in kept:
            text = data.decode("utf-8", "replace")
            sys.stdout.write(f"== {name}\n" + re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", "?", text))
            if not text.endswith("\n"):
                sys.stdout.write("\n")
        return 0
    shown = repo.history.show_commit(attempt.record_commit)
    sys.stdout.write(re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", "?", shown))
    return 0


def _rendered(transcripts: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Each kept transcript as a person reads it (its first line, the command, dropped)."""
    from ..agents.transcript import render

    out = []
    for name, data in transcripts:
        body = data.decode("utf-8", "replace").split("\n\n", 1)[-1]
        out.append((name, render(body).encode()))
    return out


def cmd_log(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..store import oplog

    records = list(oplog.read(open_repo(args).common_dir))
    if not args.all:  # the journal's own lines: how a move's record was settled, not a move
        records = [r for r in records if r.op not in oplog.JOURNAL_OPS]
    if args.agent:
        records = [r for r in records if r.agent == args.agent]
    records.reverse()
    if args.limit is not None:
        records = records[: args.limit]
    if args.json:
        for r in records:
            print(json.dumps(asdict(r), sort_keys=True))
        return 0
    if not records:
        filtered = args.agent or args.limit is not None
        print("no records match" if filtered else "the operations log is empty")
        return 0
    for r in records:
        old = (r.old or "-")[:12]
        new = (r.new or "-")[:12]
        print(
            f"{r.time}  {r.op:<12} {r.ref}  {old} -> {new}  agent={r.agent or '-'} "
            f"objects={r.objects} bytes={r.bytes} {r.duration_ms:.1f}ms"
            + (f"  [{r.note}]" if r.note else "")
            + (f"  {r.task}" if r.task else "")
        )
    return 0


def cmd_pending(args: argparse.Namespace) -> int:
    from ..git.repo import BaseRepo
    from ..store import oplog, pending
    from ..store.locks import ref_lock

    repo = BaseRepo.open(args.repo, "--repo", "with --repo PATH")
    lines = pending.open_lines(oplog.read(repo.common_dir))
    if args.set_aside:
        chosen = [line for line in lines if line.pending.startswith(args.set_aside)]
        if len(chosen) != 1:
            raise Refused(f"{args.set_aside!r} names {len(chosen)} open pending lines, not one")
        line = chosen[0]
        with ref_lock(repo, line.ref):
            oplog.append(
                repo.common_dir,
                oplog.OpRecord(
                    "pending-abandoned", line.ref, None, None, pending=line.pending,
                    note="set aside by agentgate pending",
                ),
            )  # fmt: skip
        print(f"set aside {line.pending} ({line.task}); its line stays in the log")
        return 0
    if args.retry:
        for ref in sorted({line.ref for line in lines}):
            with ref_lock(repo, ref):
                for note in pending.settle(repo, ref, retry=True):
                    print(f"agentgate: {note}", file=sys.stderr)
        lines = pending.open_lines(oplog.read(repo.common_dir))
    stuck = pending.stuck_lines(oplog.read(repo.common_dir))
    if not lines:
        print("no move is waiting for its record")
        return 0
    for line in lines:
        why = stuck.get(line.pending, "not settled yet")
        print(f"{line.pending}  {line.ref}  {(line.new or '-')[:12]}  {line.task}  [{why}]")
    return 1 if stuck else 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from ..land import promote

    repo = open_repo(args)
    branch, target = moved_branch(repo, args)
    to = repo.history.resolve_commit(args.to, "--to")
    expect = expected_old(repo, args)
    ref = f"refs/heads/{branch}"
    tip_tree = repo.tree_of(target.ref if target is not None else ref)
    if tip_tree == repo.tree_of(to):
        shown = target.label if target is not None else branch
        print(f"{shown} already holds the tree of {to[:12]} ({tip_tree}): nothing to do")
        return 0
    begin = time.perf_counter()
    move = promote.rollback(
        repo,
        ref,
        to,
        expect=expect,
        author=author_of(args.agent),
        agent=args.agent,
        dry_run=args.dry_run,
        target=target,
    )
    if target is not None:
        branch = target.label
    ms = (time.perf_counter() - begin) * 1000
    if args.dry_run:
        print(
            f"would roll {branch} back from {move.old[:12]} to the tree of {to[:12]} ({move.tree})"
        )
        return 0
    print(f"{branch}: {move.old[:12]} -> {move.new[:12]} (rollback to {to[:12]}, {ms:.0f} ms)")
    if move.problem:
        return files_lagging(args, move.problem)
    print(f"tree before rollback: {tip_tree}")
    print(f"tree of {to[:12]}:    {move.tree}")
    print(f"tree now:             {repo.tree_of(move.new)}")
    return 0


def cmd_revert(args: argparse.Namespace) -> int:
    import tempfile

    from ..judge.gate import GateSpec, Judging, run_commands
    from ..land import promote
    from ..store.attempts import find

    repo = open_repo(args)
    branch, target = moved_branch(repo, args)
    attempt = find(repo, args.attempt, records_ref(repo, args))
    if attempt.verdict != "promoted":
        raise Refused(
            f"{attempt.record_ref} was not promoted (verdict {attempt.verdict or 'unknown'}); "
            "only a promoted attempt can be reverted"
        )
    # (find has refused a record whose Base trailer is not its own parent.)
    landed_ref = target.ref if target is not None else f"refs/heads/{branch}"
    if not attempt.landed or not repo.history.is_ancestor(attempt.landed, landed_ref):
        raise Refused(
            f"{attempt.record_ref} did not land on {target.label if target else branch} "
            "(its Landed commit is not in that branch's history); nothing was changed"
        )
    expect = expected_old(repo, args)
    retest = None
    chosen = settings_of(args, *REVERT_SETTINGS)
    if chosen.of("gate").get("commands"):
        spec = GateSpec(**chosen.of("gate"))

        def retest(tree: str, tip: str) -> tuple[bool, str, str]:
            from ..judge.gate import GateContext
            from ..sandbox.containment import Settings, resolve

            contained = resolve(Settings(**chosen.of("sandbox"))).with_hidden(
                *(p for p in (repo.worktree, repo.git_dir, repo.common_dir) if p is not None)
            )
            with tempfile.TemporaryDirectory(prefix="agentgate-revert-") as tmp:
                context = GateContext(Path(tmp), contained)
                result = run_commands(repo, tree, spec, context, Judging("revert"))
            return result.ok, result.message, result.output

    from ..errors import GateFailed

    try:
        undo = promote.Undo(
            attempt.record_commit, attempt.base, args.agent, f"revert {attempt.task}"
        )
        move = promote.revert(
            repo,
            f"refs/heads/{branch}",
            undo,
            expect=expect,
            author=author_of(args.agent),
            retest=retest,
            dry_run=args.dry_run,
            target=target,
        )
    except GateFailed as failed:
        print(
            f"agentgate revert: the gate rejected the reverted tree ({failed.reason}); "
            "nothing was changed" + (f"\n{failed.output}" if failed.output else ""),
            file=sys.stderr,
        )
        return 1
    if target is not None:
        branch = target.label
    if args.gate:
        print(f"gate on the reverted tree: passed ({len(args.gate)} command(s))")
    if args.dry_run:
        print(
            f"would revert {attempt.record_ref} on {branch} ({move.old[:12]}), giving tree {move.tree}"
        )
    else:
        print(f"{branch}: {move.old[:12]} -> {move.new[:12]} (reverted {attempt.record_ref})")
        if move.problem:
            return files_lagging(args, move.problem)
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from ..maintenance import prune

    keep_runs = settings_of(args, "keep_runs").value("keep_runs")
    if args.keep_runs is not None and args.workspaces is None:
        raise UsageProblem("--keep-runs needs --workspaces DIR (the --agentgate-workdir to tidy)")
    repo = open_repo(args)
    cutoff = datetime.now(UTC) - args.older_than
    if args.remote:
        from ..remote.server_records import for_remote

        report = prune.prune_remote(
            repo,
            for_remote(repo, args.remote),
            cutoff=cutoff,
            keep_last=args.keep_last,
            dry_run=args.dry_run,
            agent=args.agent,
        )
        verb = _print_pruned(report, args.dry_run, f" on {args.remote}")
        for ref in report.leftovers:
            print(f"{verb} {ref} on {args.remote} (the shared queue's, older than the cutoff)")
        return 0
    report = prune.prune(
        repo,
        cutoff=cutoff,
        keep_last=args.keep_last,
        rotate_bytes=args.rotate_bytes,
        workspaces=args.workspaces,
        keep_runs=keep_runs,
        dry_run=args.dry_run,
        agent=args.agent,
    )
    verb = _print_pruned(report, args.dry_run, "")
    for ref in report.scratch:
        print(f"{verb} {ref} (an old dry run's scratch ref)")
    for path in report.workspaces:
        print(f"{verb} workspace run {path}")
    if report.rotated:
        print(
            f"{'would rotate' if args.dry_run else 'rotated'} the operations log to {report.rotated}"
        )
    return 0


def _print_pruned(report: PruneReport, dry_run: bool, where: str) -> str:
    """What prune removed and kept (``where``: on which server, or here); its verb."""
    verb = "would remove" if dry_run else "removed"
    for ref in report.removed:
        print(f"{verb} {ref}{where}")
    for ref, why in report.kept_landed:
        print(f"kept {ref}{where} ({why})")
    print(f"{verb} {len(report.removed)} attempt(s){where}; kept {report.kept} attempt(s)")
    return verb


def _real_state_root(root: Path) -> Path:
    """``root``, unless it is reached through a link (the state must go nowhere else)."""
    if os.path.realpath(root) != os.path.normpath(root):
        raise Refused(
            f"the state root {str(root)!r} is reached through a symbolic link: nothing of the "
            "state was written; choose another --state-root"
        )
    return root


def cmd_restore(args: argparse.Namespace) -> int:
    """Write an attempt's or a checkpoint's code (and with ``--state`` its declared state)
    into a directory, for a person to inspect or to start from."""
    import tempfile

    from ..errors import AgentgateError
    from ..store import checkpoints
    from ..store.attempts import find
    from ..workspace import state

    repo = open_repo(args)
    try:
        if args.remote:
            raise AgentgateError("a server's attempt, not a checkpoint here")
        point = checkpoints.read(repo, args.attempt)
        tree, commit, what = point.code_tree, point.state, f"checkpoint {point.commit[:12]}"
    except AgentgateError:
        attempt = find(repo, args.attempt, records_ref(repo, args, with_state=args.state))
        tree, commit = repo.tree_of(attempt.record_commit), attempt.record.state
        what = attempt.record_ref + (f" (on {args.remote})" if args.remote else "")
        if args.state and commit and not repo.has_object(commit):
            raise Refused(
                f"{what} carries state, but its state is not on {args.remote}: its run "
                "pushed no state (--agentgate-push-state)"
            ) from None
    if args.state and not commit:
        raise Refused(f"{what} carries no state (its test declared no state=[...])")
    dest = args.to.resolve()
    if dest.exists() and not dest.is_dir():
        raise Refused(f"--to {str(args.to)!r} is a file, not a directory")
    if dest.is_dir() and any(dest.iterdir()) and not args.force:
        raise Refused(
            f"--to {str(args.to)!r} is not empty: nothing was written (--force writes over "
            "the files there)"
        )
    if args.state and args.state_root is not None:
        _real_state_root(Path(os.path.abspath(args.state_root)))  # before anything is written
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentgate-restore-") as tmp:
        index = repo.index(Path(tmp), Path(tmp) / "index")
        index.read_tree(tree)
        index.check_out_all(dest)
    print(f"restored the code of {what} to {args.to}")
    if args.state and commit:
        # State declared outside the workspace goes under --state-root: never to its real
        # absolute path unless that is asked for (--state-root /).
        # Checked again now: the code just written may hold a link by the default's name.
        root = _real_state_root(
            Path(os.path.abspath(args.state_root or args.to / ".agentgate-state-root"))
        )
        names = state.restore(repo, commit, dest, overwrite=args.force, outside_root=root)
        for name in names:
            shown = (
                root / name[len(state.ABS) + 1 :]
                if name.startswith(f"{state.ABS}/")
                else args.to / name
            )
            print(f"restored {shown}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.keep)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
