"""A work tree and the index that describes it, as named git operations (the git layer).

The plugin works with three kinds of index: the private index of a workspace or a gate
checkout (outside the directory, so the agent cannot edit it), a scratch index for building a
tree (state, grading), and the base repository's own (when the checked-out target follows a
move). All three are an :class:`Index`: a work tree (or none), an index file (or the
repository's own), and the operations the package needs of them, each with its arguments and
its parsing here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import GitError, StaleLock
from . import runner as _git

#: How long a git lock found after a refresh may take to go (a git command of somebody
#: else's that holds it for a moment) before it is reported.
_LOCK_GRACE_S = 1.0


class Repository(Protocol):
    """What an index needs of its repository (a :class:`~pytest_agentgate.git.repo.BaseRepo`):
    its git directory, and its runner of git."""

    @property
    def git_dir(self) -> Path: ...

    def _run(
        self,
        *args: str,
        work_tree: Path | None = ...,
        index: Path | None = ...,
        env: Mapping[str, str] | None = ...,
        input: bytes | None = ...,
        ok: Sequence[int] = ...,
    ) -> _git.GitResult: ...


@dataclass(frozen=True)
class IndexEntry:
    """One staged path: its mode, object and path (``ls-files -s`` / ``--index-info``)."""

    mode: str
    oid: str
    path: str

    def line(self) -> bytes:
        return f"{self.mode} {self.oid}\t{self.path}".encode("utf-8", "surrogateescape") + b"\0"


@dataclass(frozen=True)
class Differences:
    """What differs between an index and its work tree, each path once, in git's order."""

    untracked: tuple[str, ...]  # a trailing "/" marks a directory git did not enter (a repo)
    changed: tuple[str, ...]  # tracked paths modified or deleted


