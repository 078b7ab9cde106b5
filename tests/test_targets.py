"""One contract, three kinds of target: a local branch, a dry run's scratch ref, a branch on a
server (a real bare repository reached through ``git push``). Every test of the class runs
against each kind; what is special to one kind follows the class."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import fsck, git

from pytest_agentgate.errors import PushRefused
from pytest_agentgate.git.repo import ZERO, Author, BaseRepo
from pytest_agentgate.land.dry_run import DryRunRef
from pytest_agentgate.land.remote_branch import RemoteBranch
from pytest_agentgate.land.target import LocalBranch, MoveNote, Target
from pytest_agentgate.store import oplog, pending
from pytest_agentgate.store.record import Record

AUTHOR = Author("contract", "contract@agentgate.invalid")


class World:
    """A base repository with a target of one kind, and a way to make new commits."""

    def __init__(self, kind: str, service: Path, tmp_path: Path) -> None:
        self.kind = kind
        self.server: Path | None = None
        if kind == "remote":
            self.server = tmp_path / "server.git"
            git(tmp_path, "clone", "-q", "--bare", str(service), str(self.server))
            work = tmp_path / "work"
            git(tmp_path, "clone", "-q", str(self.server), str(work))
            self.repo = BaseRepo.open(work)
        else:
            git(service, "checkout", "-q", "--detach")  # nothing checked out follows a move
            self.repo = BaseRepo.open(service)
        self.log = oplog.OpLog(self.repo.common_dir)
        self.target: Target
        if kind == "local":
            self.target = LocalBranch(self.repo, "main", self.log)
        elif kind == "dryrun":
            self.target = DryRunRef(LocalBranch(self.repo, "main", self.log), self.log)
        else:
            self.target = RemoteBranch(self.repo, "origin", "main", self.log)
        self.target.start("run-1")

    def child(self, of: str, text: str) -> str:
        """A new commit on ``of`` whose tree adds one file."""
        from pytest_agentgate.git.index import IndexEntry

        index = self.repo.index(None, self.repo.private_dir / f"contract-{os.getpid()}")
        index.read_tree(of)
        index.stage_entries([IndexEntry("100644", self.repo.hash_blob(text.encode()), text)])
        return self.repo.commit_tree(index.write_tree(), [of], f"{text}\n", AUTHOR)

    def where_it_lives(self) -> str | None:
        """The target's value where it really is (the server, for a remote branch)."""
        if self.server is not None:
            return git(self.server, "rev-parse", "main")
        return self.repo.refs.value(self.target.ref)

    def lines(self, op: str) -> list[oplog.OpRecord]:
        return [r for r in self.log.read() if r.op == op]


@pytest.fixture(params=["local", "dryrun", "remote"])
def world(request: pytest.FixtureRequest, service: Path, tmp_path: Path) -> World:
    return World(str(request.param), service, tmp_path)


class TestTargetContract:
    def test_names(self, world: World) -> None:
        t = world.target
        assert t.branch == "main"
        assert t.ref.startswith("refs/")
        assert (
            t.label
            == {"local": "main", "dryrun": "dryrun/main", "remote": "origin/main"}[world.kind]
        )
        assert t.promotes == (world.kind != "dryrun")

    def test_tip_is_where_the_target_is(self, world: World) -> None:
        assert world.target.tip() == world.where_it_lives() is not None

    def test_a_move_with_the_right_old_value_moves_and_is_logged(self, world: World) -> None:
        old = world.target.tip()
        assert old is not None
        new = world.child(old, "a.txt")
        result = world.target.move(new, old, "contract move", MoveNote("promote", "ann", "t", "ff"))
        assert result.moved and result.problem is None
        assert world.target.tip() == world.where_it_lives() == new
        (line,) = world.lines("promote")
        assert (line.ref, line.old, line.new, line.agent, line.task) == (
            world.target.moved_ref,
            old,
            new,
            "ann",
            "t",
        )
        assert line.objects >= 2  # the commit and its tree at least
        fsck(world.server or world.repo.git_dir)

    def test_a_move_from_a_stale_value_loses_and_changes_nothing(self, world: World) -> None:
        old = world.target.tip()
        assert old is not None
        first = world.child(old, "first.txt")
        assert world.target.move(first, old, "m", MoveNote("promote")).moved
        late = world.child(old, "late.txt")  # made against the tip before the first move
        note = MoveNote("promote", record=Record("late", "agent", "", "", uid="x"))
        result = world.target.move(late, old, "m", note)
        assert not result.moved
        assert world.target.tip() == world.where_it_lives() == first
        assert len(world.lines("promote")) == 1
        # Its pending line was written first, and settled as abandoned.
        assert not pending.open_lines(world.log.read(), world.target.ref)
        assert len(world.lines("pending-abandoned")) == 1

    def test_records_first_the_record_is_written_after_the_move_before_the_log(
        self, world: World
    ) -> None:
        old = world.target.tip()
        assert old is not None
        new = world.child(old, "b.txt")
        seen: list[str | None] = []

        def after_move() -> bool:
            seen.append(world.where_it_lives())
            assert not world.lines("promote")  # the move's own line comes after the record
            assert pending.open_lines(world.log.read(), world.target.ref)  # in flight
            return True

        note = MoveNote("promote", "ann", "t", record=Record("t", "ann", "", "", uid="u1"))
        assert world.target.move(new, old, "m", note, after_move).moved
        assert seen == [new]
        assert not pending.open_lines(world.log.read(), world.target.ref)
        assert len(world.lines("pending-done")) == 1

    def test_a_record_not_written_leaves_the_pending_line_for_the_next_run(
        self, world: World
    ) -> None:
        old = world.target.tip()
        assert old is not None
        new = world.child(old, "c.txt")
        note = MoveNote("promote", record=Record("t", "agent", "", "", uid="u2"))
        assert world.target.move(new, old, "m", note, lambda: False).moved
        (line,) = pending.open_lines(world.log.read(), world.target.ref)
        assert line.new == new and line.record["uid"] == "u2"

    def test_the_lock_is_per_target_and_says_how_long_it_waited(self, world: World) -> None:
        with world.target.lock() as waited:
            assert isinstance(waited, float) and waited >= 0

    def test_start_is_safe_to_call_again(self, world: World) -> None:
        tip = world.target.tip()
        assert world.target.start("run-1") == []
        assert world.target.tip() == tip


