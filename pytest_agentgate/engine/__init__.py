"""The gated lifecycle as plain Python: fork, snapshot, gate, preflight, promote, record.

The pytest plugin is a thin layer over :class:`Engine`; an orchestrator that is not pytest
drives the same calls::

    engine = Engine.open("../service", "main", promote=True,
                         gate=GateSpec(commands=("python -m pytest -q",)))
    ws = engine.fork(task="Add total()")
    ...  # the agent edits ws.path
    attempt = engine.run_attempt(ws, task="Add total()", agent="agent-a")
    print(attempt.verdict.status, attempt.record_ref)

The engine holds the lifecycle only. Where attempts land is its :class:`~..land.target.Target`;
workspaces come from a :class:`~.pool.WorkspacePool`; what a test is held to from
:class:`~..judge.baseline.Baselines`; the verdict from :mod:`..judge.gate`; messages from
:mod:`..store.records`. Its settings are one frozen :class:`EngineSettings`, given whole.

Its modules, each using only those after it: :mod:`.story` (the one place that tells the
lifecycle in order: :meth:`Engine.run_attempt`, over the parts it holds); then, side by
side, :mod:`.parts` (its parts and the steps that stand alone), :mod:`.tries` (checkpoints,
declared state, what a retry starts from) and :mod:`.landing` (the lander it holds:
records, the queue, the batch re-test); :mod:`.settings`;
then the values and parts it holds: :mod:`.attempt` (one attempt, filled in as the story
goes), :mod:`.pool` (a run's workspaces and gate contexts) and :mod:`.resume` (what a try
starts from, and the declared state around a test); under them :mod:`.resolving` (settings
made into the values they fill) and :mod:`.options` (every setting declared once, which the
pytest plugin loads in every run).
May use every folder below it; nothing below imports it.

Its names are imported on first use, so that loading :mod:`.options` loads nothing else.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..judge.baseline import HarnessBroken
    from .attempt import Attempt
    from .settings import NO_GATE, EngineSettings, make_target
    from .story import Engine

_WHERE = {
    "NO_GATE": ".settings",
    "Attempt": ".attempt",
    "Engine": ".story",
    "EngineSettings": ".settings",
    "HarnessBroken": "..judge.baseline",
    "make_target": ".settings",
}
__all__ = ["NO_GATE", "Attempt", "Engine", "EngineSettings", "HarnessBroken", "make_target"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(where, __name__), name)
    globals()[name] = value
    return value
