"""The queue's pure core: the gather decision, the bisection of a failing batch, which
chains need no re-test. Plain values, no git, no threads, no sleeps."""

from __future__ import annotations

import math

import pytest

from pytest_agentgate.land.planning import GATHER_FLOOR_S, Bisected, bisect, gather


def _passes_unless(broken: set[int]):
    """A chain whose prefix k fails once it holds any link of ``broken`` (1-based);
    the calls are counted."""
    calls: list[int] = []

    def passes(k: int) -> bool:
        calls.append(k)
        return not any(b <= k for b in broken)

    return passes, calls


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 16])
def test_a_passing_chain_lands_whole_after_one_retest(n: int) -> None:
    passes, calls = _passes_unless(set())
    assert bisect(n, passes) == Bisected(n, 0)
    assert calls == [n]


@pytest.mark.parametrize(
    ("n", "culprit"), [(1, 1), (2, 1), (2, 2), (8, 1), (8, 5), (8, 8), (16, 11)]
)
def test_the_first_failing_link_is_found_in_log2_retests(n: int, culprit: int) -> None:
    passes, calls = _passes_unless({culprit})
    assert bisect(n, passes) == Bisected(culprit - 1, culprit)
    assert len(calls) <= 1 + math.ceil(math.log2(n)), calls


def test_with_two_culprits_the_first_is_found_and_what_lands_passed() -> None:
    passes, _ = _passes_unless({3, 6})
    good, culprit = bisect(8, passes)
    assert (good, culprit) == (2, 3) and passes(good)


def test_a_later_fix_never_makes_a_failing_prefix_land() -> None:
    # Link 3 breaks the tests, link 5 fixes them: prefixes 3 and 4 fail, 5..8 pass.
    calls: list[int] = []

    def passes(k: int) -> bool:
        calls.append(k)
        return k < 3 or k >= 5

    good, culprit = bisect(8, passes)
    assert good == 8 and culprit == 0  # the top passes: it was tested, it lands whole
    good, culprit = bisect(4, passes)
    assert (good, culprit) == (2, 3) and passes(good) and not passes(culprit)


def test_an_empty_chain() -> None:
    assert bisect(0, lambda k: False) == Bisected(0, 0)


def test_a_batch_waits_for_gates_begun_with_its_own_not_for_later_ones() -> None:
    plan = gather([100.0, 101.0], now=110.0, gate_s=10.0)
    assert plan.began_by == 101.0 + 3.0  # its latest, plus 0.3 of a gate
    assert plan.wait_s == 15.0  # a gate and a half
    short = gather([100.0], now=100.2, gate_s=0.1)
    assert short.began_by == 100.0 + GATHER_FLOOR_S and short.wait_s == 0.2
    assert gather([50.0], now=1000.0, gate_s=100.0).wait_s == 30.0  # never more than 30 s


def test_an_unknown_start_counts_as_a_gate_ago() -> None:
    assert gather([0.0], now=100.0, gate_s=4.0).began_by == 96.0 + 1.2
    assert gather([], now=100.0, gate_s=4.0).began_by == 96.0 + 1.2
