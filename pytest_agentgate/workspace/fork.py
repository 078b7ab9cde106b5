"""Forking a private workspace at an exact base commit (snapshotting it is :mod:`.snapshot`,
reusing it :mod:`.recycle`).

The workspace holds the base commit's files and a ``.git`` of its own for the agent (objects
borrowed from the base through alternates). The plugin never runs git with that ``.git``: it
snapshots with the *base* repository's git directory, ``--work-tree=<workspace>`` and a private
index it keeps outside the workspace. The index is written by the checkout itself, so it is
stat-valid and a snapshot hashes only the files the agent changed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .._constants import DEFAULT_RUN_TIMEOUT_S
from ..errors import AgentgateError
from ..git.index import Index
from ..git.repo import BaseRepo
from ..sandbox import process as _proc
from ..sandbox.containment import UNCONTAINED, Mounts, Role, Sandbox, run_contained
from ..sandbox.removal import remove_later, remove_tree, remove_under
from ..store.checkpoints import CheckpointError

if TYPE_CHECKING:
    from ..sandbox.agent_command import AgentCommand


@dataclass
class Workspace:
    """A private directory at the base commit that one agent task may change freely."""

    path: Path
    base: str
    branch: str
    repo: BaseRepo
    index: Path
    runs: list[_proc.CommandResult] = field(default_factory=list)
    fork_ms: float = 0.0
    recycled: int = 0
    resumed_from: str | None = None
    #: When the private index was last written (0: known to be stat-valid).
    index_written: float = 0.0
    #: The tree the private index holds, where known (None: only the index can say).
    index_tree: str | None = None
    #: The containment the agent's commands run in, and as which role.
    sandbox: Sandbox = UNCONTAINED
    role: Role = field(default_factory=lambda: Role("agent"))
    #: The workspace's own directory outside every workspace: its commands' /tmp and $HOME.
    private: Path | None = None
    #: The object store the agent's ``.git`` borrows from (None: sealed, nothing borrowed).
    objects: Path | None = None
    #: What :meth:`run_agent` runs (None: no agent command is configured).
    agent_command: AgentCommand | None = None
    #: The default timeout of :meth:`run_agent`, in seconds (None: none).
    agent_timeout: float | None = None
    #: The task and the agent's name, as the marker and the settings give them.
    task: str = ""
    agent: str = "agent"
    #: Which try within its test this is (1-based), and what the earlier tries came to:
    #: one mapping per try (``attempt``, ``verdict``, ``reason``, ``output``).
    attempt: int = 1
    history: list[dict[str, object]] = field(default_factory=list)
    #: The file outside the workspace that holds :attr:`history` for the agent to read.
    feedback: Path | None = None
    #: Declared state outside the workspace, bound writable into the agent's sandbox.
    state_binds: tuple[Path, ...] = ()
    #: The test's declared state paths, and the commit of what those outside the workspace
    #: held before its first try (None: nothing, or none declared).
    state_declared: tuple[str, ...] = ()
    state_base: str | None = None
    #: This try's name among its test's tries (its checkpoints' folder), and the refs of the
    #: checkpoints it made so far.
    try_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    checkpoints: list[str] = field(default_factory=list)
    #: What records a checkpoint (the engine's, set when the workspace serves a gated test).
    checkpointer: Callable[[Workspace, str], str] | None = None
    #: What the agent reported of this try through :meth:`note` (tokens, cost, steps...).
    notes: dict[str, object] = field(default_factory=dict)
    #: Told when the agent starts and ends (the plugin's progress line); None: nobody.
    on_step: Callable[[str], None] | None = None
    #: Connections the network's allow-list refused in this try (the first ones, as text),
    #: how many in all, and whether one rejects the attempt.
    refused: list[str] = field(default_factory=list)
    refused_count: int = 0
    network_strict: bool = False
    #: The agent's transcripts of this try (its stream or trajectory, one per run_agent()),
    #: with the size each had before it was cut to its end.
    transcripts: list[tuple[bytes, int]] = field(default_factory=list)
    _groups: list[int] = field(default_factory=list)

    def for_next_task(self) -> None:
        """Serve another task (a workspace the pool recycles): nothing of the last one
        carries over, neither its tries, notes, refusals and transcripts, nor its feedback,
        declared state and agent settings. The engine's fork and the plugin's fixture set
        them anew."""
        self.new_try()
        self.task, self.agent, self.attempt, self.history = "", "agent", 1, []
        self.feedback, self.resumed_from = None, None
        self.state_binds, self.state_declared, self.state_base = (), (), None
        self.agent_command, self.agent_timeout, self.network_strict = None, None, False
        self.checkpointer, self.on_step = None, None

    def new_try(self) -> None:
        """Begin another try (the next one of this test, or the first of another test this
        recycled workspace serves): no checkpoint, note, refusal or transcript of an earlier
        try carries over."""
        self.checkpoints, self.notes, self.try_id = [], {}, uuid.uuid4().hex[:12]
        self.refused, self.refused_count, self.transcripts = [], 0, []

    def note(self, **fields: object) -> None:
        """Record what the agent reports of this try (``note(tokens=1200, cost=0.04)``):
        numbers add up over the calls of one try, anything else is replaced. The notes go
        into the attempt's record, the JSON report and the junit properties, and
        ``budget=`` on the marker is held to their sum over the test's tries."""
        for name, value in fields.items():
            if not name.isidentifier():
                raise AgentgateError(f"note(): {name!r} is not a field name")
            old = self.notes.get(name)
            _check_note(name, value, old)
            if _is_number(value) and _is_number(old):
                self.notes[name] = old + value  # type: ignore[operator]
            elif _is_number(value) or isinstance(value, str | bool) or value is None:
                self.notes[name] = value
            else:
                raise AgentgateError(
                    f"note({name}=...): a number, a string, a bool or None, not {type(value).__name__}"
                )

    def checkpoint(self, message: str = "") -> str:
        """Record where the task stands: the code, the declared state and the agent's own
        git state (its index, HEAD, commits, an unresolved merge), as a commit under
        ``refs/agentgate/checkpoints/``; returns its id. A retry with ``resume="code"`` or
        ``"full"`` starts from the last one."""
        if self.checkpointer is None:
            raise AgentgateError("checkpoint() needs a workspace of a gated test (agent_workspace)")
        return self.checkpointer(self, message)

    def run_agent(self, timeout: float | None = None) -> _proc.CommandResult:
        """Run the configured agent command (``agentgate_agent_command``) on this task, in
        the workspace and in the sandbox, and return what it did.

        Each placeholder of the template fills one argument (no shell). Its whole transcript
        is kept with the attempt (the tail, when long). Past ``timeout`` (default:
        ``agentgate_agent_timeout``) every process of the agent is ended and
        :class:`~pytest_agentgate.sandbox.agent_command.AgentTimedOut` is raised: the attempt's
        verdict is then ``error``, ``agent timed out after N s``.
        """
        from ..sandbox.agent_command import AgentCommandError, AgentTimedOut

        if self.agent_command is None:
            raise AgentCommandError(
                "",
                "none is configured: set agentgate_agent_command in the ini file or "
                "pass --agentgate-agent-command (or run the agent with agent_workspace.run())",
            )
        from ..agents.reading import program_roots, read_run

        home = self._private() / "home"
        argv = self.agent_command.argv(
            task=self.task,
            workspace=self.path,
            agent=self.agent,
            attempt=self.attempt,
            feedback=self.feedback or "",
            home=home,
        )
        limit = self.agent_timeout if timeout is None else timeout
        extra_ro: tuple[Path, ...] = (self.feedback,) if self.feedback is not None else ()
        extra_ro += program_roots(argv[0], os.environ.get("PATH", ""))
        self._tell("agent")
        try:
            env = dict(self.agent_command.env)
            if self.feedback is not None:  # for the agent's own tools too, not only its prompt
                env["AGENTGATE_FEEDBACK"] = str(self.feedback)
            result = self.run(argv, timeout=limit, extra_ro=extra_ro, env=env)
        finally:
            self._tell("")
        if result.timed_out and limit is not None:
            raise AgentTimedOut(limit)
        self._check_started(argv, result)
        read = read_run(self.agent_command, result.output, home)
        if read.notes:
            self.note(**read.notes)
        self.transcripts.append((read.transcript, read.transcript_size))
        return result

    def _check_started(self, argv: Sequence[str], result: _proc.CommandResult) -> None:
        """Raise :class:`AgentSetupError` when the agent never started: its program could not
        be executed (126, 127, a failed launch), or it failed naming a path that exists here
        but lies outside the sandbox's read view (a script in a folder it cannot see)."""
        from ..sandbox.agent_command import AgentSetupError

        if result.ok:
            return
        hidden = self.sandbox.outside_view(" ".join(argv) + "\n" + result.output)
        if not (result.launch_error or result.returncode in (126, 127) or hidden):
            return
        why = result.launch_error or f"it exited {result.returncode}"
        if hidden:
            shown = ", ".join(str(p) for p in hidden[:3])
            why += (
                f"; {shown} exists but lies outside the sandbox's read view: widen it with "
                "--agentgate-sandbox-read=PATH"
            )
        raise AgentSetupError(self.agent_command.template if self.agent_command else "", why)

    def _tell(self, step: str) -> None:
        if self.on_step is not None:
            with contextlib.suppress(Exception):  # a display must never change an outcome
                self.on_step(step)

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        extra_ro: Sequence[Path] = (),
    ) -> _proc.CommandResult:
        """Run a command in the workspace (in the sandbox, when there is one); its output is
        kept for the attempt record. When it ends, every process it started has ended.

        The environment is the allow-list plus the variables named for agents, plus ``env``.
        ``GIT_CEILING_DIRECTORIES`` stops an agent that deleted its ``.git`` from reaching
        a repository that encloses the workspace.
        """
        extra = dict(env or {})
        extra["GIT_CEILING_DIRECTORIES"] = str(self.path.parent)
        result = run_contained(
            self.sandbox,
            self.role,
            cmd,
            Mounts(
                self.path, self._private(), ro=tuple(extra_ro), rw=tuple(self.state_binds),
                objects=self.objects,
            ),
            timeout=timeout,
            env=extra,
            watch=_proc.Watch(started=self._groups),
        )  # fmt: skip
        self.runs.append(result)
        self.refused += [str(r) for r in result.refused][: 50 - len(self.refused)]
        self.refused_count += result.refused_count
        return result

    def _private(self) -> Path:
        """The workspace's own directory outside it (made on first use)."""
        if self.private is None:
            self.private = Path(
                tempfile.mkdtemp(prefix=".agentgate-private-", dir=self.path.parent)
            )
        return self.private

    def end_processes(self) -> int:
        """End every process still at work in the workspace; return how many are left.

        Each command's supervisor already ended what that command started; this catches
        what else runs there (started by the test body itself, or a supervisor that was
        killed): every process whose working directory, root or an open file is inside.
        """
        for pgid in self._groups:
            _proc.kill_group(pgid)
        self._groups.clear()
        return _proc.end_processes_in(self.path)

    def output_tail(self, lines: int = _proc.TAIL_LINES) -> str:
        text = "\n".join(f"$ {r.command}\n{r.output}" for r in self.runs)
        return "\n".join(text.splitlines()[-lines:])


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: The largest noted number (and sum of one field in a try): 2**53, the last integer a
#: float holds exactly; past it a budget's sum would overflow or round.
NOTE_MAX = 2**53


