"""New modules that take the place of one of the tree's own (part of rule ``shadowing``).

The base's tests, unchanged, would then import code the tree does not show where they expect
it. Read from the two trees' paths alone:

- a module or package named like one at the top of a folder the code is imported from (the
  tree's top, the configured ``pythonpath``, a gate's ``PYTHONPATH=``), added to another
  folder Python is given: pytest's default import mode puts first on ``sys.path`` the folder
  of each test module and ``conftest.py`` (or its first ancestor that is no package), so a
  ``tests/ledger/`` there is the ``ledger`` every test imports;
- beside a source module ``x.py``, a regular package ``x/`` (its ``__init__`` of any suffix
  Python imports) or an extension module ``x.cpython-311-x86_64-linux-gnu.so``: Python's
  finder takes either first.

A place counts when it is importable in the new tree and was not in the base: a data folder
of the base made a package counts too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence


def package_inits() -> tuple[str, ...]:
    """The ends of a package's ``__init__`` paths, one for each suffix Python imports
    (``/__init__.py``, ``/__init__.cpython-311-x86_64-linux-gnu.so``...)."""
    from importlib.machinery import all_suffixes

    return tuple(f"/__init__{suffix}" for suffix in all_suffixes())


def folders_of(path: str) -> list[str]:
    """The folders ``path`` lies in, outermost first (``a/b/c.py``: ``a``, ``a/b``)."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def taking_place(
    changed: Sequence[str],
    trees: tuple[Sequence[str], Sequence[str]],
    on_path: Collection[str],
    code_folders: Iterable[str],
    module_name: Callable[[str], str],
    links: Collection[str] = (),
) -> list[str]:
    """What of ``changed`` takes the place of one of the tree's own modules, as lines.

    ``trees``: the base's paths and the new tree's; ``on_path``: the folders Python is
    given; ``code_folders``: those whose modules are the tree's own (with every top-level
    regular package, wherever it lies); ``links``: the changed paths that are symbolic
    links in the new tree (Python follows one as readily as a folder)."""
    inits = package_inits()
    base_set, new_set = set(trees[0]), set(trees[1])

    def importable(paths: set[str], place: str) -> bool:
        name = place.rpartition("/")[2]
        return any(place + init in paths for init in inits) or (
            place in paths and (module_name(name) != name or (paths is new_set and place in links))
        )

    added: dict[str, tuple[str, str]] = {}  # place -> (folder, module)
    for path in changed:
        parts = path.split("/")
        for depth in range(len(parts)):
            place, module = "/".join(parts[: depth + 1]), module_name(parts[depth])
            if place in added or not module.isidentifier() or module.startswith("__"):
                continue
            if importable(new_set, place) and not importable(base_set, place):
                added[place] = ("/".join(parts[:depth]), module)
    compiled = [  # a package's compiled __init__ runs instead of the __init__.py it shows
        f"{path} (is imported instead of {path.rpartition('/')[0]}/__init__.py)"
        for path in changed
        if path.rpartition("/")[2].startswith("__init__.")
        and path.rpartition("/")[0]
        and _taken_first(new_set, path, ())
        and f"{path.rpartition('/')[0]}/__init__.py" in new_set
    ]
    if not added:
        return compiled
    own = _own_modules(base_set, code_folders, module_name)
    # The tree's own folders without an ``__init__`` (namespace packages): a module file
    # beside one comes first, and a folder of its name elsewhere joins it, ahead of it.
    namespaces = {p for places in own.values() for p in places if not importable(base_set, p)}
    base_dirs = {d for p in base_set for d in folders_of(p)}
    found = []
    for place, (folder, module) in sorted(added.items()):
        source = f"{folder}/{module}.py" if folder else f"{module}.py"
        beside = f"{folder}/{module}" if folder else module
        # In its own folder a regular package comes first: only another folder shadows it.
        others = sorted(o for o in own.get(module, ()) if o.rpartition("/")[0] != folder)
        if folder in on_path and others:
            found.append(f"{place} (shadows the tree's module {module!r}, {others[0]})")
        elif source in new_set and place != source and _taken_first(new_set, place, inits):
            found.append(f"{place} (is imported instead of {source})")
        elif place != beside and beside in base_dirs and not importable(base_set, beside):
            found.append(f"{place} (is imported instead of the folder {beside}/)")
    found += _joining(changed, (base_set, new_set), on_path, namespaces, module_name, inits)
    return compiled + found


