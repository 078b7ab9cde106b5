"""Where an attempt's declared state is named: ``refs/agentgate/state/<slug>/<n>``, beside
its record. Capturing and restoring the state itself is the workspace's
(:mod:`pytest_agentgate.workspace.state`); naming what was captured is the store's."""

from __future__ import annotations

from ..errors import StateError
from ..git.repo import BaseRepo

PREFIX = "refs/agentgate/state/"


def ref_for(attempt_ref: str) -> str:
    """``refs/agentgate/attempts/<slug>/<n>`` -> ``refs/agentgate/state/<slug>/<n>``."""
    return PREFIX + attempt_ref.split("/", 3)[3]


def write_ref(repo: BaseRepo, attempt_ref: str, commit: str) -> str:
    """Name the state commit beside its attempt (created once, by compare-and-swap)."""
    ref = ref_for(attempt_ref)
    if not repo.refs.update(ref, commit, None, "agentgate state"):
        raise StateError(ref, "already exists")
    return ref
