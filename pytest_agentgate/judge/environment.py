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
