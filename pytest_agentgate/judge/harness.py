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
  ``test``, ``tests`` or ``testing``; but an empty one in a folder the attempt adds), and
  ``pytest_plugins`` in a test module;
- anything that installs code into an interpreter: ``*.pth``, ``*.dist-info/``, ``*.egg-info/``,
  and bytecode (``__pycache__/``, ``*.pyc``: an unchecked-hash ``.pyc`` runs instead of the
  source beside it, so the gate would test code the tree does not show);
- a new module or package at the top of the tree named like one of the standard library or of
  an installed distribution (``pytest.py``, ``_pytest/``, ``xml/``, ``sitecustomize.py``):
  ``python -m pytest`` puts the checkout first on ``sys.path``, so such a name would replace
  the test runner, or a part of it, with the agent's code;
- a new module that takes the place of one of the tree's own (a ``tests/ledger/`` the tests
  import as ``ledger``, a package or an extension module beside ``x.py``).

Each rule has a name (the strings of :data:`DEFAULT_HARNESS`), by which a person can lift it
(``--agentgate-unprotect``).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import iniconfig

from .own_modules import folders_of as _folders
from .own_modules import inserted_folders, package_inits, taking_place

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
    "wrappers",
)
#: What a gate's wrapper reads to decide what it runs (rule ``wrappers``): for a gate that runs
#: one of these programs, those files are harness too (a recipe the agent could edit runs
#: before pytest, with the gate's results channel in its environment).
_MAKEFILES = (
    # GNU make remakes a makefile from any of these by its built-in rules (Makefile.sh,
    # RCS and SCCS masters) before it reads it.
    "Makefile", "makefile", "GNUmakefile", "*.mk", "Makefile.*", "makefile.*", "GNUmakefile.*",
    "*,v", "s.*", "RCS", "SCCS",
)  # fmt: skip
WRAPPER_FILES = {
    "make": _MAKEFILES,
    "gmake": _MAKEFILES,
    "tox": ("tox.ini", "tox.toml"),
    "nox": ("noxfile.py",),
    "hatch": ("hatch.toml",),
    "just": ("justfile", ".justfile"),  # matched whatever their case, as just finds them
}
#: The sections of shared files those wrappers read.
WRAPPER_SECTIONS = {
    "tox": (("setup.cfg", "tox:tox"), ("pyproject.toml", "tool.tox")),
    "hatch": (("pyproject.toml", "tool.hatch"),),
}
_SECTION = re.compile(r"^(?P<file>[^:]+):\[(?P<section>[^\]]+)\]$")
_TEST_MODULE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
_TEST_DIR_NAMES = frozenset({"test", "tests", "testing"})
#: Reads a file of a tree: (tree, path) -> its bytes, or None when it is not there.
Reader = Callable[[str, str], "bytes | None"]


class Trees(Protocol):
    """What the rules read of a tree (the git layer answers, the rules stay pure)."""

    def read(self, tree: str, path: str) -> bytes | None: ...

    def paths(self, tree: str) -> Sequence[str]: ...

    def links(self, tree: str, paths: Sequence[str]) -> set[str]:
        """Which of ``paths`` are symbolic links in ``tree``."""
        ...

    def attributes(
        self, tree: str, paths: Sequence[str], names: Sequence[str]
    ) -> Mapping[str, tuple[str, ...]]:
        """Each path's values of the attributes ``names``, as git reads ``tree``'s
        ``.gitattributes`` files."""
        ...


#: Files the harness reads as configuration: a symbolic link in one's place is refused
#: (the rules would read the link's text, pytest the file it points to), each with the rules
#: that make it harness.
CONFIG_FILES = {
    "conftest.py": ("conftest.py",),
    "pytest.ini": ("pytest.ini",),
    ".pytest.ini": (".pytest.ini",),
    "pytest.toml": ("pytest.toml",),
    ".pytest.toml": (".pytest.toml",),
    "noxfile.py": ("noxfile.py",),
    "tox.ini": ("tox.ini:[pytest]",),
    "setup.cfg": ("setup.cfg:[tool:pytest]",),
    "pyproject.toml": ("pyproject.toml:[tool.pytest.ini_options]", "pyproject.toml:[tool.pytest]"),
    ".gitattributes": (".gitattributes",),
}


