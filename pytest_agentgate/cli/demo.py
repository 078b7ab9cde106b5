"""``agentgate demo``: the whole idea in one command, with real git and the real plugin.

It builds a throwaway repository holding a small inventory service and its tests, then lets
two scripted agents work on it through pytest: one refactor that misses a file (rejected,
its attempt kept), one feature that passes (promoted). Then it rolls the target back to the
first commit and shows that the tree id is the same, and prints the operations log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..git.repo import BaseRepo

SERVICE = {
    "inventory/__init__.py": "",
    "inventory/store.py": '''
        class Store:
            """Quantities on hand, by item name."""

            def __init__(self):
                self._items = {}

            def add_item(self, name, qty):
                self._items[name] = self._items.get(name, 0) + qty

            def quantity_of(self, name):
                return self._items.get(name, 0)
        ''',
    "inventory/report.py": """
        def low_stock(store, names, threshold=2):
            return [n for n in names if store.quantity_of(n) < threshold]
        """,
    "inventory/api.py": """
        from inventory.store import Store


        def receive(lines):
            store = Store()
            for name, qty in lines:
                store.add_item(name, qty)
            return {name: store.quantity_of(name) for name, _ in lines}
        """,
    "tests/test_inventory.py": """
        from inventory.api import receive
        from inventory.report import low_stock
        from inventory.store import Store


        def test_receive():
            assert receive([("bolt", 3), ("nut", 1)]) == {"bolt": 3, "nut": 1}


        def test_low_stock():
            store = Store()
            store.add_item("bolt", 5)
            assert low_stock(store, ["bolt", "nut"]) == ["nut"]
        """,
    ".gitignore": "__pycache__/\n.pytest_cache/\n",
}

AGENTS = '''
import pytest


@pytest.mark.gated(task="Rename Store.quantity_of to Store.qty", agent="refactor-bot")
def test_rename_refactor(agent_workspace):
    # The agent updates the class and one caller, and never opens inventory/api.py.
    for rel in ("inventory/store.py", "inventory/report.py"):
        path = agent_workspace.path / rel
        path.write_text(path.read_text().replace("quantity_of", "qty"))


@pytest.mark.gated(task="Add Store.total()", agent="feature-bot")
def test_add_total(agent_workspace):
    store = agent_workspace.path / "inventory" / "store.py"
    store.write_text(store.read_text() + """
    def total(self):
        return sum(self._items.values())
""")
    tests = agent_workspace.path / "tests" / "test_total.py"
    tests.write_text("""from inventory.store import Store


def test_total():
    store = Store()
    store.add_item("bolt", 2)
    store.add_item("nut", 3)
    assert store.total() == 5
""")
'''


class StoryBroken(Exception):
    """The demo's story did not hold; the message says which step."""


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def _agentgate(*args: str) -> int:
    """Run the ``agentgate`` command as a person would: a process of its own (what it prints
    is passed on)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


@contextmanager
def _step(title: str) -> Iterator[None]:
    begin = time.perf_counter()
    print(f"\n== {title}", flush=True)
    yield
    print(f"   ({(time.perf_counter() - begin) * 1000:.0f} ms)", flush=True)


def _pytest(root: Path, repo: Path, test: str, report: Path) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
        f"agents/test_agents.py::{test}",
        f"--agentgate-repo={repo}", "--agentgate-target=main",
        f"--agentgate-gate={sys.executable} -m pytest -q -p no:cacheprovider tests",
        "--agentgate-promote", f"--agentgate-report={report}",
        f"--agentgate-workdir={root / 'work'}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    keep = [
        line for line in lines if line.startswith(("PROMOTED", "REJECTED", "E   ", "agentgate"))
    ]
    for line in keep[:12]:
        print(f"   | {line}")
    return proc.returncode


def _verdict(report: Path) -> dict[str, object]:
    data = json.loads(report.read_text(encoding="utf-8"))
    if len(data["attempts"]) != 1:
        raise StoryBroken(f"expected one attempt in {report}, found {len(data['attempts'])}")
    row: dict[str, object] = data["attempts"][0]
    return row


def _service(root: Path, repo: Path) -> tuple[BaseRepo, str]:
    """A new repository at ``repo`` whose ``main`` holds the service, committed by a person;
    the agents' tests beside it, outside the repository."""
    from ..git.repo import Author, init

    repo.mkdir(parents=True)
    base = init(repo, "main")
    _write(repo, SERVICE)
    _write(root, {"agents/test_agents.py": AGENTS})
    index = base.checkout_index()
    index.stage_all()
    person = Author("A. Person", "person@example.invalid")
    first = base.commit_tree(index.write_tree(), [], "inventory service\n", person)
    base.refs.update("refs/heads/main", first, None, "commit (initial): inventory service")
    return base, first


