"""Snapshotting what the agent left: its changes as a tree of the base repository, hashed
with the base's git directory and a private index outside the workspace (so only the files
the agent changed are read), refused when they hold what git would not compare or what
would reach outside the tree."""

from __future__ import annotations

import errno
import fnmatch
import functools
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._constants import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES
from ..errors import AgentgateError, GitError
from ..git import runner as _git
from ..git import trees
from ..git.repo import BaseRepo, TreeChange

if TYPE_CHECKING:
    pass

from .._constants import DEFAULT_EXCLUDE
from .fork import Workspace, _index

#: One path that differs between the base tree and the snapshot.
Change = TreeChange


@dataclass(frozen=True)
class Snapshot:
    """The tree the agent left, and what it changed against the base."""

    base: str
    base_tree: str
    tree: str
    changes: tuple[Change, ...]
    excluded: tuple[str, ...] = ()
    hashed: int = 0
    #: Gitlinks the agent changed or removed; the snapshot keeps the base's value.
    kept_gitlinks: tuple[str, ...] = ()
    #: Trees and blobs the snapshot has that the base lacks (for the operations log).
    new_objects: tuple[str, ...] = ()

    @property
    def changed_paths(self) -> tuple[str, ...]:
        return tuple(change.path for change in self.changes)


class SnapshotRefused(AgentgateError):
    """The workspace holds something that must not become a tree (reported, not stored)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def excluded_by(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``path`` matches an exclude pattern (see :data:`DEFAULT_EXCLUDE`): a pattern
    without a slash against each of the path's names, one with a slash against each of its
    leading parts (``a``, ``a/b``, ...)."""
    by_name, by_prefix = _compiled(tuple(patterns))
    parts = path.strip("/").split("/")
    if by_name is not None and any(by_name.match(part) for part in parts):
        return True
    if by_prefix is not None:
        return any(by_prefix.match("/".join(parts[: i + 1])) for i in range(len(parts)))
    return False


@functools.lru_cache(maxsize=32)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
    """The patterns as two expressions, each matching what any of its patterns matches as
    :func:`fnmatch.fnmatchcase` would: a snapshot of 1,000 files asked 50 patterns each."""
    names: list[str] = []
    prefixes: list[str] = []
    for raw in patterns:
        pattern = raw.strip("/")
        if pattern:
            (prefixes if "/" in pattern else names).append(fnmatch.translate(pattern))

    def one(translated: list[str]) -> re.Pattern[str] | None:
        return re.compile("|".join(f"(?:{t})" for t in translated)) if translated else None

    return one(names), one(prefixes)


def snapshot(
    ws: Workspace,
    *,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    allow_symlinks: Sequence[str] = (),
    by_git: bool = False,
) -> Snapshot:
    """Turn the files the agent left into a tree whose parent is the base.

    One pass lists what differs from the private index (new, modified, deleted; ignore rules
    honoured); only those paths become new objects. Secrets matching ``exclude`` stay out and
    are named in the result. Gitlinks keep the base's value (an agent cannot repoint a
    submodule). Nested repositories and paths git refuses raise :class:`SnapshotRefused`.
    The limits are checked from file sizes before anything is read.

    A few changed files are written by the plugin, the same objects git writes, and the
    private index is left as it was: the next snapshot (after a checkpoint, the attempt's)
    edits the tree the index holds, with what changed since it. Past that, or with
    ``by_git``, git stages the files into the index and writes its tree, so the index holds
    that tree afterwards.
    """
    repo = ws.repo
    _settle_index(ws)
    found = _index(ws).differences()
    others, tracked = list(found.untracked), list(found.changed)
    nested = [p.rstrip("/") for p in others if p.endswith("/")]
    if nested:
        raise SnapshotRefused(
            f"nested git repository at {', '.join(nested)}: an agent may not add a repository "
            "inside the workspace (it would be stored as a gitlink)"
        )
    excluded = tuple(p for p in (*tracked, *others) if excluded_by(p, exclude))
    # Tracked paths that are no longer a file here: deleted, now a directory, or behind a
    # symlink. They leave the index first; a gitlink among them keeps the base's value.
    excluded_set = set(excluded)
    gitlinks = _gitlinks(ws, [p for p in tracked if p not in excluded_set])
    folders: dict[str, bool] = {}  # what each folder on the way is, looked up once
    skip = excluded_set | gitlinks
    removals = {p for p in tracked if p not in skip and not _is_file_here(ws.path, p, folders)}
    additions = [p for p in (*tracked, *others) if p not in skip and p not in removals]
    if len(additions) + len(removals) > max_files:
        raise SnapshotRefused(
            f"attempt changes {len(additions) + len(removals)} files, over the limit of {max_files}"
        )
    sizes = _sizes(ws.path, additions, max_bytes)
    base_tree, start = repo.tree_of(ws.base), ws.index_tree
    tree = None if by_git else _written_here(ws, sizes, removals)
    if tree is None:
        tree = _written_by_git(ws, additions, removals)
    repo.same_gitlinks(tree, base_tree)  # the index holds the base's gitlinks, no other
    if start is not None and not any(
        p.rpartition("/")[2] == ".gitattributes" for p in (*additions, *removals)
    ):
        repo.same_attributes(tree, start)  # and the attributes files it held
    changes, new_objects = diff_trees(repo, base_tree, tree)
    _refuse_escaping_links(repo, base_tree, tree, changes, allow_symlinks)
    return Snapshot(
        base=ws.base,
        base_tree=base_tree,
        tree=tree,
        changes=changes,
        new_objects=new_objects,
        excluded=excluded,
        hashed=len(additions),
        kept_gitlinks=tuple(sorted(gitlinks)),
    )


