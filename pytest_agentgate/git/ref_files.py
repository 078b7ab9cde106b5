"""Refs read and created as git's files backend keeps them, without a git process: a loose
ref's name rules, and the plugin's own new refs (records, checkpoints, baselines, state;
one git process less for each) created by git's own protocol, where git would do exactly
that. ``create`` answers None for git to do it otherwise."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from . import objects

#: Refs read from their files: shared ones (not per-worktree), plain names only.
PLAIN_REF = re.compile(r"^refs/(heads|tags|remotes|agentgate)/[A-Za-z0-9._+@%/-]+\Z")
#: What git's ref name rules refuse among plain names (a component starting with a dot,
#: two dots, an empty component, a trailing slash or dot, a ``.lock`` component).
ODD_REF = re.compile(r"(^|/)\.|\.\.|//|[/.]\Z|\.lock(/|\Z)")

#: The most of ``packed-refs`` read to create a ref without git (about 3,000 refs).
_PACKED_READ = 256 * 1024


def create(common_dir: Path, git_dir: Path, ref: str, new: str, message: str) -> bool | None:
    """Create one of the plugin's own refs as git's files backend does: its lock file
    taken exclusively, the ref found neither in its file nor in ``packed-refs``, the value
    written to the lock and the lock renamed into place. False when the ref exists.

    None leaves it to git, which then does it or says why not: a lock already held, a ref
    where a folder must be (or the other way round), a commit not loose and whole, a reflog
    git would write (its settings, a HEAD naming the ref), a name or message git refuses.
    The caller keeps refs in files (no reftable) and has checked ``new``'s length."""
    if (
        not ref.startswith("refs/agentgate/")
        or not PLAIN_REF.match(ref)
        or ODD_REF.search(ref)
        or not message
        or "\0" in message
        or not objects.writes_itself(common_dir, refs=True)  # read each time: a few files
        or os.path.lexists(common_dir / "logs" / ref)
        or _a_head_names(common_dir, git_dir, ref)
    ):
        return None
    found = objects.read_loose(common_dir / "objects", new)
    if found is None or found[0] != b"commit" or not objects.plain_commit(found[1]):
        return None
    path = common_dir / ref
    lock = path.with_name(f"{path.name}.lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    try:
        try:
            way = _in_the_way(common_dir, ref, path)
            data = memoryview(f"{new}\n".encode("ascii"))
            while not way and data:  # a short write: its error follows
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        if not way:
            os.rename(lock, path)  # the lock is the ref now: nothing of it to remove
            return True
    except OSError:
        way = "failed"
    except BaseException:  # an interrupt: the lock is ours, never left for others
        lock.unlink(missing_ok=True)
        raise
    lock.unlink(missing_ok=True)
    return False if way == "exists" else None


def _a_head_names(common_dir: Path, git_dir: Path, ref: str) -> bool:
    """Whether a HEAD (this worktree's, the main one's, a linked one's) points at ``ref``:
    git would log the ref's creation in that HEAD's reflog too."""
    heads = [git_dir / "HEAD", common_dir / "HEAD"]
    with contextlib.suppress(OSError):
        heads += [
            common_dir / "worktrees" / n / "HEAD" for n in os.listdir(common_dir / "worktrees")
        ]
    for head in heads:
        try:
            text = head.read_bytes()[:4096]
        except OSError:
            continue
        if text.strip() == f"ref: {ref}".encode():
            return True
    return False


def _in_the_way(common_dir: Path, ref: str, path: Path) -> str:
    """What stands where ``ref`` would be created, its lock held: ``exists`` (the ref
    itself: a lost race), ``conflict`` (a ref or a folder of refs where git would report
    one; a symbolic ref, which git would follow; a ``packed-refs`` too large to read here,
    or not whole), or nothing."""
    if os.path.lexists(path):
        if not path.is_file() or path.is_symlink():
            return "conflict"
        with open(path, "rb") as current:
            return "conflict" if current.read(5) == b"ref: " else "exists"
    try:
        with open(common_dir / "packed-refs", "rb") as packed:
            data = packed.read(_PACKED_READ + 1)
    except FileNotFoundError:
        return ""
    except OSError:
        return "conflict"
    if len(data) > _PACKED_READ or (data and not data.endswith(b"\n")):
        return "conflict"  # git reads a large one by halving; a torn one is git's to report
    name = b" " + ref.encode()
    if name + b"\n" in data:
        return "exists"
    parts = ref.split("/")
    above = [" " + "/".join(parts[:n]) + "\n" for n in range(2, len(parts))]
    if name + b"/" in data or any(a.encode() in data for a in above):
        return "conflict"
    return ""
