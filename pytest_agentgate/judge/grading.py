"""Benchmark grading in SWE-bench's words: fail-to-pass, pass-to-pass, and a grade.

A graded task names the tests that must go from failing to passing (``fail_to_pass``) and
those that must keep passing (``pass_to_pass``, by default every test that passed on the
base). The files holding those tests, and the harness (conftest files, pytest configuration
files, test-directory ``__init__.py``), are set to their content at ``tests_from`` (by default
the base) in the tree that is graded, so an agent that edits a graded test to pass gains
nothing; that graded tree, not the agent's raw tree, is the one promoted. The grade is
``FULL`` (every test passes), ``PARTIAL`` (some fail-to-pass tests pass, every pass-to-pass
test passes) or ``NO``; only ``FULL`` promotes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..git.index import IndexEntry
from . import results

if TYPE_CHECKING:
    from ..git.repo import BaseRepo

FULL, PARTIAL, NO = "FULL", "PARTIAL", "NO"
_HARNESS_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml"}
)


@dataclass(frozen=True)
class Grading:
    """What a graded task is graded on."""

    fail_to_pass: tuple[str, ...] = ()
    #: None: every test that passed on the base (with the graded files of ``tests_from``).
    pass_to_pass: tuple[str, ...] | None = None
    #: The commit whose graded files and harness are put into the graded tree (None: the base).
    tests_from: str | None = None

    def files(self) -> list[str]:
        """The files that hold the graded tests (the part of a node id before ``::``)."""
        ids = (*self.fail_to_pass, *(self.pass_to_pass or ()))
        return sorted({test.split("::", 1)[0] for test in ids})


@dataclass(frozen=True)
class Grade:
    """The grade and each graded test's outcome."""

    grade: str
    outcomes: Mapping[str, str]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]

    def reason(self) -> str:
        still = [t for t in self.fail_to_pass if self.outcomes.get(t) != results.PASSED]
        broke = [t for t in self.pass_to_pass if self.outcomes.get(t) != results.PASSED]
        parts = []
        if still:
            parts.append(f"fail-to-pass still not passing: {', '.join(still[:5])}")
        if broke:
            parts.append(f"pass-to-pass no longer passing: {', '.join(broke[:5])}")
        return f"grade {self.grade}" + (f" ({'; '.join(parts)})" if parts else "")

    def as_dict(self) -> dict[str, object]:
        return {
            "grade": self.grade,
            "fail_to_pass": {t: self.outcomes.get(t, "missing") for t in self.fail_to_pass},
            "pass_to_pass": {t: self.outcomes.get(t, "missing") for t in self.pass_to_pass},
        }


def test_files(
    repo: BaseRepo, base: str, tests_from: str, grading: Grading, changed: Iterable[str] = ()
) -> list[str]:
    """The files a graded tree takes from ``tests_from``: those holding the graded tests, and
    every test file (in a test directory, or a test module) that differs between the base and
    ``tests_from`` or that the attempt changed: the helpers and data the graded tests use
    are graded too, as SWE-bench applies a whole test patch."""
    from . import harness

    differing = repo.diff_tree(repo.tree_of(base), repo.tree_of(tests_from))
    candidates = {*(c.path for c in differing), *changed}
    test_dirs = harness.test_directories(repo.tree_paths(repo.tree_of(tests_from)))
    picked = {p for p in candidates if harness.is_test_path(p, test_dirs)}
    return sorted(picked | set(grading.files()))


def graded_tree(repo: BaseRepo, tree: str, tests_from: str, files: Iterable[str]) -> str:
    """``tree`` with ``files`` and the harness set to their content at ``tests_from``.

    A file ``tests_from`` lacks is removed from the graded tree; harness files are those of
    either tree, so a conftest the attempt added goes too.
    """
    source_tree = repo.tree_of(tests_from)
    paths = set(files)
    # One listing of each tree: the source's entries (mode and object) answer every lookup.
    source: dict[str, IndexEntry] = {}
    for listed in (source_tree, tree):
        for entry in repo.ls_tree(listed):
            if listed == source_tree:
                source[entry.path] = IndexEntry(entry.mode, entry.oid, entry.path)
            if entry.path.rsplit("/", 1)[-1] in _HARNESS_NAMES:
                paths.add(entry.path)
    with tempfile.TemporaryDirectory(prefix="agentgate-grade-") as tmp:
        index = repo.index(None, Path(tmp) / "index")
        index.read_tree(tree)
        # A path the source lacks leaves the graded tree (mode 0 removes it).
        index.stage_entries(
            [source.get(path, IndexEntry("0", repo.null_oid, path)) for path in sorted(paths)]
        )
        return index.write_tree()


def grade(
    outcomes: Mapping[str, str], fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]
) -> Grade:
    passed = {t for t, o in outcomes.items() if o == results.PASSED}
    keeps = all(t in passed for t in pass_to_pass)
    fixed = [t for t in fail_to_pass if t in passed]
    if keeps and len(fixed) == len(fail_to_pass):
        verdict = FULL
    elif keeps and fixed:
        verdict = PARTIAL
    else:
        verdict = NO
    return Grade(verdict, dict(outcomes), tuple(fail_to_pass), tuple(pass_to_pass))
