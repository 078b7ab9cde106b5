"""Real agent CLIs, end to end through the plugin: Claude Code, Codex, Aider and
mini-swe-agent, each installed from its registry, run by ``--agentgate-agent=NAME`` and no
other agent option, contained, against the scripted model server on loopback.

One pytest run per CLI, three gated tests in it:

- ``test_honest``: a right edit (after reaching for a host not on the list) is promoted; the
  refused connection is on the record; ``agentgate show`` renders the transcript as steps;
- ``test_retry``: an edit that breaks a passing test is rejected, the next try reads the
  feedback (the model server sees the verdict in what the CLI sent it) and lands;
- ``test_budget``: the CLI's own usage report stops the retries at ``budget=``.

Where a CLI cannot be installed (no registry, no npm) the test skips with why, and fails
under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_clis import CLIS, NotInstalled, install
from helpers import git, write

from pytest_agentgate.testing import Finish, Run, ScriptedModelServer, Write

BROKEN = "def add(a, b):\n    return a * b\n"
FIXED = "def add(a, b):\n    return a + b\n"
MUL = "def mul(a, b):\n    return a * b\n"

SUITE = textwrap.dedent(
    """
    import pytest

    @pytest.mark.gated(task="make add() add")
    def test_honest(agent_workspace):
        agent_workspace.run_agent()

    @pytest.mark.gated(task="make mul() multiply, and read the feedback", retries=1)
    def test_retry(agent_workspace):
        agent_workspace.run_agent()

    @pytest.mark.gated(task="make add() add, within budget", retries=3, budget={"tokens": 100})
    def test_budget(agent_workspace):
        agent_workspace.run_agent()
    """
)

#: Each shell step: what the CLI's own tool runs (Aider has no shell: its edits only).
REACH_OUT = Run(
    "python3 -c \"import urllib.request as u; u.urlopen('http://example.com/', timeout=5)\" || true"
)
READ_FEEDBACK = Run('cat "$AGENTGATE_FEEDBACK"')


def scripts(shell: bool) -> list[list[Run | Write | Finish]]:
    """One script a conversation, in the order the tries come."""
    first = [REACH_OUT] if shell else []
    retry = [READ_FEEDBACK] if shell else []
    return [
        [*first, Write("calc.py", FIXED), Finish("add() adds now")],  # test_honest
        [Write("calc.py", BROKEN), Finish("done (wrongly)")],  # test_retry, try 1
        [*retry, Write("ops.py", MUL), Finish("fixed after the feedback")],  # try 2
        [Write("calc.py", BROKEN), Finish("done (wrongly)")],  # test_budget, try 1
    ]


def environment(name: str, server: ScriptedModelServer) -> dict[str, str]:
    """What a person sets for the CLI: its key, its base URL, its model."""
    model = "scripted-model"
    return {
        "claude-code": {"ANTHROPIC_API_KEY": "sk-scripted", "ANTHROPIC_BASE_URL": server.url,
                        "ANTHROPIC_MODEL": model},
        "codex": {"OPENAI_API_KEY": "sk-scripted", "OPENAI_BASE_URL": server.url + "/v1",
                  "OPENAI_MODEL": model},
        "aider": {"OPENAI_API_KEY": "sk-scripted", "OPENAI_API_BASE": server.url + "/v1",
                  "AIDER_MODEL": f"openai/{model}"},
        "mini-swe-agent": {"OPENAI_API_KEY": "sk-scripted", "OPENAI_API_BASE": server.url + "/v1",
                           "MSWEA_MODEL_NAME": f"openai/{model}"},
    }[name]  # fmt: skip


def installed(name: str) -> Path:
    try:
        return install(CLIS[name])
    except NotInstalled as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc} (CI=true: the real agents must run)", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write(repo, {
        "calc.py": "def add(a, b):\n    return a - b\n",
        "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
        "ops.py": "def mul(a, b):\n    return a + b\n",
        "test_ops.py": "from ops import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n",
    })  # fmt: skip
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    return repo


def agentgate(repo: Path, *args: str) -> str:
    command = [sys.executable, "-m", "pytest_agentgate", *args]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", sorted(CLIS))
def test_a_real_agent_is_gated_end_to_end(
    name: str, pytester: pytest.Pytester, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = installed(name)
    shell = name != "aider"
    with ScriptedModelServer(scripts(shell)) as server:
        for key, value in environment(name, server).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        pytester.makepyfile(test_agents=SUITE)
        report = pytester.path / "report.json"
        result = pytester.runpytest_subprocess(
            f"--agentgate-repo={project}", "--agentgate-promote", f"--agentgate-agent={name}",
            f"--agentgate-gate={sys.executable} -m pytest -q -p no:randomly -p no:cacheprovider",
            f"--agentgate-report={report}", "-p", "no:randomly", "-p", "no:cacheprovider",
            timeout=600,
        )  # fmt: skip
        sent = [json.dumps(r.body) for r in server.agent_requests]
    rows = json.loads(report.read_text())["attempts"]
    tries = [(r["test"].split("::")[1], r["verdict"]) for r in rows]
    assert tries == [
        ("test_honest", "promoted"),
        ("test_retry", "rejected"),
        ("test_retry", "promoted"),
        ("test_budget", "rejected"),
    ], result.stdout.str()
    result.assert_outcomes(passed=2, failed=1)
    assert git(project, "show", "main:calc.py") == FIXED.strip()
    assert git(project, "show", "main:ops.py") == MUL.strip()

    honest, budget = rows[0], rows[-1]
    # Its own usage report, read into the notes: the budget stopped the retries at one try.
    assert budget["notes"]["tokens"] > 100 and budget["budget"]["tokens"][0] > 100
    assert all(r["notes"].get("tokens", 0) > 0 for r in rows)
    # The next try read the verdict of the one before (its tool's output, or Aider's --read):
    # the prompt names the file only, so the words reached the model by the agent reading it.
    assert any("Try 1: rejected" in s for s in sent), sent[-1][:2000]
    if shell:  # and with it, the end of what the agent did in that try, as steps
        assert any("What the agent did" in s for s in sent)
    # A host not on the list was refused and is on the record.
    refused = " ".join(honest["refused"])
    assert ("example.com:80" if shell else "raw.githubusercontent.com:443") in refused
    shown = agentgate(project, "show", honest["attempt_ref"].rsplit("attempts/", 1)[1])
    assert "Connections the allow-list refused:" in shown
    # The transcript reads as steps, never as raw JSON.
    assert "Agent transcript (last lines):" in shown
    assert '{"type"' not in shown and '"role":' not in shown
    assert ("-> " in shown) if shell else ("#### make add() add" in shown), shown
    whole = agentgate(project, "show", "--transcript", honest["attempt_ref"].split("attempts/")[1])
    assert "agent-transcript" in whole and '{"type"' not in whole
    assert ("-> " in whole) if shell else ("#### make add() add" in whole), whole
