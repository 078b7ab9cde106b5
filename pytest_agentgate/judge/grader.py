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
from .gate import GateContext, GateSpec, Judging, Verdict, run_commands


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
    # Named pass-to-pass tests: those and the fail-to-pass ones alone run. By default every
    # test that passes on the base is held: the command's whole selection runs.
    ids = None if g.pass_to_pass is None else (*g.fail_to_pass, *g.pass_to_pass)
    graded = replace(spec, commands=graded_commands(spec, sys.executable), grading=None, select=ids)
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


def graded_commands(spec: GateSpec, python: str) -> tuple[results.Command, ...]:
    """The command of a graded run: the gate's first command that reports per-test
    results, whole (its wrapper, its environment, its own selection and options), run
    with only the graded tests selected (by the results collector, so an id is never a
    command-line argument, and a wrapper that takes none still runs just those); ``python
    -m pytest`` when the gate has none."""
    for command in spec.commands:
        if not spec.by_exit_code(command):
            return (command,)
    return ((python, "-m", "pytest", "-q"),)


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
    run = run_commands(
        repo, tree, found.spec, context, Judging("grade", collect=True, harness_fault=False)
    )
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
