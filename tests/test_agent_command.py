"""Real agents: the agent command run by ``agent_workspace.run_agent()``, retries that restart
or resume, the feedback an agent reads before its next try, and its timeout.

The agent is a scripted stand-in (a small Python program that edits files by the task it is
given), run through ``agentgate_agent_command`` in the sandbox, as a real agent would be.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import git

# The stand-in agent: what it does depends on the task, the try and the feedback it reads.
AGENT = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    task, workspace, attempt, feedback = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ws = pathlib.Path(workspace)
    told = pathlib.Path(feedback).read_text()
    (ws / "argv.json").write_text(json.dumps(sys.argv[1:]))
    (ws / "told.md").write_text(told)  # what it was told, for the test to read
    if task.startswith("answer"):
        # A first guess; the right answer only once the feedback says the guess failed.
        (ws / "answer.txt").write_text("42\\n" if "Try 1: rejected" in told else "41\\n")
    elif task.startswith("two steps"):
        # The first try does step one and gives up; a later try only knows step two.
        (ws / ("step1.txt" if attempt == 1 else "step2.txt")).write_text("done\\n")
    elif task.startswith("hang"):
        # A child in a session of its own, beating into the workspace, and then no end.
        beat = "import time\\nwhile True:\\n    open('beat.txt', 'a').write('.')\\n    time.sleep(0.05)\\n"
        import subprocess
        subprocess.Popen([sys.executable, "-c", beat], cwd=ws, start_new_session=True)
        (ws / "pid.txt").write_text(str(os.getpid()))
        time.sleep(120)
    """
)

TESTS = textwrap.dedent(
    """
    import pytest

    @pytest.mark.gated(task="answer: what is 6 x 7? don't 'guess'; think", retries=1)
    def test_answer(agent_workspace):
        agent_workspace.run_agent()

    @pytest.mark.gated(task="two steps", retries=1, resume={resume!r})
    def test_two_steps(agent_workspace):
        agent_workspace.run_agent()

    @pytest.mark.gated(task="hang forever", retries=2)
    def test_hang(agent_workspace):
        agent_workspace.run_agent(timeout=1)

    @pytest.mark.gated(task="spend and fail", retries=5, budget={{"tokens": 250}})
    def test_budget(agent_workspace):
        agent_workspace.run_agent()
        agent_workspace.note(tokens=60, model="stand-in")
        agent_workspace.note(tokens=40)  # numbers add up within a try
    """
)

GATE = (
    f"{sys.executable} -c \"import pathlib, sys; p = pathlib.Path('.'); "
    "sys.exit(0 if (p / 'answer.txt').exists() and (p / 'answer.txt').read_text() == '42\\n' "
    "or (p / 'step1.txt').exists() and (p / 'step2.txt').exists() "
    "or (p / 'pid.txt').exists() else 1)\""
)


def run(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, *args: str, resume: str = "code"
) -> tuple[pytest.RunResult, list[dict[str, object]]]:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    pytester.makepyfile(test_agents=TESTS.format(resume=resume))
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        f"--agentgate-repo={service}", "--agentgate-promote", f"--agentgate-gate-exit-code={GATE}",
        f"--agentgate-agent-command={sys.executable} {agent} {{task}} {{workspace}} {{attempt}} {{feedback}}",
        f"--agentgate-sandbox-bind={agent}", f"--agentgate-report={report}", "-p", "no:randomly",
        *args,
    )  # fmt: skip
    rows = json.loads(report.read_text())["attempts"] if report.exists() else []
    return result, rows


