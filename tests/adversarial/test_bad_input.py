"""Bad input: each gets an error naming the value and where it came from; nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import git

from pytest_agentgate import Engine, GateSpec, GitTooOld
from pytest_agentgate.git import runner as _git

GATED = """
import pytest

@pytest.mark.gated(task="t", gate=[])
def test_t(agent_workspace):
    (agent_workspace.path / "x.txt").write_text("x")
"""


def test_git_older_than_needed_is_refused() -> None:
    with pytest.raises(
        GitTooOld, match=r"git \d+\.\d+.* is too old: pytest-agentgate needs git 99.0 or newer"
    ):
        _git.require_version((99, 0))
    _git.require_version()  # this machine's git is new enough


@pytest.mark.parametrize("name", ["-main", "a..b", "has space", "new\nline", "x.lock", ""])
def test_malformed_target_names(pytester: pytest.Pytester, service: Path, name: str) -> None:
    pytester.makepyfile(test_t=GATED)
    result = pytester.runpytest(f"--agentgate-repo={service}", f"--agentgate-target={name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "is not a valid branch name" in result.stderr.str()
        or "does not exist" in result.stderr.str()
    )


def test_shallow_clone_says_how_to_deepen(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    first = git(service, "rev-parse", "main")
    (service / "more.txt").write_text("more\n")
    git(service, "add", "more.txt")
    git(service, "commit", "-qm", "more")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth=1", f"file://{service}", str(shallow))
    pytester.makepyfile(test_t=GATED)
    result = pytester.runpytest(f"--agentgate-repo={shallow}", f"--agentgate-base={first}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*{first!r} does not name a commit*shallow clone*git fetch --unshallow*"]
    )


def test_bare_repository_without_the_target(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(service), str(bare))
    git(bare, "symbolic-ref", "HEAD", "refs/heads/trunk")
    pytester.makepyfile(test_t=GATED)
    result = pytester.runpytest(f"--agentgate-repo={bare}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*branch 'trunk' does not exist in*bare.git*--agentgate-target*"])
    # Naming the target makes the bare repository usable; promotion needs no working tree.
    result = pytester.runpytest(
        f"--agentgate-repo={bare}", "--agentgate-target=main", "--agentgate-promote"
    )
    result.assert_outcomes(passed=1)
    assert git(bare, "show", "main:x.txt") == "x"
    # Bare repositories keep no reflog by default; the plugin creates one for the target.
    assert git(bare, "config", "--get", "core.logAllRefUpdates", check=False) in ("", "false")
    assert git(bare, "reflog", "show", "--format=%gs", "main").startswith(
        "agentgate promote: t by agent"
    )


def test_detached_head_needs_a_target(pytester: pytest.Pytester, service: Path) -> None:
    git(service, "checkout", "-q", "--detach")
    pytester.makepyfile(test_t=GATED)
    result = pytester.runpytest(f"--agentgate-repo={service}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no branch checked out*--agentgate-target BRANCH*"])


def test_engine_errors_carry_their_data(service: Path) -> None:
    from pytest_agentgate import RevisionNotFound

    with pytest.raises(RevisionNotFound) as info:
        Engine.open(service, "main", base="no-such-rev", gate=GateSpec())
    assert info.value.rev == "no-such-rev" and info.value.source == "base"
