"""Agent presets, allow-lists, usage and transcripts: pure values, read from what real CLIs
printed (the files under data/agents were captured from Claude Code 2.1.332, Codex 0.171.0,
Aider 0.86.2 and mini-swe-agent 2.4.6 run against a scripted model server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_agentgate.agents import presets, transcript, usage
from pytest_agentgate.agents.reading import program_roots
from pytest_agentgate.errors import ConfigError
from pytest_agentgate.sandbox.agent_command import AgentCommand
from pytest_agentgate.sandbox.network import Network

DATA = Path(__file__).parent / "data" / "agents"


def sample(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# -- the allow-list ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port", "allowed"),
    [
        ("allow:api.anthropic.com", "api.anthropic.com", 443, True),
        ("allow:api.anthropic.com", "API.Anthropic.com.", 443, True),
        ("allow:api.anthropic.com", "api.anthropic.com", 22, False),
        ("allow:api.anthropic.com", "evil-api.anthropic.com", 443, False),
        ("allow:api.anthropic.com", "api.anthropic.com.evil.test", 443, False),
        ("allow:*.example.com", "a.b.example.com", 443, True),
        ("allow:*.example.com", "example.com", 443, False),
        ("allow:*.example.com", "badexample.com", 443, False),
        ("allow:localhost:11434", "localhost", 11434, True),
        ("allow:localhost:11434", "localhost", 11435, False),
        ("allow:localhost:11434", "127.0.0.1", 11434, False),  # a name is matched as written
        ("allow:[::1]:8000", "::1", 8000, True),
        ("allow:10.0.0.7:8080", "10.0.0.7", 8080, True),
        ("none", "api.anthropic.com", 443, False),
        ("host", "anything.test", 1, True),
    ],
)
def test_an_allow_list_lets_through_only_what_it_names(
    text: str, host: str, port: int, allowed: bool
) -> None:
    assert Network.parse(text).allows(host, port) is allowed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("lan", "network must be none, host or allow:HOST"),
        ("allow:", "names no host"),
        ("allow:localhost", "a loopback host needs its port"),
        ("allow:api.example.com:99999", "the port must be a number"),
        ("allow:http://api.example.com", "is a URL: name the host alone"),
        ("allow:a b", "is not a host name"),
    ],
)
def test_a_bad_network_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Network.parse(text)


def test_an_allow_list_reads_back_as_written() -> None:
    text = "allow:api.openai.com,127.0.0.1:8000,[::1]:9000,*.example.com"
    network = Network.parse(text)
    assert str(network) == text
    assert Network.parse(str(network)) == network
    assert [str(r) for r in network.forwards()] == ["127.0.0.1:8000", "[::1]:9000"]


# -- presets ----------------------------------------------------------------------------


def test_each_preset_parses_and_fills_every_placeholder_it_names() -> None:
    environ = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_MODEL": "m"}
    for preset in presets.PRESETS.values():
        command = AgentCommand.parse(preset.template(environ))
        argv = command.argv(task="fix it", feedback="/fb.md", home="/h", workspace="/w")
        prompt = next(a for a in argv if a.startswith("fix it"))
        assert "/fb.md" in prompt, preset.name
        assert not any("{" in a and "}" in a and "=" not in a for a in argv), argv


def test_a_preset_allows_its_api_and_the_host_of_its_base_url() -> None:
    claude = presets.find("Claude-Code")
    assert claude is not None
    assert str(claude.network({})) == "allow:api.anthropic.com"
    local = claude.network({"ANTHROPIC_BASE_URL": "http://127.0.0.1:4321"})
    assert local.allows("127.0.0.1", 4321) and not local.allows("127.0.0.1", 4322)
    remote = claude.network({"ANTHROPIC_BASE_URL": "https://gateway.corp.test/anthropic"})
    assert remote.allows("gateway.corp.test", 443)


def test_codex_is_pointed_at_its_base_url_through_its_configuration() -> None:
    codex = presets.find("codex")
    assert codex is not None
    assert "model_provider" not in codex.template({})
    argv = AgentCommand.parse(codex.template({"OPENAI_BASE_URL": "http://h:1/v1"})).argv()
    provider = next(a for a in argv if a.startswith("model_providers.agentgate="))
    assert 'base_url="http://h:1/v1"' in provider and "supports_websockets=false" in provider


# -- usage ------------------------------------------------------------------------------


def test_usage_is_read_from_what_each_real_cli_printed() -> None:
    claude = usage.claude_stream(sample("claude-code.stream.jsonl"))
    assert claude["input_tokens"] == 200 and claude["output_tokens"] == 40
    assert claude["steps"] == 2 and claude["cost"] > 0
    codex = usage.codex_json(sample("codex.events.jsonl"))
    assert codex == {"tokens": 336.0, "input_tokens": 246.0, "output_tokens": 90.0, "steps": 1.0}
    aider = usage.aider_text(sample("aider.stdout.txt"))
    assert aider == {
        "tokens": 1260.0,
        "input_tokens": 1200.0,
        "output_tokens": 60.0,
        "steps": 1.0,
        "cost": 0.0013,
    }
    mini = usage.mini_trajectory("", sample("mini-swe-agent.trajectory.json"))
    assert mini["steps"] == 2 and mini["tokens"] > 0 and mini["cost"] == pytest.approx(0.0034)


def test_usage_of_output_that_holds_none_is_empty_never_an_error() -> None:
    for reader in usage.READERS.values():
        assert reader("not json\n{broken\n", "{also broken") == {}


def test_named_paths_read_the_last_json_line_that_holds_them() -> None:
    fields = usage.parse_fields(["tokens=usage.total", "cost=bill.0.usd"])
    out = '{"usage": {"total": 5}}\nnoise\n{"usage": {"total": 7}, "bill": [{"usd": 0.5}]}\n'
    assert usage.by_paths(fields)(out, "") == {"tokens": 7.0, "cost": 0.5}
    with pytest.raises(ValueError, match="FIELD=PATH"):
        usage.parse_fields(["tokens"])


# -- transcripts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "claude-code.stream.jsonl",
            ["-> Bash: echo hello-from-bash", "result:", "ended: success"],
        ),
        ("codex.events.jsonl", ["-> shell: /bin/bash -lc", "result (exit 0):", "turn ended"]),
        ("mini-swe-agent.trajectory.json", ["-> bash: cat > hello.py", "ended: Submitted"]),
    ],
)
def test_a_transcript_reads_as_steps_never_as_raw_json(name: str, expected: list[str]) -> None:
    shown = transcript.render(sample(name))
    for part in expected:
        assert part in shown, shown
    assert '{"type"' not in shown and '"role"' not in shown


def test_a_tool_result_is_shortened_with_the_cut_said() -> None:
    long = "\n".join(f"line {i}" for i in range(100))
    event = {"type": "item.completed", "item": {"type": "command_execution", "command": "x",
                                                  "aggregated_output": long, "exit_code": 0}}  # fmt: skip
    shown = transcript.render(json.dumps({"type": "thread.started"}) + "\n" + json.dumps(event))
    assert "line 11" in shown and "line 12" not in shown and "more characters" in shown


def test_text_that_is_no_known_stream_shows_as_it_is() -> None:
    assert transcript.render(sample("aider.stdout.txt")) == sample("aider.stdout.txt")


# -- where a CLI is installed -----------------------------------------------------------


def test_a_program_s_install_folder_is_found_for_the_read_view(tmp_path: Path) -> None:
    package = tmp_path / "cli" / "node_modules" / "@scope" / "tool" / "bin"
    package.mkdir(parents=True)
    real = package / "tool.js"
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    bins = tmp_path / "cli" / "node_modules" / ".bin"
    bins.mkdir()
    (bins / "tool").symlink_to(real)
    assert program_roots("tool", str(bins)) == (tmp_path / "cli" / "node_modules",)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "agent").write_text("#!/bin/sh\n")
    (venv / "bin" / "agent").chmod(0o755)
    assert program_roots(str(venv / "bin" / "agent"), "") == (venv,)
    assert program_roots("no-such-program-here", str(bins)) == ()
