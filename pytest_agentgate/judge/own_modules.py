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
    from importlib.machinery import all_suffixes

    inits = tuple(f"/__init__{suffix}" for suffix in all_suffixes())
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
    if not added:
        return []
    own = _own_modules(base_set, code_folders, module_name)
    found = []
    for place, (folder, module) in sorted(added.items()):
        source = f"{folder}/{module}.py" if folder else f"{module}.py"
        # In the module's own folder a package comes first: only another folder can shadow.
        others = sorted(o for o in own.get(module, ()) if o.rpartition("/")[0] != folder)
        if folder in on_path and others:
            found.append(f"{place} (shadows the tree's module {module!r}, {others[0]})")
        elif source in new_set and place != source and _taken_first(new_set, place, inits):
            found.append(f"{place} (is imported instead of {source})")
    return found


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
    regular package wherever it lies (a ``conftest.py`` or a gate that changes folder may
    put its folder on the path). ``conftest`` has a rule of its own; ``__init__`` and
    ``__main__`` are no top-level names."""
    own: dict[str, set[str]] = {}

    def add(place: str) -> None:
        module = module_name(place.rpartition("/")[2])
        if module.isidentifier() and not module.startswith("__") and module != "conftest":
            own.setdefault(module, set()).add(place)

    packages = {p.rpartition("/")[0] for p in paths if p.rpartition("/")[2].startswith("__init__.")}
    for package in packages:
        if package and package.rpartition("/")[0] not in packages:
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


def _taken_first(paths: set[str], place: str, inits: Sequence[str]) -> bool:
    """Whether Python's finder takes ``place`` before a source module of its name beside it:
    a regular package, or an extension module."""
    from importlib.machinery import EXTENSION_SUFFIXES

    return any(place + init in paths for init in inits) or place.endswith(tuple(EXTENSION_SUFFIXES))
