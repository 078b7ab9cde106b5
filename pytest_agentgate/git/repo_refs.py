"""The lower half of the repository's named operations: finding it, running git against it,
and its refs and history (what names what, what descends from what). Refs only move through
:meth:`RepoRefs.update_ref`, which always passes the old value, so a lost race is reported
as ``False`` and never overwrites someone else's move. :mod:`.repo` adds objects, trees and
merges."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self

from ..errors import BadRefName, RepoNotFound, RevisionNotFound
from . import objects, ref_files
from . import runner as _git
from .objects import is_oid

if TYPE_CHECKING:
    from .index import Index


ZERO = "0" * 40


_PLAIN_REF, _ODD_REF = ref_files.PLAIN_REF, ref_files.ODD_REF


@dataclass(frozen=True)
class LogEntry:
    """One commit of a first-parent history walk."""

    commit: str
    tree: str
    author: str
    subject: str


def check_branch_name(name: str, source: str = "") -> str:
    """Return ``name`` if git accepts it as a branch name, else raise :class:`BadRefName`."""
    if (
        not name
        or name.startswith("-")
        or any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in name)
    ):
        raise BadRefName(name, source)
    result = _git.run(
        ["check-ref-format", "--branch", name], _git.NO_REPOSITORY, ok=(0, 1, 128), cwd=Path("/")
    )
    if result.returncode != 0:
        raise BadRefName(name, source)
    return name


def _object_format(common_dir: Path) -> str:
    """``sha1`` or ``sha256``, from the repository's own configuration file."""
    try:
        text = (common_dir / "config").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "sha1"
    found = re.search(r"(?im)^\s*objectformat\s*=\s*(\w+)", text)
    return found[1].lower() if found else "sha1"


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


class RepoRefs:
    """A repository found on disk: git run against it, its refs and its history."""

    def __init__(self, git_dir: Path, worktree: Path | None) -> None:
        self.git_dir = git_dir
        self.worktree = worktree
        #: Where objects, refs and the plugin's own files live: the git directory itself, or
        #: for a linked worktree (``git worktree add``) the main repository's.
        self.common_dir = _common_dir(git_dir)
        # commit -> tree; commits never change, so this cache is never stale.
        self._trees: dict[str, str] = {}
        self._tree_paths: dict[str, list[str]] = {}
        self._gitlinks: dict[str, frozenset[str]] = {}
        self._no_filters: tuple[str, ...] | None = None
        #: A reftable repository keeps no ref files: every ref question goes to git.
        self._reftable = (self.common_dir / "reftable").is_dir()
        self._oid_length = 64 if _object_format(self.common_dir) == "sha256" else 40

    @classmethod
    def open(cls, path: str | Path, source: str = "", option: str = "") -> Self:
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
        on = _git.Repository(
            self.git_dir, work_tree, index, self.worktree or self.git_dir, (*filters, *config)
        )
        return _git.run(args, on, env=env, input=input, ok=ok)

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
                _git.Repository(self.git_dir, safe_directory=self.worktree or self.git_dir),
                ok=(0, 1),
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

    def config_value(self, key: str) -> str | None:
        """One value of the repository's configuration, or None when it is not set."""
        return self._run("config", "--get", key, ok=(0, 1)).out.strip() or None

    def remote_urls(self, remote: str) -> tuple[str, str]:
        """(fetch URL, push URL) of a configured remote, as git resolves them (``insteadOf``)."""
        fetch = self._run("remote", "get-url", "--end-of-options", remote).out.strip()
        push = self._run("remote", "get-url", "--push", "--end-of-options", remote).out.strip()
        return fetch, push

    def is_shallow(self) -> bool:
        return (self.common_dir / "shallow").exists()

    def fsck(self) -> None:
        """Raise :class:`GitError` unless ``git fsck --strict`` finds the repository sound."""
        self._run("fsck", "--strict", "--no-progress")

    def index(self, work_tree: Path | None, path: Path | None = None) -> Index:
        """``work_tree`` with the index at ``path`` (None: the repository's own index)."""
        from .index import Index

        return Index(self, work_tree, path)

    def checkout_index(self) -> Index:
        """The base repository's own checkout and index (the user's filters apply)."""
        return self.index(self.worktree)

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
        """Every working tree of the repository: its own and each linked one (``git worktree
        add``). Read where ``git worktree list`` reads them, without starting git: each linked
        one's ``<common-dir>/worktrees/<name>/gitdir`` names its ``.git`` file."""
        found = [self.worktree] if self.worktree is not None else []
        if self.common_dir.name == ".git":  # the main one, also seen from a linked one
            found.append(self.common_dir.parent)
        try:
            names = sorted(os.listdir(self.common_dir / "worktrees"))
        except OSError:
            names = []
        for name in names:
            try:
                text = (self.common_dir / "worktrees" / name / "gitdir").read_text("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if text.strip():
                found.append(Path(text.strip()).parent)
        return list(dict.fromkeys(found))

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

    def update_ref(
        self, ref: str, new: str, old: str | None, message: str, *, reflog: bool = False
    ) -> bool:
        """Move ``ref`` from ``old`` (None: must not exist) to ``new``; False if it moved.

        A stale lock raises :class:`StaleLock`; any other failure :class:`GitError`.
        """
        whole = not self._reftable and len(new) == self._oid_length
        if old is None and not reflog and whole:
            created = ref_files.create(self.common_dir, self.git_dir, ref, new, message)
            if created is not None:
                return created
        if old is not None and reflog and whole and len(old) == self._oid_length:
            by = self._reflog_identity()
            moved = by and ref_files.update(
                self.common_dir, self.git_dir, ref, new, old, message, by
            )
            if moved:
                return True
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

    @staticmethod
    def _reflog_identity() -> bytes:
        """Who moves a ref and when, as git writes it in a reflog line; empty when git
        would write the name otherwise (see :func:`.objects.clean_identity`)."""
        name, email = _git.committer()
        if not (objects.clean_identity(name) and objects.clean_identity(email)):
            return b""
        when = objects.now()
        try:
            return objects.identity(name, email, when, objects.zone_offset(when))
        except UnicodeEncodeError:
            return b""  # bytes that are not UTF-8: git's to write as they are

    def delete_ref(self, ref: str, old: str, message: str = "agentgate prune") -> bool:
        """Delete ``ref`` if it is still at ``old``; False when it was not."""
        result = self._run(
            "update-ref", "-m", message, "-d", "--end-of-options", ref, old, ok=(0, 1, 128)
        )
        return result.returncode == 0

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

    def first_parent_naming(self, span: str, text: str) -> list[str]:
        """The commits of ``span`` along first parents whose message holds ``text`` (a
        fixed string), newest first."""
        out = self._run(
            "log", "--first-parent", "--format=%H", "--fixed-strings", f"--grep={text}",
            "--end-of-options", span,
        ).out  # fmt: skip
        return out.split()

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

    def patch(self, old: str, new: str) -> str:
        """The patch from ``old`` to ``new`` (trees or commits), as git prints it, with
        nothing of the repository's run (no external diff, no text conversion)."""
        return self._run(
            "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--end-of-options", old, new
        ).out

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

    def commit_message(self, commit: str) -> str:
        """A commit's message, whole."""
        return self._run("cat-file", "commit", commit).out.split("\n\n", 1)[-1]