def _joining(
    changed: Sequence[str],
    trees: tuple[set[str], set[str]],
    on_path: Collection[str],
    namespaces: set[str],
    module_name: Callable[[str], str],
    inits: Sequence[str],
) -> list[str]:
    """New source in a folder on the path named like one of the tree's namespace packages
    elsewhere, holding a module of a name that one holds: Python joins the two, in the
    order of ``sys.path``, so ``tests/acme/x.py`` would be the ``acme.x`` the tests import
    (a ``tests/acme/test_x.py`` beside it takes nothing's place)."""
    base_set, new_set = trees
    names = {module_name(p.rpartition("/")[2]): p for p in sorted(namespaces)}
    held: dict[str, set[str]] = {}  # a namespace folder -> the module names directly in it
    for path in base_set:
        for namespace in names.values():
            if path.startswith(namespace + "/"):
                below = path[len(namespace) + 1 :].split("/")[0]
                held.setdefault(namespace, set()).add(module_name(below))
    found: dict[str, str] = {}
    for path in changed:
        if path in base_set or not path.endswith((".py", ".so", ".pyd")):
            continue
        parts = path.split("/")
        for depth in range(len(parts) - 1):
            folder, first = "/".join(parts[:depth]), parts[depth]
            place = f"{folder}/{first}" if folder else first
            theirs = names.get(first)
            inner = module_name(parts[depth + 1])
            # Chosen first only as a module or a regular package: a bare folder there is
            # one more namespace portion, which gives way to the tree's regular package.
            taken = depth + 2 == len(parts) or any(
                "/".join(parts[: depth + 2]) + init in new_set for init in inits
            )
            if (
                folder in on_path
                and theirs is not None
                and theirs != place
                and inner in held.get(theirs, set())
                and taken
            ):
                found.setdefault(place, f"{place} (joins the tree's namespace package "
                                        f"{first!r} ahead of {theirs}/)")  # fmt: skip
    return [found[k] for k in sorted(found)]


def inserted_folders(
    paths: Iterable[str], is_test_module: Callable[[str], bool], packages: Collection[str]
) -> set[str]:
    """The folders pytest's default import mode puts on ``sys.path`` for a tree: for each
    test module and ``conftest.py``, its folder, or the first ancestor that is no package
    (a folder of ``packages``)."""
    found = set()
    for path in paths:
        if path.rpartition("/")[2] == "conftest.py" or is_test_module(path):
            folder = path.rpartition("/")[0]
            while folder and folder in packages:
                folder = folder.rpartition("/")[0]
            found.add(folder)
    return found


def _own_modules(
    paths: set[str], folders: Iterable[str], module_name: Callable[[str], str]
) -> dict[str, set[str]]:
    """The tree's own modules, each name and where it is: those at the top of ``folders``
    (a module, or a folder with Python source below it: a regular package of that name
    anywhere on ``sys.path`` comes before a namespace package), and every top-level
    regular package of a ``src`` or of a project's root, wherever it lies (a
    ``conftest.py`` or a gate that changes folder may put that folder on the path).
    ``conftest`` has a rule of its own; ``__init__`` and ``__main__`` are no top-level
    names."""
    own: dict[str, set[str]] = {}

    def add(place: str) -> None:
        module = module_name(place.rpartition("/")[2])
        if module.isidentifier() and not module.startswith("__") and module != "conftest":
            own.setdefault(module, set()).add(place)

    packages = {p.rpartition("/")[0] for p in paths if p.rpartition("/")[2].startswith("__init__.")}
    # A folder above one whose tests run is a project's root too (``svc/`` above ``svc/tests``).
    above_tests = {f.rpartition("/")[0] for f in folders if f}
    for package in packages:
        parent = package.rpartition("/")[0]
        if package and parent not in packages and (parent in above_tests or _a_root(paths, parent)):
            add(package)
    for folder in folders:
        prefix = f"{folder}/" if folder else ""
        for path in paths:
            if path.startswith(prefix):
                first, below, _ = path[len(prefix) :].partition("/")
                name = first if below else module_name(first)
                if path.endswith(".py") if below else name != first:
                    add(prefix + first)
    return own


def _a_root(paths: set[str], folder: str) -> bool:
    """Whether ``folder`` is where a project's code is imported from: a ``src``, or the
    root of a project (its packaging or its pytest configuration lies there). A package
    in a benchmark's or a test's data folder is not the tree's code."""
    if folder.rpartition("/")[2] == "src":
        return True
    prefix = f"{folder}/" if folder else ""
    return any(prefix + name in paths for name in _ROOT_FILES)


_ROOT_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "conftest.py", "pytest.ini", "tox.ini")


def _taken_first(paths: set[str], place: str, inits: Sequence[str]) -> bool:
    """Whether Python's finder takes ``place`` before a source module of its name beside it:
    a regular package, or an extension module."""
    from importlib.machinery import EXTENSION_SUFFIXES

    return any(place + init in paths for init in inits) or place.endswith(tuple(EXTENSION_SUFFIXES))
