"""Objects read from git's pack files without a git process: found through a pack's index,
their chain of deltas followed back to a whole object and applied forward, each result
checked against its id by the caller's hash.

A pack is read with ``pread``, never mapped (a file truncated under the reader would kill
the process), and every number in it is held to what git holds it to, with bounds on the
work: a header or a delta that is not as git writes it, a chain that loops or runs too
deep, a delta that would build more than it says, or simply more work than a git process
costs, makes the answer None, which the caller leaves to git. The format is git's
(gitformat-pack); following a pack's index and its entries in place is what dulwich's pack
reader does, as an idea.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

#: An object's kind from the type bits of its pack entry header (6 and 7 are deltas).
KIND = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}
_OFS_DELTA, _REF_DELTA = 6, 7
#: The largest object (or delta) read here; trees and commits are far smaller.
_LIMIT = 1 << 20
#: The deepest chain of deltas followed: git's own default depth (``gc --aggressive`` makes
#: chains of 250, each link a read and an inflation: past 50, a git process costs less).
_CHAIN_LIMIT = 50
#: Delta instructions applied for one object, and bytes inflated for it: past either, a
#: git process costs less than this interpreter.
_WORK_LIMIT = 2000
_INFLATE_LIMIT = 4 << 20
#: The most bytes of a variable-length number (64 bits of value).
_VARINT_BYTES = 10
#: The most packs searched for an object (each index is opened per lookup).
_PACKS_READ = 16
#: A pack starts with a 12-byte header; no entry lies before it.
_HEADER = 12


class _Unreadable(ValueError):
    """Not as git writes it, or more work than asking git: the caller asks git."""


def _raw(oid: str) -> bytes:
    try:
        return bytes.fromhex(oid)
    except ValueError:
        return b""


def find(packs: Path, raw: bytes) -> tuple[Path, int] | None:
    """The pack holding ``raw`` (a binary object id) and where in it, or None."""
    if len(raw) not in (20, 32):
        return None
    try:
        names = [n for n in os.listdir(packs) if n.endswith(".idx")]
    except OSError:
        return None
    if len(names) > _PACKS_READ:
        return None
    for name in names:
        try:
            offset = _offset_in(packs / name, packs / f"{name[:-4]}.pack", raw)
        except (OSError, _Unreadable):
            continue
        if offset is not None:
            return packs / f"{name[:-4]}.pack", offset
    return None


def _offset_in(idx: Path, pack: Path, raw: bytes) -> int | None:
    """Where ``raw`` starts in ``pack``, from its version-2 index ``idx``, which must be of
    the size its count of objects gives and name ``pack``'s checksum, as git requires."""
    width = len(raw)
    fd = os.open(idx, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8 + 256 * 4, 0)
        if len(head) != 8 + 256 * 4 or head[:8] != b"\xfftOc\x00\x00\x00\x02":
            raise _Unreadable("not a version-2 index")

        def fanout(i: int) -> int:  # objects whose first byte is at most i (three are read)
            return int.from_bytes(head[8 + 4 * i : 12 + 4 * i])

        count = fanout(255)
        least = 8 + 256 * 4 + count * (width + 8) + 2 * width
        if not least <= size <= least + max(count - 1, 0) * 8:
            raise _Unreadable("an index of the wrong size")
        low = fanout(raw[0] - 1) if raw[0] else 0
        high = fanout(raw[0])
        if not low <= high <= count:
            raise _Unreadable("a fan-out table out of order")
        names = 8 + 256 * 4
        while low < high:
            mid = (low + high) // 2
            found = os.pread(fd, width, names + mid * width)
            if found == raw:
                return _entry_offset(
                    fd, names + count * (width + 4) + mid * 4, count, width, size, pack
                )
            low, high = (mid + 1, high) if found < raw else (low, mid)
        return None
    finally:
        os.close(fd)


