"""A recycled workspace is indistinguishable from a fresh checkout of the next base."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from helpers import git, land

from pytest_agentgate import Engine, GateSpec
from pytest_agentgate.workspace.fork import fork
from pytest_agentgate.workspace.recycle import RecycleFailed, prove_clean, recycle
from pytest_agentgate.workspace.snapshot import snapshot


def describe(root: Path) -> dict[str, tuple[str, object]]:
    """Every path below ``root`` (but .git) with its type, mode and content or target."""
    found: dict[str, tuple[str, object]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (dirpath == str(root) and d == ".git")]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", oct(info.st_mode & 0o777))
            elif not stat.S_ISREG(info.st_mode):
                found[rel] = ("special", oct(info.st_mode))  # never opened: a FIFO blocks
            else:
                found[rel] = (oct(info.st_mode & 0o777), path.read_bytes())
    return found


def hostile_agent(path: Path) -> None:
    """Creates, deletes, chmods, symlinks, ignores, and rewrites a file keeping size and mtime."""
    (path / "new_dir" / "deep").mkdir(parents=True)
    (path / "new_dir" / "deep" / "file.txt").write_text("new")
    (path / "ledger" / "report.py").unlink()
    (path / "ledger" / "api.py").chmod(0o755)
    os.symlink("ledger/store.py", path / "link.py")
    (path / "ledger" / "__pycache__").mkdir()
    (path / "ledger" / "__pycache__" / "junk.pyc").write_bytes(b"\0junk")
    (path / ".env").write_text("SECRET=1")
    (path / "empty-dir").mkdir()
    target = path / "ledger" / "store.py"
    before = target.stat()
    data = target.read_bytes()
    target.write_bytes(data.replace(b"_rows", b"_ROWS"))  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime


@pytest.mark.parametrize("snapshot_first", [True, False])
def test_recycled_equals_fresh(service: Path, tmp_path: Path, snapshot_first: bool) -> None:
    from pytest_agentgate import BaseRepo

    repo = BaseRepo.open(service)
    base = git(service, "rev-parse", "main")
    ws = fork(repo, base, "main", tmp_path / "pool")
    hostile_agent(ws.path)
    if snapshot_first:
        snapshot(ws)
    # The base moves on meanwhile: recycling must follow it too.
    land(service, {"ledger/extra.py": "X = 1\n", "tests/test_ledger.py": None}, task="move base")
    new_base = git(service, "rev-parse", "main")
    recycled = recycle(ws, new_base)
    fresh = fork(repo, new_base, "main", tmp_path / "fresh")
    assert describe(recycled.path) == describe(fresh.path)
    assert recycled.base == new_base and recycled.recycled == 1
    # The agent-facing .git is new: clean, on the branch, at the new base.
    assert git(recycled.path, "status", "--porcelain") == ""
    assert git(recycled.path, "rev-parse", "HEAD") == new_base
    # And a snapshot of it holds exactly the base tree.
    assert snapshot(recycled).tree == git(service, "rev-parse", "main^{tree}")


def test_a_recycled_workspace_keeps_nothing_of_the_task_it_served(
    service: Path, tmp_path: Path
) -> None:
    """A workspace handed back (``Engine.release``) and forked again serves another task:
    the last task's notes, refusals, transcripts, tries, feedback and declared state must
    not reach the next one's record or sandbox (a retry of the same task keeps its own)."""
    from pytest_agentgate.workspace.reuse import ReuseCosts

    engine = Engine.open(
        service, "main", promote=False, workdir=tmp_path / "work",
        gate=GateSpec(outcome_is_enough=True),
    )  # fmt: skip
    for _ in range(ReuseCosts.KEEP):  # recycling pays here: a workspace handed back is kept
        engine.pool._costs.note("fresh", 50.0)
        engine.pool._costs.note("recycled", 0.5)
    fresh = engine.fork(task="the next task")
    ws = engine.fork(task="the last task")
    ws.agent, ws.attempt, ws.agent_timeout, ws.on_step = "agent-a", 3, 60.0, print
    ws.note(tokens=1200)
    ws.refused.append("example.com:443")
    ws.refused_count, ws.network_strict = 1, True
    ws.transcripts.append((b"steps", 5))
    ws.checkpoints.append("refs/agentgate/checkpoints/x")
    ws.history.append({"attempt": 1, "verdict": "rejected"})
    ws.feedback = tmp_path / "feedback.md"
    ws.state_binds, ws.state_declared = (tmp_path / "state.db",), ("state.db",)
    engine.release(ws)
    recycled = engine.fork(task="the next task")
    assert recycled is ws and recycled.recycled == 1
    for name in (
        "task", "agent", "attempt", "notes", "refused", "refused_count", "network_strict",
        "transcripts", "checkpoints", "history", "feedback", "state_binds", "state_declared",
        "state_base", "agent_command", "agent_timeout", "on_step",
    ):  # fmt: skip
        assert getattr(recycled, name) == getattr(fresh, name), name
    engine.close()


