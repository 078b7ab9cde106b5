"""Summary lines and the rejection message, from report rows alone."""

from __future__ import annotations

from pytest_agentgate.pytest_plugin import report


def row(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "verdict": "promoted",
        "test": "agents/test_a.py::test_a",
        "attempt_commit": "1" * 40,
        "attempt_ref": "refs/agentgate/attempts/a/1",
        "target": "main",
        "target_old": "2" * 40,
        "target_new": "3" * 40,
        "promotion": "merge",
        "retested": True,
        "reason": "",
    }
    base.update(overrides)
    return base


def test_a_promotion_says_how_it_landed() -> None:
    line = report.summary_line(row())
    assert line.startswith("PROMOTED")
    assert "main: 222222222222 -> 333333333333 (merge, re-tested)" in line


def test_a_dry_run_and_a_skipped_retest() -> None:
    line = report.summary_line(row(verdict="passed", retested=False, retest_skipped=True))
    assert line.startswith("WOULD PROMOTE")
    assert "re-test skipped (--agentgate-no-retest)" in line


def test_a_rejection_names_why_and_where_the_target_stays() -> None:
    line = report.summary_line(
        row(verdict="rejected", reason="the test failed: AssertionError\nmore", target_new="2" * 40)
    )
    assert line.startswith("REJECTED")
    assert "main stays at 222222222222" in line and "[the test failed: AssertionError]" in line
    assert "more" not in line


def test_flaky_tests_and_record_problems_are_shown() -> None:
    line = report.summary_line(
        row(results={"flaky_ids": ["t::a", "t::b"]}, record_problem="the record was not written")
    )
    assert "[flaky: t::a, t::b]" in line and "[the record was not written]" in line


def test_long_reasons_are_clipped_at_a_word() -> None:
    line = report.summary_line(row(verdict="error", reason="word " * 100))
    assert line.endswith(" ...]") and len(line) < 300


def test_the_rejection_message_points_at_the_record() -> None:
    text = report.rejection_message(
        row(verdict="rejected", reason="no changes", check="snapshot"), "/srv/repo", "out\n", "/ws"
    )
    assert "agentgate rejected: no changes" in text
    assert "git -C /srv/repo show refs/agentgate/attempts/a/1" in text
    assert "    out" in text and "workspace kept at /ws" in text
    unrecorded = report.rejection_message(
        row(attempt_ref=None, record_problem="disk full"), "/r", "", "/ws"
    )
    assert "not recorded (disk full)" in unrecorded


def test_markdown_table() -> None:
    table = report.markdown([row()])
    assert "| promoted | `agents/test_a.py::test_a` | `refs/agentgate/attempts/a/1` |" in table


def test_a_change_already_on_the_target_does_not_read_as_a_promotion() -> None:
    """Once: 'PROMOTED ... main: 084c92f8c610 -> 084c92f8c610 ()' for a retry whose change
    had landed already."""
    line = report.summary_line(row(target_new="2" * 40, promotion="", retested=False))
    assert line.startswith("ALREADY ON")
    assert "already on main at 222222222222: nothing moved" in line
    assert "->" not in line


def test_a_retry_names_its_record_beside_its_try() -> None:
    """Once: '(try 2)' in the summary while the record was .../4 (earlier runs' tries)."""
    line = report.summary_line(row(**{"try": 2, "attempt_ref": "refs/agentgate/attempts/a/4"}))
    assert "(try 2, recorded as a/4)" in line
