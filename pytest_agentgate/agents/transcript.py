"""An agent's step-by-step stream, as a person reads it: never raw JSON.

Each tool call shows with its arguments, its result shortened, and the agent's messages in
between. The format is read from the stream itself: Claude Code's ``stream-json``, Codex's
``exec --json`` events, mini-swe-agent's trajectory file, or text (Aider's chat history, any
other agent's output), which shows as it is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .usage import json_lines

#: Lines and characters of one tool result that a rendered step keeps.
RESULT_LINES = 12
RESULT_CHARS = 1200


def shortened(text: str, lines: int = RESULT_LINES, chars: int = RESULT_CHARS) -> str:
    """``text`` cut to its first ``lines`` lines and ``chars`` characters, the cut said."""
    kept = text.rstrip("\n").splitlines()
    out = "\n".join(kept[:lines])
    if len(out) > chars:
        out = out[:chars]
    left = len(text.rstrip("\n")) - len(out)
    return out + (f"\n... ({left} more characters)" if left > 0 else "")


def _indented(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines()) if text else prefix + "(empty)"


def _arguments(name: str, data: object) -> str:
    """A tool call's arguments in a line or a few: the command of a shell tool as it is."""
    if isinstance(data, dict):
        for key in ("command", "cmd"):
            value = data.get(key)
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            if isinstance(value, str):
                return value
        if "file_path" in data:
            rest = {k: v for k, v in data.items() if k != "file_path"}
            return f"{data['file_path']} " + shortened(json.dumps(rest), 3, 300)
    return shortened(json.dumps(data, ensure_ascii=False), 4, 400)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def claude(lines: Iterable[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for line in lines:
        kind, message = line.get("type"), line.get("message") or {}
        if kind == "system" and line.get("subtype") == "init":
            out.append(
                f"session started: model {line.get('model', '?')}, in {line.get('cwd', '?')}"
            )
        elif kind == "assistant":
            for block in message.get("content") or []:
                if block.get("type") == "text" and block.get("text", "").strip():
                    out.append("agent: " + block["text"].strip())
                elif block.get("type") == "tool_use":
                    name = block.get("name", "?")
                    out.append(f"-> {name}: {_arguments(name, block.get('input'))}")
        elif kind == "user":
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    mark = " (error)" if block.get("is_error") else ""
                    text = _content_text(block.get("content"))
                    out.append(f"   result{mark}:\n" + _indented(shortened(text)))
        elif kind == "result":
            usage = line.get("usage") or {}
            out.append(
                f"ended: {line.get('subtype', '?')}, {line.get('num_turns', '?')} turns, "
                f"{usage.get('input_tokens', '?')} tokens in, {usage.get('output_tokens', '?')} out"
                + (
                    f", ${line['total_cost_usd']:.4f}"
                    if isinstance(line.get("total_cost_usd"), int | float)
                    else ""
                )
            )
    return out


def codex(lines: Iterable[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for event in lines:
        kind, item = event.get("type"), event.get("item") or {}
        if kind == "item.completed":
            what = item.get("type")
            if what == "agent_message":
                out.append("agent: " + str(item.get("text", "")).strip())
            elif what == "reasoning":
                out.append("thinking: " + shortened(str(item.get("text", "")), 3, 300))
            elif what == "command_execution":
                out.append(f"-> shell: {item.get('command', '?')}")
                code = item.get("exit_code")
                out.append(
                    f"   result (exit {code}):\n"
                    + _indented(shortened(str(item.get("aggregated_output", ""))))
                )
            elif what == "file_change":
                changes = item.get("changes") or []
                shown = ", ".join(f"{c.get('kind', '?')} {c.get('path', '?')}" for c in changes)
                out.append(f"-> patch: {shown}")
            elif what:
                out.append(f"-> {what}: " + shortened(json.dumps(item), 3, 300))
        elif kind == "turn.completed":
            usage = event.get("usage") or {}
            out.append(
                f"turn ended: {usage.get('input_tokens', '?')} tokens in, "
                f"{usage.get('output_tokens', '?')} out"
            )
        elif kind in ("turn.failed", "error"):
            out.append(f"error: {event.get('message') or event.get('error')}")
    return out


def _mini_command(message: dict[str, Any], text: str) -> str:
    """The command of a mini-swe-agent step: its tool call, or its text's fenced block."""
    for call in message.get("tool_calls") or []:
        try:
            arguments = json.loads((call.get("function") or {}).get("arguments") or "{}")
        except ValueError:
            continue
        if isinstance(arguments, dict) and isinstance(arguments.get("command"), str):
            return str(arguments["command"])
    fenced = text.split("```", 2)
    return fenced[1].partition("\n")[2].strip() if len(fenced) == 3 else ""


def _mini_result(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return "   result:\n" + _indented(shortened(text))
    if not isinstance(data, dict):
        return "   result:\n" + _indented(shortened(text))
    shown = str(data.get("output") or data.get("exception_info") or "")
    return f"   result (exit {data.get('returncode', '?')}):\n" + _indented(shortened(shown))


def mini(data: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for message in data.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role, text = message.get("role"), _content_text(message.get("content")).strip()
        if role == "assistant":
            thought = text.split("```")[0].removeprefix("THOUGHT:").strip()
            if thought:
                out.append("agent: " + thought)
            command = _mini_command(message, text)
            if command:
                out.append("-> bash: " + command)
        elif role in ("user", "tool") and out:  # the task's prompt is the first user message
            out.append(_mini_result(text))
    info = data.get("info") or {}
    if info.get("exit_status"):
        out.append(f"ended: {info['exit_status']}")
    return out


def steps_tail(transcripts: Iterable[tuple[bytes, int]], lines: int) -> str:
    """The last ``lines`` lines of a try's transcripts rendered as steps; empty for none."""
    text = "\n".join(render(raw) for raw, _ in transcripts)
    return "\n".join(text.splitlines()[-lines:])


def render(raw: bytes | str) -> str:
    """The transcript as text a person reads (steps, each with its result shortened)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    stripped = text.strip()
    if stripped.startswith("{") and not stripped.startswith('{"type"'):
        try:
            whole = json.loads(stripped)
        except ValueError:
            whole = None
        if isinstance(whole, dict) and "messages" in whole:
            return "\n".join(mini(whole))
    lines = list(json_lines(text))
    kinds = {line.get("type") for line in lines}
    if kinds & {"thread.started", "item.completed", "turn.completed"}:
        return "\n".join(codex(lines))
    if kinds & {"assistant", "result"} and any("message" in e or "result" in e for e in lines):
        return "\n".join(claude(lines))
    return text
