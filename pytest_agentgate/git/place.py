"""Where a repository is and how git runs against it: the git directory, the working tree,
the common directory that holds objects and refs, the object format, and the one function
that starts git on the repository's behalf. :class:`~.repo.BaseRepo` holds a :class:`Place`
and gives the same one to its refs (:mod:`.refs`) and its history (:mod:`.history`), the
way dulwich's ``Repo`` is given its ref container and object store."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import RepoNotFound
from . import runner as _git


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


def find(path: str | Path, source: str = "", option: str = "") -> tuple[Path, Path | None]:
    """(git directory, working tree or None) of the repository at ``path``: its top, a
    subdirectory, or a bare repository.

    Discovery is done by reading the filesystem, not by letting git search, so only a real
    ``.git`` directory is accepted: a ``.git`` *file* (a linked worktree or a submodule) is
    followed once, to a directory that must itself be a repository.
    """
    start = Path(path).expanduser()
    if not start.exists():
        raise RepoNotFound(path, source, option)
    start = start.resolve()
    for candidate in (start, *start.parents):
        dotgit = candidate / ".git"
        if dotgit.is_dir() and _looks_like_git_dir(dotgit):
            return dotgit, candidate
        if dotgit.is_file():
            target = _read_gitfile(dotgit)
            if target is not None and _looks_like_git_dir(target):
                return target, candidate
        if _looks_like_git_dir(candidate) and (candidate / "config").is_file():
            return candidate, None
    raise RepoNotFound(path, source, option)


class Place:
    """A repository found on disk, and git run against it."""

    def __init__(self, git_dir: Path, worktree: Path | None) -> None:
        self.git_dir = git_dir
        self.worktree = worktree
        #: Where objects, refs and the plugin's own files live: the git directory itself, or
        #: for a linked worktree (``git worktree add``) the main repository's.
        self.common_dir = _common_dir(git_dir)
        #: A reftable repository keeps no ref files: every ref question goes to git.
        self.reftable = (self.common_dir / "reftable").is_dir()
        self.oid_length = 64 if _object_format(self.common_dir) == "sha256" else 40
        self.label = str(worktree or git_dir)
        self._no_filters: tuple[str, ...] | None = None

    @property
    def null_oid(self) -> str:
        """The all-zero object id of this repository's object format (40 hex digits for
        sha1, 64 for sha256): what ``update-ref`` and a push's lease take for "none"."""
        return "0" * self.oid_length

    @property
    def private_dir(self) -> Path:
        """A directory inside the git directory that only the plugin writes."""
        path = self.common_dir / "agentgate"
        path.mkdir(exist_ok=True)
        return path

    def run(
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
        keeps the user's filters (see :meth:`run`). Read once per repository.
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
        return self.run("config", "--get", key, ok=(0, 1)).out.strip() or None

    def remote_urls(self, remote: str) -> tuple[str, str]:
        """(fetch URL, push URL) of a configured remote, as git resolves them (``insteadOf``)."""
        fetch = self.run("remote", "get-url", "--end-of-options", remote).out.strip()
        push = self.run("remote", "get-url", "--push", "--end-of-options", remote).out.strip()
        return fetch, push

    def is_shallow(self) -> bool:
        return (self.common_dir / "shallow").exists()

    def fsck(self) -> None:
        """Raise :class:`GitError` unless ``git fsck --strict`` finds the repository sound."""
        self.run("fsck", "--strict", "--no-progress")

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
