"""The harness is the base's: what decides how tests run may not be changed by an attempt.

A gate that runs the attempt's own test configuration judges nothing: ``addopts =
--collect-only``, a ``conftest.py`` that marks every report passed, a ``tests/__init__.py``
that replaces ``unittest.TestCase.run``, an entry point planted beside the code. So by default
no attempt may add or change, at any depth:

- ``conftest.py``, ``noxfile.py``, and every pytest configuration file (``pytest.ini``,
  ``.pytest.ini``, ``pytest.toml``, ``.pytest.toml``);
- the pytest sections of shared configuration files (``tox.ini``'s ``[pytest]``,
  ``setup.cfg``'s ``[tool:pytest]``, ``pyproject.toml``'s ``[tool.pytest.ini_options]`` and
  ``[tool.pytest]``), compared section by section, so the rest of those files stays editable
  (an agent may add a dependency to ``pyproject.toml``);
- the ``__init__.py`` of a test directory (one that holds test modules, or is named
  ``test``, ``tests`` or ``testing``), and ``pytest_plugins`` in a test module;
- anything that installs code into an interpreter: ``*.pth``, ``*.dist-info/``, ``*.egg-info/``,
  and bytecode (``__pycache__/``, ``*.pyc``: an unchecked-hash ``.pyc`` runs instead of the
  source beside it, so the gate would test code the tree does not show);
- a new module or package at the top of the tree named like one of the standard library or of
  an installed distribution (``pytest.py``, ``_pytest/``, ``xml/``, ``sitecustomize.py``):
  ``python -m pytest`` puts the checkout first on ``sys.path``, so such a name would replace
  the test runner, or a part of it, with the agent's code.

Each rule has a name (the strings of :data:`DEFAULT_HARNESS`), by which a person can lift it
(``--agentgate-unprotect``).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence

import iniconfig

#: The rules that protect the harness, each by its name.
DEFAULT_HARNESS = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "noxfile.py",
    "tox.ini:[pytest]",
    "setup.cfg:[tool:pytest]",
    "pyproject.toml:[tool.pytest.ini_options]",
    "pyproject.toml:[tool.pytest]",
    "__init__.py",
    "pytest_plugins",
    "*.pth",
    "*.dist-info",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    "shadowing",
    ".gitattributes",
)
_SECTION = re.compile(r"^(?P<file>[^:]+):\[(?P<section>[^\]]+)\]$")
_TEST_MODULE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
_TEST_DIR_NAMES = frozenset({"test", "tests", "testing"})
_PLUGINS = re.compile(rb"^pytest_plugins\s*[:=]", re.MULTILINE)

#: Reads a file of a tree: (tree, path) -> its bytes, or None when it is not there.
Reader = Callable[[str, str], "bytes | None"]


def unknown_rules(names: Iterable[str]) -> list[str]:
    """The names that are no rule of :data:`DEFAULT_HARNESS` (a typo in --agentgate-unprotect)."""
    return [name for name in names if name not in DEFAULT_HARNESS]


def violations(
    rules: Sequence[str],
    changed: Sequence[str],
    base_tree: str,
    tree: str,
    read: Reader,
    all_paths: Callable[[str], Sequence[str]],
) -> list[str]:
    """What the change from ``base_tree`` to ``tree`` does to the protected harness.

    ``changed`` lists the paths that differ; ``read`` gives a file's content in a tree;
    ``all_paths`` lists a tree's files (only needed for the test-directory rule).
    """
    found: list[str] = []
    components = [
        r
        for r in rules
        if not _SECTION.match(r) and r not in ("__init__.py", "pytest_plugins", ".gitattributes")
    ]
    sections = [_SECTION.match(r) for r in rules if _SECTION.match(r)]
    for path in changed:
        parts = path.split("/")
        # Case folded: Python's metadata finds "Evil.DIST-INFO" as readily as "evil.dist-info".
        folded = [part.lower() for part in parts]
        hit = next(
            (r for r in components if any(fnmatch.fnmatchcase(p, r.lower()) for p in folded)), None
        )
        if hit is not None:
            found.append(f"{path} ({hit})")
            continue
        name = parts[-1]
        for match in sections:
            if match is not None and name == match["file"]:
                before, after = read(base_tree, path), read(tree, path)
                if _section(name, before, match["section"]) != _section(
                    name, after, match["section"]
                ):
                    found.append(f"{path}:[{match['section']}]")
        if (
            ".gitattributes" in rules
            and name.lower() == ".gitattributes"
            and _conversions(read(base_tree, path)) != _conversions(read(tree, path))
        ):
            found.append(f"{path} (.gitattributes: how files are written out)")
        if (
            "pytest_plugins" in rules
            and _TEST_MODULE.search(path)
            and _plugins_line(read(base_tree, path)) != _plugins_line(read(tree, path))
        ):
            found.append(f"{path} (pytest_plugins)")
    if "shadowing" in rules:
        found += _shadowing(changed, base_tree, tree, all_paths, read)
    if "__init__.py" in rules:
        inits = [p for p in changed if p.split("/")[-1] == "__init__.py"]
        if inits:
            test_dirs = _test_dirs(all_paths(base_tree)) | _test_dirs(all_paths(tree))
            for path in inits:
                folder = path.rpartition("/")[0]
                if folder in test_dirs or folder.rpartition("/")[2] in _TEST_DIR_NAMES:
                    found.append(f"{path} (__init__.py of a test directory)")
    return found


#: Attributes that change the bytes a checkout writes (filters are never run: see repo.py).
_CONVERTING = frozenset({"text", "eol", "crlf", "working-tree-encoding", "ident"})


def _conversions(data: bytes | None) -> set[tuple[str, str]]:
    """The (pattern, attribute) pairs of a ``.gitattributes`` that change how a checkout
    writes a file's bytes: an attempt that sets one could make the gate test bytes that are
    not its tree's (``working-tree-encoding=UTF-7`` turns ``+`` into ``+-``)."""
    found: set[tuple[str, str]] = set()
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        words = line.split("#", 1)[0].split() if not line.lstrip().startswith("#") else []
        for word in words[1:]:
            name = word.lstrip("-!").split("=", 1)[0].lower()
            if name in _CONVERTING:
                found.add((words[0], word))
    return found


