"""The base repository as named git operations: objects, trees and merges here; it holds
where it is and how git runs (:mod:`.place`), its refs (:mod:`.refs`) and its history
(:mod:`.history`) as parts, reached as ``repo.place``, ``repo.refs`` and ``repo.history``.

This module and :mod:`.index` (a work tree with its own index) and :mod:`.transport` (fetch
and push) are the git layer: the only code that builds a git command line. Each operation
owns its arguments and the parsing of what git printed, and returns a typed result; failures
are classified once, in :mod:`.runner`. Refs only move through :meth:`.refs.Refs.update`,
which always passes the old value, so a lost race is reported as ``False`` and never
overwrites someone else's move.

Modelled on pip's ``vcs/git.py`` (one method per question asked of git) and dulwich's object
and ref containers (typed entries, not text), as ideas; the code is this project's own.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self, TypeVar

from ..errors import GitError
from . import objects, trees
from . import runner as _git
from .history import History, LogEntry
from .objects import is_oid
from .place import Place, find
from .refs import ZERO, Refs, check_branch_name

__all__ = [
    "ZERO",
    "Author",
    "BaseRepo",
    "LogEntry",
    "MergePreview",
    "TreeChange",
    "TreeEntry",
    "check_branch_name",
    "init",
    "is_oid",
]

if TYPE_CHECKING:
    from .index import Index

T = TypeVar("T")

#: How long a diff is walked in process before ``diff-tree`` is asked instead: about what
#: starting git costs here. A gated test's few changes take a fraction of it.
_DIFF_HERE_S = 0.003


@dataclass(frozen=True)
class Author:
    """Who a commit is attributed to: the agent."""

    name: str
    email: str

    @classmethod
    def for_agent(cls, agent: str) -> Author:
        local = re.sub(r"[^A-Za-z0-9._-]+", "-", agent).strip("-") or "agent"
        return cls(agent, f"{local}@agentgate.invalid")

    def env(self) -> dict[str, str]:
        return {"GIT_AUTHOR_NAME": self.name, "GIT_AUTHOR_EMAIL": self.email}


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a tree listing (``ls-tree``)."""

    mode: str  # 100644, 100755, 120000 (a symlink), 160000 (a gitlink), 040000 (a tree)
    kind: str  # blob, tree, commit
    oid: str
    path: str

    @property
    def is_link(self) -> bool:
        return self.mode == "120000"

    @property
    def is_gitlink(self) -> bool:
        return self.mode == "160000"


@dataclass(frozen=True)
class TreeChange:
    """One path that differs between two trees (``diff-tree``, no rename detection)."""

    status: str  # A, M, D, T
    path: str
    old_mode: str
    new_mode: str
    old_oid: str = ZERO
    new_oid: str = ZERO

    @property
    def is_tree(self) -> bool:
        """An entry for a directory itself (listed with ``trees=True``), not a changed path."""
        return self.old_mode == self.new_mode == "040000" or (
            self.status in "AD" and "040000" in (self.old_mode, self.new_mode)
        )


@dataclass(frozen=True)
class MergePreview:
    """The result of a three-way merge that moved no ref."""

    tree: str
    conflicts: tuple[str, ...]

    @property
    def clean(self) -> bool:
        return not self.conflicts


