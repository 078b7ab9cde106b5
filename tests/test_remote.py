"""A target on a server: promotion is a push with a lease, against a real bare remote and a
real ``git daemon`` on the loopback interface."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import fsck, git, git_daemon, spawn_pytest

AGENT = """
import pytest

@pytest.mark.gated(task="remote change {n}", gate=["true"], results="exit-code")
def test_change_{n}(agent_workspace):
    (agent_workspace.path / "{who}-{n}.txt").write_text("{who} {n}\\n")
"""


def clone(url: str, path: Path) -> Path:
    git(path.parent, "clone", "-q", url, str(path))
    return path


@pytest.fixture
def server(service: Path, tmp_path: Path) -> Path:
    bare = tmp_path / "server" / "ledger.git"
    bare.parent.mkdir()
    git(tmp_path, "clone", "-q", "--bare", str(service), str(bare))
    return bare


def test_promotion_pushes_with_a_lease(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    work = clone(str(server), tmp_path / "work")
    local_main = git(work, "rev-parse", "main")
    pytester.makepyfile(test_agent=AGENT.format(n=1, who="a"))
    result = pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["PROMOTED*origin/main: *fast-forward*"])
    assert git(server, "show", "main:a-1.txt") == "a 1"
    # The user's own branch and remote-tracking refs are untouched; the plugin's view moved.
    assert git(work, "rev-parse", "main") == local_main
    assert git(work, "rev-parse", "refs/remotes/origin/main") == local_main
    assert git(work, "rev-parse", "refs/agentgate/remote/origin/main") == git(
        server, "rev-parse", "main"
    )
    assert git(work, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/") == (
        "refs/agentgate/attempts/remote-change-1/1"
    )
    fsck(server)


def test_a_push_that_lands_meanwhile_is_merged_onto_not_overwritten(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    work = clone(str(server), tmp_path / "work")
    other = clone(str(server), tmp_path / "other")
    pytester.makepyfile(
        test_agent=f"""
        import subprocess
        import pytest

        @pytest.mark.gated(task="mine", gate=["test -f mine.txt"], results="exit-code")
        def test_mine(agent_workspace):
            (agent_workspace.path / "mine.txt").write_text("mine")
            # Meanwhile a person pushes to the server from another clone.
            run = lambda *a: subprocess.run(["git", "-c", "user.name=P", "-c", "user.email=p@e", *a],
                                            cwd={str(other)!r}, check=True)
            (__import__("pathlib").Path({str(other)!r}) / "person.txt").write_text("person")
            run("add", "person.txt")
            run("commit", "-qm", "a person's push")
            run("push", "-q", "origin", "main")
        """
    )
    result = pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["PROMOTED*merge, re-tested*"])
    names = git(server, "ls-tree", "--name-only", "main").splitlines()
    assert "person.txt" in names and "mine.txt" in names
    assert git(server, "log", "-1", "--format=%s", "main^1") == "a person's push"


def test_unknown_remote_is_a_usage_error(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(test_agent=AGENT.format(n=1, who="a"))
    result = pytester.runpytest(
        f"--agentgate-repo={service}", "--agentgate-remote=upstream", "--agentgate-promote"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*has no remote named 'upstream'*git remote add upstream URL*(from command line --agentgate-remote)*"
        ]
    )


def pre_receive(server: Path, script: str) -> None:
    """Give the server a pre-receive hook (``script``, after the shebang)."""
    hook = server / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\n" + script)
    hook.chmod(0o755)


def run_reported(pytester: pytest.Pytester, work: Path, report: Path) -> pytest.RunResult:
    """One agent test against origin from ``work``, promoting, with the JSON report."""
    pytester.makepyfile(test_agent=AGENT.format(n=1, who="a"))
    return pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote",
        f"--agentgate-report={report}",
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def daemon(server: Path) -> Iterator[str]:
    """``git daemon`` serving the server directory on a loopback port, pushes enabled."""
    with git_daemon(server) as url:
        yield url


def test_two_machines_promote_through_git_daemon_and_lose_nothing(
    daemon: str, server: Path, tmp_path: Path
) -> None:
    """Two clones (two "machines"), four agent tasks each, pushing at once: all eight land."""
    procs = []
    for who in ("left", "right"):
        work = clone(daemon, tmp_path / who)
        suite = tmp_path / f"suite-{who}"
        suite.mkdir()
        (suite / "test_agents.py").write_text("".join(AGENT.format(n=n, who=who) for n in range(4)))
        procs.append(
            spawn_pytest(
                suite,
                f"--agentgate-repo={work}",
                "--agentgate-remote=origin",
                "--agentgate-promote",
                f"--basetemp={tmp_path / f'tmp-{who}'}",
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    names = set(git(server, "ls-tree", "--name-only", "main").splitlines())
    assert {f"{who}-{n}.txt" for who in ("left", "right") for n in range(4)} <= names
    fsck(server)


def test_a_push_the_server_refuses_is_an_error_after_one_push(
    pytester: pytest.Pytester, daemon: str, server: Path, tmp_path: Path
) -> None:
    """A pre-receive hook that declines is the server's policy, not a race: one push, an
    ``error`` verdict with the server's own words, the branch where it was, nothing retried."""
    pushes = tmp_path / "pushes.log"
    pre_receive(
        server,
        f"while read old new ref; do echo $ref >> {pushes}; done\n"
        "echo 'policy: main is protected, open a review instead' >&2\nexit 1\n",
    )
    before = git(server, "rev-parse", "main")
    work = clone(daemon, tmp_path / "work")
    report = tmp_path / "report.json"
    result = run_reported(pytester, work, report)
    assert result.ret == 6  # an error verdict: the harness (here the server) stopped it
    row = json.loads(report.read_text())["attempts"][0]
    assert row["verdict"] == "error", row
    assert "refused" in row["reason"] and "pre-receive hook declined" in row["reason"]
    assert "main is protected, open a review instead" in row["reason"]
    # Exactly one push of the branch, no retries; then one of the record, refused too (and
    # the lease it tried to take first: refused, so the move went on without one).
    pushed = [
        r for r in pushes.read_text().splitlines() if not r.startswith("refs/agentgate/lease/")
    ]
    assert pushed == ["refs/heads/main", row["attempt_ref"]]
    assert git(server, "rev-parse", "main") == before
    assert row["attempt_ref"]  # the attempt is still recorded, locally
    assert "not pushed to origin" in row["record_problem"]
    fsck(server)