def test_feedback_reaches_the_next_try_which_lands(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    result, rows = run(pytester, service, tmp_path, "-k", "answer")
    result.assert_outcomes(passed=1)
    assert [(r["try"], r["verdict"]) for r in rows] == [(1, "rejected"), (2, "promoted")]
    assert git(service, "show", "main:answer.txt") == "42"
    # Each placeholder filled one argument: the task's spaces, quotes and ';' reached the
    # agent as they are, through no shell.
    argv = json.loads(git(service, "show", "main:argv.json"))
    assert argv[0] == "answer: what is 6 x 7? don't 'guess'; think"
    assert argv[2] == "2"
    told = git(service, "show", "main:told.md")
    assert "Try 1: rejected" in told and "gate command exited 1" in told
    feedback, workspace = Path(argv[3]), Path(argv[1])
    assert workspace not in feedback.parents  # outside the workspace: it never lands
    # Each try is its own recorded attempt, and the summary says which try landed.
    assert rows[0]["attempt_ref"] != rows[1]["attempt_ref"]
    assert "(try 2, recorded as " in result.stdout.str()


@pytest.mark.parametrize(("resume", "lands"), [("restart", False), ("code", True)])
def test_a_retry_restarts_or_resumes_from_the_last_try_s_code(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, resume: str, lands: bool
) -> None:
    result, rows = run(pytester, service, tmp_path, "-k", "two_steps", resume=resume)
    result.assert_outcomes(passed=1 if lands else 0, failed=0 if lands else 1)
    assert [r["verdict"] for r in rows] == ["rejected", "promoted" if lands else "rejected"]
    tracked = git(service, "ls-tree", "-r", "--name-only", "main").splitlines()
    assert ("step1.txt" in tracked and "step2.txt" in tracked) is lands
    if lands:  # the second try resumed from the first one's snapshot, and says so
        assert rows[1]["resumed_from"] and rows[1]["resumed_from"] in git(
            service, "rev-list", "--all"
        )


def test_an_agent_past_its_timeout_is_ended_and_the_attempt_is_an_error(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    import time

    result, rows = run(pytester, service, tmp_path, "-k", "hang")
    assert result.ret == 6  # an attempt that could not be judged
    assert [(r["verdict"], r["reason"]) for r in rows] == [
        ("error", "agent timed out after 1 s")
    ]  # not retried: a timeout is no verdict on the code
    # Every process of the agent was ended, the child in its own session too: the
    # workspace (kept for inspection) hears no more beats.
    beats = Path(json.loads(git(service, "show", f"{rows[0]['attempt_ref']}:argv.json"))[1])
    beats = beats / "beat.txt"
    assert beats.exists()
    size = beats.stat().st_size
    time.sleep(0.5)
    assert beats.stat().st_size == size


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("my-agent --task {tsak}", "unknown placeholder {tsak}"),
        ("my-agent 'unclosed", "cannot be split into arguments"),
        ("my-agent {task", "write {{ and }} for literal braces"),
    ],
)
def test_a_bad_agent_command_stops_the_run_before_any_agent(
    pytester: pytest.Pytester, service: Path, template: str, said: str
) -> None:
    pytester.makepyfile(test_agents=TESTS.format(resume="code"))
    result = pytester.runpytest_subprocess(
        f"--agentgate-repo={service}", f"--agentgate-gate-exit-code={GATE}",
        f"--agentgate-agent-command={template}",
    )  # fmt: skip
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*invalid --agentgate-agent-command*{said}*"])
    assert "refs/agentgate/attempts" not in git(service, "for-each-ref")


def test_a_budget_stops_further_retries(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    result, rows = run(pytester, service, tmp_path, "-k", "budget", f"--junitxml={junit}")
    result.assert_outcomes(failed=1)
    # 100 tokens a try: the third try reaches 250, so no fourth, though retries=5 allows it.
    assert [r["try"] for r in rows] == [1, 2, 3]
    assert [r["notes"] for r in rows] == [{"tokens": 100, "model": "stand-in"}] * 3
    assert rows[-1]["budget"] == {"tokens": [300.0, 250.0]}
    assert "[budget tokens 300/250]" in result.stdout.str()
    assert 'name="agentgate_note_tokens" value="100"' in junit.read_text()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_an_interrupted_attempt_says_where_it_was_interrupted(
    service: Path, tmp_path: Path, how: str
) -> None:
    """Ctrl-C at a terminal, SIGTERM from CI cancelling a job: the attempt's record says
    ``interrupted during gate``, never ``not judged yet``."""
    import signal
    import subprocess
    import time

    started = tmp_path / "gate-started"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_one.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.gated(task='interrupt me')\n"
        "def test_one(agent_workspace):\n"
        "    (agent_workspace.path / 'x.txt').write_text('x')\n"
    )
    gate = f"sh -c 'touch {started}; sleep 60'"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--agentgate-repo={service}",
         f"--agentgate-gate-exit-code={gate}", "--agentgate-sandbox=none", f"--basetemp={tmp_path / 'tmp'}"],
        cwd=suite, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the gate never started"
    proc.send_signal(getattr(signal, how))
    assert proc.wait(timeout=60) != 0
    message = git(service, "log", "-1", "--format=%B", "refs/agentgate/attempts/interrupt-me/1")
    assert "Reason: interrupted during gate" in message
    assert "Agentgate-Verdict: error" in message


