"""The ``gated`` marker: what it accepts, and what it says about what it does not."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_agentgate.pytest_plugin.marker import GatedMarker, gated


def test_a_valid_marker() -> None:
    m = gated(
        " Add total() ", agent="a", gate=["pytest -q"], state=["data/db.sqlite"], resume="full",
        resume_from="latest",
    )  # fmt: skip
    assert (m.task, m.agent, m.gate, m.state, m.retry_mode, m.resume_from) == (
        "Add total()", "a", ("pytest -q",), ("data/db.sqlite",), "full", "latest"
    )  # fmt: skip
    assert gated("t").retry_mode == "restart"
    assert type(m) is GatedMarker


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": ""}, "task must be a non-empty string"),
        ({"task": "t", "agent": "a\nb"}, "control characters"),
        ({"task": "t", "gate": "pytest"}, "gate must be a list of command strings"),
        ({"task": "t", "checks": [1]}, "checks must be a list of callables"),
        ({"task": "t", "max_changed_lines": True}, "max_changed_lines must be a non-negative int"),
        ({"task": "t", "state": ["/"]}, "the whole machine"),
        ({"task": "t", "state": ["@abs/x"]}, "never under '@abs/'"),
        ({"task": "t", "resume": "sometimes"}, "resume must be one of"),
        ({"task": "t", "retries": -1}, "retries must be a non-negative int"),
        ({"task": "t", "state": ["../up"]}, "relative to the workspace"),
        ({"task": "t", "resume": True}, "write resume_from='latest'"),
        ({"task": "t", "resume": False}, "resume must be one of"),
        ({"task": "t", "fail_to_pass": ["not-a-node-id"]}, "pytest node ids"),
        ({"task": "t", "tests_from": "HEAD~1"}, "name its fail_to_pass"),
        ({"task": "t", "allow_removed": "tests/x.py::t"}, "allow_removed must be a list"),
    ],
)
def test_invalid_markers_say_what_is_wrong(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message.replace("(", r"\(")):
        gated(**kwargs)
