"""Which early re-test answers for a batch's re-test (``engine.landing._reusable``): pure
logic over plain values, so it is held here without git or processes."""

from __future__ import annotations

from pytest_agentgate.engine.landing import _reusable
from pytest_agentgate.land.retest import Retested


def test_a_failed_early_run_of_a_gate_without_tests_is_run_again() -> None:
    """Found under load: an early run whose sandbox was killed before the command started
    (bwrap exited -9) failed, and, the gate reporting no tests, that failure was taken as
    the batch's re-test: the batch's last attempt was rejected for it."""
    killed = Retested(False, "the sandbox could not start the command: bwrap exited -9")
    assert not _reusable(killed, None)


def test_a_passing_early_run_of_a_gate_without_tests_answers_for_the_batch() -> None:
    assert _reusable(Retested(True), None)
    assert not _reusable(Retested(True), {"t::a": "passed"})  # held to tests it cannot show


def test_an_early_run_with_tests_answers_only_when_nothing_fails() -> None:
    held = {"t::a": "passed"}
    assert _reusable(Retested(True, tests={"t::a": "passed", "t::b": "passed"}), held)
    assert not _reusable(Retested(True, tests={"t::a": "passed", "t::b": "failed"}), held)
    assert not _reusable(Retested(False, tests={"t::a": "failed"}), held)
