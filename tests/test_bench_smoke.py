"""The benchmark's --quick run works end to end (it measures; it asserts no timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "run.py"


def test_quick_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    operations = {row["operation"] for row in rows}
    for expected in (
        "fork (disk)",
        "fork, recycling on (disk)",
        "recycling alone (disk)",
        "snapshot, 10 changed",
        "preflight, clean",
        "preflight, conflicting",
        "promote, fast-forward",
        "land through the queue, merge",
        "rollback",
        "whole gated test (gate: true)",
    ):
        assert expected in operations
    assert all(set(row) == {"size", "operation", "plugin_ms", "floor_ms"} for row in rows)
    assert all(row["plugin_ms"] > 0 and row["floor_ms"] > 0 for row in rows)
    for line in (
        "pytest run with no gated test",
        "lock wait",
        "peak RSS",
        "objects hashed per snapshot",
    ):
        assert line in proc.stdout
    assert "161-183 ms" in proc.stdout  # the article's figures, labelled, beside ours
    assert "rows over their target:" in proc.stdout


def quick(script: str, *more: str, timeout: float = 300) -> str:
    """What ``bench/<script> --quick`` printed; its exit status must be 0."""
    proc = subprocess.run(
        [sys.executable, str(BENCH.with_name(script)), "--quick", *more],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_quick_queue_benchmark_runs() -> None:
    """bench/queue.py --quick: four agents land, nothing is lost (it asserts no timing)."""
    out = quick("queue.py")
    rows = [line.split() for line in out.splitlines()[2:] if line.strip()]
    assert len(rows) == 2
    for row in rows:
        assert row[0] == "4" and row[-3:] == ["4", "0", "0"]  # landed, rejected, lost


def test_the_false_rejection_benchmark_runs_and_refuses_nothing() -> None:
    """Its offline run: honest replays under two gate spellings and two at once."""
    assert "refused: 0 of 3 honest replays that pass by hand" in quick(
        "false_rejections.py", "--at-once", "2"
    )


def test_quick_agent_benchmark_runs() -> None:
    """bench/agents.py --quick: a real CLI run bare and through the plugin, side by side
    (installed from its registry when missing; it asserts no timing)."""
    out = quick("agents.py", "--install", timeout=900)
    assert "claude-code" in out and " ms  1  (" in out, out


def test_quick_cost_benchmark_runs() -> None:
    """bench/cost.py --quick: a suite's command beside its gate (it asserts no timing)."""
    out = quick("cost.py")
    assert "500 tests" in out and "median" in out and "another engine" in out
