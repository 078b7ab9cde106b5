"""The results collector: a pytest plugin that every pytest a gate command starts loads.

The plugin copies this file, alone, into a read-only directory of each gate command and names
it in the environment (``PYTEST_PLUGINS`` and ``PYTHONPATH``), so that a pytest started under
any wrapper that keeps the environment (``env``, ``sh -c``, ``make``, ``uv run``, ``tox`` with
``pass_env``) loads it, before the tree's own configuration, conftest files or modules.

It imports only the standard library and pytest (it runs in the gate's interpreter, which may
not have this package), connects to the plugin's socket as it is imported, and sends one JSON
object a line: who it is, the configuration pytest used, every plugin registered with the
hooks each implements, each test's outcome as it finishes, and last, pytest's exit status.
The socket is the plugin's: whatever a session sent is in the plugin's memory as soon as it
is read, so no other process can change it afterwards, and no link or file in the sandbox can
redirect it.

As it loads, it takes its own variables out of the environment, so a pytest that the tests
start (pytester, a subprocess) does not report as a session of the gate.
"""

from __future__ import annotations

import os
import sys


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path or os.curdir)
    return bool(root) and (real == root or real.startswith(root + os.sep))


# What the collector itself needs comes from past the checkout: a module of the tree's named
# like one (json.py beside the code, src/socket.py on PYTHONPATH=src) is never what it runs.
_CHECKOUT = (
    os.path.realpath(os.environ.get("AGENTGATE_CHECKOUT", ""))
    if os.environ.get("AGENTGATE_CHECKOUT")
    else ""
)
_SAVED_PATH = sys.path[:]
sys.path[:] = [p for p in sys.path if not _inside(p, _CHECKOUT)]
try:
    import _socket
    import contextlib
    import ctypes
    import socket
    from typing import Any
finally:
    sys.path[:] = _SAVED_PATH

CHANNEL_ENV = "AGENTGATE_RESULTS"
CHECKOUT_ENV = "AGENTGATE_CHECKOUT"
#: Names the file that says what a session collects, NUL-separated, relative to the
#: checkout: ``+PATH`` the only files collected (the attempt's own test modules) or
#: ``+PATH::ID`` the only tests run (a graded run); ``-PATH`` a file never collected (a test
#: module the attempt added, in the session of the base's tests).
SELECT_ENV = "AGENTGATE_SELECT"
SELECT_FILE = "select"
NAME = "agentgate_collector"
#: The longest socket path ``connect`` takes as it is (the kernel's limit is 108 bytes).
_MAX_SOCKET_PATH = 100
_RANK = {"passed": 1, "skipped": 2, "xfail": 2, "failed": 3, "error": 3}


def _take_environment() -> tuple[str, str]:
    """This session's channel, and the file saying what it collects ("": everything); the
    collector's variables leave the environment."""
    path = os.environ.pop(CHANNEL_ENV, "")
    only = os.environ.pop(SELECT_ENV, "")
    plugins = [p.strip() for p in os.environ.get("PYTEST_PLUGINS", "").split(",")]
    kept = [p for p in plugins if p and p != __name__]
    if kept:
        os.environ["PYTEST_PLUGINS"] = ",".join(kept)
    else:
        os.environ.pop("PYTEST_PLUGINS", None)
    here = os.path.dirname(os.path.abspath(__file__))
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    rest = [e for e in entries if e and os.path.abspath(e) != here]
    if rest:
        os.environ["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        os.environ.pop("PYTHONPATH", None)
    return path, only


def _encode(value: Any) -> str:
    """JSON of what the collector sends (objects, lists, strings, numbers, booleans, None),
    written here: the ``json`` module is one that code of the tree could have replaced
    before the collector loads."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            return '"' + value + '"'  # a node id, most often: nothing to escape
        out = ['"']
        for ch in value:
            code = ord(ch)
            if ch in '"\\':
                out.append("\\" + ch)
            elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
                out.append(f"\\u{code:04x}")
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_encode(str(k))}:{_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    return _encode(str(value))


def _untouchable() -> None:
    """No other process of the gate reads this one's memory or takes its descriptors (the
    results socket: ``pidfd_getfd``, ``/proc/<pid>/fd``): it is not dumpable. Processes it
    starts are dumpable again once they exec, as any program is."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE


