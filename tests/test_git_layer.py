"""The git layer's named operations against real repositories: each answers what git itself
answers, whatever the names hold, and the shortcuts that read git's files agree with git."""

from __future__ import annotations

import itertools
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import git

from pytest_agentgate.errors import GitError
from pytest_agentgate.git.index import IndexEntry
from pytest_agentgate.git.repo import ZERO, Author, BaseRepo

ODD_NAMES = ["a file\nwith a newline.txt", ":colon.txt", "star*.txt", "tab\there.txt", "ü.txt"]


@pytest.fixture
def repo(service: Path) -> BaseRepo:
    return BaseRepo.open(service)


def commit_with(repo: BaseRepo, files: dict[str, bytes], parent: str) -> str:
    index = repo.index(None, repo.private_dir / "layer-index")
    index.read_tree(parent)
    index.stage_entries(
        [IndexEntry("100644", repo.hash_blob(data), p) for p, data in files.items()]
    )
    return repo.commit_tree(index.write_tree(), [parent], "odd names\n", Author("t", "t@e"))


def test_trees_and_diffs_keep_any_name(repo: BaseRepo) -> None:
    base = repo.history.resolve_commit("main")
    new = commit_with(repo, {n: n.replace("\n", " ").encode() for n in ODD_NAMES}, base)
    changes = repo.diff_tree(base, new)
    assert sorted(c.path for c in changes) == sorted(ODD_NAMES)
    assert {c.status for c in changes} == {"A"} and all(c.old_oid == ZERO for c in changes)
    listed = {e.path for e in repo.ls_tree(repo.tree_of(new))}
    assert set(ODD_NAMES) <= listed and set(repo.tree_paths(new)) == listed
    entry = repo.tree_entry(repo.tree_of(new), "star*.txt")
    assert entry is not None and repo.read_blob(entry.oid) == b"star*.txt"
    assert repo.tree_entry(repo.tree_of(new), "star") is None  # literal, never a glob
    assert repo.changed_lines(base, new) == len(ODD_NAMES)


