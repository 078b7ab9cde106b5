"""Recycling a workspace for the next task: its checkout reset to a new base, and proved clean
of what git never compares (hard links, odd modes, leftovers), or not reused at all."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import AgentgateError, GitError
from ..git.index import Index, IndexEntry
from ..git.repo import BaseRepo
from ..sandbox.removal import remove_empty_dirs, remove_under

if TYPE_CHECKING:
    pass

from .fork import Workspace, _new_dir, make_agent_git


class RecycleFailed(AgentgateError):
    """A used workspace could not be proven identical to a fresh checkout."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot recycle {path}: {reason}")


#: git writes a file's bytes through the attributes it holds then, and rewrites no file whose
#: blob is unchanged: under other attributes those files would keep the old bytes.
_ATTRIBUTES_CHANGED = (
    "its .gitattributes differ from the tree's: files git wrote under the old ones would keep "
    "their bytes (a fresh checkout is made instead)"
)


def reset_checkout(
    repo: BaseRepo,
    path: Path,
    index: Path,
    rev: str,
    *,
    current: str | None = None,
    proven: bool | None = None,
    files_since: float | None = None,
) -> bool:
    """Bring a used checkout (a workspace, a gate's) to exactly ``rev``'s tree, or raise.

    Everything untracked or ignored is removed first (a ``.pyc`` one run left must never
    run in the next tree, and a ``.gitattributes`` it left would change how git writes the
    next tree's files); ``read-tree --reset -u`` then rewrites the paths whose blob or mode
    differs and every path whose stat (ctime included) no longer matches; one more pass
    removes what is left, nested ``.git`` entries and FIFOs, and resets directory modes; and
    the result is verified as a snapshot would see it. :class:`RecycleFailed` when anything
    still differs, and when the two trees' ``.gitattributes`` differ (git would not write
    an unchanged file again under the new ones).

    With ``files_since``, files git never compares are looked at too (see :func:`_scrub`):
    one with other permission bits, a hard link, an attribute, a time before then, keeps the
    checkout from reuse (:class:`RecycleFailed`).

    With ``current`` (the tree the checkout was last brought to), a checkout proven to hold
    exactly ``current`` (by :func:`prove_clean`: now, or already when ``proven`` says so;
    False: it was found to differ) is brought
    to ``rev`` by the paths that differ between the two trees alone (:func:`_bring_over`;
    returns True); otherwise every path is reset as above (False).
    """
    checkout = repo.index(path, index)
    if current is not None:
        if proven is None:
            proven = prove_clean(checkout, path, repo.gitlinks(current))
            if proven is None:
                raise RecycleFailed(path, "it holds what git cannot reset")
        if proven and _bring_over(repo, checkout, path, current, rev):
            return True
    # First remove what the last run left: git reads a ``.gitattributes`` from the work
    # tree while it writes files, so one left behind would change the bytes of the next.
    for rel in checkout.differences(ignored_too=True, tracked=False).untracked:
        remove_under(path, rel.rstrip("/"))
    attributes = checkout.attribute_files()
    checkout.read_tree(rev, update=True)
    if checkout.attribute_files() != attributes:
        raise RecycleFailed(path, _ATTRIBUTES_CHANGED)
    found = checkout.differences(ignored_too=True)
    # A tracked path still modified or missing after the reset means it could not be fixed.
    if found.changed:
        raise RecycleFailed(
            path, f"still differs from {rev[:12]} at {', '.join(found.changed[:5])}"
        )
    for rel in found.untracked:
        remove_under(path, rel.rstrip("/"))
    _purge_gitlinks(path, repo.gitlinks(repo.tree_of(rev)))
    found_off = _scrub(path, files_since=files_since)
    if found_off is not None:  # what git cannot reset (see _scrub): not reused
        raise RecycleFailed(path, found_off)
    if checkout.write_tree() != repo.tree_of(rev):
        raise RecycleFailed(path, "its index does not hold the tree it was reset to")
    return False


