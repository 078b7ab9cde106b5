"""A tree made from another by setting and removing paths, and the blobs of a work tree's
files, written as loose objects without a git process, where git would write exactly those
objects; otherwise (None) git's to do.

A snapshot of a few changed files pays for ``update-index`` (which reads and rewrites the
whole private index) and ``write-tree`` (which reads it again): two processes, more than the
work of hashing the files and writing the trees along their paths. Git would write the
same objects only when no filter applies (no attributes, no line-ending or encoding
setting), a file's mode is taken from its stat (``core.fileMode``, ``core.symlinks``), and
each name is one git takes as it is; :func:`plain_checkin` says whether the repository's
configuration allows it, the caller whether its paths and trees do.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from . import objects
from . import runner as _git

#: Settings that change the bytes git stores for a file, or where it reads how: line
#: endings and encodings, attributes from elsewhere, a file's mode or link kept otherwise
#: than its stat says (``filemode`` other than the ``true`` a repository is made with),
#: names folded or protected, a large file streamed to a pack, and anything that brings in
#: another file. (A filter applies only where an attribute names it: none does here.)
_CHECKIN_SETTINGS = re.compile(
    r"(?i)autocrlf|\beol\b|safecrlf|attributesfile|symlinks|ignorecase|precomposeunicode"
    r"|protecthfs|protectntfs|bigfilethreshold|encoding|include|worktreeconfig"
    r"|filemode(?!\s*=\s*true[ \t]*(\r?\n|\Z))"
)

#: The most a snapshot hashes without git, in all: a larger one is git's (it streams).
MAX_BYTES = 8 << 20

#: An entry as :meth:`BaseRepo._tree_here` keeps one: (name, mode, object id), by the key
#: git orders entries by (a tree's name with a slash).
Entries = dict[str, tuple[str, str, str]]


def plain_checkin(common_dir: Path) -> bool:
    """Whether git, adding a work tree's file to this repository, stores exactly its bytes
    under the mode its stat gives: no configuration git reads mentions a setting of
    :data:`_CHECKIN_SETTINGS` (nor one that changes how objects are written), and no
    attributes file outside the trees applies (the repository's, the user's, the system's,
    each where git looks for it). Attributes files in the tree and the work tree are the
    caller's to rule out."""
    sysconfdir = _git.sysconfdir()
    if sysconfdir is None:
        return False
    places = [common_dir / "info" / "attributes", sysconfdir / "gitattributes"]
    user = objects.user_file("attributes")
    if user is not None:
        places.append(user)
    if any(not place.is_absolute() or os.path.lexists(place) for place in places):
        return False
    return objects.writes_itself(common_dir, sysconfdir, also=(_CHECKIN_SETTINGS,))


#: Words in a name git guards in some spelling: ``.git`` and the files git reads from a
#: tree (``.gitmodules``, ``.gitattributes``, ``.gitignore``, ``.mailmap``), each also by
#: its NTFS short name (``git~1``, ``gi7eba~1``...): any name holding one is git's to take
#: or leave, as are names git would fold (case, trailing dots and spaces).
_GUARDED = ("git", "mailmap", "~")

#: The deepest path written without git (each folder is a step of a recursion).
MAX_DEPTH = 200


def plain_name(path: str) -> bool:
    """Whether git takes ``path`` as it is, whatever it holds: no component that is empty,
    ``.`` or ``..``, ends with a dot or a space, or holds a word of :data:`_GUARDED` in
    any case; and no deeper than :data:`MAX_DEPTH`."""
    parts = path.split("/")
    return len(parts) <= MAX_DEPTH and all(
        part not in ("", ".", "..")
        and not part.endswith((".", " "))
        and not any(word in part.lower() for word in _GUARDED)
        for part in parts
    )


def attributes_along(root: Path, paths: Iterable[str]) -> bool:
    """Whether a ``.gitattributes`` is in the work tree at ``root`` or in a folder on the
    way to one of ``paths``: git reads it (ignored or not) for the files below it."""
    folders = {""}
    for path in paths:
        parts = path.split("/")[:-1]
        folders.update("/".join(parts[: n + 1]) for n in range(len(parts)))
    return any(os.path.lexists(root / folder / ".gitattributes") for folder in folders)