# -- what one kind does that the others do not ------------------------------------------


def test_each_dry_run_has_its_scratch_ref_made_once(service: Path, tmp_path: Path) -> None:
    w = World("dryrun", service, tmp_path)
    tip = w.target.tip()
    first = w.target.ref
    assert tip == git(service, "rev-parse", "main") and "/run-1/" in first
    moved = w.child(tip or ZERO, "scratch.txt")
    assert w.target.move(moved, tip or ZERO, "m", MoveNote("promote")).moved
    assert w.target.start("run-1") == [] and w.target.tip() == moved  # same run: kept
    w.target.start("run-2")  # another run: a scratch ref of its own, from the branch
    assert w.target.ref != first and w.target.tip() == tip
    assert w.repo.refs.value(first) == moved  # the first run's is untouched
    assert git(service, "rev-parse", "main") == tip  # the branch itself never moved
    assert [(r.ref, r.old, r.new) for r in w.lines("dryrun-reset")] == [
        (first, None, tip),
        (w.target.ref, None, tip),
    ]


def test_a_refused_push_raises_and_settles_its_pending_line(service: Path, tmp_path: Path) -> None:
    w = World("remote", service, tmp_path)
    assert w.server is not None
    hook = w.server / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'frozen for the release' >&2\nexit 1\n")
    hook.chmod(0o755)
    old = w.target.tip()
    assert old is not None
    new = w.child(old, "d.txt")
    called: list[bool] = []
    after: Callable[[], bool] = lambda: called.append(True) or True  # noqa: E731
    with pytest.raises(PushRefused) as refused:
        w.target.move(
            new, old, "m", MoveNote("promote", record=Record("t", "agent", "", "", uid="u3")), after
        )
    assert "pre-receive hook declined" in str(refused.value)
    assert "frozen for the release" in refused.value.reason
    assert called == [] and w.where_it_lives() == old
    assert not pending.open_lines(w.log.read(), w.target.ref)


def test_a_local_branch_checked_out_refuses_a_move_that_would_lose_an_edit(
    service: Path,
) -> None:
    from pytest_agentgate.errors import DirtyWorktree

    repo = BaseRepo.open(service)
    log = oplog.OpLog(repo.common_dir)
    target = LocalBranch(repo, "main", log)
    old = target.tip()
    assert old is not None
    (service / "ledger" / "store.py").write_text("# a person's unsaved work\n")
    w = World.__new__(World)
    w.repo, w.log, w.target = repo, log, target
    new = World.child(w, old, "e.txt")
    with pytest.raises(DirtyWorktree):
        target.move(
            new, old, "m", MoveNote("promote", record=Record("t", "agent", "", "", uid="u4"))
        )
    assert target.tip() == old
    assert not w.lines("pending")  # refused before anything was written


def test_a_push_that_fails_without_a_verdict_leaves_its_pending_line_open(
    service: Path, tmp_path: Path
) -> None:
    """The connection failing mid-push may or may not have landed the update: the pending
    line stays open for the next run to settle from what the server holds."""
    from pytest_agentgate.errors import GitError

    w = World("remote", service, tmp_path)
    old = w.target.tip()
    assert old is not None
    new = w.child(old, "f.txt")
    git(
        w.repo.worktree or tmp_path,
        "remote",
        "set-url",
        "--push",
        "origin",
        str(tmp_path / "gone.git"),
    )
    w.target = RemoteBranch(w.repo, "origin", "main", w.log)  # reads the URLs afresh
    with pytest.raises(GitError, match="git push origin"):
        w.target.move(
            new, old, "m", MoveNote("promote", record=Record("t", "agent", "", "", uid="u5"))
        )
    (line,) = pending.open_lines(w.log.read(), w.target.ref)
    assert line.new == new