def _entry_offset(fd: int, at: int, count: int, width: int, size: int, pack: Path) -> int:
    """The pack offset stored at ``at`` of an index (a large one through its 8-byte table),
    once the pack is known to be the one the index was made for."""
    offset = int.from_bytes(os.pread(fd, 4, at))
    if offset & 0x80000000:  # the low bits index the table of large offsets
        large = 8 + 256 * 4 + count * (width + 8)
        index = offset & 0x7FFFFFFF
        if large + (index + 1) * 8 > size - 2 * width:
            raise _Unreadable("a large offset past its table")
        offset = int.from_bytes(os.pread(fd, 8, large + index * 8))
    with open(pack, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        if not _HEADER <= offset < end - width:
            raise _Unreadable("an offset outside its pack")
        if os.pread(f.fileno(), width, end - width) != os.pread(fd, width, size - 2 * width):
            raise _Unreadable("an index made for another pack")
    return offset


class _Pack:
    """One pack file open for reading."""

    def __init__(self, path: Path, objects: Path, width: int) -> None:
        self.path, self.objects, self.width = path, objects, width
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)

    def varint(self, data: bytes, at: int) -> tuple[int, int]:
        """A little-endian base-128 number of at most :data:`_VARINT_BYTES` bytes."""
        value = 0
        for n in range(_VARINT_BYTES):
            if at + n >= len(data):
                raise _Unreadable("a number cut short")
            value |= (data[at + n] & 0x7F) << (7 * n)
            if not data[at + n] & 0x80:
                return value, at + n + 1
        raise _Unreadable("a number longer than git writes")

    def chain(self, offset: int) -> list[tuple[int, int, int]]:
        """The entries from ``offset`` back to a whole object, as (type, size, where the
        data starts): each delta's base strictly before it, or named by an id in this pack,
        never one seen already."""
        seen: set[int] = set()
        found: list[tuple[int, int, int]] = []
        while len(found) <= _CHAIN_LIMIT:
            if offset in seen or not _HEADER <= offset < self.size - self.width:
                raise _Unreadable("a chain that loops or leaves its pack")
            seen.add(offset)
            head = os.pread(self.fd, 16 + 2 * _VARINT_BYTES + self.width, offset)
            kind, size, at = head[0] >> 4 & 7, head[0] & 0x0F, 1
            if head[0] & 0x80:
                more, at = self.varint(head, 1)
                size |= more << 4
            if size > _LIMIT:
                raise _Unreadable("an object too large to read here")
            if kind in KIND:
                found.append((kind, size, offset + at))
                return found
            if kind == _OFS_DELTA:
                distance, at = self._distance(head, at)
                found.append((kind, size, offset + at))
                if not _HEADER <= offset - distance < offset:
                    raise _Unreadable("a base outside the pack")
                offset -= distance
            elif kind == _REF_DELTA:
                base = find(self.objects / "pack", head[at : at + self.width])
                if base is None or base[0] != self.path:
                    raise _Unreadable("a base in another pack, or none")
                found.append((kind, size, offset + at + self.width))
                offset = base[1]
            else:
                raise _Unreadable("an entry of no known type")
        raise _Unreadable("a chain deeper than git makes")

    def _distance(self, head: bytes, at: int) -> tuple[int, int]:
        """An offset delta's distance back to its base (big-endian, one added a byte)."""
        byte = head[at]
        distance, at = byte & 0x7F, at + 1
        for _ in range(_VARINT_BYTES):
            if not byte & 0x80:
                return distance, at
            byte = head[at]
            distance, at = ((distance + 1) << 7) | (byte & 0x7F), at + 1
        raise _Unreadable("a distance longer than git writes")

    def inflate(self, at: int, size: int) -> bytes:
        """``size`` bytes inflated from the zlib stream at ``at``, read a few kilobytes at a
        time (where the stream ends is not recorded)."""
        inflate, out = zlib.decompressobj(), b""
        step = min(max(4096, size + 64), _LIMIT)
        while not inflate.eof:
            chunk = os.pread(self.fd, step, at)
            if not chunk:
                raise _Unreadable("an entry runs past the end of its pack")
            out += inflate.decompress(chunk, size + 1 - len(out))
            if len(out) > size or inflate.unconsumed_tail:
                raise _Unreadable("an entry larger than its header says")
            at += len(chunk)
        if len(out) != size:
            raise _Unreadable("an entry not the size its header says")
        return out


#: What reading a pack raises when it is not as git writes it, or changed under the reader.
_FAILED = (OSError, IndexError, _Unreadable, zlib.error)


def _opened(objects: Path, oid: str) -> tuple[_Pack, int] | None:
    """The pack holding ``oid``, open, and where in it the object starts; None if none."""
    found = find(objects / "pack", _raw(oid))
    if found is None:
        return None
    try:
        return _Pack(found[0], objects, len(oid) // 2), found[1]
    except OSError:
        return None


def kind(objects: Path, oid: str) -> bytes | None:
    """The kind of packed object ``oid``: its entry's, or its chain's base's for a delta."""
    opened = _opened(objects, oid)
    if opened is None:
        return None
    pack, offset = opened
    try:
        return KIND[pack.chain(offset)[-1][0]]
    except _FAILED:
        return None
    finally:
        pack.close()


def read(objects: Path, oid: str) -> tuple[bytes, bytes] | None:
    """Packed object ``oid``'s kind and content, its deltas applied one at a time (the
    caller checks the result against the id); None to ask git."""
    opened = _opened(objects, oid)
    if opened is None:
        return None
    pack, offset = opened
    try:
        chain = pack.chain(offset)
        base_kind, size, at = chain[-1]
        data = pack.inflate(at, size)
        work, inflated = _WORK_LIMIT, size
        for _, size, at in reversed(chain[:-1]):
            inflated += size
            if inflated > _INFLATE_LIMIT:
                raise _Unreadable("more to inflate than a git process costs")
            data, work = _apply_delta(pack, data, pack.inflate(at, size), work)
        return KIND[base_kind], data
    except _FAILED:
        return None
    finally:
        pack.close()


def _apply_delta(pack: _Pack, base: bytes, delta: bytes, work: int) -> tuple[bytes, int]:
    """``base`` with ``delta`` applied (copies of its ranges, inserted bytes), never past
    the size the delta declares; and what is left of ``work``."""
    size, at = pack.varint(delta, 0)
    if size != len(base):
        raise _Unreadable("a delta for another base")
    size, at = pack.varint(delta, at)
    if size > _LIMIT:
        raise _Unreadable("a delta's result too large to read here")
    out = bytearray()
    while at < len(delta):
        work -= 1
        if work < 0:
            raise _Unreadable("more delta than a git process costs")
        op, at = delta[at], at + 1
        if op & 0x80:  # copy: up to four bytes of offset, three of size, each if its bit is set
            start = length = 0
            for bit in range(4):
                if op & (1 << bit):
                    start, at = start | delta[at] << (8 * bit), at + 1
            for bit in range(3):
                if op & (0x10 << bit):
                    length, at = length | delta[at] << (8 * bit), at + 1
            length = length or 0x10000
            if start + length > len(base) or len(out) + length > size:
                raise _Unreadable("a delta copies past its base or its result")
            out += base[start : start + length]
        elif op:  # insert the next ``op`` bytes
            if at + op > len(delta) or len(out) + op > size:
                raise _Unreadable("a delta inserts past its end or its result")
            out += delta[at : at + op]
            at += op
        else:
            raise _Unreadable("a delta with a reserved instruction")
    if len(out) != size:
        raise _Unreadable("a delta's result not the size it says")
    return bytes(out), work
