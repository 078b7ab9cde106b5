"""Baselines: the gate's per-test results on a base tree, computed once and kept in git.

An attempt is judged against what its base's tests did under the very same gate. That is
computed once per (tree, gate commands, interpreter, sandbox settings), under a lock so that
concurrent processes (pytest-xdist workers, other CI jobs) compute it once, and stored as a
commit under ``refs/agentgate/results/<key>`` holding ``results.json``; every attempt forked
from that tree reuses it, and so does the next run. A merged tree that passed its re-test is
stored the same way, so it is a baseline at no extra cost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from . import results
from .errors import AgentgateError
from .repo import Author, BaseRepo, TreeEntry

if TYPE_CHECKING:
    from .gate import GateContext, GateSpec
    from .sandbox import Role

PREFIX = "refs/agentgate/results/"
#: Part of every key: a change to how results are named or judged starts new baselines.
FORMAT = "results-2 (pytest node ids)"
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


_INSTALLED: tuple[str, ...] | None = None


def installed() -> tuple[str, ...]:
    """``name==version`` of every distribution in this environment, read once per process:
    an upgraded dependency makes new baselines, as a changed tree does."""
    global _INSTALLED
    if _INSTALLED is None:
        from importlib.metadata import distributions

        _INSTALLED = tuple(sorted({f"{d.metadata['Name']}=={d.version}" for d in distributions()}))
    return _INSTALLED


def load(repo: BaseRepo, name: str) -> dict[str, str] | None:
    found = repo.read_blob(f"{PREFIX}{name}:results.json")
    if found is None:
        return None
    try:
        data = json.loads(found)
    except ValueError:
        return None
    tests = data.get("tests") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in tests.items()} if isinstance(tests, dict) else None


def store(repo: BaseRepo, name: str, tree: str, tests: Mapping[str, str]) -> None:
    """Keep ``tests`` as the baseline ``name`` (first writer wins; a lost race is fine)."""
    payload = json.dumps({"tree": tree, "tests": dict(sorted(tests.items()))}, indent=1)
    blob = repo.hash_blob(payload.encode())
    holder = repo.mktree([TreeEntry("100644", "blob", blob, "results.json")])
    from .records import baseline_message

    commit = repo.commit_tree(holder, [], baseline_message(tree), _AUTHOR)
    repo.update_ref(f"{PREFIX}{name}", commit, None, "agentgate baseline")


def get_or_compute(
    repo: BaseRepo, name: str, tree: str, compute: Callable[[], Mapping[str, str] | None]
) -> dict[str, str] | None:
    """The baseline ``name``, computed by ``compute`` under its lock when nobody has yet."""
    from .locks import ref_lock

    found = load(repo, name)
    if found is not None:
        return found
    with ref_lock(repo, f"{PREFIX}{name}"):
        found = load(repo, name)
        if found is not None:
            return found
        computed = compute()
        if computed is None:
            return None
        store(repo, name, tree, computed)
        return dict(computed)


# -- the engine's view: which results an attempt is held to -----------------------------


class HarnessBroken(AgentgateError):
    """The gate cannot judge anything: it does not run on the base, or runs no test there."""

    def __init__(self, base: str, reason: str, output: str = "") -> None:
        self.base = base
        self.reason = reason
        self.output = output
        super().__init__(f"the gate cannot run on the base {base[:12]}: {reason}")


def reports(command: results.Command, spec: GateSpec) -> bool:
    """Whether a gate command reports per-test results (a pytest run, or a results file)."""
    argv = results.argv_of(command)
    return spec.results_file is not None or (argv is not None and results.is_pytest(argv))


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
        self, repo: BaseRepo, context: Callable[[], GateContext], sandbox_label: str, role: Role
    ) -> None:
        self.repo = repo
        self.context = context
        self.sandbox_label = sandbox_label
        self.role = role
        self._known: dict[str, dict[str, str]] = {}

    def key(self, tree: str, spec: GateSpec) -> str:
        from .gate import environment_plugins

        named = [f"{n}={os.environ.get(n, '')}" for n in self.role.env_names]  # values hashed
        return key(
            tree,
            spec.commands,
            spec.results_file,
            [self.sandbox_label, str(self.role.network), *named, *environment_plugins(),
             *installed()],
        )  # fmt: skip

    def of_commit(self, base: str, spec: GateSpec) -> dict[str, str] | None:
        """The gate's per-test results on ``base``'s tree: from git, or computed once now.

        None when the gate reports no per-test results (no pytest command, no results file).
        Raises :class:`HarnessBroken` when the gate cannot run on the base at all, or runs no
        test there: no attempt can be judged against that.
        """
        if not spec.commands or not any(reports(c, spec) for c in spec.commands):
            return None
        return self.of_tree(self.repo.tree_of(base), base, spec)

    def of_tree(self, tree: str, base: str, spec: GateSpec) -> dict[str, str] | None:
        name = self.key(tree, spec)
        found = self._known.get(name)
        if found is not None:
            return found

        def compute() -> dict[str, str] | None:
            from .gate import run_commands

            run = run_commands(self.repo, tree, spec, self.context(), "baseline", collect=True)
            if not run.ok:
                raise HarnessBroken(base, run.message, run.output)
            if not run.tests:
                raise HarnessBroken(base, "the gate ran no test on the base", run.output)
            return dict(run.tests)

        found = get_or_compute(self.repo, name, tree, compute)
        if found is not None:
            self._known[name] = found
        return found

    def of_tip(self, tip: str, spec: GateSpec) -> dict[str, str] | None:
        """The results of a target's tip: stored by the landing that made it, else now."""
        if not any(reports(c, spec) for c in spec.commands):
            return None
        try:
            return self.of_tree(self.repo.tree_of(tip), tip, spec)
        except HarnessBroken:
            return None  # the tip cannot run this gate (a graded command): the base decides

    def keep(self, tree: str, spec: GateSpec, tests: Mapping[str, str]) -> None:
        """Store results a passing gate already produced as ``tree``'s baseline (best effort)."""
        with contextlib.suppress(AgentgateError, OSError):
            store(self.repo, self.key(tree, spec), tree, tests)