def _check_note(name: str, value: object, old: object = None) -> None:
    """A noted number is a count or an amount: finite, not negative, at most ``NOTE_MAX``,
    its sum within the try too (a NaN, a negative or an overflowing note would never reach a
    budget); and a field keeps its kind within a try (a string in place of a number would
    reset its count)."""
    import math

    if _is_number(value) != _is_number(old) and old is not None:
        raise AgentgateError(
            f"note({name}={value!r}): {name} was noted as {type(old).__name__} in this try"
        )
    if _is_number(value):
        total = value + (old or 0)  # type: ignore[operator]
        if not math.isfinite(value) or value < 0 or total > NOTE_MAX:  # type: ignore[arg-type,operator]
            raise AgentgateError(
                f"note({name}={value!r}): a noted number is finite, not negative, and its sum "
                f"in a try at most {NOTE_MAX:,}"
            )


def fork(
    repo: BaseRepo,
    base: str,
    branch: str,
    root: Path,
    name: str = "ws",
    *,
    sealed: bool = False,
    private: Path | None = None,
) -> Workspace:
    """Check out ``base`` into a new directory under ``root`` and give it its own ``.git``.

    ``sealed`` gives that ``.git`` a copy of just the base commit's objects instead of the
    base repository's whole object store: no other attempt, state or history to read.
    """
    begin = time.perf_counter()
    path, index = _checkout(repo, base, root, name)
    try:
        make_agent_git(repo, path, branch, base, index, sealed=sealed)
    except BaseException:
        remove_tree(path)
        index.unlink(missing_ok=True)
        raise
    return Workspace(
        path=path,
        base=base,
        branch=branch,
        repo=repo,
        index=index,
        fork_ms=(time.perf_counter() - begin) * 1000,
        index_written=time.time(),
        index_tree=repo.tree_of(base),
        private=private,
        objects=None if sealed else (repo.common_dir / "objects").resolve(),
    )


