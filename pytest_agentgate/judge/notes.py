"""What the gate says beside a failure: why a command could not be judged, and the notes
that point a person at the cause (a path outside the sandbox's read view, an editable install
the sandbox hides)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..sandbox.containment import Sandbox
from ..sandbox.process import CommandResult
from .channel import CHANNEL_ENV

if TYPE_CHECKING:
    from .spec import GateContext


def no_results(shown: str, output: str = "") -> str:
    """Why a command from which no per-test results came back cannot be judged."""
    if 'Error importing plugin "agentgate_collector_' in output:
        return (
            f"the gate's pytest could not load the results collector: {shown}; a wrapper "
            "replaced the PYTHONPATH that leads to it (tox's setenv, a Makefile, a script) in "
            "an environment without pytest-agentgate: keep the PYTHONPATH it is given (tox: "
            "setenv = PYTHONPATH = src{:}{env:PYTHONPATH:}; a shell: "
            "PYTHONPATH=src:$PYTHONPATH), or install pytest-agentgate into that environment "
            "(tox: deps), where it loads the collector whatever PYTHONPATH says"
        )
    return (
        f"gate reported no per-test results (judged by exit code only): {shown}; declare a "
        "gate that runs no pytest with --agentgate-gate-exit-code CMD (or results='exit-code' "
        "on the marker), or let the pytest it wraps keep the environment (tox: pass_env = "
        f"{CHANNEL_ENV} PYTEST_PLUGINS PYTHONPATH)"
    )


def outside_view(context: GateContext, result: CommandResult) -> str:
    """Why a contained command may have failed: a path it named lies outside the sandbox's
    read view (it exists here, the command could not see it)."""
    if not context.sandbox.active:
        return ""
    missing = context.sandbox.outside_view(result.output)
    if not missing:
        return ""
    shown = ", ".join(str(p) for p in missing[:3])
    return (
        f" (note: {shown} exists but lies outside the sandbox's read view; widen it with "
        "--agentgate-sandbox-read=PATH)"
    )


def hidden_editable(contained: Sandbox) -> str:
    """Why a contained gate may fail to import the project: an editable install of it from
    the base repository's working tree, which the sandbox hides on purpose."""
    if not contained.active or contained.base_tree is None:
        return ""
    from ..sandbox.containment import hidden_editable_sources

    hidden = hidden_editable_sources(contained.base_tree)
    if not hidden:
        return ""
    return (
        f" (note: {', '.join(map(str, hidden))} is installed in editable mode from the base "
        "repository, which the sandbox hides so that the gate tests its checkout, not the working "
        "tree; run the gate so that it imports the checkout (python -m pytest from its root), or "
        "install the project without -e)"
    )
