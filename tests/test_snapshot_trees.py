"""A snapshot's tree written without git is the tree git writes from the same files, and
wherever git would store other bytes (attributes, line-ending settings, names it guards),
git writes it."""

from __future__ import annotations

import os
import random
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import git
from test_git_layer import _random_edit

from pytest_agentgate.git import runner
from pytest_agentgate.git.repo import Author, BaseRepo, TreeEntry
from pytest_agentgate.workspace.fork import Workspace, fork
from pytest_agentgate.workspace.snapshot import snapshot


def git_tree_of(repo: BaseRepo, ws: Workspace, scratch: Path) -> str:
    """What ``git add -A`` and ``write-tree`` make of the workspace's files, from its base."""
    env = {**os.environ, "GIT_DIR": str(repo.git_dir), "GIT_WORK_TREE": str(ws.path),
           "GIT_INDEX_FILE": str(scratch)}  # fmt: skip
    for args in (["read-tree", ws.base], ["add", "-A"], ["write-tree"]):
        out = subprocess.run(["git", *args], env=env, capture_output=True, text=True, check=True)
    scratch.unlink()
    return out.stdout.strip()


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The git commands started from now on (their first word)."""
    calls: list[str] = []
    real = runner.run

    def run(args: list[str], *rest: object, **options: object) -> object:
        calls.append(next(a for a in args if not a.startswith("-") and "=" not in a))
        return real(args, *rest, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "run", run)
    return calls


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_a_snapshot_tree_written_without_git_is_git_s_edit_for_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, object_format: str
) -> None:
    """Random edits (files written, removed, made executable, made links, a file made a
    folder and back), each round's snapshot the next round's base: the tree is git's every
    time, and written without ``update-index`` and ``write-tree``."""
    git(tmp_path, "init", "-q", "-b", "main", f"--object-format={object_format}", "r")
    path = tmp_path / "r"
    (path / "a").mkdir()
    (path / "a" / "a.txt").write_text("first\n")
    (path / "b").write_text("b\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-q", "-m", "base")
    repo = BaseRepo.open(path)
    rng = random.Random(7)
    names = ["a", "a.txt", "a-b", "b", "z"]
    base = repo.history.resolve_commit("main")
    kinds: set[str] = set()
    calls = counting(monkeypatch)
    for n in range(40):
        ws = fork(repo, base, "main", tmp_path / f"pool-{n}")
        for _ in range(rng.randint(1, 4)):
            _random_edit(ws.path, rng, names)
        calls.clear()
        snap = snapshot(ws)
        assert "update-index" not in calls and "write-tree" not in calls, calls
        assert snap.tree == git_tree_of(repo, ws, tmp_path / "index"), n
        gone = {c.path for c in snap.changes if c.status == "D"}
        kinds |= {c.status for c in snap.changes}
        if any(c.path.rpartition("/")[0] in gone for c in snap.changes if c.status == "A"):
            kinds.add("a file made a folder")
        base = repo.commit_tree(snap.tree, [base], f"round {n}\n", Author("t", "t@e"))
    assert kinds == {"A", "D", "M", "T", "a file made a folder"}  # every kind of change
    git(path, "fsck", "--strict")


@pytest.mark.parametrize(
    "where",
    ["a .gitattributes in the base", "info/attributes", "the user's attributes",
     "core.autocrlf", "core.fileMode"],
)  # fmt: skip
def test_where_git_would_store_other_bytes_git_writes_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Each case makes git store a file otherwise than its bytes and stat say (line endings
    converted, a mode kept from the index): the tree is git's own, written by git, not the
    one the plain bytes would make."""
    git(tmp_path, "init", "-q", "-b", "main", "r")
    path = tmp_path / "r"
    (path / "x.txt").write_text("x\n")
    rel = "sub/w.txt" if where == "a .gitattributes in the base" else "w.txt"
    if where == "a .gitattributes in the base":
        (path / "sub").mkdir()
        (path / "sub" / ".gitattributes").write_text("* text eol=lf\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-q", "-m", "base")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    if where == "info/attributes":
        (path / ".git" / "info").mkdir(exist_ok=True)
        (path / ".git" / "info" / "attributes").write_text("* text\n")
    elif where == "the user's attributes":
        (tmp_path / "xdg" / "git").mkdir(parents=True)
        (tmp_path / "xdg" / "git" / "attributes").write_text("* text\n")
    elif where == "core.autocrlf":
        git(path, "config", "core.autocrlf", "input")
    elif where == "core.fileMode":
        git(path, "config", "core.fileMode", "false")
    repo = BaseRepo.open(path)
    ws = fork(repo, repo.history.resolve_commit("main"), "main", tmp_path / "pool")
    (ws.path / rel).write_bytes(b"one\r\ntwo\r\n")
    (ws.path / "x.txt").chmod(0o755)  # with core.fileMode=false git keeps the index's mode
    calls = counting(monkeypatch)
    snap = snapshot(ws)
    assert "write-tree" in calls
    assert snap.tree == git_tree_of(repo, ws, tmp_path / "index")
    plain = {rel: ("100644", repo.write_blob(b"one\r\ntwo\r\n")),
             "x.txt": ("100755", repo.write_blob(b"x\n"))}  # fmt: skip
    assert repo.edited_tree(repo.tree_of(ws.base), plain) != snap.tree