@pytest.fixture
def unhurried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A diff walked in process however long it takes: the walk gives way to git past the
    cost of a git process, which a loaded machine may reach with any diff."""
    import pytest_agentgate.git.repo as repo_module

    monkeypatch.setattr(repo_module, "_DIFF_HERE_S", 60.0)


@pytest.mark.usefixtures("unhurried")
def test_a_kept_diff_answers_as_git_does_and_starts_no_git(
    repo: BaseRepo, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gated test asked git for the same two trees' difference twice (its snapshot, and
    the kept gate checkout that held its base); the answer is kept, and each view of it is
    what ``diff-tree`` itself prints, a file that became a directory included."""
    from pytest_agentgate.git import runner

    base = repo.history.resolve_commit("main")
    files = {"ledger/core.py": b"gone\n", "new/dir/file.txt": b"x\n", "ledger/core.py.d/a": b""}
    first = commit_with(repo, files, base)
    index = repo.index(None, repo.private_dir / "layer-index-2")
    index.read_tree(first)
    index.stage_entries([IndexEntry("0", ZERO, "ledger/core.py")])
    index.stage_entries([IndexEntry("100644", repo.hash_blob(b"y"), "ledger/core.py/inner")])
    second = repo.commit_tree(index.write_tree(), [first], "type change\n", Author("t", "t@e"))
    old, new = repo.tree_of(base), repo.tree_of(second)

    def raw(*flags: str) -> list[tuple[str, str]]:
        out = git(service, "diff-tree", "-r", "-z", "--no-renames", *flags, old, new)
        fields = out.split("\0")
        return [
            (m.split(" ")[-1][0], p) for m, p in zip(fields[0:-1:2], fields[1::2], strict=False)
        ]

    calls: list[object] = []
    real = runner.run
    monkeypatch.setattr(runner, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert [(c.status, c.path) for c in repo.diff_tree(old, new, trees=True)] == raw("-t")
    assert [(c.status, c.path) for c in repo.diff_tree(old, new)] == raw()
    assert [(c.status, c.path) for c in repo.diff_tree(old, new, trees=True)] == raw("-t")
    assert len(calls) == 0, calls  # loose trees: read in process, and the answer kept


def test_loose_ref_reads_agree_with_git(repo: BaseRepo, service: Path) -> None:
    main = git(service, "rev-parse", "main")
    assert repo.refs.value("refs/heads/main") == main
    git(service, "update-ref", "refs/agentgate/attempts/t/1", main)
    git(service, "update-ref", "refs/agentgate/attempts/t/2", main)
    git(service, "pack-refs", "--all")  # now both are only in packed-refs
    git(service, "update-ref", "refs/agentgate/attempts/t/3", main)  # and one loose
    assert repo.refs.value("refs/agentgate/attempts/t/1") == main  # packed: asked of git
    assert repo.refs.names("refs/agentgate/attempts/t/") == [
        f"refs/agentgate/attempts/t/{n}" for n in (1, 2, 3)
    ]
    (service / ".git" / "refs" / "agentgate" / "attempts" / "t" / "4.lock").write_text("x")
    assert len(repo.refs.names("refs/agentgate/attempts/t/")) == 3  # a lock file is no ref
    git(service, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    assert repo.refs.value("refs/heads/alias") == main  # symbolic: asked of git
    assert repo.refs.value("refs/heads/missing") is None
    assert repo.refs.value("refs/heads/../../HEAD") is None


def test_loose_commit_trees_agree_with_git(repo: BaseRepo, service: Path) -> None:
    base = repo.history.resolve_commit("main")
    new = commit_with(repo, {"x.txt": b"x"}, base)
    fresh = BaseRepo.open(service)  # no cache: the object file is read
    assert fresh.tree_of(new) == git(service, "rev-parse", f"{new}^{{tree}}")
    tree = fresh.tree_of(new)
    assert BaseRepo.open(service)._commit_tree_here(tree) == tree  # a loose tree is its own
    assert git(service, "rev-parse", f"{tree}^{{tree}}") == tree
    blob = git(service, "rev-parse", f"{new}:x.txt")
    assert BaseRepo.open(service)._commit_tree_here(blob) is None  # a blob has none: git says
    with pytest.raises(GitError):
        BaseRepo.open(service).tree_of(blob)
    git(service, "gc", "-q")
    packed = BaseRepo.open(service)
    assert packed.tree_of(base) == git(service, "rev-parse", "main^{tree}")
    assert packed.tree_of("main") == git(service, "rev-parse", "main^{tree}")


def test_a_broken_loose_ref_is_git_s_to_judge(repo: BaseRepo, service: Path) -> None:
    """A SHA-1 repository's ref file holding 64 hex digits is broken: git ignores it, so does
    the shortcut."""
    (service / ".git" / "refs" / "heads" / "broken").write_text("ab" * 32 + "\n")
    assert repo.refs.value("refs/heads/broken") is None


def test_a_forged_loose_commit_is_not_believed(repo: BaseRepo, service: Path) -> None:
    """An object file whose content does not hash to its name is corrupt: the shortcut does
    not read a tree from it, and git then reports the corruption."""
    import shutil

    from pytest_agentgate.errors import GitError

    base = repo.history.resolve_commit("main")
    real = commit_with(repo, {"real.txt": b"r"}, base)
    fake = "0" * 39 + "1"
    target = service / ".git" / "objects" / fake[:2] / fake[2:]
    target.parent.mkdir(exist_ok=True)
    shutil.copy(service / ".git" / "objects" / real[:2] / real[2:], target)
    fresh = BaseRepo.open(service)
    assert fresh._commit_tree_here(fake) is None
    with pytest.raises(GitError):
        fresh.tree_of(fake)


def test_worktrees_are_those_git_lists_seen_from_any_of_them(tmp_path: Path) -> None:
    """Read from the common directory without starting git: the same set as ``git worktree
    list``, from the main working tree and from a linked one."""
    from pytest_agentgate.git.repo import BaseRepo

    main, linked = tmp_path / "main", tmp_path / "linked"
    subprocess.run(["git", "init", "-q", str(main)], check=True)
    git(main, "commit", "-q", "--allow-empty", "-m", "first")
    git(main, "worktree", "add", "-q", str(linked), "-b", "other")
    listed = {
        Path(line.split(" ", 1)[1]).resolve()
        for line in git(main, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    }
    for where in (main, linked):
        assert {p.resolve() for p in BaseRepo.open(where).place.worktrees()} == listed


def test_a_loose_blob_is_read_from_its_file_and_checked_against_its_id(repo: BaseRepo) -> None:
    """Read without starting git, it is the blob git reads. A file that does not hash to its
    name (swapped in under it) is not read as the blob: git is asked, as before."""
    import os
    import zlib

    oid = repo.hash_blob(b"layout 2\n")
    assert repo.read_blob(oid) == b"layout 2\n" == repo.blob(oid)
    other = b"blob 6\0forged"
    path = repo.common_dir / "objects" / oid[:2] / oid[2:]
    os.chmod(path, 0o644)
    path.write_bytes(zlib.compress(other))
    assert repo._object(oid) is None
    assert repo.read_blob(oid) == git(repo.common_dir, "cat-file", "blob", oid).encode()


def test_a_held_index_lock_is_found_whether_or_not_the_refresh_writes(service: Path) -> None:
    """git takes the index lock on a refresh only when it has stat data to write (entries
    as new as the index): with the files an hour old and the index fresh, it writes nothing
    and a held lock went unseen, until a promotion failed on it after the agents' work."""
    import os
    import time

    from pytest_agentgate.errors import StaleLock

    hour_ago = time.time() - 3600
    for path in service.rglob("*"):
        if ".git" not in path.parts and path.is_file():
            os.utime(path, (hour_ago, hour_ago))
    git(service, "update-index", "--really-refresh")
    lock = service / ".git" / "index.lock"
    lock.write_text("")
    refreshed = subprocess.run(
        ["git", "-C", str(service), "update-index", "-q", "--refresh"], check=False
    )
    assert refreshed.returncode == 0  # git itself says nothing of the lock here
    with pytest.raises(StaleLock) as raised:
        BaseRepo.open(service).checkout_index().refresh()
    assert raised.value.path == lock
    lock.unlink()
    BaseRepo.open(service).checkout_index().refresh()


# -- commits the plugin writes itself -----------------------------------------------------


def _git_commit(
    repo: BaseRepo, tree: str, parents: list[str], message: str, author: Author
) -> tuple[str, int]:
    """The commit ``git commit-tree`` writes for the same input, run as the plugin runs git
    (its own clock and zone), and the second it was stamped with."""
    from pytest_agentgate.git import runner

    args = ["git", *runner._SAFETY, f"--git-dir={repo.git_dir}", "commit-tree", tree]
    for parent in parents:
        args += ["-p", parent]
    env = runner.scrubbed_env(author.env())
    while True:  # git reads the clock for each of its two lines: the same second in both
        made = subprocess.run(
            args, input=message.encode(), env=env, capture_output=True, check=True
        )
        oid = made.stdout.decode().strip()
        text = git(repo.git_dir, "cat-file", "commit", oid)
        stamps = {
            text.split(f"\n{who} ")[1].split("\n")[0].split()[-2] for who in ("author", "committer")
        }
        if len(stamps) == 1:
            return oid, int(stamps.pop())


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
@pytest.mark.parametrize(
    "zone",
    [
        "UTC",
        "Asia/Kolkata",  # half an hour
        "America/St_Johns",  # west, and a half hour
        "XXX0:00:30",  # thirty seconds west: git writes +0000
        "right/Asia/Kolkata",  # counts leap seconds: git writes +0529
    ],
)
def test_a_commit_written_without_git_is_byte_for_byte_git_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, object_format: str, zone: str
) -> None:
    """Records, changes and checkpoints are written without a git process: each must be the
    object git itself writes for the same input in the same second, with any parents (one
    named twice), any message (what git rewrites is git's to write), any identity, in the
    local zone as the environment names it now, in either object format."""
    import time

    from pytest_agentgate.git import objects

    monkeypatch.setenv("TZ", zone)  # set, not applied: the plugin applies it as git does
    monkeypatch.delenv("AGENTGATE_COMMITTER_NAME", raising=False)
    monkeypatch.delenv("AGENTGATE_COMMITTER_EMAIL", raising=False)
    git(tmp_path, "init", "-q", f"--object-format={object_format}", "-b", "main", "r")
    path = tmp_path / "r"
    (path / "f.txt").write_text("one\n")
    git(path, "add", "f.txt")
    git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-qm", "first")
    repo = BaseRepo.open(path)
    first, tree = repo.history.resolve_commit("main"), repo.tree_of("main")
    agent = Author.for_agent("agent ü-1")
    second = repo.commit_tree(tree, [first], "two\n", agent)
    for parents, message, author in [
        ([], "no parent, no newline at the end", agent),
        ([first], "ünïcödé — subject\n\nbody\n\n", agent),
        ([first, second], "", agent),
        ([first, first], "one parent named twice\n", agent),
        ([first], "not characters: \ufdd0 \U0001fffe \uffff\n", agent),
        ([first], "m\n", Author("a name ending in a carriage return\r", "cr@e")),
        ([first], "m\n", Author("not a character \ufffe", "nc@e")),
    ]:
        for _ in range(5):  # what is git's to write is stamped by its own clock: a second on
            expected, when = _git_commit(repo, tree, parents, message, author)
            monkeypatch.setattr(objects, "now", lambda when=when: when)
            made = repo.commit_tree(tree, parents, message, author)
            if f" {when} " in git(path, "cat-file", "commit", made):
                break
        assert made == expected, (zone, parents, message, author)
    monkeypatch.undo()
    time.tzset()
    subprocess.run(["git", "-C", str(path), "fsck", "--strict"], check=True, capture_output=True)


def test_what_git_would_refuse_or_write_otherwise_is_left_to_git(
    repo: BaseRepo, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit git would refuse (a tree that is not there, a blob given as the tree, a tree
    given as a parent) is refused as git refuses it; a repository shared with a group gets
    the permissions git gives; an identity git would rewrite is git's to write."""
    from pytest_agentgate.git import objects

    base = repo.history.resolve_commit("main")
    tree = repo.tree_of(base)
    blob = repo.hash_blob(b"a blob\n")
    author = Author("t", "t@e")
    for bad_tree, parents in [("1" * 40, [base]), (blob, [base]), (tree, [tree])]:
        with pytest.raises(GitError):
            repo.commit_tree(bad_tree, parents, "m\n", author)
    with pytest.raises(GitError):  # a NUL in a message: git refuses, and so does the plugin
        repo.commit_tree(tree, [base], "a\0b\n", author)
    assert not objects.clean_identity(" padded") and not objects.clean_identity("a <b>")
    odd = repo.commit_tree(tree, [base], "m\n", Author("odd.", "odd@e"))
    assert git(service, "log", "-1", "--format=%an", odd) == "odd"  # git took the dot off
    rewritten = repo.commit_tree(tree, [base], "not a character: \uffff\n", author)
    raw = subprocess.run(["git", "-C", str(service), "cat-file", "commit", rewritten],
                         capture_output=True, check=True).stdout  # fmt: skip
    assert raw.endswith(b"not a character: \xc3\xaf\xc2\xbf\xc2\xbf\n"), raw  # as Latin-1
    from pytest_agentgate.git import runner

    ran: list[str] = []
    real = runner.run
    monkeypatch.setattr(
        runner, "run", lambda args, *a, **kw: ran.append(args[0]) or real(args, *a, **kw)
    )
    repo.commit_tree(tree, [base], "plain\n", author)
    assert "commit-tree" not in ran  # written without git...
    config = repo.common_dir / "config"
    plain = config.read_text()
    included = service.parent / "included.cfg"
    included.write_text("[i18n]\n\tcommitEncoding = ISO-8859-1\n")
    for setting in [
        "[core] sharedRepository = 0600\n",  # a section and its key on one line
        "[i18n]commitEncoding=ISO-8859-1\n",
        f"[include]\n\tpath = {included}\n",  # what an included file holds is unknown
        "[extensions]\n\tworktreeConfig = true\n",
    ]:
        config.write_text(plain + setting)
        ran.clear()
        repo.commit_tree(tree, [base], f"with {setting}", author)
        assert "commit-tree" in ran, setting  # ...but these are git's to honour
    config.write_text(plain)
    git(service, "config", "core.sharedRepository", "group")
    ran.clear()
    shared = BaseRepo.open(service)
    shared.commit_tree(tree, [base], "shared\n", author)
    assert "commit-tree" in ran  # git gives the group its permissions


def test_the_kind_of_a_packed_object_is_git_s_or_left_to_git(service: Path) -> None:
    """An object's kind read from a pack (whole, or past a large-offset table) is the kind
    git names; a delta, whose kind is its base's, is never guessed."""
    from pytest_agentgate.git import objects

    repo = BaseRepo.open(service)
    git(service, "gc", "-q", "--aggressive")
    listed = git(
        service, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)"
    )
    kinds = dict(line.split() for line in listed.splitlines())
    answered = {oid: objects.kind_of(repo.common_dir / "objects", oid) for oid in kinds}
    assert all(found in (None, kinds[oid].encode()) for oid, found in answered.items())
    assert sum(found is not None for found in answered.values()) > len(kinds) // 2
    assert objects.kind_of(repo.common_dir / "objects", "2" * 40) is None


def test_a_plugin_ref_created_without_git_is_the_one_git_creates(
    repo: BaseRepo, service: Path
) -> None:
    """Records, checkpoints and baselines create their refs without a git process: git reads
    each as it would its own, a second creation is a lost race, and whatever git would
    report (a held lock, a ref where a folder must be, a packed ref of the same name) is
    git's to report, as before."""
    from pytest_agentgate.errors import StaleLock

    base = repo.history.resolve_commit("main")
    made = repo.commit_tree(repo.tree_of(base), [base], "a record\n", Author("t", "t@e"))
    assert repo.refs.update("refs/agentgate/attempts/t/1", made, None, "m")
    assert git(service, "rev-parse", "refs/agentgate/attempts/t/1") == made
    assert not repo.refs.update("refs/agentgate/attempts/t/1", base, None, "m")  # lost race
    assert git(service, "rev-parse", "refs/agentgate/attempts/t/1") == made
    assert not (repo.common_dir / "refs/agentgate/attempts/t/1.lock").exists()
    git(service, "update-ref", "refs/agentgate/packed/1", base)
    git(service, "pack-refs", "--all")
    assert not repo.refs.update("refs/agentgate/packed/1", made, None, "m")  # packed: exists
    with pytest.raises(GitError):  # a ref where its folder would be: git's conflict
        repo.refs.update("refs/agentgate/packed/1/below", made, None, "m")
    with pytest.raises(GitError):
        repo.refs.update("refs/agentgate/attempts/t/1/below", made, None, "m")
    with pytest.raises(GitError):  # an object that is not there is never named
        repo.refs.update("refs/agentgate/attempts/t/2", "3" * 40, None, "m")
    lock = repo.common_dir / "refs/agentgate/attempts/t/3.lock"
    lock.write_text("")
    with pytest.raises(StaleLock):
        repo.refs.update("refs/agentgate/attempts/t/3", made, None, "m")
    assert lock.read_text() == ""  # somebody else's lock, left as it was
    subprocess.run(["git", "-C", str(service), "fsck", "--strict"], check=True, capture_output=True)


def _random_edit(path: Path, rng: random.Random, names: list[str]) -> None:
    """One edit of the work tree at a random path: written, removed, made executable, made
    a link, or turned from a file into a folder (or back)."""
    target = path.joinpath(*[rng.choice(names) for _ in range(rng.randint(1, 3))])
    above = [p for p in target.parents if path in p.parents]
    if any(p.is_file() or p.is_symlink() for p in above):
        return
    action = rng.choice(["write", "write", "remove", "exec", "link", "flip"])
    is_dir = target.is_dir() and not target.is_symlink()
    if action in ("remove", "flip"):
        if is_dir:
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if action == "flip":
            target.mkdir(parents=True)
            (target / rng.choice(names)).write_text(str(rng.random()))
        return
    if is_dir:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or action == "link":
        target.unlink(missing_ok=True)
    if action == "link":
        target.symlink_to(rng.choice(names))
        return
    if action == "write" or not target.exists():
        target.write_text(str(rng.random()))
    if action == "exec":
        target.chmod(0o755)


def _random_history(path: Path, rounds: int) -> list[str]:
    """Commits of ``rounds`` random edits each (some adding or moving a submodule's commit)."""
    rng = random.Random(24)
    names = ["a", "a.txt", "a-b", "b", "z"]
    commits = []
    for _ in range(rounds):
        for _ in range(rng.randint(1, 6)):
            _random_edit(path, rng, names)
        git(path, "add", "-A")
        link = "/".join(rng.choice(names) for _ in range(rng.randint(1, 2)))
        clear = not (path / link).exists() and not (path / link).parent.is_file()
        if rng.random() < 0.2 and clear:
            git(path, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},{link}")
        git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-q", "--allow-empty",
            "-m", "c")  # fmt: skip
        commits.append(git(path, "rev-parse", "HEAD"))
    return commits


@pytest.mark.usefixtures("unhurried")
def test_a_diff_read_without_git_is_git_s_change_for_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot's diff of two trees is read in process: over many random edits
    (files added, removed, made executable, made links; a file made a folder and back; a
    submodule's commit; whole folders gone) it is ``diff-tree -r -t``'s list, in its order.
    Trees read from a pack give the same answer, with no git process either."""
    from pytest_agentgate.git import runner

    git(tmp_path, "init", "-q", "-b", "main", "r")
    path = tmp_path / "r"
    commits = _random_history(path, 25)
    repo = BaseRepo.open(path)
    pairs = [*itertools.pairwise(commits), (commits[0], commits[-1]), (commits[-1], commits[0])]
    statuses = set()
    for old, new in pairs:
        here = repo._diff_here(old, new)
        assert here is not None
        assert here == repo._diff_tree(old, new), (old, new)
        statuses |= {c.status for c in here}
    assert statuses == {"A", "D", "M", "T"}  # the edits made every kind of change
    git(path, "gc", "-q")  # packed, deltas and all: read in process too
    packed = BaseRepo.open(path)
    calls: list[object] = []
    real = runner.run
    monkeypatch.setattr(runner, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    found = [packed.diff_tree(old, new, trees=True) for old, new in pairs]
    assert not calls and found == [repo._diff_tree(old, new) for old, new in pairs]
    import pytest_agentgate.git.repo as repo_module

    monkeypatch.setattr(repo_module, "_DIFF_HERE_S", 0.0)  # past its time: git's, same answer
    late = BaseRepo.open(path)
    assert [late.diff_tree(old, new, trees=True) for old, new in pairs] == found and calls


def test_a_plugin_ref_is_git_s_to_create_wherever_git_would_do_otherwise(
    repo: BaseRepo, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review of the refs created without git found where git does otherwise; each is
    git's now, with git's answer: an interrupt left the ref's lock behind, and names, a
    message, a commit, settings, a HEAD, a symbolic ref or a ``packed-refs`` git refuses or
    treats otherwise were taken as they were."""
    base = repo.history.resolve_commit("main")
    made = repo.commit_tree(repo.tree_of(base), [base], "a record\n", Author("t", "t@e"))

    def interrupted(*_args: object) -> str:
        raise KeyboardInterrupt

    from pytest_agentgate.git import ref_files

    monkeypatch.setattr(ref_files, "_in_the_way", interrupted)
    with pytest.raises(KeyboardInterrupt):
        repo.refs.update("refs/agentgate/t/1", made, None, "m")
    monkeypatch.undo()
    assert not (repo.common_dir / "refs/agentgate/t/1.lock").exists()
    assert repo.refs.update("refs/agentgate/t/1", made, None, "m")
    for name, message in [("refs/agentgate/x.", "m"), ("refs/agentgate/x\n", "m"),
                          ("refs/agentgate/t/2", "")]:  # fmt: skip
        with pytest.raises(GitError):
            repo.refs.update(name, made, None, message)
    garbage = subprocess.run(
        ["git", "-C", str(service), "hash-object", "-t", "commit", "--literally", "-w", "--stdin"],
        input=b"garbage", capture_output=True, check=True,
    ).stdout.decode().strip()  # fmt: skip
    with pytest.raises(GitError):
        repo.refs.update("refs/agentgate/t/3", garbage, None, "m")
    (repo.common_dir / "refs/agentgate/t/link").write_text("ref: refs/heads/from-a-link\n")
    assert repo.refs.update("refs/agentgate/t/link", made, None, "m")  # git follows it
    assert git(service, "rev-parse", "refs/heads/from-a-link") == made
    git(service, "symbolic-ref", "HEAD", "refs/agentgate/t/head")
    assert repo.refs.update("refs/agentgate/t/head", made, None, "m")
    assert (repo.git_dir / "logs/HEAD").read_text().splitlines()[-1].split()[1] == made
    git(service, "symbolic-ref", "HEAD", "refs/heads/main")
    config = repo.common_dir / "config"
    config.write_text(config.read_text() + "[core]\n\tlogAllRefUpdates = al\\\nways\n")
    assert repo.refs.update("refs/agentgate/t/logged", made, None, "m")
    assert (repo.common_dir / "logs/refs/agentgate/t/logged").exists()  # as git keeps it
    config.write_text(config.read_text().replace("\tlogAllRefUpdates = al\\\nways\n", ""))
    packed = repo.common_dir / "packed-refs"
    packed.write_bytes((packed.read_bytes() if packed.exists() else b"") + b"not a line")
    with pytest.raises(GitError):  # a torn packed-refs: git says so
        repo.refs.update("refs/agentgate/t/4", made, None, "m")


@pytest.mark.usefixtures("unhurried")
def test_a_tree_naming_a_file_and_a_folder_alike_is_diffed_as_git_does(
    repo: BaseRepo, service: Path
) -> None:
    """A tree written by hand may hold a file and a folder of one name (git writes none,
    but stores one): read in process, one of the two was lost from the diff."""

    def fed(*args: str, data: bytes) -> str:
        made = subprocess.run(["git", "-C", str(service), *args], input=data,
                              capture_output=True, check=True)  # fmt: skip
        return made.stdout.decode().strip()

    blob = repo.hash_blob(b"x\n")
    sub = fed("mktree", data=f"100644 blob {blob}\tf\n".encode())
    raw = b"100644 a\0" + bytes.fromhex(blob) + b"40000 a\0" + bytes.fromhex(sub)
    both = fed("hash-object", "-t", "tree", "--literally", "-w", "--stdin", data=raw)
    empty = fed("mktree", data=b"")
    for old, new in [(empty, both), (both, empty)]:
        found = repo.diff_tree(old, new, trees=True)
        assert found == repo._diff_tree(old, new) and len(found) == 3, found


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
@pytest.mark.parametrize("bases", ["by offset", "by id"])
def test_an_object_read_from_a_pack_is_git_s_whatever_its_chain_of_deltas(
    tmp_path: Path, object_format: str, bases: str
) -> None:
    """Trees and commits a snapshot diffs are read from the pack without git, deltas
    applied (their bases named by offset, or by id): every object of a history repacked
    deep reads as ``cat-file`` prints it. A pack changed under the reader is never believed."""
    from pytest_agentgate.git import objects

    git(tmp_path, "init", "-q", f"--object-format={object_format}", "-b", "main", "r")
    path = tmp_path / "r"
    _random_history(path, 12)
    for n in range(12):  # files that differ a little: what deltas are made of
        (path / f"doc{n % 4}.txt").write_text(
            "".join(f"line {i} {n if i == n else ''}\n" for i in range(200))
        )
        git(path, "add", "-A")
        git(path, "-c", "user.name=p", "-c", "user.email=p@e", "commit", "-qm", f"doc {n}")
    offsets = "true" if bases == "by offset" else "false"
    git(
        path,
        "-c",
        f"repack.useDeltaBaseOffset={offsets}",
        "repack",
        "-adfq",
        "--depth=50",
        "--window=50",
    )
    store = path / ".git" / "objects"
    listed = git(
        path,
        "cat-file",
        "--batch-all-objects",
        "--batch-check=%(objectname) %(objecttype) %(deltabase)",
    )
    rows = [line.split() for line in listed.splitlines()]
    assert sum(base.strip("0") != "" for _, _, base in rows) > 20  # deltas there are
    batch = subprocess.run(["git", "-C", str(path), "cat-file", "--batch"], capture_output=True, check=True,
                           input="".join(f"{oid}\n" for oid, _, _ in rows).encode()).stdout  # fmt: skip
    want = {}
    for oid, kind, _ in rows:
        header, _, batch = batch.partition(b"\n")
        size = int(header.split()[2])
        want[oid], batch = (kind.encode(), batch[:size]), batch[size + 1 :]
        assert objects.read_packed(store, oid) == want[oid], oid
        assert objects.kind_of(store, oid) == want[oid][0]
    pack = next((store / "pack").glob("*.pack"))
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    read = {oid: objects.read_packed(store, oid) for oid in want}
    assert all(found in (None, want[oid]) for oid, found in read.items())  # never misread
    assert None in read.values()
