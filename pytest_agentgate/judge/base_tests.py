"""The base's tests judge the attempt's code: which tree each of a gate's two sessions runs.

An agent that cannot make the code work can make the tests pass instead: weaken an assertion,
skip a test, or add a test module that monkeypatches the code in the runner's process. None
of that can move a test of a session that never loads the agent's test files. So a gate
command runs twice on an attempt that changed test files:

1. **the base's tests** on the attempt's code: the attempt's tree with every test file
   (test modules, ``conftest.py``, everything in a ``test``/``tests``/``testing`` folder,
   the pytest configuration files) set to the base's bytes; added test files are gone and
   removed ones are back. Its per-test results are compared with the base's, test by test;
2. **the attempt's tests**: the attempt's own tree, collecting only the test modules it
   added or changed. Each test there must pass, unless it fails on the base too.

This is SWE-bench's reset of the test files done completely (conftest files and helpers
too, not only the files a patch names). A task whose purpose is to change existing tests
names them (``allow_changed``: files or test ids, globs allowed): a named file keeps the
attempt's bytes in the first session; a named test id is not required there.
"""

from __future__ import annotations

import fnmatch
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


def is_test_file(path: str) -> bool:
    """Whether ``path`` belongs to the tests rather than to the code they test: a test
    module, a pytest configuration file or conftest, or anything below a folder named
    ``test``, ``tests`` or ``testing``. A folder is not a test folder merely for holding a
    test module (a Django app's ``tests.py`` lies beside its models)."""
    if harness.is_test_module(path) or path.rpartition("/")[2] in _CONFIG_NAMES:
        return True
    return any(part in harness.TEST_DIR_NAMES for part in path.split("/")[:-1])


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

    @property
    def split(self) -> bool:
        """Whether the attempt touched any test file (else one session judges it all)."""
        return bool(self.changed)


def split_tests(
    repo: BaseRepo, base_tree: str, tree: str, allow_changed: Sequence[str] = ()
) -> TestSplit:
    """How ``tree`` (an attempt on ``base_tree``) is judged: see the module's docstring."""
    changes = [c for c in repo.diff_tree(base_tree, tree) if is_test_file(c.path)]
    if not changes:
        return TestSplit(tree, (), ())
    files = [p for p in allow_changed if "::" not in p]
    kept = {c.path for c in changes if any(fnmatch.fnmatchcase(c.path, g) for g in files)}
    reset = [c for c in changes if c.path not in kept]
    judged = tree
    if reset:
        entries = [
            IndexEntry("0", repo.null_oid, c.path)
            if c.status == "A"
            else IndexEntry(c.old_mode, c.old_oid, c.path)
            for c in reset
        ]
        with tempfile.TemporaryDirectory(prefix="agentgate-tests-") as tmp:
            index = repo.index(None, Path(tmp) / "index")
            index.read_tree(tree)
            index.stage_entries(entries)
            judged = index.write_tree()
    modules = tuple(
        sorted(c.path for c in changes if c.status != "D" and harness.is_test_module(c.path))
    )
    ids = tuple(p for p in allow_changed if "::" in p)
    held = tuple(
        sorted(c.path for c in reset if c.status != "A" and harness.is_test_module(c.path))
    )
    return TestSplit(judged, tuple(sorted(c.path for c in changes)), modules, ids, held)


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
