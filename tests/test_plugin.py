"""The pytest layer, through real pytest runs (pytester) against real repositories."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers import fsck, git

APPEND_TOTAL = """
    p = agent_workspace.path / "ledger" / "store.py"
    p.write_text(p.read_text() + "\\n    def total(self):\\n        return sum(self._rows)\\n")
"""


def gated_test(body: str = APPEND_TOTAL, marker: str = 'task="Add total", agent="agent-a"') -> str:
    return (
        f"import pytest\n\n@pytest.mark.gated({marker})\ndef test_task(agent_workspace):\n{body}\n"
    )


def run(pytester: pytest.Pytester, repo: Path, *args: str) -> pytest.RunResult:
    report = pytester.path / "report.json"
    return pytester.runpytest(
        f"--agentgate-repo={repo}", f"--agentgate-report={report}", "-p", "no:cacheprovider", *args
    )


def rows(pytester: pytest.Pytester) -> list[dict]:
    return json.loads((pytester.path / "report.json").read_text())["attempts"]


def test_promotes_with_a_passing_gate(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(test_agent=gated_test())
    before = git(service, "rev-parse", "main")
    result = run(pytester, service, "--agentgate-gate-exit-code=true", "--agentgate-promote")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*= agentgate =*", "PROMOTED*test_agent.py::test_task*main: *->*fast-forward*"]
    )
    after = git(service, "rev-parse", "main")
    assert after != before and git(service, "rev-parse", "main^") == before
    assert git(service, "log", "-1", "--format=%an", "main") == "agent-a"
    [row] = rows(pytester)
    assert row["verdict"] == "promoted" and row["target_new"] == after
    record = git(service, "log", "-1", "--format=%B", row["attempt_ref"])
    assert f"Agentgate-Landed: {after}" in record
    assert "Agentgate-Test: test_agent.py::test_task" in record
    assert git(service, "status", "--porcelain") == ""
    fsck(service)


def test_failing_gate_rejects_and_keeps_the_attempt(
    pytester: pytest.Pytester, service: Path
) -> None:
    pytester.makepyfile(test_agent=gated_test())
    before = git(service, "rev-parse", "main")
    result = run(
        pytester,
        service,
        "--agentgate-gate-exit-code=echo broken-build; exit 3",
        "--agentgate-promote",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*agentgate rejected: gate command exited 3: echo broken-build; exit 3",
            "*attempt: refs/agentgate/attempts/add-total/1*git -C*show refs/agentgate/attempts/add-total/1*",
            "*broken-build*",
        ]
    )
    assert git(service, "rev-parse", "main") == before
    shown = git(service, "show", "refs/agentgate/attempts/add-total/1")
    assert "+    def total(self):" in shown and "broken-build" in shown
    assert "Agentgate-Verdict: rejected" in shown


def test_failing_body_rejects_with_its_own_error(pytester: pytest.Pytester, service: Path) -> None:
    body = APPEND_TOTAL + "    assert False, 'agent gave up'\n"
    pytester.makepyfile(test_agent=gated_test(body))
    result = run(pytester, service, "--agentgate-gate-exit-code=true", "--agentgate-promote")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: agent gave up*"])
    [row] = rows(pytester)
    assert row["verdict"] == "rejected" and row["check"] == "test"
    assert "agent gave up" in row["reason"]
    assert git(service, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/")


def test_no_changes_is_rejected(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(test_agent=gated_test("    pass"))
    result = run(pytester, service, "--agentgate-gate-exit-code=true")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*agentgate rejected: no changes*"])


def test_no_gate_is_an_error_and_empty_gate_is_enough(
    pytester: pytest.Pytester, service: Path
) -> None:
    pytester.makepyfile(
        test_a=gated_test(),
        test_b=gated_test(marker='task="Outcome only", gate=[]'),
    )
    result = run(pytester, service)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*agentgate error: no gate: promotion needs a gate command*"])
    verdicts = {row["test"]: row["verdict"] for row in rows(pytester)}
    assert verdicts == {"test_a.py::test_task": "error", "test_b.py::test_task": "passed"}


def test_dry_run_moves_only_the_scratch_ref(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(test_agent=gated_test())
    before = git(service, "rev-parse", "main")
    result = run(pytester, service, "--agentgate-gate-exit-code=true")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["WOULD PROMOTE*dryrun/main: *"])
    assert git(service, "rev-parse", "main") == before
    (first,) = scratch_refs(service)
    assert first.startswith("refs/agentgate/dryruns/") and first.endswith("/main")
    assert git(service, "rev-parse", f"{first}^") == before
    # A new run has a scratch ref of its own, started from the target's tip.
    result = run(pytester, service, "--agentgate-gate-exit-code=true")
    result.assert_outcomes(passed=1)
    (second,) = set(scratch_refs(service)) - {first}
    assert git(service, "rev-parse", f"{second}^") == before
    log = [
        json.loads(line)
        for line in (service / ".git" / "agentgate" / "oplog.jsonl").read_text().splitlines()
    ]
    resets = [r for r in log if r["op"] == "dryrun-reset"]
    assert [(r["ref"], r["old"], r["new"]) for r in resets] == [
        (first, None, before),
        (second, None, before),
    ]


def scratch_refs(service: Path) -> list[str]:
    """The dry runs' scratch refs, one per run."""
    out = git(service, "for-each-ref", "--format=%(refname)", "refs/agentgate/dryruns/")
    return out.splitlines()