def unknown_rules(names: Iterable[str]) -> list[str]:
    """The names that are no rule of :data:`DEFAULT_HARNESS` (a typo in --agentgate-unprotect)."""
    return [name for name in names if name not in DEFAULT_HARNESS]


def violations(
    rules: Sequence[str],
    changed: Sequence[str],
    base_tree: str,
    tree: str,
    trees: Trees,
    allow_symlinks: Sequence[str] = (),
    commands: Sequence[str] = (),
) -> list[str]:
    """What the change from ``base_tree`` to ``tree`` does to the protected harness.

    ``changed`` lists the paths that differ; ``trees`` reads the two trees;
    ``allow_symlinks`` are globs of paths where a link may stand for a configuration file;
    ``commands`` are the gate's (a wrapper they run makes its files harness).
    """
    read = trees.read
    found: list[str] = []
    components = [
        r
        for r in rules
        if not _SECTION.match(r) and r not in ("__init__.py", "pytest_plugins", ".gitattributes")
    ]
    sections = [_SECTION.match(r) for r in rules if _SECTION.match(r)]
    found += _linked_configs(rules, changed, tree, trees, allow_symlinks)
    for path in changed:
        parts = path.split("/")
        # Case folded: Python's metadata finds "Evil.DIST-INFO" as readily as "evil.dist-info".
        folded = [part.lower() for part in parts]
        hit = next(
            (r for r in components if any(fnmatch.fnmatchcase(p, r.lower()) for p in folded)), None
        )
        if hit is not None and not (
            parts[-1] == "conftest.py" and _same_code_file(trees, base_tree, tree, path)
        ):
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
            "pytest_plugins" in rules
            and _TEST_MODULE.search(path)
            and plugin_writes(read(base_tree, path)) != plugin_writes(read(tree, path))
        ):
            found.append(f"{path} (pytest_plugins)")
    if ".gitattributes" in rules and any(
        p.split("/")[-1].lower() == ".gitattributes" for p in changed
    ):
        found += _converted(base_tree, tree, trees)
    if "wrappers" in rules and commands:
        found += _wrapper_files(commands, changed, base_tree, tree, read)
    if "shadowing" in rules:
        inserted = _inserted(base_tree, trees.paths(base_tree), read)
        found += _shadowing(changed, base_tree, tree, trees.paths, read, commands, inserted)
        found += _own_shadowing(changed, base_tree, tree, trees, commands, inserted)
    if "__init__.py" in rules:
        inits = [p for p in changed if p.split("/")[-1] == "__init__.py"]
        if inits:
            base_paths = trees.paths(base_tree)
            test_dirs = _test_dirs(base_paths) | _test_dirs(trees.paths(tree))
            base_dirs = {d for p in base_paths for d in _folders(p)}
            for path in inits:
                folder = path.rpartition("/")[0]
                in_tests = folder in test_dirs or folder.rpartition("/")[2] in _TEST_DIR_NAMES
                if in_tests and not (
                    _same_code_file(trees, base_tree, tree, path)
                    # An empty one in a folder the attempt made: it runs nothing, and only
                    # the attempt's own modules there are imported otherwise.
                    or (folder not in base_dirs and _runs_nothing(trees, tree, path))
                ):
                    found.append(f"{path} (__init__.py of a test directory)")
    return found


def _runs_nothing(trees: Trees, tree: str, path: str) -> bool:
    """Whether ``path`` in ``tree`` is a file whose code is an empty file's (comments and a
    docstring at most), not a link."""
    return not trees.links(tree, [path]) and same_code(b"", trees.read(tree, path))


def _same_code_file(trees: Trees, base_tree: str, tree: str, path: str) -> bool:
    """Whether ``path`` runs the same code in both trees: a file in each (a link's text is
    no code: Python runs what it points to), with the same syntax tree."""
    if trees.links(base_tree, [path]) or trees.links(tree, [path]):
        return False
    return same_code(trees.read(base_tree, path), trees.read(tree, path))


def same_code(before: bytes | None, after: bytes | None) -> bool:
    """Whether two versions of a Python file run the same code: equal syntax trees once
    docstrings are set aside (a blank line, a comment, a reworded docstring change nothing
    that runs). A file added or removed, or one that does not parse, is not the same."""
    if before is None or after is None:
        return False
    try:
        return _code_of(before) == _code_of(after)
    except (SyntaxError, ValueError, RecursionError):
        return False


