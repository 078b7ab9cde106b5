"""The results channel: how the pytest sessions of one gate command report to the plugin.

Each gate command gets a folder of its own holding a copy of the collector
(:mod:`pytest_agentgate.judge.collector`) and a listening Unix socket; the command's environment
names both, so every pytest it starts, however it is wrapped, loads the collector and
connects. The folder is read-only inside the sandbox, so nothing there can replace the
socket with one of its own. What a session sends is read into this process as it comes:
no file is left for anyone to rewrite, and no link is ever followed.

Any process of the command could connect and speak as a session, so a report is believed
only as a whole: every session must have ended (sent pytest's exit status), the sessions'
outcomes are merged worst first (a second session cannot turn a failure into a pass), and
the number of sessions, the configuration each read and the plugins each loaded must be
the base's (see :func:`unexpected`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import collector as _collector
from . import results

#: What the collector's module is called where the gate's Python finds it.
MODULE = _collector.NAME
CHANNEL_ENV = _collector.CHANNEL_ENV
#: The most a command's sessions may send (beyond, the report is refused, not cut).
MAX_BYTES = 64 << 20
#: Where a contained command sees the channel's folder: in the sandbox's read-only root, so
#: that nothing there can rename it, or a folder above it, out of the way.
INSIDE = Path("/run/agentgate")
#: How long the channel waits, once the command ended, for its sessions' last words.
_DRAIN_S = 2.0
_RANK = results.RANK
_OUTCOMES = frozenset(_RANK)
#: Rules whose lifting lets the tree's own configuration differ from the base's.
_CONFIG_RULES = frozenset(
    {
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini:[pytest]",
        "setup.cfg:[tool:pytest]",
        "pyproject.toml:[tool.pytest.ini_options]",
        "pyproject.toml:[tool.pytest]",
    }
)


@dataclass
class Session:
    """What one pytest process reported (nothing in it is trusted until it is judged)."""

    pid: int | None = None
    argv: tuple[str, ...] = ()
    rootdir: str = ""
    inifile: str = ""
    addopts: tuple[str, ...] = ()
    plugins: dict[str, tuple[str, ...]] = field(default_factory=dict)
    tests: dict[str, str] = field(default_factory=dict)
    exitstatus: int | None = None
    ended: bool = False
    #: Why part of what it sent could not be read (a broken line, too much, after its end).
    garbled: str = ""
    #: Why its interpreter cannot be trusted to report (the collector's own word).
    tainted: str = ""
    #: The test it began last and never finished ("" when none), named when it never ended.
    running: str = ""
    #: The files it could not collect, each with the first line of its error.
    collect_errors: dict[str, str] = field(default_factory=dict)
    #: The checkout's packages it imported from outside the checkout, and from where.
    shadowed: dict[str, str] = field(default_factory=dict)

    def read(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            self.garbled = self.garbled or "a line that is not JSON"
            return
        if not isinstance(message, dict):
            self.garbled = self.garbled or "a line that is not an object"
            return
        if self.ended:
            self.garbled = self.garbled or "lines after its end"
            return
        kind = message.get("kind")
        if kind == "hello":
            pid = message.get("pid")
            self.pid = pid if isinstance(pid, int) else None
            self.argv = tuple(str(a) for a in message.get("argv") or ())
            self.tainted = str(message.get("tainted") or "")
        elif kind == "config":
            self.rootdir = str(message.get("rootdir", ""))
            self.inifile = str(message.get("inifile", ""))
            self.addopts = tuple(str(a) for a in message.get("addopts") or ())
        elif kind == "test":
            test, outcome = message.get("id"), message.get("outcome")
            if isinstance(test, str) and test == self.running:
                self.running = ""
            if isinstance(test, str) and outcome in _OUTCOMES:
                # Worst first here too: a line sent again for a test (by code of the session's
                # own process) never turns its failure into a pass. (A test run again by
                # pytest-rerunfailures is reported once, by its last run.)
                known = self.tests.get(test)
                if known is None or _RANK[str(outcome)] > _RANK[known]:
                    self.tests[test] = str(outcome)
            else:
                self.garbled = self.garbled or "a test line without an id or outcome"
        elif kind == "start":
            test = message.get("id")
            self.running = test if isinstance(test, str) else ""
        elif kind == "collect_error":
            where, said = message.get("id"), message.get("line")
            if isinstance(where, str) and isinstance(said, str):
                self.collect_errors.setdefault(where, said[:300])
        elif kind == "shadowed":
            modules = message.get("modules")
            for name, where in modules.items() if isinstance(modules, dict) else ():
                if isinstance(where, str):
                    self.shadowed.setdefault(str(name)[:100], where[:300])
        elif kind == "plugins":
            for entry in message.get("plugins") or ():
                if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list):
                    self.plugins[str(entry[0])] = tuple(str(h) for h in entry[1])
        elif kind == "end":
            status = message.get("exitstatus")
            self.exitstatus = status if isinstance(status, int) else None
            self.ended = True

    @property
    def label(self) -> str:
        argv = " ".join(self.argv[:6]) or "?"
        return f"pytest (pid {self.pid or '?'}: {argv})"


@dataclass(frozen=True)
class Report:
    """The sessions of one command, merged."""

    sessions: tuple[Session, ...]

    @property
    def tests(self) -> dict[str, str]:
        """Each test's worst outcome over the sessions."""
        merged: dict[str, str] = {}
        for session in self.sessions:
            for test, outcome in session.tests.items():
                known = merged.get(test)
                if known is None or _RANK[outcome] > _RANK[known]:
                    merged[test] = outcome
        return merged

    @property
    def problem(self) -> str:
        """Why the report cannot be believed ("" when it can)."""
        count = len(self.sessions)
        for number, session in enumerate(self.sessions, 1):
            # Which of how many: a pid is the sandbox's own (2 in its PID namespace), no count.
            which = f"{session.label}" if count == 1 else f"{session.label}, {number} of {count}"
            if session.tainted:
                return f"the gate's {which} cannot report: {session.tainted}"
            if session.garbled:
                return f"the gate's {which} sent {session.garbled}"
            if not session.ended:
                running = session.running
                during = f" during {running}" if running else ""
                return (
                    f"the gate's {which} ended without reporting its end{during} (killed, or "
                    "it exited from inside a test): its results are incomplete"
                )
            if session.shadowed:
                name, where = next(iter(sorted(session.shadowed.items())))
                return (
                    f"the gate's {which} imported the package {name!r} from {where}, outside "
                    f"the checkout, not the checkout's own {name}/: an installed copy (or "
                    "another working copy's editable install) answered for the code under "
                    "test. Put the checkout first (a src layout: PYTHONPATH=src, or pytest's "
                    "-o pythonpath=src), or install the package from the checkout in the "
                    "gate's own environment (tox, nox); see docs/recipes.md"
                )
        return ""

    @property
    def collect_errors(self) -> dict[str, str]:
        """Each file a session could not collect, with the first line of its error."""
        found: dict[str, str] = {}
        for session in self.sessions:
            for where, line in session.collect_errors.items():
                found.setdefault(where, line)
        return found

    @property
    def statuses(self) -> list[int | None]:
        return [s.exitstatus for s in self.sessions]

    def fingerprint(self, index: int) -> frozenset[str]:
        """What must be the base's: the sessions, the configuration, the plugins' hooks."""
        found = {f"{index}|sessions|{len(self.sessions)}"}
        for session in self.sessions:
            found.add(f"{index}|ini|{session.inifile or '(none)'}")
            found.add(f"{index}|rootdir|{session.rootdir}")
            found.add(f"{index}|addopts|{' '.join(session.addopts)}")
            for name, hooks in session.plugins.items():
                found.update(f"{index}|plugin|{name}|{hook}" for hook in hooks)
                found.add(f"{index}|plugin|{name}|")
        return frozenset(found)