def make_agent_git(
    repo: BaseRepo, path: Path, branch: str, base: str, index: Path, *, sealed: bool = False
) -> None:
    """Write the agent's own ``.git``: the branch at ``base``, a clean index, and objects.

    It has no remote, and its only link to the base is a read-only alternates entry (or, when
    ``sealed``, none: a pack of the base commit's own objects), so nothing done in it (commits,
    ``update-ref``, hooks) can move a ref of the base.
    """
    # Written directly, as `git init --template=` would lay it out: a git process less per
    # fork, and nothing from a template directory to copy or trust.
    dotgit = path / ".git"
    for folder in ("objects/info", "objects/pack", "refs/tags", f"refs/heads/{branch}"):
        (dotgit / folder).mkdir(parents=True, exist_ok=True)
    (dotgit / f"refs/heads/{branch}").rmdir()  # only its parents were wanted
    (dotgit / "HEAD").write_text(f"ref: refs/heads/{branch}\n", encoding="utf-8")
    (dotgit / "config").write_text(_agent_config(path.parent), encoding="utf-8")
    if sealed:
        _write_sealed_objects(repo, base, dotgit / "objects" / "pack")
    else:
        (dotgit / "objects" / "info" / "alternates").write_text(
            f"{(repo.common_dir / 'objects').resolve()}\n", encoding="utf-8"
        )
    (dotgit / "refs" / "heads" / branch).write_text(f"{base}\n", encoding="ascii")
    shutil.copyfile(index, dotgit / "index")


