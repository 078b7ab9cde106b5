"""Helpers for testing agent suites offline: a scripted model server real agent CLIs talk to.

``ScriptedModelServer`` speaks Anthropic's Messages API and OpenAI's Responses and Chat
Completions APIs on loopback, answering each agent request with the next step of a script
(``Run``, ``Write``, ``Finish``): ``model_server`` serves, ``wire`` reads and writes the
three formats, ``steps`` holds the script's steps. Nothing here is imported by the plugin
itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model_server import Request, ScriptedModelServer
    from .steps import Finish, Run, Write

__all__ = ["Finish", "Request", "Run", "ScriptedModelServer", "Write"]

_WHERE = {
    "ScriptedModelServer": "model_server",
    "Request": "model_server",
    "Run": "steps",
    "Write": "steps",
    "Finish": "steps",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
