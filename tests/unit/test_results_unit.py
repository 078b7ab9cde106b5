"""Per-test judging against the base, schema versions, and lease arithmetic: pure logic."""

from __future__ import annotations

import pytest

from pytest_agentgate.judge.results import compare, failing
from pytest_agentgate.remote.lease import margin
from pytest_agentgate.store import schema

BASE = {"t::a": "passed", "t::b": "passed", "t::c": "failed", "t::d": "skipped"}


def test_a_test_that_passed_on_the_base_must_still_pass() -> None:
    found = compare({**BASE, "t::a": "failed"}, BASE)
    assert not found.ok and found.lost == ("t::a",)
    assert "1 test(s) that passed on the base no longer pass: t::a" in found.reason()


def test_a_test_gone_is_lost_unless_allowed() -> None:
    gone = {k: v for k, v in BASE.items() if k != "t::b"}
    assert compare(gone, BASE).lost == ("t::b",)
    assert compare(gone, BASE, allow_removed=["t::b"]).ok
    assert compare(gone, BASE, allow_removed=["t::*"]).ok
    # Allowed to be removed, not to fail.
    assert compare({**BASE, "t::b": "failed"}, BASE, allow_removed=["t::b"]).lost == ("t::b",)


def test_the_base_s_own_failures_are_not_the_attempt_s() -> None:
    assert compare(BASE, BASE).ok
    assert compare({**BASE, "t::c": "passed"}, BASE).ok


def test_a_base_test_file_that_no_longer_collects_is_lost_not_new() -> None:
    """Its collection error reports under the file's path: its tests are lost, and the
    reason said "1 new test(s) do not pass" of the base's own file as well."""
    found = compare({"t::b": "passed", "t::c": "failed", "t::d": "skipped", "t": "error"}, BASE)
    assert found.lost == ("t::a",) and found.failed == () and found.new == ()
    assert "new test" not in found.reason()
    # A file the base had no test in is the attempt's: its error is a new failure.
    assert compare({**BASE, "u": "error"}, BASE).failed == ("u",)


def test_a_new_test_must_pass_when_the_base_is_known() -> None:
    assert compare({**BASE, "t::e": "skipped"}, BASE).failed == ("t::e",)
    assert compare({**BASE, "t::e": "passed"}, BASE).ok
    found = compare({**BASE, "t::e": "error"}, BASE)
    assert found.new == ("t::e",) and found.counts["failed"] == 2


def test_with_no_baseline_a_test_is_held_only_to_not_failing() -> None:
    assert compare({"t::x": "skipped"}, None).ok
    assert compare({"t::x": "error"}, None).failed == ("t::x",)


def test_failing_lists_failures_and_errors() -> None:
    assert failing({"a": "failed", "b": "error", "c": "passed", "d": "xfail"}) == ["a", "b"]


@pytest.mark.parametrize(
    ("trailer", "version"),
    [(None, 1), ("1", 1), (str(schema.RECORD_VERSION), schema.RECORD_VERSION), ("x", None)],
)
def test_record_versions(trailer: str | None, version: int | None) -> None:
    trailers = {} if trailer is None else {"Schema": trailer}
    found = schema.record_version(trailers)
    if version is None:  # unreadable: newer than any this version knows
        assert found > schema.RECORD_VERSION
        with pytest.raises(schema.TooNew, match="upgrade pytest-agentgate"):
            schema.check_record("refs/agentgate/attempts/x/1", trailers)
    else:
        assert found == version
        schema.check_record("refs/agentgate/attempts/x/1", trailers)


def test_a_newer_record_is_refused_with_what_to_do() -> None:
    newer = {"Schema": str(schema.RECORD_VERSION + 1)}
    with pytest.raises(schema.TooNew) as caught:
        schema.check_record("refs/agentgate/attempts/x/1", newer)
    assert caught.value.found == schema.RECORD_VERSION + 1
    assert caught.value.known == schema.RECORD_VERSION


def test_a_lease_is_honoured_past_its_expiry_by_a_quarter_at_least_a_second() -> None:
    assert margin(120.0) == 30.0
    assert margin(2.0) == 1.0
    assert margin(0.1) == 1.0
