"""The ``@pytest.mark.gated(...)`` marker: what it takes, and checking it at collection.

A malformed marker is a collection error that names the test, so a typo never runs an agent
with a setting silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from .._constants import LANDINGS, MARKER, MARKER_HELP

__all__ = ["MARKER", "MARKER_HELP", "GatedMarker", "gated", "marker_of"]


#: What a retry may start from (see ``GatedMarker.retry_mode``).
RETRY_MODES = ("restart", "code", "full")
#: How a test's gate commands are judged (see ``GatedMarker.results``).
RESULTS = ("tests", "exit-code")
#: How a passing attempt lands (see ``store.record.Landing``; written here too, so that
#: loading the marker, in every pytest run, imports nothing of the store).


class GatedMarker(NamedTuple):
    """A validated ``@pytest.mark.gated(...)``."""

    task: str
    agent: str | None = None
    gate: tuple[str, ...] | None = None
    checks: tuple[Callable[[Any], Any], ...] = ()
    protect: tuple[str, ...] = ()
    max_changed_lines: int | None = None
    state: tuple[str, ...] = ()
    #: What a retry starts from: "restart" (None), "code" or "full".
    resume: str | None = None
    allow_removed: tuple[str, ...] = ()
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] | None = None
    tests_from: str | None = None
    #: How many more tries a rejected (or conflicting) attempt gets.
    retries: int = 0
    #: Limits on the sums of noted fields over the tries (``{"tokens": 100_000}``).
    budget: tuple[tuple[str, float], ...] = ()
    #: A checkpoint or recorded attempt the first try starts from; ``"latest"``: the
    #: newest earlier attempt at this task, unless there is none or it landed.
    resume_from: str | None = None
    #: "tests" (the gate's commands must report per-test results) or "exit-code".
    results: str | None = None
    #: Test files (globs) or ids the task changes on purpose (see ``judge.base_tests``).
    allow_changed: tuple[str, ...] = ()
    #: How it lands when it passes (merge, squash, rebase); None: the run's setting.
    land: str | None = None

    @property
    def retry_mode(self) -> str:
        """What a retry starts from: ``restart``, ``code`` or ``full``."""
        return self.resume or "restart"


def _check_resume(resume: Any) -> None:
    if resume is True:
        raise TypeError(
            "resume=True was the development versions' spelling: write "
            "resume_from='latest' (the first try starts from the newest earlier attempt at "
            "this task, its code and state) and resume='full' (each retry from the last try)"
        )
    if resume is not None and resume not in RETRY_MODES:
        raise TypeError(
            f"resume must be one of {', '.join(map(repr, RETRY_MODES))}, got {resume!r}"
        )


def gated(
    task: str,
    *,
    agent: str | None = None,
    gate: Any = None,
    checks: Any = (),
    protect: Any = (),
    max_changed_lines: int | None = None,
    state: Any = (),
    resume: Any = None,
    allow_removed: Any = (),
    fail_to_pass: Any = (),
    pass_to_pass: Any = None,
    tests_from: str | None = None,
    retries: int = 0,
    budget: Any = None,
    resume_from: str | None = None,
    results: str | None = None,
    allow_changed: Any = (),
    land: str | None = None,
) -> GatedMarker:
    if not isinstance(task, str) or not task.strip():
        raise TypeError(f"task must be a non-empty string, got {task!r}")
    if agent is not None and (not isinstance(agent, str) or not agent.strip()):
        raise TypeError(f"agent must be a non-empty string, got {agent!r}")
    if agent is not None and any(ord(c) < 32 or ord(c) == 127 for c in agent):
        raise TypeError(f"agent must be a plain name without control characters, got {agent!r}")
    if gate is not None:
        if isinstance(gate, str) or not all(isinstance(c, str) and c.strip() for c in gate):
            raise TypeError(f"gate must be a list of command strings, got {gate!r}")
        gate = tuple(gate)
    if isinstance(checks, str) or not all(callable(c) for c in checks):
        raise TypeError(f"checks must be a list of callables, got {checks!r}")
    if isinstance(protect, str) or not all(isinstance(p, str) for p in protect):
        raise TypeError(f"protect must be a list of glob strings, got {protect!r}")
    if max_changed_lines is not None and (
        isinstance(max_changed_lines, bool)
        or not isinstance(max_changed_lines, int)
        or max_changed_lines < 0
    ):
        raise TypeError(f"max_changed_lines must be a non-negative int, got {max_changed_lines!r}")
    state = _check_state(state)
    _check_resume(resume)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise TypeError(f"retries must be a non-negative int, got {retries!r}")
    if resume_from is not None and (not isinstance(resume_from, str) or not resume_from.strip()):
        raise TypeError(
            f"resume_from must be a checkpoint or attempt (ref or id), got {resume_from!r}"
        )
    limits = _check_budget(budget)
    _check_words("allow_removed", allow_removed, "test ids or globs")
    _check_words("allow_changed", allow_changed, "test files, test ids or globs")
    _check_grading(fail_to_pass, pass_to_pass, tests_from)
    _check_choice("results", results, RESULTS)
    _check_choice("land", land, LANDINGS)
    return GatedMarker(
        task.strip(),
        agent,
        gate,
        tuple(checks),
        tuple(protect),
        max_changed_lines,
        state,
        resume,
        tuple(allow_removed),
        tuple(fail_to_pass),
        None if pass_to_pass is None else tuple(pass_to_pass),
        tests_from,
        retries,
        limits,
        resume_from.strip() if resume_from else None,
        results,
        tuple(allow_changed),
        land,
    )


def _check_words(name: str, value: Any, what: str) -> None:
    if isinstance(value, str) or not all(isinstance(t, str) and t.strip() for t in value):
        raise TypeError(f"{name} must be a list of {what}, got {value!r}")


def _check_state(state: Any) -> tuple[str, ...]:
    """The declared state paths, normalised: relative or absolute, never everything, never
    overlapping."""
    if isinstance(state, str) or not all(isinstance(p, str) and p.strip() for p in state):
        raise TypeError(f"state must be a list of paths, got {state!r}")
    for path in state:
        if ".." in Path(path).parts or path.strip("/").split("/")[0] == "@abs":
            raise TypeError(
                f"state paths are relative to the workspace or absolute, without '..' "
                f"(and never under '@abs/'): {path!r}"
            )
        if Path(path).is_absolute() and Path(path) == Path("/"):
            raise TypeError("state=['/'] would carry the whole machine: name what the task keeps")
    from ..workspace.state import normalise, overlapping

    if any(normalise(p) in (".", "/") for p in state):
        raise TypeError("state=['.'] or ['/'] would carry everything: name what the task keeps")
    state = tuple(normalise(p) for p in state)
    overlap = overlapping(state)
    if overlap:
        raise TypeError(
            f"state paths {overlap[0]!r} and {overlap[1]!r} overlap: declare the outer one alone"
        )
    return tuple(state)


def _check_budget(budget: Any) -> tuple[tuple[str, float], ...]:
    """The budget as sorted (noted field, limit) pairs."""
    limits: list[tuple[str, float]] = []
    if budget is not None:
        if not isinstance(budget, dict) or not all(
            isinstance(k, str)
            and k.isidentifier()
            and isinstance(v, int | float)
            and not isinstance(v, bool)
            and v > 0
            for k, v in budget.items()
        ):
            raise TypeError(
                f"budget must map noted field names to positive numbers, got {budget!r}"
            )
        limits = sorted((k, float(v)) for k, v in budget.items())
    return tuple(limits)


def _check_grading(fail_to_pass: Any, pass_to_pass: Any, tests_from: Any) -> None:
    for name, ids in (("fail_to_pass", fail_to_pass), ("pass_to_pass", pass_to_pass or ())):
        if isinstance(ids, str) or not all(isinstance(t, str) and "::" in t for t in ids):
            raise TypeError(f"{name} must be a list of pytest node ids (path::test), got {ids!r}")
    if tests_from is not None and (not isinstance(tests_from, str) or not tests_from.strip()):
        raise TypeError(f"tests_from must be a revision, got {tests_from!r}")
    if (pass_to_pass is not None or tests_from) and not fail_to_pass:
        raise TypeError("pass_to_pass= and tests_from= grade a task: name its fail_to_pass= tests")


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise TypeError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def marker_of(item: pytest.Item) -> GatedMarker | None:
    """The test's validated marker, or None; raises ``TypeError`` naming what is wrong."""
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return None
    return gated(*mark.args, **mark.kwargs)
