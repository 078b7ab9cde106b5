"""Attacks from a gate on the checkout the next gate reuses (found by a trial of reused gate
checkouts): whatever one gate's command does in its checkout, the next gate, which may judge
another agent's attempt, sees exactly its own tree, byte for byte and bit for bit.

Each attack runs as a real gate command (uncontained: the strictest case, nothing but the
plugin's own clean-up stands between the two gates), then a probe gate records what it finds,
compared with a fresh checkout of the same tree."""

from __future__ import annotations

import os
import pickle
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import git

from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.judge import gate
from pytest_agentgate.judge.gate import GateSpec
from pytest_agentgate.sandbox import containment as sandbox
from pytest_agentgate.sandbox.removal import removals_done
from pytest_agentgate.workspace.checkouts import GateCheckouts

FILES = {
    "pkg/__init__.py": "",
    "pkg/mod.py": "X = 1\n",
    "other/__init__.py": "",
    "README.md": "Caf\u00e9 \u2014 readme\nline two\nline three\n",
    "run.sh": "#!/bin/sh\necho hi\n",
}

#: What the probe gate writes: every path with its type, mode, bytes, links and attributes.
DESCRIBE = textwrap.dedent(
    """
    import os, pickle, stat, sys, time
    found = {}
    for dirpath, dirs, files in os.walk("."):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            try:
                attrs = sorted(os.listxattr(path, follow_symlinks=False))
            except OSError:
                attrs = []
            attrs = [a for a in attrs if not a.startswith("security.")]
            if stat.S_ISLNK(info.st_mode):
                found[path] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[path] = ("dir", stat.S_IMODE(info.st_mode), attrs)
            elif not stat.S_ISREG(info.st_mode):
                found[path] = ("special", info.st_mode)
            else:
                old = info.st_mtime < time.time() - 3600
                data = open(path, "rb").read()
                found[path] = (stat.S_IMODE(info.st_mode), data, info.st_nlink, attrs, old)
    pickle.dump(found, open(sys.argv[1], "wb"))
    """
)


@pytest.fixture
def repo(tmp_path: Path) -> BaseRepo:
    """Two commits: the attack gate runs on the first tree, the probe on the second."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    for rel, text in FILES.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text, encoding="utf-8")
    (path / "run.sh").chmod(0o755)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "one")
    (path / "pkg" / "mod.py").write_text("X = 3\n")
    git(path, "commit", "-qam", "two")
    return BaseRepo.open(path)


def with_gitlink(repo: BaseRepo) -> None:
    """A submodule (a gitlink at vendor/lib, pointing at the first commit) in both trees:
    the first tree gains it, the second is the first's change again on top."""
    path = repo.worktree
    assert path is not None
    one = git(path, "rev-parse", "HEAD~1")
    git(path, "checkout", "-q", "HEAD~1")
    (path / ".gitmodules").write_text(
        '[submodule "vendor/lib"]\n\tpath = vendor/lib\n\turl = https://example.invalid/lib.git\n'
    )
    git(path, "update-index", "--add", "--cacheinfo", f"160000,{one},vendor/lib")
    git(path, "add", ".gitmodules")
    git(path, "commit", "-qm", "a submodule")
    git(path, "cherry-pick", "main")
    git(path, "branch", "-f", "main")
    git(path, "checkout", "-q", "main")


