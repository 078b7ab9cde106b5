"""Grading a benchmark task (``fail_to_pass`` / ``pass_to_pass``): the plan, found before any
agent works, and the grade of an attempt after it.

The files holding the graded tests, and the harness, are set to their content at
``tests_from`` in the tree that is graded (see :mod:`.grading`); that tree is what lands on a
``FULL`` grade.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from ..errors import ConfigError
from ..git.repo import BaseRepo
from ..workspace.snapshot import Snapshot
from . import grading, results
from .baseline import Baselines
from .gate import GateContext, GateSpec, Verdict, run_commands


@dataclass(frozen=True)
class Plan:
    """What a graded task runs, what the base did with the graded files, what must keep
    passing."""

    spec: GateSpec  # the gate that runs the graded tests by their ids
    on_base: dict[str, str]
    pass_to_pass: tuple[str, ...]


@dataclass(frozen=True)
class Graded:
    """An attempt's grade: a verdict when it does not land, else the tree that lands."""

    verdict: Verdict | None
    tree: str | None
    plan: Plan | None
    results: dict[str, object]


def plan(repo: BaseRepo, baselines: Baselines, base: str, spec: GateSpec) -> Plan:
    """The plan of a graded task from ``base``.

    Raises ``ConfigError`` when a fail-to-pass test already passes there: such a task grades
    nothing, and that is found before the agent works.
    """
    assert spec.grading is not None
    g = spec.grading
    tests_from = g.tests_from or base
    files = grading.test_files(repo, base, tests_from, g)
    tree = grading.graded_tree(repo, repo.tree_of(base), tests_from, files)
    ids = [*g.fail_to_pass, *(g.pass_to_pass or ())]
    graded = replace(
        spec, commands=(grading.command(spec.commands, sys.executable, ids),), grading=None
    )
    found = baselines.of_tree(tree, base, graded).tests or {}
    already = [t for t in g.fail_to_pass if found.get(t) == results.PASSED]
    if already:
        raise ConfigError(
            f"fail_to_pass test(s) already pass on the base (with the files of "
            f"{tests_from[:12]}): {', '.join(already)}; they grade nothing",
            value=already,
            source="fail_to_pass",
        )
    keep = g.pass_to_pass
    if keep is None:
        keep = tuple(
            sorted(t for t, o in found.items() if o == results.PASSED and t not in g.fail_to_pass)
        )
    return Plan(graded, found, keep)


def grade(
    repo: BaseRepo,
    baselines: Baselines,
    context: GateContext,
    base: str,
    snapshot: Snapshot,
    spec: GateSpec,
) -> Graded:
    """Grade the attempt whose snapshot is ``snapshot``; only FULL lands (its graded tree)."""
    assert spec.grading is not None
    g = spec.grading
    try:
        found = plan(repo, baselines, base, spec)
    except ConfigError as exc:
        return Graded(Verdict("error", str(exc), "grade"), None, None, {})
    tests_from = g.tests_from or base
    files = grading.test_files(repo, base, tests_from, g, snapshot.changed_paths)
    tree = grading.graded_tree(repo, snapshot.tree, tests_from, files)
    run = run_commands(repo, tree, found.spec, context, "grade", collect=True, harness_fault=False)
    if not run.ok and not run.harness_error:
        return Graded(Verdict("rejected", run.message, "grade", run.output), None, found, {})
    if run.flaky and spec.flaky == "reject":
        flaky = ", ".join(run.flaky[:5])
        why = f"flaky: {flaky} failed, then passed when run again"
        return Graded(Verdict("rejected", why, "grade"), None, found, {})
    if run.tests is None:
        why = run.message or "the graded tests reported nothing"
        return Graded(Verdict("error", why, "grade"), None, found, {})
    outcomes = {t: results.PASSED if o == results.FLAKY else o for t, o in run.tests.items()}
    outcome = grading.grade(outcomes, g.fail_to_pass, found.pass_to_pass)
    if outcome.grade != grading.FULL:
        verdict = Verdict("rejected", outcome.reason(), "grade", run.output)
        return Graded(verdict, tree, found, outcome.as_dict())
    return Graded(None, tree, found, outcome.as_dict())