def test_a_lock_left_on_the_server_is_an_error_after_one_push(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    """A stale ``main.lock`` on the server fails the server's own ref transaction
    (``[remote rejected] (atomic transaction failed)``): not a race, so one push and an
    error naming what the server said, never twenty pushes and a misleading RefMoved."""
    pushes = tmp_path / "pushes.log"
    pre_receive(server, f"while read old new ref; do echo $ref >> {pushes}; done\n")
    work = clone(str(server), tmp_path / "work")
    (server / "refs" / "heads" / "main.lock").write_text("")
    report = tmp_path / "report.json"
    result = run_reported(pytester, work, report)
    assert result.ret == 6
    row = json.loads(report.read_text())["attempts"][0]
    assert row["verdict"] == "error" and "refused" in row["reason"], row
    assert "main.lock" in row["reason"] or "cannot lock ref" in row["reason"]
    # The branch once (no retries), with its link in the chain of moves; then the record,
    # which the server takes. (The lease is taken, renewed with the branch and given back
    # around it.)
    pushed = [
        r for r in pushes.read_text().splitlines() if not r.startswith("refs/agentgate/lease/")
    ]
    assert pushed == ["refs/heads/main", "refs/agentgate/moves/main", row["attempt_ref"]]


def test_a_remote_s_credentials_never_reach_a_message(
    pytester: pytest.Pytester, service: Path
) -> None:
    git(service, "remote", "add", "origin", "http://agent:s3cr3t-token@127.0.0.1:9/ledger.git")
    pytester.makepyfile(test_agent=AGENT.format(n=1, who="a"))
    result = pytester.runpytest(
        f"--agentgate-repo={service}", "--agentgate-remote=origin", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "git fetch origin" in text and "s3cr3t-token" not in text


def _diverged(tmp_path: Path, shared: int, on_main: int) -> Path:
    """A server whose main and feature share ``shared`` commits, then part ways."""
    src = tmp_path / "src"
    git(tmp_path, "init", "-q", "-b", "main", str(src))
    for i in range(shared):
        (src / f"shared{i}.txt").write_text(f"{i}\n")
        git(src, "add", "-A")
        git(src, "commit", "-qm", f"shared {i}")
    git(src, "checkout", "-qb", "feature")
    for i in range(2):
        (src / f"feature{i}.txt").write_text(f"{i}\n")
        git(src, "add", "-A")
        git(src, "commit", "-qm", f"feature {i}")
    git(src, "checkout", "-q", "main")
    for i in range(on_main):
        (src / f"main{i}.txt").write_text(f"{i}\n")
        git(src, "add", "-A")
        git(src, "commit", "-qm", f"main {i}")
    server = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(src), str(server))
    return server


def _from_depth_1_clone(server: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """An engine on a depth-1 clone of the server's feature branch, forking from its HEAD."""
    from pytest_agentgate import Engine, GateSpec
    from pytest_agentgate.sandbox.containment import Settings

    work = tmp_path / "work"
    git(
        tmp_path,
        "clone",
        "-q",
        "--depth",
        "1",
        "--branch",
        "feature",
        f"file://{server}",
        str(work),
    )
    assert (work / ".git" / "shallow").exists()
    return Engine.open(
        work, "main", remote="origin", base="HEAD", promote=True, workdir=tmp_path / "runs",
        gate=GateSpec(outcome_is_enough=True), sandbox=Settings(mode="none"),
    )  # fmt: skip


def test_a_depth_1_clone_is_deepened_just_enough_for_a_merge(tmp_path: Path) -> None:
    """CI checks out one commit of a branch (depth 1); an attempt forked there lands on a
    target that moved: the plugin fetches just enough history to find the merge base."""

    server = _diverged(tmp_path, shared=3, on_main=3)
    e = _from_depth_1_clone(server, tmp_path)
    ws = e.fork(task="shallow")
    (ws.path / "agent.txt").write_text("from a shallow clone\n")
    attempt = e.run_attempt(ws, task="shallow")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert attempt.move is not None and attempt.move.kind == "merge"
    landed = git(server, "ls-tree", "--name-only", "main").splitlines()
    assert {"agent.txt", "feature1.txt", "main2.txt"} <= set(landed)
    git(server, "fsck", "--strict", "--no-progress")


def test_a_shallow_clone_too_far_from_the_target_names_the_command_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_agentgate.land.remote_branch import RemoteBranch

    monkeypatch.setattr(RemoteBranch, "DEEPEN_STEPS", (1,))  # the merge base is 2 behind
    server = _diverged(tmp_path, shared=2, on_main=6)
    e = _from_depth_1_clone(server, tmp_path)
    ws = e.fork(task="too shallow")
    (ws.path / "agent.txt").write_text("x\n")
    verdict = e.run_attempt(ws, task="too shallow").verdict
    assert verdict.status == "error"
    assert "git fetch --unshallow origin" in verdict.reason and "fetch-depth: 0" in verdict.reason
    assert "agent.txt" not in git(server, "ls-tree", "--name-only", "main")


def test_a_person_s_push_to_the_server_is_logged_as_an_external_move(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    """Judged by the records, as for a local branch: a tip on the server that no attempt
    record or logged move accounts for is logged and shown in the summary."""
    work = clone(str(server), tmp_path / "work")
    other = clone(str(server), tmp_path / "other")
    for n in range(2):
        pytester.makepyfile(
            **{
                f"test_agent_{n}": f"""
            import pytest

            @pytest.mark.gated(task="change {n}")
            def test_change(agent_workspace):
                (agent_workspace.path / "change-{n}.txt").write_text("{n}")
            """
            }
        )
    flags = [f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote",
             "--agentgate-gate-exit-code=true"]  # fmt: skip
    pytester.runpytest("test_agent_0.py", *flags).assert_outcomes(passed=1)
    (other / "person.txt").write_text("person\n")
    git(other, "add", "person.txt")
    git(other, "commit", "-qm", "a person's push")
    git(other, "pull", "-q", "--rebase", "origin", "main")
    git(other, "push", "-q", "origin", "HEAD:main")
    second = pytester.runpytest("test_agent_1.py", *flags)
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines(["*target had moved outside agentgate: pushed to origin*"])
    log = [
        json.loads(line)
        for line in (work / ".git" / "agentgate" / "oplog.jsonl").read_text().splitlines()
    ]
    assert [r["op"] for r in log].count("external-move") == 1


def test_another_machine_s_landing_is_not_taken_for_a_person_s_push(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    """Machine B's landing, as machine A sees it: no record or log line of A's names it,
    but the server's chain of moves (in the same atomic push as B's move) does: not an
    external move. A person's push afterwards still is one, and is shown once."""
    a = clone(str(server), tmp_path / "a")
    b = clone(str(server), tmp_path / "b")
    person = clone(str(server), tmp_path / "person")
    pytester.makepyfile(**{f"test_agent_{n}": AGENT.format(n=n, who=f"m{n}") for n in range(4)})
    flags = ["--agentgate-remote=origin", "--agentgate-promote", "--agentgate-gate-exit-code=true"]
    pytester.runpytest("test_agent_0.py", f"--agentgate-repo={a}", *flags).assert_outcomes(passed=1)
    pytester.runpytest("test_agent_1.py", f"--agentgate-repo={b}", *flags).assert_outcomes(passed=1)
    after_b = pytester.runpytest("test_agent_2.py", f"--agentgate-repo={a}", *flags)
    after_b.assert_outcomes(passed=1)
    assert "moved outside agentgate" not in after_b.stdout.str()
    (person / "person.txt").write_text("person\n")
    git(person, "add", "person.txt")
    git(person, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-qm", "a person")
    git(person, "pull", "-q", "--rebase", "origin", "main")
    git(person, "push", "-q", "origin", "HEAD:main")
    after_person = pytester.runpytest("test_agent_3.py", f"--agentgate-repo={a}", *flags)
    after_person.assert_outcomes(passed=1)
    after_person.stdout.fnmatch_lines(["*target had moved outside agentgate: pushed to origin*"])
    log = [
        json.loads(line)
        for line in (a / ".git" / "agentgate" / "oplog.jsonl").read_text().splitlines()
    ]
    external = [r["new"] for r in log if r["op"] == "external-move"]
    assert external == [git(person, "rev-parse", "HEAD")]
    links = git(server, "log", "--first-parent", "--format=%s", "refs/agentgate/moves/main")
    assert links.splitlines()[:5].count("agentgate promote of main") == 4  # one per landing
    fsck(server)


def _attempts_on(work: Path, remote: str = "origin") -> list[dict[str, str]]:
    """What ``agentgate attempts --remote`` lists from ``work``, as JSON rows."""
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", "attempts", "--repo", str(work),
         "--remote", remote, "--json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return list(json.loads(out))


def test_records_go_to_the_server_with_numbers_unique_across_machines(
    daemon: str, server: Path, tmp_path: Path
) -> None:
    """Two clones run the same four tasks at once: every record reaches the server, each
    under a number of its own there (claimed by compare-and-swap, renumbered here when the
    other machine had it), and either clone lists all eight with ``--remote origin``."""
    procs, works = [], []
    for who in ("left", "right"):
        work = clone(daemon, tmp_path / who)
        works.append(work)
        suite = tmp_path / f"suite-{who}"
        suite.mkdir()
        (suite / "test_agents.py").write_text("".join(AGENT.format(n=n, who=who) for n in range(4)))
        procs.append(
            spawn_pytest(
                suite, f"--agentgate-repo={work}", "--agentgate-remote=origin",
                "--agentgate-promote", "-n", "2", f"--basetemp={tmp_path / f'tmp-{who}'}",
            )
        )  # fmt: skip
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    on_server = dict(
        line.split()[::-1]
        for line in git(server, "for-each-ref", "--format=%(objectname) %(refname)",
                        "refs/agentgate/attempts/").splitlines()
    )  # fmt: skip
    assert len(on_server) == 8, on_server
    for slug in (f"remote-change-{n}" for n in range(4)):
        assert {f"refs/agentgate/attempts/{slug}/1", f"refs/agentgate/attempts/{slug}/2"} <= set(
            on_server
        )
    for work in works:
        mine = dict(
            line.split()[::-1]
            for line in git(work, "for-each-ref", "--format=%(objectname) %(refname)",
                            "refs/agentgate/attempts/").splitlines()
        )  # fmt: skip
        assert len(mine) == 4 and all(on_server[ref] == c for ref, c in mine.items()), mine
        listed = _attempts_on(work)
        assert sorted(r["ref"] for r in listed) == sorted(on_server), listed
        assert {r["verdict"] for r in listed} == {"promoted"}
    fsck(server)


def test_a_record_the_server_would_not_take_is_pushed_by_the_next_run(
    pytester: pytest.Pytester, daemon: str, server: Path, tmp_path: Path
) -> None:
    """The server refuses the record (not the landing): the attempt still lands, the
    summary says its record stayed here, and the next run pushes it before anything else."""
    pre_receive(
        server,
        "while read old new ref; do case $ref in refs/agentgate/*) "
        "echo 'no records here' >&2; exit 1;; esac; done\nexit 0\n",
    )
    work = clone(daemon, tmp_path / "work")
    report = tmp_path / "report.json"
    first = run_reported(pytester, work, report)
    first.assert_outcomes(passed=1)
    row = json.loads(report.read_text())["attempts"][0]
    assert row["verdict"] == "promoted" and git(server, "show", "main:a-1.txt") == "a 1"
    assert "not pushed to origin" in row["record_problem"]
    first.stdout.fnmatch_lines(["*not pushed to origin*"])
    assert git(server, "for-each-ref", "refs/agentgate/attempts/") == ""
    (server / "hooks" / "pre-receive").unlink()
    pytester.makepyfile(test_agent=AGENT.format(n=2, who="a"))
    second = pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote"
    )
    second.assert_outcomes(passed=1)
    refs = git(server, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/")
    assert refs.splitlines() == [
        "refs/agentgate/attempts/remote-change-1/1",
        "refs/agentgate/attempts/remote-change-2/1",
    ]
    # Any clone reads them: show and restore from a fresh one, which never ran an agent.
    elsewhere = clone(daemon, tmp_path / "elsewhere")
    shown = _agentgate("show", "--repo", str(elsewhere), "--remote", "origin", "remote-change-1/1")
    assert "attempt refs/agentgate/attempts/remote-change-1/1 (on origin)" in shown
    assert "a-1.txt" in shown
    out = tmp_path / "restored"
    _agentgate("restore", "--repo", str(elsewhere), "--remote", "origin", "remote-change-1/1",
               "--to", str(out))  # fmt: skip
    assert (out / "a-1.txt").read_text() == "a 1\n"
    fsck(server)


def _agentgate(*args: str) -> str:
    import sys

    found = subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    return found.stdout


def test_rollback_and_revert_move_the_server_s_branch(
    pytester: pytest.Pytester, daemon: str, server: Path, tmp_path: Path
) -> None:
    """Undo on the server: from a clone that ran nothing, ``revert --remote`` undoes one
    promoted attempt (found among the server's records) keeping the later one, and
    ``rollback --remote`` lands a byte-exact tree; both by the server's compare-and-swap,
    both logged. A stale ``--expect`` moves nothing."""
    work = clone(daemon, tmp_path / "work")
    start = git(server, "rev-parse", "main")
    pytester.makepyfile(
        test_agents=AGENT.format(n=1, who="a") + AGENT.format(n=2, who="a"),
    )
    pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote"
    ).assert_outcomes(passed=2)
    elsewhere = clone(daemon, tmp_path / "elsewhere")
    landed = git(server, "rev-parse", "main")
    stale = subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", "rollback", "--repo", str(elsewhere),
         "--remote", "origin", "--target", "main", "--to", "HEAD~2", "--expect", "HEAD~1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert stale.returncode != 0 and git(server, "rev-parse", "main") == landed
    _agentgate("revert", "--repo", str(elsewhere), "--remote", "origin", "--target", "main",
               "remote-change-1/1")  # fmt: skip
    names = set(git(server, "ls-tree", "--name-only", "main").splitlines())
    assert "a-2.txt" in names and "a-1.txt" not in names
    out = _agentgate("rollback", "--repo", str(elsewhere), "--remote", "origin",
                     "--target", "main", "--to", start)  # fmt: skip
    assert "origin/main:" in out
    assert git(server, "rev-parse", "main^{tree}") == git(server, "rev-parse", f"{start}^{{tree}}")
    log = [
        json.loads(line)
        for line in (elsewhere / ".git" / "agentgate" / "oplog.jsonl").read_text().splitlines()
    ]
    assert [r["op"] for r in log if r["op"] in ("revert", "rollback")] == ["revert", "rollback"]
    assert all(r["ref"] == "origin:refs/heads/main" for r in log if r["op"] == "rollback")
    fsck(server)


def test_prune_on_the_server_keeps_what_landed_and_each_task_s_highest_number(
    pytester: pytest.Pytester, daemon: str, server: Path, tmp_path: Path
) -> None:
    """``prune --remote``: by the same rules as here, on every machine's records there; a
    task's highest number stays, so no machine is handed a number a second time."""
    work = clone(daemon, tmp_path / "work")
    failing = """
import pytest

@pytest.mark.gated(task="doomed", gate=["false"], results="exit-code")
def test_doomed_{n}(agent_workspace):
    (agent_workspace.path / "d-{n}.txt").write_text("d")
"""
    pytester.makepyfile(
        test_agents=AGENT.format(n=1, who="a") + failing.format(n=1) + failing.format(n=2)
    )
    pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote"
    ).assert_outcomes(passed=1, failed=2)
    listed = git(server, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/")
    assert listed.splitlines() == [
        "refs/agentgate/attempts/doomed/1",
        "refs/agentgate/attempts/doomed/2",
        "refs/agentgate/attempts/remote-change-1/1",
    ]
    elsewhere = clone(daemon, tmp_path / "elsewhere")
    out = _agentgate("prune", "--repo", str(elsewhere), "--remote", "origin", "--older-than", "0s")
    assert "removed refs/agentgate/attempts/doomed/1 on origin" in out
    assert "kept refs/agentgate/attempts/doomed/2 on origin (its task's highest number)" in out
    assert "landed on origin/main" in out
    listed = git(server, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/")
    assert listed.splitlines() == [
        "refs/agentgate/attempts/doomed/2",
        "refs/agentgate/attempts/remote-change-1/1",
    ]
    # A later attempt at the task gets a number above every one handed out.
    pytester.makepyfile(test_agents=failing.format(n=3))
    pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote"
    ).assert_outcomes(failed=1)
    assert "refs/agentgate/attempts/doomed/3" in git(
        server, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/doomed/"
    )
    fsck(server)


LOGGED = """
import pytest

@pytest.mark.gated(task="logged change {n}")
def test_change_{n}(agent_workspace):
    (agent_workspace.path / "{who}-{n}.txt").write_text("{who} {n}\\n")
"""

#: A gate that logs each of its runs and takes a little while, as a test suite does. Its
#: first four runs (the first test of each of the two machines' two workers) wait for each
#: other, for at most 20 s: on a loaded machine one pytest could start seconds after the
#: other, its landings then came one by one, and the count measured that skew, not batching.
GATE_LOGGING = (
    f'{sys.executable} -c "import pathlib, os, time; '
    "p = pathlib.Path(os.environ['GATE_LOG']); s = p.with_name('gate.starts'); "
    "s.open('a').write('s\\n'); end = time.monotonic() + 20\n"
    "while len(s.read_text().splitlines()) < 4 and time.monotonic() < end: time.sleep(0.05)\n"
    "time.sleep(0.3); p.open('a').write('run\\n')\""
)


def test_two_machines_share_one_leader_and_few_retests(
    daemon: str, server: Path, tmp_path: Path, signing: dict[str, list[str]]
) -> None:
    """Two clones, each pytest -n 2 over four tests, at once, under a real git daemon: the
    batch leader is one across machines (the server's lease, which every move holds), and
    it batches the attempts the other machine posted on the server's queue beside its own:
    all eight land with no racing re-tests, at most one re-test a landing (without the
    lease there were 30-45% more than one per merge), and the lease, the queue and the
    verdicts are all gone from the server afterwards. How few re-tests batching leaves
    (8 + 2 to 4 on an idle machine, more when the runs are spread out by load) is measured
    by ``bench/queue.py``, not asserted here: it depends on how the attempts meet in time."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "gate.log"
    procs = []
    for who in ("left", "right"):
        work = clone(daemon, tmp_path / who)
        suite = tmp_path / f"suite-{who}"
        suite.mkdir()
        (suite / "test_agents.py").write_text(
            "".join(LOGGED.format(n=n, who=who) for n in range(4))
        )
        procs.append(
            spawn_pytest(
                suite, f"--agentgate-repo={work}", "--agentgate-remote=origin",
                "--agentgate-promote", "-n", "2", f"--agentgate-gate-exit-code={GATE_LOGGING}",
                "--agentgate-gate-env=GATE_LOG", f"--agentgate-sandbox-bind={logs}:rw", *signing[who],
                f"--basetemp={tmp_path / f'tmp-{who}'}", env={"GATE_LOG": str(log)},
            )
        )  # fmt: skip
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    names = set(git(server, "ls-tree", "--name-only", "main").splitlines())
    assert {f"{who}-{n}.txt" for who in ("left", "right") for n in range(4)} <= names
    runs = len(log.read_text().splitlines())
    assert 8 <= runs <= 8 + 8, f"{runs} gate runs"
    assert git(server, "for-each-ref", "refs/agentgate/lease/") == ""  # given back
    for left in ("queue", "verdicts"):  # every posted attempt taken, every verdict read
        assert git(server, "for-each-ref", f"refs/agentgate/{left}/") == "", left
    assert len(_attempts_on(tmp_path / "left")) == 8
    assert len(_attempts_on(tmp_path / "right")) == 8
    fsck(server)


def test_a_leader_killed_holding_the_lease_is_taken_over_after_it_expires(
    daemon: str, server: Path, tmp_path: Path
) -> None:
    """Machine A's leader is killed mid-batch, holding the server's lease: nothing of its
    batch lands; machine B's leader waits for the lease to expire (its length plus the
    skew margin), takes it over, and lands B's attempt once."""
    pusher = clone(daemon, tmp_path / "person")
    moves = """
import subprocess
import pytest

@pytest.mark.gated(task="{who} change")
def test_{who}(agent_workspace):
    (agent_workspace.path / "{who}.txt").write_text("{who}\\n")
    # Someone pushes meanwhile: the attempt needs a merge, so it goes through the queue.
    person = {person!r}
    open(person + "/{who}-person.txt", "w").write("p\\n")
    subprocess.run(["git", "-C", person, "add", "-A"], check=True)
    subprocess.run(["git", "-C", person, "-c", "user.name=p", "-c", "user.email=p@e",
                    "commit", "-qm", "person {who}"], check=True)
    subprocess.run(["git", "-C", person, "pull", "-q", "--rebase"], check=True)
    subprocess.run(["git", "-C", person, "push", "-q"], check=True)
"""
    runs = {}
    for who, env in (("a", {"AGENTGATE_FAULT": "merge-written"}), ("b", {})):
        work = clone(daemon, tmp_path / who)
        suite = tmp_path / f"suite-{who}"
        suite.mkdir()
        (suite / "test_it.py").write_text(moves.format(who=who, person=str(pusher)))

        begin = time.monotonic()
        proc = spawn_pytest(
            suite, f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote",
            "--agentgate-gate-exit-code=true", "--agentgate-lease-seconds=3",
            f"--basetemp={tmp_path / f'tmp-{who}'}", env=env,
        )  # fmt: skip
        out = proc.communicate(timeout=120)[0]
        runs[who] = (proc.returncode, out, time.monotonic() - begin)
        if who == "a":
            assert proc.returncode == -9, out  # killed while it led, lease held
            held = git(server, "log", "-1", "--format=%B", "refs/agentgate/lease/main")
            expires = float(held.split("Agentgate-Expires: ")[1].split()[0])
    code, out, _ = runs["b"]
    assert code == 0, out
    # B landed only once A's lease had expired, by more than the skew margin (1 s for 3 s).
    landed_at = float(git(server, "log", "-1", "--format=%ct", "main"))
    assert landed_at >= int(expires + 1), (landed_at, expires)
    names = git(server, "ls-tree", "--name-only", "main").splitlines()
    assert "b.txt" in names and "a.txt" not in names  # A's batch never landed
    assert names.count("b.txt") == 1
    assert git(server, "for-each-ref", "refs/agentgate/lease/") == ""
    fsck(server)


@pytest.mark.parametrize(
    "message",
    [
        "lease\n\nAgentgate-Holder: squatter\nAgentgate-Expires: 32503680000\n",
        "lease\n\nAgentgate-Expires: notanumber\nAgentgate-Holder\n",
    ],
    ids=["lasting for ever", "a line that is no field"],
)
def test_a_lease_written_by_hand_is_taken_over_after_at_most_one_length(
    pytester: pytest.Pytester, server: Path, tmp_path: Path, message: str
) -> None:
    """Anyone who can push can write a lease: one that claims to expire in the year 3000 is
    honoured for one length plus the margin (it never changes, so nobody renews it), one
    that cannot be read not at all; then it is taken over, and the landing happens, once."""

    work = clone(str(server), tmp_path / "work")
    tree = git(work, "hash-object", "-t", "tree", "-w", "/dev/null")
    forged = git(work, "commit-tree", tree, "-m", message)
    git(work, "push", "-q", str(server), f"{forged}:refs/agentgate/lease/main")
    pytester.makepyfile(test_agent=AGENT.format(n=1, who="a"))
    begin = time.monotonic()
    result = pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote",
        "--agentgate-lease-seconds=2",
    )  # fmt: skip
    took = time.monotonic() - begin
    result.assert_outcomes(passed=1)
    if "32503680000" in message:
        assert took >= 2 + 1  # the length and the margin: honoured that long, no longer
    assert took < 30
    assert git(server, "show", "main:a-1.txt") == "a 1"
    assert git(server, "for-each-ref", "refs/agentgate/lease/") == ""
    fsck(server)
