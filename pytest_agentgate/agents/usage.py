"""What an agent reports of its own usage, read into the try's notes.

Each reader takes what the agent printed (and the file it wrote its trajectory to, when it
writes one) and returns note fields: ``tokens`` (in and out, cache reads included), ``cost``
(in dollars, when the agent says), ``steps`` (its tool calls or model turns), and
``input_tokens`` / ``output_tokens`` when told apart. ``budget={"tokens": ...}`` on the marker
is then held to them with no code in the test.

A command that is no preset names its fields with ``FIELD=PATH`` entries
(``tokens=usage.total_tokens``): each path is read from the last JSON line of its output
that holds it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

Notes = dict[str, float]


def json_lines(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects among ``text``'s lines (other lines, a CLI's warnings, skipped)."""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict):
                yield found


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 else None


def _dig(data: object, path: str) -> object:
    for part in path.split("."):
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and part.lstrip("-").isdigit() and data:
            index = int(part)
            data = data[index] if -len(data) <= index < len(data) else None
        else:
            return None
    return data


def _kept(notes: dict[str, float | None]) -> Notes:
    return {k: v for k, v in notes.items() if v is not None}


def claude_stream(output: str, trajectory: str = "") -> Notes:
    """Claude Code's ``stream-json``: its last ``result`` line holds the totals."""
    results = [line for line in json_lines(output) if line.get("type") == "result"]
    if not results:
        return {}
    last = results[-1]
    usage: dict[str, Any] = last["usage"] if isinstance(last.get("usage"), dict) else {}
    parts = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
             "cache_read_input_tokens")  # fmt: skip
    counts = [_number(usage.get(p)) for p in parts]
    return _kept(
        {
            "tokens": sum(c for c in counts if c is not None) if any(counts) else None,
            "input_tokens": counts[0],
            "output_tokens": counts[1],
            "cost": _number(last.get("total_cost_usd")),
            "steps": _number(last.get("num_turns")),
        }
    )


def codex_json(output: str, trajectory: str = "") -> Notes:
    """Codex's ``exec --json`` events: each ``turn.completed`` carries that turn's usage;
    each completed command, patch or tool call is a step."""
    totals = {"input_tokens": 0.0, "output_tokens": 0.0, "cached_input_tokens": 0.0}
    seen, steps = False, 0
    for event in json_lines(output):
        kind = event.get("type")
        if kind == "turn.completed" and isinstance(event.get("usage"), dict):
            seen = True
            for name in totals:
                totals[name] += _number(event["usage"].get(name)) or 0.0
        elif kind == "item.completed" and _step_item(event.get("item")):
            steps += 1
    if not seen:
        return {}
    return {
        "tokens": totals["input_tokens"] + totals["output_tokens"],
        "input_tokens": totals["input_tokens"],
        "output_tokens": totals["output_tokens"],
        "steps": float(steps),
    }


def _step_item(item: object) -> bool:
    kinds = ("command_execution", "file_change", "mcp_tool_call")
    return isinstance(item, dict) and item.get("type") in kinds


_AIDER_TOKENS = re.compile(
    r"Tokens: ([\d.]+)(k?) sent(?:, ([\d.]+)(k?) cache \w+)*, ([\d.]+)(k?) received\."
    r"(?: Cost: \$([\d.]+) message, \$([\d.]+) session\.)?"
)


def _count(digits: str, kilo: str) -> float:
    return float(digits) * (1000 if kilo else 1)


def aider_text(output: str, trajectory: str = "") -> Notes:
    """Aider prints ``Tokens: 1.2k sent, 50 received. Cost: $0.01 message, $0.02 session.``
    after each model call."""
    found = list(_AIDER_TOKENS.finditer(output))
    if not found:
        return {}
    sent = sum(_count(m[1], m[2]) for m in found)
    received = sum(_count(m[5], m[6]) for m in found)
    costs = [float(m[8]) for m in found if m[8]]
    notes: Notes = {
        "tokens": sent + received,
        "input_tokens": sent,
        "output_tokens": received,
        "steps": float(len(found)),
    }
    if costs:
        notes["cost"] = costs[-1]
    return notes


def mini_trajectory(output: str, trajectory: str = "") -> Notes:
    """mini-swe-agent's trajectory file: its model stats, and each model call's usage."""
    try:
        data = json.loads(trajectory) if trajectory else None
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    stats = _dig(data, "info.model_stats")
    notes: dict[str, float | None] = {}
    if isinstance(stats, dict):
        notes["cost"] = _number(stats.get("instance_cost"))
        notes["steps"] = _number(stats.get("api_calls"))
    sent = received = 0.0
    for message in data.get("messages") or []:
        usage = _dig(message, "extra.response.usage") if isinstance(message, dict) else None
        if isinstance(usage, dict):
            sent += _number(usage.get("prompt_tokens")) or 0.0
            received += _number(usage.get("completion_tokens")) or 0.0
    if sent or received:
        notes.update(tokens=sent + received, input_tokens=sent, output_tokens=received)
    return _kept(notes)


def by_paths(fields: Sequence[tuple[str, str]]) -> Callable[[str, str], Notes]:
    """A reader of named JSON paths: each field from the last JSON line of the output (or the
    trajectory file) that holds a number there."""

    def read(output: str, trajectory: str = "") -> Notes:
        lines = list(json_lines(output))
        if trajectory:
            lines += list(json_lines(trajectory.replace("\n", " ")))
        notes: Notes = {}
        for name, path in fields:
            for line in reversed(lines):
                value = _number(_dig(line, path))
                if value is not None:
                    notes[name] = value
                    break
        return notes

    return read


READERS: dict[str, Callable[[str, str], Notes]] = {
    "claude-stream": claude_stream,
    "codex-json": codex_json,
    "aider-text": aider_text,
    "mini-trajectory": mini_trajectory,
}


def parse_fields(entries: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``FIELD=PATH`` entries, checked: a note field name and a dotted path."""
    fields = []
    for entry in entries:
        name, sep, path = entry.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name.isidentifier() or not path or " " in path:
            raise ValueError(
                f"{entry!r} is not FIELD=PATH (tokens=usage.total_tokens): a note field name, "
                "then a dotted path into the agent's last JSON line that holds it"
            )
        fields.append((name, path))
    return tuple(fields)
