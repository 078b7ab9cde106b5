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
#: Words that make a folder one of tests wherever they stand in its name (``tests``,
#: ``regression_tests``, ``test_suite``, ``unittest``), as whole words: never a part of one
#: (``contests`` and ``latest`` hold code).
_TESTS = frozenset(
    {"test", "tests", "testsuite", "testsuites", "unittest", "unittests", "testcases", "pytests"}
)
#: Words that name a folder of tests when its name is made of them alone (``e2e``,
#: ``integration``, ``qa``); with another word beside them (``openapi_spec``) it is code.
_TEST_WORDS = frozenset(
    {"testing", "unit", "integration", "functional", "acceptance", "e2e", "spec", "specs",
     "qa", "it", "regression", "smoke", "system"}
)  # fmt: skip


def _names_tests(name: str, package: bool) -> bool:
    """Whether a folder's name says it holds tests (``testing`` only when it is no package:
    ``numpy.testing`` is code)."""
    words = {w for w in re.split(r"[\W_]+", name.lower()) if w}
    if words & _TESTS:
        return True
    return bool(words) and words <= _TEST_WORDS and not (package and words == {"testing"})


@dataclass(frozen=True)
class TestFiles:
    """What counts as a test file of one base, decided by what the base's own run of the
    gate did, never by the attempt: a file the base's tests came from (by the baseline's test
    ids) that pytest collects as tests, a ``conftest.py`` or pytest configuration file, and
    anything in a test folder of the base. A test folder is one holding such a file (or
    above it, the outermost) whose name has a whole word ``test`` or ``tests`` (or
    ``testsuite``, ``unittests``...: ``regression_tests``, ``test_suite``), or is made of
    words tests are named by alone (``e2e``, ``integration``, ``qa``; ``testing`` when it is
    no package: ``ledger/testing/`` is code). Any other folder holds code beside its tests:
    a Django app's ``tests.py`` lies beside its models, a ``contests/`` package beside its
    ``test_scoring.py``, an ``openapi_spec/`` package above its ``tests/``; a module merely
    named like a test, or matched by ``python_files = *.py``, is code unless the base's
    tests came from it."""

    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    #: The files the base's tests came from, collected as tests.
    holding: frozenset[str] = frozenset()
    #: The base's test folders.
    folders: frozenset[str] = frozenset()

    def collected(self, path: str) -> bool:
        """Whether pytest collects ``path`` as a test module (or doctest file)."""
        name = path.rpartition("/")[2]
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def __contains__(self, path: str) -> bool:
        if path.rpartition("/")[2] in _CONFIG_NAMES or path in self.holding:
            return True
        parts = path.split("/")[:-1]
        return any("/".join(parts[: depth + 1]) in self.folders for depth in range(len(parts)))


def test_files(repo: BaseRepo, base_tree: str, baseline: Mapping[str, str]) -> TestFiles:
    """The test files of ``base_tree``, from the base's configuration (``python_files``) and
    the files its results came from (``baseline``)."""
    patterns = _patterns(repo, base_tree)
    probe = TestFiles(tuple(patterns))
    holding = frozenset(f for f in {t.partition("::")[0] for t in baseline} if probe.collected(f))
    folders: set[str] = set()
    held_in = {f.rpartition("/")[0] for f in holding} - {""}
    # Of the base alone: the attempt cannot make a folder code.
    packages = (
        {p.rpartition("/")[0] for p in repo.tree_paths(base_tree) if _is_init(p)}
        if held_in
        else set()
    )
    for folder_of_tests in held_in:
        parts = folder_of_tests.split("/")
        for depth, name in enumerate(parts):  # the outermost folder named as tests holds them
            folder = "/".join(parts[: depth + 1])
            if _names_tests(name, folder in packages):
                folders.add(folder)
                break
    return TestFiles(tuple(patterns), holding, frozenset(folders))


#: The test patterns of the last few base trees (a tree's id names its content for good):
#: every attempt on a base would otherwise read its configuration files again.
_PATTERNS: dict[str, tuple[str, ...]] = {}


def _patterns(repo: BaseRepo, base_tree: str) -> tuple[str, ...]:
    found = _PATTERNS.get(base_tree)
    if found is None:
        read = repo.read_blob
        configured = harness.configured(base_tree, lambda t, p: read(f"{t}:{p}"), "python_files")
        found = (*(configured or DEFAULT_PATTERNS[:2]), DEFAULT_PATTERNS[2])
        if len(_PATTERNS) >= 32:
            _PATTERNS.clear()
        _PATTERNS[base_tree] = found
    return found


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
    #: Modules the first session has on disk as the attempt left them but never collects:
    #: those it added or changed that pytest would collect and the base's tests did not
    #: come from (code may import them; their tests are the second session's).
    skipped: tuple[str, ...] = ()

    @property
    def split(self) -> bool:
        """Whether the attempt touched any test file (else one session judges it all)."""
        return bool(self.changed)


def split_tests(
    repo: BaseRepo,
    base_tree: str,
    tree: str,
    baseline: Mapping[str, str],
    allow_changed: Sequence[str] = (),
) -> TestSplit:
    """How ``tree`` (an attempt on ``base_tree``) is judged: see the module's docstring."""
    diff = repo.diff_tree(base_tree, tree)
    if not diff:
        return TestSplit(tree, (), ())
    tests = test_files(repo, base_tree, baseline)
    changes = [c for c in diff if c.path in tests or tests.collected(c.path)]
    if not changes:
        return TestSplit(tree, (), ())
    globs = [p for p in allow_changed if "::" not in p]
    kept = {c.path for c in changes if any(fnmatch.fnmatchcase(c.path, g) for g in globs)}
    entries = []
    for change in changes:
        if change.path in kept or change.path not in tests:
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
    # A module only named like a test, changed, is code: the record does not list it.
    listed = [c.path for c in changes if c.path in tests or c.status == "A"]
    return TestSplit(
        judged,
        tuple(sorted(listed)),
        tuple(sorted(c.path for c in collected if c.status != "D")),
        tuple(p for p in allow_changed if "::" in p),
        tuple(sorted(c.path for c in collected if c.path in tests.holding and c.path not in kept)),
        tuple(
            sorted(
                c.path
                for c in collected
                if c.status != "D"
                and c.path not in kept
                and (c.status == "A" or c.path not in tests)
            )
        ),
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


def _is_init(path: str) -> bool:
    return path.rpartition("/")[2] == "__init__.py"