def _sizes(root: Path, additions: Sequence[str], max_bytes: int) -> dict[str, int]:
    """Each added path's size, refused past ``max_bytes`` in all, or when a path listed a
    moment ago is gone (a process of the agent's is still at work in the workspace)."""
    sizes: dict[str, int] = {}
    total = 0
    for rel in additions:
        try:
            sizes[rel] = os.lstat(os.path.join(root, rel)).st_size
        except (FileNotFoundError, NotADirectoryError):
            raise SnapshotRefused(
                f"{rel} went away while the workspace was snapshotted: something is still "
                "changing it"
            ) from None
        total += sizes[rel]
        if total > max_bytes:
            raise SnapshotRefused(f"attempt writes over {max_bytes} bytes, the limit")
    return sizes


def _written_by_git(ws: Workspace, additions: Sequence[str], removals: Iterable[str]) -> str:
    """The snapshot's tree as git writes it: the paths staged in the private index (git
    hashes the files, filters applied), then the index written as a tree.

    From the first staging on, the index may hold something else than the tree it held: its
    tree is unknown (``ws.index_tree`` None) until ``write-tree`` names it, so a snapshot
    after one that failed half-way is git's too, never an edit of a tree the index left."""
    index = _index(ws)
    ws.index_tree = None
    try:
        index.stage_paths(sorted(removals), remove=True)
        index.stage_paths(additions)
    except GitError as err:
        if _git.disk_trouble(err.stderr):
            raise  # a full or failing disk is the machine's trouble, not the agent's
        raise SnapshotRefused(f"git refused a path the agent wrote: {err.stderr.strip()}") from err
    ws.index_written = time.time()
    ws.index_tree = index.write_tree()
    return ws.index_tree


def _written_here(ws: Workspace, sizes: Mapping[str, int], removals: Iterable[str]) -> str | None:
    """A snapshot written by the plugin, the same objects git would write, two git
    processes less (see :mod:`pytest_agentgate.git.trees`); the private index is left as it
    is, and so is the tree it holds (``ws.index_tree``): the next snapshot edits that tree
    again, hashing what changed since it (at most :data:`_HERE_FILES` files here). None
    when it is git's to write: a name git guards, an attributes file anywhere, a setting
    that changes what git stores, more files or bytes than git hashes faster
    (:data:`_HERE_FILES`, :data:`~pytest_agentgate.git.trees.MAX_BYTES`), anything but a
    file or a link (or one larger than ``sizes`` says), or an index whose tree is not
    known (a resumed workspace).

    An attributes file anywhere git would read one for these paths (the index's tree, the
    work tree's folders on their way, ignored or not) leaves it to git."""
    repo = ws.repo
    removals = sorted(removals)
    if (
        ws.index_tree is None
        or len(sizes) > _HERE_FILES
        or sum(sizes.values()) > trees.MAX_BYTES
        or not all(trees.plain_name(p) for p in (*sizes, *removals))
        or not trees.plain_checkin(repo.common_dir)
        or repo.has_attributes(ws.index_tree)
        or trees.attributes_along(ws.path, sizes)
    ):
        return None
    blobs = repo.blobs_here(ws.path, sizes)
    if blobs is None:
        return None
    edits: dict[str, tuple[str, str] | None] = {**dict.fromkeys(removals), **blobs}
    # The edits are of what the index holds: the base, or the last checkpoint's tree.
    return repo.edited_tree(ws.index_tree, edits)