def unexpected(
    found: Iterable[str], expected: Iterable[str], rules: Sequence[str], subset: bool = False
) -> list[str]:
    """What of ``found`` (a fingerprint) the base's run did not have, and the plugins it had
    that ``found`` lacks, as sentences.

    Conftest files count only while their rule stands, the configuration only while every
    configuration rule does (a person who lifted one lets the tree's own differ). A
    ``subset`` session (it collects some of the tree's test modules) may lack plugins of the
    tree's files: a ``conftest.py`` of a folder it never enters, a module another test
    module names in ``pytest_plugins``; what it loads more still counts.
    """
    known, seen = set(expected), set(found)
    lifted_conftest = "conftest.py" not in rules
    lifted_config = not set(rules) >= _CONFIG_RULES
    said: dict[str, list[str]] = {}
    # What the base's run loaded and this one did not counts too: a session that never said
    # what it loaded, or a plugin gone, is not the base's harness either.
    for element in sorted(known - seen):
        _, kind, *rest = element.split("|")
        if subset and kind == "plugin" and _of_tree(rest[0]):
            continue
        if kind == "plugin" and not (lifted_conftest and rest[0].endswith("conftest.py")):
            what = rest[0].removeprefix("module ").removeprefix("object ")
            said.setdefault(f"no plugin {what}, which the base's run loaded", [])
    for element in sorted(seen - known):
        _, kind, *rest = element.split("|")
        if kind == "plugin":
            name, hook = rest[0], rest[1] if len(rest) > 1 else ""
            if lifted_conftest and name.startswith("module ") and name.endswith("conftest.py"):
                continue
            said.setdefault(f"plugin {name.removeprefix('module ').removeprefix('object ')}", [])
            if hook:
                said[f"plugin {name.removeprefix('module ').removeprefix('object ')}"].append(hook)
        elif kind in ("ini", "addopts", "rootdir"):
            if not lifted_config:
                said.setdefault(f"{kind} {rest[0] or '(none)'}", [])
        elif kind == "sessions":
            base = next((e.split("|")[2] for e in known if e.split("|")[1] == "sessions"), "?")
            said.setdefault(f"{rest[0]} pytest session(s) where the base's run had {base}", [])
    return [f"{what} ({', '.join(hooks)})" if hooks else what for what, hooks in said.items()]