def _write_sealed_objects(repo: BaseRepo, base: str, pack_dir: Path) -> None:
    """One pack holding the base commit, its tree and blobs: no parents, nothing else."""
    tree = repo.tree_of(base)
    oids = [base, tree]
    # A gitlink names a commit of another repository: not ours to pack.
    oids += [e.oid for e in repo.ls_tree(tree, trees=True) if not e.is_gitlink]
    repo.pack(oids, pack_dir / "pack")


_TRAITS: dict[Path, str] = {}


def _agent_config(root: Path) -> str:
    """The agent's ``.git/config``, with the filesystem traits ``git init`` would probe.

    Probed once per workspace root (executable bits, symlinks, case), so the agent's own
    ``git status`` is right on any filesystem.
    """
    traits = _TRAITS.get(root)
    if traits is None:
        probe = Path(tempfile.mkdtemp(prefix=".agentgate-probe-", dir=root))
        try:
            sample = probe / "probe"
            sample.write_text("")
            sample.chmod(0o755)
            filemode = bool(sample.stat().st_mode & 0o100)
            try:
                os.symlink("probe", probe / "link")
                symlinks = True
            except OSError:
                symlinks = False
            ignorecase = (probe / "PROBE").exists()
        finally:
            shutil.rmtree(probe, ignore_errors=True)
        traits = f"\tfilemode = {str(filemode).lower()}\n"
        if not symlinks:
            traits += "\tsymlinks = false\n"
        if ignorecase:
            traits += "\tignorecase = true\n"
        _TRAITS[root] = traits
    return (
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tlogallrefupdates = true\n"
        + traits
    )