def _code_of(source: bytes) -> str:
    module = ast.parse(source)
    module.body = module.body or [ast.Pass()]
    for node in ast.walk(module):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[:] = body[1:] or [ast.Pass()]
    return ast.dump(module, include_attributes=False)


def wrappers_of(commands: Sequence[str]) -> list[str]:
    """The wrappers of :data:`WRAPPER_FILES` that the gate's commands run (as a word of the
    command: ``make test``, ``sh -c 'cd x && tox -e py'``)."""
    words = {w.rsplit("/", 1)[-1] for c in commands for w in re.split(r"[\s;&|()'\"`]+", c)}
    return sorted(set(WRAPPER_FILES) & words)


def _wrapper_files(
    commands: Sequence[str], changed: Sequence[str], base_tree: str, tree: str, read: Reader
) -> list[str]:
    """The files a gate's wrapper reads, and every file of the base the gate's commands
    name (``sh scripts/test.sh``, ``python run_tests.py``, ``./ci``): each runs before
    pytest, with the results channel in its environment."""
    found = []
    for wrapper in wrappers_of(commands):
        globs = [g.lower() for g in WRAPPER_FILES[wrapper]]
        for path in changed:
            parts = [part.lower() for part in path.split("/")]
            if any(fnmatch.fnmatchcase(part, g) for g in globs for part in parts):
                found.append(f"{path} (wrappers: the gate runs {wrapper})")
        if wrapper in ("make", "gmake"):
            included = _make_includes(read(base_tree, "Makefile") or b"")
            found += [
                f"{p} (wrappers: the base's Makefile includes it)" for p in changed if p in included
            ]
        for name, section in WRAPPER_SECTIONS.get(wrapper, ()):
            for path in changed:
                if path.split("/")[-1] == name and _section(
                    name, read(base_tree, path), section
                ) != _section(name, read(tree, path), section):
                    found.append(f"{path}:[{section}] (wrappers: the gate runs {wrapper})")
    run = ran_files(commands)
    found += [f"{p} (wrappers: the gate runs it)" for p in changed if p in run]
    return sorted(set(found))


_INTERPRETER = re.compile(r"^(?:sh|bash|dash|zsh|ksh|python[\d.]*|node|perl|ruby|tclsh)$")


def ran_files(commands: Sequence[str]) -> set[str]:
    """The files of the checkout that gate commands run: the program of each command (``./ci``,
    ``scripts/test.sh``, after any ``VAR=value`` or ``env``) and the script an interpreter
    is given (``sh scripts/test.sh``, ``python run_tests.py``). A file a command only reads
    or tests for (``test -f x``) is not one."""
    found: set[str] = set()
    for command in commands:
        for segment in re.split(r"&&|\|\||[;|&()\n]", command):
            words = [w.strip("'\"") for w in segment.split()]
            while words and (re.match(r"^[A-Za-z_]\w*=", words[0]) or words[0] == "env"):
                words.pop(0)
            if not words:
                continue
            if "/" in words[0]:
                found.add(words[0].removeprefix("./"))
            if _INTERPRETER.match(words[0].rsplit("/", 1)[-1]):
                script = next((w for w in words[1:] if not w.startswith("-")), None)
                if script is not None and not {"-c", "-m"} & set(words[1:]):
                    found.add(script.removeprefix("./"))
    return found


def _make_includes(makefile: bytes) -> set[str]:
    """The files a Makefile's ``include``, ``-include`` and ``sinclude`` lines name."""
    found: set[str] = set()
    for line in makefile.decode("utf-8", "replace").splitlines():
        words = line.split()
        if words and words[0] in ("include", "-include", "sinclude"):
            found.update(w.removeprefix("./") for w in words[1:] if "$" not in w)
    return found


def _linked_configs(
    rules: Sequence[str],
    changed: Sequence[str],
    tree: str,
    trees: Trees,
    allow_symlinks: Sequence[str],
) -> list[str]:
    """Configuration files the attempt made symbolic links (where a rule protects them)."""
    named = [
        p
        for p in changed
        if any(r in rules for r in CONFIG_FILES.get(p.split("/")[-1], ()))
        and not any(fnmatch.fnmatchcase(p, g) for g in allow_symlinks)
    ]
    if not named:
        return []
    return [
        f"{p} (a symbolic link in place of a configuration file: the harness reads files; "
        "--agentgate-allow-symlink PATH allows one)"
        for p in sorted(trees.links(tree, named))
    ]