def _tainted() -> str:
    """Why this interpreter cannot be trusted to report: a module the collector uses comes
    from the checkout (it ran before the collector, and may have changed what it sends)."""
    for module in (socket, _socket, contextlib, ctypes):
        where = getattr(module, "__file__", None) or ""
        if where and _inside(where, _CHECKOUT):
            return f"{module.__name__} was loaded from the checkout ({where})"
    return ""


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by children
    if len(path) <= _MAX_SOCKET_PATH:
        sock.connect(path)
        return sock
    # A long path is reached through a descriptor of its folder (/proc/self/fd/N/name).
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_CLOEXEC)
    try:
        sock.connect(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
    finally:
        os.close(folder)
    return sock


class _Session:
    """One pytest process's report, written to the plugin's socket as it happens."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.checkout = os.path.realpath(os.environ.get(CHECKOUT_ENV) or os.getcwd())
        self.rootdir = ""
        self.plugins: dict[str, list[str]] = {}
        self.outcomes: dict[str, tuple[int, str]] = {}
        self.ended = False
        self.session: Any = None
        #: The only Python files collected, relative to the checkout (None: every file),
        #: and the only test ids run in them (empty: every test of those files).
        self.only: frozenset[str] | None = None
        self.only_ids: frozenset[str] = frozenset()
        #: Files never collected, relative to the checkout.
        self.skip: frozenset[str] = frozenset()
        #: Each collected test's file, relative to the checkout, by its node id.
        self.files: dict[str, str] = {}
        #: Each path's real path, read once (every test of a module names its file).
        self._real: dict[str, str] = {}
        #: A test's result, sent with the next line (the next test's start): one write a
        #: test, not two. Should the process die between them, the test it was in is named.
        self.pending = b""

    def send(self, **message: Any) -> None:
        line = self.pending + _encode(message).encode("utf-8", "surrogatepass") + b"\n"
        self.pending = b""
        # A send that fails leaves a session that never ended: an error, never a pass.
        with contextlib.suppress(OSError):
            self.sock.sendall(line)

    def hold(self, **message: Any) -> None:
        """A line that goes with the next one sent (a test's result with the next start)."""
        self.pending += _encode(message).encode("utf-8", "surrogatepass") + b"\n"

    def relative(self, path: str) -> str:
        """A path as the checkout names it: relative inside it or directly in the folder
        above it (the boundary ``pytest.ini`` lies there, in a folder of each run's own),
        absolute elsewhere."""
        real = self._real.get(path)
        if real is None:
            real = self._real[path] = os.path.realpath(path)
        if real == self.checkout:
            return "."
        if real.startswith(self.checkout + os.sep):
            return os.path.relpath(real, self.checkout).replace(os.sep, "/")
        if real == os.path.dirname(self.checkout):  # a folder of each run's own
            return ".."
        if os.path.dirname(real) == os.path.dirname(self.checkout):
            return "../" + os.path.basename(real)
        return real

    def test_id(self, nodeid: str) -> str:
        """A node id relative to the checkout, whatever rootdir pytest chose: the file a
        collected test came from, by its own path (a node id's file part is not always
        relative to the rootdir, under ``-c FILE``), else joined to the rootdir."""
        path, sep, rest = nodeid.partition("::")
        known = self.files.get(nodeid)
        if known is not None:
            return known + sep + rest
        if not self.rootdir or not path:
            return nodeid
        where = self.relative(os.path.join(self.rootdir, path))
        return where + sep + rest if not where.startswith("/") else nodeid

    def identity(self, plugin: Any, name: str | None) -> str:
        """A name for a plugin that is the same in every checkout and every run."""
        if plugin is sys.modules.get(__name__):  # this collector, by its name of every run
            return f"module {NAME}"
        module = getattr(plugin, "__file__", None)
        if isinstance(module, str):
            where = self.relative(module)
            if not where.startswith("/"):
                return f"module {where}"
            named = getattr(plugin, "__name__", name)
            if sys.modules.get(str(named)) is not plugin:  # a module object of its own making
                return f"module {named} (not the module imported as {named})"
            return f"module {named}"
        kind = type(plugin)
        return f"object {kind.__module__}.{kind.__qualname__}"


_SESSION: _Session | None = None


def _start() -> None:
    global _SESSION
    path, only = _take_environment()
    if not path:
        return
    try:
        sock = _connect(path)
    except OSError as exc:
        # The gate asked for results and cannot have them: stop, rather than run untold.
        raise RuntimeError(
            f"agentgate: the results channel {path!r} is unreachable: {exc}"
        ) from None
    _untouchable()
    _SESSION = _Session(sock)
    if only:
        with open(only, "rb") as listed:
            entries = [os.fsdecode(p) for p in listed.read().split(b"\0") if p]
        chosen = [e[1:] for e in entries if e.startswith("+")]
        if chosen:
            _SESSION.only = frozenset(e.partition("::")[0] for e in chosen)
            _SESSION.only_ids = frozenset(e for e in chosen if "::" in e)
        _SESSION.skip = frozenset(e[1:] for e in entries if e.startswith("-"))
    _SESSION.send(kind="hello", version=1, pid=os.getpid(), argv=list(sys.argv), tainted=_tainted())


if __name__.startswith(NAME + "_"):  # as the gate's pytest loads it (a name of its command's
    # own); imported by the plugin itself, it does nothing
    _start()


def _hooks(plugin: Any) -> list[str]:
    try:
        names = dir(plugin)
    except Exception:
        return []
    return sorted(n for n in names if n.startswith("pytest_"))


def pytest_plugin_registered(plugin: Any, plugin_name: str, manager: Any) -> None:
    """Every plugin ever registered, also those registered before this one (the hook is
    historic) and those unregistered later."""
    if _SESSION is None:
        return
    identity = _SESSION.identity(plugin, plugin_name)
    found = _SESSION.plugins.setdefault(identity, [])
    found[:] = sorted(set(found) | set(_hooks(plugin)))


def pytest_ignore_collect(collection_path: Any, config: Any) -> bool | None:
    """A file to skip is never collected; in the session of the attempt's own test modules,
    every other file is left uncollected (never imported). conftest and package files
    still load as pytest loads them, folders are still walked."""
    found = _SESSION
    if found is None or (found.only is None and not found.skip):
        return None
    path = str(collection_path)
    if os.path.basename(path) in ("conftest.py", "__init__.py"):
        return None
    where = found.relative(path)
    if where in found.skip:
        return True
    if found.only is None or not path.endswith((".py", ".txt")):
        return None
    return None if where in found.only else True


def pytest_itemcollected(item: Any) -> None:
    found = _SESSION
    if found is not None:
        where = found.relative(str(getattr(item, "path", "") or ""))
        if where and not where.startswith("/") and where != ".":
            found.files[item.nodeid] = where


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """A graded run: only the tests named (a class or a parametrized test by its prefix)."""
    found = _SESSION
    if found is None or not found.only_ids:
        return
    kept: list[Any] = []
    dropped: list[Any] = []
    for item in items:
        test = found.test_id(item.nodeid)
        # The id itself, its parametrized test, or a class above it: one look-up each.
        named = [test, test.partition("[")[0]]
        parts = test.split("::")
        named += ["::".join(parts[:depth]) for depth in range(2, len(parts))]
        (kept if any(n in found.only_ids for n in named) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_configure(config: Any) -> None:
    if _SESSION is None:
        return
    _SESSION.rootdir = str(config.rootpath)
    inipath = getattr(config, "inipath", None)
    try:
        addopts = [str(a) for a in config.getini("addopts")]
    except (ValueError, KeyError):
        addopts = []
    _SESSION.send(
        kind="config",
        rootdir=_SESSION.relative(str(config.rootpath)),
        inifile=_SESSION.relative(str(inipath)) if inipath else "",
        addopts=addopts,
        worker=hasattr(config, "workerinput"),
    )


def pytest_collectreport(report: Any) -> None:
    if _SESSION is not None and report.failed:
        where = _SESSION.test_id(report.nodeid) or "."
        _SESSION.send(kind="test", id=where, outcome="error")
        _SESSION.send(kind="collect_error", id=where, line=_first_error(report))


def _first_error(report: Any) -> str:
    """The line of a collection error that names it (``E   ModuleNotFoundError: ...``)."""
    try:
        text = str(report.longrepr)
    except Exception:
        return "(its error could not be read)"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (named[-1] if named else lines[-1] if lines else "")[:300]


def pytest_runtest_logreport(report: Any) -> None:
    if _SESSION is None:
        return
    if report.outcome == "rerun":  # pytest-rerunfailures: only the last run counts
        _SESSION.outcomes.pop(report.nodeid, None)
        return
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "xfail" if hasattr(report, "wasxfail") else "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:
        return
    known = _SESSION.outcomes.get(report.nodeid)
    if known is None or _RANK[outcome] > known[0]:  # the worse of its phases
        _SESSION.outcomes[report.nodeid] = (_RANK[outcome], outcome)


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if _SESSION is not None:
        _SESSION.send(kind="start", id=_SESSION.test_id(nodeid))


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if _SESSION is None:
        return
    found = _SESSION.outcomes.pop(nodeid, None)
    if found is not None:
        _SESSION.hold(kind="test", id=_SESSION.test_id(nodeid), outcome=found[1])


def pytest_sessionstart(session: Any) -> None:
    if _SESSION is not None:
        _SESSION.session = session


def _shadowed() -> dict[str, str]:
    """The checkout's packages (``X/`` or ``src/X/`` with an ``__init__.py``) that this
    session imported from somewhere else: an installed copy, or another working copy's
    editable install, answered for the code under test."""
    found: dict[str, str] = {}
    for folder in (_CHECKOUT, os.path.join(_CHECKOUT, "src")) if _CHECKOUT else ():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if not name.isidentifier() or not os.path.isfile(
                os.path.join(folder, name, "__init__.py")
            ):
                continue
            where = getattr(sys.modules.get(name), "__file__", None)
            if isinstance(where, str) and not _inside(where, _CHECKOUT):
                found[name] = where
    return found


def pytest_unconfigure(config: Any) -> None:
    """The end: pytest's exit status is final by now (set after every sessionfinish)."""
    found = _SESSION
    if found is None or found.ended:
        return
    found.ended = True
    for nodeid, (_, outcome) in found.outcomes.items():  # begun, never finished
        found.send(kind="test", id=found.test_id(nodeid), outcome=outcome)
    shadowed = _shadowed()
    if shadowed:
        found.send(kind="shadowed", modules=shadowed)
    status = getattr(found.session, "exitstatus", None)
    found.send(
        kind="plugins", plugins=[[name, hooks] for name, hooks in sorted(found.plugins.items())]
    )
    found.send(kind="end", exitstatus=int(status) if status is not None else None)
    with contextlib.suppress(OSError):
        found.sock.close()


if _SESSION is not None and (_SESSION.only is not None or _SESSION.skip):
    # Before the tree's conftest files answer (the hook's first answer decides). pytest is
    # loaded by now, as it imports its plugins: taken as loaded, never imported again.
    pytest_ignore_collect = sys.modules["pytest"].hookimpl(tryfirst=True)(pytest_ignore_collect)
