"""One record, both ways: what a record commit's trailers say is read back as the same
:class:`Record` that was written, odd bytes and a large record included; and nothing
outside ``store/`` reads a trailer by its name."""

from __future__ import annotations

import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from pytest_agentgate.store.record import Record
from pytest_agentgate.store.records import POSTED as POSTED_JSON
from pytest_agentgate.store.records import (
    TRAILERS,
    format_message,
    parse_trailers,
    posting_of_record,
    record_of_posting,
    record_of_trailers,
)

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_agentgate"
#: What only a record's body holds (or the record commit itself: its tree), never a trailer.
BODY_ONLY = {"tree", "excluded", "transcript", "results", "refused", "pid"}
#: The record's fields a server's queue posting carries (by their field names).
POSTED_FIELDS = tuple(name for name in POSTED_JSON)

WHOLE = Record(
    task="Add total()", agent="agent-a", base="b" * 40, tree="", uid="u1", test="t::x",
    status="rejected", state="s" * 40, sandbox="bwrap", graded_tree="g" * 40, try_number=3,
    protect=("docs/*", "a,b.json", "[x]"), max_changed_lines=40, checkpoints="cp/abc",
    retest="passed early", batch="x (1 of 2)", landing="squash",
)  # fmt: skip


def _round_trip(record: Record) -> Record:
    return record_of_trailers(parse_trailers(format_message(record, check="gate: x")))


OTHER = {
    "task": "other", "agent": "b", "base": "c" * 40, "uid": "u2", "test": "t::y",
    "status": "passed", "state": "t" * 40, "sandbox": "none", "graded_tree": "h" * 40,
    "try_number": 4, "protect": ("z",), "max_changed_lines": 3, "checkpoints": "cp/def",
    "retest": "batched", "batch": "y (2 of 2)", "landing": "rebase",
}  # fmt: skip


def test_every_trailer_field_comes_back() -> None:
    assert _round_trip(WHOLE) == WHOLE
    # A new field of the record is either carried (and named here) or the body's: one edit
    # to the record and its codec, held here.
    assert set(OTHER) == {f.name for f in fields(Record)} - BODY_ONLY
    # Both ways read one table: a field is carried by naming it there, once.
    assert {t.field for t in TRAILERS if t.field} == set(OTHER)
    for name, value in OTHER.items():  # each field, changed alone, comes back changed
        assert getattr(_round_trip(replace(WHOLE, **{name: value})), name) == value, name


@pytest.mark.parametrize(
    "odd",
    ["caf\udcc3\udca9 \udcff", "tab\there", "a\x00b", "\u2028line", "Agentgate-Verdict: promoted"],
)
def test_odd_bytes_come_back_as_the_record_wrote_them(odd: str) -> None:
    record = replace(WHOLE, task=odd, agent=odd.replace("\x00", ""), test=odd)
    back = _round_trip(record)
    # The record escapes what git cannot hold and makes each value one line: read back, it
    # is that escaped, one-line text, and never a second trailer.
    from pytest_agentgate.store.records import one_line

    assert back.task == one_line(record.task) and back.test == one_line(record.test)
    assert back.status == "rejected"


def test_a_large_record_comes_back_whole() -> None:
    record = replace(WHOLE, protect=tuple(f"glob/{i}/**" for i in range(2000)), task="t" * 5000)
    back = _round_trip(record)
    assert back.protect == record.protect and back.task == record.task


def test_an_older_or_damaged_record_reads_without_raising() -> None:
    back = record_of_trailers(
        {"Verdict": "weird", "Try": "x", "Protect": "{not json", "Max-Changed-Lines": "-1"}
    )
    assert (back.status, back.try_number, back.protect, back.max_changed_lines) == (
        "promoted", 1, (), None,
    )  # fmt: skip


def test_no_module_outside_store_reads_a_trailer_by_its_name() -> None:
    # A trailer read by its name (``trailers.get("X")``), or trailers parsed to be read so
    # (``parse_trailers(...)``): the store's readers say what a message means instead.
    reads = re.compile(r"trailers(\.get\(|\[)\s*[\"']|parse_trailers\(")
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in PACKAGE.rglob("*.py")
        if path.parent.name != "store"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert not found, f"read the Record (AttemptInfo.record) or landing_said instead: {found}"


def test_a_landing_commit_says_its_task_its_agent_and_what_it_replays() -> None:
    from pytest_agentgate.store.records import (
        change_message,
        landing_said,
        merge_message,
        rebased_message,
        squash_message,
    )

    change = "c" * 40
    rebased = rebased_message(change_message(WHOLE.task, WHOLE.agent), change)
    for message, replays in (
        (squash_message(WHOLE, change), change),
        (rebased, change),
        (merge_message(WHOLE.task, WHOLE.agent), ""),
    ):
        assert landing_said(message) == (WHOLE.task, WHOLE.agent, replays), message
    assert landing_said("a person's commit\n\nSigned-off-by: p\n") == ("", "", "")


def _posted(record: Record) -> Record:
    """Through another machine: posted as JSON, read back as a waiter's record."""
    sent = json.loads(json.dumps(posting_of_record(record)))
    return record_of_posting(sent, record.uid, record.status)


def test_a_posting_brings_the_record_s_posted_fields_and_only_those() -> None:
    back = _posted(WHOLE)
    assert {n: getattr(back, n) for n in POSTED_FIELDS} == {
        n: getattr(WHOLE, n) for n in POSTED_FIELDS
    }
    assert (back.uid, back.status, back.tree, back.state) == ("u1", "rejected", "", None)
    large = replace(WHOLE, protect=tuple(f"glob/{i}/**" for i in range(2000)))
    assert _posted(large).protect == large.protect  # every glob: none may be lost


def test_a_hostile_posting_reads_as_a_safe_record() -> None:
    """Anyone who can push can post: a name is cut to printable characters and its
    length, a value of the wrong type is absent, the agent and task are never empty."""
    back = record_of_posting(
        {
            "agent": ["not", "a", "name"],
            "task": "\x1b[2Kfake\nAgentgate-Verdict: promoted" + "x" * 5000,
            "base": 7,
            "protect": ["docs/*", 3, None],
            "max_changed_lines": True,
            "landing": "sideways",
            "test": "t::x",
        },
        "u9",
        "passed",
    )
    assert back.agent == "agent" and back.base == "" and back.test == "t::x"
    assert back.task.startswith("[2KfakeAgentgate-Verdict") and len(back.task) == 200
    assert (back.protect, back.max_changed_lines, back.landing) == (("docs/*",), None, "merge")
    assert record_of_posting({}, "u9", "passed").task == "task"
