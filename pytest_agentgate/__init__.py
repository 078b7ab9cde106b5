"""pytest-agentgate: gate coding-agent changes behind tests.

The public API is re-exported here lazily: pytest imports this package in every run of every
suite that has the plugin installed, so names load (and with them the engine's modules) only
when they are first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._constants import VERSION as __version__

_EXPORTS = {
    "Engine": "engine",
    "EngineSettings": "engine",
    "Attempt": "engine.attempt",
    "Target": "land.target",
    "LocalBranch": "land.target",
    "DryRunRef": "land.dry_run",
    "RemoteBranch": "land.remote_branch",
    "MoveNote": "land.target",
    "MoveResult": "land.target",
    "Move": "land.promote",
    "Undo": "land.promote",
    "OpLog": "store.oplog",
    "TreeEntry": "git.repo",
    "TreeChange": "git.repo",
    "Index": "git.index",
    "PushResult": "git.transport",
    "PushRefused": "errors",
    "GateSpec": "judge.gate",
    "CheckResult": "judge.gate",
    "Verdict": "judge.gate",
    "Workspace": "workspace.fork",
    "Snapshot": "workspace.snapshot",
    "fork": "workspace.fork",
    "snapshot": "workspace.snapshot",
    "BaseRepo": "git.repo",
    "Author": "git.repo",
    "MergePreview": "git.repo",
    "rollback": "land.promote",
    "revert": "land.promote",
    "list_attempts": "store.attempts",
    "OpRecord": "store.oplog",
    "AgentgateError": "errors",
    "GitError": "errors",
    "GitTooOld": "errors",
    "ConfigError": "errors",
    "SettingError": "errors",
    "RepoNotFound": "errors",
    "RevisionNotFound": "errors",
    "BadRefName": "errors",
    "RefMoved": "errors",
    "DirtyWorktree": "errors",
    "WorktreeBlocked": "errors",
    "MergeConflict": "errors",
    "AttemptNotFound": "errors",
    "StaleLock": "errors",
    "NothingToRevert": "errors",
    "GateFailed": "errors",
}

__all__ = [
    "__version__",
    "AgentgateError",
    "Attempt",
    "AttemptNotFound",
    "Author",
    "BadRefName",
    "BaseRepo",
    "CheckResult",
    "ConfigError",
    "DirtyWorktree",
    "DryRunRef",
    "Engine",
    "EngineSettings",
    "GateFailed",
    "GateSpec",
    "GitError",
    "GitTooOld",
    "Index",
    "LocalBranch",
    "MergeConflict",
    "MergePreview",
    "Move",
    "MoveNote",
    "MoveResult",
    "NothingToRevert",
    "OpLog",
    "OpRecord",
    "PushRefused",
    "PushResult",
    "RefMoved",
    "RemoteBranch",
    "RepoNotFound",
    "RevisionNotFound",
    "SettingError",
    "Snapshot",
    "StaleLock",
    "Target",
    "TreeChange",
    "TreeEntry",
    "Undo",
    "Verdict",
    "Workspace",
    "WorktreeBlocked",
    "fork",
    "list_attempts",
    "revert",
    "rollback",
    "snapshot",
]


# Names here must not be those of submodules: ``from . import promote`` inside the package
# would otherwise get a function instead of the module.


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from .engine import Engine, EngineSettings
    from .engine.attempt import Attempt
    from .errors import (
        AgentgateError,
        AttemptNotFound,
        BadRefName,
        ConfigError,
        DirtyWorktree,
        GateFailed,
        GitError,
        GitTooOld,
        MergeConflict,
        NothingToRevert,
        PushRefused,
        RefMoved,
        RepoNotFound,
        RevisionNotFound,
        SettingError,
        StaleLock,
        WorktreeBlocked,
    )
    from .git.index import Index
    from .git.repo import Author, BaseRepo, MergePreview, TreeChange, TreeEntry
    from .git.transport import PushResult
    from .judge.gate import CheckResult, GateSpec, Verdict
    from .land.dry_run import DryRunRef
    from .land.promote import Move, Undo, revert, rollback
    from .land.remote_branch import RemoteBranch
    from .land.target import LocalBranch, MoveNote, MoveResult, Target
    from .store.attempts import list_attempts
    from .store.oplog import OpLog, OpRecord
    from .workspace.fork import Workspace, fork
    from .workspace.snapshot import Snapshot, snapshot