def test_recycle_refuses_what_it_cannot_prove(service: Path, tmp_path: Path) -> None:
    from pytest_agentgate import BaseRepo

    repo = BaseRepo.open(service)
    base = git(service, "rev-parse", "main")
    ws = fork(repo, base, "main", tmp_path / "pool")
    ws.index.write_bytes(b"not an index")  # the private index is damaged
    with pytest.raises(RecycleFailed, match="cannot recycle"):
        recycle(ws, base)


def test_engine_recycles_promoted_workspaces_and_falls_back(service: Path, tmp_path: Path) -> None:
    engine = Engine.open(
        service,
        "main",
        promote=True,
        workdir=tmp_path / "work",
        gate=GateSpec(outcome_is_enough=True),
    )
    for _ in range(5):  # recycling pays here, whatever this machine's disk costs
        engine.pool._costs.note("fresh", 1e6)
    ws = engine.fork(task="one")
    (ws.path / "one.txt").write_text("1")
    assert engine.run_attempt(ws, task="one").verdict.status == "promoted"
    engine.release(ws)
    again = engine.fork(task="two")
    assert again is ws and again.recycled == 1 and again.path.name.startswith("two-")
    assert (again.path / "one.txt").read_text() == "1"  # it follows the target that moved
    assert again.base == git(service, "rev-parse", "main")
    (again.path / "two.txt").write_text("2")
    assert engine.run_attempt(again, task="two").verdict.status == "promoted"
    engine.release(again)
    # Sabotage the pooled workspace beyond repair: a fresh fork replaces it.
    import shutil

    shutil.rmtree(again.path)
    third = engine.fork(task="three")
    assert third.path != again.path and third.recycled == 0
    engine.close()


