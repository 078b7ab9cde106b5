"""Baselines: the gate's per-test results on a base tree, computed once and kept in git.

An attempt is judged against what its base's tests did under the very same gate. That is
computed once per (tree, gate commands and what they are given, interpreter, sandbox
settings), under a lock so that concurrent processes (pytest-xdist workers, other CI jobs)
compute it once, and stored as a commit under ``refs/agentgate/results/<key>`` holding
``results.json``; every attempt forked from that tree reuses it, and so does the next run. A
merged tree that passed its re-test is stored the same way, so it is a baseline at no extra
cost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import AgentgateError
from ..git.repo import Author, BaseRepo, TreeEntry
from ..sandbox.containment import command_env
from . import results

if TYPE_CHECKING:
    from ..sandbox.containment import Role, Sandbox
    from .gate import CheckResult, GateContext, GateSpec

PREFIX = "refs/agentgate/results/"
#: Part of every key: a change to how results are named or judged starts new baselines.
FORMAT = "results-4 (the collector's node ids, fingerprints, base tests apart)"
_AUTHOR = Author("agentgate", "agentgate@localhost")


def key(
    tree: str, commands: Sequence[object], results_file: str | None, context: Sequence[str]
) -> str:
    """What the results depend on, hashed: the tree, the gate, the interpreter, the sandbox."""
    material = json.dumps(
        [FORMAT, tree, list(commands), results_file, os.path.realpath(sys.executable),
         sys.version, list(context)]
    )  # fmt: skip
    return hashlib.sha256(material.encode()).hexdigest()[:40]


def installed() -> tuple[str, ...]:
    """``name==version`` of every distribution in this environment, read once per process:
    an upgraded dependency makes new baselines, as a changed tree does."""
    from . import environment

    return environment.versions()


@dataclass(frozen=True)
class Stored:
    """A baseline as kept: per-test results (None: no command reported any), what the
    gate's pytest loaded (see :meth:`.channel.Report.fingerprint`), and the commands from
    which no results came back (judged by exit code)."""

    tests: dict[str, str] | None
    fingerprint: frozenset[str] = frozenset()
    by_exit_code: tuple[str, ...] = ()


def load(repo: BaseRepo, name: str) -> Stored | None:
    """The baseline ``name`` as stored, or None when there is none (or it cannot be read)."""
    found = repo.read_blob(f"{PREFIX}{name}:results.json")
    if found is None:
        return None
    try:
        data = json.loads(found)
    except ValueError:
        return None
    if not isinstance(data, dict) or "tests" not in data:
        return None
    tests = data["tests"]
    if tests is not None and not isinstance(tests, dict):
        return None
    return Stored(
        {str(k): str(v) for k, v in tests.items()} if tests is not None else None,
        frozenset(str(e) for e in data.get("fingerprint") or ()),
        tuple(str(c) for c in data.get("by_exit_code") or ()),
    )


def store(repo: BaseRepo, name: str, tree: str, found: Stored) -> None:
    """Keep ``found`` as the baseline ``name`` (first writer wins; a lost race is fine)."""
    payload = json.dumps(
        {
            "tree": tree,
            "tests": dict(sorted(found.tests.items())) if found.tests is not None else None,
            "fingerprint": sorted(found.fingerprint),
            "by_exit_code": list(found.by_exit_code),
        },
        indent=1,
    )
    blob = repo.hash_blob(payload.encode())
    holder = repo.mktree([TreeEntry("100644", "blob", blob, "results.json")])
    from ..store.records import baseline_message

    commit = repo.commit_tree(holder, [], baseline_message(tree), _AUTHOR)
    repo.refs.update(f"{PREFIX}{name}", commit, None, "agentgate baseline")


def get_or_compute(repo: BaseRepo, name: str, tree: str, compute: Callable[[], Stored]) -> Stored:
    """The baseline ``name``, computed by ``compute`` under its lock when nobody has yet."""
    from ..store.locks import ref_lock

    found = load(repo, name)
    if found is not None:
        return found
    with ref_lock(repo, f"{PREFIX}{name}"):
        found = load(repo, name)
        if found is not None:
            return found
        computed = compute()
        store(repo, name, tree, computed)
        return computed


# -- the engine's view: which results an attempt is held to -----------------------------


class HarnessBroken(AgentgateError):
    """The gate cannot judge anything: it does not run on the base, or runs no test there."""

    def __init__(self, base: str, reason: str, output: str = "") -> None:
        self.base = base
        self.reason = reason
        self.output = output
        super().__init__(f"the gate cannot run on the base {base[:12]}: {reason}")


def _keyed(name: str) -> bool:
    """Whether the value of ``name``, a variable every command is passed, may change the
    results: a terminal's name does not; the plugin's own settings are the run's, not the
    tests'; a hash seed tox draws anew for each run would make every run compute its
    baselines again, for tests whose outcome the seed decides (flaky ones)."""
    return name not in _UNKEYED and not name.startswith("AGENTGATE_")


#: Passed to every command, and no part of the key (see :func:`_keyed`).
_UNKEYED = frozenset({"TERM", "PYTHONHASHSEED"})


def judged_by_results(spec: GateSpec) -> bool:
    """Whether any command of the gate may report per-test results (not every one was
    declared to be judged by its exit code)."""
    return any(not spec.by_exit_code(c) for c in spec.commands)


def either_passed(
    base: Mapping[str, str] | None, tip: Mapping[str, str] | None
) -> dict[str, str] | None:
    """One baseline from two: a test is required when it passed on either."""
    if base is None or tip is None:
        return dict(base) if base is not None else (dict(tip) if tip is not None else None)
    merged = {**tip, **base}
    for test in set(base) | set(tip):
        if results.PASSED in (base.get(test), tip.get(test)):
            merged[test] = results.PASSED
    return merged


class Baselines:
    """The baselines of one run: keyed by everything the results depend on, cached in the
    process, kept in git, computed in the sandbox the gate runs in."""

    def __init__(
        self, repo: BaseRepo, context: Callable[[], GateContext], sandbox: Sandbox, role: Role
    ) -> None:
        self.repo = repo
        self.context = context
        self.sandbox = sandbox
        self.role = role
        self._known: dict[str, Stored] = {}
        #: Told before the base's results are computed (not found kept): the first gate of
        #: a run on a new base costs a whole run of the base more, and a person should
        #: know why it is slow. Called with a sentence.
        self.on_compute: Callable[[str], None] | None = None

    def key(self, tree: str, spec: GateSpec) -> str:
        from .environment import plugins as environment_plugins

        named = [f"{n}={os.environ.get(n, '')}" for n in self.role.env_names]  # values hashed
        # And the variables every command is passed from this process (which python, tox or
        # node PATH finds, the locale, the time zone), but the plugin's own settings.
        passed = command_env(os.environ, ())
        named += [f"{n}={v}" for n, v in sorted(passed.items()) if _keyed(n)]
        # What the sandbox lets the commands see and use beyond its mode.
        settings = self.sandbox.settings
        seen = [
            *(f"bind {b.path}:{b.writable}" for b in settings.binds),
            *(f"read {p}" for p in settings.reads),
            f"pids {settings.pids_max}", f"file bytes {settings.file_bytes}",
        ]  # fmt: skip
        # What the commands are given, and how often a failing one runs again (a flaky test
        # of the base), make other results.
        given: list[tuple[str, ...]] = [("env", k, v) for k, v in sorted(spec.env.items())]
        given += [("rerun", str(spec.rerun))] if spec.rerun else []
        given += [("exit-code", str(c)) for c in spec.exit_code]
        given += [("results", spec.results_mode)] if spec.results_mode != "tests" else []
        return key(
            tree,
            [
                *spec.commands, *(("setup", s) for s in spec.setup),
                *(("select", s) for s in spec.select or ()), *(("skip", s) for s in spec.skip),
                *given,
            ],
            spec.results_file,
            [self.sandbox.label, *seen, str(self.role.network), *named,
             *environment_plugins(), *installed(), *self._editable_states()],
        )  # fmt: skip

    def _editable_states(self) -> list[str]:
        """The state of each editable install's files outside the repository (the tree
        covers those inside it): an edit there changes no version, yet may change results."""
        from . import environment

        worktree = self.repo.place.worktree
        inside = Path(os.path.realpath(worktree)) if worktree is not None else None
        states = []
        for project in environment.editable_projects():
            if inside is not None and (
                project.is_relative_to(inside) or inside.is_relative_to(project)
            ):
                continue
            states.append(f"editable {project} {environment.project_state(project)}")
        return states

    def of_commit(self, base: str, spec: GateSpec) -> dict[str, str] | None:
        """The gate's per-test results on ``base``'s tree: from git, or computed once now.

        None when the gate reports no per-test results. Raises :class:`HarnessBroken` when
        the gate cannot run on the base at all, or runs no test there: no attempt can be
        judged against that.
        """
        found = self.stored_of_commit(base, spec)
        return found.tests if found is not None else None

    def stored_of_commit(self, base: str, spec: GateSpec) -> Stored | None:
        """The whole baseline of ``base``'s tree (None: the gate is judged by exit code)."""
        if not spec.commands or not judged_by_results(spec):
            return None
        return self.of_tree(self.repo.tree_of(base), base, spec)

    def of_tree(self, tree: str, base: str, spec: GateSpec) -> Stored:
        name = self.key(tree, spec)
        found = self._known.get(name)
        if found is not None:
            return found

        def compute() -> Stored:
            from .gate import Judging, run_commands

            if self.on_compute is not None:
                shown = "; ".join(str(c) for c in spec.commands)
                self.on_compute(
                    f"computing the base's results once ({base[:12]}, tree {tree[:12]}): "
                    f"{shown}; every attempt on this tree reuses them"
                )
            # The base is landed: its own bytes are the trusted ones.
            how = Judging("baseline", collect=True, trusted=tree)
            run = run_commands(self.repo, tree, spec, self.context(), how)
            if not run.ok:
                raise HarnessBroken(base, run.message, run.output)
            if run.tests is not None and not run.tests:
                raise HarnessBroken(base, "the gate ran no test on the base", run.output)
            return Stored(
                dict(run.tests) if run.tests is not None else None,
                run.fingerprint,
                run.by_exit_code,
            )

        found = get_or_compute(self.repo, name, tree, compute)
        self._known[name] = found
        return found

    def of_tip(self, tip: str, spec: GateSpec) -> Stored | None:
        """The baseline of a target's tip: stored by the landing that made it, else now."""
        if not judged_by_results(spec):
            return None
        try:
            return self.of_tree(self.repo.tree_of(tip), tip, spec)
        except HarnessBroken:
            return None  # the tip cannot run this gate (a graded command): the base decides

    def keep(self, tree: str, spec: GateSpec, run: CheckResult) -> None:
        """Store what a passing gate run already produced as ``tree``'s baseline (best
        effort). Not a run in which a test failed and then passed: it was judged as the
        flaky policy says, where a baseline's run names such a test flaky."""
        if run.tests is None or run.flaky:
            return
        found = Stored(dict(run.tests), run.fingerprint, run.by_exit_code)
        with contextlib.suppress(AgentgateError, OSError):
            store(self.repo, self.key(tree, spec), tree, found)
