"""Baselines: the gate's per-test results on a base tree, computed once and kept in git.

An attempt is judged against what its base's tests did under the very same gate. That is
computed once per (tree, gate commands, interpreter, sandbox settings), under a lock so that
concurrent processes (pytest-xdist workers, other CI jobs) compute it once, and stored as a
commit under ``refs/agentgate/results/<key>`` holding ``results.json``; every attempt forked
from that tree reuses it, and so does the next run. A merged tree that passed its re-test is
stored the same way, so it is a baseline at no extra cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from .repo import Author, BaseRepo

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
    found = repo.git("cat-file", "blob", f"{PREFIX}{name}:results.json", ok=(0, 128))
    if found.returncode != 0:
        return None
    try:
        data = json.loads(found.stdout)
    except ValueError:
        return None
    tests = data.get("tests") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in tests.items()} if isinstance(tests, dict) else None


def store(repo: BaseRepo, name: str, tree: str, tests: Mapping[str, str]) -> None:
    """Keep ``tests`` as the baseline ``name`` (first writer wins; a lost race is fine)."""
    payload = json.dumps({"tree": tree, "tests": dict(sorted(tests.items()))}, indent=1)
    blob = repo.git("hash-object", "-w", "--stdin", input=payload.encode()).out.strip()
    holder = repo.git("mktree", input=f"100644 blob {blob}\tresults.json\n".encode()).out.strip()
    commit = repo.commit_tree(holder, [], f"agentgate baseline of tree {tree}\n", _AUTHOR)
    repo.update_ref(f"{PREFIX}{name}", commit, None, "agentgate baseline")


def get_or_compute(
    repo: BaseRepo, name: str, tree: str, compute: Callable[[], Mapping[str, str] | None]
) -> dict[str, str] | None:
    """The baseline ``name``, computed by ``compute`` under its lock when nobody has yet."""
    from .promote import target_lock

    found = load(repo, name)
    if found is not None:
        return found
    with target_lock(repo, f"{PREFIX}{name}"):
        found = load(repo, name)
        if found is not None:
            return found
        computed = compute()
        if computed is None:
            return None
        store(repo, name, tree, computed)
        return dict(computed)
