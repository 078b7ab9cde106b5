"""The second source article's staged service repair, rebuilt with a scripted agent.

The task needs a code change and a schema migration of a SQLite database that lives outside
the repository, at an absolute path (a temporary directory stands for /var/lib/inventory).
The first try migrates the database, is checkpointed and fails; the retry's agent only knows
the code change. Only a retry that resumes the checkpoint's database (``resume="full"``) can
pass. Scripted agents decide the outcome, so this tests the mechanism, not agents.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import git

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "staged_repair"


@pytest.fixture
def repair(tmp_path: Path) -> dict[str, Path]:
    service = tmp_path / "service"
    shutil.copytree(EXAMPLE / "service", service)
    git(service, "init", "-q", "-b", "main")
    git(service, "add", "-A")
    git(service, "commit", "-q", "-m", "the inventory service")
    git(service, "checkout", "-q", "--detach")
    folder = tmp_path / "var" / "lib" / "inventory"
    folder.mkdir(parents=True)
    db = folder / "store.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE stock (item TEXT, qty INTEGER)")
        conn.execute("INSERT INTO stock VALUES ('bolt', 3)")
    conn.close()
    suite = tmp_path / "suite"
    shutil.copytree(EXAMPLE / "suite", suite)
    return {"service": service, "db": db, "suite": suite, "root": tmp_path}


def columns(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(stock)")]
    finally:
        conn.close()


@pytest.mark.parametrize(("mode", "lands"), [("restart", False), ("code", False), ("full", True)])
def test_only_a_full_resume_finishes_the_staged_repair(
    repair: dict[str, Path], mode: str, lands: bool
) -> None:
    db, service = repair["db"], repair["service"]
    report = repair["root"] / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    env.update(INVENTORY_DB=str(db), REPAIR_RESUME=mode)
    agent = EXAMPLE / "agent.py"
    result = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--agentgate-repo={service}", "--agentgate-target=main", "--agentgate-promote",
            f"--agentgate-gate={sys.executable} -m pytest -q -p no:cacheprovider tests",
            "--agentgate-gate-env=INVENTORY_DB", "--agentgate-agent-env=INVENTORY_DB",
            f"--agentgate-agent-command={sys.executable} {agent} {{workspace}} {{attempt}}",
            f"--agentgate-sandbox-bind={agent}", f"--agentgate-sandbox-bind={db.parent}",
            f"--agentgate-report={report}", f"--basetemp={repair['root'] / 'tmp'}",
        ],
        cwd=repair["suite"], env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    rows = json.loads(report.read_text())["attempts"]
    assert [r["try"] for r in rows] == [1, 2], result.stdout
    assert rows[0]["verdict"] == "rejected" and rows[0]["checkpoints"]
    assert rows[1]["verdict"] == ("promoted" if lands else "rejected"), result.stdout
    assert (result.returncode == 0) is lands, result.stdout
    tracked = git(service, "show", "main:inventory/store.py")
    assert ("stock_by_sku" in tracked) is lands
    # The database outside the repository: migrated when the repair landed, and put back to
    # what it was before the test when it did not.
    assert ("sku" in columns(db)) is lands
    if lands:  # the retry started from the checkpoint of the first try, and says so
        first_checkpoint = git(service, "rev-parse", rows[0]["checkpoints"][-1])
        assert rows[1]["resumed_from"] == first_checkpoint
    # A person restores the first try's checkpoint: its code, and (asked) its state, the
    # database outside the repository under a root of their choosing, never its real path.
    out, root = repair["root"] / "restored", repair["root"] / "state-root"
    subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", "restore", "--repo", str(service),
         rows[0]["checkpoints"][-1], "--to", str(out), "--state", "--state-root", str(root)],
        check=True, capture_output=True,
    )  # fmt: skip
    assert (out / "inventory" / "store.py").exists()
    assert "sku" in columns(root / str(db).lstrip("/"))  # migrated by the first try
    # `agentgate attempts` lists each try's checkpoints under it.
    listing = subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", "attempts", "--repo", str(service)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "checkpoint repair-the-inventory-service/" in listing
    assert "after the agent's try 1" in listing
    git(service, "fsck", "--strict", "--no-progress")
