"""Git objects read and written by the plugin itself, where that is exactly what git would
do and a process less: small objects read loose or from a pack (deltas applied, each
checked against its id), a commit written as a loose object, and the settings under which
git would write otherwise.

Anything this module cannot answer for certain (an object in an alternate store or based on
one in another pack, a large one, a repository whose configuration asks for shared
permissions or includes other files, an identity git would rewrite) is left to git: every
function here returns None for "ask git", never a guess. The format follows git's
documentation (gitformat-pack, the loose object and commit layouts); the approach, reading
an index's fan-out table and a pack entry in place, is the one dulwich's pack reader takes,
as an idea.
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import os
import re
import secrets
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

from . import packs

_KINDS = frozenset(packs.KIND.values())

#: What git strips from both ends of a name or an e-mail address (besides every byte up to
#: the space: ``strbuf_addstr_without_crud``), and what it will not keep inside one: an
#: identity holding any of these is git's to write.
_CRUD = ".,:;<>\"\\'"
_UNWRITABLE = re.compile(r"[<>\n\0]")

#: The code points git takes for invalid UTF-8 in a commit (and rewrites, as if Latin-1):
#: U+FDD0 to U+FDEF and the last two of every plane (``find_invalid_utf8``).
_NONCHARACTERS = re.compile(
    "[\ufdd0-\ufdef"
    + "".join(chr(plane << 16 | 0xFFFE) + chr(plane << 16 | 0xFFFF) for plane in range(17))
    + "]"
)

#: Settings that change what git writes for a commit or a ref, or how (a group's
#: permissions, syncing, another encoding), and those that bring in other files (includes,
#: a worktree's own configuration): wherever one is mentioned in a configuration git reads,
#: the plugin leaves writing to git. ``commit-tree`` signs nothing unless told to.
_GIT_WRITES = re.compile(r"(?i)sharedrepository|fsync|commitencoding|include|worktreeconfig")
#: Anything that brings in another file, and any mention of ``logAllRefUpdates`` other
#: than the plain ``true`` or ``false`` a repository is made with (``always`` would have git
#: keep a reflog of the plugin's own refs; a value spelt otherwise is git's to read).
_LOGS_EVERY_REF = re.compile(
    r"(?i)include|worktreeconfig|logallrefupdates(?!\s*=\s*(true|false)[ \t]*(\r?\n|\Z))"
)


#: A full object id, SHA-1 or SHA-256.
_OID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def is_oid(text: str) -> bool:
    """Whether ``text`` is a full object id (40 or 64 lowercase hex digits)."""
    return bool(_OID.match(text))


def clean_identity(text: str) -> bool:
    """Whether git writes ``text`` (a name or an e-mail address) exactly as given."""
    return (
        bool(text)
        and not _UNWRITABLE.search(text)
        and git_keeps(text)
        and not _crud(text[0])
        and not _crud(text[-1])
    )


def _crud(char: str) -> bool:
    return ord(char) <= 32 or char in _CRUD


def git_keeps(text: str) -> bool:
    """Whether git stores ``text`` in a commit as its UTF-8 bytes (see :data:`_NONCHARACTERS`)."""
    return not _NONCHARACTERS.search(text)


def writes_itself(
    common_dir: Path,
    sysconfdir: Path | None,
    *,
    refs: bool = False,
    also: tuple[re.Pattern[str], ...] = (),
) -> bool:
    """Whether the plugin may write a commit (with ``refs``, also a ref) as git would here:
    no configuration git reads (the repository's, the user's, the system's, in
    ``sysconfdir``) holds a setting of :data:`_GIT_WRITES` (nor, for a ref, one of
    :data:`_LOGS_EVERY_REF`: git would keep its reflog; nor one of ``also``, the caller's
    own), and the repository borrows no objects from another store (an object there is
    git's to find). Each configuration file is read once, whatever is asked."""
    settings = (_GIT_WRITES, *((_LOGS_EVERY_REF,) if refs else ()), *also)
    return (
        not _configured(common_dir, settings, sysconfdir)
        and not (common_dir / "objects" / "info" / "alternates").exists()
    )


def _configured(
    common_dir: Path, settings: tuple[re.Pattern[str], ...], sysconfdir: Path | None
) -> bool:
    """Whether a configuration git reads (the repository's, the user's, the system's) may
    hold one of ``settings``, each file read once: True also when one cannot be read or
    its place be told (no ``sysconfdir``, a relative path: git would look elsewhere)."""
    files = config_files(common_dir, sysconfdir)
    if files is None:
        return True
    for config in files:
        try:
            text = config.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError:
            return True
        if any(setting.search(text) for setting in settings):
            return True
    return False


def config_files(common_dir: Path, sysconfdir: Path | None) -> list[Path] | None:
    """The configuration files git reads for the repository, where git looks for them: its
    own, the user's (``GIT_CONFIG_GLOBAL``, else ``$HOME/.gitconfig`` and the XDG one),
    the system's (``GIT_CONFIG_SYSTEM``, else in ``sysconfdir``). None when one of them
    cannot be told: no ``sysconfdir`` known, or a place that is not absolute."""
    named_system = os.environ.get("GIT_CONFIG_SYSTEM")
    if named_system is not None:
        system = Path(named_system)
    elif sysconfdir is not None:
        system = sysconfdir / "gitconfig"
    else:
        return None
    files = [common_dir / "config", system]
    named = os.environ.get("GIT_CONFIG_GLOBAL")
    if named is not None:
        files.append(Path(named))
    else:
        home = os.environ.get("HOME")
        if home is not None:
            files.append(Path(home + "/.gitconfig"))
        xdg = user_file("config")
        if xdg is not None:
            files.append(xdg)
    return files if all(f.is_absolute() for f in files) else None


def user_file(name: str) -> Path | None:
    """The user's git file ``name`` (``config``, ``attributes``) where git looks for it:
    ``$XDG_CONFIG_HOME/git/``, else ``$HOME/.config/git/``; None when neither is set. (A
    relative place is returned as it is, for the caller to refuse.)"""
    xdg, home = os.environ.get("XDG_CONFIG_HOME"), os.environ.get("HOME")
    if xdg:
        return Path(f"{xdg}/git/{name}")
    if home is not None:
        return Path(f"{home}/.config/git/{name}")
    return None


def object_id(kind: bytes, body: bytes, oid_length: int) -> str:
    """The id of an object of ``kind`` holding ``body`` (nothing is written)."""
    return _hash(_framed(kind, body), oid_length)


def _framed(kind: bytes, body: bytes) -> bytes:
    """An object as git hashes and stores it: its kind, its size, a NUL, its content."""
    return kind + b" " + str(len(body)).encode() + b"\0" + body


def _hash(whole: bytes, oid_length: int) -> str:
    """The id of a framed object in the repository's object format."""
    return hashlib.new("sha256" if oid_length == 64 else "sha1", whole).hexdigest()


def read_loose(objects: Path, oid: str, limit: int = 1 << 16) -> tuple[bytes, bytes] | None:
    """A small loose object's kind and content, read from its file and held to what git
    checks: one whole zlib stream and nothing after it, a header of a known kind and the
    exact size, the content hashing to its id. None to ask git (packed, larger than
    ``limit``, not there, or not what git would read)."""
    try:
        with open(objects / oid[:2] / oid[2:], "rb") as loose:
            raw = loose.read(limit + 1)
        inflate = zlib.decompressobj()
        whole = inflate.decompress(raw)
    except (OSError, zlib.error):
        return None
    if len(raw) > limit or not inflate.eof or inflate.unused_data:
        return None
    if _hash(whole, len(oid)) != oid:
        return None
    header, nul, body = whole.partition(b"\0")
    kind, _, size = header.partition(b" ")
    if not nul or kind not in _KINDS or size != str(len(body)).encode():
        return None
    return kind, body


def kind_of(objects: Path, oid: str) -> bytes | None:
    """The kind of object ``oid`` (``commit``, ``tree``, ``blob``, ``tag``), read from its
    loose file's header or its pack entry's (a delta's, from its chain's base); None when it
    is in neither, or git's to read."""
    try:
        with open(objects / oid[:2] / oid[2:], "rb") as loose:
            # A compressed block may open with its code tables (hundreds of bytes) before
            # the header's first byte: read on until the header is out.
            inflate, head = zlib.decompressobj(), b""
            while b"\0" not in head and (chunk := loose.read(512)) and len(head) < 64:
                head += inflate.decompress(chunk, 64 - len(head))
        return head.partition(b" ")[0] if b"\0" in head else None
    except FileNotFoundError:
        pass
    except (OSError, zlib.error):
        return None
    return packs.kind(objects, oid)


def read_object(objects: Path, oid: str) -> tuple[bytes, bytes] | None:
    """A small object's kind and content, loose or packed, checked against its id; None
    to ask git."""
    return read_loose(objects, oid) or read_packed(objects, oid)


def read_packed(objects: Path, oid: str) -> tuple[bytes, bytes] | None:
    """A packed object's kind and content (see :mod:`.packs`), believed only when it hashes
    to its id: a misread, a corrupted or a crafted pack is never taken for the object."""
    found = packs.read(objects, oid)
    if found is None:
        return None
    return found if _hash(_framed(*found), len(oid)) == oid else None


def identity(name: str, email: str, when: int, offset_minutes: int) -> bytes:
    """An author or committer line's value, as git formats it."""
    sign = "-" if offset_minutes < 0 else "+"
    minutes = abs(offset_minutes)
    return f"{name} <{email}> {when} {sign}{minutes // 60:02d}{minutes % 60:02d}".encode()


def message_bytes(message: str) -> bytes:
    """A commit message's bytes: UTF-8, and a character UTF-8 cannot hold (a lone surrogate
    the layers above missed) written as its escape. A NUL is refused, as git refuses it: the
    record escapes it where a record is made (``store.record.printable``)."""
    return message.encode("utf-8", "backslashreplace")


def commit_body(
    tree: str, parents: Sequence[str], author: bytes, committer: bytes, message: str
) -> bytes:
    """The content of a commit object, as ``git commit-tree`` writes it."""
    lines = [b"tree " + tree.encode()]
    lines += [b"parent " + parent.encode() for parent in parents]
    lines += [b"author " + author, b"committer " + committer]
    return b"\n".join(lines) + b"\n\n" + message_bytes(message)


def now() -> int:
    """The time git stamps a commit with: whole seconds of the real clock (a test that
    freezes ``time.time`` does not freeze git's)."""
    return int(time.clock_gettime(time.CLOCK_REALTIME))


def zone_offset(when: int) -> int:
    """The local zone's offset at ``when`` in minutes, as git computes it: the local time
    read back as if it were UTC (a zone that counts leap seconds is off by them), less
    ``when``, divided toward zero; the zone TZ names now (git reads it in each process)."""
    time.tzset()  # the C library keeps the zone it read first; git reads TZ in each process
    return int((calendar.timegm(time.localtime(when)) - when) / 60)


def write_loose(objects: Path, kind: bytes, body: bytes, oid_length: int) -> str:
    """Write an object as git writes a loose one, and return its id.

    The file is written whole under a temporary name in its folder, then linked into place,
    so a reader never sees part of it and an object already there is left as it is (its
    time refreshed, as git does, so a prune does not take it). Raises ``OSError`` when it
    cannot be written; nothing is left half written.
    """
    whole = _framed(kind, body)
    oid = _hash(whole, oid_length)
    folder = objects / oid[:2]
    final = folder / oid[2:]
    if final.exists():
        os.utime(final)
        return oid
    packed = packs.find(objects / "pack", bytes.fromhex(oid))
    if packed is not None:  # as git: the pack's time refreshed, no loose copy
        os.utime(packed[0])
        return oid
    folder.mkdir(exist_ok=True)
    tmp = folder / f"tmp_obj_{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    try:
        try:
            data = memoryview(zlib.compress(whole, 1))  # git's loose default: best speed
            while data:  # a short write is followed by the error that cut it short
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # written meanwhile: the same bytes
            os.link(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return oid


#: The modes git writes in a tree (a tree's without its leading zero), as ``diff-tree``
#: prints them. A tree holding any other is left to git, which canonicalises it.
_TREE_MODES = {b"40000": "040000", b"100644": "100644", b"100755": "100755",
               b"120000": "120000", b"160000": "160000"}  # fmt: skip


def tree_entries(body: bytes, oid_length: int) -> list[tuple[str, str, str]] | None:
    """A tree object's entries as (mode, name, object id), in their order; None when it is
    not exactly as git writes one (a mode git does not write, a name with a slash or none,
    entries out of git's order or twice), which is then git's to read."""
    width = oid_length // 2
    entries: list[tuple[str, str, str]] = []
    at, last, names = 0, b"", set()
    while at < len(body):
        space = body.find(b" ", at)
        nul = body.find(b"\0", space + 1)
        if space < 0 or nul < 0 or nul + 1 + width > len(body):
            return None
        mode, name = _TREE_MODES.get(body[at:space]), body[space + 1 : nul]
        if mode is None or not name or b"/" in name or name in names:
            return None  # a name twice (a file and a folder): git lists both, a dict cannot
        names.add(name)
        key = name + b"/" if mode == "040000" else name  # git's order: a tree as "name/"
        if key <= last:
            return None
        last = key
        oid = body[nul + 1 : nul + 1 + width].hex()
        entries.append((mode, name.decode("utf-8", "surrogateescape"), oid))
        at = nul + 1 + width
    return entries


def plain_commit(body: bytes) -> bool:
    """Whether a commit's content opens as git writes one: a tree, then parents, an author
    and a committer (a commit missing any is git's to judge)."""
    head = body.partition(b"\n\n")[0].split(b"\n")
    return (
        len(head) >= 3
        and head[0].startswith(b"tree ")
        and head[-1].startswith(b"committer ")
        and any(line.startswith(b"author ") for line in head)
    )