#: The most files a snapshot hashes without git: each costs the plugin about as much as a
#: git process's start saves, past a dozen or two (``bench``'s crossing, 100 and 1,000
#: files: ten changed, 30 ms against 32 and 42; forty, 81 against 60 and 62 against 64).
_HERE_FILES = 16


def tree_snapshot(
    repo: BaseRepo,
    base: str,
    tree: str,
    *,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    allow_symlinks: Sequence[str] = (),
) -> Snapshot:
    """A tree somebody else made (another machine's posted attempt), judged as the files an
    agent left would be: what :func:`snapshot` keeps out or refuses is refused here.

    A workspace never yields a changed gitlink, a path ``exclude`` matches, more than
    ``max_files`` changes or ``max_bytes`` written, or a symlink out of the tree; a tree
    written by hand can hold any of them, so each raises :class:`SnapshotRefused`.
    """
    base_tree = repo.tree_of(base)
    changes, new_objects = diff_trees(repo, base_tree, tree)
    gitlinks = [c.path for c in changes if "160000" in (c.old_mode, c.new_mode)]
    if gitlinks:
        raise SnapshotRefused(f"changes a submodule's commit: {', '.join(gitlinks[:10])}")
    kept_out = [c.path for c in changes if c.status != "D" and excluded_by(c.path, exclude)]
    if kept_out:
        raise SnapshotRefused(
            f"writes paths every attempt keeps out (--agentgate-exclude): {', '.join(kept_out[:10])}"
        )
    if len(changes) > max_files:
        raise SnapshotRefused(
            f"attempt changes {len(changes)} files, over the limit of {max_files}"
        )
    if repo.total_size([c.new_oid for c in changes if c.status != "D"]) > max_bytes:
        raise SnapshotRefused(f"attempt writes over {max_bytes} bytes, the limit")
    _refuse_escaping_links(repo, base_tree, tree, changes, allow_symlinks)
    return Snapshot(base, base_tree, tree, changes, new_objects=new_objects)


#: How many symlinks one path may pass through before it counts as a loop (Linux: 40).
_MAX_HOPS = 40


def _refuse_escaping_links(
    repo: BaseRepo, base_tree: str, tree: str, changes: Sequence[Change], allowed: Sequence[str]
) -> None:
    """Reject a symlink the attempt added or changed that is absolute or leaves the tree.

    Each link is resolved inside the snapshot's own tree, following the tree's symlinks, so a
    link that climbs out (to an ignored file of the workspace, to the base checkout) or goes
    through another link that does is caught; what lands is never a link out. Links the base
    already had are not the attempt's, unless the change makes one leave the tree that did not
    before (``up -> a/..`` once ``a`` becomes a link). Paths matching ``allowed`` pass.
    """
    changed_links = [c.path for c in changes if c.new_mode == "120000" and c.status != "D"]
    if not changed_links:
        return
    in_new, in_base = _tree_lookup(repo, tree), _tree_lookup(repo, base_tree)
    bad = []
    for path in changed_links:
        if _matches_glob(path, allowed):
            continue
        found = in_new(path)
        target = found[1] if found else ""
        if not _resolves_inside(path, target, in_new):
            bad.append(f"{path} -> {target}")
    # A new link can change where an old one leads: judge the base's links again.
    changed = {c.path for c in changes}
    for entry in repo.ls_tree(tree):
        path = entry.path
        if not entry.is_link or path in changed or _matches_glob(path, allowed):
            continue
        target = (in_new(path) or ("", ""))[1]
        if not _resolves_inside(path, target, in_new) and _resolves_inside(path, target, in_base):
            bad.append(f"{path} -> {target} (a link of the base that this change makes leave)")
    if bad:
        raise SnapshotRefused(
            f"symlink leaves the tree: {', '.join(bad)} (a symlink must be relative and resolve "
            "inside the repository; allow one with --agentgate-allow-symlink GLOB)"
        )


