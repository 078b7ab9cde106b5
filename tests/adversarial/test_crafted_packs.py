"""Packs crafted to break the reader that reads objects without git: each must read as
None (git's to answer) at once, in bounded memory, never raise, never be believed.

Found by a review of the reader: a 1 KB pack made it build 64 GiB (a delta copying before
its declared size was checked), spend 52 s (numbers of a million bytes), hold 1 GiB for
5 s (a delta that is its own base, or two that are each other's), or read before the pack's
start (a base further back than the entry). Each case runs in a process of its own under a
512 MiB address-space limit and a time limit many times what it takes, so a regression
fails rather than takes the machine.
"""

from __future__ import annotations

import hashlib
import resource
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

MiB = 1 << 20


def _header(kind: int, size: int) -> bytes:
    """A pack entry's type and size (little-endian base 128 after the first four bits)."""
    out, first, size = bytearray(), kind << 4 | size & 0x0F, size >> 4
    while size:
        out.append(first | 0x80)
        first, size = size & 0x7F, size >> 7
    out.append(first)
    return bytes(out)


def _distance(n: int) -> bytes:
    """An offset delta's distance to its base, as git encodes it."""
    out = [n & 0x7F]
    n >>= 7
    while n:
        n -= 1
        out.append(0x80 | n & 0x7F)
        n >>= 7
    return bytes(reversed(out))


def _size(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _name(tag: bytes) -> bytes:
    return hashlib.sha1(tag).digest()


def _write(objects: Path, entries: list[bytes], named: list[tuple[bytes, int]]) -> None:
    """A pack of ``entries`` and its version-2 index naming ``named`` (id, entry number)."""
    pack = bytearray(b"PACK" + (2).to_bytes(4) + len(entries).to_bytes(4))
    offsets = []
    for entry in entries:
        offsets.append(len(pack))
        pack += entry
    pack += hashlib.sha1(pack).digest()
    folder = objects / "pack"
    folder.mkdir(parents=True)
    (folder / "pack-crafted.pack").write_bytes(bytes(pack))
    pairs = sorted((oid, offsets[n]) for oid, n in named)
    idx = bytearray(b"\xfftOc" + (2).to_bytes(4))
    idx += b"".join(sum(oid[0] <= i for oid, _ in pairs).to_bytes(4) for i in range(256))
    idx += b"".join(oid for oid, _ in pairs) + b"\0\0\0\0" * len(pairs)
    idx += b"".join(offset.to_bytes(4) for _, offset in pairs) + pack[-20:]
    idx += hashlib.sha1(idx).digest()
    (folder / "pack-crafted.idx").write_bytes(bytes(idx))


def copy_bomb(objects: Path) -> bytes:
    """A delta declaring 100 bytes, then a million copies of 64 KiB (0x80: copy, sizes
    absent, so offset 0 and 0x10000 bytes)."""
    base = b"\0" * 0x10000
    first = _header(3, len(base)) + zlib.compress(base)
    delta = _size(len(base)) + _size(100) + b"\x80" * (MiB - 16)
    bomb = _header(6, len(delta)) + _distance(len(first)) + zlib.compress(delta, 9)
    _write(objects, [first, bomb], [(_name(b"bomb"), 1)])
    return _name(b"bomb")


def long_number(objects: Path) -> bytes:
    """A delta whose first size runs on for a mebibyte of continuation bytes."""
    first = _header(3, 5) + zlib.compress(b"hello")
    delta = b"\xff" * (MiB - 8) + b"\x01"
    entry = _header(6, len(delta)) + _distance(len(first)) + zlib.compress(delta, 9)
    _write(objects, [first, entry], [(_name(b"long"), 1)])
    return _name(b"long")


def long_distance(objects: Path) -> bytes:
    """An offset delta whose distance to its base is 300,000 bytes of continuation."""
    entry = _header(6, 8) + b"\xff" * 300_000 + b"\x01" + zlib.compress(b"\x05\x05\x05hello")
    _write(objects, [entry], [(_name(b"far"), 0)])
    return _name(b"far")


def own_base(objects: Path) -> bytes:
    """An offset delta at distance 0: its own base, a mebibyte of delta each time round."""
    delta = b"\0" * (MiB - 1)
    _write(objects, [_header(6, len(delta)) + _distance(0) + zlib.compress(delta)],
           [(_name(b"self"), 0)])  # fmt: skip
    return _name(b"self")


def each_other_s_base(objects: Path) -> bytes:
    """Two deltas naming each other by id as their base."""
    a, b, delta = _name(b"a"), _name(b"b"), b"\0" * (MiB - 1)
    entries = [_header(7, len(delta)) + b + zlib.compress(delta),
               _header(7, len(delta)) + a + zlib.compress(delta)]  # fmt: skip
    _write(objects, entries, [(a, 0), (b, 1)])
    return a


def before_the_pack(objects: Path) -> bytes:
    """A delta whose base would lie before the pack's first byte (read from its end)."""
    body = b"hello world"
    whole = _header(3, len(body)) + zlib.compress(body)
    delta = _size(len(body)) + _size(len(body)) + bytes([0x90, len(body)])
    at = 12 + len(whole)
    distance = at  # as far back again as the pack is long: the whole entry, read from the end
    for _ in range(3):
        entry = _header(6, len(delta)) + _distance(distance) + zlib.compress(delta)
        distance = at - 12 + (at + len(entry) + 20)
    oid = hashlib.sha1(b"blob 11\0" + body).digest()
    _write(objects, [whole, entry], [(oid, 1)])
    return oid


@pytest.mark.parametrize(
    "craft",
    [copy_bomb, long_number, long_distance, own_base, each_other_s_base, before_the_pack],
)
def test_a_crafted_pack_is_git_s_to_read_at_once_and_in_little_memory(
    tmp_path: Path, craft: Callable[[Path], bytes]
) -> None:
    objects = tmp_path / "objects"
    oid = craft(objects).hex()
    reader = (
        "import sys; from pathlib import Path; from pytest_agentgate.git import objects as o; "
        "print(o.read_packed(Path(sys.argv[1]), sys.argv[2]), o.read_object(Path(sys.argv[1]), sys.argv[2]))"
    )

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (512 * MiB, 512 * MiB))

    ran = subprocess.run([sys.executable, "-c", reader, str(objects), oid], capture_output=True,
                         text=True, timeout=15, preexec_fn=bounded, check=False)  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.split() == ["None", "None"], ran