def prove_clean(
    checkout: Index, path: Path, gitlinks: Iterable[str], *, made: float | None = None
) -> bool | None:
    """Whether the checkout holds exactly what its index says: True, False (a tracked file
    differs: reset every path), or None (something git cannot reset: do not reuse it).

    First everything untracked or ignored is removed, before any file is compared (a
    ``.gitattributes`` left behind would make git compare a changed file through it and call
    it unchanged), with what a submodule's directory holds and every entry git never lists
    (:func:`_scrub`, which with ``made``, when the checkout was made, also looks at what git
    never compares). Then one pass: nothing tracked may be modified or missing, by stat data
    (ctime included, which no process can set back; git reads the content of any file
    written in the same second as the index). Call it only when nothing can run in the
    checkout any more (its command's processes were all ended): what it proves then holds
    until the next write.
    """
    for rel in checkout.differences(ignored_too=True, tracked=False).untracked:
        remove_under(path, rel.rstrip("/"))
    _purge_gitlinks(path, gitlinks)
    if _scrub(path, files_since=made) is not None:
        return None
    found = checkout.differences(ignored_too=True)
    for rel in found.untracked:
        remove_under(path, rel.rstrip("/"))
    return not found.changed


def _bring_over(repo: BaseRepo, checkout: Index, path: Path, current: str, rev: str) -> bool:
    """Bring a checkout proven to hold ``current`` to ``rev`` by the paths that differ;
    False (nothing written) when a submodule is among them, for the full reset instead.

    Deleted files are unlinked (and directories they leave empty), the index is set to
    ``rev``'s entries at the changed paths, and git itself writes the new files from it. The
    work tree then holds ``rev`` because it held ``current`` and exactly the difference was
    written; the index's tree must equal ``rev``'s. Unlike a two-tree ``read-tree -m -u``,
    nothing stats every path a second time: on a large tree that pass was most of the cost.
    """
    changes = repo.diff_tree(current, rev)
    if any(c.path.rpartition("/")[2] == ".gitattributes" for c in changes):
        raise RecycleFailed(path, _ATTRIBUTES_CHANGED)
    if any("160000" in (c.old_mode, c.new_mode) for c in changes):
        return False  # a submodule's directory: the full reset handles gitlinks
    gone = [c for c in changes if c.status == "D"]
    for change in gone:
        with contextlib.suppress(FileNotFoundError):
            remove_under(path, change.path)
    remove_empty_dirs(path, [c.path.rpartition("/")[0] for c in gone if "/" in c.path])
    checkout.stage_entries(
        [IndexEntry("0", c.old_oid, c.path) for c in gone]
        + [IndexEntry(c.new_mode, c.new_oid, c.path) for c in changes if c.status != "D"]
    )
    checkout.check_out_paths([c.path for c in changes if c.status != "D"])
    if checkout.write_tree() != repo.tree_of(rev):
        raise RecycleFailed(path, "its index does not hold the tree it was brought to")
    return True


