"""Hooks other plugins implement to add checks to the gate and to observe verdicts.

The plugin's own behaviour goes through the same hooks: the marker's ``checks=`` come from its
own ``trylast`` implementation of :func:`pytest_agentgate_checks`, and the terminal summary and
JSON report are fed by its own implementation of :func:`pytest_agentgate_verdict`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..engine.attempt import Attempt


@pytest.hookspec
def pytest_agentgate_checks(item: pytest.Item, attempt: Attempt) -> list[Any] | None:
    """Return checks (callables taking the attempt) to run on ``item``'s attempt.

    Every implementation's list is used, in hook order. A check returns a bool or a
    :class:`pytest_agentgate.CheckResult`; an exception it raises rejects the attempt.
    """


@pytest.hookspec
def pytest_agentgate_verdict(item: pytest.Item, attempt: Attempt) -> None:
    """Called once an attempt's verdict is final and its record ref is written."""
