"""A target moved without a git process is moved exactly as ``git update-ref
--create-reflog`` moves it (its value, its reflog line byte for byte), and wherever git
would do otherwise, git moves it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import git

from pytest_agentgate.errors import StaleLock
from pytest_agentgate.git import objects, runner
from pytest_agentgate.git.repo import BaseRepo


def twins(tmp_path: Path, object_format: str) -> tuple[Path, Path, str, str]:
    """Two bare repositories with the same two commits, ``main`` at the first."""
    git(tmp_path, "init", "-q", "-b", "main", f"--object-format={object_format}", "src")
    src = tmp_path / "src"
    for n in (1, 2):
        (src / "f.txt").write_text(f"{n}\n")
        git(src, "add", "f.txt")
        git(src, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-qm", f"c{n}")
    first, second = git(src, "rev-parse", "HEAD~1"), git(src, "rev-parse", "HEAD")
    pair = []
    for name in ("by-git", "by-plugin"):
        git(tmp_path, "clone", "-q", "--bare", "--no-local", str(src), name)
        git(tmp_path / name, "update-ref", "refs/heads/main", first)
        pair.append(tmp_path / name)
    return pair[0], pair[1], first, second


def git_moves(repo: Path, ref: str, new: str, old: str, message: str) -> int:
    """The move as the plugin asks git for it; the second git stamped its reflog line with."""
    args = ["git", *runner._SAFETY, f"--git-dir={repo}", "update-ref", "--create-reflog",
            "-m", message, "--end-of-options", ref, new, old]  # fmt: skip
    subprocess.run(args, env=runner.scrubbed_env(), check=True, capture_output=True)
    last = (repo / "logs" / ref).read_bytes().splitlines()[-1]
    return int(last.split(b"\t")[0].split()[-2])


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []
    real = runner.run
    monkeypatch.setattr(
        runner, "run", lambda args, *a, **k: ran.append(args[0]) or real(args, *a, **k)
    )
    return ran


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
@pytest.mark.parametrize("zone", ["UTC", "America/St_Johns", "right/Asia/Kolkata"])
@pytest.mark.parametrize("packed", [False, True])
def test_a_target_moved_without_git_is_moved_as_git_moves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, object_format: str, zone: str, packed: bool
) -> None:
    """The ref's file and the whole reflog are git's byte for byte (and HEAD's, which
    names the ref), for a ref in its own file or only in ``packed-refs``, with a reflog
    made or appended to, in any zone."""
    monkeypatch.setenv("TZ", zone)
    monkeypatch.delenv("AGENTGATE_COMMITTER_NAME", raising=False)
    by_git, by_plugin, first, second = twins(tmp_path, object_format)
    if packed:
        for repo in (by_git, by_plugin):
            git(repo, "pack-refs", "--all")
    repo = BaseRepo(by_plugin, None)
    ran = counting(monkeypatch)
    for new, old, message in [(second, first, "agentgate promote: ü task by agent"),
                              (first, second, "agentgate rollback: to c1")]:  # fmt: skip
        when = git_moves(by_git, "refs/heads/main", new, old, message)
        monkeypatch.setattr(objects, "now", lambda when=when: when)
        assert repo.update_ref("refs/heads/main", new, old, message, reflog=True)
    assert "update-ref" not in ran
    for rel in ("refs/heads/main", "logs/refs/heads/main", "logs/HEAD", "HEAD"):
        assert (by_plugin / rel).read_bytes() == (by_git / rel).read_bytes(), rel
    assert not [p for p in by_plugin.rglob("*.lock")]
    monkeypatch.undo()
    time.tzset()
    assert git(by_plugin, "reflog", "show", "--format=%gs", "main") == git(
        by_git, "reflog", "show", "--format=%gs", "main"
    )
    git(by_plugin, "fsck", "--strict")


def test_where_git_would_move_a_target_otherwise_git_moves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message git would rewrite, another worktree's HEAD naming the ref, a symbolic
    ref, a value other than the one expected, a held lock (the ref's or HEAD's), a tree
    given to a branch, a reflog setting: each is git's to do or refuse, as before."""
    _, by_plugin, first, second = twins(tmp_path, "sha1")
    repo = BaseRepo(by_plugin, None)
    ran = counting(monkeypatch)
    ref = "refs/heads/main"
    assert repo.update_ref(ref, second, first, "two  spaces\tand a tab", reflog=True)
    assert "update-ref" in ran
    assert git(by_plugin, "reflog", "show", "--format=%gs", "main") == "two spaces and a tab"
    assert not repo.update_ref(ref, second, first, "m", reflog=True)  # not at first: lost race
    lock = by_plugin / "refs/heads/main.lock"
    lock.write_text("")
    with pytest.raises(StaleLock):
        repo.update_ref(ref, first, second, "m", reflog=True)
    lock.unlink()
    with pytest.raises(Exception, match="non-commit"):
        repo.update_ref(ref, repo.tree_of(first), second, "m", reflog=True)
    head_lock = by_plugin / "HEAD.lock"
    head_lock.write_text("")
    with pytest.raises(StaleLock):
        repo.update_ref(ref, first, second, "m", reflog=True)
    assert head_lock.read_text() == "" and not lock.exists()
    head_lock.unlink()
    linked = by_plugin / "worktrees" / "w"
    linked.mkdir(parents=True)
    (linked / "HEAD").write_text("ref: refs/heads/main\n")  # git would not log there
    ran.clear()
    assert repo.update_ref(ref, first, second, "m", reflog=True)
    assert "update-ref" in ran and (by_plugin / "logs" / "HEAD").read_text().endswith("\tm\n")
    shutil.rmtree(by_plugin / "worktrees")
    ran.clear()
    assert repo.update_ref(ref, second, first, "m", reflog=True)
    assert not ran  # now this is one for the plugin to make
    git(by_plugin, "update-ref", ref, first)
    git(by_plugin, "symbolic-ref", "HEAD", "refs/heads/other")
    git(by_plugin, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    ran.clear()
    assert repo.update_ref("refs/heads/alias", second, first, "m", reflog=True)
    assert "update-ref" in ran and git(by_plugin, "rev-parse", "main") == second
    (by_plugin / "config").write_text(
        (by_plugin / "config").read_text() + "[core]\n\tlogAllRefUpdates = always\n"
    )
    ran.clear()
    assert repo.update_ref(ref, first, second, "m", reflog=True)
    assert "update-ref" in ran
    git(by_plugin, "fsck", "--strict")
