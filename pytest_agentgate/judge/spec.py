"""What judges an attempt and what the judging answers: the gate's settings (:class:`GateSpec`),
where its commands run (:class:`GateContext`), one check's answer (:class:`CheckResult`) and
the decision (:class:`Verdict`). Plain values, no behaviour: :mod:`.gate` runs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._constants import DEFAULT_GATE_TIMEOUT_S, DEFAULT_TESTS_OF
from ..sandbox.containment import UNCONTAINED, Role, Sandbox
from ..store.record import Landing, Status
from . import harness, results
from .grading import Grading

if TYPE_CHECKING:
    from ..workspace.checkouts import GateCheckouts
    from .bytecode import Bytecode

DEFAULT_GATE_TIMEOUT = DEFAULT_GATE_TIMEOUT_S


@dataclass(frozen=True)
class CheckResult:
    """One check's answer: ``ok`` first, as people write it (``CheckResult(False, "why")``).

    ``message`` says why it failed, ``name`` which check (filled in from the check's function
    name when empty), ``output`` the evidence. ``ok`` must be a ``bool``: a non-empty string
    is true, so ``CheckResult("name", False)`` in the old order would silently pass.
    """

    ok: bool
    message: str = ""
    _: dataclasses.KW_ONLY
    name: str = ""
    output: str = ""
    #: The harness failed (a gate that could not start, a lost exit status), not the agent.
    harness_error: bool = False
    #: ... and before the command ran: nothing of the tree judged ran (see
    #: ``CommandResult.never_ran``).
    never_ran: bool = False
    #: Per-test outcomes the gate reported (test id -> passed, failed, error, skipped, xfail).
    tests: Mapping[str, str] | None = None
    #: The comparison with the base's results, when the gate reported any.
    comparison: results.Comparison | None = None
    #: Tests (or commands) that failed and then passed when run again.
    flaky: tuple[str, ...] = ()
    #: What the gate's pytest sessions loaded (see :meth:`.channel.Report.fingerprint`).
    fingerprint: frozenset[str] = frozenset()
    #: The commands from which no per-test results came back: judged by exit code.
    by_exit_code: tuple[str, ...] = ()
    #: The tree ``tests`` are the results of, when not the attempt's own ("": the tree
    #: judged): the base's tests on the attempt's code (see :mod:`.base_tests`).
    results_tree: str = ""
    #: Every test file the attempt added, changed or removed.
    changed_tests: tuple[str, ...] = ()
    #: Each gate command's whole output (at most ``sandbox.process.LOG_BYTES`` of it):
    #: (the command, the output kept, how many bytes it printed in all).
    logs: tuple[tuple[str, str, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.ok, bool):
            raise TypeError(
                f"CheckResult(ok, message='', *, name=..., output=...): ok must be True or False, "
                f"got {self.ok!r}"
            )


@dataclass(frozen=True)
class Verdict:
    """The decision on an attempt: a status, the check that decided, and the evidence."""

    status: Status
    reason: str = ""
    check: str = ""
    output: str = ""

    @property
    def accepted(self) -> bool:
        return self.status in ("promoted", "passed")


#: A check written in Python: given the attempt, returns a bool or a :class:`CheckResult`.
Check = Callable[[Any], "bool | CheckResult"]


@dataclass(frozen=True)
class GateSpec:
    """Everything that judges one attempt."""

    commands: tuple[results.Command, ...] = ()
    checks: tuple[Check, ...] = ()
    #: Globs of paths no attempt may change, beyond the harness.
    protect: tuple[str, ...] = ()
    #: The harness rules in force (see :mod:`pytest_agentgate.judge.harness`); () protects nothing.
    harness: tuple[str, ...] = harness.DEFAULT_HARNESS
    #: Tests (ids or globs) this task may remove on purpose.
    allow_removed: tuple[str, ...] = ()
    #: Test files (globs) or test ids this task may change on purpose: a file named here
    #: keeps the attempt's bytes in the base's session, a test id named here is not
    #: required there (see :mod:`.base_tests`).
    allow_changed: tuple[str, ...] = ()
    #: Whose tests judge the code: "base" (the base's test files, in a session of their
    #: own, then the attempt's added and changed test modules) or "attempt" (the attempt's
    #: whole tree in one session, its tests as it left them).
    tests_of: str = DEFAULT_TESTS_OF
    #: Only these are collected (None: whatever the command collects): test modules (paths
    #: relative to the checkout: no other Python file is collected), or test ids (a graded
    #: run: those tests alone run, by the gate's own command).
    select: tuple[str, ...] | None = None
    #: The attempt's own tests' session: each test it reports must pass unless it fails on
    #: the base too (else each is compared with the base's test by test).
    additions: bool = False
    #: Files never collected: the test modules an attempt added, in the base's session.
    skip: tuple[str, ...] = ()
    #: Test ids (or globs) the comparison with the base does not hold the attempt to.
    unrequired: tuple[str, ...] = ()
    #: The JUnit XML file a gate command that is not pytest writes, relative to its checkout.
    results_file: str | None = None
    #: How many times a failing gate command runs again on the same tree.
    rerun: int = 0
    #: What a test that fails and then passes does: "reject" (the default) or "accept".
    flaky: str = "reject"
    #: A graded task's fail-to-pass and pass-to-pass tests (see :mod:`.grading`).
    grading: Grading | None = None
    max_changed_lines: int | None = None
    #: How a passing attempt lands (merge, squash, rebase): not the gate's business, but
    #: like the limits above, the run's setting a test's marker may refine.
    landing: Landing = "merge"
    timeout: float = DEFAULT_GATE_TIMEOUT
    #: True when the user said explicitly that the test's own outcome is enough (``gate=[]``).
    outcome_is_enough: bool = False
    env: dict[str, str] = field(default_factory=dict)
    #: How many gate commands of one attempt run at once, each in its own checkout.
    jobs: int = 1
    #: Commands declared to be judged by their exit code (they run no pytest).
    exit_code: tuple[results.Command, ...] = ()
    #: "tests" (every command must report per-test results when promoting) or "exit-code"
    #: (every command may be judged by its exit code).
    results_mode: str = "tests"
    #: Commands run once in each gate checkout before its gate command (what a build must
    #: generate: a version file, compiled parts), contained the same way; judged by their
    #: exit code, never counted as the gate's tests.
    setup: tuple[str, ...] = ()

    @property
    def has_gate(self) -> bool:
        return bool(self.commands or self.checks or self.outcome_is_enough)

    def by_exit_code(self, command: results.Command) -> bool:
        """Whether ``command`` was declared to be judged by its exit code."""
        return self.results_mode == "exit-code" or command in self.exit_code


@dataclass(frozen=True)
class GateContext:
    """Where and how gate commands run: contained, as the gate role, in private checkouts.

    ``private_root`` is a directory of the run that is not beside any workspace (mode 0700);
    each checkout in it gets an unguessable name.
    """

    private_root: Path
    sandbox: Sandbox = UNCONTAINED
    role: Role = field(default_factory=lambda: Role("gate"))
    #: Checkouts kept from earlier gate runs (None: a fresh checkout for every command).
    checkouts: GateCheckouts | None = None
    #: A command from which no per-test results come back is an error unless declared so
    #: (a promoting run); else it is judged by its exit code, and the record says so.
    require_results: bool = False
    #: Bytecode the plugin compiles once for the modules of a trusted tree, given to each
    #: command that runs them unchanged (None: every command compiles its own).
    bytecode: Bytecode | None = None


@dataclass(frozen=True)
class Judging:
    """What one gate run of a tree is held to, and whose fault a failure is: the values that
    travel together from the caller to every command of the run (see
    :func:`~.gate.run_commands`)."""

    #: What the run is called in its checks' names ("gate", "baseline", "retest", ...).
    label: str = "gate"
    #: The base's per-test results the run is compared with.
    baseline: Mapping[str, str] | None = None
    #: What the gate's pytest must load (the base's fingerprint).
    expected: frozenset[str] | None = None
    #: Run every command to the end and return what they reported (a baseline, a graded run).
    collect: bool = False
    #: Whether a failing command is the harness's fault (None: when ``collect``).
    harness_fault: bool | None = None
    #: The tree whose bytes are trusted to compile bytecode from: the base's, already landed
    #: (None: nothing is compiled for the run's commands).
    trusted: str | None = None

    @property
    def fault(self) -> bool:
        return self.collect if self.harness_fault is None else self.harness_fault