def _converted(base_tree: str, tree: str, trees: Trees) -> list[str]:
    """Files whose bytes a checkout would write differently under the attempt's
    ``.gitattributes`` than under the base's, as git itself reads them: an attempt that
    sets one could make the gate test bytes that are not its tree's
    (``working-tree-encoding=UTF-7`` turns ``+`` into ``+-``)."""
    paths = sorted(set(trees.paths(tree)) | set(trees.paths(base_tree)))
    before = trees.attributes(base_tree, paths, CONVERTING)
    after = trees.attributes(tree, paths, CONVERTING)
    differ = [p for p in paths if before.get(p) != after.get(p)]
    shown = differ[:5] + ([f"{len(differ) - 5} more"] if len(differ) > 5 else [])
    return [f"{p} (.gitattributes: how files are written out)" for p in shown]


#: Attributes that change the bytes a checkout writes (filters are never run: see repo.py).
CONVERTING = ("text", "eol", "crlf", "working-tree-encoding", "ident", "binary")


def _shadowing(
    changed: Sequence[str],
    base_tree: str,
    tree: str,
    all_paths: Callable[[str], Sequence[str]],
    read: Reader,
    commands: Sequence[str] = (),
    inserted: set[str] | None = None,
) -> list[str]:
    """New modules or packages that shadow a module Python or the test runner imports, where
    Python looks first: the top of the tree (``python -m pytest`` puts the checkout on
    ``sys.path``), every test directory (pytest's default import mode puts those on it too),
    the folders the configuration's ``pythonpath`` and the gate's own ``PYTHONPATH=`` name.
    A name counts when it is one of the standard library's or of an installed distribution,
    or one the standard library or the test runner imports when it is there (``org``, which
    ``copy`` tries; ``setproctitle``, which pytest-xdist's workers try): such a module would
    run at the runner's start, before any test. Any file Python imports counts: ``x.py``,
    ``x.pyc``, ``x.cpython-311-x86_64-linux-gnu.so``, a package ``x/``. Names the base
    already has at that place are the base's."""
    shadowable = _shadowable()
    candidates: dict[str, tuple[str, str]] = {}  # place -> (folder, module)
    for path in changed:
        parts = path.split("/")
        for depth in range(len(parts)):
            module = _module_name(parts[depth])
            if module.isidentifier():
                candidates["/".join(parts[: depth + 1])] = ("/".join(parts[:depth]), module)
    suspects = {k: v for k, v in candidates.items() if v[1] in shadowable or _of_runner(v[1])}
    base_paths: Sequence[str] | None = None
    if len(suspects) < len(candidates):
        # Only places new to the tree can shadow: the names the runner may import are read
        # (once per process) only when the attempt adds one.
        base_paths = all_paths(base_tree)
        existing = set(base_paths) | {d for p in base_paths for d in _folders(p)}
        new = {k: v for k, v in candidates.items() if k not in existing and k not in suspects}
        if new:
            optional = optional_imports()
            suspects.update({k: v for k, v in new.items() if v[1] in optional})
    if not suspects:
        return []
    base_paths = all_paths(base_tree) if base_paths is None else base_paths
    new_paths = all_paths(tree)
    on_path = {""} | test_directories(base_paths) | test_directories(new_paths)
    on_path |= _configured_paths(base_tree, read) | command_paths(commands)
    on_path |= _inserted(base_tree, base_paths, read) if inserted is None else inserted
    # A folder of the base the attempt made a package is new as a module.
    base_set, new_set = set(base_paths), set(new_paths)
    inits = package_inits()
    existing = base_set | {
        d
        for d in {d for p in base_paths for d in _folders(p)}
        if not any(d + i in new_set and d + i not in base_set for i in inits)
    }
    # The runner's own names shadow wherever a folder that is no package could be put on
    # sys.path by a wrapper whose PYTHONPATH no rule reads (a Makefile, tox's setenv).
    # Packages of the base alone: a folder the attempt makes a package is on a PYTHONPATH
    # as readily as any.
    packages = {p.rpartition("/")[0] for p in base_paths if p.rpartition("/")[2] == "__init__.py"}
    return [
        f"{place} (shadows the module {module!r})"
        for place, (folder, module) in sorted(suspects.items())
        if place not in existing
        and (folder in on_path or (_of_runner(module) and folder not in packages))
    ]


