"""The one record: what the engine makes, the queue's entries and pending lines carry, and
the writer writes; its JSON read back whole, and read without raising when damaged."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pytest_agentgate.land.planning import as_judged
from pytest_agentgate.land.queue_folder import Entry
from pytest_agentgate.pytest_plugin import marker
from pytest_agentgate.store.record import LANDINGS, RETESTS, STATUSES, Record

FULL = Record(
    task="Add total()", agent="agent-a", base="b" * 40, tree="t" * 40, uid="u1", test="t::x",
    status="rejected", excluded=(".env",), state="s" * 40, sandbox="bwrap", transcript="hi\n",
    results={"passed": 2, "failed": 0}, graded_tree="g" * 40, try_number=2, protect=("docs/*",),
    max_changed_lines=40, checkpoints="cp/1", retest="passed early", batch="x (1 of 2)", pid=7,
    landing="squash",
)  # fmt: skip


def test_a_record_round_trips_through_its_json() -> None:
    data = json.loads(json.dumps(FULL.to_json()))
    assert data["try"] == 2 and "try_number" not in data  # the name on disk
    assert Record.from_json(data) == FULL


def test_pid_is_written_only_when_set() -> None:
    assert "pid" not in Record("t", "a", "b", "t").to_json()
    assert replace(Record("t", "a", "b", "t"), pid=3).to_json()["pid"] == 3


def test_what_an_older_writer_left_is_read() -> None:
    """A pending line of a version before the record was typed: a plain dict, lists for
    tuples, no status, extra keys."""
    old = {"uid": "u", "task": "t", "agent": "a", "base": "b", "tree": "t", "excluded": [".env"],
           "protect": [], "try": 1, "results": None, "someday": True}  # fmt: skip
    record = Record.from_json(old)
    assert record.status == "promoted" and record.excluded == (".env",) and record.pid is None


@pytest.mark.parametrize(
    ("field", "value", "read_as"),
    [
        ("status", "landed-somehow", "promoted"),
        ("retest", "trust me", ""),
        ("try", "2", 1),
        ("pid", True, None),
        ("excluded", ".env", ()),
        ("max_changed_lines", 4.5, None),
        ("results", ["passed"], None),
        ("task", 7, ""),
    ],
)
def test_a_field_of_the_wrong_type_is_taken_as_absent(
    field: str, value: object, read_as: object
) -> None:
    data = {**FULL.to_json(), field: value}
    name = {"try": "try_number"}.get(field, field)
    assert getattr(Record.from_json(data), name) == read_as


def test_the_values_are_the_literals() -> None:
    assert STATUSES == ("promoted", "passed", "rejected", "conflict", "error")
    assert "" in RETESTS and "batched" in RETESTS


def test_the_landings_the_marker_checks_are_the_record_s() -> None:
    assert marker.LANDINGS == LANDINGS == ("merge", "squash", "rebase")
    assert Record.from_json({**FULL.to_json(), "landing": "octopus"}).landing == "merge"


def _entry(name: str, base: str, foreign: bool = False) -> Entry:
    record = Record(name, name, base, "t")
    return Entry(0, name, "k", "c-" + name, record, 1, machine="m2" if foreign else "")


@pytest.mark.parametrize(
    ("links", "judged"),
    [
        ([("a", "B", "fast-forward")], True),
        ([("a", "B", "squash")], True),  # a squash on its own base: its own tree
        ([("a", "B", "rebase")], False),  # (never made on its own base: a fast-forward)
        ([("a", "B", "fast-forward"), ("b", "c-a", "fast-forward")], True),
        ([("a", "B", "squash"), ("b", "B", "squash")], False),  # onto a moved tip: merged
        ([("a", "B", "merge")], False),
    ],
)
def test_which_chains_need_no_retest(links: list[tuple[str, str, str]], judged: bool) -> None:
    chain = [(_entry(n, base), f"c-{n}", "tree", kind) for n, base, kind in links]
    assert as_judged("B", chain) is judged
    foreign = [(_entry("a", "B", foreign=True), "c-a", "tree", "fast-forward")]
    assert as_judged("B", foreign) is False  # another machine's word is not ours