def test_children_branch_from_one_checkpoint_judged_against_its_base(service: Path) -> None:
    """``Engine.fork(resume_from=...)``: several children start from one recorded step (the
    Go-Explore pattern), each at the checkpoint's base; what the step changed is still the
    child's change, judged as such: a protected file edited before the checkpoint rejects."""
    from pytest_agentgate import Engine, GateSpec

    e = Engine.open(
        service, "main", promote=True, workdir=service.parent / "work",
        gate=GateSpec(outcome_is_enough=True),
    )  # fmt: skip
    base = git(service, "rev-parse", "main")
    explorer = e.fork(task="explore")
    (explorer.path / "step1.txt").write_text("found the bug\n")
    point = explorer.checkpoint("step one")
    (explorer.path / "conftest.py").write_text("collect_ignore = ['tests']\n")  # a cheat
    cheat_point = explorer.checkpoint("step two")
    git(service, "commit", "-q", "--allow-empty", "-m", "the target moves on")

    children = [e.fork(task=f"child {i}", resume_from=point, mode="code") for i in range(2)]
    for i, child in enumerate(children):
        assert child.base == base and child.resumed_from == point
        assert (child.path / "step1.txt").read_text() == "found the bug\n"
        (child.path / f"child{i}.txt").write_text(f"{i}\n")
    landed = [e.run_attempt(child, task=f"child {i}") for i, child in enumerate(children)]
    assert [a.verdict.status for a in landed] == ["promoted", "promoted"]
    assert {"step1.txt", "child0.txt", "child1.txt"} <= set(
        git(service, "ls-tree", "--name-only", "main").splitlines()
    )
    cheater = e.fork(task="child from the cheat", resume_from=cheat_point, mode="full")
    (cheater.path / "child.txt").write_text("x\n")
    verdict = e.run_attempt(cheater, task="child from the cheat").verdict
    assert verdict.status == "rejected" and "conftest.py" in verdict.reason


