"""The base's tests judge the attempt's code: which tree each of a gate's two sessions runs.

An agent that cannot make the code work can make the tests pass instead: weaken an assertion,
skip a test, or add a test module that monkeypatches the code in the runner's process. None
of that can move a test of a session that never loads the agent's test files. So a gate
command runs twice on an attempt that changed test files:

1. **the base's tests** on the attempt's code: the attempt's tree with every test file it
   changed or removed set back to the base's bytes, and every ``conftest.py`` or pytest
   configuration file it added removed. A test module it added stays on disk (code may
   import it) but is never collected there. Its per-test results are compared with the
   base's, test by test;
2. **the attempt's tests**: the attempt's own tree, collecting only the test modules it
   added or changed. Each test there must pass, unless it fails on the base too, and a test
   the base had in a module it changed or removed must still be there.

A test file is what belongs to the tests rather than to the code they test: a module pytest
collects as tests (``test_*.py``, ``*_test.py``, the base's own ``python_files``, doctest
files ``test*.txt``), a ``conftest.py`` or pytest configuration file, and whatever lies in a
test folder (``tests/``, ``test/``, ``unit_tests/``, ``Tests/``; a ``testing/`` folder only
outside a package: ``numpy.testing`` or ``ledger/testing/`` is code).

This is SWE-bench's reset of the test files done completely (conftest files and helpers
too, not only the files a patch names). A task whose purpose is to change existing tests
names them (``allow_changed``: files or test ids, globs allowed): a named file keeps the
attempt's bytes in the first session; a named test id is not required there.
"""

from __future__ import annotations

import fnmatch
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..git.index import IndexEntry
from . import harness, results

if TYPE_CHECKING:
    from ..git.repo import BaseRepo

#: Files that configure pytest wherever they lie (the shared files, ``tox.ini``,
#: ``setup.cfg`` and ``pyproject.toml``, are the harness rules' to judge section by section).
_CONFIG_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml"}
)
#: What pytest collects as tests unless the configuration says otherwise, and its doctest glob.
DEFAULT_PATTERNS = ("test_*.py", "*_test.py", "test*.txt")
#: A folder of tests: test, tests, and a name made with them (unit_tests, tests_e2e).
_TEST_FOLDER = re.compile(r"(tests?|.+[_-]tests?|tests?[_-].+)")


@dataclass(frozen=True)
class TestFiles:
    """What counts as a test file in one repository: pytest's patterns for test modules,
    and the folders that are packages of the code (a ``testing`` folder in one is code)."""

    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    packages: frozenset[str] = frozenset()

    def collected(self, path: str) -> bool:
        """Whether pytest collects ``path`` as a test module (or doctest file)."""
        name = path.rpartition("/")[2]
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def __contains__(self, path: str) -> bool:
        parts = path.split("/")
        if parts[-1] in _CONFIG_NAMES or self.collected(path):
            return True
        for depth, folder in enumerate(parts[:-1]):
            low = folder.lower()
            if _TEST_FOLDER.fullmatch(low):
                return True
            if low == "testing" and "/".join(parts[:depth]) not in self.packages:
                return True
        return False


def test_files(repo: BaseRepo, base_tree: str, tree: str) -> TestFiles:
    """The test files of ``tree``, an attempt on ``base_tree``: pytest's patterns as the
    base configures them (``python_files``), the packages of either tree."""
    read = repo.read_blob
    configured = harness.configured(base_tree, lambda t, p: read(f"{t}:{p}"), "python_files")
    patterns = (*(configured or DEFAULT_PATTERNS[:2]), DEFAULT_PATTERNS[2])
    packages = {
        p.rpartition("/")[0]
        for t in (base_tree, tree)
        for p in repo.tree_paths(t)
        if p.rpartition("/")[2] == "__init__.py"
    }
    return TestFiles(tuple(patterns), frozenset(packages))


def is_test_file(path: str) -> bool:
    """Whether ``path`` is a test file by pytest's default patterns (see :class:`TestFiles`)."""
    return path in TestFiles()


@dataclass(frozen=True)
class TestSplit:
    """What each session of an attempt's gate runs."""

    #: The tree the first session runs: the attempt's code, the base's tests.
    judged_tree: str
    #: Every test file the attempt added, changed or removed (for the record).
    changed: tuple[str, ...]
    #: The test modules of the attempt's tree the second session collects (added or changed).
    modules: tuple[str, ...]
    #: Test ids (or globs) the first session does not hold the attempt to.
    not_required: tuple[str, ...] = ()
    #: The files whose base tests must still be there in the attempt's own tree: its
    #: changed and removed test modules, but those named in ``allow_changed``.
    held: tuple[str, ...] = ()
    #: The test modules the attempt added: on disk in the first session, never collected.
    skipped: tuple[str, ...] = ()

    @property
    def split(self) -> bool:
        """Whether the attempt touched any test file (else one session judges it all)."""
        return bool(self.changed)


def split_tests(
    repo: BaseRepo, base_tree: str, tree: str, allow_changed: Sequence[str] = ()
) -> TestSplit:
    """How ``tree`` (an attempt on ``base_tree``) is judged: see the module's docstring."""
    diff = repo.diff_tree(base_tree, tree)
    if not diff:
        return TestSplit(tree, (), ())
    tests = test_files(repo, base_tree, tree)
    changes = [c for c in diff if c.path in tests]
    if not changes:
        return TestSplit(tree, (), ())
    globs = [p for p in allow_changed if "::" not in p]
    kept = {c.path for c in changes if any(fnmatch.fnmatchcase(c.path, g) for g in globs)}
    entries = []
    for change in changes:
        if change.path in kept:
            continue
        if change.status != "A":
            entries.append(IndexEntry(change.old_mode, change.old_oid, change.path))
        elif change.path.rpartition("/")[2] in _CONFIG_NAMES:
            entries.append(IndexEntry("0", repo.null_oid, change.path))  # pytest loads it by path
    judged = tree
    if entries:
        with tempfile.TemporaryDirectory(prefix="agentgate-tests-") as tmp:
            index = repo.index(None, Path(tmp) / "index")
            index.read_tree(tree)
            index.stage_entries(entries)
            judged = index.write_tree()
    collected = [c for c in changes if tests.collected(c.path)]
    return TestSplit(
        judged,
        tuple(sorted(c.path for c in changes)),
        tuple(sorted(c.path for c in collected if c.status != "D")),
        tuple(p for p in allow_changed if "::" in p),
        tuple(sorted(c.path for c in collected if c.status != "A" and c.path not in kept)),
        tuple(sorted(c.path for c in collected if c.status == "A" and c.path not in kept)),
    )


def gone(
    baseline: Mapping[str, str] | None,
    held: Sequence[str],
    found: Mapping[str, str],
    allowed: Sequence[str],
) -> list[str]:
    """The tests that passed on the base in a ``held`` file and that the attempt's own tree
    no longer has (``found``: what its session reported), but those ``allowed`` to go."""
    files = set(held)
    return sorted(
        t
        for t, outcome in (baseline or {}).items()
        if outcome == results.PASSED
        and t.partition("::")[0] in files
        and t not in found
        and not results.matches(t, allowed)
    )
