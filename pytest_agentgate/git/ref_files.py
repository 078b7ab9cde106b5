"""Refs read, created and moved as git's files backend keeps them, without a git process: a
loose ref's name rules, the plugin's own new refs (records, checkpoints, baselines, state)
created, and a target moved with its reflog (a promotion), by git's own protocol, where
git would do exactly that: one git process less for each. ``create`` and ``update``
answer None for git to do it otherwise."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from .. import _faults
from . import objects
from . import runner as _git

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
        or not objects.writes_itself(common_dir, _git.sysconfdir(), refs=True)  # a few files
        or os.path.lexists(common_dir / "logs" / ref)
        or _a_head_names(common_dir, git_dir, ref)
    ):
        return None
    found = objects.read_loose(common_dir / "objects", new)
    if found is None or found[0] != b"commit" or not objects.plain_commit(found[1]):
        return None
    path = common_dir / ref
    lock = path.with_name(f"{path.name}.lock")
    with _faults.uninterrupted():  # a signal never leaves the lock behind
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
        except BaseException:  # before the rename (signals wait): the lock is ours
            lock.unlink(missing_ok=True)
            raise
        lock.unlink(missing_ok=True)
    return False if way == "exists" else None


def update(
    common_dir: Path, git_dir: Path, ref: str, new: str, old: str, message: str, by: bytes
) -> bool | None:
    """Move ``ref`` from ``old`` to ``new`` as ``git update-ref --create-reflog -m message``
    does: its lock taken exclusively, its value read under the lock and found to be
    ``old``, the new value written to the lock, a line appended to its reflog (``by``: the
    committer's identity and time, as git formats it), the lock renamed into place.
    Where this worktree's HEAD names the ref, git logs the move in HEAD's reflog too,
    holding HEAD's lock meanwhile: so is it done here. Signals wait until it is done.

    None leaves it to git, which then does it or says why not: a value other than ``old``
    (or none, or a symbolic ref, or a link), a lock already held, a message git would
    rewrite or a name it would write otherwise, an object that is not whole or not a
    commit where a branch needs one, a HEAD or a reflog git would read or write
    otherwise (spelt otherwise, a link, another worktree's HEAD naming the ref, the
    reflog settings), and any failure before the first write (git tries again)."""
    if not PLAIN_REF.match(ref) or ODD_REF.search(ref) or new == old:
        return None
    heads = _heads_naming(common_dir, git_dir, ref)
    line = _log_line(old, new, by, message)
    if (
        line is None
        or heads is None
        or heads - {git_dir / "HEAD"}
        or not objects.writes_itself(common_dir, _git.sysconfdir(), refs=True)
    ):
        return None
    found = objects.read_object(common_dir / "objects", new)  # whole, and its id's
    if found is None or (found[0] != b"commit" and ref.startswith("refs/heads/")):
        return None
    path = common_dir / ref
    locks = [path.with_name(f"{path.name}.lock"), *(git_dir / "HEAD.lock" for _ in heads)]
    logs = [common_dir / "logs" / ref, *(git_dir / "logs" / "HEAD" for _ in heads)]
    with _faults.uninterrupted():  # a signal never leaves a lock behind
        return _move(common_dir, ref, path, new, old, locks, logs, line)


def _move(
    common_dir: Path,
    ref: str,
    path: Path,
    new: str,
    old: str,
    locks: list[Path],
    logs: list[Path],
    line: bytes,
) -> bool | None:
    """:func:`update`'s writes: every lock taken, the value checked and written, every
    reflog opened before any is written (a reflog that cannot be opened leaves it all to
    git, nothing written twice), the lines appended, the ref's lock renamed into place."""
    taken: list[Path] = []
    opened: list[int] = []
    try:
        for lock in locks:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            taken.append(lock)
            if len(taken) > 1:
                os.close(fd)  # HEAD's lock: held, never written (its value stays)
                continue
            try:
                moving = _value(common_dir, ref, path, len(old)) == old
                data = memoryview(f"{new}\n".encode("ascii"))
                while moving and data:  # a short write: its error follows
                    data = data[os.write(fd, data) :]
            finally:
                os.close(fd)
            if not moving:
                return None
        for log in logs:
            log.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            opened.append(os.open(log, flags, 0o666))
        for fd in opened:  # one write each, as git appends
            if os.write(fd, line) != len(line):
                return None
        os.rename(taken[0], path)
        taken.pop(0)  # the lock is the ref now: nothing of it to remove
        return True
    except OSError:
        return None
    finally:
        for fd in opened:
            os.close(fd)
        for lock in taken:
            lock.unlink(missing_ok=True)


def _log_line(old: str, new: str, by: bytes, message: str) -> bytes | None:
    """The reflog line git writes for the move, or None when git would write the message
    otherwise (see :func:`_kept_as_is`) or it is not text git would pass on as it is."""
    if not _kept_as_is(message):
        return None
    try:
        text = message.encode("utf-8")
    except UnicodeEncodeError:
        return None  # bytes that are not UTF-8: git's to write as they are
    return f"{old} {new} ".encode() + by + b"\t" + text + b"\n"


def _kept_as_is(message: str) -> bool:
    """Whether git logs ``message`` as it is: no control character, no space at either end
    or two together (git squeezes them)."""
    return (
        bool(message)
        and message == message.strip(" ")
        and "  " not in message
        and all(ord(c) >= 32 and c != "\x7f" for c in message)
    )


def _value(common_dir: Path, ref: str, path: Path, length: int) -> str | None:
    """The object id ``ref`` holds, from its file or ``packed-refs``; None when it holds
    none, or anything git would read otherwise (a symbolic ref, a file not exactly an id
    and a newline, a ``packed-refs`` too large to read here or not whole)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        text = None
    except OSError:
        return None  # a link (a symbolic ref git would follow), or unreadable
    else:
        with open(fd, "rb") as loose:
            text = loose.read(length + 2)
    if text is not None:
        oid = text[:-1].decode("ascii", "replace")
        whole = len(text) == length + 1 and text.endswith(b"\n")
        return oid if whole and objects.is_oid(oid) else None
    data = _packed_refs(common_dir)
    at = -1 if data is None else data.find(b" " + ref.encode() + b"\n")
    if data is None or at < 0:
        return None
    oid = data[data.rfind(b"\n", 0, at) + 1 : at].decode("ascii", "replace")
    return oid if len(oid) == length and objects.is_oid(oid) else None


def _packed_refs(common_dir: Path) -> bytes | None:
    """``packed-refs`` as read here: empty when there is none; None when it cannot be read,
    is larger than :data:`_PACKED_READ` (git reads a large one by halving) or is not whole
    (a torn one is git's to report)."""
    try:
        with open(common_dir / "packed-refs", "rb") as packed:
            data = packed.read(_PACKED_READ + 1)
    except FileNotFoundError:
        return b""
    except OSError:
        return None
    if len(data) > _PACKED_READ or (data and not data.endswith(b"\n")):
        return None
    return data


def _a_head_names(common_dir: Path, git_dir: Path, ref: str) -> bool:
    """Whether a HEAD (this worktree's, the main one's, a linked one's) points at ``ref``,
    or may: git would log the ref's creation in that HEAD's reflog too."""
    return _heads_naming(common_dir, git_dir, ref) != set()


def _heads_naming(common_dir: Path, git_dir: Path, ref: str) -> set[Path] | None:
    """The HEADs (this worktree's, the main one's, linked ones') that point at ``ref``;
    None when one is not as git writes it (``ref: <name>`` and a newline, or an object id
    and a newline), so may name it in a way read here otherwise than git reads it: a link,
    other spacing, an unreadable file."""
    heads = {git_dir / "HEAD", common_dir / "HEAD"}
    with contextlib.suppress(OSError):
        heads |= {
            common_dir / "worktrees" / n / "HEAD" for n in os.listdir(common_dir / "worktrees")
        }
    naming = set()
    for head in heads:
        try:
            fd = os.open(head, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        with open(fd, "rb") as file:
            text = file.read(4096)
        if text == f"ref: {ref}\n".encode():
            naming.add(head)
        elif not _HEAD.fullmatch(text):
            return None
    return naming


#: A HEAD as git writes one: a symbolic ref to a plain name, or a detached object id.
_HEAD = re.compile(rb"ref: refs/[^\s]+\n|[0-9a-f]{40}\n|[0-9a-f]{64}\n")


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
    data = _packed_refs(common_dir)
    if data is None:
        return "conflict"  # unreadable, too large to read here, or torn: git's to report
    name = b" " + ref.encode()
    if name + b"\n" in data:
        return "exists"
    parts = ref.split("/")
    above = [" " + "/".join(parts[:n]) + "\n" for n in range(2, len(parts))]
    if name + b"/" in data or any(a.encode() in data for a in above):
        return "conflict"
    return ""