def test_fresh_workspaces_option(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(
        test_agents="""
        import pytest

        RECYCLED = []

        @pytest.mark.parametrize("n", range(3))
        @pytest.mark.gated(task="write", gate=[])
        def test_write(agent_workspace, n):
            RECYCLED.append(agent_workspace.recycled)
            (agent_workspace.path / f"f{n}-{FRESH}.txt").write_text(str(n))

        def test_zz_paths():
            # Recycling on, the second fork recycles the first's workspace; whether the
            # third does depends on what that cost here against a fresh fork.
            assert RECYCLED == [0, 0, 0] if FRESH else RECYCLED[:2] == [0, 1]
        """
    )
    for fresh in (False, True):
        pytester.makeconftest(f"import test_agents\ntest_agents.FRESH = {fresh}\n")
        args = ["--agentgate-fresh-workspaces"] if fresh else []
        result = pytester.runpytest(
            f"--agentgate-repo={service}", "--agentgate-promote", "-p", "no:randomly", *args
        )
        result.assert_outcomes(passed=4)


def _commit_files(service: Path, files: dict[str, str | None], message: str) -> str:
    """Commit ``files`` (None: delete; a value starting with "->": a symlink to the rest)."""
    for rel, content in files.items():
        path = service / rel
        if content is None:
            git(service, "rm", "-rq", "--", rel)
            continue
        if path.is_dir() and not path.is_symlink():
            git(service, "rm", "-rq", "--", rel)
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_symlink() or path.exists():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        if content.startswith("->"):
            os.symlink(content[2:], path)
        else:
            path.write_text(content)
            if rel.endswith(".sh"):
                path.chmod(0o755)
    git(service, "add", "-A")
    git(service, "commit", "-qm", message)
    return git(service, "rev-parse", "HEAD^{tree}")


@pytest.mark.parametrize("gate_left", ["nothing", "untracked", "an edit"])
def test_a_kept_gate_checkout_brought_to_the_next_tree_equals_a_fresh_one(
    service: Path, tmp_path: Path, gate_left: str
) -> None:
    """A kept gate checkout is brought to the next tree by the paths that differ: a file that
    becomes a directory, a directory that becomes a file, a directory left empty, a file that becomes a link, a mode
    that changes. Each step must equal a fresh checkout of that tree, also after a gate that
    left untracked things (bytecode, a FIFO, a nested ``.git``, a directory's mode) or an
    edit of the same size and time (then the checkout is reset whole instead)."""
    from pytest_agentgate import BaseRepo
    from pytest_agentgate.workspace.checkouts import GateCheckouts

    repo = BaseRepo.open(service)
    trees = [git(service, "rev-parse", "HEAD^{tree}")]
    trees.append(
        _commit_files(
            service,
            {
                "ledger/report.py": None,
                "ledger/report.py/inner.txt": "now a directory\n",
                "deep/a/b/only.txt": "alone\n",
                "run.sh": "#!/bin/sh\necho hi\n",
                "alias.py": "->ledger/store.py",
            },
            "shapes",
        )
    )
    trees.append(
        _commit_files(
            service,
            {
                "deep/a/b/only.txt": None,
                "alias.py": "a file, not a link\n",
                "ledger": "a file where a package was\n",
            },
            "shapes back",
        )
    )
    kept = GateCheckouts(repo, tmp_path / "kept")
    fresh_root = tmp_path / "fresh"
    order = [0, 1, 2, 0, 2, 1]
    path = None
    for n, step in enumerate(order):
        with kept.checkout(trees[step], "gate") as reused:
            assert path in (None, reused)
            path = reused
            if n:
                with GateCheckouts(repo, fresh_root).checkout(trees[step], "fresh") as fresh:
                    assert describe(reused) == describe(fresh), f"tree {step}"
            # What the gate's command leaves, while it runs (nothing runs after it).
            if gate_left == "untracked":
                (reused / "left.pyc").write_bytes(b"\0")
                os.mkfifo(reused / "tests" / "pipe")
                (reused / "tests" / ".git").mkdir()
                (reused / "tests" / ".git" / "config").write_text("[core]\n")
                (reused / "tests").chmod(0o777)
            if gate_left == "an edit":
                target = reused / "tests" / "test_ledger.py"
                before = target.stat()
                data = target.read_bytes()
                target.write_bytes(data[::-1])  # the same size
                os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert kept.reused == len(order) - 1
    if gate_left == "an edit":
        assert kept.brought_over == 0  # an edit found: reset whole, every time
    else:
        assert kept.brought_over == kept.reused  # the fast way, every time
    kept.close()


@pytest.mark.parametrize("where", [".gitattributes", "ledger/.gitattributes"])
@pytest.mark.parametrize("gate_left", ["nothing", "an edit"])
def test_a_checkout_is_never_brought_over_a_change_of_its_attributes(
    service: Path, tmp_path: Path, where: str, gate_left: str
) -> None:
    """git writes a file's bytes through the ``.gitattributes`` it holds then (``eol``,
    filters), and never writes again a file whose blob did not change: a kept checkout (or a
    recycled workspace) brought to a tree whose attributes differ would keep the old bytes
    of every unchanged file, where a fresh checkout holds the new ones. A gate reading them
    could then pass or fail for which checkout it was given."""
    from pytest_agentgate import BaseRepo
    from pytest_agentgate.workspace.checkouts import GateCheckouts

    repo = BaseRepo.open(service)
    trees = [git(service, "rev-parse", "HEAD^{tree}")]
    first = git(service, "rev-parse", "HEAD")
    trees.append(_commit_files(service, {where: "*.py eol=crlf\n"}, "CRLF for Python files"))
    kept = GateCheckouts(repo, tmp_path / "kept")
    for n, step in enumerate([0, 1, 0]):
        with kept.checkout(trees[step], "gate") as reused:
            with GateCheckouts(repo, tmp_path / f"fresh{n}").checkout(trees[step], "f") as fresh:
                assert describe(reused) == describe(fresh), f"tree {step}"
            if gate_left == "an edit":  # then the checkout is reset whole, not brought over
                target = reused / "ledger" / "store.py"
                before = target.stat()
                target.write_bytes(target.read_bytes()[::-1])  # the same size and time
                os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    kept.close()
    ws = fork(repo, first, "main", tmp_path / "pool")
    if gate_left == "an edit":
        (ws.path / "ledger" / "api.py").write_text("# edited by the agent\n")
    new_base = git(service, "rev-parse", "main")
    try:
        recycled = recycle(ws, new_base)
    except RecycleFailed:
        return  # not reused: the pool forks afresh
    assert describe(recycled.path) == describe(fork(repo, new_base, "main", tmp_path / "new").path)


@pytest.mark.parametrize("left", ["a hard link", "a mode git does not keep"])
def test_a_workspace_left_with_what_git_never_compares_does_not_pass_it_on(
    service: Path, tmp_path: Path, left: str
) -> None:
    """A promoted agent leaves two tracked files hard-linked (or one 0600): invisible to
    git, so its attempt lands. The next agent's workspace must not inherit it: either it is
    a fresh fork, or git rewrote the file while resetting (it does for a file whose stat
    data it cannot trust, which depends on the clock), and either way one file's edit
    never changes another."""
    engine = Engine.open(
        service, "main", promote=True, workdir=tmp_path / "work",
        gate=GateSpec(outcome_is_enough=True),
    )  # fmt: skip
    ws = engine.fork(task="one")
    (ws.path / "one.txt").write_text("1")
    if left == "a hard link":
        (ws.path / "ledger" / "report.py").unlink()
        os.link(ws.path / "ledger" / "api.py", ws.path / "ledger" / "report.py")
    else:
        (ws.path / "ledger" / "api.py").chmod(0o600)
    found = engine.run_attempt(ws, task="one")
    assert found.verdict.status == "promoted", found.verdict  # else it is never recycled
    engine.release(ws)
    nxt = engine.fork(task="two")
    api, report = nxt.path / "ledger" / "api.py", nxt.path / "ledger" / "report.py"
    assert os.stat(api).st_nlink == 1 and os.stat(report).st_nlink == 1
    assert stat.S_IMODE(os.stat(api).st_mode) in (0o644, 0o664)
    before = report.read_bytes()
    api.write_text("# the next agent's edit\n")
    assert report.read_bytes() == before
    engine.close()


@pytest.mark.parametrize(
    "left", ["a hard link", "a hard link out of the tree", "a mode git does not keep"]
)
def test_what_git_never_compares_keeps_a_checkout_from_reuse(
    service: Path, tmp_path: Path, left: str
) -> None:
    """The check itself, without the reset that may rewrite the file first: a checkout
    holding a hard link or a mode git does not keep is not proven clean (None: not reused)."""
    from pytest_agentgate import BaseRepo

    repo = BaseRepo.open(service)
    ws = fork(repo, git(service, "rev-parse", "main"), "main", tmp_path / "pool")
    checkout = repo.index(ws.path, ws.index)
    links = repo.gitlinks(repo.tree_of(ws.base))
    assert prove_clean(checkout, ws.path, links, made=0.0) is True
    api = ws.path / "ledger" / "api.py"
    if left == "a hard link":
        (ws.path / "ledger" / "report.py").unlink()
        os.link(api, ws.path / "ledger" / "report.py")
    elif left == "a hard link out of the tree":
        os.link(api, tmp_path / "kept-outside.py")
    else:
        api.chmod(0o600)
    assert prove_clean(checkout, ws.path, links, made=0.0) is None


def test_a_pool_recycles_only_where_that_costs_less_than_a_fresh_fork(
    service: Path, tmp_path: Path
) -> None:
    """Recycling is for trees that cost more to write than to prove clean: where the pool's
    recycled forks cost more than its fresh ones, a workspace handed back is removed and
    the next fork is fresh; where they cost less, it is kept and recycled. Every sixteenth
    one tries the other way, in case the costs moved."""
    from pytest_agentgate.sandbox.removal import removals_done
    from pytest_agentgate.workspace.reuse import ReuseCosts

    engine = Engine.open(
        service, "main", promote=False, workdir=tmp_path / "work",
        gate=GateSpec(outcome_is_enough=True),
    )  # fmt: skip
    costs = engine.pool._costs
    kept = engine.fork(task="one")
    for _ in range(ReuseCosts.KEEP):
        costs.note("fresh", 1.0)
        costs.note("recycled", 50.0)
    engine.release(kept)  # not kept: recycling costs more here
    fresh = engine.fork(task="two")
    assert fresh is not kept and fresh.recycled == 0
    removals_done()
    assert not kept.path.exists()
    for _ in range(ReuseCosts.KEEP):
        costs.note("recycled", 0.5)
    engine.release(fresh)
    again = engine.fork(task="three")
    assert again is fresh and again.recycled == 1
    engine.close()
    probing = ReuseCosts()
    for _ in range(ReuseCosts.KEEP):
        probing.note("fresh", 1.0)
        probing.note("recycled", 50.0)
    ways = [probing.recycle_next() for _ in range(2 * ReuseCosts.PROBE_EVERY)]
    assert ways.count(True) == 2 and ways[ReuseCosts.PROBE_EVERY - 1]


def test_gate_checkouts_are_kept_only_where_reusing_one_pays(service: Path, tmp_path: Path) -> None:
    """A run's gate checkouts are kept for the next gate only while bringing one over (and
    proving it clean, off the gate's path but not free) has cost no more than a fresh
    checkout; else each gate gets a fresh one, and the last is removed."""
    from pytest_agentgate import BaseRepo
    from pytest_agentgate.sandbox.removal import removals_done
    from pytest_agentgate.workspace.checkouts import GateCheckouts
    from pytest_agentgate.workspace.reuse import ReuseCosts

    repo = BaseRepo.open(service)
    tree = repo.tree_of("HEAD")
    costs = ReuseCosts()
    kept = GateCheckouts(repo, tmp_path, costs=costs)
    for _ in range(ReuseCosts.KEEP):
        costs.note("fresh", 1.0)
        costs.note("recycled", 50.0)
    with kept.checkout(tree, "one") as first:
        pass
    with kept.checkout(tree, "two") as second:
        assert second != first and kept.reused == 0
    removals_done()
    assert not first.exists() and not second.exists()
    for _ in range(ReuseCosts.KEEP):
        costs.note("recycled", 0.5)
    with kept.checkout(tree, "three") as third:
        pass
    with kept.checkout(tree, "four") as fourth:
        assert fourth == third and kept.reused == 1
    kept.close()
