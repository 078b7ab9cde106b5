"""The five-agent story of the gated lifecycle, end to end through a real pytest run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import fsck, git

GATE = "--agentgate-gate=python -m pytest -q -p no:cacheprovider tests"

AGENTS = """
import pytest


def edit(ws, rel, old, new):
    path = ws.path / rel
    text = path.read_text()
    assert old in text, (rel, old)
    path.write_text(text.replace(old, new))


@pytest.mark.gated(task="Rename add_entry to add", agent="renamer")
def test_1_rename_misses_a_file(agent_workspace):
    # store.py and report.py are updated; api.py, which also calls add_entry, is not.
    edit(agent_workspace, "ledger/store.py", "def add_entry(", "def add(")
    edit(agent_workspace, "ledger/report.py", "store.add_entry(", "store.add(")


@pytest.mark.gated(task="Add Store.total", agent="adder")
def test_2_add_method_and_test(agent_workspace):
    edit(agent_workspace, "ledger/store.py", "self._rows = []\\n",
         "self._rows = []\\n\\n    def total(self):\\n        return sum(self._rows)\\n")
    (agent_workspace.path / "tests" / "test_total.py").write_text(
        "from ledger.store import Store\\n\\n\\ndef test_total():\\n"
        "    s = Store()\\n    s.add_entry(2)\\n    s.add_entry(3)\\n    assert s.total() == 5\\n"
    )


@pytest.mark.gated(task="Add a formatter module", agent="formatter")
def test_3_independent_change(agent_workspace):
    (agent_workspace.path / "ledger" / "fmt.py").write_text(
        "def money(cents):\\n    return f'{cents / 100:.2f}'\\n"
    )
    (agent_workspace.path / "tests" / "test_fmt.py").write_text(
        "from ledger.fmt import money\\n\\n\\ndef test_money():\\n    assert money(250) == '2.50'\\n"
    )


@pytest.mark.gated(task="Add Store.count", agent="counter")
def test_4_same_lines_as_adder(agent_workspace):
    edit(agent_workspace, "ledger/store.py", "self._rows = []\\n",
         "self._rows = []\\n\\n    def count(self):\\n        return len(self._rows)\\n")


@pytest.mark.gated(task="Store rows as tuples", agent="tupler")
def test_5_breaks_only_with_adder(agent_workspace):
    # Consistent on its own; breaks Store.total (which sums self._rows) once merged.
    edit(agent_workspace, "ledger/store.py", "self._rows.append(amount)", "self._rows.append((amount,))")
    edit(agent_workspace, "ledger/store.py", "return list(self._rows)", "return [row[0] for row in self._rows]")
"""

EXPECTED = {
    "test_1_rename_misses_a_file": "rejected",
    "test_2_add_method_and_test": "promoted",
    "test_3_independent_change": "promoted",
    "test_4_same_lines_as_adder": "conflict",
    "test_5_breaks_only_with_adder": "rejected",
}


def run_story(pytester: pytest.Pytester, service: Path, *extra: str) -> dict[str, dict]:
    pytester.makepyfile(test_agents=AGENTS)
    base = git(service, "rev-parse", "main")
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        f"--agentgate-repo={service}",
        f"--agentgate-base={base}",
        GATE,
        f"--agentgate-report={report}",
        "-p",
        "no:cacheprovider",
        *extra,
    )
    result.assert_outcomes(passed=2, failed=3)
    rows = json.loads(report.read_text())["attempts"]
    return {row["test"].split("::")[-1]: row for row in rows}


def test_five_agents_promote(pytester: pytest.Pytester, service: Path) -> None:
    base = git(service, "rev-parse", "main")
    rows = run_story(pytester, service, "--agentgate-promote")
    assert {name: row["verdict"] for name, row in rows.items()} == EXPECTED

    rename = rows["test_1_rename_misses_a_file"]
    assert rename["target_old"] == base and rename["target_new"] == base
    shown = git(service, "show", rename["attempt_ref"])
    assert "def add(self, amount)" in shown and "Agentgate-Verdict: rejected" in shown
    assert "AttributeError" in git(service, "log", "-1", "--format=%B", rename["attempt_ref"])

    ff = rows["test_2_add_method_and_test"]
    assert ff["promotion"] == "fast-forward" and ff["target_old"] == base

    merged = rows["test_3_independent_change"]
    assert merged["promotion"] == "merge" and merged["retested"] is True
    assert merged["target_old"] == ff["target_new"]
    tip = git(service, "rev-parse", "main")
    assert tip == merged["target_new"]
    assert git(service, "rev-parse", "main^1") == ff["target_new"]

    conflict = rows["test_4_same_lines_as_adder"]
    assert "ledger/store.py" in conflict["reason"]
    broken = rows["test_5_breaks_only_with_adder"]
    assert broken["check"] == "retest" and "re-test" in broken["reason"]

    # Every attempt is recorded, the target holds only what passed, and git agrees.
    assert len(git(service, "for-each-ref", "refs/agentgate/attempts/").splitlines()) == 5
    assert git(service, "status", "--porcelain") == ""
    assert "def total" in (service / "ledger" / "store.py").read_text()
    assert (service / "ledger" / "fmt.py").exists()
    assert "tuple" not in git(service, "log", "-p", "main")
    fsck(service)
    reflog = git(service, "reflog", "show", "--format=%gs", "main")
    assert "agentgate promote: Add a formatter module by formatter (merge)" in reflog


def test_five_agents_dry_run(pytester: pytest.Pytester, service: Path) -> None:
    base = git(service, "rev-parse", "main")
    rows = run_story(pytester, service)
    expected = {k: ("passed" if v == "promoted" else v) for k, v in EXPECTED.items()}
    assert {name: row["verdict"] for name, row in rows.items()} == expected
    assert git(service, "rev-parse", "main") == base
    (scratch,) = git(
        service, "for-each-ref", "--format=%(refname)", "refs/agentgate/dryruns/"
    ).splitlines()
    dryrun = git(service, "rev-parse", scratch)
    assert dryrun == rows["test_3_independent_change"]["target_new"]
    assert git(service, "status", "--porcelain") == ""
    fsck(service)
