"""State that lives outside git's tracked files: captured with each attempt, restored on demand.

An agent's progress is not always in the code: a SQLite database it populated, an artifact it
built. Paths declared on the marker (``state=["data/app.db", "build/"]``) are captured after
the test body into a commit of their own under ``refs/agentgate/state/<slug>/<n>`` (the same
``<slug>/<n>`` as the attempt), whatever ``.gitignore`` says, so a later attempt can start from
them (``resume_from="latest"``) and a person can restore them (``agentgate restore``). A SQLite
database is copied through SQLite's backup API, so the capture is a consistent database even
if the agent left a connection or a write-ahead log open.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import AgentgateError, StateError
from ..git.index import IndexEntry
from ..git.repo import Author, BaseRepo
from ..store.state_refs import PREFIX, ref_for, write_ref

__all__ = ["PREFIX", "StateError", "StateTooLarge", "ref_for", "write_ref"]

SQLITE_MAGIC = b"SQLite format 3\x00"


class StateTooLarge(StateError):
    """Declared state holding more bytes than the run allows (``--agentgate-max-state-bytes``)."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        AgentgateError.__init__(
            self,
            f"the declared state holds {size:,} bytes, more than --agentgate-max-state-bytes "
            f"{limit:,}: declare less (exclude caches), or raise the limit",
        )
        self.path, self.reason = "", str(self)


#: Where a state path declared outside the workspace (``/var/lib/app/store.db``) lives in a
#: state commit: ``@abs/var/lib/app/store.db``. A workspace path never starts with ``@abs/``
#: (the marker refuses one that does).
ABS = "@abs"


def normalise(declared: str) -> str:
    """One spelling per declared path (``/x//y/./z/`` is ``/x/y/z``): every comparison of
    declared paths (overlap, locks, what a restore may write) is made on it."""
    folded = os.path.normpath(declared)
    return "/" + folded.lstrip("/") if declared.startswith("/") else folded


def tree_path(declared: str) -> str:
    """The path a declared state path has in a state commit."""
    path = normalise(declared)
    return f"{ABS}/{path.lstrip('/')}" if path.startswith("/") else path


def _files(root: Path, rel: str) -> Iterator[tuple[str, Path]]:
    """(path in the state tree, file on disk) under one declared path; links are not followed.

    ``rel`` is relative to the workspace ``root``, or absolute (outside every workspace)."""
    outside = rel.startswith("/")
    start = Path(rel) if outside else root / rel
    base, prefix = (Path("/"), f"{ABS}/") if outside else (root, "")
    if (
        not outside
        and not start.resolve().is_relative_to(root.resolve())
        and not start.is_symlink()
    ):
        raise StateError(rel, "is outside the workspace")
    if start.is_symlink() or start.is_file():
        yield tree_path(rel), start
        return
    if not start.is_dir():
        return  # not created (yet): nothing to carry
    for dirpath, dirnames, filenames in os.walk(start):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            path = Path(dirpath) / name
            yield prefix + str(path.relative_to(base)), path


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def _consistent_copy(path: Path, scratch: Path) -> Path:
    """A SQLite database as one consistent file (its WAL folded in); other files as they are."""
    if not _is_sqlite(path):
        return path
    copy = scratch / f"db-{len(list(scratch.iterdir()))}.sqlite"
    # As a URI whose path is percent-encoded: SQLite decodes %HH in URI paths, so a file
    # named "x%2F..%2F..%2Fsecret.db" would otherwise open another database on the host.
    source = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True)
    try:
        opened = _main_file(source)
        if opened is None or not os.path.samefile(opened, path):
            raise StateError(path, "SQLite opened another file than the one declared")
        target = sqlite3.connect(copy)
        with target:
            source.backup(target)
        target.close()
    finally:
        source.close()
    return copy


def _main_file(connection: sqlite3.Connection) -> str | None:
    """The file SQLite really opened for the main database."""
    for _seq, name, filename in connection.execute("PRAGMA database_list"):
        if name == "main":
            return str(filename) or None
    return None


@dataclass(frozen=True)
class Keep:
    """What of the declared state is kept: paths matching ``exclude`` (the secrets
    patterns) are left out; more than ``max_bytes`` in all is refused."""

    exclude: Sequence[str] = ()
    max_bytes: int | None = None