class BaseRepo:
    """A repository the agents' work lands in (bare or with a working tree)."""

    def __init__(self, git_dir: Path, worktree: Path | None) -> None:
        self.place = Place(git_dir, worktree)
        self.refs = Refs(self.place)
        self.history = History(self.place)
        self.git_dir, self.worktree = git_dir, worktree
        self.common_dir, self.label = self.place.common_dir, self.place.label
        self._oid_length = self.place.oid_length
        #: Git run against this repository: for the git layer's own modules only.
        self._run = self.place.run
        # commit -> tree; commits never change, so this cache is never stale.
        self._trees: dict[str, str] = {}
        self._tree_paths: dict[str, list[str]] = {}
        self._gitlinks: dict[str, frozenset[str]] = {}
        #: "old new" object ids -> ``diff-tree -t`` between them (objects never change).
        self._diffs: dict[str, list[TreeChange]] = {}
        #: Tree id -> whether it holds a ``.gitattributes`` at any depth.
        self._attributed: dict[str, bool] = {}

    @classmethod
    def open(cls, path: str | Path, source: str = "", option: str = "") -> Self:
        """The repository at ``path`` (its top, a subdirectory, or a bare repository); see
        :func:`.place.find`."""
        return cls(*find(path, source, option))

    @property
    def bare(self) -> bool:
        return self.worktree is None

    @property
    def null_oid(self) -> str:
        return self.place.null_oid

    @property
    def private_dir(self) -> Path:
        return self.place.private_dir

    def index(self, work_tree: Path | None, path: Path | None = None) -> Index:
        """``work_tree`` with the index at ``path`` (None: the repository's own index)."""
        from .index import Index

        return Index(self, work_tree, path)

    def checkout_index(self) -> Index:
        """The base repository's own checkout and index (the user's filters apply)."""
        return self.index(self.worktree)

    # -- names --------------------------------------------------------------------------

    def tree_of(self, rev: str) -> str:
        """The tree of a commit (cached for full commit ids, which never change).

        A commit is read from its object, loose or packed: its first line names the tree; a
        tree is its own. Anything else is asked of git.
        """
        cached = self._trees.get(rev)
        if cached is not None:
            return cached
        tree = self._commit_tree_here(rev) if is_oid(rev) else None
        if tree is None:
            tree = self._run(
                "rev-parse", "--verify", "--end-of-options", f"{rev}^{{tree}}"
            ).out.strip()
        if is_oid(rev):
            self._trees[rev] = tree
        return tree

    def _commit_tree_here(self, oid: str) -> str | None:
        """The tree of a commit read in process (a tree's is itself), or None to ask git."""
        found = self._object(oid)
        if found is not None and found[0] == b"tree":
            return oid
        if found is None or found[0] != b"commit" or not objects.plain_commit(found[1]):
            return None
        tree = found[1][5:].partition(b"\n")[0].decode("ascii", "replace")
        return tree if is_oid(tree) else None

    def _object(self, oid: str) -> tuple[bytes, bytes] | None:
        """A small object's kind and content, loose or packed, checked as git checks it;
        None to ask git (see :func:`.objects.read_object`)."""
        if len(oid) != self._oid_length or not is_oid(oid):
            return None
        return objects.read_object(self.common_dir / "objects", oid)

    # -- objects ------------------------------------------------------------------------

    def commit_tree(
        self,
        tree: str,
        parents: Sequence[str],
        message: str,
        author: Author,
        *,
        signing_key: Path | None = None,
    ) -> str:
        """A commit of ``tree``; with ``signing_key`` (an SSH private key), signed with it
        (git's SSH signatures, ``ssh-keygen -Y sign``)."""
        if signing_key is None:
            made = self._commit_here(tree, parents, message, author)
            if made is not None:
                self._trees[made] = tree
                return made
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        config: tuple[str, ...] = ()
        if signing_key is not None:
            args.append("-S")
            config = ("gpg.format=ssh", f"user.signingKey={signing_key}")
        oid = self._run(
            *args, env=author.env(), input=objects.message_bytes(message), config=config
        ).out.strip()
        self._trees[oid] = tree
        return oid

    def _commit_here(
        self, tree: str, parents: Sequence[str], message: str, author: Author
    ) -> str | None:
        """The commit ``git commit-tree`` would write, written by the plugin (a git process
        less for every record, change and checkpoint): only when git would write exactly
        these bytes and the tree and parents are known to be a tree and commits, as git
        checks; None leaves it to git, which then writes it or says why it cannot."""
        committer = _git.committer()
        names = (*committer, author.name, author.email)
        parents = list(dict.fromkeys(parents))  # git drops a parent named twice, and says so
        if (
            not all(len(oid) == self._oid_length and is_oid(oid) for oid in (tree, *parents))
            or not all(objects.clean_identity(name) for name in names)
            or "\0" in message  # git refuses it
            or not objects.git_keeps(message)
            or not objects.writes_itself(self.common_dir, _git.sysconfdir())
        ):
            return None
        store = self.common_dir / "objects"
        if objects.kind_of(store, tree) != b"tree" or any(
            objects.kind_of(store, parent) != b"commit" for parent in parents
        ):
            return None
        when = objects.now()
        offset = objects.zone_offset(when)
        try:
            body = objects.commit_body(
                tree,
                parents,
                objects.identity(author.name, author.email, when, offset),
                objects.identity(*committer, when, offset),
                message,
            )
            return objects.write_loose(store, b"commit", body, self._oid_length)
        except (OSError, UnicodeError):
            return None

    def signer(self, commit: str, allowed_signers: Path) -> str | None:
        """Who signed ``commit``, as the allowed-signers file names them (git's SSH
        signatures); None when it is unsigned, or signed by a key the file does not name."""
        result = self._run(
            "verify-commit", "--end-of-options", commit, ok=(0, 1, 128),
            config=("gpg.format=ssh", f"gpg.ssh.allowedSignersFile={allowed_signers}"),
        )  # fmt: skip
        if result.returncode != 0:
            return None
        match = re.search(r'Good "git" signature for (\S+)', result.stderr)
        return match[1] if match else None

    def has_object(self, oid: str) -> bool:
        """Whether the object ``oid`` is in this repository (a fetch may not have brought it)."""
        return self._run("cat-file", "-e", f"{oid}^{{object}}", ok=(0, 1, 128)).returncode == 0

    def blob(self, oid: str) -> bytes:
        """The content of a blob that must exist (:class:`GitError` otherwise)."""
        return self._run("cat-file", "blob", oid).stdout

    def read_blob(self, spec: str) -> bytes | None:
        """The content of a blob (an id, or ``tree:path``), or None when there is none. A
        small blob named by its id is read from its object, without starting git."""
        found = self._object(spec) if is_oid(spec) else None
        if found is not None and found[0] == b"blob":
            return found[1]
        asked = self._run("cat-file", "blob", spec, ok=(0, 128))
        return asked.stdout if asked.returncode == 0 else None

    def blob_size(self, oid: str) -> int:
        return int(self._run("cat-file", "-s", oid).out.strip())

    def hash_blob(self, data: bytes) -> str:
        """Store ``data`` as a blob (no filters: the bytes as given); return its id."""
        return self._run("hash-object", "-w", "--stdin", input=data).out.strip()

    def blob_id(self, data: bytes) -> str:
        """The id ``data`` has as a blob; nothing is written."""
        return self._run("hash-object", "--stdin", input=data).out.strip()

    def hash_files(self, paths: Sequence[Path]) -> list[str]:
        """Store each file as a blob, byte for byte (no filters); return their ids in order."""
        if not paths:
            return []
        listing = "".join(f"{p}\n" for p in paths).encode("utf-8", "surrogateescape")
        return self._run(
            "hash-object", "-w", "--no-filters", "--stdin-paths", input=listing
        ).out.split()

    def empty_tree(self) -> str:
        """The empty tree, stored."""
        return self.mktree([])

    def mktree(self, entries: Sequence[TreeEntry]) -> str:
        """A tree of exactly ``entries`` (one level, no paths with ``/``); return its id."""
        listing = "".join(f"{e.mode} {e.kind} {e.oid}\t{e.path}\n" for e in entries)
        return self._run("mktree", input=listing.encode("utf-8", "surrogateescape")).out.strip()

    def pack(self, oids: Sequence[str], prefix: Path) -> None:
        """Write one pack holding exactly ``oids`` at ``prefix``-<hash>.pack (and its index)."""
        payload = "".join(f"{oid}\n" for oid in dict.fromkeys(oids)).encode("ascii")
        self._run("pack-objects", "-q", str(prefix), input=payload)

    # -- trees --------------------------------------------------------------------------

    def ls_tree(self, tree: str, *, trees: bool = False) -> list[TreeEntry]:
        """Every entry of ``tree`` at any depth; with ``trees``, the directories too."""
        args = ["ls-tree", "-r", "-z", "--full-tree"]
        if trees:
            args.append("-t")
        out = self._run(*args, "--end-of-options", tree).stdout
        return [_tree_entry(item) for item in _git.split_z(out)]

    def tree_paths(self, tree: str) -> list[str]:
        """The paths of every file (blob, link or gitlink) in ``tree``.

        Kept for the last few trees named by object id (an id always names the same tree):
        the judge lists the base's tree for every attempt made on it."""
        found = self._tree_paths.get(tree)
        if found is None:
            out = self._run("ls-tree", "-r", "-z", "--name-only", "--end-of-options", tree).stdout
            found = _git.split_z(out)
            _keep(self._tree_paths, tree, found)
        return list(found)

    def gitlinks(self, tree: str) -> frozenset[str]:
        """The paths of ``tree``'s gitlinks (submodules), kept per tree id."""
        found = self._gitlinks.get(tree)
        return self._list_whole(tree)[0] if found is None else found

    def has_attributes(self, tree: str) -> bool:
        """Whether ``tree`` holds a ``.gitattributes`` file at any depth, kept per tree id
        (listed with its gitlinks)."""
        found = self._attributed.get(tree)
        return self._list_whole(tree)[1] if found is None else found

    def _list_whole(self, tree: str) -> tuple[frozenset[str], bool]:
        """``tree``'s gitlinks, and whether it holds a ``.gitattributes``, from one listing
        of it; both kept per tree id."""
        entries = self.ls_tree(tree)
        gitlinks = frozenset(e.path for e in entries if e.mode == "160000")
        attributed = any(e.path.rpartition("/")[2] == ".gitattributes" for e in entries)
        _keep(self._gitlinks, tree, gitlinks)
        _keep(self._attributed, tree, attributed, size=64)
        return gitlinks, attributed

    def same_gitlinks(self, tree: str, like: str) -> None:
        """Note that ``tree`` holds exactly ``like``'s gitlinks, where those are known (a
        snapshot's tree and its base's: a snapshot never stages a gitlink), so asking for
        ``tree``'s starts no git process."""
        found = self._gitlinks.get(like)
        if found is not None:
            _keep(self._gitlinks, tree, found)

    def same_attributes(self, tree: str, like: str) -> None:
        """Note that ``tree`` holds a ``.gitattributes`` exactly when ``like`` does, where
        that is known (a tree made from ``like`` changing none)."""
        found = self._attributed.get(like)
        if found is not None:
            _keep(self._attributed, tree, found, size=64)

    def edited_tree(
        self, tree: str | None, edits: Mapping[str, tuple[str, str] | None]
    ) -> str | None:
        """``tree`` (None: an empty one) with each path of ``edits`` set to a (mode, object
        id) or removed (None), written by the plugin as ``write-tree`` would write it from an
        index given those edits (see :func:`.trees.edit`); None when it is git's to do."""
        if tree is not None and (len(tree) != self._oid_length or not is_oid(tree)):
            return None
        store = self.common_dir / "objects"

        def write(body: bytes) -> str:
            return objects.write_loose(store, b"tree", body, self._oid_length)

        try:
            return trees.edit(self._tree_here, write, tree, edits, self._oid_length)
        except OSError:
            return None  # git tries it, and says what is wrong (a full disk) if it fails too

    def write_blob(self, data: bytes) -> str:
        """Store ``data`` as a blob, byte for byte, as git writes a loose object; its id."""
        return objects.write_loose(self.common_dir / "objects", b"blob", data, self._oid_length)

    def blobs_here(self, root: Path, sizes: Mapping[str, int]) -> dict[str, tuple[str, str]] | None:
        """Each file at a path of ``sizes`` under ``root`` stored as the blob git would
        store (no filters), read no further than its size there: its (mode, id). None when
        one is git's to read (see :func:`.trees.file_blob`) or cannot be written (git then
        tries, and says what is wrong: a full disk)."""
        found = {}
        for rel, most in sizes.items():
            blob = trees.file_blob(root, rel, most)
            if blob is None:
                return None
            try:
                found[rel] = (blob[0], self.write_blob(blob[1]))
            except OSError:
                return None
        return found

    def tree_entry(self, tree: str, path: str) -> TreeEntry | None:
        """The entry at exactly ``path`` in ``tree`` (a literal path, no globbing), or None."""
        out = self._run("ls-tree", "-z", "--end-of-options", tree, "--", f":(literal){path}").stdout
        items = _git.split_z(out)
        if not items:
            return None
        entry = _tree_entry(items[0])
        return entry if entry.path == path else None

    def diff_tree(self, old: str, new: str, *, trees: bool = False) -> list[TreeChange]:
        """The paths that differ between two trees or commits, recursively, no renames.

        With ``trees``, the directories that differ are listed too (``is_tree``): with the
        blobs, exactly the objects ``new`` has that ``old`` lacks.

        The answer for two object ids is kept (with the last few others): a gated test asks
        for the same pair more than once (its snapshot, then the kept gate checkout that
        held its base), and ``-t`` answers both questions, the paths being its non-tree
        entries.
        """
        key = f"{old} {new}"
        found = self._diffs.get(key)
        if found is None:
            here = self._diff_here(old, new)
            found = here if here is not None else self._diff_tree(old, new)
            if is_oid(old) and is_oid(new):
                _keep(self._diffs, key, found, check=False)
        return list(found) if trees else [c for c in found if not c.is_tree]

    def _diff_here(self, old: str, new: str) -> list[TreeChange] | None:
        """``diff-tree -r -t`` between two trees or commits, read from their objects, loose
        or packed (every tree a snapshot or a merge just wrote is loose, and so, in a run, the tree
        each landing left on the target): the same changes in the same order, a git
        process less. None when an object it needs is git's to read, or when the walk takes
        longer than a ``diff-tree`` would (many changes, deep chains of deltas): the answer is
        the same either way, only its cost differs."""
        if not (is_oid(old) and is_oid(new)):
            return None
        roots = [self._commit_tree_here(oid) for oid in (old, new)]
        if roots[0] is None or roots[1] is None:
            return None
        changes: list[TreeChange] = []
        deadline = time.perf_counter() + _DIFF_HERE_S
        return changes if self._walk_trees(roots[0], roots[1], "", changes, deadline) else None

    def _tree_here(self, oid: str) -> dict[str, tuple[str, str, str]] | None:
        """A tree's entries by the key git orders them by (a tree's name with a slash), as
        (name, mode, id); None when it is git's to read."""
        found = self._object(oid)
        if found is None or found[0] != b"tree":
            return None
        entries = objects.tree_entries(found[1], self._oid_length)
        if entries is None:
            return None
        return {name + ("/" if mode == "040000" else ""): (name, mode, eid)
                for mode, name, eid in entries}  # fmt: skip

    def _walk_trees(
        self, old: str, new: str, prefix: str, out: list[TreeChange], deadline: float
    ) -> bool:
        """Add the changes between trees ``old`` and ``new`` (either may be absent: the
        null id) below ``prefix`` to ``out``, in git's order; False when one is git's to
        read, or the walk has taken as long as a git process would (a large difference)."""
        if time.perf_counter() > deadline:
            return False
        none = "0" * self._oid_length
        ours = {} if old == none else self._tree_here(old)
        theirs = {} if new == none else self._tree_here(new)
        if ours is None or theirs is None:
            return False
        for key in sorted(
            ours.keys() | theirs.keys(), key=lambda k: k.encode("utf-8", "surrogateescape")
        ):
            a, b = ours.get(key), theirs.get(key)
            if a == b:
                continue
            name, old_mode, old_oid = a or (key.rstrip("/"), "000000", none)
            new_mode, new_oid = (b or ("", "000000", none))[1:]
            status = "A" if a is None else "D" if b is None else "M"
            is_tree = key.endswith("/")
            if a and b and not is_tree and old_mode[:2] != new_mode[:2]:
                status = "T"  # a file, a link and a submodule's commit are three kinds
            path = prefix + name
            out.append(TreeChange(status, path, old_mode, new_mode, old_oid, new_oid))
            if is_tree and not self._walk_trees(old_oid, new_oid, path + "/", out, deadline):
                return False
        return True

    def _diff_tree(self, old: str, new: str) -> list[TreeChange]:
        raw = self._run(
            "diff-tree", "-r", "-z", "--no-renames", "-t", "--end-of-options", old, new
        ).stdout
        fields = raw.split(b"\0")
        changes = []
        # Records come in pairs, ":<meta>" then the path; a path may itself start with ":".
        for meta_raw, path_raw in zip(fields[0:-1:2], fields[1::2], strict=False):
            old_mode, new_mode, old_oid, new_oid, status = meta_raw[1:].decode("ascii").split(" ")
            changes.append(
                TreeChange(
                    status[0],
                    path_raw.decode("utf-8", "surrogateescape"),
                    old_mode,
                    new_mode,
                    old_oid,
                    new_oid,
                )
            )
        return changes

    def changed_lines(self, old: str, new: str) -> int:
        """Added plus deleted lines between two trees (a binary file counts as one line)."""
        out = self._run(
            "diff-tree", "-r", "--numstat", "--no-renames", "--end-of-options", old, new
        ).out
        total = 0
        for line in out.splitlines():
            added, deleted, _ = line.split("\t", 2)
            total += 1 if added == "-" else int(added) + int(deleted)
        return total

    # -- merges -------------------------------------------------------------------------

    def merge_preview(self, ours: str, theirs: str) -> MergePreview:
        """A real three-way merge of two commits (``git merge-tree --write-tree``).

        It writes the merged blobs and trees into the object store and moves no ref.
        """
        result = self._run(
            "merge-tree", "--write-tree", "--name-only", "-z", "--no-messages",
            "--end-of-options", ours, theirs,
            ok=(0, 1),
        )  # fmt: skip
        names = _git.split_z(result.stdout)
        if not names:
            raise GitError(["merge-tree"], result.returncode, result.stderr or "no output")
        conflicts = tuple(dict.fromkeys(names[1:])) if result.returncode == 1 else ()
        return MergePreview(names[0], conflicts)

    # -- what a move adds ---------------------------------------------------------------

    def count_new_objects(self, new: str, old: str | None) -> tuple[int, int]:
        """Objects, and bytes on disk, that commit ``new`` adds over ``old``.

        That is ``new`` itself and every tree and blob in its tree that is not in ``old``'s,
        found with ``diff-tree -t`` so the cost follows the change, not the repository (a
        ``rev-list --objects`` would walk all of ``old``'s trees). Without ``old``, every
        object of ``new`` not reachable from a ref is counted.
        """
        if old is None or not old.strip("0"):
            oids = self._run(
                "rev-list", "--objects", "--no-object-names", new, "--not", "--all"
            ).out.split()
        else:
            changed = {
                c.new_oid for c in self.diff_tree(old, new, trees=True) if c.new_oid.strip("0")
            }
            root = self.tree_of(new)
            oids = [new, *({root} - {self.tree_of(old)}), *sorted(changed)]
        return self.measure(oids)

    def measure(self, oids: Sequence[str]) -> tuple[int, int]:
        """How many objects, and their bytes on disk.

        New objects are loose: their size on disk is the file's. Packed ones (rare) are asked.
        """
        size, packed = 0, []
        for oid in oids:
            try:
                size += (self.common_dir / "objects" / oid[:2] / oid[2:]).stat().st_size
            except OSError:
                packed.append(oid)
        if packed:
            batch = ("\n".join(packed) + "\n").encode()
            out = self._run("cat-file", "--batch-check=%(objectsize:disk)", input=batch).out.split()
            size += sum(int(n) for n in out if n.isdigit())
        return len(oids), size

    def total_size(self, oids: Sequence[str]) -> int:
        """The bytes of ``oids`` as objects (a blob: its file's size), in one git process."""
        if not oids:
            return 0
        batch = ("\n".join(oids) + "\n").encode()
        out = self._run("cat-file", "--batch-check=%(objectsize)", input=batch).out.split()
        return sum(int(n) for n in out if n.isdigit())

    # -- refs ---------------------------------------------------------------------------

    # -- work trees ---------------------------------------------------------------------


def init(path: Path, branch: str) -> BaseRepo:
    """A new repository with a working tree at ``path``, on ``branch`` (no commits yet)."""
    _git.run(
        ["init", "-q", "-b", branch, "--end-of-options", str(path)],
        _git.NO_REPOSITORY,
        cwd=path.parent,
    )
    return BaseRepo(path / ".git", path)


def _tree_entry(item: str) -> TreeEntry:
    meta, _, path = item.partition("\t")
    mode, kind, oid = meta.split(" ")
    return TreeEntry(mode, kind, oid, path)


def _keep(cache: dict[str, T], tree: str, value: T, *, check: bool = True, size: int = 4) -> None:
    """Keep ``value`` for ``tree`` when that is an object id (an id always names the same
    tree), with the last ``size`` others (``check=False``: the caller made sure of the key)."""
    if not check or is_oid(tree):
        if len(cache) >= size:
            # Threads of one gate share the repository: another may evict at the same time.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                cache.pop(next(iter(cache)))
        cache[tree] = value