def play(root: Path, say: Callable[[str], None] = print) -> None:
    """Play the story in ``root``; raise :class:`StoryBroken` where it does not hold."""
    from ..errors import GitError
    from ..git.worktree import dirty_paths
    from ..store import oplog

    repo = root / "service"
    with _step("1. a throwaway repository with a working service and its tests"):
        base, first = _service(root, repo)
        say(f"   main = {first[:12]}, tree {base.tree_of(first)}")

    with _step("2. refactor-bot renames a method and misses inventory/api.py"):
        code = _pytest(root, repo, "test_rename_refactor", root / "report-1.json")
        row = _verdict(root / "report-1.json")
        if code != 1 or row["verdict"] != "rejected":
            raise StoryBroken(f"the broken refactor was not rejected: {row['verdict']}")
        if base.refs.value("refs/heads/main") != first:
            raise StoryBroken("main moved after a rejected attempt")
        say(f"   rejected; main still {first[:12]}; attempt kept at {row['attempt_ref']}")
        say(f"   containment: {_containment(row)}")

    with _step("3. feature-bot adds Store.total() with a test"):
        code = _pytest(root, repo, "test_add_total", root / "report-2.json")
        row = _verdict(root / "report-2.json")
        if code != 0 or row["verdict"] != "promoted":
            raise StoryBroken(f"the good change was not promoted: {row['verdict']} {row['reason']}")
        promoted = base.history.resolve_commit("refs/heads/main")
        if dirty_paths(base):
            raise StoryBroken("the checked-out main has uncommitted changes after promotion")
        say(f"   promoted; main {first[:12]} -> {promoted[:12]} (checked-out files updated)")

    with _step("4. roll main back to the first commit"):
        rolled = _agentgate(
            "rollback", "--repo", str(repo), "--to", first, "--expect", promoted, "--agent", "demo"
        )
        if rolled != 0:
            raise StoryBroken("the rollback failed")
        before, after = (
            base.tree_of(first),
            base.tree_of(base.history.resolve_commit("refs/heads/main")),
        )
        if before != after:
            raise StoryBroken(f"rollback gave tree {after}, not {before}")
        if not base.history.is_ancestor(promoted, "refs/heads/main"):
            raise StoryBroken("the rollback rewrote history")
        say(f"   trees equal: {before} == {after}; the promoted commit is still in history")

    with _step("5. what is left to read"):
        sys.stdout.flush()
        _agentgate("attempts", "--repo", str(repo))
        print(flush=True)
        _agentgate("log", "--repo", str(repo))
        try:
            base.place.fsck()
        except GitError as exc:
            raise StoryBroken(f"git fsck --strict found problems: {exc}") from exc
        records = list(oplog.read(repo / ".git"))
        if {r.op for r in records} < {"attempt", "promote", "rollback"}:
            raise StoryBroken("the operations log is missing records")
        say("   git fsck --strict: clean")


def _containment(row: dict[str, object]) -> str:
    """What the agents' commands and the gates ran under, as the attempt's record says."""
    label = str(row.get("sandbox") or "none (not recorded)")
    if label == "bwrap":
        return "bwrap (a sandbox: read-only system, only the workspace writable, no network)"
    return f"{label}: uncontained"


def run_demo(keep: Path | None = None) -> int:
    """Run the story; 0 when it held, 1 when it did not."""
    begin = time.perf_counter()
    if keep is not None:
        keep = keep.resolve()
        if keep.exists() and any(keep.iterdir()):
            print(
                f"agentgate demo: error: {keep} is not empty; name a new or empty directory",
                file=sys.stderr,
            )
            return 2
        keep.mkdir(parents=True, exist_ok=True)
        root = keep
    else:
        root = Path(tempfile.mkdtemp(prefix="agentgate-demo-"))
    try:
        play(root)
    except StoryBroken as exc:
        print(f"\nagentgate demo: the story did not hold: {exc}", file=sys.stderr)
        return 1
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    total = (time.perf_counter() - begin) * 1000
    print(f"\nthe story held in {total:.0f} ms" + (f"; kept in {root}" if keep else ""))
    return 0
