"""The target as checked out in the base repository: a person's working tree.

When promotion (or a rollback, a revert) moves the branch that the base repository has
checked out, its files must follow, and nothing of the person's may be lost on the way: no
uncommitted edit, no untracked or ignored file overwritten. The update is journalled per ref
before the ref moves, so a process killed in between is finished by the next one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import DirtyWorktree, GitError, WorktreeBlocked
from .index import IndexEntry
from .repo import BaseRepo


def checked_out(repo: BaseRepo, ref: str) -> bool:
    """Whether ``ref`` is the branch checked out in the base repository's main working tree."""
    if repo.bare or not ref.startswith("refs/heads/"):
        return False
    return repo.refs.head_branch() == ref[len("refs/heads/") :]


def linked_checkout(repo: BaseRepo, ref: str) -> Path | None:
    """Another working tree of the repository that has ``ref`` checked out, if any.

    That is a linked worktree (``git worktree add``), or, when the base repository is itself
    a linked worktree, the main one.
    """
    if not ref.startswith("refs/heads/"):
        return None
    if repo.common_dir != repo.git_dir:
        try:
            if (repo.common_dir / "HEAD").read_text(encoding="utf-8").strip() == f"ref: {ref}":
                return repo.common_dir.parent
        except OSError:
            pass
    folder = repo.common_dir / "worktrees"
    if not folder.is_dir():
        return None
    for entry in folder.iterdir():
        if entry.resolve() == repo.git_dir.resolve():
            continue  # that is the base repository's own working tree
        try:
            head = (entry / "HEAD").read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if head == f"ref: {ref}":
            try:
                return Path((entry / "gitdir").read_text(encoding="utf-8").strip()).parent
            except OSError:
                return entry
    return None


def dirty_paths(repo: BaseRepo) -> list[str]:
    """Tracked files with uncommitted changes (staged or not) in the base working tree."""
    assert repo.worktree is not None
    index = repo.checkout_index()
    index.refresh()
    return index.changed_since("HEAD")


JOURNAL_PREFIX = "worktree-sync-"


def journal_path(repo: BaseRepo, ref: str) -> Path:
    """The journal of one ref's pending working-tree update (one per ref, as the locks are)."""
    return repo.private_dir / f"{JOURNAL_PREFIX}{ref.replace('/', '%2F')}.json"


