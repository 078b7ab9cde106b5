"""The seccomp program refuses exactly the calls that reach into another process."""

from __future__ import annotations

import struct

import pytest

from pytest_agentgate.sandbox import seccomp


def decide(program: bytes, arch: int, nr: int) -> int:
    """Run the classic BPF program on a seccomp_data of ``arch`` and ``nr`` (the few
    instructions the filter uses)."""
    insns = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    data = {0: nr, 4: arch}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = data[k]
        elif code == 0x06:
            return k
        elif code == 0x15:
            pc += jt if acc == k else jf
        elif code == 0x35:
            pc += jt if acc >= k else jf
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


ALLOW, EPERM = 0x7FFF0000, 0x00050001
X86_64, I386 = 0xC000003E, 0x40000003


@pytest.mark.parametrize(
    ("arch", "nr", "expected"),
    [
        (X86_64, 101, EPERM),  # ptrace
        (X86_64, 311, EPERM),  # process_vm_writev
        (X86_64, 438, EPERM),  # pidfd_getfd
        (X86_64, 0x40000000 | 101, EPERM),  # x32 ptrace
        (I386, 26, EPERM),  # i386 ptrace through int 0x80
        (I386, 348, EPERM),  # i386 process_vm_writev
        (X86_64, 0, ALLOW),  # read
        (X86_64, 59, ALLOW),  # execve
        (X86_64, 434, ALLOW),  # pidfd_open (waiting on a pid is harmless)
        (I386, 3, ALLOW),  # i386 read
    ],
)
def test_x86_64_refuses_only_the_reaching_calls(arch: int, nr: int, expected: int) -> None:
    assert decide(seccomp.program("x86_64"), arch, nr) == expected


def test_aarch64_and_unknown_machines() -> None:
    arm = seccomp.program("aarch64")
    assert decide(arm, 0xC00000B7, 117) == EPERM and decide(arm, 0xC00000B7, 63) == ALLOW
    assert seccomp.program("sparc") == b""