def _of_tree(plugin: str) -> bool:
    """Whether a plugin's name (see :meth:`.collector._Session.identity`) is a file of the
    checkout: ``module tests/fixtures.py``, not ``module xdist.plugin`` or an object."""
    where = plugin.removeprefix("module ")
    return where != plugin and where.endswith(".py") and not where.startswith(("/", "../"))


class Channel:
    """One gate command's socket and the sessions that report on it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket_path = folder / "results.sock"
        # A name of this command's own: no tree can hold a module by that name where Python
        # looks before the collector's folder (a PYTHONPATH a Makefile or a script sets).
        self.module = f"{MODULE}_{secrets.token_hex(8)}"
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop_r, self._stop_w = -1, -1
        self._sessions: list[Session] = []
        self._total = 0

    def open(self) -> Channel:
        self.folder.mkdir(mode=0o755)
        shutil.copyfile(_collector.__file__, self.folder / f"{self.module}.py")
        os.chmod(self.folder / f"{self.module}.py", 0o444)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        where = os.open(self.folder, os.O_PATH | os.O_CLOEXEC)
        try:  # through the folder's descriptor: a socket's path is at most 108 bytes
            listener.bind(f"/proc/self/fd/{where}/{self.socket_path.name}")
        finally:
            os.close(where)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="agentgate-results", daemon=True)
        self._thread.start()
        return self

    def environment(
        self,
        would_have: Mapping[str, str],
        seen_at: Path | None = None,
        *,
        only: Sequence[str] | None = None,
        skip: Sequence[str] = (),
    ) -> dict[str, str]:
        """What the command's environment gets so that its pytest sessions report here:
        the collector first on the ``PYTHONPATH`` and in the ``PYTEST_PLUGINS`` the command
        would have had (``would_have``); ``seen_at`` is where the command sees the folder
        (a fixed, read-only place in the sandbox), when not at its own path. With ``only``,
        the sessions collect nothing but those files (or run nothing but those test ids);
        ``skip`` they never collect. The lists lie in the folder (paths relative to the
        checkout), never in a variable of unbounded length."""
        folder = seen_at or self.folder
        path = (str(folder), would_have.get("PYTHONPATH", ""))
        plugins = (self.module, would_have.get("PYTEST_PLUGINS", ""))
        found = {
            CHANNEL_ENV: str(folder / self.socket_path.name),
            "PYTEST_PLUGINS": ",".join(p for p in plugins if p),
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
        }
        if only is not None or skip:
            entries = [*(f"+{p}" for p in only or ()), *(f"-{p}" for p in skip)]
            listed = self.folder / _collector.SELECT_FILE
            listed.write_bytes(b"".join(os.fsencode(e) + b"\0" for e in entries))
            os.chmod(listed, 0o444)
            found[_collector.SELECT_ENV] = str(folder / _collector.SELECT_FILE)
        return found

    def close(self) -> Report:
        """Once the command ended: its sessions' last words, then the merged report."""
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join()
            self._thread = None
        for fd in (self._stop_r, self._stop_w):
            if fd >= 0:
                os.close(fd)
        self._stop_r = self._stop_w = -1
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        return Report(tuple(self._sessions))

    def _serve(self) -> None:
        assert self._listener is not None
        chosen = selectors.DefaultSelector()
        chosen.register(self._listener, selectors.EVENT_READ, None)
        chosen.register(self._stop_r, selectors.EVENT_READ, "stop")
        open_: dict[socket.socket, tuple[Session, bytearray]] = {}
        deadline: float | None = None
        try:
            while deadline is None or (open_ and time.monotonic() < deadline):
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                for key, _ in chosen.select(timeout):
                    if key.data == "stop":
                        chosen.unregister(self._stop_r)
                        deadline = time.monotonic() + _DRAIN_S
                    elif key.data is None:
                        self._accept(chosen, open_)
                    else:
                        self._receive(key.fileobj, chosen, open_)  # type: ignore[arg-type]
                if deadline is not None:
                    self._accept(chosen, open_)  # connections still in the backlog
        finally:
            for conn in list(open_):
                chosen.unregister(conn)
                conn.close()
            chosen.close()

    def _accept(
        self, chosen: selectors.BaseSelector, open_: dict[socket.socket, tuple[Session, bytearray]]
    ) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            session = Session()
            self._sessions.append(session)
            open_[conn] = (session, bytearray())
            chosen.register(conn, selectors.EVENT_READ, "conn")

    def _receive(
        self,
        conn: socket.socket,
        chosen: selectors.BaseSelector,
        open_: dict[socket.socket, tuple[Session, bytearray]],
    ) -> None:
        session, buffer = open_[conn]
        try:
            chunk = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        self._total += len(chunk)
        if self._total > MAX_BYTES:
            session.garbled = f"more than {MAX_BYTES >> 20} MiB"
            chunk = b""
        if not chunk:
            if buffer and not session.garbled:
                session.garbled = "a line cut short"
            chosen.unregister(conn)
            conn.close()
            del open_[conn]
            return
        buffer += chunk
        *lines, rest = bytes(buffer).split(b"\n")
        buffer[:] = rest
        for line in lines:
            if line.strip():
                session.read(line)