def _in_the_way(
    repo: BaseRepo, old: str, new: str, skip: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """Untracked or ignored files where ``new`` puts a file: git would overwrite them silently.

    git treats ignored files as expendable, so its own checks pass while a user's ignored
    database or build directory is replaced. The plugin never does that: such a path blocks.
    """
    assert repo.worktree is not None
    pairs = [(c.status, c.path) for c in repo.diff_tree(old, new) if c.status in "AD"]
    deleted = {path for status, path in pairs if status == "D"}
    blocked = []
    for status, rel in pairs:
        if status != "A" or rel in skip:
            continue
        target = repo.worktree / rel
        if os.path.lexists(target):
            # A directory whose every file the new commit deletes is git's own D/F change.
            if not (
                target.is_dir()
                and not target.is_symlink()
                and _only(target, repo.worktree, deleted)
            ):
                blocked.append(rel)
            continue
        parent, prefix = repo.worktree, ""
        for part in rel.split("/")[:-1]:
            parent, prefix = parent / part, f"{prefix}{part}"
            if (
                parent.is_symlink() or (parent.exists() and not parent.is_dir())
            ) and prefix not in deleted:
                blocked.append(prefix)
                break
            prefix += "/"
    return blocked


def _only(folder: Path, top: Path, deleted: set[str]) -> bool:
    """Whether every file under ``folder`` is one of ``deleted`` (paths relative to ``top``)."""
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if str((Path(dirpath) / name).relative_to(top)) not in deleted:
                return False
    return True


def check_worktree(repo: BaseRepo, old: str, new: str) -> None:
    """Raise unless the working tree can go from ``old`` to ``new`` without losing anything."""
    assert repo.worktree is not None
    dirty = dirty_paths(repo)
    if dirty:
        raise DirtyWorktree(repo.worktree, dirty)
    in_the_way = _in_the_way(repo, old, new)
    if in_the_way:
        raise WorktreeBlocked(
            repo.worktree,
            f"untracked or ignored files are where the new commit puts files: {', '.join(in_the_way[:5])}",
        )
    refused = repo.checkout_index().merge_trees(old, new, dry_run=True)
    if refused is not None:
        raise WorktreeBlocked(repo.worktree, refused)


def sync_worktree(repo: BaseRepo, old: str, new: str) -> None:
    """Bring the checked-out files from ``old`` to ``new`` (two-tree merge, keeps untracked)."""
    assert repo.worktree is not None
    index = repo.checkout_index()
    index.merge_trees(old, new)
    index.refresh()


def recover_worktree(repo: BaseRepo, ref: str) -> str | None:
    """Finish a working-tree update of ``ref`` that a killed process left; say what was done.

    Called with ``ref``'s lock held. If the update was cut off halfway (some files already
    new, the index still old), the files already at their new content are staged as such,
    so the two-tree merge carries on from there. The other paths get the same check as a
    promotion (nothing untracked or ignored in the way). Anything else (a file that is
    neither old nor new: somebody edited it since) is not guessed at: the journal stays
    and the error says what to look at.
    """
    journal = journal_path(repo, ref)
    try:
        data = json.loads(journal.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError:
        journal.unlink(missing_ok=True)
        return None
    old, new = data["old"], data["new"]
    note = None
    if repo.refs.value(ref) == new and checked_out(repo, ref) and repo.worktree is not None:
        index_tree = repo.checkout_index().tree_or_none()
        if index_tree == repo.tree_of(old):
            finished = _stage_finished_paths(repo, old, new)
            blocked = _in_the_way(repo, old, new, skip=finished)
            try:
                if blocked:
                    raise WorktreeBlocked(
                        repo.worktree,
                        f"untracked or ignored files are in the way: {', '.join(blocked[:5])}",
                    )
                sync_worktree(repo, old, new)
            except (GitError, WorktreeBlocked) as exc:
                raise WorktreeBlocked(
                    repo.worktree,
                    str(exc),
                    message=f"an interrupted update of {str(repo.worktree)!r} from {old[:12]} to "
                    f"{new[:12]} could not be finished ({exc}); check 'git status' there, then "
                    f"delete {journal}",
                ) from exc
            note = f"finished updating {repo.worktree} from {old[:12]} to {new[:12]}"
    journal.unlink(missing_ok=True)
    return note


def _rewrite_truncated(repo: BaseRepo, target: Path, oid: str, mode: str) -> bool:
    """Rewrite a file that an interrupted update left shorter than ``oid`` (a full disk).

    Only a file whose content is a strict prefix of the new blob counts: git wrote it and
    was cut off. A person's edit is not a prefix of the new content, and is left alone.
    The blob is written as stored (this repository's filters aside: a truncated write is
    rare, and a filtered file then shows as modified rather than being lost).
    """
    size = target.stat().st_size
    if size >= repo.blob_size(oid):
        return False
    blob = repo.blob(oid)
    with open(target, "rb") as fh:
        if fh.read() != blob[:size]:
            return False
    tmp = target.with_name(f".{target.name}.agentgate-rewrite")
    tmp.write_bytes(blob)
    tmp.chmod(0o755 if mode == "100755" else 0o644)
    os.replace(tmp, target)
    return True


def _stage_finished_paths(repo: BaseRepo, old: str, new: str) -> set[str]:
    """Stage the paths whose files already hold ``new``'s content and mode (or are gone).

    Contents are hashed as the user's git would (their filters apply in their checkout);
    symlinks are compared by target. Returns the paths staged.
    """
    assert repo.worktree is not None
    index = repo.checkout_index()
    entries, done = [], set()
    for change in repo.diff_tree(old, new):
        rel, new_mode, new_oid = change.path, change.new_mode, change.new_oid
        target = repo.worktree / rel
        if change.status == "D":
            if not os.path.lexists(target):
                entries.append(IndexEntry("0", repo.null_oid, rel))
                done.add(rel)
            continue
        if new_mode == "120000" and target.is_symlink():
            have = repo.blob_id(os.readlink(target).encode("utf-8", "surrogateescape"))
        elif new_mode in ("100644", "100755") and target.is_file() and not target.is_symlink():
            if _rewrite_truncated(repo, target, new_oid, new_mode):
                entries.append(IndexEntry(new_mode, new_oid, rel))
                done.add(rel)
                continue
            executable = bool(target.stat().st_mode & 0o100)
            if executable != (new_mode == "100755"):
                continue
            have = index.hash_file(rel)
        else:
            continue
        if have == new_oid:
            entries.append(IndexEntry(new_mode, new_oid, rel))
            done.add(rel)
    index.stage_entries(entries)
    return done