def _tree_lookup(repo: BaseRepo, tree: str) -> Callable[[str], tuple[str, str] | None]:
    """(mode, link target or "") of a path in ``tree``, or None when it is not there; cached."""
    cache: dict[str, tuple[str, str] | None] = {}

    def lookup(path: str) -> tuple[str, str] | None:
        if path not in cache:
            entry = repo.tree_entry(tree, path)
            if entry is None:
                cache[path] = None
            else:
                target = ""
                if entry.is_link:
                    target = repo.blob(entry.oid).decode("utf-8", "surrogateescape")
                cache[path] = (entry.mode, target)
        return cache[path]

    return lookup


def _resolves_inside(
    link: str, target: str, lookup: Callable[[str], tuple[str, str] | None]
) -> bool:
    """Whether the link at ``link`` with ``target`` resolves to a path inside the tree."""
    if target.startswith("/") or not target:
        return False
    pending = [*link.split("/")[:-1], *target.split("/")]
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                return False
            resolved.pop()
            continue
        resolved.append(part)
        found = lookup("/".join(resolved))
        if found is not None and found[0] == "120000":
            hops += 1
            if hops > _MAX_HOPS or found[1].startswith("/") or not found[1]:
                return False
            resolved.pop()
            pending[:0] = found[1].split("/")
    return True


def _matches_glob(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _settle_index(ws: Workspace) -> None:
    """Make the private index stat-valid once a second has passed since it was written.

    git trusts a file's stat data only when the file is older than the index; files written
    in the same second as the index are "racily clean" and have their content compared, by
    every command that reads the index. One refresh, a second or more later, compares them
    once and rewrites the index, so the snapshot's own pass is stat-only.
    """
    if ws.index_written and time.time() - ws.index_written >= 1.0:
        _index(ws).refresh()
        ws.index_written = 0.0


def _is_file_here(root: Path, rel: str, folders: dict[str, bool] | None = None) -> bool:
    """Whether ``rel`` is a file or symlink reached without passing through a symlink.
    ``folders`` keeps what was found of each folder on the way, for the next path."""
    folders = {} if folders is None else folders
    parts = rel.split("/")
    for i in range(1, len(parts)):
        folder = "/".join(parts[:i])
        found = folders.get(folder)
        if found is None:
            mode = _lstat_mode(os.path.join(root, folder))
            found = folders[folder] = mode is not None and stat.S_ISDIR(mode)
        if not found:
            return False
    mode = _lstat_mode(os.path.join(root, rel))
    return mode is not None and (stat.S_ISLNK(mode) or stat.S_ISREG(mode))


def _lstat_mode(path: str) -> int | None:
    """The mode of ``path`` itself (a link not followed); None where it is not there, or a
    file is on its way (the errors :mod:`pathlib`'s ``is_dir`` takes for False)."""
    try:
        return os.lstat(path).st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return None
        raise


def _gitlinks(ws: Workspace, paths: Sequence[str]) -> set[str]:
    """Those of ``paths`` that are gitlinks (submodules) in the private index.

    The index holds the base's gitlinks and no other: a snapshot never stages one (a nested
    repository is refused, a gitlink keeps the base's value). So they are read from the
    base's tree, which the repository keeps per tree id: the attempts made on one base pay
    for one listing between them.
    """
    if not paths:
        return set()
    return set(ws.repo.gitlinks(ws.repo.tree_of(ws.base)) & set(paths))


def diff_trees(repo: BaseRepo, old: str, new: str) -> tuple[tuple[Change, ...], tuple[str, ...]]:
    """The paths that differ between two trees (no rename detection), and the objects
    ``new`` has that ``old`` lacks (its changed trees and blobs; the root tree first).

    One ``diff-tree -t`` answers both: the snapshot's change list, and the object count the
    operations log records, which then costs no git process of its own.
    """
    if old == new:
        return (), ()
    changes = []
    objects = [new]
    for change in repo.diff_tree(old, new, trees=True):
        if change.new_oid.strip("0") and change.new_mode != "160000":
            objects.append(change.new_oid)
        if not change.is_tree:  # a directory entry, listed by trees=True: not a changed path
            changes.append(change)
    return tuple(changes), tuple(objects)
