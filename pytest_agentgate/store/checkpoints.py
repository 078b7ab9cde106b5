"""Checkpoints: what an agent had at one step of its task, kept so a later try can resume.

``agent_workspace.checkpoint("migrated the schema")`` records three things as one commit under
``refs/agentgate/checkpoints/<slug>/<try>/<k>``:

- the code (the commit's tree: a snapshot, as an attempt's, so ``git show`` reads the step);
- the declared state (a state commit, see :mod:`.state`), as a second parent;
- the agent's own git state: every file of its ``.git`` (its index, ``HEAD``, its commits,
  an unresolved merge's ``MERGE_HEAD``), read as files into a tree under ``git/``, as a
  third parent. The plugin never runs git with that directory, nor reads its config: it is
  copied byte for byte, and written back the same way.

``<try>`` names one try of one test (the attempt number is only claimed when the try is
recorded, after its body): the try's record names it in ``Agentgate-Checkpoints``.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import AgentgateError
from ..git import objects, trees
from ..git import runner as _git
from ..git.index import IndexEntry
from ..git.repo import Author, BaseRepo
from .records import one_line, parse_trailers

PREFIX = "refs/agentgate/checkpoints/"
_STATE, _GIT, _OF = "Agentgate-State", "Agentgate-Agent-Git", "Agentgate-Checkpoint-Of"


class CheckpointError(AgentgateError):
    """A checkpoint that cannot be written or read back, and why."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"checkpoint {what}: {reason}")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as read back: its commit, code tree, state and agent git commits."""

    commit: str
    ref: str
    code_tree: str
    state: str | None
    agent_git: str | None
    message: str


def capture_agent_git(
    repo: BaseRepo,
    workspace: Path,
    author: Author,
    *,
    max_files: int | None = None,
    max_bytes: int | None = None,
) -> str | None:
    """A commit whose tree holds every file of the agent's ``.git`` under ``git/``; links
    are kept as links, never followed; None when there is no ``.git``. More files or bytes
    than the limits (the run's ``--agentgate-max-files`` and ``--agentgate-max-bytes``):
    :class:`CheckpointError`, and nothing is stored."""
    root = workspace / ".git"
    if root.is_symlink() or not root.is_dir():
        return None
    found: list[tuple[str, str, Path]] = []
    sizes: dict[str, int] = {}  # by the path inside .git
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted(filenames) + [d for d in dirnames if (here / d).is_symlink()]:
            path = here / name
            info = path.lstat()
            rel = "git/" + str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                found.append(("120000", rel, path))
            elif stat.S_ISREG(info.st_mode):
                found.append(("100755" if info.st_mode & stat.S_IXUSR else "100644", rel, path))
            else:
                continue
            sizes[rel[4:]] = info.st_size
        dirnames[:] = sorted(d for d in dirnames if not (here / d).is_symlink())
    files = [f for f in found if f[0] != "120000"]
    size = sum(sizes[rel[4:]] for _, rel, _ in files)
    if max_files is not None and len(found) > max_files:
        raise CheckpointError(
            "of the agent's .git", f"{len(found):,} files, more than {max_files:,}"
        )
    if max_bytes is not None and size > max_bytes:
        raise CheckpointError("of the agent's .git", f"{size:,} bytes, more than {max_bytes:,}")
    written = _tree_here(repo, root, found, sizes, size)
    if written is not None:
        return repo.commit_tree(written, [], "agentgate: the agent's git state\n", author)
    # ``--stdin-paths`` takes a path a line: a name with a newline is hashed from its bytes.
    listed = [p for *_, p in files if "\n" not in str(p)]
    oids = dict(zip(map(str, listed), repo.hash_files(listed), strict=True))
    oids.update({str(p): repo.hash_blob(p.read_bytes()) for *_, p in files if str(p) not in oids})
    entries = [
        IndexEntry(
            mode,
            repo.hash_blob(os.readlink(path).encode("utf-8", "surrogateescape"))
            if mode == "120000"
            else oids[str(path)],
            rel,
        )
        for mode, rel, path in found
    ]
    with tempfile.TemporaryDirectory(prefix="agentgate-checkpoint-") as tmp:
        index = repo.index(None, Path(tmp) / "index")
        index.stage_entries(entries)
        tree = index.write_tree()
    return repo.commit_tree(tree, [], "agentgate: the agent's git state\n", author)


