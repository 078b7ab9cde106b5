"""State outside git (a SQLite database, a built artifact) travels with the attempt."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from helpers import git

from pytest_agentgate.cli.main import main

AGENTS = """
import sqlite3
import pytest

STATE = ["var/inventory.db", "build/"]


@pytest.mark.gated(task="Repair the inventory", state=STATE, gate=["false"], results="exit-code")
def test_first_try(agent_workspace):
    (agent_workspace.path / "var").mkdir()
    db = sqlite3.connect(agent_workspace.path / "var" / "inventory.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE stock (item TEXT, qty INTEGER)")
    db.execute("INSERT INTO stock VALUES ('bolt', 3)")
    db.commit()  # the connection stays open, the WAL unmerged: the capture must still be whole
    (agent_workspace.path / "build").mkdir()
    (agent_workspace.path / "build" / "model.bin").write_bytes(bytes(range(256)) * 64)
    (agent_workspace.path / "fix.py").write_text("FIXED = False\\n")
    globals()["_keep_open"] = db


@pytest.mark.gated(task="Repair the inventory", state=STATE, resume_from="latest", gate=[])
def test_second_try_resumes(agent_workspace):
    db = sqlite3.connect(agent_workspace.path / "var" / "inventory.db")
    assert db.execute("SELECT item, qty FROM stock").fetchall() == [("bolt", 3)]
    assert (agent_workspace.path / "fix.py").read_text() == "FIXED = False\\n"  # its code too
    db.execute("INSERT INTO stock VALUES ('nut', 5)")
    db.commit()
    db.close()
    assert (agent_workspace.path / "build" / "model.bin").read_bytes() == bytes(range(256)) * 64
    (agent_workspace.path / "fix.py").write_text("FIXED = True\\n")
