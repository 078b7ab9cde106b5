"""The agent command: a template the plugin fills in per attempt and runs in the sandbox.

``agentgate_agent_command = my-agent --task {task} --in {workspace} --notes {feedback}`` is
split into arguments first (shell quoting rules, no shell), then each placeholder fills the
argument it stands in: a task text with spaces, quotes or ``;`` stays one argument and is never
read by a shell. A template that wants a shell names one (``sh -c '...'``).

Placeholders: ``{task}``, ``{workspace}``, ``{agent}``, ``{attempt}`` (the 1-based try within
the test) and ``{feedback}`` (a file outside the workspace, bound read-only into the sandbox,
holding the earlier attempts' verdicts and failing output: inside the workspace it would be
snapshotted and land) and ``{home}`` (the command's own empty home, outside the workspace: a
place for its configuration, history and trajectory files). ``{{`` and ``}}`` are literal
braces.
"""

from __future__ import annotations

import shlex
import string
from dataclasses import dataclass

from ..errors import AgentgateError

PLACEHOLDERS = ("task", "workspace", "agent", "attempt", "feedback", "home")


class AgentCommandError(AgentgateError):
    """An agent command template that cannot be used, and why."""

    def __init__(self, template: str, reason: str) -> None:
        self.template = template
        self.reason = reason
        super().__init__(f"agent command {template!r}: {reason}")


class AgentTimedOut(AgentgateError):
    """The agent ran longer than its timeout; every process it started was ended."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"agent timed out after {seconds:g} s")


class AgentSetupError(AgentgateError):
    """The agent command could not start its agent (its program missing or not executable,
    a file it names out of the sandbox's sight): the harness's setup, never the agent's try."""

    def __init__(self, command: str, reason: str) -> None:
        self.command = command
        self.reason = reason
        super().__init__(f"the agent command could not start: {reason} ({command})")


@dataclass(frozen=True)
class AgentCommand:
    """A checked template: its arguments, each with the placeholders it holds; and what a
    preset adds to it (see :mod:`pytest_agentgate.agents.presets`)."""

    template: str
    args: tuple[str, ...]
    #: Set in the command's environment (a preset's switches: no telemetry, no updates).
    env: tuple[tuple[str, str], ...] = ()
    #: How the agent's usage is read: a reader's name, or (field, JSON path) pairs.
    usage: str = ""
    usage_fields: tuple[tuple[str, str], ...] = ()
    #: A file in ``{home}`` holding the agent's transcript; empty: what it printed.
    transcript_file: str = ""
    #: The preset it came from, if any.
    preset: str = ""

    @classmethod
    def parse(cls, template: str) -> AgentCommand:
        """Split and check ``template``; :class:`AgentCommandError` says what is wrong."""
        try:
            args = tuple(shlex.split(template))
        except ValueError as exc:
            raise AgentCommandError(template, f"cannot be split into arguments ({exc})") from exc
        if not args:
            raise AgentCommandError(template, "is empty")
        for arg in args:
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
            except ValueError as exc:
                raise AgentCommandError(
                    template, f"{exc} in {arg!r} (write {{{{ and }}}} for literal braces)"
                ) from exc
            for name in fields:
                if name not in PLACEHOLDERS:
                    raise AgentCommandError(
                        template,
                        f"unknown placeholder {{{name}}}; the placeholders are "
                        + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS),
                    )
        return cls(template, args)

    def argv(self, **values: object) -> list[str]:
        """The command line for one attempt: each placeholder fills one argument."""
        filled = {name: str(values.get(name, "")) for name in PLACEHOLDERS}
        return [arg.format_map(filled) for arg in self.args]