def _shadowing(
    changed: Sequence[str],
    base_tree: str,
    tree: str,
    all_paths: Callable[[str], Sequence[str]],
    read: Reader,
) -> list[str]:
    """New modules or packages that shadow the standard library or an installed distribution,
    where Python looks first: the top of the tree (``python -m pytest`` puts the checkout on
    ``sys.path``) and every test directory (pytest's default import mode puts those on it
    too). Any file Python imports counts: ``x.py``, ``x.pyc``, ``x.cpython-311-x86_64-linux-gnu.so``,
    a package ``x/``. Names the base already has at that place are the base's."""
    shadowable = _shadowable()
    suspects: dict[str, tuple[str, str]] = {}  # place -> (folder, module)
    for path in changed:
        parts = path.split("/")
        for depth in range(len(parts)):
            module = _module_name(parts[depth])
            if module in shadowable:
                folder = "/".join(parts[:depth])
                suspects["/".join(parts[: depth + 1])] = (folder, module)
    if not suspects:
        return []
    base_paths = all_paths(base_tree)
    new_paths = all_paths(tree)
    on_path = {""} | test_directories(base_paths) | test_directories(new_paths)
    on_path |= _configured_paths(base_tree, read)
    existing = set(base_paths) | {d for p in base_paths for d in _folders(p)}
    return [
        f"{place} (shadows the module {module!r})"
        for place, (folder, module) in sorted(suspects.items())
        if folder in on_path and place not in existing
    ]


def _configured_paths(base_tree: str, read: Reader) -> set[str]:
    """The folders the base's pytest configuration puts on ``sys.path`` (``pythonpath``)."""
    found: set[str] = set()
    for name, section in (
        ("pyproject.toml", "tool.pytest.ini_options"),
        ("pyproject.toml", "tool.pytest"),
        ("pytest.toml", "pytest"),
        (".pytest.toml", "pytest"),
        ("pytest.ini", "pytest"),
        (".pytest.ini", "pytest"),
        ("tox.ini", "pytest"),
        ("setup.cfg", "tool:pytest"),
    ):
        data = _section(name, read(base_tree, name), section)
        value = data.get("pythonpath") if isinstance(data, dict) else None
        entries = (
            value.split() if isinstance(value, str) else value if isinstance(value, list) else []
        )
        for entry in entries:
            folder = str(entry).strip().strip("/")
            while folder.startswith("./"):
                folder = folder[2:]
            found.add("" if folder in ("", ".") else folder)
    return found


def _folders(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _module_name(name: str) -> str:
    """The module a file or folder name makes importable (``x.cpython-311.so`` -> ``x``)."""
    from importlib.machinery import all_suffixes

    for suffix in sorted(all_suffixes(), key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    if ".cpython-" in name and name.endswith((".so", ".pyd")):
        return name.split(".", 1)[0]
    return name


_SHADOWABLE: frozenset[str] | None = None


def _shadowable() -> frozenset[str]:
    """Top-level names of the standard library and of this environment's distributions."""
    global _SHADOWABLE
    if _SHADOWABLE is None:
        import sys
        from importlib.metadata import packages_distributions

        names = set(sys.stdlib_module_names) | {"sitecustomize", "usercustomize"}
        names |= set(packages_distributions())
        _SHADOWABLE = frozenset(names)
    return _SHADOWABLE


def test_directories(paths: Iterable[str]) -> set[str]:
    """Folders that hold test modules, and folders named test, tests or testing."""
    found = _test_dirs(paths := list(paths))
    found |= {d for p in paths for d in _folders(p) if d.rpartition("/")[2] in _TEST_DIR_NAMES}
    return found


def is_test_path(path: str, test_dirs: set[str]) -> bool:
    """Whether ``path`` is a test module or lies in a test directory (at any depth)."""
    return bool(_TEST_MODULE.search(path)) or any(d in test_dirs for d in _folders(path))


def _test_dirs(paths: Iterable[str]) -> set[str]:
    return {p.rpartition("/")[0] for p in paths if _TEST_MODULE.search(p)}


def _plugins_line(content: bytes | None) -> list[bytes]:
    """The ``pytest_plugins`` assignments of a module, as written (empty when none)."""
    if content is None:
        return []
    return [line.strip() for line in content.splitlines() if _PLUGINS.match(line)]


_UNREADABLE = object()


def _section(name: str, content: bytes | None, section: str) -> object:
    """The named section of an ini or TOML file as data (None when absent).

    A file that cannot be parsed yields a marker that differs from any parsed section, so a
    change from a readable file to an unreadable one (or back) counts as a change.
    """
    if content is None:
        return None
    text = content.decode("utf-8", "replace")
    try:
        if name.endswith(".toml"):
            data: object = tomllib.loads(text)
            for key in section.split("."):
                if not isinstance(data, dict) or key not in data:
                    return None
                data = data[key]
            return data
        # Read as pytest reads it (iniconfig: comments stripped from section lines, keys kept
        # as written), so what this compares is what pytest will see.
        config = iniconfig.IniConfig(name, data=text)
        return dict(config[section].items()) if section in config else None
    except (tomllib.TOMLDecodeError, iniconfig.ParseError):
        return _UNREADABLE
