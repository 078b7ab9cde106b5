"""Bytecode files one at a time: their names, where a prefix folder holds them, what they
hold (checked-hash ``.pyc``, PEP 552), compiling a source as the import system or pytest's
assertion rewriting does, checking one a trusted run wrote, and reading the names in a
folder a command wrote. The policy of which to give a command is :mod:`.bytecode`'s."""

from __future__ import annotations

import ast
import importlib.util
import marshal
import os
import stat
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType

#: A checked-hash pyc's flags (PEP 552): hash-based, and the source is checked.
CHECKED_HASH = (0b11).to_bytes(4, "little")
_TIMESTAMPED = bytes(4)
#: The largest source (or .pyc) read.
MOST_BYTES = 8 << 20


def rewriting() -> ModuleType | None:
    """pytest's assertion rewriting, to compile a test module as the gate's pytest does
    (None: no pytest here). Imported only when a test module is compiled, never when the
    plugin or the command loads: the contracts that keep the engine free of pytest name
    this one import."""
    found = sys.modules.get("_pytest.assertion.rewrite")
    if found is None:
        try:
            import _pytest.assertion.rewrite as found
        except ImportError:
            return None
    return found


@dataclass(frozen=True)
class Tags:
    """The endings of the ``.pyc`` names a gate command's Python (and pytest) read: a
    command runs without ``-O``, whatever this process runs with."""

    plain: str
    #: None: no pytest installed to rewrite test modules.
    rewritten: str | None

    @classmethod
    def here(cls) -> Tags:
        loaded = sys.modules.get("_pytest._version")
        found = getattr(loaded, "version", None) if loaded is not None else None
        if not isinstance(found, str):  # read without importing pytest
            from importlib.metadata import PackageNotFoundError, version

            try:
                found = version("pytest")
            except PackageNotFoundError:
                found = None
        tag = sys.implementation.cache_tag
        return cls(f".{tag}.pyc", f".{tag}-pytest-{found}.pyc" if found else None)

    def of(self, name: str) -> tuple[str, bool] | None:
        """(module file name, rewritten) for a ``.pyc`` name, None for any other."""
        for tail, rewritten in ((self.rewritten, True), (self.plain, False)):
            if tail and name.endswith(tail) and len(name) > len(tail):
                return name[: -len(tail)] + ".py", rewritten
        return None


def mapped(folder: Path, source: Path) -> Path:
    """Where Python (and pytest) look for ``source``'s bytecode under the prefix ``folder``:
    the source's folder, made relative to ``/``, below it."""
    return folder.joinpath(*source.parts[1:-1])


def pyc(source: bytes, code: CodeType) -> bytes:
    """A checked-hash ``.pyc`` of ``code`` compiled from ``source``."""
    digest = importlib.util.source_hash(source)
    return importlib.util.MAGIC_NUMBER + CHECKED_HASH + digest + marshal.dumps(code)


