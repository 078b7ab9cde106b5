"""The engine's settings, given whole, and the target they name."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._constants import (
    DEFAULT_BATCH_MAX,
    DEFAULT_EXCLUDE,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    ISOLATIONS,
)
from ..errors import ConfigError
from ..git.repo import BaseRepo
from ..judge.gate import (
    GateSpec,
)
from ..land.dry_run import DryRunRef
from ..land.remote_branch import RemoteBranch
from ..land.target import LocalBranch, Target
from ..remote.server_queue import Trust
from ..sandbox import containment as sandbox
from ..store import oplog, records
from .resolving import Resolved

NO_GATE = (
    "no gate: promotion needs a gate command (--agentgate-gate CMD), a check "
    "(checks=[...] on the marker), or gate=[] on the marker to say the test's own outcome is enough"
)


@dataclass(frozen=True)
class EngineSettings:
    """Everything an engine is configured with, resolved once (by the plugin from the
    command line, environment and ini; by a script directly)."""

    #: The branch attempts land on (``None``: the one checked out in the repository).
    target: str | None = None
    #: Move the target for real; without it, a dry run onto this run's scratch ref
    #: (``refs/agentgate/dryruns/<run>/<b>``).
    promote: bool = False
    #: The target lives on this remote of the repository: promote by push with a lease.
    remote: str | None = None
    #: Fork every workspace from this revision instead of the target's tip (``run-start``:
    #: the target's tip when the engine opens).
    base: str | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "agentgate")
    gate: GateSpec = field(default_factory=GateSpec)
    retest: bool = True
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES
    #: The most bytes an attempt's declared state may hold (beyond: rejected).
    max_state_bytes: int = DEFAULT_MAX_BYTES
    agent: str = "agent"
    recycle: bool = True
    sandbox: sandbox.Settings = field(default_factory=sandbox.Settings)
    isolation: str = "shared"
    allow_symlinks: tuple[str, ...] = ()
    #: Most attempts one re-test lands together (1: each merge is tested alone).
    batch_max: int = DEFAULT_BATCH_MAX
    #: Test a batch's merged tree while its attempts' own gates run (see :mod:`.early`).
    early_retest: bool = True
    push_state: bool = False
    lease_seconds: float = DEFAULT_LEASE_S
    #: An SSH private key this machine signs its posts on a server's queue with.
    signing_key: Path | None = None
    #: git's allowed-signers file: whose signed posts a leader here takes.
    allowed_signers: Path | None = None
    #: Take other machines' posts unsigned (anyone who can push could write one).
    unsigned_posts: bool = False
    #: Names this run (every process of one run shares it): a dry run's scratch ref is its own.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        records.check_name(self.agent, "agent name", "agent")
        if self.isolation not in ISOLATIONS:
            raise ConfigError(
                f"isolation must be one of {', '.join(ISOLATIONS)}, got {self.isolation!r}",
                value=self.isolation,
                source="isolation",
            )

    @classmethod
    def resolved(cls, resolved: Resolved, **fixed: Any) -> EngineSettings:
        """Settings from the option table's values (:func:`.options.resolve`), each field
        filled by the one setting declared for it; ``fixed``: what the face that read them
        decides itself (its work directory, its run's id)."""
        return cls(
            **resolved.of("engine"),
            gate=GateSpec(**resolved.of("gate")),
            sandbox=sandbox.Settings(**resolved.of("sandbox")),
            **fixed,
        )

    @classmethod
    def of(cls, **options: Any) -> EngineSettings:
        """Settings from keyword options (the fields of this class)."""
        if options.get("workdir") is None:
            options.pop("workdir", None)
        for name in ("exclude", "allow_symlinks"):
            if name in options:
                options[name] = tuple(options[name])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown engine setting(s): {', '.join(unknown)}")
        return cls(**options)


def program_exists(program: str) -> bool:
    """Whether a gate's program can be found as the gate will look for it (on PATH, or a
    path; a relative path is the checkout's business and is left to the launch)."""
    import shutil

    if "/" in program:
        return not os.path.isabs(program) or os.access(program, os.X_OK)
    return shutil.which(program) is not None


def make_target(repo: BaseRepo, settings: EngineSettings, log: oplog.OpLog) -> Target:
    """The target the settings name: a branch here or on a server, or a dry run of either."""
    assert settings.target is not None
    source: LocalBranch | RemoteBranch = (
        RemoteBranch(
            repo,
            settings.remote,
            settings.target,
            log,
            push_state=settings.push_state,
            lease_seconds=settings.lease_seconds,
            trust=Trust(settings.signing_key, settings.allowed_signers, settings.unsigned_posts),
        )
        if settings.remote
        else LocalBranch(repo, settings.target, log)
    )
    if settings.promote:
        return source
    return DryRunRef(source, log, agent=settings.agent, run_id=settings.run_id)
