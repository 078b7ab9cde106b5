"""What this Python environment has installed, read from its folders.

``importlib.metadata`` parses every distribution's ``METADATA`` and ``RECORD`` for the same
facts: a few hundred milliseconds in an environment of a hundred distributions, paid by
every pytest process that judges an attempt. The folders already say them: a distribution's
``<name>-<version>.dist-info`` (or ``.egg-info``) is named for it, and what it installed to
import is the entries beside it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

#: ``name-version`` of a metadata folder (the name has no ``-``: it is escaped to ``_``).
_META = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(?:-py\d[\w.]*)?\.(?:dist|egg)-info$")
_VERSIONS: tuple[str, ...] | None = None
_NAMES: frozenset[str] | None = None


def _folders() -> list[str]:
    """The folders that hold installed distributions: the ``site-packages`` (and Debian's
    ``dist-packages``) folders on ``sys.path``, each once. Not the other entries of the path:
    pytest puts a project's own test folders there."""
    found = []
    for entry in sys.path:
        name = os.path.basename(entry.rstrip("/"))
        kept = name in ("site-packages", "dist-packages") and entry not in found
        if kept and os.path.isdir(entry):
            found.append(entry)
    return found


def _entries(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def versions() -> tuple[str, ...]:
    """``name==version`` of every distribution installed here (names normalized as PEP 503
    spells them), once per process."""
    global _VERSIONS
    if _VERSIONS is None:
        found = set()
        for folder in _folders():
            for entry in _entries(folder):
                match = _META.match(entry)
                if match:
                    name = re.sub(r"[-_.]+", "-", match["name"]).lower()
                    found.add(f"{name}=={match['version']}")
        _VERSIONS = tuple(sorted(found))
    return _VERSIONS


def top_level_names(module_name: Callable[[str], str]) -> frozenset[str]:
    """Every top-level name a module of this environment's distributions can be imported
    by: the entries of the folders on ``sys.path`` (``x/``, ``x.py``, ``x.cpython-*.so``),
    the folders their ``.pth`` files add, and the packages editable installs map. A stray
    module counts too: what is importable here is what a tree must not shadow.

    ``module_name`` turns a file name into the module name it imports as (see
    :func:`.harness._module_name`)."""
    global _NAMES
    if _NAMES is None:
        names: set[str] = set()
        folders = _folders()
        seen = set(folders)
        while folders:
            folder = folders.pop()
            for entry in _entries(folder):
                if entry.endswith(".pth"):
                    for extra in _pth_folders(Path(folder, entry)):
                        if extra not in seen:
                            seen.add(extra)
                            folders.append(extra)
                elif entry.startswith("__editable__") and entry.endswith(".py"):
                    names |= _mapped(Path(folder, entry))
                name = module_name(entry)
                if name.isidentifier():
                    names.add(name)
        _NAMES = frozenset(names)
    return _NAMES


def _pth_folders(pth: Path) -> list[str]:
    """The folders a ``.pth`` file adds to ``sys.path``, those that exist."""
    from ..sandbox.containment import pth_paths

    return [str(p) for p in pth_paths(pth, pth.parent) if p.is_dir()]


_MAPPING = re.compile(r"^MAPPING\s*(?::[^=]*)?=\s*\{(?P<body>.*?)\}\s*$", re.MULTILINE | re.DOTALL)
_KEY = re.compile(r"""['"]([^'"]+)['"]\s*:""")


def _mapped(finder: Path) -> set[str]:
    """The top-level packages a setuptools editable finder maps to their source folders."""
    try:
        match = _MAPPING.search(finder.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return set()
    return set(_KEY.findall(match["body"])) if match else set()


_EDITABLE: tuple[Path, ...] | None = None
_STATES: dict[Path, str] = {}
#: Folders of a project that are never its importable source: its history, caches, builds.
_NOT_SOURCE = frozenset({"__pycache__", "node_modules", "build", "dist", "site"})
#: Past this many entries a project's folder is hashed no further (the first ones still say).
_MOST_ENTRIES = 50_000


def editable_projects() -> tuple[Path, ...]:
    """The project folders of this environment's editable installs (``pip install -e``),
    as pip's ``direct_url.json`` names them, once per process."""
    global _EDITABLE
    if _EDITABLE is None:
        found = set()
        for folder in _folders():
            for entry in _entries(folder):
                if entry.endswith(".dist-info"):
                    project = _editable_project(Path(folder, entry, "direct_url.json"))
                    if project is not None:
                        found.add(project)
        _EDITABLE = tuple(sorted(found))
    return _EDITABLE


def _editable_project(direct_url: Path) -> Path | None:
    import json
    from urllib.parse import unquote, urlsplit

    try:
        with open(direct_url, "rb") as file:
            said = json.loads(file.read(65536))
    except (OSError, ValueError):
        return None
    if not isinstance(said, dict) or not isinstance(said.get("dir_info"), dict):
        return None
    url = said.get("url")
    if said["dir_info"].get("editable") is not True or not isinstance(url, str):
        return None
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    return Path(os.path.realpath(unquote(parts.path)))


def project_state(project: Path) -> str:
    """What an editable project's importable files are now (each one's path, size and
    change times, hashed), once per process: its version stays the same while its code
    changes, so a base's results computed with one state of it are not the results with
    another.

    Importable: every file of a package (a folder holding ``__init__.py``, and the folders
    below it: its data too), and the modules at the top of the project or of its ``src``.
    Its documentation, changelog, tests and tools are not: an edit there changes no key
    (a key is also how attempts are batched across processes)."""
    state = _STATES.get(project)
    if state is None:
        import hashlib

        digest = hashlib.sha256(str(project).encode("utf-8", "surrogateescape"))
        for line in _listing(project):
            digest.update(line.encode("utf-8", "surrogateescape") + b"\0")
        state = _STATES[project] = digest.hexdigest()[:20]
    return state


def _listing(project: Path) -> list[str]:
    lines: list[str] = []
    folders = [("", False)]  # (folder, inside a package)
    while folders and len(lines) < _MOST_ENTRIES:
        rel, packaged = folders.pop()
        try:
            with os.scandir(project / rel if rel else project) as found:
                entries = sorted(found, key=lambda e: e.name)
        except OSError:
            continue
        names = {e.name for e in entries}
        if "pyvenv.cfg" in names:
            continue  # a virtual environment inside the project
        packaged = packaged or "__init__.py" in names
        top = rel in ("", "src")
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if _source_folder(entry.name):
                        folders.append((path, packaged))
                    continue
                if not (packaged or (top and entry.name.endswith(".py"))):
                    continue
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            lines.append(f"{path} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}")
    return lines


def _source_folder(name: str) -> bool:
    return not (name.startswith(".") or name in _NOT_SOURCE or name.endswith(".egg-info"))


#: The pytest11 entry points of this environment, read once per process.
_PLUGINS: tuple[str, ...] | None = None


def plugins() -> tuple[str, ...]:
    """The pytest11 entry points of this environment, read once per process.

    A pytest gate runs with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` and ``-p`` for each of these,
    so an entry point planted in the checkout (a ``*.dist-info`` beside the code) loads nothing.
    """
    global _PLUGINS
    if _PLUGINS is None:
        from importlib.metadata import entry_points

        _PLUGINS = tuple(sorted({ep.name for ep in entry_points(group="pytest11")}))
    return _PLUGINS


def plugins_of(program: str, path: str | None, checkout: Path) -> tuple[str, ...] | None:
    """The plugins a gate's pytest ``program`` (``python``, ``.venv/bin/pytest``, found on
    ``path`` as the command finds it) is given: this environment's when it runs in this one;
    another environment's, read from its ``site-packages``, when it runs in another (a
    project's own virtual environment beside the plugin's); none of a program inside the
    checkout, whose environment the attempt could have written; None when its environment
    cannot be told (a pyenv shim, a wrapper script): it then loads them as run by hand."""
    import shutil

    found: str | None = program
    if "/" not in program:
        found = shutil.which(program, path=path)
    elif not os.path.isabs(program):
        found = os.path.join(checkout, program)
    if found is None:
        return plugins()  # it fails as it would by hand
    where = os.path.abspath(found)
    if Path(os.path.realpath(where)).is_relative_to(os.path.realpath(checkout)) or Path(
        where
    ).is_relative_to(checkout):
        return ()
    prefix, config = _prefix_of(where)
    if prefix == os.path.realpath(sys.prefix):
        return plugins()
    folders = _site_packages(prefix)
    if config.get("include-system-site-packages", "").lower() == "true" and config.get("home"):
        folders += _site_packages(os.path.realpath(os.path.dirname(config["home"])))
    if not folders:
        return None
    return tuple(sorted({name for folder in folders for name in _entry_points(folder)}))


def _prefix_of(program: str) -> tuple[str, dict[str, str]]:
    """The environment a program in its ``bin`` folder runs in, and its ``pyvenv.cfg``: a
    virtual environment's own interpreter is a link to its base's, so the folder above
    ``bin`` is asked first."""
    above = os.path.dirname(os.path.dirname(program))
    config = _pyvenv(os.path.join(above, "pyvenv.cfg"))
    if config is not None:
        return os.path.realpath(above), config
    return os.path.dirname(os.path.dirname(os.path.realpath(program))), {}


def _pyvenv(path: str) -> dict[str, str] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            lines = file.read(65536).splitlines()
    except OSError:
        return None
    pairs = (line.partition("=") for line in lines)
    return {key.strip().lower(): value.strip() for key, sep, value in pairs if sep}


def _site_packages(prefix: str) -> list[str]:
    import glob

    found = glob.glob(os.path.join(glob.escape(prefix), "lib*", "python3*", "site-packages"))
    return sorted(f for f in found if os.path.isdir(f))


def _entry_points(folder: str) -> set[str]:
    """The pytest11 entry points the distributions installed in ``folder`` declare."""
    names: set[str] = set()
    for entry in _entries(folder):
        if not entry.endswith((".dist-info", ".egg-info")):
            continue
        try:
            with open(os.path.join(folder, entry, "entry_points.txt"), encoding="utf-8") as file:
                text = file.read(1 << 20)
        except (OSError, UnicodeDecodeError):
            continue
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
            elif section == "pytest11" and "=" in line and not line.startswith(("#", ";")):
                names.add(line.partition("=")[0].strip())
    return names
