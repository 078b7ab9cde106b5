"""The checks that decide an attempt, and the verdict they make.

Order matters and is fixed: the test's own outcome, the diff limits, checks written in Python,
then gate commands, each in a clean checkout of the exact tree being judged. The first check
that fails decides; later ones are not run.
"""

from __future__ import annotations

import fnmatch
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .removal import remove_tree
from .sandbox import UNCONTAINED, Role, Sandbox, run_contained
from .workspace import changed_lines, checkout_tree

if TYPE_CHECKING:
    from .repo import BaseRepo
    from .workspace import Snapshot

Status = Literal["promoted", "passed", "rejected", "conflict", "error"]
DEFAULT_GATE_TIMEOUT = 600.0


@dataclass(frozen=True)
class CheckResult:
    """One check's answer. ``name`` says which check, ``message`` why it failed."""

    name: str
    ok: bool
    message: str = ""
    output: str = ""
    #: The harness failed (a gate that could not start, a lost exit status), not the agent.
    harness_error: bool = False


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

    commands: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()
    protect: tuple[str, ...] = ()
    max_changed_lines: int | None = None
    timeout: float = DEFAULT_GATE_TIMEOUT
    #: True when the user said explicitly that the test's own outcome is enough (``gate=[]``).
    outcome_is_enough: bool = False
    env: dict[str, str] = field(default_factory=dict)

    @property
    def has_gate(self) -> bool:
        return bool(self.commands or self.checks or self.outcome_is_enough)


@dataclass(frozen=True)
class GateContext:
    """Where and how gate commands run: contained, as the gate role, in private checkouts.

    ``private_root`` is a directory of the run that is not beside any workspace (mode 0700);
    each checkout in it gets an unguessable name.
    """

    private_root: Path
    sandbox: Sandbox = UNCONTAINED
    role: Role = field(default_factory=lambda: Role("gate"))


def check_limits(repo: BaseRepo, snap: Snapshot, spec: GateSpec) -> CheckResult:
    """Protected paths and the changed-line budget."""
    if spec.protect:
        touched = [
            path
            for path in snap.changed_paths
            if any(fnmatch.fnmatchcase(path, pattern) for pattern in spec.protect)
        ]
        if touched:
            return CheckResult("protect", False, f"changes protected paths: {', '.join(touched)}")
    if spec.max_changed_lines is not None:
        lines = changed_lines(repo, snap.base_tree, snap.tree)
        if lines > spec.max_changed_lines:
            return CheckResult(
                "max_changed_lines",
                False,
                f"changes {lines} lines, over max_changed_lines={spec.max_changed_lines}",
            )
    return CheckResult("limits", True)


def run_check(check: Check, attempt: Any) -> CheckResult:
    """Run one Python check; an exception it raises is a failed check, not a crash."""
    name = getattr(check, "__name__", repr(check))
    try:
        answer = check(attempt)
    except Exception as exc:
        return CheckResult(name, False, f"check {name} raised {type(exc).__name__}: {exc}")
    if isinstance(answer, CheckResult):
        return answer
    if isinstance(answer, bool):
        return CheckResult(name, answer, "" if answer else f"check {name} returned False")
    return CheckResult(
        name, False, f"check {name} returned {answer!r}; return a bool or a CheckResult"
    )


def run_commands(
    repo: BaseRepo, tree: str, spec: GateSpec, context: GateContext | Path, label: str = "gate"
) -> CheckResult:
    """Run each gate command in its own clean checkout of ``tree``; the first failure decides.

    Each command runs in the sandbox when there is one, with the gate's environment, and
    nothing it started outlives it. A command the plugin could not start (or whose exit
    status was lost) is a harness error, never the agent's failure.
    """
    if isinstance(context, Path):
        context = GateContext(context)
    for command in spec.commands:
        name = secrets.token_hex(16)
        checkout = checkout_tree(repo, tree, context.private_root, name=name)
        private = context.private_root / f"{name}.private"
        # What the gate runs is the agent's code: give its git no inherited repository to
        # reach, and no way up out of the checkout (which has no .git of its own).
        env = dict(spec.env)
        env["GIT_CEILING_DIRECTORIES"] = str(checkout.parent)
        env["AGENTGATE_CHECKOUT"] = str(checkout)
        env["AGENTGATE_ACTIVE"] = "1"
        try:
            result = run_contained(
                context.sandbox,
                context.role,
                command,
                cwd=checkout,
                private=private,
                timeout=spec.timeout,
                env=env,
            )
        finally:
            remove_tree(checkout)
            remove_tree(private)
        if result.launch_error:
            return CheckResult(
                f"{label}: {command}", False, f"{result.launch_error} ({command})", result.tail(),
                harness_error=True,
            )  # fmt: skip
        if result.timed_out:
            return CheckResult(
                f"{label}: {command}", False, f"gate timed out after {spec.timeout:g} s: {command}",
                result.tail(),
            )  # fmt: skip
        if result.returncode != 0:
            return CheckResult(
                f"{label}: {command}",
                False,
                f"gate command exited {result.returncode}: {command}"
                + _hidden_editable_note(context.sandbox),
                result.tail(),
            )
    return CheckResult("gate", True)


def _hidden_editable_note(contained: Sandbox) -> str:
    """Why a contained gate may fail to import the project: an editable install of it from
    the base repository's working tree, which the sandbox hides on purpose."""
    if not contained.active or contained.base_tree is None:
        return ""
    from .sandbox import hidden_editable_sources

    hidden = hidden_editable_sources(contained.base_tree)
    if not hidden:
        return ""
    return (
        f" (note: {', '.join(map(str, hidden))} is installed in editable mode from the base "
        "repository, which the sandbox hides so that the gate tests its checkout, not the working "
        "tree; run the gate so that it imports the checkout (python -m pytest from its root), or "
        "install the project without -e)"
    )


def judge(
    repo: BaseRepo,
    snap: Snapshot,
    spec: GateSpec,
    attempt: Any,
    context: GateContext | Path,
    extra_checks: Sequence[Check] = (),
) -> list[CheckResult]:
    """Run the checks in order and return them up to and including the first failure."""
    results: list[CheckResult] = []
    limits = check_limits(repo, snap, spec)
    results.append(limits)
    if not limits.ok:
        return results
    for check in (*spec.checks, *extra_checks):
        outcome = run_check(check, attempt)
        results.append(outcome)
        if not outcome.ok:
            return results
    if spec.commands:
        results.append(run_commands(repo, snap.tree, spec, context))
    return results