def recycle(ws: Workspace, base: str, name: str | None = None) -> Workspace:
    """Bring a used workspace to ``base`` by rewriting only what differs, then prove it.

    ``read-tree --reset -u`` rewrites exactly the paths whose blob or mode differs from the new
    base, and every path whose stat (ctime included, so a restored mtime hides nothing) no
    longer matches; everything untracked or ignored is removed; the agent's ``.git`` is made
    anew. The result is then verified as a snapshot would see it: nothing modified, nothing
    extra, the index's tree equal to the base's. Raises :class:`RecycleFailed` otherwise.
    With ``name``, the workspace moves to a directory named for the task it now serves, so
    a kept workspace is found by its task.
    """
    repo = ws.repo
    begin = time.perf_counter()
    left = ws.end_processes()
    if left:
        raise RecycleFailed(ws.path, f"{left} of its processes could not be ended")
    try:
        remove_under(ws.path, ".git")
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RecycleFailed(ws.path, f"cannot remove the agent's .git: {exc}") from exc
    if ws.private is not None:  # the last task's /tmp and $HOME go with it
        for folder in ("tmp", "home"):
            with contextlib.suppress(FileNotFoundError):
                remove_under(ws.private, folder)
    try:
        # A hard link or a mode the last agent left would reach the next agent's work (an
        # edit of one file changing another): such a workspace is not recycled. Times stay
        # the agent's business here (tools restore them); the gate never runs in it.
        reset_checkout(repo, ws.path, ws.index, base, files_since=0.0)
        make_agent_git(repo, ws.path, ws.branch, base, ws.index, sealed=ws.objects is None)
        if name is not None:
            fresh = _new_dir(ws.path.parent, name)
            fresh.rmdir()
            ws.path.rename(fresh)
            ws.path = fresh
    except (GitError, OSError) as exc:
        raise RecycleFailed(ws.path, str(exc)) from exc
    ws.base = base
    ws.index_written = time.time()
    ws.index_tree = repo.tree_of(base)
    ws.resumed_from = None
    ws.runs.clear()
    ws.fork_ms = (time.perf_counter() - begin) * 1000
    ws.recycled += 1
    return ws


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _scrub(root: Path, *, files_since: float | None = None) -> str | None:
    """Remove what git's own listing never shows, so a recycled workspace is a fresh one.

    git skips every entry named ``.git`` at any depth and ignores FIFOs, sockets and devices,
    and a checkout leaves directory modes as it found them: an agent could leave a message
    for the next task there. One descriptor-based walk (no link followed, file types from
    the directory entries) removes such entries, gives directories the mode a fresh checkout
    gives them and drops their ACLs and user attributes (a default ACL would change the mode
    of every file git writes there next).

    With ``files_since`` (when the checkout was made), every regular file is looked at too,
    for what git never compares: permission bits beyond the owner's execute bit, a hard link
    to another file, an ACL or a user attribute, a modification time set back before the
    checkout existed. Returns what was found (the checkout must then not be reused), or None.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    mode = 0o777 & ~_umask()
    file_modes = {0o666 & ~_umask(), 0o777 & ~_umask()}
    # Depth first, one open descriptor per level: a wide tree never holds many at once.
    stack: list[tuple[str, int, list[os.DirEntry[str]]]] = []

    def enter(prefix: str, fd: int) -> None:
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)
            for name in _attributes(fd):
                os.removexattr(fd, name)
            with os.scandir(fd) as entries:
                found = list(entries)
        except BaseException:
            os.close(fd)
            raise
        stack.append((prefix, fd, found))

    enter("", os.open(root, flags))
    try:
        while stack:
            prefix, fd, found = stack[-1]
            if not found:
                os.close(fd)
                stack.pop()
                continue
            entry = found.pop()
            rel = prefix + entry.name
            if entry.name == ".git":
                remove_under(root, rel)
            elif entry.is_dir(follow_symlinks=False):
                enter(rel + "/", os.open(entry.name, flags, dir_fd=fd))
            elif not (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                remove_under(root, rel)
            elif files_since is not None and not entry.is_symlink():
                info = entry.stat(follow_symlinks=False)
                if stat.S_IMODE(info.st_mode) not in file_modes:
                    return f"{rel} has mode {stat.S_IMODE(info.st_mode):o}"
                if info.st_nlink != 1:
                    return f"{rel} is a hard link ({info.st_nlink} names)"
                if info.st_mtime < files_since:
                    return f"{rel} was given a time before the checkout was made"
                if _attributes(str(root / rel)):
                    return f"{rel} carries extended attributes"
    finally:
        for _, fd, _ in stack:
            os.close(fd)
    return None


def _attributes(target: int | str) -> list[str]:
    """The extended attributes an agent can set that change or mark a file or directory:
    ACLs and ``user.*`` (``security.*`` labels belong to the system, and stay)."""
    try:
        names = (
            os.listxattr(target, follow_symlinks=False)
            if isinstance(target, str)
            else os.listxattr(target)
        )
    except OSError:  # a filesystem without extended attributes
        return []
    return [n for n in names if n.startswith(("user.", "system.posix_acl", "trusted."))]


def _purge_gitlinks(path: Path, gitlinks: Iterable[str]) -> None:
    """Empty every submodule's directory (a gitlink's): git never lists what is inside one,
    and a fresh checkout leaves it empty. The paths are the tree's the checkout holds (the
    repository keeps them per tree id), not read from its index by a git process."""
    for link in gitlinks:
        where = path / link
        if where.is_dir() and not where.is_symlink():
            with os.scandir(where) as listing:
                names = [child.name for child in listing]
            for name in names:
                remove_under(path, f"{link}/{name}")
