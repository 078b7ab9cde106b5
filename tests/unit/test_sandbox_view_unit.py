"""The sandbox's command line: the read view is built once per process, and a folder that
must stay hidden is masked even when it appears after the view was first built."""

from __future__ import annotations

from pathlib import Path

from pytest_agentgate.sandbox.containment import Mounts, Role, Sandbox, Settings


def masks(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"]


def test_a_hidden_folder_made_after_the_first_command_is_still_masked(tmp_path: Path) -> None:
    readable = tmp_path / "shared"  # a folder a person made readable to commands
    readable.mkdir()
    secret = readable / "base-repo"  # the base repository, made there later
    box = Sandbox(Settings(mode="bwrap", reads=(readable,)), "bwrap", hidden=(secret,))
    mounts = Mounts(tmp_path / "w", tmp_path / "p")
    for path in (mounts.cwd, mounts.tmp, mounts.home):
        path.mkdir(parents=True)

    def line() -> list[str]:
        return box.wrap(["true"], mounts, role=Role("gate"))

    first = line()
    assert str(readable) in first and str(secret) not in masks(first)
    secret.mkdir()
    assert str(secret) in masks(line())
    assert line() == line()  # built once: the same command line again
