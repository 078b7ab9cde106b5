"""What a try starts from: a checkpoint's or a recorded attempt's code, state and agent git
state written into a workspace, and the declared state outside the workspace held, captured
and put back around a gated test."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, RevisionNotFound
from ..git.repo import Author, BaseRepo
from ..store import attempts, checkpoints, locks, records
from ..workspace import fork
from ..workspace import state as state_module
from ..workspace.fork import Workspace


@dataclass(frozen=True)
class ResumeSource:
    """What a try can start from: a checkpoint's or a recorded attempt's code, state and
    agent git state, and the base it was made on (protection and baseline stay that one's)."""

    base: str
    code_tree: str
    state: str | None
    agent_git: str | None
    commit: str
    label: str


#: What ``resume_from`` names for the newest earlier attempt at the same task.
LATEST = "latest"


def source_of(repo: BaseRepo, spec: str) -> ResumeSource:
    """What a checkpoint or a recorded attempt (a ref or an id) can resume from."""
    try:
        point = checkpoints.read(repo, spec)
    except (checkpoints.CheckpointError, RevisionNotFound):
        point = None
    if point is not None:
        return ResumeSource(
            repo.history.resolve_commit(f"{point.commit}^1"),  # the base it was made on
            point.code_tree,
            point.state,
            point.agent_git,
            point.commit,
            f"the checkpoint {point.commit[:12]} ({point.message})",
        )
    return _of_attempt(repo, attempts.find(repo, spec))


def _of_attempt(repo: BaseRepo, found: attempts.AttemptInfo) -> ResumeSource:
    """What a recorded attempt (read as readable) can resume from."""
    return ResumeSource(
        found.base,
        repo.tree_of(found.record_commit),
        found.record.state,
        None,
        found.record_commit,
        f"the attempt {found.record_ref}",
    )


def write_into(repo: BaseRepo, ws: Workspace, source: ResumeSource | None, mode: str) -> str:
    """Write ``source`` into ``ws`` (fresh at its base) as ``mode`` says; None: the base.

    The state outside the workspace goes back to what it held before the test unless
    ``full`` brings the source's; the workspace keeps its base whatever is resumed.
    """
    full = mode == "full" and source is not None and source.state is not None
    state_module.put_back(repo, None if full else ws.state_base, ws.state_declared)
    ws.resumed_from = None
    if source is None or mode == "restart":
        return "a fresh workspace at the base, with the base state"
    repo.index(ws.path, ws.index).merge_trees(ws.base, source.code_tree)
    ws.index_written = time.time()
    ws.index_tree = None  # what the merge left: the index's to say
    ws.resumed_from = source.commit
    said = source.label
    if full and source.state is not None:
        state_module.restore(
            repo, source.state, ws.path, overwrite=True, declared=ws.state_declared
        )
        said += ", its state"
    else:
        said += ", with the base state"
    if mode == "full" and source.agent_git:
        fork.restore_agent_git(repo, source.agent_git, ws.path)
        said += " and the agent's git state"
    return said


@contextlib.contextmanager
def state_held(
    repo: BaseRepo, ws: Workspace, declared: Sequence[str], exclude: Sequence[str]
) -> Iterator[None]:
    """For one gated test: lock each declared state path outside the workspace (across
    processes and xdist workers), capture what it holds before the first try, and bind
    it into the agent's sandbox. The caller puts it back afterwards unless the test's attempt
    was promoted (:func:`pytest_agentgate.workspace.state.put_back`)."""
    declared = [state_module.normalise(p) for p in declared]
    outside = sorted({p for p in declared if p.startswith("/")})
    ws.state_declared = tuple(declared)
    with contextlib.ExitStack() as held:
        for path in outside:
            digest = hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()
            held.enter_context(locks.ref_lock(repo, f"state/{digest[:24]}"))
        _check_declared(declared, outside)
        for path in outside:
            found = state_module.not_exactly_capturable(path, exclude)
            if found is not None:
                raise ConfigError(
                    f"state path {path!r} cannot be put back exactly after a rejected "
                    f"attempt: {found[0]} {found[1]}",
                    source="state",
                )
        ws.state_binds = tuple(Path(p) for p in outside)
        ws.state_base = (
            state_module.capture(
                repo,
                ws.path,
                outside,
                message=records.state_message(ws.task or "base state"),
                author=Author.for_agent(ws.agent),
                keep=state_module.Keep(exclude),
            )
            if outside
            else None
        )
        yield


def _check_declared(declared: Sequence[str], outside: Sequence[str]) -> None:
    """Refuse declared state that could not be put back exactly: a path reached through a
    link, two paths one inside the other, a path outside the workspace that is not there."""
    for path in outside:
        real = os.path.realpath(path)
        if real != os.path.normpath(path):
            raise ConfigError(
                f"state path {path!r} is reached through a symbolic link: declare "
                f"the real path {real!r} (a link's target is not put back)",
                source="state",
            )
    overlap = state_module.overlapping(declared)
    if overlap:
        raise ConfigError(
            f"state paths {overlap[0]!r} and {overlap[1]!r} overlap: declare the outer one alone",
            source="state",
        )
    missing = [p for p in outside if not os.path.lexists(p)]
    if missing:
        raise ConfigError(
            f"state path {missing[0]!r} does not exist: create it (the file, or an "
            "empty directory) before the run, so it can be bound into the sandbox",
            source="state",
        )


def latest_of(repo: BaseRepo, task: str) -> ResumeSource | None:
    """What the newest earlier attempt at ``task`` can resume from; None when there is none
    (a task's first run) or when it landed (what it did is on the target: the task starts
    again from there, never from an older attempt it went past)."""
    slug, one_line = attempts.slugify(task), records.one_line(task)
    for earlier in attempts.list_attempts(repo):
        # The same slug may name another task ("Fix it!", "fix it"): its record says (as
        # one line: a task's line breaks are spaces in its record).
        if earlier.record_ref.split("/")[3] == slug and earlier.record.task == one_line:
            landed = earlier.verdict == "promoted"
            return None if landed else _of_attempt(repo, attempts.check_readable(repo, earlier))
    return None