def _own_shadowing(
    changed: Sequence[str],
    base_tree: str,
    tree: str,
    trees: Trees,
    commands: Sequence[str] = (),
    inserted: set[str] | None = None,
) -> list[str]:
    """New modules that take the place of one of the tree's own (see :mod:`.own_modules`),
    by the folders the base's tests put on ``sys.path``."""
    base_paths = trees.paths(base_tree)
    if inserted is None:
        inserted = _inserted(base_tree, base_paths, trees.read)
    code_folders = {""} | _configured_paths(base_tree, trees.read) | command_paths(commands)
    # The folders Python is given are those whose modules are the tree's own.
    given = code_folders | inserted
    return taking_place(
        changed, (base_paths, trees.paths(tree)), given, given, _module_name,
        trees.links(tree, changed),
    )  # fmt: skip


def _inserted(base_tree: str, base_paths: Sequence[str], read: Reader) -> set[str]:
    """The folders pytest's default import mode puts on ``sys.path`` for the base's tests
    (see :func:`.own_modules.inserted_folders`), its own ``python_files`` counted."""
    patterns = configured(base_tree, read, "python_files")

    def is_test_module(path: str) -> bool:
        name = path.rpartition("/")[2]
        return bool(_TEST_MODULE.search(path)) or any(
            fnmatch.fnmatchcase(name, p) for p in patterns
        )

    packages = {p.rpartition("/")[0] for p in base_paths if p.rpartition("/")[2] == "__init__.py"}
    return inserted_folders(base_paths, is_test_module, packages)


def _of_runner(module: str) -> bool:
    return module in runner_modules() or module.startswith("agentgate_collector")


_RUNNER: frozenset[str] | None = None


def runner_modules() -> frozenset[str]:
    """The top-level modules of the test runner and its reporting: pytest, its plugins (the
    pytest11 entry points installed here), this plugin and its collector, and the modules
    Python imports at every start."""
    global _RUNNER
    if _RUNNER is None:
        from importlib.metadata import entry_points

        found = {"pytest", "_pytest", "pluggy", "py", "iniconfig", "pytest_agentgate"}
        found |= {"sitecustomize", "usercustomize"}
        for point in entry_points(group="pytest11"):
            found.add(point.value.split(":")[0].split(".")[0].strip())
        _RUNNER = frozenset(found)
    return _RUNNER


_PYTHONPATH = re.compile(r"\bPYTHONPATH=(?P<value>\"[^\"]*\"|'[^']*'|[^\s;&|)]+)")


def command_paths(commands: Sequence[str]) -> set[str]:
    """The folders of the checkout that gate commands put on ``PYTHONPATH`` (``PYTHONPATH=src
    python -m pytest``, ``env PYTHONPATH=src:lib ...``, in a shell string too)."""
    found: set[str] = set()
    for command in commands:
        for match in _PYTHONPATH.finditer(command):
            for entry in match["value"].strip("'\"").split(":"):
                folder = entry.strip().strip("/")
                while folder.startswith("./"):
                    folder = folder[2:]
                if folder and not folder.startswith(("$", "/", "..")):
                    found.add("" if folder == "." else folder)
    return found


_OPTIONAL: frozenset[str] | None = None
_IMPORTED = re.compile(
    rb"^[ \t]*(?:import[ \t]+(\w+)[ \t]*(?:[.,#\n]|as\b|$)|from[ \t]+(\w+)(?:\.\w+)*[ \t]+import\b)",
    re.M,
)


