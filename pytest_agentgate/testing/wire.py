"""The three wire formats of the scripted model server: reading a request, writing a reply.

Streaming replies are written whole, with their length: a server-sent event stream read to
its end is what every client of these APIs parses, and a fixed length keeps the connection
simple.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from .steps import MINI_DONE, Finish, Run, Step, aider_text, mini_text, said, tool_call

_ids = itertools.count(1)


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Reply:
    content_type: str
    body: bytes


def dialect(path: str) -> str | None:
    """``anthropic``, ``responses`` or ``chat`` by the request's path; None for another."""
    if "://" in path:  # absolute-form, as a proxy may pass it on
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    path = path.split("?")[0].rstrip("/")
    if path.endswith("/messages"):
        return "anthropic"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/chat/completions"):
        return "chat"
    return None


def tools(kind: str | None, body: dict[str, Any]) -> list[str]:
    """The names of the tools the request offers."""
    names = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            name = tool.get("name") or (tool.get("function") or {}).get("name")
            if name:
                names.append(str(name))
    return names


def assistant_turns(kind: str | None, body: dict[str, Any]) -> int:
    """How many turns the assistant has had in the conversation the request carries."""
    if kind == "responses":
        items = body.get("input") or []
        return sum(
            1
            for item in items
            if isinstance(item, dict)
            and item.get("type") in ("function_call", "local_shell_call", "custom_tool_call")
        )
    messages = body.get("messages") or []
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def _text_of(body: dict[str, Any]) -> str:
    parts = [str(body.get("system") or "")]
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else ""
        parts.append(content if isinstance(content, str) else json.dumps(content))
    return "\n".join(parts)


def aider_style(kind: str | None, offered: list[str], body: dict[str, Any]) -> bool:
    """Whether the request is Aider's: chat with no tools, and not mini-swe-agent's text mode
    (Aider's prompt holds worked examples, so its turns cannot be counted for a step)."""
    return kind == "chat" and not offered and MINI_DONE.split()[1] not in _text_of(body)


#: Where Aider's prompt shows the fence it wants, in its worked example of a file listing.
_AIDER_FENCE = re.compile(r"path/to/filename\.js\n(`{3,}|<\w+>)\n")


def render_aider(script: list[Step], body: dict[str, Any], model: str, usage: Usage) -> Reply:
    found = _AIDER_FENCE.search(_text_of(body))
    opening = found[1] if found else "```"
    closing = f"</{opening[1:]}" if opening.startswith("<") else opening
    text = aider_text(script, (opening, closing))
    return _chat(text, None, model, usage, bool(body.get("stream")))


def render(
    kind: str | None, step: Step, offered: list[str], body: dict[str, Any], model: str, usage: Usage
) -> Reply:
    """The reply that says ``step`` to a client of ``kind``."""
    mini = MINI_DONE.split()[1] in _text_of(body)
    if isinstance(step, Finish) and mini:  # mini-swe-agent ends by running its command
        step = Run(MINI_DONE, step.say)
    call = None if isinstance(step, Finish) else tool_call(step, offered)
    stream = bool(body.get("stream"))
    if kind == "anthropic":
        return _anthropic(step, call, model, usage, stream)
    if kind == "responses":
        return _responses(step, call, model, usage)
    if kind == "chat" and not offered:  # mini-swe-agent's text mode
        return _chat(mini_text(step), None, model, usage, stream)
    return _chat(said(step), call, model, usage, stream)


def _sse(events: list[tuple[str | None, dict[str, Any]]], done: bool = False) -> Reply:
    out = []
    for name, data in events:
        out.append((f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return Reply("text/event-stream", "".join(out).encode())


def _json(data: dict[str, Any]) -> Reply:
    return Reply("application/json", json.dumps(data).encode())


# -- Anthropic Messages --------------------------------------------------------------------


def _anthropic(step: Step, call: Any, model: str, usage: Usage, stream: bool) -> Reply:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": said(step)}]
    if call is not None:
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{next(_ids):08d}", "name": call.name,
             "input": call.arguments}
        )  # fmt: skip
    stop = "tool_use" if call is not None else "end_turn"
    ident = f"msg_{next(_ids):08d}"
    tokens = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
    if not stream:
        return _json(
            {"id": ident, "type": "message", "role": "assistant", "model": model,
             "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": tokens}
        )  # fmt: skip
    start: dict[str, Any] = {
        "id": ident, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": 1,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }  # fmt: skip
    events: list[tuple[str | None, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            opened: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            ("content_block_start",
             {"type": "content_block_start", "index": index, "content_block": opened}),
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]  # fmt: skip
    events += [
        ("message_delta",
         {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
          "usage": {"output_tokens": usage.output_tokens}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return _sse(events)


# -- OpenAI Responses ----------------------------------------------------------------------


def _responses(step: Step, call: Any, model: str, usage: Usage) -> Reply:
    ident = f"resp_{next(_ids):08d}"
    if call is not None:
        item: dict[str, Any] = {
            "type": "function_call", "id": f"fc_{next(_ids):08d}",
            "call_id": f"call_{next(_ids):08d}", "name": call.name,
            "arguments": json.dumps(call.arguments), "status": "completed",
        }  # fmt: skip
    else:
        item = {
            "type": "message", "id": f"msg_{next(_ids):08d}", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": said(step), "annotations": []}],
        }  # fmt: skip
    tokens = {
        "input_tokens": usage.input_tokens, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }  # fmt: skip
    base = {"id": ident, "object": "response", "model": model, "created_at": int(time.time())}
    events: list[tuple[str | None, dict[str, Any]]] = [
        ("response.created",
         {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}}),
        ("response.output_item.done",
         {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed",
         {"type": "response.completed",
          "response": {**base, "status": "completed", "output": [item], "usage": tokens}}),
    ]  # fmt: skip
    return _sse(events)


# -- OpenAI Chat Completions ---------------------------------------------------------------


def _chat(text: str, call: Any, model: str, usage: Usage, stream: bool) -> Reply:
    ident, created = f"chatcmpl-{next(_ids):08d}", int(time.time())
    tokens = {
        "prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish = "stop"
    if call is not None:
        message["tool_calls"] = [
            {"id": f"call_{next(_ids):08d}", "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
        ]  # fmt: skip
        finish = "tool_calls"
    base = {"id": ident, "created": created, "model": model}
    if not stream:
        return _json(
            {**base, "object": "chat.completion",
             "choices": [{"index": 0, "message": message, "finish_reason": finish}],
             "usage": tokens}
        )  # fmt: skip
    delta = dict(message)
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": 0, **delta["tool_calls"][0]}]
    chunk = {**base, "object": "chat.completion.chunk"}
    events: list[tuple[str | None, dict[str, Any]]] = [
        (None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
        (None, {**chunk, "choices": [], "usage": tokens}),
    ]
    return _sse(events, done=True)
