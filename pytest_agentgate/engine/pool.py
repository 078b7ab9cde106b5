"""Workspaces for a run: forked fresh, or recycled from an attempt that landed; and the run's
private directory (gate checkouts, each command's ``/tmp`` and ``$HOME``).

A recycled workspace is reset to the new base with one two-tree checkout, which rewrites
only what differs: most of a fork's cost on a large repository is writing files.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ..git.repo import BaseRepo
from ..judge.bytecode import Bytecode
from ..judge.gate import GateContext
from ..sandbox import containment as sandbox
from ..sandbox.removal import removals_done, remove_tree
from ..store.records import slugify
from ..workspace import fork as workspace
from ..workspace import recycle as recycling
from ..workspace.checkouts import GateCheckouts
from ..workspace.fork import Workspace
from ..workspace.reuse import ReuseCosts


class WorkspacePool:
    """The run's workspaces under ``workdir``, and what each command may see of them."""

    def __init__(
        self,
        repo: BaseRepo,
        workdir: Path,
        contained: sandbox.Sandbox,
        settings: sandbox.Settings,
        *,
        branch: str,
        isolation: str = "shared",
        recycle: bool = True,
        require_results: bool = False,
    ) -> None:
        self.repo = repo
        self.workdir = workdir
        self.sandbox = contained
        self.branch = branch
        self.isolation = isolation
        self.recycle = recycle
        #: Gate commands must report per-test results unless declared (a promoting run).
        self.require_results = require_results
        self.agent_role = sandbox.Role(
            "agent", settings.agent_network, settings.agent_env, unprivileged=True
        )
        self.gate_role = sandbox.Role("gate", settings.gate_network, settings.gate_env)
        self._private: Path | None = None
        self._free: list[Workspace] = []
        self._checkouts: GateCheckouts | None = None
        #: Bytecode compiled once for the run's gate commands (see :mod:`~.judge.bytecode`).
        self._bytecode: Bytecode | None = None
        self._worktrees: list[Path] | None = None
        self._costs = ReuseCosts()

    def fork(self, at: str, task: str) -> Workspace:
        """A private workspace at ``at``: a recycled one when there is one and recycling
        costs less than a fresh checkout here (see :class:`~.workspace.reuse.ReuseCosts`), else a fresh one."""
        name = slugify(task)[:30]
        wasted = 0.0  # a recycling that failed cost its time and a fresh fork after it
        while self.recycle and self._free:
            used = self._free.pop()
            begin = time.perf_counter()
            try:
                recycled = recycling.recycle(used, at, name)
            except recycling.RecycleFailed:
                wasted += (time.perf_counter() - begin) * 1000
                workspace.remove(used, later=True)
                continue
            recycled.for_next_task()  # a retry recycles its own, and keeps its task's
            self._costs.note("recycled", recycled.fork_ms)
            return self._contain(recycled)
        private = self.private_root() / secrets.token_hex(16)
        private.mkdir(mode=0o700)
        ws = workspace.fork(
            self.repo,
            at,
            self.branch,
            self.workdir,
            name,
            sealed=self.isolation == "sealed",
            private=private,
        )
        self._costs.note("fresh", ws.fork_ms)
        if wasted:
            self._costs.note("recycled", wasted + ws.fork_ms)
        return self._contain(ws)

    def _contain(self, ws: Workspace) -> Workspace:
        ws.sandbox = self.sandbox_now()
        ws.role = self.agent_role
        return ws

    def sandbox_now(self) -> sandbox.Sandbox:
        """The sandbox with what it must hide: the workdir, the base's git directory and
        working tree, and the run's private directory."""
        hidden = [self.workdir, self.repo.git_dir, self.repo.common_dir]
        if self.repo.worktree is not None:
            hidden.append(self.repo.worktree)
        if self._worktrees is None:  # linked ones (git worktree add) hold other branches
            self._worktrees = self.repo.place.worktrees()
        hidden += self._worktrees
        if self._private is not None:
            hidden.append(self._private)
        return replace(self.sandbox.with_hidden(*hidden), base_tree=self.repo.worktree)

    def private_root(self) -> Path:
        """The run's private directory: mode 0700, an unguessable name, under the workdir
        (hidden in the sandbox with the whole workdir)."""
        if self._private is None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._private = Path(tempfile.mkdtemp(prefix=".private-", dir=self.workdir))
            self._private.chmod(0o700)
        return self._private

    def gate_context(self) -> GateContext:
        """Where gate commands run: the private directory, the sandbox, the gate role, and
        the checkouts earlier gate runs left (reused when ``recycle`` is on)."""
        root = self.private_root()
        if self.recycle and self._checkouts is None:
            self._checkouts = GateCheckouts(self.repo, root, costs=ReuseCosts())
        if self._bytecode is None:
            self._bytecode = Bytecode(self.repo)
        return GateContext(
            root, self.sandbox_now(), self.gate_role, self._checkouts, self.require_results,
            self._bytecode,
        )  # fmt: skip

    def release(self, ws: Workspace) -> None:
        """Take a workspace back once its attempt is recorded: kept for reuse where
        recycling pays here (see :class:`~.workspace.reuse.ReuseCosts`), or removed in the background."""
        if self.recycle and self._costs.recycle_next():
            ws.end_processes()
            self._free.append(ws)
        else:
            workspace.remove(ws, later=True)

    def close(self) -> None:
        """Remove the kept workspaces (they hold nothing but a copy of a base)."""
        while self._free:
            workspace.remove(self._free.pop())
        if self._checkouts is not None:
            self._checkouts.close()
            self._checkouts = None
        if self._private is not None:
            removals_done()  # the gates' checkouts inside it, still being deleted
            remove_tree(self._private)
            self._private = None
