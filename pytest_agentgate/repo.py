"""The base repository: resolving names, reading and writing objects, moving refs safely.

Refs only move through :meth:`BaseRepo.update_ref`, which always passes the old value, so a
lost race is reported as ``False`` and never overwrites someone else's move.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import _git
from .errors import BadRefName, GitError, RepoNotFound, RevisionNotFound, StaleLock

ZERO = "0" * 40
_OID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


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

    @classmethod
    def open(cls, path: str | Path, source: str = "") -> BaseRepo:
        """Find the repository at ``path`` (its top, a subdirectory, or a bare repository).

        Discovery is done by reading the filesystem, not by letting git search, so only a
        real ``.git`` directory is accepted: a ``.git`` *file* (a linked worktree or a
        submodule) is followed once, to a directory that must itself be a repository.
        """
        start = Path(path).expanduser()
        if not start.exists():
            raise RepoNotFound(path, source)
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
        raise RepoNotFound(path, source)

    # -- running git ------------------------------------------------------------------

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

    def git(
        self,
        *args: str,
        work_tree: Path | None = None,
        index: Path | None = None,
        env: Mapping[str, str] | None = None,
        input: bytes | None = None,
        ok: Sequence[int] = (0,),
    ) -> _git.GitResult:
        return _git.run(
            args,
            git_dir=self.git_dir,
            work_tree=work_tree,
            index=index,
            env=env,
            input=input,
            ok=ok,
            safe_directory=self.worktree or self.git_dir,
            # The user's own checkout keeps the user's filters; everything else runs none.
            config=()
            if work_tree is not None and work_tree == self.worktree
            else self.no_filters(),
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
        result = self.git(
            "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
        )
        return result.out.strip() or None

    def commit(self, rev: str, source: str = "") -> str:
        """The commit ``rev`` names; :class:`RevisionNotFound` names the source otherwise."""
        if not rev or rev.startswith("-"):
            raise RevisionNotFound(rev, self.label, source)
        oid = self.resolve(rev)
        if oid is None:
            raise RevisionNotFound(rev, self.label, source)
        return oid

    def ref_value(self, ref: str) -> str | None:
        """What a full ref name points at, or None when it does not exist."""
        result = self.git("rev-parse", "--verify", "--quiet", "--end-of-options", ref, ok=(0, 1))
        return result.out.strip() or None

    def tree_of(self, rev: str) -> str:
        """The tree of a commit (cached for full commit ids, which never change)."""
        cached = self._trees.get(rev)
        if cached is not None:
            return cached
        tree = self.git("rev-parse", "--verify", "--end-of-options", f"{rev}^{{tree}}").out.strip()
        if is_oid(rev):
            self._trees[rev] = tree
        return tree

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
        result = self.git("symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1))
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

    def is_shallow(self) -> bool:
        return (self.common_dir / "shallow").exists()

    def refs(self, prefix: str, fmt: str = "%(refname)%00%(objectname)") -> list[list[str]]:
        """Rows of ``for-each-ref`` under ``prefix``, fields split on NUL."""
        out = self.git("for-each-ref", f"--format={fmt}", "--end-of-options", prefix).out
        return [line.split("\0") for line in out.splitlines() if line]

    # -- objects ------------------------------------------------------------------------

    def commit_tree(self, tree: str, parents: Sequence[str], message: str, author: Author) -> str:
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        oid = self.git(*args, env=author.env(), input=message.encode()).out.strip()
        self._trees[oid] = tree
        return oid

    def merge_preview(self, ours: str, theirs: str) -> MergePreview:
        """A real three-way merge of two commits (``git merge-tree --write-tree``).

        It writes the merged blobs and trees into the object store and moves no ref.
        """
        result = self.git(
            "merge-tree", "--write-tree", "--name-only", "-z", "--no-messages",
            "--end-of-options", ours, theirs,
            ok=(0, 1),
        )  # fmt: skip
        names = _git.split_z(result.stdout)
        if not names:
            raise GitError(["merge-tree"], result.returncode, result.stderr or "no output")
        conflicts = tuple(dict.fromkeys(names[1:])) if result.returncode == 1 else ()
        return MergePreview(names[0], conflicts)

    def count_new_objects(self, new: str, old: str | None) -> tuple[int, int]:
        """Objects, and bytes on disk, that commit ``new`` adds over ``old``.

        That is ``new`` itself and every tree and blob in its tree that is not in ``old``'s,
        found with ``diff-tree -t`` so the cost follows the change, not the repository (a
        ``rev-list --objects`` would walk all of ``old``'s trees). Without ``old``, every
        object of ``new`` not reachable from a ref is counted.
        """
        if old is None or old == ZERO:
            oids = self.git(
                "rev-list", "--objects", "--no-object-names", new, "--not", "--all"
            ).out.split()
        else:
            raw = self.git(
                "diff-tree", "-r", "-t", "-z", "--no-renames", "--end-of-options", old, new
            ).stdout
            changed = set()
            # Records come in pairs, ":<meta>" then the path; a path may itself start with ":".
            for meta in raw.split(b"\0")[0:-1:2]:
                parts = meta.split(b" ")
                if len(parts) == 5 and parts[0].startswith(b":") and parts[3].strip(b"0"):
                    changed.add(parts[3].decode("ascii"))
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
            out = self.git("cat-file", "--batch-check=%(objectsize:disk)", input=batch).out.split()
            size += sum(int(n) for n in out if n.isdigit())
        return len(oids), size

    # -- refs ---------------------------------------------------------------------------

    def update_ref(
        self, ref: str, new: str, old: str | None, message: str, *, reflog: bool = False
    ) -> bool:
        """Move ``ref`` from ``old`` (None: must not exist) to ``new``; False if it moved."""
        args = ["update-ref"]
        if reflog:
            args.append("--create-reflog")
        args += ["-m", message, "--end-of-options", ref, new, old or ZERO]
        result = self.git(*args, ok=(0, 1, 128))
        if result.returncode == 0:
            return True
        stale = _git.LOCK_HELD.search(result.stderr)
        if stale:
            raise StaleLock(stale[1])
        if any(lost in result.stderr for lost in _LOST_RACE):
            return False
        raise GitError(args, result.returncode, result.stderr)

    def delete_ref(self, ref: str, old: str, message: str = "agentgate prune") -> bool:
        result = self.git(
            "update-ref", "-m", message, "-d", "--end-of-options", ref, old, ok=(0, 1, 128)
        )
        return result.returncode == 0


# How update-ref says the old value did not match: a lost race, not a failure.
_LOST_RACE = ("but expected", "reference already exists", "unable to resolve reference")


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
