"""Forking a private workspace at an exact base commit, and snapshotting what the agent left.

The workspace holds the base commit's files and a ``.git`` of its own for the agent (objects
borrowed from the base through alternates). The plugin never runs git with that ``.git``: it
snapshots with the *base* repository's git directory, ``--work-tree=<workspace>`` and a private
index it keeps outside the workspace. The index is written by the checkout itself, so it is
stat-valid and a snapshot hashes only the files the agent changed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .._constants import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, DEFAULT_RUN_TIMEOUT_S
from ..errors import AgentgateError, GitError
from ..git import runner as _git
from ..git.index import Index, IndexEntry
from ..git.repo import BaseRepo, TreeChange
from ..sandbox import process as _proc
from ..sandbox.containment import UNCONTAINED, Role, Sandbox, run_contained
from ..sandbox.removal import remove_empty_dirs, remove_tree, remove_under

if TYPE_CHECKING:
    from ..sandbox.agent_command import AgentCommand

#: Paths never snapshotted (nor captured as state): secrets an agent might leave behind. A
#: pattern without a slash matches any component of a path, so ``.env`` also keeps out
#: everything in a ``.env/`` directory; a pattern with one matches the path or a parent.
DEFAULT_EXCLUDE = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    "id_dsa*",
    ".netrc",
    ".pypirc",
    ".npmrc",
)


#: One path that differs between the base tree and the snapshot.
Change = TreeChange


@dataclass(frozen=True)
class Snapshot:
    """The tree the agent left, and what it changed against the base."""

    base: str
    base_tree: str
    tree: str
    changes: tuple[Change, ...]
    excluded: tuple[str, ...] = ()
    hashed: int = 0
    #: Gitlinks the agent changed or removed; the snapshot keeps the base's value.
    kept_gitlinks: tuple[str, ...] = ()
    #: Trees and blobs the snapshot has that the base lacks (for the operations log).
    new_objects: tuple[str, ...] = ()

    @property
    def changed_paths(self) -> tuple[str, ...]:
        return tuple(change.path for change in self.changes)


class SnapshotRefused(AgentgateError):
    """The workspace holds something that must not become a tree (reported, not stored)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


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
    _groups: list[int] = field(default_factory=list)

    def new_try(self) -> None:
        """Begin another try (the next one of this test, or the first of another test this
        recycled workspace serves): no checkpoint or note of an earlier try carries over."""
        self.checkpoints, self.notes, self.try_id = [], {}, uuid.uuid4().hex[:12]

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
        argv = self.agent_command.argv(
            task=self.task,
            workspace=self.path,
            agent=self.agent,
            attempt=self.attempt,
            feedback=self.feedback or "",
        )
        limit = self.agent_timeout if timeout is None else timeout
        extra_ro = (self.feedback,) if self.feedback is not None else ()
        self._tell("agent")
        try:
            result = self.run(argv, timeout=limit, extra_ro=extra_ro)
        finally:
            self._tell("")
        if result.timed_out and limit is not None:
            raise AgentTimedOut(limit)
        return result

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
        if self.private is None:
            self.private = Path(
                tempfile.mkdtemp(prefix=".agentgate-private-", dir=self.path.parent)
            )
        result = run_contained(
            self.sandbox,
            self.role,
            cmd,
            cwd=self.path,
            private=self.private,
            timeout=timeout,
            env=extra,
            objects=self.objects,
            started=self._groups,
            extra_ro=extra_ro,
            extra_rw=self.state_binds,
        )
        self.runs.append(result)
        return result

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