def _tree_here(
    repo: BaseRepo,
    root: Path,
    found: list[tuple[str, str, Path]],
    sizes: dict[str, int],
    size: int,
) -> str | None:
    """The tree of the agent's ``.git`` written by the plugin, the objects ``hash-object
    --no-filters`` and ``write-tree`` would write, three git processes less; None when it
    is git's to write: more than :data:`~pytest_agentgate.git.trees.MAX_BYTES`, a name git
    guards, a setting that changes how git writes objects (a group's permissions, syncing),
    or a file that changes while it is read (git reads it then)."""
    if (
        size > trees.MAX_BYTES
        or not all(trees.plain_name(inside) for inside in sizes)
        or not objects.writes_itself(repo.common_dir, _git.sysconfdir())  # a group's modes
    ):
        return None
    blobs = repo.blobs_here(root, sizes)
    if blobs is None or any(blobs[rel[4:]][0] != mode for mode, rel, _ in found):
        return None
    return repo.edited_tree(None, {rel: blobs[rel[4:]] for _, rel, _ in found})


@dataclass(frozen=True)
class Contents:
    """What one checkpoint holds: the code's tree, and the commits of the declared state
    and of the agent's ``.git`` (None: none)."""

    code_tree: str
    state: str | None = None
    agent_git: str | None = None


def write(
    repo: BaseRepo,
    *,
    slug: str,
    try_id: str,
    base: str,
    contents: Contents,
    message: str,
    author: Author,
) -> Checkpoint:
    """Record one checkpoint as the next ``<k>`` of its try (by compare-and-swap)."""
    code_tree, state, agent_git = contents.code_tree, contents.state, contents.agent_git
    # One line, whatever the message holds: a line of its own could pass for a trailer.
    text = one_line(message)[:200] or "checkpoint"
    trailers = [
        f"{_OF}: {try_id}",
        f"{_STATE}: {state}" if state else "",
        f"{_GIT}: {agent_git}" if agent_git else "",
    ]
    body = f"agentgate: checkpoint: {text}\n\n" + "".join(f"{t}\n" for t in trailers if t)
    parents = [base, *(c for c in (state, agent_git) if c)]
    commit = repo.commit_tree(code_tree, parents, body, author)
    folder = f"{PREFIX}{slug}/{try_id}/"
    for k in range(len(repo.refs.names(folder)) + 1, 10_000):
        ref = f"{folder}{k}"
        if repo.refs.update(ref, commit, None, "agentgate checkpoint"):
            return Checkpoint(commit, ref, code_tree, state, agent_git, text)
    raise CheckpointError(folder, "no free number")


def read(repo: BaseRepo, spec: str) -> Checkpoint:
    """A checkpoint by its ref or its commit id; :class:`CheckpointError` when it is none."""
    commit = repo.history.resolve_commit(spec)
    for ref, oid, contents in repo.refs.records(PREFIX, ["refname", "objectname", "contents"]):
        if oid != commit:
            continue
        first = contents.splitlines()[0] if contents else ""
        # Only the plugin's own trailer block counts, and only for commits it made parents
        # of the checkpoint: a value anywhere else is text, not a state to restore.
        fields = parse_trailers(contents)
        parents = set(repo.history.parents(commit)[1:])
        state, agent_git = fields.get("State"), fields.get("Agent-Git")
        if (state and state not in parents) or (agent_git and agent_git not in parents):
            raise CheckpointError(ref, "its trailers name commits that are not its parents")
        return Checkpoint(
            commit,
            ref,
            repo.tree_of(commit),
            state or None,
            agent_git or None,
            first.removeprefix("agentgate: checkpoint: "),
        )
    raise CheckpointError(spec, f"is not a checkpoint (none under {PREFIX} names it)")
