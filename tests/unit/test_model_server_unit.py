"""The scripted model server: each wire format answered with the right step, as the real
clients parse it (requests shaped like those Claude Code, Codex, Aider and mini-swe-agent
sent; the end-to-end runs with the real CLIs are in tests/test_real_agents.py)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from pytest_agentgate.testing import Finish, Run, ScriptedModelServer, Write
from pytest_agentgate.testing.steps import Step


def post(server: ScriptedModelServer, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
    request = urllib.request.Request(
        server.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read()


def tool_input(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The input of the tool call a streamed Anthropic answer holds."""
    deltas = [e["delta"] for e in found if e["type"] == "content_block_delta"]
    return dict(json.loads(next(d["partial_json"] for d in deltas if "partial_json" in d)))


def events(raw: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in raw.decode().splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


SCRIPT: list[Step] = [Run("echo one"), Write("a/b.py", "x = 1\n"), Finish("all done")]
BASH = [{"name": "Bash", "input_schema": {}}]
Body = dict[str, Any]


def test_anthropic_each_turn_gets_its_step_and_a_side_question_none() -> None:
    with ScriptedModelServer(SCRIPT) as server:
        first: Body = {"model": "m", "stream": True, "tools": BASH, "messages": [{"role": "user"}]}
        kind, raw = post(server, "/v1/messages?beta=true", first)
        assert kind == "text/event-stream"
        found = events(raw)
        assert found[0]["type"] == "message_start"
        assert tool_input(found)["command"] == "echo one"
        assert found[-2]["delta"]["stop_reason"] == "tool_use"
        # A title request has no tools: answered aside, no step used.
        _, aside = post(server, "/v1/messages", {"messages": [{"role": "user"}]})
        assert b"ok" in aside
        second: Body = {
            **first,
            "messages": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}],
        }
        call = tool_input(events(post(server, "/v1/messages", second)[1]))
        assert "base64 -d > a/b.py" in call["command"] and "mkdir -p a" in call["command"]
        third = {
            **second,
            "stream": False,
            "messages": [*second["messages"], {"role": "assistant"}],
        }
        done = json.loads(post(server, "/v1/messages", third)[1])
        assert done["stop_reason"] == "end_turn" and done["content"][0]["text"] == "all done"
        assert [r.step for r in server.requests] == [0, -1, 1, 2]
        assert done["usage"]["input_tokens"] > 0


def test_responses_api_counts_the_calls_it_was_answered() -> None:
    with ScriptedModelServer(SCRIPT) as server:
        tools = [{"type": "function", "name": "exec_command"}]
        body: Body = {"model": "m", "stream": True, "tools": tools, "input": []}
        found = events(post(server, "/v1/responses", body)[1])
        item = found[1]["item"]
        assert item["name"] == "exec_command" and json.loads(item["arguments"]) == {
            "cmd": "echo one"
        }
        assert found[-1]["type"] == "response.completed" and found[-1]["response"]["usage"]
        body["input"] = [{"type": "function_call"}, {"type": "function_call_output"}] * 2
        last = events(post(server, "/v1/responses", body)[1])[1]["item"]
        assert last["type"] == "message" and last["content"][0]["text"] == "all done"


def test_chat_with_a_bash_tool_and_mini_swe_agent_s_ending() -> None:
    with ScriptedModelServer([[Run("ls"), Finish("bye")]]) as server:
        tools = [{"type": "function", "function": {"name": "bash"}}]
        system = {"role": "system", "content": "end with COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}
        body: Body = {"model": "m", "tools": tools, "messages": [system, {"role": "user"}]}
        answer = json.loads(post(server, "/v1/chat/completions", body)[1])
        call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
        assert json.loads(call["arguments"]) == {"command": "ls"}
        body["messages"] += [{"role": "assistant"}, {"role": "tool"}]
        answer = json.loads(post(server, "/v1/chat/completions", body)[1])
        call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
        assert json.loads(call["arguments"]) == {
            "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
        }
        assert answer["usage"]["prompt_tokens"] > 0


def test_aider_gets_the_whole_script_as_whole_file_blocks_streamed() -> None:
    with ScriptedModelServer([SCRIPT, [Write("c.py", "y = 2\n")]]) as server:
        examples = [{"role": "user"}, {"role": "assistant"}] * 3  # its worked examples
        body: Body = {"model": "m", "stream": True, "messages": [{"role": "system"}, *examples]}
        found = events(post(server, "/v1/chat/completions", body)[1])
        text = found[0]["choices"][0]["delta"]["content"]
        assert "a/b.py\n```\nx = 1\n```" in text and "all done" in text
        assert found[-1]["usage"]["completion_tokens"] > 0
        # The next message is the next try: the next script.
        text = events(post(server, "/v1/chat/completions", body)[1])[0]["choices"][0]["delta"]
        assert "c.py\n```\ny = 2\n```" in text["content"]


def test_each_conversation_takes_the_next_script_and_the_last_one_again() -> None:
    with ScriptedModelServer([[Run("first")], [Run("second")]]) as server:
        body = {"tools": BASH, "messages": [{"role": "user"}]}
        commands = []
        for _ in range(3):
            found = events(post(server, "/v1/messages", {**body, "stream": True})[1])
            commands.append(tool_input(found)["command"])
        assert commands == ["first", "second", "second"]
        assert len(server.agent_requests) == 3


def test_aider_is_answered_in_the_fence_its_prompt_asked_for() -> None:
    """Aider picks another fence when a file in its chat holds ``` (a feedback file that
    quotes a transcript): an answer in the usual one would be read as no edit at all."""
    system = "You MUST use this *file listing* format:\n\npath/to/filename.js\n<source>\n// ...\n"
    with ScriptedModelServer([Write("ops.py", "y = 2\n")]) as server:
        body: Body = {"messages": [{"role": "system", "content": system}, {"role": "user"}]}
        answer = json.loads(post(server, "/v1/chat/completions", body)[1])
        assert "ops.py\n<source>\ny = 2\n</source>" in answer["choices"][0]["message"]["content"]