@pytest.mark.skipif(shutil.which("script") is None, reason="needs script(1) for a terminal")
def test_a_slow_step_shows_one_updating_line_on_a_terminal_only(
    service: Path, tmp_path: Path
) -> None:
    """On a terminal (a pseudo-terminal here), a gate that takes a few seconds shows which
    test, which step and for how long; the same run's captured output never holds it."""
    import shlex
    import subprocess

    from pytest_agentgate.pytest_plugin.progress import Progress

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_slow.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.gated(task='slow gate')\n"
        "def test_slow(agent_workspace):\n"
        "    (agent_workspace.path / 'x.txt').write_text('x')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    env.pop("CI", None)
    command = shlex.join([
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--agentgate-repo={service}",
        "--agentgate-gate-exit-code=sleep 4.5", f"--basetemp={tmp_path / 'tmp'}", "--agentgate-sandbox=none",
        f"--junitxml={tmp_path / 'junit.xml'}",
    ])  # fmt: skip
    shown = subprocess.run(
        ["script", "-qec", command, "/dev/null"], cwd=suite, env=env, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "1 passed" in shown.stdout, shown.stdout
    import re

    assert re.search(r"agentgate: test_slow\.py::test_slow: gate for [34] s", shown.stdout)
    assert "gate for" not in (tmp_path / "junit.xml").read_text()
    # Off a terminal, or under CI, there is no line at all.
    assert Progress.for_terminal(False) is None
    os.environ["CI"] = "true"
    try:
        assert Progress.for_terminal(True) is None
    finally:
        del os.environ["CI"]


def test_a_recycled_workspace_carries_no_notes_of_the_last_test(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_two=(
            "import pytest\n\n"
            "@pytest.mark.gated(task='first')\n"
            "def test_a(agent_workspace):\n"
            "    (agent_workspace.path / 'a.txt').write_text('a')\n"
            "    agent_workspace.note(tokens=5)\n\n"
            "@pytest.mark.gated(task='second')\n"
            "def test_b(agent_workspace):\n"
            "    (agent_workspace.path / 'b.txt').write_text('b')\n"
        )
    )
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        f"--agentgate-repo={service}", "--agentgate-promote", "--agentgate-gate-exit-code=true",
        f"--agentgate-report={report}", "-p", "no:randomly",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    rows = json.loads(report.read_text())["attempts"]
    assert [r["notes"] for r in rows] == [{"tokens": 5}, {}]


def test_the_agent_s_transcript_is_in_its_record(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    """What the agent printed, on stdout and on stderr, is in its attempt's record (agentgate
    show), for a rejected attempt and a promoted one: only the gate's output was there."""
    agent = tmp_path / "talking-agent.py"
    agent.write_text(
        "import pathlib, sys\n"
        "print('agent says: working on', sys.argv[1])\n"
        "print('agent warns: on stderr', file=sys.stderr)\n"
        "pathlib.Path(sys.argv[2], sys.argv[1] + '.txt').write_text('x')\n"
    )
    pytester.makepyfile(
        test_agents="""
        import pytest

        @pytest.mark.gated(task="good", gate=["true"], results="exit-code")
        def test_good(agent_workspace):
            agent_workspace.run_agent()

        @pytest.mark.gated(task="bad", gate=["false"], results="exit-code")
        def test_bad(agent_workspace):
            agent_workspace.run_agent()
        """
    )
    result = pytester.runpytest(
        f"--agentgate-repo={service}", "--agentgate-promote", "-p", "no:cacheprovider",
        f"--agentgate-agent-command={sys.executable} {agent} {{task}} {{workspace}}",
        f"--agentgate-sandbox-bind={agent}",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    for ref in ("refs/agentgate/attempts/good/1", "refs/agentgate/attempts/bad/1"):
        shown = subprocess.run(
            [sys.executable, "-m", "pytest_agentgate", "show", "--repo", str(service), ref],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        assert "agent says: working on" in shown, (ref, shown)
        assert "agent warns: on stderr" in shown, (ref, shown)


@pytest.mark.parametrize("missing", ["a script outside the read view", "no such program"])
def test_an_agent_that_cannot_start_is_an_error_that_spends_no_retry(
    pytester: pytest.Pytester, service: Path, bwrap: str, missing: str
) -> None:
    """Once both tries of a retry budget went on a script the sandbox could not see, each
    recorded as a rejected attempt, and no hint named --agentgate-sandbox-read."""
    import tempfile

    outside = Path(tempfile.mkdtemp(prefix="agentgate-agent-", dir="/var/tmp"))
    try:
        (outside / "agent.py").write_text(AGENT)
        template = (
            f"{sys.executable} {outside / 'agent.py'} {{task}} {{workspace}} {{attempt}} {{feedback}}"
            if missing.startswith("a script")
            else "no-such-agent-program {task}"
        )
        pytester.makepyfile(
            test_agents="import pytest\n\n@pytest.mark.gated(task='answer', retries=2)\n"
            "def test_answer(agent_workspace):\n    agent_workspace.run_agent()\n"
        )
        result = pytester.runpytest_subprocess(
            f"--agentgate-repo={service}", f"--agentgate-gate-exit-code={GATE}",
            f"--agentgate-agent-command={template}", "--agentgate-sandbox=bwrap",
        )  # fmt: skip
        result.assert_outcomes(failed=1)
        out = result.stdout.str()
        assert "the agent command could not start" in out
        if missing.startswith("a script"):
            assert f"{outside}" in out and "--agentgate-sandbox-read=PATH" in out
        refs = git(service, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts")
        assert len(refs.splitlines()) == 1, refs  # one try, an error: no retry spent on it
        assert "ERROR" in out
    finally:
        shutil.rmtree(outside, ignore_errors=True)


NOSY = textwrap.dedent(
    """
    import json, pathlib, sys, urllib.request
    try:  # a host nobody allowed
        urllib.request.urlopen("http://example.com/", timeout=5)
    except Exception as exc:
        print("refused:", type(exc).__name__)
    pathlib.Path(sys.argv[1], "answer.txt").write_text("42\\n")
    print(json.dumps({"usage": {"total": 1234}, "cost_usd": 0.5}))
    """
)


@pytest.mark.parametrize("strict", [False, True])
def test_a_refused_connection_is_recorded_and_strict_mode_rejects(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, bwrap: str, strict: bool
) -> None:
    agent = tmp_path / "nosy.py"
    agent.write_text(NOSY)
    pytester.makepyfile(
        test_nosy="""
        import pytest

        @pytest.mark.gated(task="answer")
        def test_nosy(agent_workspace):
            agent_workspace.run_agent()
        """
    )
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        f"--agentgate-repo={service}", "--agentgate-promote", f"--agentgate-gate-exit-code={GATE}",
        f"--agentgate-agent-command={sys.executable} {agent} {{workspace}}",
        f"--agentgate-sandbox-bind={agent}", f"--agentgate-report={report}",
        "--agentgate-agent-network=allow:pypi.org",
        "--agentgate-agent-usage=tokens=usage.total", "--agentgate-agent-usage=cost=cost_usd",
        *(["--agentgate-agent-network-strict"] if strict else []),
    )  # fmt: skip
    row = json.loads(report.read_text())["attempts"][0]
    assert row["refused"] and row["refused"][0].startswith("example.com:80 at ")
    # The usage its command printed, read by the paths named: no note() in the test.
    assert row["notes"] == {"tokens": 1234.0, "cost": 0.5}
    if strict:
        assert row["verdict"] == "rejected" and row["check"] == "network"
        assert "allow-list refuses (example.com:80" in row["reason"]
        result.assert_outcomes(failed=1)
    else:
        assert row["verdict"] == "promoted"
        result.assert_outcomes(passed=1)
    shown = subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", "show", row["attempt_ref"].split("attempts/")[1]],
        cwd=service, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "Connections the allow-list refused: example.com:80 at" in shown
