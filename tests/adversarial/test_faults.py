"""Kill a real pytest run at named points; the target is never left anywhere but old or new."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fsck, git, spawn_pytest

JOURNAL = "worktree-sync-refs%2Fheads%2Fmain.json"


def run(
    suite: Path, repo: Path, base: str, fault: str | None, gate: str = "true"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    if fault:
        env["AGENTGATE_FAULT"] = fault
    # A session of its own, so a SIGINT sent to "the terminal's" process group hits only it.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={suite / 'tmp'}",
         f"--agentgate-repo={repo}", f"--agentgate-base={base}", f"--agentgate-gate-exit-code={gate}",
         "--agentgate-promote"],
        cwd=suite, env=env, capture_output=True, text=True, timeout=120, check=False, start_new_session=True,
    )  # fmt: skip


def assert_nothing_runs_in(root: Path) -> None:
    """No process (a gate's bwrap or its sandbox, a supervisor) is left at work in ``root``:
    the ends a killed run leaves are ended by the kernel, a moment later at most."""
    import time

    from pytest_agentgate.sandbox.process import processes_in

    deadline = time.monotonic() + 3
    while (left := processes_in(root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]


def assert_recovers(suite: Path, service: Path, base: str) -> None:
    """The next run needs no cleanup: both tasks land, the tree is clean, git is healthy."""
    result = run(suite, service, base, None)
    assert result.returncode == 0, result.stdout + result.stderr
    names = git(service, "ls-tree", "--name-only", "main").splitlines()
    assert "first.txt" in names and "second.txt" in names
    assert git(service, "status", "--porcelain") == ""
    fsck(service)


@pytest.mark.parametrize(
    ("fault", "gate", "lands"),
    [
        ("gate", "sleep 0.3", 0),  # (a) killed while the first gate command runs
        ("merge-written", "true", 1),  # (b) merge objects written, ref not moved
        ("locked", "true", 0),  # (c) killed while holding the promotion lock
        ("worktree-sync", "true", 1),  # (d) ref moved, checked-out files not yet updated
    ],
)
def test_sigkill_at_a_named_point(
    suite: Path, service: Path, fault: str, gate: str, lands: int
) -> None:
    base = git(service, "rev-parse", "main")
    result = run(suite, service, base, fault, gate)
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    tip = git(service, "rev-parse", "main")
    if lands == 0:
        assert tip == base
    else:
        assert git(service, "rev-parse", "main^") == base  # exactly the first promotion
        assert git(service, "ls-tree", "--name-only", "main", "first.txt") == "first.txt"
    fsck(service)
    if fault == "gate":  # nothing of the gate outlives the run, whatever started it
        assert_nothing_runs_in(suite / "tmp")
    if fault == "worktree-sync":
        # The files are behind the ref until the next run finishes the update.
        assert not (service / "first.txt").exists()
        assert (service / ".git" / "agentgate" / JOURNAL).exists()
    assert_recovers(suite, service, base)
    assert not (service / ".git" / "agentgate" / JOURNAL).exists()


def test_ctrl_c_during_promotion_finishes_it_first(suite: Path, service: Path) -> None:
    """SIGINT to the whole process group (a terminal's Ctrl-C) between ref move and file update."""
    base = git(service, "rev-parse", "main")
    result = run(suite, service, base, "worktree-sync:int")
    assert result.returncode == pytest.ExitCode.INTERRUPTED, result.stdout + result.stderr
    assert git(service, "rev-parse", "main^") == base
    assert (service / "first.txt").read_text() == "first\n"  # the update finished before exiting
    assert git(service, "status", "--porcelain") == ""
    assert not (service / ".git" / "agentgate" / JOURNAL).exists()
    fsck(service)


def test_half_finished_file_update_is_completed(suite: Path, service: Path) -> None:
    """A file update cut off halfway (some files new, the index old) is finished, not refused."""
    from pytest_agentgate import BaseRepo
    from pytest_agentgate.git.worktree import recover_worktree

    base = git(service, "rev-parse", "main")
    result = run(suite, service, base, "worktree-sync")
    assert result.returncode == -signal.SIGKILL
    # As if read-tree had written one of the two new files before dying.
    (service / "first.txt").write_text("first\n")
    repo = BaseRepo.open(service)
    note = recover_worktree(repo, "refs/heads/main")
    assert note and "finished updating" in note
    assert git(service, "status", "--porcelain") == ""
    assert not (service / ".git" / "agentgate" / JOURNAL).exists()


def test_stale_git_lock_is_reported_not_deleted(suite: Path, service: Path) -> None:
    base = git(service, "rev-parse", "main")
    lock = service / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text("")
    result = run(suite, service, base, None)
    assert result.returncode == 6  # the attempts could not be judged: not the agents' fault
    assert f"git lock file '{lock}' exists" in result.stdout
    assert f"rm '{lock}'" in result.stdout
    assert lock.exists() and git(service, "rev-parse", "main") == base
    lock.unlink()
    assert_recovers(suite, service, base)


def test_busy_base_index_blocks_promotion_with_a_clear_error(suite: Path, service: Path) -> None:
    """A failing git call during promotion (here: git's index lock is held) changes nothing."""
    base = git(service, "rev-parse", "main")
    lock = service / ".git" / "index.lock"
    lock.write_text("")
    result = run(suite, service, base, None)
    # Found before any agent works (the checked-out target cannot be checked): exit 4.
    assert result.returncode == 4
    assert f"git lock file '{lock}' exists" in result.stderr
    assert git(service, "rev-parse", "main") == base and lock.exists()
    lock.unlink()
    assert_recovers(suite, service, base)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_checkout_owned_by_another_user(suite: Path, service: Path) -> None:
    """As in a CI container: the repository belongs to someone else; no global setting changes."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    subprocess.run(["chown", "-R", f"{nobody.pw_uid}:{nobody.pw_gid}", str(service)], check=True)
    plain = subprocess.run(
        ["git", "status"], cwd=service, capture_output=True, text=True, check=False
    )
    assert "dubious ownership" in plain.stderr  # git itself would refuse here
    base = git(service, "-c", f"safe.directory={service}", "rev-parse", "main")
    result = run(suite, service, base, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        git(
            service,
            "-c",
            f"safe.directory={service}",
            "ls-tree",
            "--name-only",
            "main",
            "first.txt",
        )
        == "first.txt"
    )
    home_config = Path(os.path.expanduser("~/.gitconfig"))
    assert not home_config.exists() or str(service) not in home_config.read_text()


def test_recovery_never_overwrites_an_ignored_file(service: Path) -> None:
    """A crash left the ref moved and the files behind; meanwhile the user made an ignored
    file exactly where the new commit puts one. Recovery refuses rather than overwrite it."""
    import json as json_

    from pytest_agentgate import BaseRepo, WorktreeBlocked
    from pytest_agentgate.git.worktree import recover_worktree

    old = git(service, "rev-parse", "main")
    git(service, "checkout", "-q", "-b", "side")
    (service / "app.log").write_text("from the agent\n")
    git(service, "add", "-f", "app.log")
    git(service, "commit", "-qm", "track app.log")
    new = git(service, "rev-parse", "side")
    git(service, "checkout", "-q", "main")
    # The state a SIGKILL between the ref move and the file update leaves behind:
    git(service, "update-ref", "refs/heads/main", new, old)
    journal = service / ".git" / "agentgate" / JOURNAL
    journal.parent.mkdir(exist_ok=True)
    journal.write_text(json_.dumps({"ref": "refs/heads/main", "old": old, "new": new}))
    (service / ".git" / "info").mkdir(exist_ok=True)
    (service / ".git" / "info" / "exclude").write_text("*.log\n")
    (service / "app.log").write_text("the user's own log\n")
    with pytest.raises(WorktreeBlocked, match=r"app\.log"):
        recover_worktree(BaseRepo.open(service), "refs/heads/main")
    assert (service / "app.log").read_text() == "the user's own log\n"
    assert journal.exists()  # kept, for the person to act on


def test_sigterm_while_a_gate_runs_ends_the_gate_too(
    suite: Path, service: Path, tmp_path: Path
) -> None:
    """CI cancels a job with SIGTERM: the gate and everything it started go with the run."""
    from helpers import Sleeper, wait_for

    sleeper = Sleeper()

    assert not sleeper.alive()
    base = git(service, "rev-parse", "main")
    proc = spawn_pytest(
        suite,
        f"--basetemp={suite / 'tmp'}",
        f"--agentgate-repo={service}",
        f"--agentgate-base={base}",
        f"--agentgate-gate-exit-code=setsid {sleeper.command} & wait",
        "--agentgate-promote",
        start_new_session=True,
    )
    wait_for(sleeper.alive, 60, "the gate to start")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    wait_for(lambda: not sleeper.alive(), 5, "the gate's processes to end")
    assert git(service, "rev-parse", "main") == base
    fsck(service)