def excluded_by(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``path`` matches an exclude pattern (see :data:`DEFAULT_EXCLUDE`)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        pattern = raw.strip("/")
        if not pattern:
            continue
        if "/" in pattern:
            if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
                return True
        elif any(fnmatch.fnmatchcase(part, pattern) for part in parts):
            return True
    return False


def snapshot(
    ws: Workspace,
    *,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    allow_symlinks: Sequence[str] = (),
) -> Snapshot:
    """Turn the files the agent left into a tree whose parent is the base.

    One pass lists what differs from the private index (new, modified, deleted; ignore rules
    honoured); only those paths become new objects. Secrets matching ``exclude`` stay out and
    are named in the result. Gitlinks keep the base's value (an agent cannot repoint a
    submodule). Nested repositories and paths git refuses raise :class:`SnapshotRefused`.
    The limits are checked from file sizes before anything is read.
    """
    repo = ws.repo
    _settle_index(ws)
    found = _index(ws).differences()
    others, tracked = list(found.untracked), list(found.changed)
    nested = [p.rstrip("/") for p in others if p.endswith("/")]
    if nested:
        raise SnapshotRefused(
            f"nested git repository at {', '.join(nested)}: an agent may not add a repository "
            "inside the workspace (it would be stored as a gitlink)"
        )
    excluded = tuple(p for p in (*tracked, *others) if excluded_by(p, exclude))
    # Tracked paths that are no longer a file here: deleted, now a directory, or behind a
    # symlink. They leave the index first; a gitlink among them keeps the base's value.
    excluded_set = set(excluded)
    gitlinks = _gitlinks(ws, [p for p in tracked if p not in excluded_set])
    removals = {
        p
        for p in tracked
        if p not in excluded_set and p not in gitlinks and not _is_file_here(ws.path, p)
    }
    additions = [
        p
        for p in (*tracked, *others)
        if p not in excluded_set and p not in gitlinks and p not in removals
    ]
    if len(additions) + len(removals) > max_files:
        raise SnapshotRefused(
            f"attempt changes {len(additions) + len(removals)} files, over the limit of {max_files}"
        )
    total = 0
    for rel in additions:
        total += (ws.path / rel).lstat().st_size
        if total > max_bytes:
            raise SnapshotRefused(f"attempt writes over {max_bytes} bytes, the limit")
    index = _index(ws)
    try:
        index.stage_paths(sorted(removals), remove=True)
        index.stage_paths(additions)
    except GitError as err:
        if _git.disk_trouble(err.stderr):
            raise  # a full or failing disk is the machine's trouble, not the agent's
        raise SnapshotRefused(f"git refused a path the agent wrote: {err.stderr.strip()}") from err
    ws.index_written = time.time()
    tree = index.write_tree()
    base_tree = repo.tree_of(ws.base)
    changes, new_objects = diff_trees(repo, base_tree, tree)
    _refuse_escaping_links(repo, base_tree, tree, changes, allow_symlinks)
    return Snapshot(
        base=ws.base,
        base_tree=base_tree,
        tree=tree,
        changes=changes,
        new_objects=new_objects,
        excluded=excluded,
        hashed=len(additions),
        kept_gitlinks=tuple(sorted(gitlinks)),
    )


def tree_snapshot(
    repo: BaseRepo,
    base: str,
    tree: str,
    *,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    allow_symlinks: Sequence[str] = (),
) -> Snapshot:
    """A tree somebody else made (another machine's posted attempt), judged as the files an
    agent left would be: what :func:`snapshot` keeps out or refuses is refused here.

    A workspace never yields a changed gitlink, a path ``exclude`` matches, more than
    ``max_files`` changes or ``max_bytes`` written, or a symlink out of the tree; a tree
    written by hand can hold any of them, so each raises :class:`SnapshotRefused`.
    """
    base_tree = repo.tree_of(base)
    changes, new_objects = diff_trees(repo, base_tree, tree)
    gitlinks = [c.path for c in changes if "160000" in (c.old_mode, c.new_mode)]
    if gitlinks:
        raise SnapshotRefused(f"changes a submodule's commit: {', '.join(gitlinks[:10])}")
    kept_out = [c.path for c in changes if c.status != "D" and excluded_by(c.path, exclude)]
    if kept_out:
        raise SnapshotRefused(
            f"writes paths every attempt keeps out (--agentgate-exclude): {', '.join(kept_out[:10])}"
        )
    if len(changes) > max_files:
        raise SnapshotRefused(
            f"attempt changes {len(changes)} files, over the limit of {max_files}"
        )
    if repo.total_size([c.new_oid for c in changes if c.status != "D"]) > max_bytes:
        raise SnapshotRefused(f"attempt writes over {max_bytes} bytes, the limit")
    _refuse_escaping_links(repo, base_tree, tree, changes, allow_symlinks)
    return Snapshot(base, base_tree, tree, changes, new_objects=new_objects)


#: How many symlinks one path may pass through before it counts as a loop (Linux: 40).
_MAX_HOPS = 40


def _refuse_escaping_links(
    repo: BaseRepo, base_tree: str, tree: str, changes: Sequence[Change], allowed: Sequence[str]
) -> None:
    """Reject a symlink the attempt added or changed that is absolute or leaves the tree.

    Each link is resolved inside the snapshot's own tree, following the tree's symlinks, so a
    link that climbs out (to an ignored file of the workspace, to the base checkout) or goes
    through another link that does is caught; what lands is never a link out. Links the base
    already had are not the attempt's, unless the change makes one leave the tree that did not
    before (``up -> a/..`` once ``a`` becomes a link). Paths matching ``allowed`` pass.
    """
    changed_links = [c.path for c in changes if c.new_mode == "120000" and c.status != "D"]
    if not changed_links:
        return
    in_new, in_base = _tree_lookup(repo, tree), _tree_lookup(repo, base_tree)
    bad = []
    for path in changed_links:
        if _matches_glob(path, allowed):
            continue
        found = in_new(path)
        target = found[1] if found else ""
        if not _resolves_inside(path, target, in_new):
            bad.append(f"{path} -> {target}")
    # A new link can change where an old one leads: judge the base's links again.
    changed = {c.path for c in changes}
    for entry in repo.ls_tree(tree):
        path = entry.path
        if not entry.is_link or path in changed or _matches_glob(path, allowed):
            continue
        target = (in_new(path) or ("", ""))[1]
        if not _resolves_inside(path, target, in_new) and _resolves_inside(path, target, in_base):
            bad.append(f"{path} -> {target} (a link of the base that this change makes leave)")
    if bad:
        raise SnapshotRefused(
            f"symlink leaves the tree: {', '.join(bad)} (a symlink must be relative and resolve "
            "inside the repository; allow one with --agentgate-allow-symlink GLOB)"
        )


def _tree_lookup(repo: BaseRepo, tree: str) -> Callable[[str], tuple[str, str] | None]:
    """(mode, link target or "") of a path in ``tree``, or None when it is not there; cached."""
    cache: dict[str, tuple[str, str] | None] = {}

    def lookup(path: str) -> tuple[str, str] | None:
        if path not in cache:
            entry = repo.tree_entry(tree, path)
            if entry is None:
                cache[path] = None
            else:
                target = ""
                if entry.is_link:
                    target = repo.blob(entry.oid).decode("utf-8", "surrogateescape")
                cache[path] = (entry.mode, target)
        return cache[path]

    return lookup


def _resolves_inside(
    link: str, target: str, lookup: Callable[[str], tuple[str, str] | None]
) -> bool:
    """Whether the link at ``link`` with ``target`` resolves to a path inside the tree."""
    if target.startswith("/") or not target:
        return False
    pending = [*link.split("/")[:-1], *target.split("/")]
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                return False
            resolved.pop()
            continue
        resolved.append(part)
        found = lookup("/".join(resolved))
        if found is not None and found[0] == "120000":
            hops += 1
            if hops > _MAX_HOPS or found[1].startswith("/") or not found[1]:
                return False
            resolved.pop()
            pending[:0] = found[1].split("/")
    return True


def _matches_glob(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _settle_index(ws: Workspace) -> None:
    """Make the private index stat-valid once a second has passed since it was written.

    git trusts a file's stat data only when the file is older than the index; files written
    in the same second as the index are "racily clean" and have their content compared, by
    every command that reads the index. One refresh, a second or more later, compares them
    once and rewrites the index, so the snapshot's own pass is stat-only.
    """
    if ws.index_written and time.time() - ws.index_written >= 1.0:
        _index(ws).refresh()
        ws.index_written = 0.0


def _is_file_here(root: Path, rel: str) -> bool:
    """Whether ``rel`` is a file or symlink reached without passing through a symlink."""
    path = root
    parts = rel.split("/")
    for part in parts[:-1]:
        path = path / part
        if path.is_symlink() or not path.is_dir():
            return False
    last = path / parts[-1]
    return last.is_symlink() or last.is_file()


def _gitlinks(ws: Workspace, paths: Sequence[str]) -> set[str]:
    """Those of ``paths`` that the private index holds as gitlinks (submodules).

    A few paths are looked up by name; many (an agent that deleted a vendored tree) are
    answered from one listing of the index, so the cost never grows with their product.
    """
    if not paths:
        return set()
    entries = _index(ws).entries(paths if len(paths) <= 64 else ())
    wanted = set(paths)
    return {e.path for e in entries if e.mode == "160000" and e.path in wanted}


def diff_trees(repo: BaseRepo, old: str, new: str) -> tuple[tuple[Change, ...], tuple[str, ...]]:
    """The paths that differ between two trees (no rename detection), and the objects
    ``new`` has that ``old`` lacks (its changed trees and blobs; the root tree first).

    One ``diff-tree -t`` answers both: the snapshot's change list, and the object count the
    operations log records, which then costs no git process of its own.
    """
    if old == new:
        return (), ()
    changes = []
    objects = [new]
    for change in repo.diff_tree(old, new, trees=True):
        if change.new_oid.strip("0") and change.new_mode != "160000":
            objects.append(change.new_oid)
        if not change.is_tree:  # a directory entry, listed by trees=True: not a changed path
            changes.append(change)
    return tuple(changes), tuple(objects)


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


def remove(ws: Workspace) -> None:
    """Delete the workspace directory and its private index (both are the plugin's own).

    The deletion never follows a symlink (see :mod:`pytest_agentgate.sandbox.removal`).
    """
    ws.end_processes()
    remove_tree(ws.path)
    if ws.private is not None:
        remove_tree(ws.private)
    ws.index.unlink(missing_ok=True)


def discard_index(ws: Workspace) -> None:
    """Drop the private index but keep the workspace's files for inspection."""
    ws.end_processes()
    ws.index.unlink(missing_ok=True)


class RecycleFailed(AgentgateError):
    """A used workspace could not be proven identical to a fresh checkout."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot recycle {path}: {reason}")


def reset_checkout(
    repo: BaseRepo,
    path: Path,
    index: Path,
    rev: str,
    *,
    current: str | None = None,
    proven: bool | None = None,
    files_since: float | None = None,
) -> bool:
    """Bring a used checkout (a workspace, a gate's) to exactly ``rev``'s tree, or raise.

    Everything untracked or ignored is removed first (a ``.pyc`` one run left must never
    run in the next tree, and a ``.gitattributes`` it left would change how git writes the
    next tree's files); ``read-tree --reset -u`` then rewrites the paths whose blob or mode
    differs and every path whose stat (ctime included) no longer matches; one more pass
    removes what is left, nested ``.git`` entries and FIFOs, and resets directory modes; and
    the result is verified as a snapshot would see it. :class:`RecycleFailed` when anything
    still differs.

    With ``files_since``, files git never compares are looked at too (see :func:`_scrub`):
    one with other permission bits, a hard link, an attribute, a time before then, keeps the
    checkout from reuse (:class:`RecycleFailed`).

    With ``current`` (the tree the checkout was last brought to), a checkout proven to hold
    exactly ``current`` (by :func:`prove_clean`: now, or already when ``proven`` says so;
    False: it was found to differ) is brought
    to ``rev`` by the paths that differ between the two trees alone (:func:`_bring_over`;
    returns True); otherwise every path is reset as above (False).
    """
    checkout = repo.index(path, index)
    if current is not None:
        if proven is None:
            proven = prove_clean(checkout, path)
            if proven is None:
                raise RecycleFailed(path, "it holds what git cannot reset")
        if proven and _bring_over(repo, checkout, path, current, rev):
            return True
    # First remove what the last run left: git reads a ``.gitattributes`` from the work
    # tree while it writes files, so one left behind would change the bytes of the next.
    for rel in checkout.differences(ignored_too=True, tracked=False).untracked:
        remove_under(path, rel.rstrip("/"))
    checkout.read_tree(rev, update=True)
    found = checkout.differences(ignored_too=True)
    # A tracked path still modified or missing after the reset means it could not be fixed.
    if found.changed:
        raise RecycleFailed(
            path, f"still differs from {rev[:12]} at {', '.join(found.changed[:5])}"
        )
    for rel in found.untracked:
        remove_under(path, rel.rstrip("/"))
    _purge_gitlinks(checkout, path)
    found_off = _scrub(path, files_since=files_since)
    if found_off is not None:  # what git cannot reset (see _scrub): not reused
        raise RecycleFailed(path, found_off)
    if checkout.write_tree() != repo.tree_of(rev):
        raise RecycleFailed(path, "its index does not hold the tree it was reset to")
    return False


def prove_clean(checkout: Index, path: Path, *, made: float | None = None) -> bool | None:
    """Whether the checkout holds exactly what its index says: True, False (a tracked file
    differs: reset every path), or None (something git cannot reset: do not reuse it).

    First everything untracked or ignored is removed, before any file is compared (a
    ``.gitattributes`` left behind would make git compare a changed file through it and call
    it unchanged), with what a submodule's directory holds and every entry git never lists
    (:func:`_scrub`, which with ``made``, when the checkout was made, also looks at what git
    never compares). Then one pass: nothing tracked may be modified or missing, by stat data
    (ctime included, which no process can set back; git reads the content of any file
    written in the same second as the index). Call it only when nothing can run in the
    checkout any more (its command's processes were all ended): what it proves then holds
    until the next write.
    """
    for rel in checkout.differences(ignored_too=True, tracked=False).untracked:
        remove_under(path, rel.rstrip("/"))
    _purge_gitlinks(checkout, path)
    if _scrub(path, files_since=made) is not None:
        return None
    found = checkout.differences(ignored_too=True)
    for rel in found.untracked:
        remove_under(path, rel.rstrip("/"))
    return not found.changed


def _bring_over(repo: BaseRepo, checkout: Index, path: Path, current: str, rev: str) -> bool:
    """Bring a checkout proven to hold ``current`` to ``rev`` by the paths that differ;
    False (nothing written) when a submodule is among them, for the full reset instead.

    Deleted files are unlinked (and directories they leave empty), the index is set to
    ``rev``'s entries at the changed paths, and git itself writes the new files from it. The
    work tree then holds ``rev`` because it held ``current`` and exactly the difference was
    written; the index's tree must equal ``rev``'s. Unlike a two-tree ``read-tree -m -u``,
    nothing stats every path a second time: on a large tree that pass was most of the cost.
    """
    changes = repo.diff_tree(current, rev)
    if any("160000" in (c.old_mode, c.new_mode) for c in changes):
        return False  # a submodule's directory: the full reset handles gitlinks
    gone = [c for c in changes if c.status == "D"]
    for change in gone:
        with contextlib.suppress(FileNotFoundError):
            remove_under(path, change.path)
    remove_empty_dirs(path, [c.path.rpartition("/")[0] for c in gone if "/" in c.path])
    checkout.stage_entries(
        [IndexEntry("0", c.old_oid, c.path) for c in gone]
        + [IndexEntry(c.new_mode, c.new_oid, c.path) for c in changes if c.status != "D"]
    )
    checkout.check_out_paths([c.path for c in changes if c.status != "D"])
    if checkout.write_tree() != repo.tree_of(rev):
        raise RecycleFailed(path, "its index does not hold the tree it was brought to")
    return True


def recycle(ws: Workspace, base: str, name: str | None = None) -> Workspace:
    """Bring a used workspace to ``base`` by rewriting only what differs, then prove it.

    ``read-tree --reset -u`` rewrites exactly the paths whose blob or mode differs from the new
    base, and every path whose stat (ctime included, so a restored mtime hides nothing) no
    longer matches; everything untracked or ignored is removed; the agent's ``.git`` is made
    anew. The result is then verified as a snapshot would see it: nothing modified, nothing
    extra, the index's tree equal to the base's. Raises :class:`RecycleFailed` otherwise.
    With ``name``, the workspace moves to a directory named for the task it now serves, so
    a kept workspace is found by its task.
    """
    repo = ws.repo
    begin = time.perf_counter()
    left = ws.end_processes()
    if left:
        raise RecycleFailed(ws.path, f"{left} of its processes could not be ended")
    try:
        remove_under(ws.path, ".git")
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RecycleFailed(ws.path, f"cannot remove the agent's .git: {exc}") from exc
    if ws.private is not None:  # the last task's /tmp and $HOME go with it
        for folder in ("tmp", "home"):
            with contextlib.suppress(FileNotFoundError):
                remove_under(ws.private, folder)
    try:
        # A hard link or a mode the last agent left would reach the next agent's work (an
        # edit of one file changing another): such a workspace is not recycled. Times stay
        # the agent's business here (tools restore them); the gate never runs in it.
        reset_checkout(repo, ws.path, ws.index, base, files_since=0.0)
        make_agent_git(repo, ws.path, ws.branch, base, ws.index, sealed=ws.objects is None)
        if name is not None:
            fresh = _new_dir(ws.path.parent, name)
            fresh.rmdir()
            ws.path.rename(fresh)
            ws.path = fresh
    except (GitError, OSError) as exc:
        raise RecycleFailed(ws.path, str(exc)) from exc
    ws.base = base
    ws.index_written = time.time()
    ws.resumed_from = None
    ws.runs.clear()
    ws.fork_ms = (time.perf_counter() - begin) * 1000
    ws.recycled += 1
    return ws


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _scrub(root: Path, *, files_since: float | None = None) -> str | None:
    """Remove what git's own listing never shows, so a recycled workspace is a fresh one.

    git skips every entry named ``.git`` at any depth and ignores FIFOs, sockets and devices,
    and a checkout leaves directory modes as it found them: an agent could leave a message
    for the next task there. One descriptor-based walk (no link followed, file types from
    the directory entries) removes such entries, gives directories the mode a fresh checkout
    gives them and drops their ACLs and user attributes (a default ACL would change the mode
    of every file git writes there next).

    With ``files_since`` (when the checkout was made), every regular file is looked at too,
    for what git never compares: permission bits beyond the owner's execute bit, a hard link
    to another file, an ACL or a user attribute, a modification time set back before the
    checkout existed. Returns what was found (the checkout must then not be reused), or None.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    mode = 0o777 & ~_umask()
    file_modes = {0o666 & ~_umask(), 0o777 & ~_umask()}
    # Depth first, one open descriptor per level: a wide tree never holds many at once.
    stack: list[tuple[str, int, list[os.DirEntry[str]]]] = []

    def enter(prefix: str, fd: int) -> None:
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)
            for name in _attributes(fd):
                os.removexattr(fd, name)
            with os.scandir(fd) as entries:
                found = list(entries)
        except BaseException:
            os.close(fd)
            raise
        stack.append((prefix, fd, found))

    enter("", os.open(root, flags))
    try:
        while stack:
            prefix, fd, found = stack[-1]
            if not found:
                os.close(fd)
                stack.pop()
                continue
            entry = found.pop()
            rel = prefix + entry.name
            if entry.name == ".git":
                remove_under(root, rel)
            elif entry.is_dir(follow_symlinks=False):
                enter(rel + "/", os.open(entry.name, flags, dir_fd=fd))
            elif not (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                remove_under(root, rel)
            elif files_since is not None and not entry.is_symlink():
                info = entry.stat(follow_symlinks=False)
                if stat.S_IMODE(info.st_mode) not in file_modes:
                    return f"{rel} has mode {stat.S_IMODE(info.st_mode):o}"
                if info.st_nlink != 1:
                    return f"{rel} is a hard link ({info.st_nlink} names)"
                if info.st_mtime < files_since:
                    return f"{rel} was given a time before the checkout was made"
                if _attributes(str(root / rel)):
                    return f"{rel} carries extended attributes"
    finally:
        for _, fd, _ in stack:
            os.close(fd)
    return None


def _attributes(target: int | str) -> list[str]:
    """The extended attributes an agent can set that change or mark a file or directory:
    ACLs and ``user.*`` (``security.*`` labels belong to the system, and stay)."""
    try:
        names = (
            os.listxattr(target, follow_symlinks=False)
            if isinstance(target, str)
            else os.listxattr(target)
        )
    except OSError:  # a filesystem without extended attributes
        return []
    return [n for n in names if n.startswith(("user.", "system.posix_acl", "trusted."))]


def _purge_gitlinks(checkout: Index, path: Path) -> None:
    """Empty every submodule's directory (a gitlink's): git never lists what is inside one,
    and a fresh checkout leaves it empty."""
    for entry in checkout.entries():
        if entry.mode == "160000":
            where = path / entry.path
            if where.is_dir() and not where.is_symlink():
                with os.scandir(where) as listing:
                    names = [child.name for child in listing]
                for name in names:
                    remove_under(path, f"{entry.path}/{name}")


def _index(ws: Workspace) -> Index:
    """The workspace's files with its private index (outside the workspace)."""
    return ws.repo.index(ws.path, ws.index)