class Index:
    """An index file and the work tree it describes (either may be the repository's own)."""

    def __init__(self, repo: Repository, work_tree: Path | None, path: Path | None) -> None:
        self.repo = repo
        self.work_tree = work_tree
        self.path = path

    def _run(
        self, *args: str, input: bytes | None = None, ok: Sequence[int] = (0,)
    ) -> _git.GitResult:
        return self.repo._run(*args, work_tree=self.work_tree, index=self.path, input=input, ok=ok)

    # -- reading ------------------------------------------------------------------------

    def write_tree(self) -> str:
        """The tree the index holds (written to the object store)."""
        return self._run("write-tree").out.strip()

    def tree_or_none(self) -> str | None:
        """The index's tree, or None when it holds an unmerged path or cannot be read."""
        result = self._run("write-tree", ok=(0, 128))
        return result.out.strip() or None if result.returncode == 0 else None

    def entries(self, paths: Sequence[str] = ()) -> list[IndexEntry]:
        """The staged entries at ``paths`` (literal), or every entry when none are given."""
        args = ["ls-files", "-z", "-s"]
        if paths:
            args += ["--", *(f":(literal){p}" for p in paths)]
        found = []
        for item in _git.split_z(self._run(*args).stdout):
            meta, _, path = item.partition("\t")
            mode, oid, _stage = meta.split(" ")
            found.append(IndexEntry(mode, oid, path))
        return found

    def attribute_files(self) -> dict[str, str]:
        """Every ``.gitattributes`` the index holds, at any depth: its path and blob."""
        found = self._run("ls-files", "-z", "-s", "--", ":(glob)**/.gitattributes").stdout
        return {
            path: meta.split(" ")[1]
            for meta, _, path in (item.partition("\t") for item in _git.split_z(found))
        }

    def differences(self, *, ignored_too: bool = False, tracked: bool = True) -> Differences:
        """Untracked paths, and tracked ones modified or deleted, in one pass.

        Ignore rules are honoured unless ``ignored_too``, which also lists a directory git
        need not enter as one entry (``dir/``) rather than every file in it. Without
        ``tracked`` only the untracked are listed: no tracked file is examined (a racily
        clean one, written in the second its index was, would be read whole).
        """
        args = ["ls-files", "-z", "-t", "--others"] + (["--modified"] if tracked else [])
        args.append("--directory" if ignored_too else "--exclude-standard")
        others: dict[str, None] = {}
        changed: dict[str, None] = {}
        for item in _git.split_z(self._run(*args).stdout):
            tag, _, rel = item.partition(" ")
            (others if tag == "?" else changed)[rel] = None
        return Differences(tuple(others), tuple(changed))

    def attributes(self, paths: Sequence[str], names: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Each path's values of the attributes ``names`` as git reads the ``.gitattributes``
        files this index holds (``check-attr --cached``), so no parser of ours can read a line
        otherwise than git does."""
        if not paths:
            return {}
        data = "".join(f"{p}\0" for p in paths).encode("utf-8", "surrogateescape")
        out = self._run("check-attr", "--cached", "-z", "--stdin", *names, input=data).stdout
        items = _git.split_z(out)
        found: dict[str, list[str]] = {}
        for at in range(0, len(items) - 2, 3):
            path, name, value = items[at : at + 3]
            found.setdefault(path, []).append(f"{name}={value}")
        return {path: tuple(values) for path, values in found.items()}

    def changed_since(self, rev: str) -> list[str]:
        """Tracked paths whose staged or checked-out content differs from ``rev``."""
        return _git.split_z(self._run("diff-index", "--name-only", "-z", rev, "--").stdout)

    # -- writing ------------------------------------------------------------------------

    def read_tree(self, rev: str, *, update: bool = False) -> None:
        """Make the index hold exactly ``rev``; with ``update``, the work tree too."""
        args = ["read-tree", "--reset", "-u"] if update else ["read-tree"]
        self._run(*args, "--end-of-options", rev)

    def merge_trees(self, old: str, new: str, *, dry_run: bool = False) -> str | None:
        """Bring index and work tree from ``old`` to ``new`` (a two-tree merge that keeps
        untracked files and refuses to overwrite a changed one).

        With ``dry_run`` nothing is written; returns why git would refuse, or None. A held
        lock raises :class:`StaleLock` either way.
        """
        if not dry_run:
            self._run("read-tree", "-m", "-u", old, new)
            return None
        probe = self._run("read-tree", "-n", "-m", "-u", old, new, ok=(0, 128))
        if probe.returncode == 0:
            return None
        raise_if_locked(probe.stderr)
        return probe.stderr

    def stage_paths(self, paths: Sequence[str], *, remove: bool = False) -> None:
        """Stage the work tree's files at ``paths`` (``remove``: take them out of the index).

        Paths are passed on standard input, NUL-separated, so any name is one path.
        """
        if not paths:
            return
        flags = ("--force-remove",) if remove else ("--add", "--replace")
        payload = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
        self._run("update-index", *flags, "-z", "--stdin", input=payload)

    def stage_all(self) -> None:
        """Stage every file of the work tree as ``git add -A`` would (ignore rules honoured)."""
        self._run("add", "-A")

    def stage_entries(self, entries: Sequence[IndexEntry]) -> None:
        """Set index entries directly (mode ``0`` removes a path)."""
        if entries:
            payload = b"".join(entry.line() for entry in entries)
            self._run("update-index", "--add", "-z", "--index-info", input=payload)

    def check_out_paths(self, paths: Sequence[str]) -> None:
        """Write the index's files at ``paths`` into the work tree (replacing what is there,
        leading directories made as needed) and record their new stat data."""
        if paths:
            payload = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
            self._run("checkout-index", "-f", "-u", "-z", "--stdin", input=payload)

    def refresh(self) -> None:
        """Refresh stat data, so that only real edits count as changes.

        ``-q`` also silences why git failed; the usual reason is its lock, looked for here.
        """
        result = self._run("update-index", "-q", "--refresh", ok=(0, 1, 128))
        lock = (self.path or self.repo.git_dir / "index").with_name(
            (self.path.name if self.path else "index") + ".lock"
        )
        if result.returncode == 128:
            if lock.exists():
                raise StaleLock(lock)
            raise GitError(["update-index", "-q", "--refresh"], 128, result.stderr)
        # git takes the lock only when the refresh has stat data to write, which depends on
        # the clock (an entry written in the same second as the index is rewritten). A lock
        # that stays is one a later write (a promotion's checkout) would fail on: said now.
        deadline = time.monotonic() + _LOCK_GRACE_S
        while lock.exists():
            if time.monotonic() >= deadline:
                raise StaleLock(lock)
            time.sleep(0.02)

    def hash_file(self, rel: str) -> str:
        """The blob id the work tree's file at ``rel`` would be stored as (filters apply
        where this index is the repository's own checkout); nothing is written."""
        assert self.work_tree is not None
        return self._run(
            "hash-object", f"--path={rel}", "--", str(self.work_tree / rel)
        ).out.strip()

    def check_out_all(self, prefix: Path) -> None:
        """Write every file of the index under ``prefix`` (existing files are replaced)."""
        self._run("checkout-index", "-a", "-f", f"--prefix={prefix}{'/'}")


def raise_if_locked(stderr: str) -> None:
    lock = _git.held_lock(stderr)
    if lock is not None:
        raise StaleLock(lock)