def seen_by_next_gate(
    repo: BaseRepo, tmp_path: Path, attack: str, pause: float = 0.0
) -> tuple[dict, dict]:
    """Run ``attack`` as a gate on the first tree, then (``pause`` seconds later) a probe
    gate on the second reusing the checkout: (what the probe saw, what a fresh checkout of
    the second tree holds)."""
    import time

    uncontained = sandbox.resolve(sandbox.Settings(mode="none"))
    root = tmp_path / "gates"
    root.mkdir()
    kept = GateCheckouts(repo, root)
    context = gate.GateContext(root, uncontained, checkouts=kept)
    first, second = repo.tree_of("HEAD~1"), repo.tree_of("HEAD")
    gate.run_commands(repo, first, GateSpec(commands=(attack,), timeout=60), context)
    time.sleep(pause)
    script, out = tmp_path / "describe.py", tmp_path / "seen.pkl"
    script.write_text(DESCRIBE)
    probe = GateSpec(commands=(f"{sys.executable} {script} {out}",), timeout=60)
    assert gate.run_commands(repo, second, probe, context).ok
    seen = pickle.loads(out.read_bytes())
    fresh_root = tmp_path / "fresh"
    fresh_root.mkdir()
    plain = gate.GateContext(fresh_root, uncontained)
    assert gate.run_commands(repo, second, probe, plain).ok
    fresh = pickle.loads(out.read_bytes())
    kept.close()
    return seen, fresh


PY = sys.executable

ATTACKS = {
    # Same size, seen unchanged through a .gitattributes the gate left: git compares a
    # stat-dirty file's content through the attributes it finds in the work tree.
    "an edit hidden by a left .gitattributes": f"""{PY} -c "
import pathlib
p = pathlib.Path('README.md'); t = p.read_text('utf-8')
p.write_bytes(t.replace(chr(10), chr(13) + chr(10)).encode('cp1252'))
pathlib.Path('.gitattributes').write_text('README.md working-tree-encoding=CP1252 eol=crlf' + chr(10))
" """,
    "permission bits git does not compare": "sh -c 'chmod 0600 README.md; chmod 0666 pkg/mod.py; "
    "chmod 4755 run.sh'",
    "a hard link between tracked files": "sh -c 'rm other/__init__.py; ln pkg/__init__.py other/__init__.py'",
    "a time set back": "sh -c 'touch -d 2001-01-01 README.md pkg/__init__.py'",
    "a user attribute": f"""{PY} -c "
import os
os.setxattr('README.md', 'user.msg', b'hi'); os.setxattr('pkg', 'user.msg', b'hi')
" """,
    "a default ACL on a directory": f"""{PY} -c "
import os, struct
# system.posix_acl_default: version 2, then (tag, perm, id) entries: user/group/other rwx.
acl = struct.pack('<I', 2) + b''.join(
    struct.pack('<HHI', tag, 7, 0xFFFFFFFF) for tag in (0x01, 0x04, 0x20))
os.setxattr('pkg', 'system.posix_acl_default', acl)
" """,
    # Escapes the supervisor's sweep by killing the supervisor, then writes after the gate.
    "a process that kills its supervisor": f"""{PY} -c "
import os, time, signal
p = os.getpid()
while p > 1:
    if b'agentgate ' + b'supervisor' in open('/proc/%d/cmdline' % p, 'rb').read(): break
    p = int(open('/proc/%d/stat' % p).read().rsplit(')', 1)[1].split()[1])
assert p > 1, 'no supervisor above this process'
if os.fork() == 0:
    os.setsid()
    for procs in ('/sys/fs/cgroup/pids/cgroup.procs', '/sys/fs/cgroup/cgroup.procs'):
        try: open(procs, 'w').write(str(os.getpid()))  # out of the command's pids cgroup
        except OSError: pass
    time.sleep(0.3); os.kill(p, signal.SIGKILL); time.sleep(1.5)
    open('pkg/__init__.py', 'w').write('import os; os._exit(0)' + chr(10))
    open('planted.txt', 'w').write('late' + chr(10)); os._exit(0)
time.sleep(30)
" """,
    "a directory deeper than Python recurses": f"""{PY} -c "
import os
fd = os.open('.', os.O_RDONLY)
for _ in range(3000):
    os.mkdir('d', dir_fd=fd); new = os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = new
" """,
}


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_the_next_gate_sees_exactly_its_tree(repo: BaseRepo, tmp_path: Path, attack: str) -> None:
    if "ACL" in attack or "attribute" in attack:
        try:
            os.setxattr(tmp_path, "user.probe", b"1")
        except OSError as exc:
            pytest.skip(f"this filesystem keeps no extended attributes: {exc}")
    # A survivor of the first gate writes 1.8 s after it began: the probe runs after that.
    pause = 2.5 if attack == "a process that kills its supervisor" else 0.0
    seen, fresh = seen_by_next_gate(repo, tmp_path, ATTACKS[attack], pause)
    assert seen == fresh