def _private_index_path(repo: BaseRepo) -> Path:
    folder = repo.private_dir / "index"
    folder.mkdir(exist_ok=True)
    return folder / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def checkout_tree(repo: BaseRepo, tree: str, root: Path, name: str = "gate") -> Path:
    """A clean checkout of exactly ``tree`` in a new directory (nothing untracked in it)."""
    path, index = _checkout(repo, tree, root, name)
    index.unlink(missing_ok=True)
    return path


def checkout_with_index(repo: BaseRepo, tree: str, root: Path, name: str) -> tuple[Path, Path]:
    """A clean checkout of ``tree`` and the private index that describes it (for reuse)."""
    return _checkout(repo, tree, root, name)


def _new_dir(root: Path, name: str) -> Path:
    """A new, uniquely named directory under ``root``, named after ``name``."""
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name[:40]}-", dir=root))


def _checkout(repo: BaseRepo, rev: str, root: Path, name: str) -> tuple[Path, Path]:
    """Write ``rev``'s files into a new directory under ``root``; return it and its index."""
    path = _new_dir(root, name)
    index = _private_index_path(repo)
    try:
        repo.index(path, index).read_tree(rev, update=True)
    except BaseException:
        remove_tree(path)
        index.unlink(missing_ok=True)
        raise
    return path, index


def remove(ws: Workspace, *, later: bool = False) -> None:
    """Delete the workspace directory and its private index (both are the plugin's own).

    The deletion never follows a symlink (see :mod:`pytest_agentgate.sandbox.removal`).
    With ``later``, its processes are ended now and its files deleted in the background
    (:func:`~pytest_agentgate.sandbox.removal.remove_later`): for a workspace no one will
    use again, whose removal the caller need not wait for.
    """
    ws.end_processes()
    ws.index.unlink(missing_ok=True)
    remove = remove_later if later else remove_tree
    remove(ws.path)
    if ws.private is not None:
        remove(ws.private)


def discard_index(ws: Workspace) -> None:
    """Drop the private index but keep the workspace's files for inspection."""
    ws.end_processes()
    ws.index.unlink(missing_ok=True)


def _index(ws: Workspace) -> Index:
    """The workspace's files with its private index (outside the workspace)."""
    return ws.repo.index(ws.path, ws.index)


def restore_agent_git(repo: BaseRepo, commit: str, workspace: Path) -> None:
    """Replace the agent's ``.git`` by the files ``commit`` holds, written as files."""
    remove_under(workspace, ".git")
    root = workspace / ".git"
    root.mkdir(mode=0o755)
    for entry in repo.ls_tree(commit):
        if not entry.path.startswith("git/"):
            continue
        path = root / entry.path[4:]
        parent = path.parent
        for folder in [parent, *parent.parents]:
            if folder == root:
                break
            if folder.is_symlink():
                raise CheckpointError(commit[:12], f"{folder} is a link: nothing is written there")
        parent.mkdir(parents=True, exist_ok=True)
        data = repo.blob(entry.oid)
        if entry.mode == "120000":
            os.symlink(data.decode("utf-8", "surrogateescape"), path)
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        if entry.mode == "100755":
            os.chmod(path, 0o755)
