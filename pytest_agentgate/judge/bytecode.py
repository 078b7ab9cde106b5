"""Bytecode for a gate command's modules, compiled by the plugin from bytes it trusts.

Every gate command reads and writes bytecode in a folder of its own, made after its setup
steps ended (a ``.pyc`` a setup step or an earlier command left would run in place of the
source that lands). So each command compiled, and pytest assertion-rewrote, every module
again: at 50,000 tests that was most of a gate's time. Before a command starts, this module
writes into its folder the bytecode of the modules earlier commands imported, on conditions
that keep the tested bytes the landed bytes:

- a module of the checkout gets bytecode only where its blob is the one the trusted tree (the
  base, already landed) holds at that path, compiled here from that blob, never taken from
  anything a command wrote;
- a module outside the checkout gets bytecode only where it lies in the Python environment
  the sandbox shows every command (``python_paths``) and in nothing it hides, compiled here
  from the file;
- each ``.pyc`` is a checked-hash one (PEP 552): Python and pytest hash the source as they
  import it and compile it themselves when it differs, so bytecode can only ever stand for
  the bytes beside it. (A pytest before 9.2 reads only its own timestamped ``.pyc`` for a
  rewritten module, so it rewrites those itself, as before.)

Which modules earlier commands imported is read from the names in their folders: names
only, which can choose among the modules above but never add to them.

A write that fails (a full disk) leaves no partial file and gives up for that command, which
then compiles what is missing itself, as before.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..git.repo import BaseRepo

#: A checked-hash pyc's flags (PEP 552): hash-based, and the source is checked.
_CHECKED_HASH = (0b11).to_bytes(4, "little")
#: Files that may switch pytest's assertion rewriting to another shape
#: (``enable_assertion_pass_hook``): their names, wherever they are in a tree.
_CONFIG_NAMES = frozenset(
    {"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
     "pyproject.toml"}
)  # fmt: skip
_PASS_HOOK = b"enable_assertion_pass_hook"
#: The most modules remembered, of each kind: learnt from names a command wrote.
_MOST = 50_000


def _rewriting() -> ModuleType | None:
    """pytest's assertion rewriting, when this process runs in pytest. The engine works
    without pytest: run from the command, it compiles no test module itself, and gives a
    command only the rewritten bytecode a run of the base wrote."""
    return sys.modules.get("_pytest.assertion.rewrite")


@dataclass(frozen=True)
class Tags:
    """The endings of the ``.pyc`` names this interpreter (and its pytest) read."""

    plain: str
    #: None: no pytest installed to rewrite test modules.
    rewritten: str | None

    @classmethod
    def here(cls) -> Tags:
        rewriting = _rewriting()
        tail = getattr(rewriting, "PYC_TAIL", None) if rewriting is not None else None
        if not isinstance(tail, str):  # as pytest names them, read without importing it
            from importlib.metadata import PackageNotFoundError, version

            try:
                ending = ".pyc" if __debug__ else ".pyo"
                tail = f".{sys.implementation.cache_tag}-pytest-{version('pytest')}{ending}"
            except PackageNotFoundError:
                tail = None
        return cls(f".{sys.implementation.cache_tag}.pyc", tail)

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
    return (
        importlib.util.MAGIC_NUMBER
        + _CHECKED_HASH
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def compiled(source: bytes, filename: str, rewritten: bool) -> CodeType | None:
    """``source`` compiled as the import system does, or as pytest's assertion rewriting
    does; None when it does not compile (the command will say why itself)."""
    import ast

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the command warns, as it would have
            if not rewritten:
                return compile(source, filename, "exec", dont_inherit=True)
            rewriting = _rewriting()
            if rewriting is None:
                return None
            tree = ast.parse(source, filename=filename)
            rewriting.rewrite_asserts(tree, source, filename, None)
            return compile(tree, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _inside_any(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class Bytecode:
    """What one run compiled, and which modules its gate commands import (see the module's
    docstring). Safe to use from the threads of commands run at once."""

    def __init__(self, repo: BaseRepo, tags: Tags | None = None) -> None:
        self._repo = repo
        self._tags = tags or Tags.here()
        self._lock = threading.Lock()
        #: Modules of checkouts commands imported: (path in the tree, rewritten).
        self._local: set[tuple[str, bool]] = set()
        #: Modules of the environment commands imported: (absolute path, rewritten).
        self._env: set[tuple[str, bool]] = set()
        #: (blob id, rewritten) -> the .pyc compiled from it (None: it does not compile).
        #: Python and pytest (9.2 on) correct the file name compiled in as they load it.
        self._blobs: dict[tuple[str, bool], bytes | None] = {}
        #: (path, modification time, size, rewritten) -> the .pyc (None: does not compile).
        self._files: dict[tuple[str, int, int, bool], bytes | None] = {}
        #: tree -> {path: blob id} of its ``.py`` files (the last few trees).
        self._listed: dict[str, dict[str, str]] = {}
        #: tree -> whether pytest's rewriting may take another shape there.
        self._hooked: dict[str, bool] = {}

    # -- before a command --------------------------------------------------------------

    def fill(
        self, folder: Path, checkout: Path, tree: str, trusted: str | None, env_roots: Sequence[str]
    ) -> int:
        """Write into ``folder`` (a fresh prefix) the bytecode of the modules commands
        imported that ``tree`` holds as ``trusted`` does, and of the environment's modules
        under ``env_roots``; return how many files were written."""
        with self._lock:
            local, env = sorted(self._local), sorted(self._env)
        if not local and not env:
            return 0
        written = 0
        try:
            if trusted is not None and local:
                written += self._fill_local(folder, checkout, tree, trusted, local)
            written += self._fill_env(folder, env, env_roots)
        except OSError:
            pass  # a full disk, say: the command compiles what is missing itself
        return written

    def _fill_local(
        self,
        folder: Path,
        checkout: Path,
        tree: str,
        trusted: str,
        wanted: Iterable[tuple[str, bool]],
    ) -> int:
        mine, theirs = self._py_blobs(tree), self._py_blobs(trusted)
        rewrite = not (self._hook(tree) or self._hook(trusted))
        written = 0
        for rel, rewritten in wanted:
            oid = mine.get(rel)
            if oid is None or theirs.get(rel) != oid or (rewritten and not rewrite):
                continue
            source_path = checkout / rel
            data = self._blob_pyc(oid, rewritten, str(source_path))
            if data is not None:
                _write(mapped(folder, source_path), source_path, self._tags, rewritten, data)
                written += 1
        return written

    def _fill_env(
        self, folder: Path, wanted: Iterable[tuple[str, bool]], roots: Sequence[str]
    ) -> int:
        written = 0
        for path, rewritten in wanted:
            # The name was learnt from what a command wrote: where it really leads decides.
            if not _inside_any(path, roots) or not _inside_any(os.path.realpath(path), roots):
                continue
            data = self._env_pyc(path, rewritten)
            if data is None:
                continue
            source_path = Path(path)
            _write(mapped(folder, source_path), source_path, self._tags, rewritten, data)
            written += 1
        return written

    def _blob_pyc(self, oid: str, rewritten: bool, filename: str) -> bytes | None:
        key = (oid, rewritten)
        with self._lock:
            if key in self._blobs:
                return self._blobs[key]
        source = self._repo.blob(oid)
        code = compiled(source, filename, rewritten)
        data = pyc(source, code) if code is not None else None
        with self._lock:
            self._blobs[key] = data
        return data

    def _env_pyc(self, path: str, rewritten: bool) -> bytes | None:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        if not os.path.isfile(path) or os.path.islink(path) or st.st_size > 8 << 20:
            return None
        key = (path, st.st_mtime_ns, st.st_size, rewritten)
        with self._lock:
            if key in self._files:
                return self._files[key]
        try:
            source = Path(path).read_bytes()
        except OSError:
            return None
        code = compiled(source, path, rewritten)
        data = pyc(source, code) if code is not None else None
        with self._lock:
            self._files[key] = data
        return data

    def _py_blobs(self, tree: str) -> dict[str, str]:
        with self._lock:
            found = self._listed.get(tree)
        if found is None:
            found = {
                e.path: e.oid
                for e in self._repo.ls_tree(tree)
                if e.kind == "blob" and not e.is_link and e.path.endswith(".py")
            }
            with self._lock:
                if len(self._listed) >= 8:
                    self._listed.pop(next(iter(self._listed)))
                self._listed[tree] = found
        return found

    def _hook(self, tree: str) -> bool:
        """Whether a configuration file of ``tree`` may ask pytest for its assertion pass
        hook (rewritten code then has another shape: none is written for that tree)."""
        with self._lock:
            if tree in self._hooked:
                return self._hooked[tree]
        configs = [p for p in self._repo.tree_paths(tree) if p.rpartition("/")[2] in _CONFIG_NAMES]
        hooked = len(configs) > 64 or any(
            _PASS_HOOK in (self._repo.read_blob(f"{tree}:{p}") or b"") for p in configs
        )
        with self._lock:
            self._hooked[tree] = hooked
        return hooked

    # -- after a command ---------------------------------------------------------------

    def learn(
        self,
        folder: Path,
        checkout: Path,
        *,
        base_run: str | None = None,
        env_roots: Sequence[str] = (),
    ) -> None:
        """Remember the modules a command imported: the names of the ``.pyc`` files in its
        folder, never their content, but for a run of the trusted tree itself
        (``base_run``, the base's own baseline, whose tracked files it left as they were):
        the bytecode it compiled from the base's bytes is as trusted as the base's code that
        ran beside it, and is kept (checked against those bytes) instead of compiled again."""
        roots = [str(mapped(folder, checkout / "x"))]
        real = Path(os.path.realpath(checkout))
        if real != checkout:
            roots.append(str(mapped(folder, real / "x")))
        local: dict[tuple[str, bool], str] = {}
        env: dict[tuple[str, bool], str] = {}
        top = str(folder)
        for here, dirs, files in os.walk(folder):  # never follows a link
            dirs.sort()
            for name in files:
                found = self._tags.of(name)
                if found is None:
                    continue
                module, rewritten = found
                inside = next((r for r in roots if _inside_any(here, [r])), None)
                if inside is not None:
                    rel = os.path.join(here[len(inside) :].lstrip("/"), module)
                    local[(rel, rewritten)] = os.path.join(here, name)
                else:
                    env[(os.path.join(here[len(top) :] or "/", module), rewritten)] = os.path.join(
                        here, name
                    )
                if len(local) + len(env) >= _MOST:
                    break
        with self._lock:
            if len(self._local) < _MOST:
                self._local |= set(local)
            if len(self._env) < _MOST:
                self._env |= set(env)
        if base_run is not None:
            self._adopt_local(local, checkout, base_run)
            self._adopt_env(env, env_roots)

    def _adopt_local(self, found: dict[tuple[str, bool], str], checkout: Path, tree: str) -> None:
        mine = self._py_blobs(tree)
        for (rel, rewritten), written in found.items():
            oid = mine.get(rel)
            if oid is None or (oid, rewritten) in self._blobs:
                continue
            data = _checked(_read(written), str(checkout / rel))
            if data is not None:
                with self._lock:
                    self._blobs[(oid, rewritten)] = data

    def _adopt_env(self, found: dict[tuple[str, bool], str], roots: Sequence[str]) -> None:
        for (path, rewritten), written in found.items():
            if not _inside_any(path, roots) or not _inside_any(os.path.realpath(path), roots):
                continue
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            data = _checked(_read(written), path)
            if data is not None:
                with self._lock:
                    self._files[(path, st.st_mtime_ns, st.st_size, rewritten)] = data


def _read(path: str, most: int = 8 << 20) -> bytes | None:
    """A file's bytes, never through a link, at most ``most`` of them (None: not so)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(most + 1)
    return data if len(data) <= most else None


def _checked(written: bytes | None, source_path: str) -> bytes | None:
    """The checked-hash ``.pyc`` of the file at ``source_path`` that a trusted run's
    ``.pyc`` (timestamped or hash-based) holds, or None when it is not one of this
    interpreter's, was compiled from other bytes (another hash, time or size), or holds no
    code."""
    source = _read(source_path)
    if written is None or source is None or written[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags, digest = written[4:8], importlib.util.source_hash(source)
    if flags == _CHECKED_HASH:
        if written[8:16] != digest:
            return None
    elif flags == b"\0\0\0\0":
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
    return importlib.util.MAGIC_NUMBER + _CHECKED_HASH + digest + written[16:]


def _write(where: Path, source: Path, tags: Tags, rewritten: bool, data: bytes) -> None:
    """One ``.pyc`` for ``source`` in its prefix folder ``where``, whole or not at all."""
    where.mkdir(parents=True, exist_ok=True)
    stem = source.name[: -len(".py")]
    target = where / (stem + ((tags.rewritten or "") if rewritten else tags.plain))
    try:
        with open(target, "xb") as out:
            out.write(data)
    except FileExistsError:
        return  # written for this command already (a path named twice)
    except OSError:
        target.unlink(missing_ok=True)
        raise


def env_roots(visible: Iterable[Path], hidden: Iterable[Path]) -> list[str]:
    """The folders whose modules may get bytecode: the Python environment every command
    sees, less what the sandbox hides. A folder that holds a hidden one is left out whole
    (rare: an environment inside the project's own tree), never shown with a hole."""
    masked = [os.path.realpath(p) for p in hidden]
    return [
        p
        for p in dict.fromkeys(os.path.realpath(v) for v in visible)
        if not _inside_any(p, masked) and not any(_inside_any(m, [p]) for m in masked)
    ]


__all__ = ["Bytecode", "Tags", "compiled", "env_roots", "mapped", "pyc"]