def file_blob(root: Path, rel: str, most: int) -> tuple[str, bytes] | None:
    """The mode and content git would store for the work tree's file at ``rel``: a link's
    target, or a regular file's bytes (executable when its owner may run it). None when it
    is neither (git's to refuse), is larger than ``most`` bytes (the size the caller saw
    and allowed), or changes while it is read.

    Every folder on the way is opened from the one above it without following a link, and
    the file from its folder: a folder swapped for a link meanwhile is not followed out of
    the work tree (git would refuse a path beyond a link). A FIFO put in the file's place
    is not waited on, and no more than the size first seen is read.
    """
    parts = rel.split("/")
    try:
        folder = os.open(root, _FOLDER)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            inner = os.open(part, _FOLDER | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
        name = parts[-1]
        info = os.lstat(name, dir_fd=folder)
        if stat.S_ISLNK(info.st_mode):
            return "120000", os.readlink(os.fsencode(name), dir_fd=folder)
        if not stat.S_ISREG(info.st_mode) or info.st_size > most:
            return None
        fd = os.open(name, _FILE, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    try:
        again = os.fstat(fd)
        if (again.st_ino, again.st_dev) != (info.st_ino, info.st_dev):
            return None  # replaced meanwhile
        chunks, left = [], info.st_size + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) != info.st_size:
        return None  # still being written: git's to read
    return ("100755" if info.st_mode & stat.S_IXUSR else "100644"), data


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def edit(
    read: Callable[[str], Entries | None],
    write: Callable[[bytes], str],
    tree: str | None,
    edits: Mapping[str, tuple[str, str] | None],
    oid_length: int,
) -> str | None:
    """The tree ``tree`` (None: an empty one) with each path of ``edits`` set to its
    (mode, object id), or removed (None), as ``write-tree`` writes it from an index that
    held ``tree`` and was given those edits: a folder left empty goes, every tree along a
    changed path is written again (``write``), the rest are kept by id.

    None when git must do it: a tree it reads is not as git writes one (``read`` says
    None), a tree written again holds an empty tree (git, writing it from an index, which
    holds no folders, would leave that out), or a path stands where the tree has a folder
    of its name, or the other way round (git's ``--replace`` rules). The edits' paths are
    relative, ``/``-separated and checked by :func:`plain_name`.
    """
    empty = objects.object_id(b"tree", b"", oid_length)
    try:
        found = _edit(read, write, tree, edits, empty)
    except RecursionError:
        return None
    return None if found is None else found or write(b"")


def _edit(
    read: Callable[[str], Entries | None],
    write: Callable[[bytes], str],
    tree: str | None,
    edits: Mapping[str, tuple[str, str] | None],
    empty: str,
) -> str | None:
    """:func:`edit`, answering "" for a tree left empty (its parent drops it)."""
    here: dict[str, tuple[str, str] | None] = {}
    below: dict[str, dict[str, tuple[str, str] | None]] = {}
    for path, change in edits.items():
        head, slash, rest = path.partition("/")
        if slash:
            below.setdefault(head, {})[rest] = change
        else:
            here[head] = change
    entries = {} if tree is None else read(tree)
    if entries is None:
        return None
    entries = dict(entries)
    for name, change in here.items():
        if change is None:
            entries.pop(name, None)  # as --force-remove: a path not there is no error
    for name, inner in below.items():
        if name in entries:
            return None  # a file, link or submodule where a folder would be
        old = entries.get(name + "/")
        subtree = _edit(read, write, None if old is None else old[2], inner, empty)
        if subtree is None:
            return None
        if subtree:
            entries[name + "/"] = (name, "040000", subtree)
        else:
            entries.pop(name + "/", None)
    for name, change in here.items():
        if change is not None:
            if name + "/" in entries:
                return None  # a folder where the file would be
            entries[name] = (name, change[0], change[1])
    if not entries:
        return ""
    if any(mode == "040000" and oid == empty for _, mode, oid in entries.values()):
        return None
    return write(_tree_body(entries))


def _tree_body(entries: Entries) -> bytes:
    """A tree object's content: its entries in git's order (by key, as bytes)."""
    parts = []
    for key in sorted(entries, key=lambda k: k.encode("utf-8", "surrogateescape")):
        name, mode, oid = entries[key]
        parts.append(
            (mode.lstrip("0") or "0").encode()
            + b" "
            + name.encode("utf-8", "surrogateescape")
            + b"\0"
            + bytes.fromhex(oid)
        )
    return b"".join(parts)
