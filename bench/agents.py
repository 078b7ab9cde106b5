"""What the plugin costs a real agent CLI: one preset agent run beside the same CLI run bare,
both against the same scripted model server on loopback, doing the same edit.

Bare: the CLI's own command line (the preset's, filled in) in a copy of the project, with the
preset's environment and an empty home, as a person would run it. Through the plugin: a
workspace forked by the engine, ``run_agent()`` with ``--agentgate-agent=NAME``: the
sandbox, the unprivileged user, the egress proxy and its relay, reading the usage and the
transcript. The ratio is the figure; the agent's own time (its start-up, its model calls)
is the floor both share.

    python bench/agents.py              # every CLI installed in the suite's cache, 5 runs each
    python bench/agents.py --install    # install the missing ones first (npm, PyPI)
    python bench/agents.py --quick      # one run of one installed CLI (a smoke test)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from agent_clis import CLIS, NotInstalled, install  # noqa: E402

from pytest_agentgate import Engine, GateSpec  # noqa: E402
from pytest_agentgate.agents.presets import PRESETS  # noqa: E402
from pytest_agentgate.sandbox.agent_command import AgentCommand  # noqa: E402
from pytest_agentgate.sandbox.containment import Settings  # noqa: E402
from pytest_agentgate.testing import Finish, Run, ScriptedModelServer, Write  # noqa: E402

FIXED = "def add(a, b):\n    return a + b\n"
GIT_ENV = {"GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "b@example.com",
           "GIT_COMMITTER_NAME": "Bench", "GIT_COMMITTER_EMAIL": "b@example.com"}  # fmt: skip


def project(root: Path) -> Path:
    repo = root / "project"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    return repo


def keys(name: str, server: ScriptedModelServer) -> dict[str, str]:
    base = server.url + "/v1"
    return {
        "claude-code": {"ANTHROPIC_API_KEY": "sk-bench", "ANTHROPIC_BASE_URL": server.url},
        "codex": {"OPENAI_API_KEY": "sk-bench", "OPENAI_BASE_URL": base, "OPENAI_MODEL": "m"},
        "aider": {"OPENAI_API_KEY": "sk-bench", "OPENAI_API_BASE": base, "AIDER_MODEL": "openai/m"},
        "mini-swe-agent": {"OPENAI_API_KEY": "sk-bench", "OPENAI_API_BASE": base,
                           "MSWEA_MODEL_NAME": "openai/m"},
    }[name]  # fmt: skip


def bare(name: str, folder: Path, repo: Path, root: Path) -> float:
    """One run of the CLI as a person runs it: its command line, its environment."""
    preset = PRESETS[name]
    work, home = root / f"bare-{time.monotonic_ns()}", root / f"home-{time.monotonic_ns()}"
    shutil.copytree(repo, work)
    home.mkdir()
    feedback = root / "feedback.md"
    feedback.write_text("This is the first try.\n")
    argv = AgentCommand.parse(preset.template(os.environ)).argv(
        task="make add() add", workspace=work, feedback=feedback, home=home
    )
    env = {**os.environ, **preset.fixed_env, "HOME": str(home), "IS_SANDBOX": "1",
           "NO_PROXY": "127.0.0.1,localhost"}  # fmt: skip
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    begin = time.perf_counter()
    subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                   timeout=300, check=True)  # fmt: skip
    seconds = time.perf_counter() - begin
    assert (work / "calc.py").read_text() == FIXED, f"{name} made no edit bare"
    return seconds


def gated(name: str, engine: Engine) -> float:
    """One run through the plugin: a forked workspace, ``run_agent()`` under the preset."""
    preset = PRESETS[name]
    ws = engine.fork(task="make add() add")
    ws.agent_command = replace(
        AgentCommand.parse(preset.template(os.environ)),
        env=tuple(preset.fixed_env.items()),
        usage=preset.usage,
        transcript_file=preset.transcript_file,
        preset=preset.name,
    )
    feedback = ws.path.parent / f"feedback-{time.monotonic_ns()}.md"
    feedback.write_text("This is the first try.\n")
    ws.feedback = feedback
    begin = time.perf_counter()
    result = ws.run_agent(timeout=300)
    seconds = time.perf_counter() - begin
    assert result.ok and (ws.path / "calc.py").read_text() == FIXED, result.output[-2000:]
    ws.end_processes()
    return seconds


def measure(name: str, folder: Path, runs: int) -> tuple[list[float], list[float], int]:
    saved = dict(os.environ)
    try:
        return _measure(name, folder, runs)
    finally:  # one CLI's keys and base URL never reach the next
        os.environ.clear()
        os.environ.update(saved)


def _measure(name: str, folder: Path, runs: int) -> tuple[list[float], list[float], int]:
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ['PATH']}"
    script = [Run("ls"), Write("calc.py", FIXED), Finish("done")]
    with tempfile.TemporaryDirectory() as scratch, ScriptedModelServer(script) as server:
        root = Path(scratch)
        os.environ.update(keys(name, server))
        repo = project(root)
        preset = PRESETS[name]
        engine = Engine.open(
            repo, "main", promote=False, workdir=root / "work", gate=GateSpec(commands=("true",)),
            sandbox=Settings(mode="auto", agent_network=preset.network(os.environ),
                             agent_env=preset.env_names),
        )  # fmt: skip
        plain, through = [], []
        for _ in range(runs):  # interleaved: a slow moment of the machine hits both
            plain.append(bare(name, folder, repo, root))
            through.append(gated(name, engine))
        return plain, through, len(server.agent_requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run of one installed CLI")
    parser.add_argument("--install", action="store_true", help="install missing CLIs first")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    print(f"{'agent':<16}{'bare (s)':>10}{'gated (s)':>11}{'ratio':>8}{'overhead':>11}  runs")
    measured = 0
    for name, cli in CLIS.items():
        if not (cli.folder / ".installed").exists() and not args.install:
            print(f"{name:<16}  not installed (python tests/agent_clis.py, or --install)")
            continue
        try:
            folder = install(cli)
        except NotInstalled as exc:
            print(f"{name:<16}  {exc}")
            continue
        if args.quick and measured:
            break
        plain, through, requests = measure(name, folder, runs)
        a, b = statistics.median(plain), statistics.median(through)
        print(f"{name:<16}{a:>10.2f}{b:>11.2f}{b / a:>8.2f}{(b - a) * 1000:>9.0f} ms  {runs}"
              f"  ({requests} model requests)")  # fmt: skip
        measured += 1
    print("bare: the CLI's command line in a copy of the project; gated: run_agent() in a "
          "forked workspace, contained, through the egress proxy; medians")  # fmt: skip
    return 0 if measured or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