def test_two_dry_runs_at_once_keep_their_own_scratch_refs(service: Path, tmp_path: Path) -> None:
    """Two dry runs at the same time: neither resets the other's scratch ref; each judges
    its later attempts against what it accumulated itself."""
    from helpers import spawn_pytest

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_two.py").write_text(
        "import pytest, time\n\n"
        "@pytest.mark.gated(task='first', gate=[])\n"
        "def test_1(agent_workspace):\n"
        "    (agent_workspace.path / 'one.txt').write_text(agent_workspace.base)\n"
        "    time.sleep(0.5)\n\n"
        "@pytest.mark.gated(task='second', gate=[])\n"
        "def test_2(agent_workspace):\n"
        "    assert (agent_workspace.path / 'one.txt').exists()  # forked from this run's ref\n"
        "    (agent_workspace.path / 'two.txt').write_text('2')\n"
    )
    procs = [
        spawn_pytest(suite, f"--agentgate-repo={service}", f"--basetemp={tmp_path / f't{i}'}")
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    refs = scratch_refs(service)
    assert len(refs) == 2
    for ref in refs:
        names = git(service, "ls-tree", "--name-only", ref).splitlines()
        assert {"one.txt", "two.txt"} <= set(names)


def test_protect_and_max_changed_lines(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(
        test_protect=gated_test(
            "    (agent_workspace.path / 'tests' / 'test_ledger.py').write_text('')\n",
            'task="Empty the tests", gate=[], protect=["tests/*"]',
        ),
        test_lines=gated_test(marker='task="Too big", gate=[], max_changed_lines=1'),
        test_fine=gated_test(marker='task="Small enough", gate=[], max_changed_lines=3'),
    )
    result = run(pytester, service)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*changes protected paths: tests/test_ledger.py*"])
    result.stdout.fnmatch_lines(["*changes 3 lines, over max_changed_lines=1*"])


def test_python_checks_and_hooks(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makeconftest(
        """
        import json
        from pytest_agentgate import CheckResult

        SEEN = []

        def pytest_agentgate_checks(item, attempt):
            if "hooked" in item.name:
                return [lambda a: CheckResult("total" not in
                        (a.path / "ledger" / "store.py").read_text(), "total() is banned here",
                        name="no-total")]

        def pytest_agentgate_verdict(item, attempt):
            SEEN.append((item.name, attempt.verdict.status))

        def pytest_sessionfinish(session):
            (session.config.rootpath / "seen.json").write_text(json.dumps(SEEN))
        """
    )
    pytester.makepyfile(
        test_checks=f"""
        import pytest

        def boom(attempt):
            raise RuntimeError("checker bug")

        @pytest.mark.gated(task="ok", checks=[lambda a: "ledger/store.py" in a.changed_paths])
        def test_passes(agent_workspace):
        {APPEND_TOTAL}

        @pytest.mark.gated(task="false", checks=[lambda a: False])
        def test_false(agent_workspace):
        {APPEND_TOTAL}

        @pytest.mark.gated(task="raises", checks=[boom])
        def test_raises(agent_workspace):
        {APPEND_TOTAL}

        @pytest.mark.gated(task="hooked", gate=[])
        def test_hooked(agent_workspace):
        {APPEND_TOTAL}
        """.replace("\n    p = ", "\n            p = ").replace(
            "\n    p.write", "\n            p.write"
        )
    )
    result = run(pytester, service)
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(
        ["*returned False*", "*check boom raised RuntimeError: checker bug*"]
    )
    result.stdout.fnmatch_lines(["*total() is banned here*"])
    seen = dict(json.loads((pytester.path / "seen.json").read_text()))
    assert seen == {
        "test_passes": "passed",
        "test_false": "rejected",
        "test_raises": "rejected",
        "test_hooked": "rejected",
    }


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("", "*missing 1 required positional argument: 'task'*"),
        ('task=""', "*task must be a non-empty string*"),
        ('task="t", colour="red"', "*unexpected keyword argument 'colour'*"),
        ('task="t", gate="pytest"', "*gate must be a list of command strings*"),
        ('task="t", checks=[1]', "*checks must be a list of callables*"),
        ('task="t", max_changed_lines="10"', "*max_changed_lines must be a non-negative int*"),
    ],
)
def test_bad_marker_is_a_collection_error(
    pytester: pytest.Pytester, service: Path, marker: str, message: str
) -> None:
    pytester.makepyfile(test_agent=gated_test(marker=marker))
    result = run(pytester, service)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting test_agent.py*",
            f"*test_agent.py::test_task: invalid @pytest.mark.gated:{message}",
        ]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--agentgate-target=nope"],
            "*branch 'nope' does not exist*(from command line --agentgate-target)*",
        ),
        (["--agentgate-target=-rf"], "*'-rf' is not a valid branch name*"),
        (["--agentgate-target=a..b"], "*'a..b' is not a valid branch name*"),
        (
            ["--agentgate-base=deadbeef"],
            "*'deadbeef' does not name a commit*(from command line --agentgate-base)*",
        ),
        (
            ["--agentgate-gate-timeout=soon"],
            "*invalid --agentgate-gate-timeout 'soon' (from command line*",
        ),
    ],
)
def test_bad_settings_exit_4(
    pytester: pytest.Pytester, service: Path, args: list[str], message: str
) -> None:
    pytester.makepyfile(test_agent=gated_test())
    result = run(pytester, service, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_each_gated_test_s_gate_is_checked_before_any_agent_works(
    pytester: pytest.Pytester, service: Path
) -> None:
    """Two gated tests of the same gate commands, one graded: the graded task's plan is
    checked before any agent works (a fail-to-pass test that passes on the base grades
    nothing), however the tests are ordered; the gates were merged by their commands."""
    graded = 'task="graded", fail_to_pass=["tests/test_ledger.py::test_build"]'
    pytester.makepyfile(
        test_agent=gated_test(marker=graded)
        + '\n\n@pytest.mark.gated(task="plain")\ndef test_plain(agent_workspace):\n    pass\n'
    )
    gate = f"--agentgate-gate={sys.executable} -m pytest -q -p no:cacheprovider tests"
    result = run(pytester, service, gate, "--agentgate-sandbox=none")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["*test_build*grade nothing*"])