def test_files_planted_in_a_submodule_s_directory_are_gone(repo: BaseRepo, tmp_path: Path) -> None:
    """git never lists what is inside a gitlink's directory: the gate's files there must not
    reach the next gate, whether the checkout is brought over or reset whole."""
    with_gitlink(repo)
    for extra in ("", "; echo tampered >> pkg/__init__.py"):
        attack = (
            'sh -c \'mkdir -p vendor/lib/pkg; echo "import os; os._exit(0)" > '
            f"vendor/lib/conftest.py; echo x > vendor/lib/pkg/data{extra}'"
        )
        case = tmp_path / ("reset" if extra else "brought-over")
        case.mkdir()
        seen, fresh = seen_by_next_gate(repo, case, attack)
        assert seen == fresh
        assert not any(path.startswith("./vendor/lib/") for path in seen)


def test_a_checkout_whose_command_lost_its_status_is_not_reused(
    repo: BaseRepo, tmp_path: Path
) -> None:
    uncontained = sandbox.resolve(sandbox.Settings(mode="none"))
    kept = GateCheckouts(repo, tmp_path)
    context = gate.GateContext(tmp_path, uncontained, checkouts=kept)
    kill = f"""{PY} -c "
import os, signal
p = os.getpid()
while b'agentgate ' + b'supervisor' not in open('/proc/%d/cmdline' % p, 'rb').read():
    p = int(open('/proc/%d/stat' % p).read().rsplit(')', 1)[1].split()[1])
os.kill(p, signal.SIGKILL)
" """
    found = gate.run_commands(repo, repo.tree_of("HEAD"), GateSpec(commands=(kill,)), context)
    assert not found.ok and "status was lost" in found.message, found.message
    plain = GateSpec(commands=("true",), exit_code=("true",))
    assert gate.run_commands(repo, repo.tree_of("HEAD~1"), plain, context).ok
    assert kept.reused == 0  # the first checkout was removed, the second made afresh
    removals_done()  # each command's private folder goes in the background
    assert not any(
        stat.S_ISDIR(p.lstat().st_mode) and p.name.endswith(".private") for p in tmp_path.iterdir()
    )
    kept.close()


def test_a_snapshot_s_gitlinks_are_its_base_s_whatever_the_agent_did(
    repo: BaseRepo, tmp_path: Path
) -> None:
    """A snapshot's tree is taken to hold its base's gitlinks without asking git (the kept
    checkouts empty those directories by them): an agent that emptied, removed or replaced a
    submodule's directory, or planted a repository, leaves a tree git lists the same."""
    from pytest_agentgate.workspace.fork import fork
    from pytest_agentgate.workspace.snapshot import SnapshotRefused, snapshot

    with_gitlink(repo)
    base = repo.history.resolve_commit("main")
    for i, act in enumerate(["emptied", "removed", "a file", "a repository"]):
        ws = fork(repo, base, "main", tmp_path / f"pool-{i}")
        lib = ws.path / "vendor" / "lib"
        (ws.path / "pkg" / "mod.py").write_text(f"X = {i + 10}\n")
        if act == "removed":
            lib.rmdir()
        elif act == "a file":
            lib.rmdir()
            lib.write_text("not a submodule\n")
        elif act == "a repository":
            git(lib, "init", "-q")
            (lib / "x.py").write_text("x\n")
        try:
            snap = snapshot(ws)
        except SnapshotRefused:
            continue
        assert repo.gitlinks(snap.tree) == BaseRepo.open(repo.git_dir).gitlinks(snap.tree)
        assert repo.gitlinks(snap.tree) == {"vendor/lib"}
