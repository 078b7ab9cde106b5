"""A target moved without a git process is moved exactly as ``git update-ref
--create-reflog`` moves it (its value, its reflog line byte for byte), and wherever git
would do otherwise, git moves it."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from helpers import git

from pytest_agentgate.errors import GitError, StaleLock
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
        assert repo.refs.update("refs/heads/main", new, old, message, reflog=True)
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
    assert repo.refs.update(ref, second, first, "two  spaces\tand a tab", reflog=True)
    assert "update-ref" in ran
    assert git(by_plugin, "reflog", "show", "--format=%gs", "main") == "two spaces and a tab"
    assert not repo.refs.update(ref, second, first, "m", reflog=True)  # not at first: lost race
    lock = by_plugin / "refs/heads/main.lock"
    lock.write_text("")
    with pytest.raises(StaleLock):
        repo.refs.update(ref, first, second, "m", reflog=True)
    lock.unlink()
    with pytest.raises(Exception, match="non-commit"):
        repo.refs.update(ref, repo.tree_of(first), second, "m", reflog=True)
    head_lock = by_plugin / "HEAD.lock"
    head_lock.write_text("")
    with pytest.raises(StaleLock):
        repo.refs.update(ref, first, second, "m", reflog=True)
    assert head_lock.read_text() == "" and not lock.exists()
    head_lock.unlink()
    linked = by_plugin / "worktrees" / "w"
    linked.mkdir(parents=True)
    (linked / "HEAD").write_text("ref: refs/heads/main\n")  # git would not log there
    ran.clear()
    assert repo.refs.update(ref, first, second, "m", reflog=True)
    assert "update-ref" in ran and (by_plugin / "logs" / "HEAD").read_text().endswith("\tm\n")
    shutil.rmtree(by_plugin / "worktrees")
    ran.clear()
    assert repo.refs.update(ref, second, first, "m", reflog=True)
    assert not ran  # now this is one for the plugin to make
    git(by_plugin, "update-ref", ref, first)
    git(by_plugin, "symbolic-ref", "HEAD", "refs/heads/other")
    git(by_plugin, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    ran.clear()
    assert repo.refs.update("refs/heads/alias", second, first, "m", reflog=True)
    assert "update-ref" in ran and git(by_plugin, "rev-parse", "main") == second
    (by_plugin / "config").write_text(
        (by_plugin / "config").read_text() + "[core]\n\tlogAllRefUpdates = always\n"
    )
    ran.clear()
    assert repo.refs.update(ref, first, second, "m", reflog=True)
    assert "update-ref" in ran
    git(by_plugin, "fsck", "--strict")


_MOVER = """
import sys
from pathlib import Path
from pytest_agentgate.git.repo import BaseRepo
repo = BaseRepo(Path(sys.argv[1]), None)
a, b = sys.argv[2], sys.argv[3]
print("ready", flush=True)
while True:
    now = (repo.git_dir / "refs/heads/main").read_text().strip()
    repo.refs.update("refs/heads/main", b if now == a else a, now, "m", reflog=True)
"""


def test_a_signal_during_a_move_leaves_no_lock(tmp_path: Path) -> None:
    """SIGTERM (how CI cancels a job) at any moment of a process moving a ref over and
    over: no lock is left (the ref's, or HEAD's, which would stop the user's own git). A
    move under way finishes first, then the signal ends the process as it would have."""
    _, repo, first, second = twins(tmp_path, "sha1")
    git(repo, "update-ref", "refs/heads/main", first)
    rng = random.Random(5)
    for _ in range(12):
        with subprocess.Popen(
            [sys.executable, "-c", _MOVER, str(repo), first, second],
            stdout=subprocess.PIPE, text=True,
        ) as mover:  # fmt: skip
            assert mover.stdout is not None and mover.stdout.readline() == "ready\n"
            time.sleep(rng.uniform(0.02, 0.12))
            mover.send_signal(signal.SIGTERM)
            assert mover.wait(timeout=30) == -signal.SIGTERM
        assert not list(repo.rglob("*.lock"))
    git(repo, "fsck", "--strict")


def test_what_a_review_found_is_git_s_to_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A symbolic ref kept as a link (``core.preferSymlinkRefs``) over a stale packed value
    moved where git refuses; a HEAD spelt otherwise or kept as a link lost its reflog line;
    a message that is not UTF-8 raised; an object whose content is not its id was named;
    a HEAD reflog that could not be written had the ref's line written twice."""
    by_git, repo_path, first, second = twins(tmp_path, "sha1")
    repo = BaseRepo(repo_path, None)
    ref = "refs/heads/main"
    git(repo_path, "update-ref", "refs/heads/other", second)
    git(repo_path, "pack-refs", "--all")  # main packed at first
    git(repo_path, "-c", "core.preferSymlinkRefs=true", "symbolic-ref", ref, "refs/heads/other")
    assert not repo.refs.update(ref, second, first, "m", reflog=True)  # at second: a lost race
    assert (repo_path / ref).is_symlink() and git(repo_path, "rev-parse", "main") == second
    (repo_path / ref).unlink()
    git(repo_path, "update-ref", ref, first)
    for head in ("ref:refs/heads/main\n", "ref:\trefs/heads/main\n", "link"):
        (repo_path / "HEAD").unlink()
        if head == "link":
            os.symlink("refs/heads/main", repo_path / "HEAD")
        else:
            (repo_path / "HEAD").write_text(head)
        before = (
            len((repo_path / "logs/HEAD").read_text().splitlines())
            if (repo_path / "logs/HEAD").exists()
            else 0
        )
        now = git(repo_path, "rev-parse", "main")
        assert repo.refs.update(
            ref, first if now == second else second, now, f"m {head!r}", reflog=True
        )
        assert len((repo_path / "logs/HEAD").read_text().splitlines()) == before + 1, head
    (repo_path / "HEAD").unlink()
    (repo_path / "HEAD").write_text("ref: refs/heads/main\n")
    now = git(repo_path, "rev-parse", "main")
    other = first if now == second else second
    assert repo.refs.update(ref, other, now, "not text: \udcff", reflog=True)
    assert (repo_path / "logs" / ref).read_bytes().endswith(b"not text: \xff\n")
    body = subprocess.run(["git", "-C", str(repo_path), "cat-file", "commit", first],
                          capture_output=True, check=True).stdout.replace(b"c1", b"c9")  # fmt: skip
    forged = hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest()
    (repo_path / "objects" / forged[:2]).mkdir(exist_ok=True)
    (repo_path / "objects" / forged[:2] / forged[2:]).write_bytes(
        zlib.compress(b"commit %d\0" % len(body) + body.replace(b"c9", b"c8"))
    )
    with pytest.raises(GitError):
        repo.refs.update(ref, forged, other, "m", reflog=True)
    assert git(repo_path, "rev-parse", "main") == other
    (repo_path / "logs/HEAD").unlink()
    (repo_path / "logs/HEAD").mkdir()  # a HEAD reflog not appended to here (git removes it)
    lines = len((repo_path / "logs" / ref).read_bytes().splitlines())
    assert repo.refs.update(ref, now, other, "m", reflog=True)
    assert len((repo_path / "logs" / ref).read_bytes().splitlines()) == lines + 1
    assert not list(repo_path.rglob("*.lock"))
    del by_git
