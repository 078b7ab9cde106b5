"""A try's workspace and its state: a checkpoint of where the task stands, the declared state
an attempt leaves captured, and what the next try starts from.

Functions over the engine's parts; :class:`~.story.Engine` names them as its methods."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ..git.repo import Author, BaseRepo
from ..store import attempts, checkpoints, records
from ..workspace import recycle as recycling
from ..workspace import state as state_module
from ..workspace.fork import Workspace
from ..workspace.snapshot import Snapshot
from . import resume
from .attempt import Attempt
from .settings import EngineSettings


def capture_state(
    repo: BaseRepo, settings: EngineSettings, attempt: Attempt, paths: Sequence[str]
) -> str | None:
    """Commit the declared state the agent left into ``attempt.state``; say what failed."""
    try:
        attempt.state = state_module.capture(
            repo,
            attempt.path,
            paths,
            message=records.state_message(attempt.task),
            author=Author.for_agent(attempt.agent),
            parent=attempt.resumed_from,
            keep=state_module.Keep(settings.exclude, settings.max_state_bytes),
            skipped=attempt.state_excluded,
        )
    except state_module.StateTooLarge as exc:
        attempt.state_refused = str(exc)
        return None
    except (state_module.StateError, OSError, sqlite3.Error) as exc:
        return f"state could not be captured: {exc}"
    return None


def prepare_retry(repo: BaseRepo, target_ref: str, ws: Workspace, mode: str, last: Attempt) -> str:
    """Bring ``ws`` back for another try at its task after ``last`` was not accepted, and
    say what the try starts from.

    The workspace keeps its base (but after a conflict, a try that starts afresh starts on
    the target's tip): protection, the harness, the limits and the baseline
    stay those of the original base whatever a retry resumes, so an earlier try's edit
    to a protected file is judged again, never taken for the base. ``restart``: the base
    code (and the base state); ``code``: the code of the last checkpoint (else of the
    last try's snapshot) over the base, the agent's own git still at the base (it sees
    the earlier work as changes); ``full``: that code, its declared state and the
    agent's git state.
    """
    made = list(ws.checkpoints)
    if made:
        source: resume.ResumeSource | None = resume.source_of(repo, made[-1])
    elif last.snapshot is not None:
        source = resume.ResumeSource(
            ws.base,
            last.snapshot.tree,
            last.state,
            None,
            last.record_commit or last.change_commit or last.snapshot.tree,
            "the last try's snapshot (it made no checkpoint)",
        )
    else:
        source = None
    conflicted = last.verdict is not None and last.verdict.status == "conflict"
    tip = repo.refs.value(target_ref) if conflicted else None
    if tip is not None and (mode == "restart" or source is None):
        # From the same base the try would meet the same conflict: it starts on the tip.
        recycling.recycle(ws, tip)
        ws.new_try()
        resume.write_into(repo, ws, None, mode)
        return f"a fresh workspace at the target's tip {tip[:12]} (the last try conflicted)"
    recycling.recycle(ws, ws.base)
    ws.new_try()
    if mode == "restart" or source is None:
        resume.write_into(repo, ws, None, mode)
        if source is None and mode != "restart":
            return f"a fresh workspace at the base (the last try left no snapshot to {mode!r} from)"
        return "a fresh workspace at the base, with the base state"
    return resume.write_into(repo, ws, source, mode)


def checkpoint(
    repo: BaseRepo, settings: EngineSettings, ws: Workspace, message: str, snap: Snapshot
) -> str:
    """Record ``ws``'s code (``snap``), declared state and agent git state (see
    :mod:`..store.checkpoints`)."""
    author = Author.for_agent(ws.agent)
    state = (
        state_module.capture(
            repo,
            ws.path,
            ws.state_declared,
            message=records.state_message(ws.task),
            author=author,
            keep=state_module.Keep(settings.exclude),
        )
        if ws.state_declared
        else None
    )
    point = checkpoints.write(
        repo,
        slug=attempts.slugify(ws.task or "task"),
        try_id=ws.try_id,
        base=ws.base,
        contents=checkpoints.Contents(
            snap.tree,
            state,
            checkpoints.capture_agent_git(
                repo,
                ws.path,
                author,
                max_files=settings.max_files,
                max_bytes=settings.max_bytes,
            ),
        ),
        message=message,
        author=author,
    )
    ws.checkpoints.append(point.ref)
    return point.commit
