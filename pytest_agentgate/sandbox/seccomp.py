"""A seccomp filter that keeps a contained command's hands off other processes' insides.

Inside the sandbox the command runs as the same user as bwrap's first process (the
namespace's init, which tells bwrap's monitor the command's exit status), and neither has
a capability: the kernel would let the command attach to it with ``ptrace``, copy its
descriptors with ``pidfd_getfd`` or write its memory with ``process_vm_writev``, and so
forge its exit status or clear its tie to pytest. The filter makes those calls fail with
``EPERM`` (bwrap loads it, with ``--seccomp``, into every process of the sandbox; a filter
cannot be lifted by the process it binds). Writing ``/proc/1/mem``, the same power through
a file, is masked in the sandbox's ``/proc`` (see :meth:`.containment.Sandbox.wrap`).

The program is classic BPF, built here for the machine's architecture; a machine this
module has no table for gets no filter (:func:`program` returns ``b""``).
"""

from __future__ import annotations

import platform
import struct
from functools import cache

# BPF instruction classes and fields (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO_EPERM = 0x00050000 | 1
_ARCH_OFFSET, _NR_OFFSET = 4, 0
#: Architecture (AUDIT_ARCH_*) -> the calls refused: ptrace, process_vm_readv,
#: process_vm_writev, pidfd_getfd. x86_64 also runs i386 calls (int 0x80) and x32 calls
#: (numbers with bit 30 set): both are filtered, so neither is a way around.
_TABLES: dict[str, list[tuple[int, tuple[int, ...]]]] = {
    "x86_64": [(0xC000003E, (101, 310, 311, 438)), (0x40000003, (26, 347, 348, 438))],
    "aarch64": [(0xC00000B7, (117, 270, 271, 438))],
}
_X32_BIT = 0x40000000


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


@cache
def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one), as bwrap's ``--seccomp`` reads it
    (built once per process)."""
    tables = _TABLES.get(machine or platform.machine())
    if not tables:
        return b""
    blocks: list[list[bytes]] = []
    for _, numbers in tables:
        block = [_insn(_LD_W_ABS, 0, 0, _NR_OFFSET)]
        if len(tables) > 1 and numbers[0] == 101:  # x86_64: an x32 call is refused
            block.append(_insn(_JGE_K, 0, 0, _X32_BIT))  # jt patched below to the refusal
        block += [_insn(_JEQ_K, 0, 0, nr) for nr in numbers]  # jt patched below
        block.append(_insn(_RET_K, 0, 0, _ALLOW))
        blocks.append(block)
    # Layout, by index: 0 loads the architecture; 1.. one test per architecture, jumping to
    # its block; then "allow" (an architecture with no table); the blocks; the refusal last.
    # A jump's offset counts the instructions after it.
    out = [_insn(_LD_W_ABS, 0, 0, _ARCH_OFFSET)]
    starts, at = [], len(tables) + 2
    for block in blocks:
        starts.append(at)
        at += len(block)
    refusal = at
    for i, (arch, _) in enumerate(tables):
        out.append(_insn(_JEQ_K, starts[i] - len(out) - 1, 0, arch))
    out.append(_insn(_RET_K, 0, 0, _ALLOW))
    for i, block in enumerate(blocks):
        for j, raw in enumerate(block):
            code, _, _, k = struct.unpack("<HBBI", raw)
            jumps = code in (_JEQ_K, _JGE_K)
            out.append(_insn(code, refusal - starts[i] - j - 1, 0, k) if jumps else raw)
    out.append(_insn(_RET_K, 0, 0, _ERRNO_EPERM))
    return b"".join(out)