"""


def test_state_is_captured_resumed_and_restored(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (service / ".gitignore").write_text("var/\nbuild/\n__pycache__/\n")
    git(service, "commit", "-qam", "ignore state")
    pytester.makepyfile(test_agents=AGENTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        f"--agentgate-repo={service}", f"--agentgate-report={report}", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1, failed=1)
    first, second = json.loads(report.read_text())["attempts"]
    assert first["verdict"] == "rejected" and first["state"]
    first_record = git(service, "rev-parse", first["attempt_ref"])
    assert second["verdict"] == "passed" and second["resumed_from"] == first_record
    # The state lives beside the attempt, never in the code snapshot, never in the target.
    assert (
        git(service, "rev-parse", "refs/agentgate/state/repair-the-inventory/1") == first["state"]
    )
    # A chain: the new state's parent is the record it resumed, whose state is the first.
    assert git(service, "rev-parse", f"{second['state']}^") == first_record
    assert "var/inventory.db" not in git(
        service, "ls-tree", "-r", "--name-only", second["attempt_ref"]
    )
    assert f"Agentgate-State: {second['state']}" in git(
        service, "log", "-1", "--format=%B", second["attempt_ref"]
    )

    # A person restores the first attempt's state and reads the database as it was then.
    out_dir = tmp_path / "restored"
    capsys.readouterr()
    restore = ["restore", "--repo", str(service), first["attempt_ref"], "--to", str(out_dir)]
    assert main([*restore, "--state"]) == 0
    assert (out_dir / "fix.py").read_text() == "FIXED = False\n"  # the code, and the state
    db = sqlite3.connect(out_dir / "var" / "inventory.db")
    assert db.execute("SELECT item, qty FROM stock").fetchall() == [("bolt", 3)]
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    assert (out_dir / "build" / "model.bin").stat().st_size == 256 * 64
    # Restoring again over those files is refused unless asked; nothing is overwritten.
    (out_dir / "build" / "model.bin").write_bytes(b"mine")
    capsys.readouterr()
    assert main([*restore, "--state"]) == 1
    assert "is not empty: nothing was written" in capsys.readouterr().err
    assert (out_dir / "build" / "model.bin").read_bytes() == b"mine"
    assert main([*restore, "--state", "--force"]) == 0
    assert (out_dir / "build" / "model.bin").stat().st_size == 256 * 64
    assert (
        main(
            [
                "restore",
                "--repo",
                str(service),
                second["attempt_ref"],
                "--to",
                str(out_dir),
                "--state",
                "--force",
            ]
        )
        == 0
    )
    rows = (
        sqlite3.connect(out_dir / "var" / "inventory.db")
        .execute("SELECT item FROM stock ORDER BY item")
        .fetchall()
    )
    assert rows == [("bolt",), ("nut",)]


def test_restore_of_an_attempt_without_state(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    from helpers import land

    land(service, {"x.txt": "x"}, task="plain")
    out = tmp_path / "out"
    assert main(["restore", "--repo", str(service), "plain", "--to", str(out), "--state"]) == 1
    assert "carries no state" in capsys.readouterr().err
    assert not out.exists()  # nothing written
    # Without --state, the code is what is restored.
    assert main(["restore", "--repo", str(service), "plain", "--to", str(out)]) == 0
    assert (out / "x.txt").read_text() == "x"


def test_resume_true_says_what_to_write_instead(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.gated(task='t', resume=True)\ndef test_t(agent_workspace):\n    pass\n"
    )
    result = pytester.runpytest(f"--agentgate-repo={service}")
    result.stdout.fnmatch_lines(["*resume=True was the development versions' spelling*"])
    result.stdout.fnmatch_lines(["*resume_from='latest'*resume='full'*"])
    assert result.ret != 0


def test_latest_is_the_newest_attempt_at_the_task_that_did_not_land(service: Path) -> None:
    from pytest_agentgate import Engine, GateSpec

    e = Engine.open(
        service, "main", promote=True, workdir=service.parent / "work",
        gate=GateSpec(outcome_is_enough=True),
    )  # fmt: skip
    fresh = e.fork(task="fix", resume_from="latest")  # none yet: a fresh start at the tip
    assert fresh.resumed_from is None and fresh.base == git(service, "rev-parse", "main")
    (fresh.path / "fix.py").write_text("FIXED = 1\n")
    first = e.run_attempt(fresh, task="fix", test_failure="not yet")
    assert first.verdict.status == "rejected"
    for task in ("other", "Fix!"):  # newer, but other tasks' (one of the same slug)
        other = e.fork(task=task)
        (other.path / "other.py").write_text("x\n")
        assert e.run_attempt(other, task=task, test_failure="no").verdict.status == "rejected"

    again = e.fork(task="fix", resume_from="latest")
    assert again.resumed_from == git(service, "rev-parse", first.record_ref)
    assert (again.path / "fix.py").read_text() == "FIXED = 1\n"
    (again.path / "fix.py").write_text("FIXED = 2\n")
    assert e.run_attempt(again, task="fix").verdict.status == "promoted"

    # What landed is on the target: the task starts again from there, not from its record.
    after = e.fork(task="fix", resume_from="latest")
    assert after.resumed_from is None and after.base == git(service, "rev-parse", "main")
    assert (after.path / "fix.py").read_text() == "FIXED = 2\n"

    # A task of several lines is one line in its record: still found by its text.
    several = "Fix the parser.\n    Keep the public API."
    ws = e.fork(task=several)
    (ws.path / "parser.py").write_text("P = 1\n")
    made = e.run_attempt(ws, task=several, test_failure="not yet")
    assert made.verdict.status == "rejected"
    resumed = e.fork(task=several, resume_from="latest")
    assert resumed.resumed_from == git(service, "rev-parse", made.record_ref)


def test_state_larger_than_the_limit_is_rejected_with_its_size(service: Path) -> None:
    from pytest_agentgate import Engine, GateSpec

    e = Engine.open(
        service, "main", workdir=service.parent / "work", gate=GateSpec(outcome_is_enough=True),
        max_state_bytes=1000,
    )  # fmt: skip
    ws = e.fork(task="big state")
    (ws.path / "build").mkdir()
    (ws.path / "build" / "model.bin").write_bytes(b"x" * 4096)
    (ws.path / "fix.py").write_text("FIXED = True\n")
    verdict = e.run_attempt(ws, task="big state", state=["build/"]).verdict
    assert verdict.status == "rejected" and verdict.check == "state"
    assert "4,096 bytes, more than --agentgate-max-state-bytes 1,000" in verdict.reason
