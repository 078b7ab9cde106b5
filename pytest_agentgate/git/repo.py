"""The base repository as named git operations: names, objects, trees, merges and refs.

This module and :mod:`.index` (a work tree with its own index) and :mod:`.transport` (fetch
and push) are the git layer: the only code that builds a git command line. Each operation
owns its arguments and the parsing of what git printed, and returns a typed result; failures
are classified once, in :mod:`._git`. Refs only move through :meth:`BaseRepo.update_ref`,
which always passes the old value, so a lost race is reported as ``False`` and never
overwrites someone else's move.

Modelled on pip's ``vcs/git.py`` (one method per question asked of git) and dulwich's object
and ref containers (typed entries, not text), as ideas; the code is this project's own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadRefName, GitError, RepoNotFound, RevisionNotFound
from . import runner as _git

if TYPE_CHECKING:
    from .index import Index

ZERO = "0" * 40
_OID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
# Refs read from their files: shared ones (not per-worktree), plain names only.
_PLAIN_REF = re.compile(r"^refs/(heads|tags|remotes|agentgate)/[A-Za-z0-9._+@%/-]+$")
_ODD_REF = re.compile(r"(^|/)\.|\.\.|//|/$|\.lock(/|$)")


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
class LogEntry:
    """One commit of a first-parent history walk."""

    commit: str
    tree: str
    author: str
    subject: str


@dataclass(frozen=True)
class MergePreview:
    """The result of a three-way merge that moved no ref."""

    tree: str
    conflicts: tuple[str, ...]

    @property
    def clean(self) -> bool:
        return not self.conflicts


def check_branch_name(name: str, source: str = "") -> str:
    """Return ``name`` if git accepts it as a branch name, else raise :class:`BadRefName`."""
    if (
        not name
        or name.startswith("-")
        or any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in name)
    ):
        raise BadRefName(name, source)
    result = _git.run(
        ["check-ref-format", "--branch", name], git_dir=None, ok=(0, 1, 128), cwd=Path("/")
    )
    if result.returncode != 0:
        raise BadRefName(name, source)
    return name


class BaseRepo:
    """A repository the agents' work lands in (bare or with a working tree)."""

    def __init__(self, git_dir: Path, worktree: Path | None) -> None:
        self.git_dir = git_dir
        self.worktree = worktree
        #: Where objects, refs and the plugin's own files live: the git directory itself, or
        #: for a linked worktree (``git worktree add``) the main repository's.
        self.common_dir = _common_dir(git_dir)
        # commit -> tree; commits never change, so this cache is never stale.
        self._trees: dict[str, str] = {}
        self._no_filters: tuple[str, ...] | None = None
        #: A reftable repository keeps no ref files: every ref question goes to git.
        self._reftable = (self.common_dir / "reftable").is_dir()
        self._oid_length = 64 if _object_format(self.common_dir) == "sha256" else 40

    @classmethod
    def open(cls, path: str | Path, source: str = "", option: str = "") -> BaseRepo:
        """Find the repository at ``path`` (its top, a subdirectory, or a bare repository).

        Discovery is done by reading the filesystem, not by letting git search, so only a
        real ``.git`` directory is accepted: a ``.git`` *file* (a linked worktree or a
        submodule) is followed once, to a directory that must itself be a repository.
        """
        start = Path(path).expanduser()
        if not start.exists():
            raise RepoNotFound(path, source, option)
        start = start.resolve()
        for candidate in (start, *start.parents):
            dotgit = candidate / ".git"
            if dotgit.is_dir() and _looks_like_git_dir(dotgit):
                return cls(dotgit, candidate)
            if dotgit.is_file():
                target = _read_gitfile(dotgit)
                if target is not None and _looks_like_git_dir(target):
                    return cls(target, candidate)
            if _looks_like_git_dir(candidate) and (candidate / "config").is_file():
                return cls(candidate, None)
        raise RepoNotFound(path, source, option)

    # -- running git ------------------------------------------------------------------

    @property
    def null_oid(self) -> str:
        """The all-zero object id of this repository's object format (40 hex digits for
        sha1, 64 for sha256): what ``update-ref`` and a push's lease take for "none"."""
        return "0" * self._oid_length

    @property
    def bare(self) -> bool:
        return self.worktree is None

    @property
    def label(self) -> str:
        return str(self.worktree or self.git_dir)

    @property
    def private_dir(self) -> Path:
        """A directory inside the git directory that only the plugin writes."""
        path = self.common_dir / "agentgate"
        path.mkdir(exist_ok=True)
        return path

    def _run(
        self,
        *args: str,
        work_tree: Path | None = None,
        index: Path | None = None,
        env: Mapping[str, str] | None = None,
        input: bytes | None = None,
        ok: Sequence[int] = (0,),
        config: Sequence[str] = (),
    ) -> _git.GitResult:
        """Run git against this repository: for the git layer's own modules only."""
        # The user's own checkout keeps the user's filters; everything else runs none.
        filters = () if work_tree is not None and work_tree == self.worktree else self.no_filters()
        return _git.run(
            args,
            git_dir=self.git_dir,
            work_tree=work_tree,
            index=index,
            env=env,
            input=input,
            ok=ok,
            safe_directory=self.worktree or self.git_dir,
            config=(*filters, *config),
        )

    def no_filters(self) -> tuple[str, ...]:
        """``-c`` settings that switch off every configured filter and merge driver.

        Those programs come from trusted configuration, but *which* files they run on is
        chosen by ``.gitattributes``, which the agent writes. So in workspaces, gate
        checkouts and merges the plugin runs none: files are stored and checked out byte for
        byte (Git LFS pointers stay pointers, nothing is fetched), and a path whose
        attributes name a custom merge driver merges as a conflict. The user's own checkout
        keeps the user's filters (see :meth:`git`). Read once per repository.
        """
        if self._no_filters is None:
            out = _git.run(
                [
                    "config",
                    "--null",
                    "--get-regexp",
                    r"^(filter|merge)\..*\.(clean|smudge|process|required|driver)$",
                ],
                git_dir=self.git_dir,
                ok=(0, 1),
                safe_directory=self.worktree or self.git_dir,
            ).out
            keys = {item.split("\n", 1)[0] for item in out.split("\0") if item}
            filters = sorted(
                {k[len("filter.") :].rsplit(".", 1)[0] for k in keys if k.startswith("filter.")}
            )
            merges = sorted(
                {k[len("merge.") :].rsplit(".", 1)[0] for k in keys if k.startswith("merge.")}
            )
            self._no_filters = (
                *(
                    f"filter.{name}.{key}" + ("=false" if key == "required" else "=")
                    for name in filters
                    for key in ("clean", "smudge", "process", "required")
                ),
                *(f"merge.{name}.driver=false" for name in merges),
            )
        return self._no_filters

    # -- names --------------------------------------------------------------------------

    def resolve(self, rev: str) -> str | None:
        """The commit ``rev`` names, or None; never treats ``rev`` as an option."""
        result = self._run(
            "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
        )
        return result.out.strip() or None

    def resolve_commit(self, rev: str, source: str = "") -> str:
        """The commit ``rev`` names; :class:`RevisionNotFound` names the source otherwise."""
        if not rev or rev.startswith("-"):
            raise RevisionNotFound(rev, self.label, source)
        oid = self.resolve(rev)
        if oid is None:
            raise RevisionNotFound(rev, self.label, source)
        return oid

    def ref_value(self, ref: str) -> str | None:
        """What a full ref name points at, or None when it does not exist.

        A loose ref is read from its file, as git reads it (git replaces the file whole,
        by rename, so a reader never sees half of one): a git process less on every fork,
        preflight and record. Anything else (packed, symbolic, a reftable repository) is
        git's to answer.
        """
        found = self._loose_ref(ref)
        if found is not None:
            return found
        result = self._run("rev-parse", "--verify", "--quiet", "--end-of-options", ref, ok=(0, 1))
        return result.out.strip() or None

    def _loose_ref(self, ref: str) -> str | None:
        if self._reftable or not _PLAIN_REF.match(ref) or _ODD_REF.search(ref):
            return None
        try:
            fd = os.open(self.common_dir / ref, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, 100)
        except OSError:
            return None
        finally:
            os.close(fd)
        text = data.decode("ascii", "replace").strip()
        valid = data.endswith(b"\n") and is_oid(text) and len(text) == self._oid_length
        return text if valid else None

    def ref_names(self, prefix: str) -> list[str]:
        """The names of the refs under ``prefix`` (a folder: ends with ``/``), loose and
        packed, read from git's files; from ``for-each-ref`` in a reftable repository.

        For guesses that a compare-and-swap then checks (the next free attempt number): a
        ref created meanwhile only makes the swap fail and the guess move on.
        """
        parts = prefix.rstrip("/").split("/")
        if any(part in ("", ".", "..") or part.endswith(".lock") for part in parts):
            return []  # no ref has such a name: never a walk outside the refs
        if self._reftable or not prefix.endswith("/") or not _PLAIN_REF.match(prefix + "x"):
            return [row[0] for row in self.refs(prefix)]
        names: set[str] = set()
        for dirpath, _dirs, files in os.walk(self.common_dir / prefix):
            rel = Path(dirpath).relative_to(self.common_dir).as_posix()
            names.update(f"{rel}/{name}" for name in files if not name.endswith(".lock"))
        try:
            with open(self.common_dir / "packed-refs", "rb") as packed:
                for line in packed:
                    if line[:1] in (b"#", b"^"):
                        continue
                    name = line.rstrip(b"\n").partition(b" ")[2].decode("utf-8", "surrogateescape")
                    if name.startswith(prefix):
                        names.add(name)
        except OSError:
            pass
        return sorted(names)

    def tree_of(self, rev: str) -> str:
        """The tree of a commit (cached for full commit ids, which never change).

        A loose commit (every commit the plugin just wrote) is read from its object file:
        its first line names the tree. Anything else is asked of git.
        """
        cached = self._trees.get(rev)
        if cached is not None:
            return cached
        tree = self._loose_commit_tree(rev) if is_oid(rev) else None
        if tree is None:
            tree = self._run(
                "rev-parse", "--verify", "--end-of-options", f"{rev}^{{tree}}"
            ).out.strip()
        if is_oid(rev):
            self._trees[rev] = tree
        return tree

    def _loose_commit_tree(self, oid: str) -> str | None:
        """The tree of a loose commit object, read and checked against its id (as git's
        own reading would find a corrupt object), or None to ask git."""
        import hashlib
        import zlib

        if len(oid) != self._oid_length:
            return None
        try:
            with open(self.common_dir / "objects" / oid[:2] / oid[2:], "rb") as loose:
                raw = loose.read(1 << 16)
            whole = zlib.decompress(raw)
        except (OSError, zlib.error):
            return None
        if hashlib.new("sha256" if len(oid) == 64 else "sha1", whole).hexdigest() != oid:
            return None
        kind, _, rest = whole.partition(b" ")
        body = rest.partition(b"\0")[2]
        if kind != b"commit" or not body.startswith(b"tree "):
            return None
        tree = body[5:].partition(b"\n")[0].decode("ascii", "replace")
        return tree if is_oid(tree) else None

    def head_branch(self) -> str | None:
        """The branch HEAD points at (short name), or None when detached.

        HEAD is always a plain file in the git directory; reading it spares a git process on
        every promotion. Anything unusual in it is left to git to interpret.
        """
        try:
            text = (self.git_dir / "HEAD").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        if text.startswith("ref: refs/heads/") and "\n" not in text:
            return text[len("ref: refs/heads/") :]
        if is_oid(text):
            return None
        result = self._run("symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1))
        return result.out.strip() or None

    def last_reflog_entry(self, ref: str) -> tuple[str, str] | None:
        """The newest reflog entry of ``ref`` as (new id, message), read from its file."""
        try:
            with open(
                (self.git_dir if ref == "HEAD" else self.common_dir) / "logs" / ref, "rb"
            ) as log:
                log.seek(0, 2)
                log.seek(max(0, log.tell() - 4096))
                lines = log.read().splitlines()
        except OSError:
            return None
        if not lines:
            return None
        head, _, message = lines[-1].decode("utf-8", "replace").partition("\t")
        fields = head.split(" ")
        return (fields[1], message) if len(fields) > 1 else None

    def worktrees(self) -> list[Path]:
        """Every working tree of the repository (its own and each linked one)."""
        out = self._run("worktree", "list", "--porcelain", "-z", ok=(0, 128)).stdout
        return [
            Path(item[len("worktree ") :])
            for item in _git.split_z(out)
            if item.startswith("worktree ")
        ]

    def is_shallow(self) -> bool:
        return (self.common_dir / "shallow").exists()

    def refs(self, prefix: str, fmt: str = "%(refname)%00%(objectname)") -> list[list[str]]:
        """Rows of ``for-each-ref`` under ``prefix``, fields split on NUL."""
        out = self._run("for-each-ref", f"--format={fmt}", "--end-of-options", prefix).out
        return [line.split("\0") for line in out.splitlines() if line]

    def ref_records(self, prefix: str, fields: Sequence[str]) -> list[list[str]]:
        """``for-each-ref`` under ``prefix``, newest first: one list of ``fields`` per ref.

        Records are split on a byte no field holds, so a multi-line field (a commit's
        trailers) stays whole.
        """
        fmt = "%00".join(f"%({name})" for name in fields) + "%01"
        out = self._run(
            "for-each-ref", "--sort=-creatordate", f"--format={fmt}", "--end-of-options", prefix
        ).out
        rows = []
        for chunk in out.split("\x01"):
            parts = chunk.strip("\n").split("\0")
            if len(parts) >= len(fields):
                rows.append(parts[: len(fields)])
        return rows

    def branch_containing(self, commit: str, prefix: str = "refs/heads/") -> str | None:
        """A branch (its name below ``prefix``) whose history contains ``commit``, or None."""
        out = self._run(
            "for-each-ref", "--count=1", "--format=%(refname)", f"--contains={commit}",
            prefix, ok=(0, 129),
        ).out.strip()  # fmt: skip
        return out[len(prefix) :] if out else None

    def is_ancestor(self, commit: str, of: str) -> bool:
        """Whether ``commit`` is in the history of ``of`` (False when either is unknown)."""
        result = self._run("merge-base", "--is-ancestor", commit, of, ok=(0, 1, 128))
        return result.returncode == 0

    def first_parent_log(self, span: str) -> list[LogEntry]:
        """The commits of ``span`` (a revision or ``a..b``) along first parents, newest first."""
        out = self._run(
            "log", "--first-parent", "--format=%H%x00%T%x00%an%x00%s", "--end-of-options", span
        ).out
        return [LogEntry(*line.split("\0", 3)) for line in out.splitlines() if line]

    def merge_base(self, a: str, b: str) -> str | None:
        """A best common ancestor of ``a`` and ``b`` in the history present, or None."""
        out = self._run("merge-base", "--end-of-options", a, b, ok=(0, 1))
        return out.out.strip() or None

    def parents(self, commit: str) -> list[str]:
        """The parents of ``commit``, in order."""
        out = self._run("rev-list", "--parents", "-n", "1", "--end-of-options", commit).out
        return out.split()[1:]

    def show_commit(self, commit: str) -> str:
        """A commit as a person reads it: header, whole message, stat and patch (no colour,
        no external diff or text conversion: nothing of the repository's runs)."""
        return self._run(
            "show", "--no-color", "--no-ext-diff", "--no-textconv", "--stat", "--patch",
            "--format=commit %H%nAuthor: %an <%ae>%nDate:   %aI%n%n%w(0,4,4)%B",
            "--end-of-options", commit,
        ).out  # fmt: skip

    def config_value(self, key: str) -> str | None:
        """One value of the repository's configuration, or None when it is not set."""
        return self._run("config", "--get", key, ok=(0, 1)).out.strip() or None

    def remote_urls(self, remote: str) -> tuple[str, str]:
        """(fetch URL, push URL) of a configured remote, as git resolves them (``insteadOf``)."""
        fetch = self._run("remote", "get-url", "--end-of-options", remote).out.strip()
        push = self._run("remote", "get-url", "--push", "--end-of-options", remote).out.strip()
        return fetch, push

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
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        config: tuple[str, ...] = ()
        if signing_key is not None:
            args.append("-S")
            config = ("gpg.format=ssh", f"user.signingKey={signing_key}")
        oid = self._run(*args, env=author.env(), input=message.encode(), config=config).out.strip()
        self._trees[oid] = tree
        return oid

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
        """The content of a blob (an id, or ``tree:path``), or None when there is none."""
        found = self._run("cat-file", "blob", spec, ok=(0, 128))
        return found.stdout if found.returncode == 0 else None

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

    def commit_message(self, commit: str) -> str:
        """A commit's message, whole."""
        return self._run("cat-file", "commit", commit).out.split("\n\n", 1)[-1]

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
        """The paths of every file (blob, link or gitlink) in ``tree``."""
        out = self._run("ls-tree", "-r", "-z", "--name-only", "--end-of-options", tree).stdout
        return _git.split_z(out)

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
        """
        args = ["diff-tree", "-r", "-z", "--no-renames"]
        if trees:
            args.append("-t")
        raw = self._run(*args, "--end-of-options", old, new).stdout
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

    def first_parent_chain(self, rev: str, limit: int) -> list[tuple[str, list[str]]]:
        """Up to ``limit`` commits from ``rev`` back along first parents, each with its
        parents (one ``rev-list``)."""
        out = self._run(
            "rev-list", "--first-parent", "--parents", f"-n{limit}", "--end-of-options", rev
        ).out
        found = []
        for line in out.splitlines():
            commit, *parents = line.split()
            found.append((commit, parents))
        return found

    def is_commit(self, oid: str) -> bool:
        """Whether ``oid`` names a commit this repository has."""
        result = self._run("cat-file", "-t", "--end-of-options", oid, ok=(0, 1, 128))
        return result.returncode == 0 and result.out.strip() == "commit"

    def total_size(self, oids: Sequence[str]) -> int:
        """The bytes of ``oids`` as objects (a blob: its file's size), in one git process."""
        if not oids:
            return 0
        batch = ("\n".join(oids) + "\n").encode()
        out = self._run("cat-file", "--batch-check=%(objectsize)", input=batch).out.split()
        return sum(int(n) for n in out if n.isdigit())

    # -- refs ---------------------------------------------------------------------------

    def update_ref(
        self, ref: str, new: str, old: str | None, message: str, *, reflog: bool = False
    ) -> bool:
        """Move ``ref`` from ``old`` (None: must not exist) to ``new``; False if it moved.

        A stale lock raises :class:`StaleLock`; any other failure :class:`GitError`.
        """
        args = ["update-ref"]
        if reflog:
            args.append("--create-reflog")
        args += ["-m", message, "--end-of-options", ref, new, old or self.null_oid]
        result = self._run(*args, ok=(0, 1, 128))
        if result.returncode == 0:
            return True
        if _git.held_lock(result.stderr) is None and _git.lost_race(result.stderr):
            return False
        raise _git.failure(args, result.returncode, result.stderr)

    def delete_ref(self, ref: str, old: str, message: str = "agentgate prune") -> bool:
        """Delete ``ref`` if it is still at ``old``; False when it was not."""
        result = self._run(
            "update-ref", "-m", message, "-d", "--end-of-options", ref, old, ok=(0, 1, 128)
        )
        return result.returncode == 0

    def fsck(self) -> None:
        """Raise :class:`GitError` unless ``git fsck --strict`` finds the repository sound."""
        self._run("fsck", "--strict", "--no-progress")

    # -- work trees ---------------------------------------------------------------------

    def index(self, work_tree: Path | None, path: Path | None = None) -> Index:
        """``work_tree`` with the index at ``path`` (None: the repository's own index)."""
        from .index import Index

        return Index(self, work_tree, path)

    def checkout_index(self) -> Index:
        """The base repository's own checkout and index (the user's filters apply)."""
        return self.index(self.worktree)


def init(path: Path, branch: str) -> BaseRepo:
    """A new repository with a working tree at ``path``, on ``branch`` (no commits yet)."""
    _git.run(
        ["init", "-q", "-b", branch, "--end-of-options", str(path)], git_dir=None, cwd=path.parent
    )
    return BaseRepo(path / ".git", path)


def _object_format(common_dir: Path) -> str:
    """``sha1`` or ``sha256``, from the repository's own configuration file."""
    try:
        text = (common_dir / "config").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "sha1"
    found = re.search(r"(?im)^\s*objectformat\s*=\s*(\w+)", text)
    return found[1].lower() if found else "sha1"


def _tree_entry(item: str) -> TreeEntry:
    meta, _, path = item.partition("\t")
    mode, kind, oid = meta.split(" ")
    return TreeEntry(mode, kind, oid, path)


def _common_dir(git_dir: Path) -> Path:
    try:
        text = (git_dir / "commondir").read_text(encoding="utf-8").strip()
    except OSError:
        return git_dir
    common = Path(text)
    return (common if common.is_absolute() else git_dir / common).resolve()


def _looks_like_git_dir(path: Path) -> bool:
    if (path / "HEAD").is_file() and (path / "commondir").is_file():  # a linked worktree's
        common = _common_dir(path)
        return (common / "objects").is_dir() and (common / "refs").is_dir()
    return (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir()


def _read_gitfile(path: Path) -> Path | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("gitdir:"):
        return None
    target = Path(text[len("gitdir:") :].strip())
    if not target.is_absolute():
        target = path.parent / target
    return target.resolve()


def is_oid(text: str) -> bool:
    return bool(_OID.match(text))
