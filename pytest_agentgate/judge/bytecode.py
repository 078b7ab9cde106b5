"""Bytecode for a gate command's modules, from bytes the plugin trusts.

Every gate command reads and writes bytecode in a folder of its own, made after its setup
steps ended (a ``.pyc`` a setup step or an earlier command left would run in place of the
source that lands). So each command compiled, and pytest assertion-rewrote, every module
again: at 50,000 tests that was most of a gate's time. Before a command starts, this module
writes into its folder the bytecode of the modules earlier commands imported, on conditions
that keep the tested bytes the landed bytes:

- a module of the checkout gets bytecode only where its blob is the one the run's trusted
  tree (the base it is judged against, already landed) holds at that path: bytecode the
  plugin compiled from that blob, or that a run of that very tree (its baseline) compiled,
  checked against its bytes, and given only to runs whose trusted tree it is (whose harness
  is the one that ran beside it);
- a module outside the checkout gets bytecode only where it lies in the Python environment
  the sandbox shows every command (less what it hides), is a file anyone may read, and was
  imported by a run of a trusted tree or by this process itself;
- each ``.pyc`` is a checked-hash one (PEP 552): Python and pytest (9.2 on; an older one
  rewrites test modules itself, as before) hash the source as they import it and compile
  it themselves when it differs, so bytecode can only ever stand for the bytes beside it.

What an attempt's run wrote is never read but for the names of its files, and those can
only choose among the modules above. All of this only saves time: anything that goes wrong
here (a full disk, a folder a command made odd) leaves the command to compile for itself.

Bytecode this process compiled itself from an environment file is the same for every engine
of the process (an orchestrator opens one a repository, a test suite one a test), so it is
kept once for all of them (:class:`_Compiled`). An engine's first command, before it learnt
anything of its own, is given those of them that gate commands imported and that this
process imported itself: about two thirds of a small suite's first run was compiling them.
Which modules an engine's commands import, and the bytecode a base's run wrote, stay that
engine's: nothing an attempt or a base of one repository chose reaches another's commands.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..sandbox.containment import TMP_INSIDE, Mounts
from .pycfiles import EnvFiles, Tags, checked, compiled, inside_any, mapped, names_in, pyc, read
from .pycfiles import write as _write

if TYPE_CHECKING:
    from ..git.repo import BaseRepo

#: Files that may switch pytest's assertion rewriting to another shape
#: (``enable_assertion_pass_hook``): those of a tree with these endings, wherever they are.
_CONFIG_ENDINGS = (".ini", ".cfg", ".toml")
_PASS_HOOK = b"enable_assertion_pass_hook"
#: The most modules remembered, of each kind.
_MOST = 20_000
#: The most bytes of bytecode kept in memory; past it, what is kept is dropped.
_MOST_KEPT = 512 << 20


class _Compiled:
    """The environment's bytecode this process compiled itself (from the bytes it read), for
    every :class:`Bytecode` of the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: (absolute path, modification time, size, inode, rewritten) -> the .pyc compiled
        #: here.
        self.kept: dict[tuple[object, ...], bytes] = {}
        self.kept_bytes = 0
        #: (absolute path, rewritten): modules of the environment some engine's command
        #: imported that this process imported itself.
        self.seen: set[tuple[str, bool]] = set()

    def remember(self, env: Iterable[tuple[str, bool]], ours: frozenset[str]) -> None:
        with self.lock:
            self.seen |= {name for name in env if name[0] in ours}

    def seed(self, ours: frozenset[str]) -> list[tuple[str, bool]]:
        """The modules an engine's first command is given before it learnt any of its own:
        those some command imported that this process imported itself (what one engine's
        runs chose shows another nothing beyond the modules this process loaded anyway)."""
        with self.lock:
            return sorted(name for name in self.seen if name[0] in ours)

    def get(self, key: tuple[object, ...]) -> bytes | None:
        with self.lock:
            return self.kept.get(key)

    def keep(self, key: tuple[object, ...], data: bytes) -> None:
        with self.lock:
            if self.kept_bytes + len(data) > _MOST_KEPT:
                self.kept.clear()
                self.kept_bytes = 0
            self.kept_bytes += len(data) - len(self.kept.get(key, b""))
            self.kept[key] = data


