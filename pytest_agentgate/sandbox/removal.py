"""Deleting the plugin's own directories without ever following a symlink.

An agent process that is still alive (or one that runs as another user) can swap a directory
for a symlink while the plugin deletes; a path-based delete would then follow the link and
remove files outside the workspace, with the plugin's rights. Every delete here walks from a
directory descriptor with ``O_NOFOLLOW``, removes entries with ``unlinkat``, and lets
``shutil.rmtree`` (descriptor-based on Linux, given ``dir_fd``) do the rest: a component that
is a symlink is removed as a link, never entered.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
from collections.abc import Iterable
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafePath(OSError):
    """A path component was a symlink or not a directory: nothing was deleted through it."""


def _open_dir(name: str, dir_fd: int | None) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (40, 20):  # ELOOP (a symlink), ENOTDIR
            raise UnsafePath(exc.errno, f"not a real directory: {name}") from exc
        raise


def remove_under(root: Path, rel: str) -> None:
    """Delete ``root/rel`` (a file, a symlink or a whole directory), walking from ``root``.

    Raises :class:`UnsafePath` when a component of ``rel`` is a symlink (nothing is deleted
    through it), ``FileNotFoundError`` when it is gone.
    """
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"not a path inside the tree: {rel!r}")
    fd = _open_dir(str(root), None)
    try:
        for part in parts[:-1]:
            inner = _open_dir(part, fd)
            os.close(fd)
            fd = inner
        _remove_entry(parts[-1], fd)
    finally:
        os.close(fd)


def _remove_entry(name: str, dir_fd: int) -> None:
    info = os.lstat(name, dir_fd=dir_fd)
    if stat.S_ISDIR(info.st_mode):
        try:
            shutil.rmtree(name, dir_fd=dir_fd)
        except RecursionError:
            _rm_deep(name, dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _rm_deep(name: str, dir_fd: int) -> None:
    """Delete a directory nested deeper than Python's recursion allows (``shutil.rmtree``
    recurses): with ``rm -rf``, which walks any depth by descriptor and follows no link,
    reaching the directory through this process's descriptor of its parent."""
    import subprocess

    subprocess.run(
        ["rm", "-rf", "--one-file-system", "--", f"/proc/self/fd/{dir_fd}/{name}"],
        pass_fds=(dir_fd,), check=False, capture_output=True,
    )  # fmt: skip
    if os.path.lexists(f"/proc/self/fd/{dir_fd}/{name}"):
        raise OSError(f"could not remove the deep directory {name}")


def remove_empty_dirs(root: Path, rels: Iterable[str]) -> None:
    """Remove each directory ``root/rel`` that is empty, deepest first, and each parent it
    leaves empty (as a checkout does for the paths it deletes). A directory that is not
    empty, or already gone, stays as it is; a component that is a symlink raises
    :class:`UnsafePath` (nothing is removed through it)."""
    wanted: set[tuple[str, ...]] = set()
    for rel in rels:
        parts = tuple(p for p in rel.split("/") if p not in ("", "."))
        if ".." in parts:
            raise ValueError(f"not a path inside the tree: {rel!r}")
        wanted.update(parts[:k] for k in range(1, len(parts) + 1))
    for parts in sorted(wanted, key=len, reverse=True):
        try:
            fd = _open_dir(str(root), None)
        except FileNotFoundError:
            return
        try:
            for part in parts[:-1]:
                inner = _open_dir(part, fd)
                os.close(fd)
                fd = inner
            os.rmdir(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (39, 20):  # ENOTEMPTY, ENOTDIR (a file now: not a dir's)
                raise
        finally:
            os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete the directory ``path`` and everything in it, following no symlink inside.

    ``path`` itself is opened from its parent with ``O_NOFOLLOW``: if it was replaced by a
    symlink, only the link goes. A path already gone is fine; other errors are ignored, as
    clean-up must never turn a verdict into a crash (what is left stays for a person).
    """
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        parent = _open_dir(str(path.parent), None)
        try:
            with contextlib.suppress(OSError):
                _remove_entry(path.name, parent)
        finally:
            os.close(parent)


class _Remover:
    """Deletes, one after another in a thread of its own, the directories a caller no longer
    needs and need not wait for: a gate's checkout is of no use once its command has ended,
    and deleting its files costs a gated test as much as checking them out did.

    The thread is not a daemon: the interpreter waits for it at exit, so a run that ends
    normally leaves nothing behind. A process killed meanwhile leaves what it had not
    deleted inside its private directory, which a later run's clean-up removes as before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queued: list[Path] = []
        self._busy = False

    def add(self, path: Path) -> None:
        with self._lock:
            self._queued.append(path)
            if self._busy:
                return
            self._busy = True
        try:
            threading.Thread(target=self._work, name="agentgate-removal").start()
        except RuntimeError:  # no thread to be had (interpreter exiting): do it here
            self._work()

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queued:
                    self._busy = False
                    self._idle.notify_all()
                    return
                path = self._queued.pop(0)
            with contextlib.suppress(Exception):  # never leave the queue stuck as busy
                remove_tree(path)

    def wait(self) -> None:
        with self._lock:
            while self._busy:
                self._idle.wait()


_remover = _Remover()


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: what the parent queued is the
    parent's to delete, and the child starts with a remover of its own (else one caught
    busy, or its lock held, would never finish)."""
    global _remover
    _remover = _Remover()


os.register_at_fork(after_in_child=_after_fork_in_child)


def remove_later(path: Path) -> None:
    """Delete ``path`` as :func:`remove_tree` does, but in the background: the caller goes
    on at once. Only for a directory nothing will use again (its processes ended, its name
    never handed out again); :func:`removals_done` waits for every such deletion."""
    _remover.add(path)


def removals_done() -> None:
    """Return once every deletion :func:`remove_later` was given has finished: before a
    directory that holds them is itself removed, or anything that expects them gone."""
    _remover.wait()


def empty_dir(path: Path) -> None:
    """Remove everything inside the directory ``path``, keeping it; raise when anything stays.

    For state the plugin puts back: nothing is followed (each directory is opened with
    ``O_NOFOLLOW`` from its parent's descriptor, so a link planted anywhere inside only goes
    itself), and a directory its writer made read-only is made writable first (a process of
    the same user can do that; the plugin then can too). Unlike :func:`remove_tree`, a
    failure is raised: state that could not be put back must not pass for put back.
    """
    fd = _open_dir(str(path), None)
    try:
        _purge(fd)
    finally:
        os.close(fd)


def _purge(dir_fd: int) -> None:
    if stat.S_IMODE(os.fstat(dir_fd).st_mode) & 0o700 != 0o700:
        os.fchmod(dir_fd, stat.S_IMODE(os.fstat(dir_fd).st_mode) | 0o700)
    with os.scandir(dir_fd) as entries:
        found = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in found:
        if is_dir:
            inner = _open_dir(name, dir_fd)
            try:
                _purge(inner)
            except RecursionError:  # deeper than Python recurses
                os.close(inner)
                inner = -1
                _rm_deep(name, dir_fd)
                continue
            finally:
                if inner >= 0:
                    os.close(inner)
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
