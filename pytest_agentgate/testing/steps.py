"""What a scripted model says, step by step, and how each kind of agent is told it.

A script is a list of steps: :class:`Run` a shell command, :class:`Write` a file, and
:class:`Finish` with a message. The same script drives every agent; what differs is how a
step is spelled for it:

- an agent with a shell tool (Claude Code's ``Bash``, Codex's ``shell``, any ``bash`` or
  ``shell`` function) gets a call of that tool; a :class:`Write` is a shell command too, the
  file's bytes in base64, so every byte arrives as written;
- mini-swe-agent calls its ``bash`` tool (or, in its text mode, reads one fenced
  ``mswea_bash_command`` block), and ends by running ``echo
  COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``: a :class:`Finish` is that command for it;
- Aider has no shell, and asks its model once a message: the whole script is one answer,
  each :class:`Write` a whole-file block of its ``whole`` edit format, each :class:`Run`
  said as text only.

Which step answers a request is read from the request itself (how many turns the assistant
has had in it), so a client that retries a request gets the same answer.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable
from dataclasses import dataclass

#: What mini-swe-agent's prompt asks a finished agent to run.
MINI_DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@dataclass(frozen=True)
class Run:
    """Run ``command`` in the agent's shell."""

    command: str
    say: str = ""


@dataclass(frozen=True)
class Write:
    """Write ``content`` to ``path`` (relative to where the agent works)."""

    path: str
    content: str
    say: str = ""

    def as_command(self) -> str:
        data = base64.b64encode(self.content.encode()).decode()
        folder = self.path.rpartition("/")[0]
        make = f"mkdir -p {shlex.quote(folder)} && " if folder else ""
        return f"{make}printf %s {data} | base64 -d > {shlex.quote(self.path)}"


@dataclass(frozen=True)
class Finish:
    """End the task with ``say``."""

    say: str = "Done."


Step = Run | Write | Finish


def command_of(step: Run | Write) -> str:
    return step.command if isinstance(step, Run) else step.as_command()


def said(step: Step) -> str:
    """The text the assistant says with the step."""
    if step.say:
        return step.say
    if isinstance(step, Run):
        return f"I will run `{step.command}`."
    if isinstance(step, Write):
        return f"I will write {step.path}."
    return "Done."


def mini_text(step: Step) -> str:
    """A step as mini-swe-agent reads it: a thought and one bash block."""
    command = MINI_DONE if isinstance(step, Finish) else command_of(step)
    return f"THOUGHT: {said(step)}\n\n```mswea_bash_command\n{command}\n```"


def aider_text(script: list[Step], fence: tuple[str, str] = ("```", "```")) -> str:
    """A script as one answer in Aider's ``whole`` edit format: each file's path, then its
    whole content between ``fence`` (the one Aider's prompt asked for: it picks another
    when a file in its chat holds the usual one)."""
    parts = []
    opening, closing = fence
    for step in script:
        if isinstance(step, Write):
            body = step.content if step.content.endswith("\n") else step.content + "\n"
            parts.append(f"{said(step)}\n\n{step.path}\n{opening}\n{body}{closing}\n")
        elif isinstance(step, Run):
            parts.append(f"{said(step)} (Aider has no shell here: `{step.command}` is not run.)")
        else:
            parts.append(said(step))
    return "\n".join(parts)


@dataclass(frozen=True)
class ToolCall:
    """A step as a call of the agent's shell tool: its name and its arguments."""

    name: str
    arguments: dict[str, object]


#: Tool names that mean "run a shell command", and how each takes its command.
SHELL_TOOLS: dict[str, Callable[[str], dict[str, object]]] = {
    "Bash": lambda c: {"command": c, "description": "scripted step"},
    "bash": lambda c: {"command": c},
    "shell": lambda c: {"command": ["bash", "-lc", c]},
    "shell_command": lambda c: {"command": c},
    "exec_command": lambda c: {"cmd": c},
    "run_shell_command": lambda c: {"command": c},
}


def tool_call(step: Run | Write, offered: list[str]) -> ToolCall | None:
    """The call of a shell tool among ``offered`` that does ``step``; None when no shell
    tool is offered."""
    for name in offered:
        make = SHELL_TOOLS.get(name)
        if make is not None:
            return ToolCall(name, make(command_of(step)))
    return None