_KEEP_ALL = Keep()


def capture(
    repo: BaseRepo,
    root: Path,
    paths: Sequence[str],
    *,
    message: str,
    author: Author,
    parent: str | None = None,
    keep: Keep = _KEEP_ALL,
    skipped: list[str] | None = None,
) -> str | None:
    """Commit the declared state under ``root``; None when none of it exists.

    What ``keep`` leaves out is appended to ``skipped``.
    """
    from .snapshot import excluded_by

    exclude, max_bytes = keep.exclude, keep.max_bytes

    with tempfile.TemporaryDirectory(prefix="agentgate-state-") as tmp:
        scratch = Path(tmp) / "copies"
        scratch.mkdir()
        entries: list[tuple[str, str, Path]] = []  # (mode, tree path, file to hash or link)
        seen: set[str] = set()
        for rel in paths:
            for tree_path, path in _files(root, rel):
                if tree_path in seen:
                    continue
                seen.add(tree_path)
                if excluded_by(tree_path, exclude):
                    if skipped is not None:
                        skipped.append(tree_path)
                    continue
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    entries.append(("120000", tree_path, path))
                elif not stat.S_ISREG(info.st_mode):
                    continue  # a FIFO, socket or device is not state that can be carried
                else:
                    mode = "100755" if info.st_mode & stat.S_IXUSR else "100644"
                    entries.append((mode, tree_path, _consistent_copy(path, scratch)))
        if not entries:
            return None
        files = [e for e in entries if e[0] != "120000"]
        size = sum(p.lstat().st_size for _, _, p in files)
        if max_bytes is not None and size > max_bytes:
            raise StateTooLarge(size, max_bytes)
        oids = repo.hash_files([p for _, _, p in files])
        by_path = {str(p): oid for (_, _, p), oid in zip(files, oids, strict=True)}
        staged = []
        for mode, tree_path, path in entries:
            if mode == "120000":
                oid = repo.hash_blob(os.readlink(path).encode("utf-8", "surrogateescape"))
            else:
                oid = by_path[str(path)]
            staged.append(IndexEntry(mode, oid, tree_path))
        index = repo.index(None, Path(tmp) / "index")
        index.stage_entries(staged)
        tree = index.write_tree()
    return repo.commit_tree(tree, [parent] if parent else [], message, author)


def restore(
    repo: BaseRepo,
    commit: str,
    dest: Path | None,
    *,
    overwrite: bool,
    outside_root: Path | None = Path("/"),
    declared: Sequence[str] | None = None,
) -> list[str]:
    """Write the state files of ``commit`` under ``dest``; returns their paths.

    The state declared outside the workspace (``@abs/...``) goes to its own absolute path
    under ``outside_root`` (``/``; a person restoring elsewhere names another; None leaves
    it out), the rest under ``dest`` (None leaves it out). Without ``overwrite``, an
    existing file at any of those paths stops the restore before anything is written
    (nothing of the user's is replaced unasked). With ``declared``, a commit holding any
    path outside those is refused before anything is written.
    """
    names = repo.tree_paths(commit)
    if declared is not None:
        check_declared(names, declared)
    inside = [n for n in names if not n.startswith(f"{ABS}/")]
    outside = [n[len(ABS) + 1 :] for n in names if n.startswith(f"{ABS}/")]
    if outside_root is None:
        outside = []
    if dest is None:
        inside = []
    places = [dest / n for n in inside if dest] + [
        outside_root / n for n in outside if outside_root
    ]
    if not overwrite:
        present = [p for p in places if p.exists() or p.is_symlink()]
        if present:
            raise StateError(
                present[0],
                f"exists; {len(present)} file(s) would be overwritten (--force overwrites them)",
            )
    top = {e.path: e for e in repo.ls_tree(commit, trees=True) if "/" not in e.path}
    with tempfile.TemporaryDirectory(prefix="agentgate-state-") as tmp:
        if inside and dest is not None:
            dest.mkdir(parents=True, exist_ok=True)
            own = repo.mktree([e for name, e in top.items() if name != ABS])
            index = repo.index(dest, Path(tmp) / "index")
            index.read_tree(own)
            index.check_out_all(dest)
        if outside and outside_root is not None:
            # git writes no file through a symbolic link in a leading directory. The work
            # tree is a scratch folder: were it one holding the current directory (``/``),
            # git would check out only the entries under the current directory.
            index = repo.index(Path(tmp), Path(tmp) / "index-outside")
            index.read_tree(top[ABS].oid)
            index.check_out_all(outside_root)
    return [*inside, *(f"{ABS}/{n}" for n in outside)]