def compiled(source: bytes, filename: str, rewritten: bool) -> CodeType | None:
    """``source`` compiled as a gate command's import system does (no ``-O``, whatever this
    process runs with), or as its pytest's assertion rewriting does; None when it does not
    compile (the command will say why itself), and off the main thread: the warnings a
    compile raises are silenced by changing the process's warning filters, which only the
    main thread may do while pytest runs there."""
    if threading.current_thread() is not threading.main_thread():
        return None
    rewriter = rewriting() if rewritten else None
    if rewritten and rewriter is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the command warns, as it would have
            if rewriter is None:
                return compile(source, filename, "exec", dont_inherit=True, optimize=0)
            tree = ast.parse(source, filename=filename)
            rewriter.rewrite_asserts(tree, source, filename, None)
            return compile(tree, filename, "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def read(path: str) -> bytes | None:
    """A file's bytes, never through a link, at most :data:`MOST_BYTES` (None: not so)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MOST_BYTES + 1)
    return data if len(data) <= MOST_BYTES else None


def checked(written: bytes | None, source_path: str) -> bytes | None:
    """The checked-hash ``.pyc`` of the file at ``source_path`` that a trusted run's
    ``.pyc`` (timestamped or hash-based) holds, or None when it is not one of this
    interpreter's, was compiled from other bytes (another hash, time or size), or holds no
    code."""
    source = read(source_path)
    if written is None or source is None or written[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags, digest = written[4:8], importlib.util.source_hash(source)
    if flags == CHECKED_HASH:
        if written[8:16] != digest:
            return None
    elif flags == _TIMESTAMPED:
        try:
            st = os.stat(source_path, follow_symlinks=False)
        except OSError:
            return None
        stamp = (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
        if written[8:16] != stamp + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little"):
            return None
    else:
        return None
    try:
        code = marshal.loads(written[16:])
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(code, CodeType):
        return None
    return importlib.util.MAGIC_NUMBER + CHECKED_HASH + digest + written[16:]


def write(where: Path, source: Path, tail: str, data: bytes, made: set[Path]) -> None:
    """One ``.pyc`` for ``source`` in its prefix folder ``where``, whole or not at all: a
    truncated one would make the import fail rather than compile the source. ``made``: the
    folders this fill made already (each is made once)."""
    if where not in made:
        where.mkdir(parents=True, exist_ok=True)
        made.add(where)
    target = where / (source.name[: -len(".py")] + tail)
    try:
        with open(target, "xb") as out:
            out.write(data)
    except FileExistsError:
        return  # written for this command already (a path named twice)
    except OSError:
        target.unlink(missing_ok=True)
        raise


def names_in(folder: Path, *, deepest: int = 64, most: int = 60_000) -> Iterator[tuple[str, str]]:
    """(folder, file name) of each file below ``folder``, which a command wrote: never
    through a link (``folder`` itself included), at most ``deepest`` folders down and
    ``most`` entries read in all, without recursion."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return
    except OSError:
        return
    stack, seen = [(str(folder), 0)], 0
    while stack:
        here, depth = stack.pop()
        try:
            with os.scandir(here) as listing:
                entries = list(listing)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > most:
                return
            if entry.is_dir(follow_symlinks=False):
                if depth < deepest:
                    stack.append((entry.path, depth + 1))
            elif entry.is_file(follow_symlinks=False):
                yield here, entry.name


class EnvFiles:
    """Which files of the environment's ``roots`` a gate command may get bytecode for: a
    file inside them as named and where it really leads, which the command could read
    itself. It runs as this user with no capability (none to pass over a file's mode, as
    this process may), so by the file's mode bits and every folder's above it, for this user
    and its groups.

    One is made for each fill or learning of a prefix folder, which asks of a few hundred
    files in a few dozen folders: where a folder leads, and whether it and those above it
    may be passed, is found once for that call, not with ten or more ``stat`` calls a file."""

    def __init__(self, roots: Sequence[str]) -> None:
        self._roots = roots
        self._uid, self._gids = os.geteuid(), {os.getegid(), *os.getgroups()}
        #: folder -> where it really leads (None: it cannot be resolved or passed).
        self._real: dict[str, str | None] = {}
        #: folder -> whether it and every folder above it may be passed.
        self._passable: dict[str, bool] = {"": True}

    def _allowed(self, st: os.stat_result, bit: int) -> bool:
        shift = 6 if st.st_uid == self._uid else 3 if st.st_gid in self._gids else 0
        return bool(st.st_mode & (bit << shift))

    def _may_pass(self, folder: str) -> bool:
        """Whether ``folder`` and every folder above it may be passed ("/" is not asked)."""
        unknown: list[str] = []
        while folder not in self._passable and os.path.dirname(folder) != folder:
            unknown.append(folder)
            folder = os.path.dirname(folder)
        found = self._passable.get(folder, True)
        for below in reversed(unknown):
            if found:
                try:
                    found = self._allowed(os.stat(below), 1)
                except OSError:
                    found = False
            self._passable[below] = found
        return found

    def stat(self, path: str) -> os.stat_result | None:
        """The file's own ``lstat`` when a command may get bytecode for it, else None."""
        if not inside_any(path, self._roots):
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or not self._allowed(st, 4) or st.st_size > MOST_BYTES:
            return None
        folder, name = os.path.split(path)
        if folder not in self._real:
            real = os.path.realpath(folder) if self._may_pass(folder) else None
            # A folder reached through a link is passed through where it leads as well.
            self._real[folder] = real if real is not None and self._may_pass(real) else None
        real = self._real[folder]
        # The file itself is no link (its lstat says so): it leads where its folder does.
        if real is None or not inside_any(os.path.join(real, name), self._roots):
            return None
        return st


def inside_any(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def env_roots(
    visible: Iterable[Path], hidden: Iterable[Path], masked: Iterable[Path] = ()
) -> list[str]:
    """The folders whose modules may get bytecode: the Python environment every command
    sees, less what the sandbox hides (``hidden``; ``masked``: folders the sandbox masks but
    shows the Python environment inside again, such as ``$HOME``). A folder that holds a
    hidden or masked one is left out whole (rare: an environment inside the project's own
    tree), never shown with a hole."""
    gone = [os.path.realpath(p) for p in hidden]
    over = [*gone, *(os.path.realpath(p) for p in masked)]
    return [
        p
        for p in dict.fromkeys(os.path.realpath(v) for v in visible)
        if not inside_any(p, gone) and not any(inside_any(m, [p]) for m in over)
    ]
