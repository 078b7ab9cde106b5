"""A write that fails after the gate passed (a full disk, an I/O error, a kill) loses nothing.

Either nothing moved, or the target moved and its record is written, now or by the next run;
never a move without its record, never a record that claims a move that did not happen, never
an internal error, and the next run needs no person to repair anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import AGENTS, fsck, git, make_service
from test_faults import run

from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.store import attempts, oplog
from pytest_agentgate.store.pending import open_lines


def assert_consistent(service: Path, base: str) -> list[attempts.AttemptInfo]:
    """Records and the target agree, nothing is left pending, git is healthy."""
    repo = BaseRepo.open(service)
    tip = git(service, "rev-parse", "main")
    infos = attempts.list_attempts(repo)
    landed = [a for a in infos if a.landed]
    for info in landed:
        assert info.verdict == "promoted"
        on = subprocess.run(
            ["git", "merge-base", "--is-ancestor", info.landed, tip], cwd=service, check=False
        )
        assert on.returncode == 0, f"{info.record_ref} claims {info.landed}, which is not on main"
    # Every commit main gained is one that a record names as landed.
    gained = git(service, "rev-list", "--first-parent", f"{base}..main").split()
    assert set(gained) <= {a.landed for a in landed}, "a move without its record"
    assert not open_lines(oplog.read(repo.common_dir)), "a pending move left unsettled"
    ids = [a.trailers.get("Id") for a in infos]
    assert len(ids) == len(set(ids)), "an attempt recorded twice"
    assert git(service, "status", "--porcelain") == ""
    fsck(service)
    return infos


@pytest.mark.parametrize(
    ("fault", "moves"),
    [
        ("pending:enospc", False),  # the pending line cannot be written: nothing may move
        ("pending:eio", False),
        ("journal:enospc", False),  # the working-tree journal cannot be written
        ("record:enospc", True),  # the target moved; its record cannot be written
        ("oplog:enospc", True),  # the target moved; its log line cannot be written
        ("worktree-sync:enospc", True),  # the target moved; its checked-out files cannot follow
    ],
)
def test_a_failing_write_after_the_gate(
    suite: Path, service: Path, fault: str, moves: bool
) -> None:
    base = git(service, "rev-parse", "main")
    result = run(suite, service, base, fault)
    out = result.stdout + result.stderr
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    assert result.returncode in (0, 6), out  # 6: an attempt could not be judged (a write)
    tip = git(service, "rev-parse", "main")
    assert (tip != base) == moves, out
    if not moves:
        assert "nothing moved" in out
    if fault.startswith("record"):
        assert "its attempt record could not be written" in out
    if fault.startswith("oplog"):
        assert "the operations log line of this move could not be written" in out
    if fault.startswith("worktree-sync"):
        assert "the checked-out files were not updated" in out
    # The next run settles what the failure left, then lands both tasks.
    again = run(suite, service, base, None)
    assert again.returncode == 0, again.stdout + again.stderr
    infos = assert_consistent(service, base)
    names = git(service, "ls-tree", "--name-only", "main").splitlines()
    assert "first.txt" in names and "second.txt" in names
    if fault.startswith("record"):  # completed by the next run, from the target's state
        assert len([a for a in infos if a.task == "first change" and a.landed]) >= 1


@pytest.mark.parametrize(
    ("fault", "moved"),
    [
        ("pending", False),  # killed with the pending line written, before the move
        ("moved", True),  # killed right after the move, before the record
        ("record", True),  # killed while the record is being written
    ],
)
def test_killed_between_the_pending_line_and_the_record(
    suite: Path, service: Path, fault: str, moved: bool
) -> None:
    base = git(service, "rev-parse", "main")
    result = run(suite, service, base, fault)
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    assert (git(service, "rev-parse", "main") != base) == moved
    repo = BaseRepo.open(service)
    [line] = open_lines(oplog.read(repo.common_dir))
    assert line.record["task"] == "first change"
    again = run(suite, service, base, None)
    assert again.returncode == 0, again.stdout + again.stderr
    infos = assert_consistent(service, base)
    settled = [a for a in infos if a.trailers.get("Id") == line.record["uid"]]
    assert len(settled) == 1
    if moved:
        assert settled[0].verdict == "promoted" and settled[0].landed == line.new
    else:
        assert settled[0].verdict == "error" and not settled[0].landed
        assert "did not move" in git(service, "log", "-1", "--format=%B", settled[0].record_ref)


def test_a_really_full_disk(tmp_path: Path) -> None:
    """The repository on a small tmpfs that the gate fills: nothing half done, all recovered."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        reason = f"cannot mount a small filesystem here: {mounted.stderr.decode().strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        service = make_service(mount / "service")
        suite = tmp_path / "suite"
        suite.mkdir()
        (suite / "test_agents.py").write_text(AGENTS)
        base = git(service, "rev-parse", "main")
        filler = mount / "filler"
        # The gate passes, then leaves the disk full for everything that follows it.
        gate = f"sh -c 'cat /dev/zero > {filler} 2>/dev/null; true'"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
        env["AGENTGATE_SANDBOX"] = "none"
        result = subprocess.run(
            [
                "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                f"--basetemp={tmp_path / 'bt'}", f"--agentgate-repo={service}",
                f"--agentgate-base={base}", f"--agentgate-gate-exit-code={gate}", "--agentgate-promote",
                "--agentgate-sandbox=none",
            ],
            cwd=suite, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        out = result.stdout + result.stderr
        assert "INTERNALERROR" not in out and "Traceback" not in out, out
        assert filler.exists(), out
        filler.unlink()
        again = run(suite, service, base, None)
        assert again.returncode == 0, again.stdout + again.stderr
        assert_consistent(service, base)
        report = [
            json.loads(line)
            for line in (service / ".git" / "agentgate" / "oplog.jsonl").read_text().splitlines()
            if line.strip().startswith("{")
        ]
        assert any(r["op"] == "promote" for r in report)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_an_agentgate_command_completes_a_record_the_run_could_not_write(
    suite: Path, service: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_agentgate.cli.main import main

    base = git(service, "rev-parse", "main")
    result = run(suite, service, base, "moved")
    assert result.returncode == -signal.SIGKILL
    landed = git(service, "rev-parse", "main")
    assert main(["attempts", "--repo", str(service), "--json"]) == 0
    captured = capsys.readouterr()
    assert "completed the record of 'first change': landed as" in captured.err
    rows = json.loads(captured.out)
    assert [(r["task"], r["verdict"], r["landed"]) for r in rows] == [
        ("first change", "promoted", landed)
    ]
    assert_consistent(service, base)


def test_a_file_the_full_disk_cut_short_is_rewritten_by_the_next_run(
    suite: Path, service: Path
) -> None:
    base = git(service, "rev-parse", "main")
    result = run(suite, service, base, "worktree-sync")
    assert result.returncode == -signal.SIGKILL
    (service / "first.txt").write_text("fir")  # what git had written when the disk filled
    again = run(suite, service, base, None)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (service / "first.txt").read_text() == "first\n"
    assert_consistent(service, base)