def _umask() -> int:
    """This process's umask, read without setting it (``os.umask`` sets it for every thread,
    and a file another thread made in between would get the wrong mode)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def not_exactly_capturable(declared: str, exclude: Sequence[str]) -> tuple[str, str] | None:
    """The first thing under an absolute declared path a capture would not hold exactly,
    and why, or None: a put-back empties the folder and writes back the capture, so each
    of these would be lost or changed by it. Checked before any agent works."""
    from .snapshot import excluded_by

    umask = _umask()
    file_modes = {0o666 & ~umask, 0o777 & ~umask}  # as git writes a file back
    folder_mode = 0o777 & ~umask
    top = Path(declared)
    if top.is_symlink() or not top.is_dir():
        walked: Iterator[tuple[str, list[str], list[str]]] = iter(
            [(str(top.parent), [], [top.name])]
        )
    else:
        walked = os.walk(top)
    for dirpath, dirnames, filenames in walked:
        here = Path(dirpath)
        if here != top and not dirnames and not filenames:
            return str(here), "is an empty folder (git keeps none: add a file to it, or remove it)"
        for name in dirnames:
            folder = here / name
            mode = folder.lstat().st_mode
            if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) != folder_mode:
                return str(folder), (
                    f"is a folder of mode {stat.S_IMODE(mode):o}: it would come back as "
                    f"{folder_mode:o} (chmod it, or declare the paths beside it)"
                )
        for name in [*filenames, *(d for d in dirnames if (here / d).is_symlink())]:
            path = here / name
            mode = path.lstat().st_mode
            if excluded_by(tree_path(str(path)), exclude):
                return str(path), (
                    "matches a secrets pattern (--agentgate-exclude): it is never captured, "
                    "so putting the state back would delete it (move it out of the declared "
                    "folder, or declare the paths beside it)"
                )
            if stat.S_ISLNK(mode):
                continue
            if not stat.S_ISREG(mode):
                return str(
                    path
                ), "is not a regular file (a FIFO, socket or device cannot be captured)"
            if stat.S_IMODE(mode) not in file_modes:
                return str(path), (
                    f"has mode {stat.S_IMODE(mode):o}: it would come back as "
                    f"{min(file_modes):o} or {max(file_modes):o} (chmod it, or move it out)"
                )
    return None


def put_back(repo: BaseRepo, commit: str | None, declared: Sequence[str]) -> None:
    """Make each declared path outside the workspace hold exactly what ``commit`` holds for
    it (nothing, when it held none): what an agent wrote there is removed (never through
    a link, read-only folders included), then the captured content is written.
    :class:`StateError` when that cannot be done."""
    from ..sandbox.removal import UnsafePath, empty_dir

    for path in (Path(p) for p in declared if p.startswith("/")):
        try:
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                os.unlink(path)
            elif path.is_dir():
                empty_dir(path)  # the folder itself stays: it is bound into the sandbox
        except (UnsafePath, OSError) as exc:
            raise StateError(
                path, f"cannot be put back to what it held before the test: {exc}"
            ) from exc
    if commit is not None:
        restore(repo, commit, None, overwrite=True, declared=declared)


def check_declared(names: Sequence[str], declared: Sequence[str]) -> None:
    """Refuse a state commit holding a path (of ``names``) outside the declared ones: what a
    restore writes must be exactly what the test declared, wherever the commit came from."""
    allowed = [tree_path(p).rstrip("/") for p in declared]
    for name in names:
        if not any(name == a or name.startswith(a + "/") for a in allowed):
            raise StateError(name, "is in the state to restore but is not a declared state path")


def overlapping(declared: Sequence[str]) -> tuple[str, str] | None:
    """Two declared paths of which one is inside the other (refused: putting one back
    would go through what an agent made of the other), or None."""
    norm = sorted({tree_path(p).rstrip("/") for p in declared})
    for outer in norm:
        for inner in norm:
            if inner != outer and inner.startswith(outer + "/"):
                return outer, inner
    return None