_COMPILED = _Compiled()


def _reset_after_fork() -> None:
    global _COMPILED
    _COMPILED = _Compiled()  # a child forked while a thread held the lock would wait forever


os.register_at_fork(after_in_child=_reset_after_fork)


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
        #: Compiled here: (blob id, rewritten), or (path, modification time, size,
        #: rewritten) -> the .pyc. Taken from a base's run: the same keys, after the tree
        #: whose run wrote it.
        self._kept: dict[tuple[object, ...], bytes] = {}
        self._kept_bytes = 0
        #: tree -> {path: blob id} of its ``.py`` files (the last few trees).
        self._listed: dict[str, dict[str, str]] = {}
        #: tree -> whether pytest's rewriting may take another shape there.
        self._hooked: dict[str, bool] = {}

    # -- before a command --------------------------------------------------------------

    def fill(
        self,
        folder: Path,
        checkout: Path,
        tree: str,
        trusted: str | None,
        env_roots: Sequence[str],
        rewrite: bool = True,
    ) -> int:
        """Write into ``folder`` (a fresh prefix) the bytecode of the modules commands
        imported that ``tree`` holds as ``trusted`` does, and of the environment's modules
        under ``env_roots`` (``rewrite``: test modules' rewritten bytecode too, unless the
        command may ask for another shape of it); return how many files were written."""
        if trusted is None:
            return 0
        with self._lock:
            local, env = sorted(self._local), sorted(self._env)
        if not env and not local:
            env = _COMPILED.seed(_loaded_files())
        rewrite = rewrite and not (self._hook(tree) or self._hook(trusted))
        written, made, env_files = 0, set[Path](), EnvFiles(env_roots)
        with contextlib.suppress(OSError):  # a full disk: the command compiles the rest
            mine, theirs = self._py_blobs(tree), self._py_blobs(trusted)
            for rel, rewritten in local:
                oid = mine.get(rel)
                if oid is None or theirs.get(rel) != oid or (rewritten and not rewrite):
                    continue
                source = checkout / rel
                data = self._take((trusted, oid, rewritten), (oid, rewritten), str(source))
                written += self._put(folder, source, rewritten, data, made)
            for path, rewritten in env:
                st = None if rewritten and not rewrite else env_files.stat(path)
                if st is None:
                    continue
                key = (path, st.st_mtime_ns, st.st_size, st.st_ino, rewritten)
                data = self._take((trusted, *key), key, path, environment=True)
                written += self._put(folder, Path(path), rewritten, data, made)
        return written

    def _put(
        self, folder: Path, source: Path, rewritten: bool, data: bytes | None, made: set[Path]
    ) -> int:
        tail = self._tags.rewritten if rewritten else self._tags.plain
        if data is None or tail is None:
            return 0
        _write(mapped(folder, source), source, tail, data, made)
        return 1

    def _take(
        self,
        adopted: tuple[object, ...],
        key: tuple[object, ...],
        path: str,
        *,
        environment: bool = False,
    ) -> bytes | None:
        """What a base's run compiled (``adopted``), else what was compiled here (``key``),
        else the file at ``path`` compiled now (its bytes the blob's: the checkout holds
        them, as the tamper check proves; a byte off and the command's Python compiles the
        file itself, since the hash differs). An ``environment`` file's, compiled here, is
        the process's (see :class:`_Compiled`)."""
        with self._lock:
            if adopted in self._kept:
                return self._kept[adopted]
            if key in self._kept:
                return self._kept[key]
        data = _COMPILED.get(key) if environment else None
        if data is not None:
            return data
        source = read(path)
        if source is None:
            return None
        code = compiled(source, path, bool(key[-1]))
        if code is None:
            return None  # off the main thread, or not Python: not kept, tried again later
        data = pyc(source, code)
        if environment:
            # Kept for the process only when the file did not change while it was read
            # (its bytes would be filed under the old stamp; the hash keeps them safe, but
            # every later command would compile the module itself).
            with contextlib.suppress(OSError):
                if (*_stamp(path), key[-1]) == key:
                    _COMPILED.keep(key, data)
        else:
            self._keep(key, data)
        return data

    def _keep(self, key: tuple[object, ...], data: bytes | None) -> None:
        if data is None:
            return
        with self._lock:
            if self._kept_bytes + len(data) > _MOST_KEPT:
                self._kept.clear()
                self._kept_bytes = 0
            self._kept[key] = data
            self._kept_bytes += len(data)

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
        configs = [p for p in self._repo.tree_paths(tree) if p.endswith(_CONFIG_ENDINGS)]
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
        tree: str,
        *,
        base_run: bool = False,
        env_roots: Sequence[str] = (),
    ) -> None:
        """Remember the modules a command in a checkout of ``tree`` imported, from the names
        of the ``.pyc`` files in its folder: modules of ``tree``; and of the environment,
        those this process imported itself, or (``base_run``) any a run of the trusted
        tree itself imported. Of a base's run (which left its tracked files as they were),
        the bytecode it compiled is taken too, checked against the bytes it stands for: as
        trusted as the base's code that ran beside it, and for runs judged by that base."""
        with contextlib.suppress(Exception):  # only ever a saving: never a failed gate
            self._learn(folder, checkout, tree, base_run, env_roots)

    def _learn(
        self, folder: Path, checkout: Path, tree: str, base_run: bool, roots: Sequence[str]
    ) -> None:
        inside = [str(mapped(folder, checkout / "x"))]
        real = Path(os.path.realpath(checkout))
        if real != checkout:
            inside.append(str(mapped(folder, real / "x")))
        mine, ours, env_files = self._py_blobs(tree), _loaded_files(), EnvFiles(roots)
        top = str(folder)
        local: dict[tuple[str, bool], str] = {}
        env: dict[tuple[str, bool], str] = {}
        for here, name in names_in(folder):
            found = self._tags.of(name)
            if found is None:
                continue
            module, rewritten = found
            root = next((r for r in inside if inside_any(here, [r])), None)
            if root is not None:
                rel = os.path.join(here[len(root) :].lstrip("/"), module)
                if rel in mine:
                    local[(rel, rewritten)] = os.path.join(here, name)
                continue
            path = os.path.join(here[len(top) :] or "/", module)
            if (base_run or path in ours) and env_files.stat(path) is not None:
                env[(path, rewritten)] = os.path.join(here, name)
        with self._lock:
            self._local |= set(list(local)[: max(0, _MOST - len(self._local))])
            self._env |= set(list(env)[: max(0, _MOST - len(self._env))])
        _COMPILED.remember(list(env)[:_MOST], ours)
        if not base_run:
            return
        for (rel, rewritten), written in local.items():
            self._keep((tree, mine[rel], rewritten), checked(read(written), str(checkout / rel)))
        for (path, rewritten), written in env.items():
            stamp = _stamp(path)
            self._keep((tree, *stamp, rewritten), checked(read(written), path))