def optional_imports() -> frozenset[str]:
    """Top-level names that the standard library, pytest and the installed pytest plugins
    (and what they require) import, read from their sources once per process: each is a
    module the runner may import at its start, present or not."""
    global _OPTIONAL
    if _OPTIONAL is None:
        import os
        import sysconfig
        from importlib import metadata

        names: set[str] = set()

        def scan(data: bytes) -> None:
            names.update((a or b).decode() for a, b in _IMPORTED.findall(data))

        skipped = {"test", "tests", "idlelib", "site-packages", "__pycache__", "lib2to3",
                   "tkinter", "turtledemo", "ensurepip"}  # fmt: skip
        for folder, dirs, files in os.walk(sysconfig.get_paths()["stdlib"]):
            dirs[:] = [d for d in dirs if d not in skipped]
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name), "rb") as f:
                        scan(f.read())
        wanted = {"pytest", "pluggy", "iniconfig"}
        for entry in metadata.entry_points(group="pytest11"):
            if entry.dist is not None and entry.dist.name != "pytest-agentgate":
                wanted.add(entry.dist.name)  # (this plugin imports nothing of a tree's)
        for dist_name in list(wanted):
            try:
                dist = metadata.distribution(dist_name)
            except metadata.PackageNotFoundError:
                continue
            wanted |= {re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or ()}
        for dist_name in wanted:
            try:
                files_of = metadata.distribution(dist_name).files or []
            except metadata.PackageNotFoundError:
                continue
            for file in files_of:
                if str(file).endswith(".py") and not skipped & set(Path(str(file)).parts):
                    try:
                        scan(file.locate().read_bytes())  # type: ignore[attr-defined]
                    except OSError:
                        continue
        _OPTIONAL = frozenset(n for n in names if n.isidentifier())
    return _OPTIONAL


#: pytest's configuration at a tree's root: each file, and the section that holds it.
_CONFIG_SECTIONS = (
    ("pyproject.toml", "tool.pytest.ini_options"),
    ("pyproject.toml", "tool.pytest"),
    ("pytest.toml", "pytest"),
    (".pytest.toml", "pytest"),
    ("pytest.ini", "pytest"),
    (".pytest.ini", "pytest"),
    ("tox.ini", "pytest"),
    ("setup.cfg", "tool:pytest"),
)


def configured(tree: str, read: Reader, key: str) -> list[str]:
    """The values the pytest configuration at ``tree``'s root gives ``key`` (a list or a
    whitespace-separated string), from every file that sets it."""
    found: list[str] = []
    for name, section in _CONFIG_SECTIONS:
        data = _section(name, read(tree, name), section)
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, str):
            found += value.split()
        elif isinstance(value, list):
            found += [str(v) for v in value]
    return found


def _configured_paths(base_tree: str, read: Reader) -> set[str]:
    """The folders the base's pytest configuration puts on ``sys.path`` (``pythonpath``)."""
    found: set[str] = set()
    for entry in configured(base_tree, read, "pythonpath"):
        folder = entry.strip().strip("/")
        while folder.startswith("./"):
            folder = folder[2:]
        found.add("" if folder in ("", ".") else folder)
    return found


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

        from . import environment
        from .collector import NAME

        # The collector the gate's pytest loads by name: a module of that name where Python
        # looks first would be loaded in its place.
        names = set(sys.stdlib_module_names) | {"sitecustomize", "usercustomize", NAME}
        names |= environment.top_level_names(_module_name)
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


def plugin_writes(content: bytes | None) -> list[str]:
    """How a module sets ``pytest_plugins``, as its syntax tree says (empty when it does not).

    Any assignment to the name at any depth (inside ``if``, ``try``, a function), augmented
    or annotated; the name as a string (``globals()["pytest_plugins"]``, ``setattr(m,
    "pytest_plugins", ...)``); and the writes to the module's own names that a reader cannot
    follow (``globals().update(...)``, ``vars()[...]``, ``setattr`` on ``sys.modules[...]``).
    A module that does not parse counts as holding the name if its text does.
    """
    if content is None:
        return []
    try:
        module = ast.parse(content)
    except (SyntaxError, ValueError):
        return ["(unparsable)"] if b"pytest_plugins" in content else []
    found: list[str] = []
    for node in ast.walk(module):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(
                isinstance(n, ast.Name) and n.id == "pytest_plugins"
                for t in targets
                for n in ast.walk(t)
            ):
                found.append(ast.dump(node))
        elif isinstance(node, ast.Constant) and node.value == "pytest_plugins":
            found.append("'pytest_plugins'")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("globals", "vars", "locals") and not node.args:
                found.append(f"{node.func.id}()")
            elif node.func.id in ("exec", "eval", "compile") or (
                node.func.id == "setattr" and node.args and _names_a_module(node.args[0])
            ):  # code no reader can follow
                found.append(ast.dump(node))
    return sorted(found)


def _names_a_module(node: ast.expr) -> bool:
    """Whether an expression reaches a module object (``sys.modules[...]``, ``__name__``)."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and inner.attr == "modules":
            return True
        if isinstance(inner, ast.Name) and inner.id in ("__name__", "__import__"):
            return True
    return False


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