def test_a_name_git_guards_is_git_s_to_take_or_leave(
    tmp_path: Path, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path git will not stage (a folder a Windows checkout would take for ``.git``) is
    never written by the plugin: git is asked, and leaves it out of the tree."""
    repo = BaseRepo.open(service)
    ws = fork(repo, repo.history.resolve_commit("main"), "main", tmp_path / "pool")
    (ws.path / "GIT~1").mkdir()
    (ws.path / "GIT~1" / "config").write_text("[core]\n")
    (ws.path / "kept.txt").write_text("kept\n")
    calls = counting(monkeypatch)
    snap = snapshot(ws)
    assert "write-tree" in calls
    assert [c.path for c in snap.changes] == ["kept.txt"]


def test_a_checkpoint_of_a_few_files_leaves_the_index_and_the_next_snapshot_edits_its_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's snapshot of a few files is written without git and leaves the private
    index (and the tree it holds) as it was; the next snapshot edits that tree with what
    changed since it, the checkpoint's files again among them: git's tree all the same. One
    written by git leaves the index holding its tree, and the next hashes only what changed
    after it."""
    git(tmp_path, "init", "-q", "-b", "main", "r")
    path = tmp_path / "r"
    for n in range(5):
        (path / f"f{n}.txt").write_text(f"{n}\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-q", "-m", "base")
    repo = BaseRepo.open(path)
    ws = fork(repo, repo.history.resolve_commit("main"), "main", tmp_path / "pool")
    base_tree = ws.index_tree
    for n in range(3):
        (ws.path / f"f{n}.txt").write_text("changed\n")
    (ws.path / "f4.txt").unlink()
    calls = counting(monkeypatch)
    first = snapshot(ws)
    assert "write-tree" not in calls and "update-index" not in calls, calls
    assert first.hashed == 3 and ws.index_tree == base_tree
    assert first.tree == git_tree_of(repo, ws, tmp_path / "index-1")
    (ws.path / "new.txt").write_text("new\n")
    calls.clear()
    second = snapshot(ws)
    assert second.hashed == 4 and "write-tree" not in calls
    assert second.tree == git_tree_of(repo, ws, tmp_path / "index-2")
    assert {c.path for c in second.changes} == {"f0.txt", "f1.txt", "f2.txt", "f4.txt", "new.txt"}
    by_git = snapshot(ws, by_git=True)
    assert by_git.tree == second.tree and ws.index_tree == second.tree
    (ws.path / "f0.txt").write_text("again\n")
    calls.clear()
    third = snapshot(ws)
    assert third.hashed == 1 and "write-tree" not in calls
    assert third.tree == git_tree_of(repo, ws, tmp_path / "index-3")


def test_a_snapshot_of_many_files_is_git_s_to_hash(
    tmp_path: Path, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past a dozen or so files git hashes faster than the plugin: it is asked."""
    repo = BaseRepo.open(service)
    ws = fork(repo, repo.history.resolve_commit("main"), "main", tmp_path / "pool")
    for n in range(17):
        (ws.path / f"new-{n}.txt").write_text(f"{n}\n")
    calls = counting(monkeypatch)
    snap = snapshot(ws)
    assert "write-tree" in calls and snap.hashed == 17
    assert snap.tree == git_tree_of(repo, ws, tmp_path / "index")


def test_a_file_is_read_from_beneath_its_work_tree_and_only_as_it_was_listed(
    tmp_path: Path,
) -> None:
    """What an agent process left alive could swap in between the listing and the hashing:
    a folder made a link out of the work tree is not followed (the secret beyond it is not
    read), and a FIFO is not waited on. A file is stored by its bytes and owner's bit, a
    link by its target."""
    from pytest_agentgate.git import trees

    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (outside / "key").write_text("secret")
    (root / "real" / "run.sh").write_text("#!/bin/sh\n")
    (root / "real" / "run.sh").chmod(0o744)
    os.symlink(outside, root / "swapped")
    os.symlink("../outside/key", root / "real" / "link")
    os.mkfifo(root / "fifo")
    assert trees.file_blob(root, "swapped/key", 100) is None
    assert trees.file_blob(root, "fifo", 100) is None
    assert trees.file_blob(root, "real/run.sh", 100) == ("100755", b"#!/bin/sh\n")
    assert trees.file_blob(root, "real/link", 100) == ("120000", b"../outside/key")


def both_ways(repo: BaseRepo, base: str, root: Path, edit: Callable[[Path], None]) -> list[str]:
    """The trees of the same edits snapshotted as a snapshot is (written without git where
    it may be) and by git."""
    trees = []
    for n, by_git in enumerate((False, True)):
        ws = fork(repo, base, "main", root / f"pool-{n}")
        edit(ws.path)
        trees.append(snapshot(ws, by_git=by_git).tree)
    return trees


def _ignored_attributes(path: Path) -> None:
    (path / "sub").mkdir()
    (path / "sub" / ".gitignore").write_text(".git*\n")  # hides itself and the next one
    (path / "sub" / ".gitattributes").write_text("* text eol=lf ident\n")
    (path / "sub" / "f.txt").write_bytes(b"line\r\n$Id$\r\n")


def _short_names(path: Path) -> None:
    os.symlink("x.txt", path / "gi7eba~1")  # what NTFS shortens .gitmodules to
    os.symlink("x.txt", path / "GI7EBA~2")
    (path / "edit.txt").write_text("y\n")


def _deep(path: Path) -> None:
    """A file 1,100 folders down (Python recurses 1,000 deep), made folder by folder."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("deep\n")
    os.close(fd)


@pytest.mark.parametrize(
    "case", ["an ignored .gitattributes", "NTFS short names", "an empty tree", "a deep path"]
)
def test_what_a_review_found_is_git_s_tree(tmp_path: Path, case: str) -> None:
    """Each case once made the tree written without git differ from git's, or crash: an
    attributes file git reads though it is ignored; links git refuses by their short
    names (the tree would fail ``fsck``); a base holding an empty tree, which git leaves
    out of a tree it writes again; a path deeper than Python recurses."""
    git(tmp_path, "init", "-q", "-b", "main", "r")
    path = tmp_path / "r"
    (path / "x.txt").write_text("x\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-q", "-m", "base")
    repo = BaseRepo.open(path)
    base = repo.history.resolve_commit("main")
    edit = {"an ignored .gitattributes": _ignored_attributes, "NTFS short names": _short_names,
            "a deep path": _deep}.get(case, lambda p: (p / "x.txt").write_text("y\n"))  # fmt: skip
    if case == "an empty tree":
        blob = git(path, "rev-parse", "HEAD:x.txt")
        tree = repo.mktree([TreeEntry("040000", "tree", repo.empty_tree(), "empty"),
                            TreeEntry("100644", "blob", blob, "x.txt")])  # fmt: skip
        base = repo.commit_tree(tree, [base], "an empty folder\n", Author("t", "t@e"))
    try:
        here, by_git = both_ways(repo, base, tmp_path, edit)
    finally:  # deeper than pytest's own clean-up of old temporary folders recurses
        subprocess.run(["rm", "-rf", *map(str, tmp_path.glob("pool-*"))], check=True)
    assert here == by_git
    commit = repo.commit_tree(here, [base], "landed\n", Author("t", "t@e"))
    git(path, "update-ref", "refs/heads/landed", commit)
    git(path, "fsck", "--strict")


def test_a_file_grown_since_its_size_was_checked_is_not_read(tmp_path: Path) -> None:
    """The limits are checked from sizes first: a file that grows after (a process still
    writing it) is git's to read, never read whole into memory here."""
    from pytest_agentgate.git import trees

    (tmp_path / "grows").write_bytes(b"x" * 100)
    assert trees.file_blob(tmp_path, "grows", 100) == ("100644", b"x" * 100)
    assert trees.file_blob(tmp_path, "grows", 1) is None


def test_the_configuration_is_read_where_git_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files checked for settings are the ones git reads: the user's where ``HOME``
    and ``XDG_CONFIG_HOME`` put them (an empty ``HOME`` is the root to git, not none), the
    system's where git's build keeps it."""
    from pytest_agentgate.git import objects

    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".gitconfig").write_text("[user]\n\tname = here\n")
    (tmp_path / ".config" / "git").mkdir(parents=True)
    (tmp_path / ".config" / "git" / "config").write_text("[user]\n\temail = here\n")
    shown = subprocess.run(["git", "config", "--list", "--show-origin"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    read = {Path(origin) for origin in re.findall(r"^file:(\S+)\t", shown, re.M)}
    files = objects.config_files(tmp_path / ".git", runner.sysconfdir())
    assert files is not None and read <= set(files), (read, files)
    assert tmp_path / ".gitconfig" in read and tmp_path / ".config/git/config" in read
    monkeypatch.setenv("HOME", "")
    files = objects.config_files(tmp_path / ".git", runner.sysconfdir())
    assert files is not None and Path("/.gitconfig") in files
    assert Path("/.config/git/config") in files


def test_the_agent_s_git_is_stored_as_git_stores_it(
    tmp_path: Path, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint stores the agent's ``.git`` as a tree written without git: the same tree
    git writes from the same files (links kept as links, executable bits, empty files, a
    name that is not UTF-8 or holds a newline, folders in folders), with no git process for
    its blobs and trees; past what it writes itself, git writes it."""
    from pytest_agentgate.git.repo import Author
    from pytest_agentgate.store import checkpoints

    repo = BaseRepo.open(service)
    ws = fork(repo, repo.history.resolve_commit("main"), "main", tmp_path / "pool")
    dot = ws.path / ".git"
    (dot / "refs" / "heads" / "deep" / "er").mkdir(parents=True)
    (dot / "refs" / "heads" / "deep" / "er" / "x").write_text("1" * 40 + "\n")
    (dot / "hooks").mkdir(exist_ok=True)
    (dot / "hooks" / "post-commit").write_text("#!/bin/sh\n")
    (dot / "hooks" / "post-commit").chmod(0o755)
    (dot / "empty").write_bytes(b"")
    (dot / os.fsdecode(b"not-utf8-\xff")).write_bytes(b"\xff\xfe")
    (dot / "a name\nover two lines").write_text("git's --stdin-paths cannot take it\n")
    os.symlink("../elsewhere", dot / "link")
    author = Author("t", "t@e")
    calls = counting(monkeypatch)
    here = checkpoints.capture_agent_git(repo, ws.path, author)
    assert here is not None and not {"hash-object", "update-index", "write-tree"} & set(calls)
    monkeypatch.setattr(checkpoints, "_tree_here", lambda *a: None)
    by_git = checkpoints.capture_agent_git(repo, ws.path, author)
    assert by_git is not None and "write-tree" in calls
    assert repo.tree_of(here) == repo.tree_of(by_git)


def test_the_agent_s_git_in_a_shared_repository_is_git_s_to_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository shared with a group (``core.sharedRepository``): git gives the group
    its permissions on every object it writes, so the agent's ``.git`` is git's to store."""
    from pytest_agentgate.store import checkpoints

    git(tmp_path, "init", "-q", "-b", "main", "--shared=group", "r")
    path = tmp_path / "r"
    (path / "a.txt").write_text("a\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-q", "-m", "base")
    repo = BaseRepo.open(path)
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/shared-and-unique\n")
    calls = counting(monkeypatch)
    made = checkpoints.capture_agent_git(repo, ws, Author("t", "t@e"))
    assert made is not None and "write-tree" in calls
    blob = git(path, "rev-parse", f"{made}:git/HEAD")
    assert (path / ".git/objects" / blob[:2] / blob[2:]).stat().st_mode & 0o040  # the group's


def _base_of(tmp_path: Path, files: dict[str, str]) -> tuple[BaseRepo, Workspace]:
    git(tmp_path, "init", "-q", "-b", "main", "r")
    path = tmp_path / "r"
    for name, text in files.items():
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-q", "-m", "base")
    repo = BaseRepo.open(path)
    return repo, fork(repo, repo.history.resolve_commit("main"), "main", tmp_path / "pool")


def test_a_snapshot_git_refused_half_way_leaves_no_tree_for_the_next_to_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git stages a snapshot's removals, then refuses an addition: a process the agent left
    swapped its folder for a link in between. The index had lost the removed file, but the
    workspace still named the tree it held before, and the next snapshot, written without
    git, edited that tree: the deleted file came back."""
    from pytest_agentgate.git.index import Index
    from pytest_agentgate.workspace.snapshot import SnapshotRefused

    repo, ws = _base_of(tmp_path, {"a.txt": "a\n", "b.txt": "b\n"})
    (ws.path / "b.txt").unlink()
    (ws.path / "d").mkdir()
    (ws.path / "d" / "digit.txt").write_text("1\n")  # a name holding "git": git's to stage
    real = Index.stage_paths

    def swapped_between(self: Index, paths: list[str], *, remove: bool = False) -> None:
        real(self, paths, remove=remove)
        if remove:  # the agent's process, now
            (ws.path / "d").rename(ws.path / "d.real")
            os.symlink("d.real", ws.path / "d")

    monkeypatch.setattr(Index, "stage_paths", swapped_between)
    with pytest.raises(SnapshotRefused, match="git refused"):
        snapshot(ws)
    monkeypatch.undo()
    os.unlink(ws.path / "d")
    (ws.path / "d.real").rename(ws.path / "d")
    (ws.path / "d" / "digit.txt").unlink()
    again = snapshot(ws)
    assert again.tree == git_tree_of(repo, ws, tmp_path / "index")
    assert "b.txt" not in {e.path for e in repo.ls_tree(again.tree)}


def test_a_file_gone_between_the_listing_and_its_size_is_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process still at work in the workspace deletes a file the snapshot has just listed:
    the snapshot raised FileNotFoundError (to a checkpoint's caller, to the engine) instead
    of refusing with a reason."""
    from pytest_agentgate.git.index import Index
    from pytest_agentgate.workspace.snapshot import SnapshotRefused

    _, ws = _base_of(tmp_path, {"a.txt": "a\n"})
    (ws.path / "new.txt").write_text("new\n")
    real = Index.differences

    def then_deleted(self: Index) -> object:
        found = real(self)
        (ws.path / "new.txt").unlink()
        return found

    monkeypatch.setattr(Index, "differences", then_deleted)
    with pytest.raises(SnapshotRefused, match=r"new\.txt went away"):
        snapshot(ws)