def new_folder(mounts: Mounts, contained: bool) -> tuple[Path, Path]:
    """A new folder for the bytecode of the command ``mounts`` says what it sees of, in its
    own ``/tmp`` when ``contained``, else in its private folder: where it is here, and where
    the command sees it. Bytecode is read and written there, never in a ``__pycache__`` of
    the checkout, and the folder is made after the setup steps ended, under a name they
    could not guess: a ``.pyc`` one of them wrote (stamped with the source's time and size,
    or one that is never checked) would run in place of the source that lands."""
    name = f".agentgate-pycache-{secrets.token_hex(8)}"
    parent, seen_as = (mounts.tmp, TMP_INSIDE) if contained else (mounts.private, mounts.private)
    parent.mkdir(mode=0o700, exist_ok=True)
    (parent / name).mkdir(mode=0o700)
    return parent / name, seen_as / name


def _stamp(path: str) -> tuple[str, int, int, int]:
    """What stands for an environment file's bytes while they do not change: its path, time,
    size and inode (a file replaced by another of the same size in the same nanosecond
    differs in its inode)."""
    st = os.stat(path)
    return (path, st.st_mtime_ns, st.st_size, st.st_ino)


def _loaded_files() -> frozenset[str]:
    """The source files of the modules this process has imported."""
    return frozenset(
        f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)
    )


__all__ = ["Bytecode", "new_folder"]