def test_missing_repo_and_ini_source(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_agent=gated_test())
    pytester.makeini(f"[pytest]\nagentgate_repo = {tmp_path / 'nowhere'}\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no git repository at*nowhere*(from ini agentgate_repo)*"])


def test_repository_without_commits(pytester: pytest.Pytester, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    pytester.makepyfile(test_agent=gated_test())
    result = run(pytester, empty)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*has no commits yet*"])


def test_settings_from_ini(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(test_agent=gated_test(marker='task="From ini"'))
    pytester.makeini(
        f"[pytest]\nagentgate_repo = {service}\nagentgate_target = main\nagentgate_promote = true\n"
        "agentgate_agent = ini-agent\nagentgate_gate_exit_code =\n    true\n    test -f ledger/store.py\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert git(service, "log", "-1", "--format=%an", "main") == "ini-agent"


def test_agent_from_environment(
    pytester: pytest.Pytester, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTGATE_AGENT", "env-agent")
    pytester.makepyfile(test_agent=gated_test(marker='task="From env", gate=[]'))
    result = run(pytester, service, "--agentgate-promote")
    result.assert_outcomes(passed=1)
    assert git(service, "log", "-1", "--format=%an", "main") == "env-agent"


def test_gate_runs_in_a_clean_checkout_with_env(pytester: pytest.Pytester, service: Path) -> None:
    body = APPEND_TOTAL + (
        "    (agent_workspace.path / 'leftover.txt').write_text('x')\n"
        "    (agent_workspace.path / 'ledger' / 'cache.pyc').write_text('ignored')\n"
    )
    pytester.makepyfile(test_agent=gated_test(body))
    gate = (
        'test "$PWD" = "$AGENTGATE_CHECKOUT" && test "$AGENTGATE_ACTIVE" = 1 '
        "&& test -f leftover.txt && test ! -e ledger/cache.pyc && test ! -e .git"
    )
    result = run(pytester, service, f"--agentgate-gate-exit-code={gate}")
    result.assert_outcomes(passed=1)


def test_gate_timeout_kills_the_process_group(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    from helpers import Sleeper

    sleeper = Sleeper()

    pytester.makepyfile(test_agent=gated_test())
    gate = f"setsid {sleeper.command} & wait"
    result = run(
        pytester, service, f"--agentgate-gate-exit-code={gate}", "--agentgate-gate-timeout=0.5"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*agentgate rejected: gate timed out*"])
    assert not sleeper.alive()


def test_gated_tests_skip_inside_a_gate(
    pytester: pytest.Pytester, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTGATE_ACTIVE", "1")
    pytester.makepyfile(test_agent=gated_test())
    result = run(pytester, service, "--agentgate-gate-exit-code=true")
    result.assert_outcomes(skipped=1)
    assert git(service, "for-each-ref", "refs/agentgate/") == ""


def test_agent_workspace_needs_the_marker(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile("def test_plain(agent_workspace):\n    pass\n")
    result = run(pytester, service)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*agent_workspace needs the test to be marked @pytest.mark.gated*"]
    )


def test_workspace_shape(pytester: pytest.Pytester, service: Path) -> None:
    base = git(service, "rev-parse", "main")
    pytester.makepyfile(
        test_agent=gated_test(
            f"""
    import subprocess
    ws = agent_workspace
    assert ws.base == "{base}"
    assert ws.branch == "main"
    git = lambda *a: subprocess.run(["git", *a], cwd=ws.path, capture_output=True, text=True).stdout.strip()
    assert git("status", "--porcelain") == ""
    assert git("rev-parse", "HEAD") == "{base}"
    assert git("symbolic-ref", "--short", "HEAD") == "main"
    assert git("remote") == ""
    assert (ws.path / ".git" / "objects" / "info" / "alternates").read_text().strip().endswith("objects")
    out = ws.run("echo hello from $PWD")
    assert out.returncode == 0 and "hello from" in out.output
{APPEND_TOTAL}""",
            marker='task="Shape", gate=[]',
        )
    )
    result = run(pytester, service)
    result.assert_outcomes(passed=1)


def test_agent_git_cannot_move_base_refs(pytester: pytest.Pytester, service: Path) -> None:
    base = git(service, "rev-parse", "main")
    body = APPEND_TOTAL + (
        "    import subprocess\n"
        "    run = lambda *a: subprocess.run(['git', '-c', 'user.name=a', '-c', 'user.email=a@b', *a],"
        " cwd=agent_workspace.path, check=True)\n"
        "    run('commit', '-qam', 'agent commit')\n"
        "    run('update-ref', 'refs/heads/main', 'HEAD')\n"
        "    run('update-ref', 'refs/heads/evil', 'HEAD')\n"
        "    run('tag', 'agent-tag')\n"
    )
    pytester.makepyfile(
        test_agent=gated_test(body, 'task="Commits itself", gate=["false"], results="exit-code"')
    )
    result = run(pytester, service, "--agentgate-promote")
    result.assert_outcomes(failed=1)
    assert git(service, "rev-parse", "main") == base
    assert (
        git(service, "for-each-ref", "refs/heads/", "refs/tags/", "--format=%(refname)")
        == "refs/heads/main"
    )
    # The agent's commit is not what gets recorded: the snapshot is, with the base as parent.
    [row] = rows(pytester)
    assert git(service, "rev-parse", f"{row['attempt_ref']}^") == base


def test_base_worktree_dirty_blocks_promotion(pytester: pytest.Pytester, service: Path) -> None:
    (service / "ledger" / "api.py").write_text("# local edit\n")
    (service / "notes.txt").write_text("untracked files do not count\n")
    before = git(service, "rev-parse", "main")
    pytester.makepyfile(test_agent=gated_test())
    result = run(pytester, service, "--agentgate-gate-exit-code=true", "--agentgate-promote")
    # Found before any agent works: the run stops with a usage error, nothing ran.
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*the target is checked out*uncommitted changes*ledger/api.py*"])
    assert git(service, "for-each-ref", "refs/agentgate/attempts/") == ""
    assert git(service, "rev-parse", "main") == before
    assert (service / "ledger" / "api.py").read_text() == "# local edit\n"
    assert (service / "notes.txt").exists()


def test_untracked_files_do_not_block_and_survive(pytester: pytest.Pytester, service: Path) -> None:
    (service / "notes.txt").write_text("mine\n")
    pytester.makepyfile(test_agent=gated_test())
    result = run(pytester, service, "--agentgate-gate-exit-code=true", "--agentgate-promote")
    result.assert_outcomes(passed=1)
    assert (service / "notes.txt").read_text() == "mine\n"
    assert "def total" in (service / "ledger" / "store.py").read_text()
    assert git(service, "status", "--porcelain") == "?? notes.txt"


def test_no_retest_is_reported(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(
        test_agent="""
        import pytest

        @pytest.mark.gated(task="first")
        def test_a(agent_workspace):
            (agent_workspace.path / "a.txt").write_text("a")

        @pytest.mark.gated(task="second")
        def test_b(agent_workspace):
            (agent_workspace.path / "b.txt").write_text("b")
        """
    )
    base = git(service, "rev-parse", "main")
    result = run(
        pytester,
        service,
        f"--agentgate-base={base}",
        "--agentgate-gate-exit-code=true",
        "--agentgate-no-retest",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*merge, re-test skipped (--agentgate-no-retest)*"])


def test_snapshot_keeps_symlinks_deletions_and_honours_gitignore(
    pytester: pytest.Pytester, service: Path
) -> None:
    body = """
    import os
    p = agent_workspace.path
    os.symlink("ledger/store.py", p / "link.py")
    os.symlink("/etc/passwd", p / "outside")
    (p / "ledger" / "report.py").unlink()
    (p / "ledger" / "__pycache__").mkdir()
    (p / "ledger" / "__pycache__" / "x.pyc").write_text("ignored")
    (p / "name with spaces.txt").write_text("s")
    (p / ".env").write_text("TOKEN=hunter2")
    (p / "deploy.pem").write_text("secret")
"""
    pytester.makepyfile(test_agent=gated_test(body, 'task="Files", gate=[]'))
    # A link out of the tree rejects unless a person allows it where it is.
    result = run(pytester, service, "--agentgate-allow-symlink=outside")
    result.assert_outcomes(passed=1)
    [row] = rows(pytester)
    tree = row["tree"]
    listing = git(service, "ls-tree", "-r", tree)
    assert "120000 blob" in listing.split("link.py")[0].splitlines()[-1]
    assert git(service, "cat-file", "-p", f"{tree}:link.py") == "ledger/store.py"
    assert git(service, "cat-file", "-p", f"{tree}:outside") == "/etc/passwd"
    assert "ledger/report.py" not in listing
    assert "__pycache__" not in listing
    assert "name with spaces.txt" in listing
    assert ".env" not in listing and "deploy.pem" not in listing
    record = git(service, "log", "-1", "--format=%B", row["attempt_ref"])
    assert (
        "Left out of the snapshot (secrets): .env, deploy.pem" in record
        or "deploy.pem, .env" in record
    )
    assert "hunter2" not in git(service, "log", "-p", "--all")


def test_loading_the_plugin_is_cheap(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_nothing_heavy_loaded():
            assert "pytest_agentgate.pytest_plugin.hooks" in sys.modules
            light = {"pytest_agentgate", "pytest_agentgate._constants", "pytest_agentgate.errors"} | {
                f"pytest_agentgate.pytest_plugin{m}" for m in ("", ".hooks", ".hookspecs", ".options")
            } | {"pytest_agentgate.engine", "pytest_agentgate.engine.options"}
            heavy = [m for m in sys.modules if m.split(".")[0] in ("git", "filelock")
                     or m.startswith("pytest_agentgate") and m not in light]
            assert heavy == []
        """
    )
    # With no git on PATH at all, a run without gated tests still passes: it spawns no git.
    nothing = tmp_path / "empty-path"
    nothing.mkdir()
    monkeypatch.setenv("PATH", str(nothing))
    result = pytester.runpytest_subprocess(f"--agentgate-repo={service}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_conftest_is_protected_by_default(pytester: pytest.Pytester, service: Path) -> None:
    body = (
        "    (agent_workspace.path / 'tests' / 'conftest.py').write_text('collect_ignore = []')\n"
    )
    pytester.makepyfile(test_agent=gated_test(body, 'task="Sneak a conftest", gate=[]'))
    result = run(pytester, service)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*changes protected paths: tests/conftest.py*"])
    result = run(pytester, service, "--agentgate-protect=none")
    result.assert_outcomes(passed=1)


def test_user_workdir_keeps_the_newest_runs(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    pytester.makepyfile(
        test_agent=gated_test("    assert False, 'keep my workspace'\n", 'task="t", gate=[]')
    )
    for _ in range(4):
        run(pytester, service, f"--agentgate-workdir={workdir}", "--agentgate-keep-runs=2")
    runs = sorted(p for p in workdir.iterdir())
    assert len(runs) == 2
    assert all((p / ".agentgate-run").is_file() for p in runs)
    # The failed attempt's workspace is kept for inspection inside its run directory.
    assert any(child.name.startswith("t-") for p in runs for child in p.iterdir())


def test_target_moved_outside_agentgate_is_noted_and_merged_onto(
    pytester: pytest.Pytester, service: Path
) -> None:
    pytester.makeconftest(
        f"""
        import subprocess

        def pytest_runtest_setup(item):
            if item.name == "test_b":  # a person commits to main while the agents run
                subprocess.run(["sh", "-c", "echo person > person.txt && git add person.txt && "
                                "git -c user.name=P -c user.email=p@e commit -qm 'by hand'"],
                               cwd={str(service)!r}, check=True)
        """
    )
    pytester.makepyfile(
        test_agents="""
        import pytest

        @pytest.mark.gated(task="a", gate=[])
        def test_a(agent_workspace):
            (agent_workspace.path / "a.txt").write_text("a")

        @pytest.mark.gated(task="b", gate=[])
        def test_b(agent_workspace):
            (agent_workspace.path / "b.txt").write_text("b")

        @pytest.mark.gated(task="c", gate=[])
        def test_c(agent_workspace):
            (agent_workspace.path / "c.txt").write_text("c")
        """
    )
    base = git(service, "rev-parse", "main")
    result = run(pytester, service, f"--agentgate-base={base}", "--agentgate-promote")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["PROMOTED*test_b*merge*[[]target had moved outside agentgate: commit: by hand[]]"]
    )
    external = [r for r in rows(pytester) if r["external_move"]]
    assert [r["test"] for r in external] == ["test_agents.py::test_b"]  # noted once, not for test_c
    names = git(service, "ls-tree", "--name-only", "main").splitlines()
    assert {"a.txt", "b.txt", "c.txt", "person.txt"} <= set(names)  # merged on top, never over it
    log = [
        json.loads(x)
        for x in (service / ".git" / "agentgate" / "oplog.jsonl").read_text().splitlines()
    ]
    assert [r["note"] for r in log if r["op"] == "external-move"] == ["commit: by hand"]


def test_failing_with_pytest_fail_is_still_recorded(
    pytester: pytest.Pytester, service: Path
) -> None:
    pytester.makepyfile(test_agent=gated_test(APPEND_TOTAL + "    pytest.fail('agent gave up')\n"))
    result = run(pytester, service, "--agentgate-gate-exit-code=true")
    result.assert_outcomes(failed=1)
    [row] = rows(pytester)
    assert row["verdict"] == "rejected" and "agent gave up" in row["reason"]


def test_collect_only_and_deselected_runs_touch_nothing(
    pytester: pytest.Pytester, service: Path
) -> None:
    pytester.makepyfile(test_agent=gated_test() + "\n\ndef test_plain():\n    pass\n")
    result = run(pytester, service, "--collect-only")
    assert result.ret == 0
    result = run(pytester, service, "-k", "plain", "--agentgate-target=nope")
    result.assert_outcomes(passed=1)
    assert git(service, "for-each-ref", "refs/agentgate/") == ""
    assert not (service / ".git" / "agentgate").exists()


def test_ignored_files_in_the_base_checkout_are_never_overwritten(
    pytester: pytest.Pytester, service: Path
) -> None:
    (service / ".gitignore").write_text("*.log\ndata/\n")
    git(service, "commit", "-qam", "ignore logs and data")
    (service / "app.log").write_text("the user's log\n")
    (service / "data").mkdir()
    (service / "data" / "db.sqlite").write_text("the user's database\n")
    before = git(service, "rev-parse", "main")
    pytester.makepyfile(
        test_agent=gated_test(
            "    (agent_workspace.path / 'app.log').write_text('agent')\n"
            "    (agent_workspace.path / 'data').write_text('a file where a directory was')\n"
            "    import subprocess\n"
            "    subprocess.run(['git', 'add', '-f', 'app.log', 'data'], cwd=agent_workspace.path, check=True)\n",
            'task="Commit ignored names", gate=[]',
        )
    )
    # The snapshot honours .gitignore, so the agent's ignored files are not in it...
    result = run(pytester, service, "--agentgate-promote")
    result.assert_outcomes(failed=1)  # ...and then there is nothing left to promote
    assert git(service, "rev-parse", "main") == before
    # Now a change that really tracks those names lands through the engine directly.
    from helpers import land

    attempt = land(
        service, {".gitignore": "", "app.log": "agent\n", "data": "file\n"}, task="track them"
    )
    assert attempt.verdict.status == "error"
    assert (
        "untracked or ignored files are where the new commit puts files: app.log, data"
        in attempt.verdict.reason
    )
    assert (service / "app.log").read_text() == "the user's log\n"
    assert (service / "data" / "db.sqlite").read_text() == "the user's database\n"
    assert git(service, "rev-parse", "main") == before


def test_target_checked_out_in_a_linked_worktree_blocks(service: Path, tmp_path: Path) -> None:
    git(service, "branch", "feature")
    git(service, "worktree", "add", "-q", str(tmp_path / "linked"), "feature")
    from pytest_agentgate import Engine, GateSpec

    engine = Engine.open(
        service,
        "feature",
        promote=True,
        workdir=tmp_path / "w",
        gate=GateSpec(outcome_is_enough=True),
    )
    ws = engine.fork(task="feature work")
    (ws.path / "f.txt").write_text("f")
    attempt = engine.run_attempt(ws, task="feature work")
    assert (
        attempt.verdict.status == "error"
        and "is checked out in the worktree" in attempt.verdict.reason
    )
    assert git(service, "rev-parse", "feature") == git(service, "rev-parse", "main")


def test_prune_never_removes_a_live_run(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    import fcntl

    from pytest_agentgate.maintenance.prune import old_runs

    root = tmp_path / "work"
    runs = []
    for i in range(3):
        run_dir = root / f"run-{i}"
        run_dir.mkdir(parents=True)
        (run_dir / ".agentgate-run").write_text("")
        os.utime(run_dir / ".agentgate-run", (1000 + i, 1000 + i))
        runs.append(run_dir)
    fd = os.open(runs[0] / ".agentgate-run", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # the oldest run is still going
    try:
        assert old_runs(root, keep=1) == [runs[1]]
    finally:
        os.close(fd)
    assert sorted(old_runs(root, keep=1)) == [runs[0], runs[1]]


def test_markdown_summary_and_junit_properties(
    pytester: pytest.Pytester, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = pytester.path / "step-summary.md"
    summary.write_text("earlier steps\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makepyfile(test_agent=gated_test(marker='task="Add total", gate=[]'))
    result = run(pytester, service, f"--junitxml={pytester.path / 'junit.xml'}")
    result.assert_outcomes(passed=1)
    text = summary.read_text()
    assert text.startswith("earlier steps\n### agentgate\n")
    assert "| passed | `test_agent.py::test_task` | `refs/agentgate/attempts/add-total/1` |" in text
    junit = (pytester.path / "junit.xml").read_text()
    assert '<property name="agentgate"' in junit and "refs/agentgate/attempts/add-total/1" in junit


def test_xdist_workers_share_one_run(pytester: pytest.Pytester, service: Path) -> None:
    """Real pytest-xdist: two workers, one dry-run reset, every promotion lands, none lost."""
    pytest.importorskip("xdist")
    pytester.makepyfile(
        test_agents="""
        import pytest

        @pytest.mark.parametrize("n", range(8))
        @pytest.mark.gated(task="parallel", gate=["true"], results="exit-code")
        def test_task(agent_workspace, n):
            (agent_workspace.path / f"f{n}.txt").write_text(str(n))
        """
    )
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        f"--agentgate-repo={service}",
        f"--agentgate-report={report}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["*= agentgate =*"])
    rows = json.loads(report.read_text())["attempts"]
    assert len(rows) == 8 and {r["verdict"] for r in rows} == {"passed"}
    (scratch,) = scratch_refs(service)  # one run, one scratch ref, for every worker
    names = git(service, "ls-tree", "--name-only", scratch).splitlines()
    assert {f"f{n}.txt" for n in range(8)} <= set(names)
    log = [
        json.loads(x)
        for x in (service / ".git" / "agentgate" / "oplog.jsonl").read_text().splitlines()
    ]
    assert sum(r["op"] == "dryrun-reset" for r in log) == 1  # one run, whichever worker came first


def test_a_run_holds_its_directory_against_prune(tmp_path: Path) -> None:
    from pytest_agentgate.maintenance.prune import old_runs
    from pytest_agentgate.pytest_plugin.rundirs import run_dir as _run_dir

    held: list[int] = []
    finished: list[int] = []
    mine = _run_dir(tmp_path / "work", "a" * 32, held)
    other = _run_dir(tmp_path / "work", "b" * 32, finished)
    for fd in finished:  # that run is over: its process let go of the lock
        os.close(fd)
    os.utime(mine / ".agentgate-run", (1, 1))  # "mine" is the oldest, yet still going
    os.utime(other / ".agentgate-run", (2, 2))
    assert old_runs(tmp_path / "work", keep=0) == [other]
    for fd in held:
        os.close(fd)
    assert sorted(old_runs(tmp_path / "work", keep=0)) == sorted([mine, other])


def test_last_failed_selection_opens_nothing(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(test_agent=gated_test() + "\n\ndef test_plain():\n    assert False\n")
    pytester.runpytest(
        f"--agentgate-repo={service}", "-k", "plain"
    )  # test_plain fails: --lf reruns it
    result = pytester.runpytest(f"--agentgate-repo={service}", "--lf", "--agentgate-target=nope")
    result.assert_outcomes(failed=1)
    assert not (service / ".git" / "agentgate").exists()


def test_space_separated_repo_cannot_hijack_the_suite_config(
    pytester: pytest.Pytester, service: Path
) -> None:
    (service / "pytest.ini").write_text("[pytest]\n")
    git(service, "add", "pytest.ini")
    git(service, "commit", "-qm", "an ini of the service's own")
    pytester.makepyfile(test_agent=gated_test(marker='task="t", gate=[]'))
    pytester.makeini("[pytest]\nagentgate_gate = true\n")
    result = pytester.runpytest_subprocess(
        "--agentgate-repo", str(service), "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*write --agentgate-repo={service}*"])
    result = pytester.runpytest_subprocess(f"--agentgate-repo={service}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_unwritable_report_and_bad_workdir_exit_4_before_anything_runs(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    pytester.makepyfile(test_agent=gated_test(marker='task="t", gate=[]'))
    before = git(service, "rev-parse", "main")
    (tmp_path / "a-file").write_text("")
    result = run(
        pytester,
        service,
        "--agentgate-promote",
        f"--agentgate-report={tmp_path / 'a-file' / 'r.json'}",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*invalid --agentgate-report*its directory cannot be made or is not writable*"]
    )
    result = run(pytester, service, f"--agentgate-workdir={tmp_path / 'a-file'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--agentgate-workdir*is not a directory*"])
    assert git(service, "rev-parse", "main") == before


def test_a_run_without_gated_tests_never_reads_where_its_summary_would_go(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$GITHUB_STEP_SUMMARY names the Markdown table's file by default; a run that has no
    row to show writes none, so a value that names nowhere is not its business."""
    pytester.makepyfile(test_plain="def test_nothing():\n    pass\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "missing" / "summary.md"))
    result = pytester.runpytest_subprocess(f"--agentgate-repo={service}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    result.assert_outcomes(passed=1)


def test_a_report_goes_into_a_folder_made_for_it_with_or_without_gated_tests(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    """A review found a run without gated tests refused a report whose folder was not made
    yet (exit 4, after its tests passed): the report's writer makes it, as it always did."""
    pytester.makepyfile(test_plain="def test_nothing():\n    pass\n")
    report = tmp_path / "reports" / "new" / "r.json"
    result = pytester.runpytest_subprocess(
        f"--agentgate-repo={service}", f"--agentgate-report={report}", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    assert json.loads(report.read_text())["attempts"] == []


def test_gated_test_must_use_the_workspace_and_state_stays_inside(
    pytester: pytest.Pytester, service: Path
) -> None:
    pytester.makepyfile(
        test_a="import pytest\n\n@pytest.mark.gated(task='t')\ndef test_t():\n    pass\n",
        test_b=(
            "import pytest\n\n@pytest.mark.gated(task='t', state=['../x'])\n"
            "def test_t(agent_workspace):\n    pass\n"
        ),
    )
    result = run(pytester, service)
    result.stdout.fnmatch_lines(
        [
            "*test_a.py::test_t: a @pytest.mark.gated test must use the agent_workspace fixture*",
            "*test_b.py::test_t: invalid @pytest.mark.gated: state paths are relative to the workspace*",
        ],
        consecutive=False,
    )


def test_a_failing_body_names_its_attempt(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(test_agent=gated_test(APPEND_TOTAL + "    raise RuntimeError('boom')\n"))
    result = run(pytester, service, "--agentgate-gate-exit-code=true")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*Captured agentgate call*", "*attempt: refs/agentgate/attempts/add-total/1*"]
    )


def test_a_linked_worktree_can_be_the_base_repository(service: Path, tmp_path: Path) -> None:
    """Agents are often run from a `git worktree add` checkout: it works as the base."""
    from pytest_agentgate import Engine, GateSpec

    git(service, "branch", "agents")
    linked = tmp_path / "linked"
    git(service, "worktree", "add", "-q", str(linked), "agents")
    engine = Engine.open(
        linked, None, promote=True, workdir=tmp_path / "w", gate=GateSpec(outcome_is_enough=True)
    )
    assert engine.target.branch == "agents"
    ws = engine.fork(task="from a worktree")
    (ws.path / "w.txt").write_text("w")
    attempt = engine.run_attempt(ws, task="from a worktree")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert (linked / "w.txt").read_text() == "w"  # the linked checkout followed
    assert git(linked, "status", "--porcelain") == ""
    assert (service / ".git" / "agentgate" / "oplog.jsonl").exists()  # one log per repository
    # The main checkout's branch cannot be promoted from here: its files would be left behind.
    main_engine = Engine.open(
        linked, "main", promote=True, workdir=tmp_path / "w", gate=GateSpec(outcome_is_enough=True)
    )
    ws = main_engine.fork(task="main from a worktree")
    (ws.path / "m.txt").write_text("m")
    attempt = main_engine.run_attempt(ws, task="main from a worktree")
    assert attempt.verdict.status == "error"
    assert f"refs/heads/main is checked out in the worktree '{service}'" in attempt.verdict.reason
    fsck(service)


def test_a_home_relative_workdir_is_pruned_where_it_was_made(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    pytester.makepyfile(test_agent=gated_test("    assert False\n", 'task="t", gate=[]'))
    for _ in range(3):
        run(pytester, service, "--agentgate-workdir=~/work", "--agentgate-keep-runs=1")
    assert len(list((tmp_path / "home" / "work").iterdir())) == 1


def test_a_test_run_again_by_rerunfailures_counts_each_attempt_once(
    pytester: pytest.Pytester, service: Path
) -> None:
    counter = pytester.path / "count"
    pytester.makepyfile(
        test_agent=f"""
        from pathlib import Path
        import pytest

        @pytest.mark.gated(task="flaky body", gate=[])
        def test_task(agent_workspace):
            (agent_workspace.path / "x.txt").write_text("x")
            counter = Path({str(counter)!r})
            n = int(counter.read_text()) if counter.exists() else 0
            counter.write_text(str(n + 1))
            assert n >= 2
        """
    )
    result = run(pytester, service, "-p", "rerunfailures", "--reruns=3")
    assert result.parseoutcomes() == {"passed": 1, "rerun": 2}
    verdicts = [r["verdict"] for r in rows(pytester)]
    assert verdicts == ["rejected", "rejected", "passed"]
    assert len({r["attempt_commit"] for r in rows(pytester)}) == 3
    summary = [line for line in result.outlines if line.startswith(("REJECTED", "WOULD PROMOTE"))]
    assert len(summary) == 3


def test_a_run_without_a_gated_test_checks_no_setting(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The plugin loads in every pytest run of the environment (gate commands' runs too): a
    setting only a gated run uses must not break a run that has none."""
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    report = tmp_path / "report.json"
    result = pytester.runpytest(
        "--agentgate-flaky=retry", "--agentgate-sandbox=bwarp", f"--agentgate-report={report}"
    )
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    assert json.loads(report.read_text())["attempts"] == []  # what it does use still works


def test_a_retry_that_lands_after_a_first_try_that_raised_passes(
    pytester: pytest.Pytester, service: Path
) -> None:
    """retries=1: the first try's body raises (an agent that ran out of time part way), the
    second lands. The test passed then crashed with UnboundLocalError in the plugin, the
    target moved and the test reported a failure."""
    body = (
        "    import pathlib\n"
        "    mark = pathlib.Path(agent_workspace.path).parent / 'tried-once'\n"
        "    if not mark.exists():\n"
        "        mark.write_text('x')\n"
        "        raise RuntimeError('ran out of time')\n"
        "    (agent_workspace.path / 'done.txt').write_text('done')\n"
    )
    pytester.makepyfile(test_agent=gated_test(body, 'task="Retry after a raise", retries=1'))
    before = git(service, "rev-parse", "main")
    result = run(pytester, service, "--agentgate-gate-exit-code=true", "--agentgate-promote")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    assert git(service, "rev-parse", "main") != before
    assert git(service, "show", "main:done.txt") == "done"


def test_colours_never_reach_a_record_or_the_feedback(
    pytester: pytest.Pytester, service: Path
) -> None:
    """A gate that prints in colour: its tail in the record and the report has no escape."""
    pytester.makepyfile(test_agent=gated_test())
    gate = "printf '\\033[31mred failure\\033[0m \\033]0;title\\007done\\n'; exit 1"
    result = run(pytester, service, f'--agentgate-gate-exit-code=sh -c "{gate}"')
    result.assert_outcomes(failed=1)
    [row] = rows(pytester)
    record = git(service, "log", "-1", "--format=%B", row["attempt_ref"])
    assert "red failure" in record and "\x1b" not in record
    assert "\x1b" not in result.stdout.str()


def test_a_sha256_repository_is_gated_and_promoted(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """``git init --object-format=sha256``: the run stopped with an INTERNALERROR, the refs
    layout check passing a 40-zero old value to update-ref. The null id is the object
    format's."""
    from helpers import make_service

    repo = make_service(tmp_path / "sha256", object_format="sha256")
    pytester.makepyfile(test_agent=gated_test())
    before = git(repo, "rev-parse", "main")
    assert len(before) == 64
    gate = f"{sys.executable} -m pytest -q -p no:cacheprovider tests"
    result = run(pytester, repo, f"--agentgate-gate={gate}", "--agentgate-promote")
    result.assert_outcomes(passed=1)
    after = git(repo, "rev-parse", "main")
    assert after != before and git(repo, "rev-parse", "main^") == before
    git(repo, "fsck", "--strict", "--no-progress")


def test_the_first_gate_s_baseline_is_announced_once(
    pytester: pytest.Pytester, service: Path
) -> None:
    """Once the first gate of a run took twice as long as the next, and nothing said why."""
    pytester.makepyfile(test_agent=gated_test())
    gate = f"--agentgate-gate={sys.executable} -m pytest -q -p no:cacheprovider tests"
    result = run(pytester, service, gate)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "agentgate: computing the base's results once (*): *every attempt on this tree reuses them"
        ]
    )
    again = run(pytester, service, gate)  # kept in git: not computed, not said
    again.assert_outcomes(passed=1)
    assert "computing the base's results" not in again.stdout.str()
