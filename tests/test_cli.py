"""The agentgate command against real repositories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fsck, git, land, spawn_pytest

from pytest_agentgate.cli.main import main
from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.sandbox.containment import Settings


def agentgate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def history(service: Path) -> dict[str, str]:
    """Three promotions on main: a, b, c, each adding one file."""
    ids = {"start": git(service, "rev-parse", "main")}
    for name in "abc":
        attempt = land(
            service, {f"{name}.txt": f"{name}\n"}, task=f"add {name}", agent=f"agent-{name}"
        )
        assert attempt.verdict.status == "promoted", attempt.verdict
        ids[name] = git(service, "rev-parse", "main")
    return ids


def test_rollback_gives_the_identical_tree_and_keeps_history(
    capsys: pytest.CaptureFixture[str], service: Path, history: dict[str, str]
) -> None:
    code, out, _ = agentgate(
        capsys, "rollback", "--repo", str(service), "--to", history["start"], "--agent", "ops"
    )
    assert code == 0
    tip = git(service, "rev-parse", "main")
    assert git(service, "rev-parse", "main^{tree}") == git(
        service, "rev-parse", f"{history['start']}^{{tree}}"
    )
    assert (
        git(service, "rev-parse", "main^") == history["c"]
    )  # a new commit on top: nothing rewritten
    assert f"tree now:             {git(service, 'rev-parse', 'main^{tree}')}" in out
    assert git(service, "status", "--porcelain") == ""
    assert not (service / "a.txt").exists()  # the checked-out files followed
    assert "agentgate rollback" in git(service, "reflog", "-1", "--format=%gs", "main")
    records = [
        json.loads(line)
        for line in agentgate(capsys, "log", "--repo", str(service), "--json")[1].splitlines()
    ]
    assert (
        records[0]["op"] == "rollback" and records[0]["new"] == tip and records[0]["agent"] == "ops"
    )
    fsck(service)


@pytest.mark.parametrize("dry_run", [False, True])
def test_stale_expect_refuses_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], service: Path, history: dict[str, str], dry_run: bool
) -> None:
    args = ["rollback", "--repo", str(service), "--to", history["start"], "--expect", history["b"]]
    code, _, err = agentgate(capsys, *args, *(["--dry-run"] if dry_run else []))
    assert code == 1
    assert f"refs/heads/main is at {history['c']}, not at the expected {history['b']}" in err
    assert len(err.strip().splitlines()) == 1
    assert git(service, "rev-parse", "main") == history["c"]
    assert (service / "c.txt").exists()


def test_rollback_dry_run_and_dirty_tree(
    capsys: pytest.CaptureFixture[str], service: Path, history: dict[str, str]
) -> None:
    code, out, _ = agentgate(
        capsys, "rollback", "--repo", str(service), "--to", history["a"], "--dry-run"
    )
    assert code == 0 and "would roll main back" in out
    assert git(service, "rev-parse", "main") == history["c"]
    (service / "a.txt").write_text("my edit\n")
    code, _, err = agentgate(capsys, "rollback", "--repo", str(service), "--to", history["start"])
    assert code == 1 and "uncommitted changes to tracked files (a.txt)" in err
    assert git(service, "rev-parse", "main") == history["c"]
    assert (service / "a.txt").read_text() == "my edit\n"


def test_revert_of_a_middle_promotion_keeps_the_later_ones(
    capsys: pytest.CaptureFixture[str], service: Path, history: dict[str, str]
) -> None:
    code, out, err = agentgate(
        capsys, "revert", "--repo", str(service), "add-b", "--expect", history["c"]
    )
    assert code == 0, err
    assert "reverted refs/agentgate/attempts/add-b/1" in out
    files = git(service, "ls-tree", "--name-only", "main").splitlines()
    assert "a.txt" in files and "c.txt" in files and "b.txt" not in files
    assert git(service, "rev-parse", "main^") == history["c"]
    assert not (service / "b.txt").exists() and git(service, "status", "--porcelain") == ""
    # Reverting it again has nothing left to undo.
    code, _, err = agentgate(capsys, "revert", "--repo", str(service), "add-b")
    assert code == 1 and "changes nothing" in err


def test_revert_conflict_and_gate(capsys: pytest.CaptureFixture[str], service: Path) -> None:
    land(service, {"notes.txt": "one\n"}, task="write notes")
    land(service, {"notes.txt": "two\n"}, task="rewrite notes")
    tip = git(service, "rev-parse", "main")
    code, _, err = agentgate(capsys, "revert", "--repo", str(service), "write-notes")
    assert code == 1 and "revert conflicts in: notes.txt" in err
    code, _, err = agentgate(
        capsys, "revert", "--repo", str(service), "rewrite-notes", "--gate", "false"
    )
    assert code == 1 and "gate command exited 1: false" in err
    assert "the gate rejected the reverted tree" in err and "nothing was changed" in err
    assert git(service, "rev-parse", "main") == tip
    code, out, err = agentgate(
        capsys, "revert", "--repo", str(service), "rewrite-notes", "--gate", "grep -q one notes.txt"
    )
    assert code == 0, err
    assert "gate on the reverted tree: passed" in out
    assert (service / "notes.txt").read_text() == "one\n"


def test_revert_refuses_an_attempt_that_did_not_land(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    land(service, {"x.txt": "x\n"}, task="dry", promote=False)
    code, _, err = agentgate(capsys, "revert", "--repo", str(service), "dry")
    assert code == 1 and "was not promoted (verdict passed)" in err  # refused, not misspelt


def test_attempts_show_and_filters(
    capsys: pytest.CaptureFixture[str], service: Path, history: dict[str, str]
) -> None:
    land(service, {}, task="do nothing", agent="lazy")
    code, out, _ = agentgate(capsys, "attempts", "--repo", str(service))
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("REF")
    assert [line.split()[0] for line in lines[1:]] == [
        "do-nothing/1",
        "add-c/1",
        "add-b/1",
        "add-a/1",
    ]
    _, out, _ = agentgate(
        capsys, "attempts", "--repo", str(service), "--verdict", "rejected", "--json"
    )
    [row] = json.loads(out)
    assert row["agent"] == "lazy" and row["verdict"] == "rejected" and row["base"] == history["c"]
    _, out, _ = agentgate(
        capsys, "attempts", "--repo", str(service), "--agent", "agent-b", "--json"
    )
    assert [r["task"] for r in json.loads(out)] == ["add b"]
    code, out, _ = agentgate(capsys, "show", "--repo", str(service), "add-a")
    assert code == 0
    assert (
        "Agentgate-Verdict: promoted" in out
        and "b.txt" not in out
        and "+a" in out
        and "1 file changed" in out
    )
    code, _, err = agentgate(capsys, "show", "--repo", str(service), "add")
    assert code == 2 and "matches 3 attempts" in err
    code, _, err = agentgate(capsys, "show", "--repo", str(service), "nothing-like-this")
    assert code == 2 and "no attempt matches 'nothing-like-this'" in err
    code, out, _ = agentgate(capsys, "attempts", "--repo", str(service), "--agent", "nobody")
    assert code == 0 and out.strip() == "no attempts match"


def test_prune_never_removes_a_landed_attempt(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    land(service, {"kept.txt": "k\n"}, task="landed")
    land(service, {}, task="rejected one")
    land(service, {"y.txt": "y\n"}, task="dry one", promote=False)
    code, out, _ = agentgate(
        capsys, "prune", "--repo", str(service), "--older-than", "0s", "--dry-run"
    )
    assert code == 0 and "would remove refs/agentgate/attempts/rejected-one/1" in out
    assert len(git(service, "for-each-ref", "refs/agentgate/attempts/").splitlines()) == 3
    code, out, _ = agentgate(capsys, "prune", "--repo", str(service), "--older-than", "0s")
    assert code == 0
    assert "kept refs/agentgate/attempts/landed/1 (landed on main)" in out
    remaining = git(
        service, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/"
    ).splitlines()
    assert remaining == ["refs/agentgate/attempts/landed/1"]
    ops = [
        json.loads(x)["op"]
        for x in agentgate(capsys, "log", "--repo", str(service), "--json")[1].splitlines()
    ]
    assert ops.count("prune") == 2
    fsck(service)


def test_prune_keeps_recent_and_rotates_the_log(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    land(service, {}, task="old")
    land(service, {}, task="new")
    code, out, _ = agentgate(
        capsys,
        "prune",
        "--repo",
        str(service),
        "--older-than",
        "0s",
        "--keep-last",
        "1",
        "--rotate-bytes",
        "10",
    )
    assert (
        code == 0
        and "removed refs/agentgate/attempts/old/1" in out
        and "rotated the operations log" in out
    )
    assert (
        git(service, "for-each-ref", "--format=%(refname)", "refs/agentgate/")
        == "refs/agentgate/attempts/new/1\nrefs/agentgate/layout"  # the layout stays
    )
    # Rotated records are still read, in order.
    _, out, _ = agentgate(capsys, "log", "--repo", str(service), "--json")
    assert [json.loads(x)["op"] for x in out.splitlines()] == ["prune", "attempt", "attempt"]


def test_prune_workspaces_keeps_the_newest_runs(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    for i in range(4):
        run = root / f"run-{i}"
        run.mkdir(parents=True)
        (run / ".agentgate-run").write_text("x")
        os.utime(run / ".agentgate-run", (1000 + i, 1000 + i))
    (root / "not-ours").mkdir()
    code, out, _ = agentgate(
        capsys, "prune", "--repo", str(service), "--workspaces", str(root), "--keep-runs", "2"
    )
    assert code == 0 and out.count("removed workspace run") == 2
    assert sorted(p.name for p in root.iterdir()) == ["not-ours", "run-2", "run-3"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["rollback"], "the following arguments are required: --to"),
        (["prune", "--older-than", "soon"], "invalid duration 'soon'"),
        (["log", "--limit", "-3"], "'-3' must not be negative"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], service: Path, args: list[str], message: str
) -> None:
    code, _, err = agentgate(capsys, *args)
    assert code == 2 and message in err


def test_bad_values_name_themselves(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    code, _, err = agentgate(capsys, "log", "--repo", str(tmp_path / "nowhere"))
    assert code == 2 and "no git repository at" in err and "(from --repo)" in err
    code, _, err = agentgate(capsys, "rollback", "--repo", str(service), "--to", "nope")
    assert code == 2 and "'nope' does not name a commit" in err and "(from --to)" in err
    code, _, err = agentgate(
        capsys, "rollback", "--repo", str(service), "--to", "main", "--target=-x"
    )
    assert code == 2 and "'-x' is not a valid branch name" in err


def test_log_from_two_concurrent_pytest_processes(pytester: pytest.Pytester, service: Path) -> None:
    """Two pytest processes gate 6 tasks each at once: every record arrives, whole."""
    pytester.makepyfile(
        test_many="""
        import os
        import pytest

        @pytest.mark.parametrize("n", range(6))
        @pytest.mark.gated(task="parallel task", gate=[])
        def test_task(agent_workspace, n):
            name = f"{os.environ['WHO']}-{n}.txt"
            (agent_workspace.path / name).write_text(name)
        """
    )
    procs = [
        spawn_pytest(
            pytester.path,
            f"--agentgate-repo={service}",
            "--agentgate-promote",
            f"--basetemp={pytester.path / who}",
            env={"WHO": who},
        )
        for who in ("left", "right")
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    raw = (service / ".git" / "agentgate" / "oplog.jsonl").read_text()
    lines = [line for line in raw.splitlines() if line]
    records = [json.loads(line) for line in lines]  # a torn line would not parse
    assert sum(r["op"] == "attempt" for r in records) == 12
    assert sum(r["op"] == "promote" for r in records) == 12
    assert sorted(int(r["ref"].rsplit("/", 1)[1]) for r in records if r["op"] == "attempt") == list(
        range(1, 13)
    )
    tree = git(service, "ls-tree", "--name-only", "main").splitlines()
    assert sum(name.endswith(".txt") for name in tree) == 12  # no promotion lost
    fsck(service)


def test_demo_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "demo"
    code = main(["demo", "--keep", str(keep)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "the story held" in out
    import re

    match = re.search(r"trees equal: ([0-9a-f]{40}) == ([0-9a-f]{40})", out)
    assert match and match[1] == match[2]
    assert (keep / "service" / ".git").is_dir()
    fsck(keep / "service")


def test_demo_leaves_nothing_behind_and_runs_as_a_console_script(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", "demo"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_rollback_to_the_tree_it_already_has_changes_nothing(
    capsys: pytest.CaptureFixture[str], service: Path, history: dict[str, str]
) -> None:
    """Nothing to do is no error: exit 0, said so, no commit and no log line."""
    lines = agentgate(capsys, "log", "--repo", str(service), "--json")[1].splitlines()
    code, out, _ = agentgate(capsys, "rollback", "--repo", str(service), "--to", history["c"])
    assert code == 0 and "nothing to do" in out
    assert git(service, "rev-parse", "main") == history["c"]
    assert agentgate(capsys, "log", "--repo", str(service), "--json")[1].splitlines() == lines


def test_restore_refuses_a_file_as_destination(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    from helpers import land

    land(service, {"x.txt": "x"}, task="plain")
    target = tmp_path / "a-file"
    target.write_text("mine")
    assert (
        agentgate(capsys, "restore", "--repo", str(service), "plain", "--to", str(target))[0] == 1
    )
    assert target.read_text() == "mine"


def test_keep_runs_needs_workspaces(capsys: pytest.CaptureFixture[str], service: Path) -> None:
    code, _, err = agentgate(capsys, "prune", "--repo", str(service), "--keep-runs", "1")
    assert code == 2 and "--keep-runs needs --workspaces" in err


def landed_then_pushed_by_hand(service: Path) -> tuple[str, str]:
    """One attempt lands on main, then a person commits on top: (the start, that commit)."""
    start = git(service, "rev-parse", "main")
    assert land(service, {"a.txt": "a\n"}, "first").verdict.status == "promoted"
    (service / "person.txt").write_text("p\n")
    git(service, "add", "person.txt")
    git(service, "commit", "-qm", "pushed by hand")
    return start, git(service, "rev-parse", "main")


def test_audit_lists_what_no_passing_gate_judged(
    service: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_agentgate.cli.main import main

    start, person = landed_then_pushed_by_hand(service)
    assert land(service, {"b.txt": "b\n"}, "second").verdict.status == "promoted"
    assert main(["audit", "--repo", str(service), "--since", start, "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["commit"] for r in rows] == [person]
    assert main(["audit", "--repo", str(service), "--since", person]) == 0
    assert "1 of 1 commits on main have a tree a passing gate judged" in capsys.readouterr().out
    # A rollback to a judged tree is that tree again: judged.
    assert main(["rollback", "--repo", str(service), "--to", f"{person}~1"]) == 0
    capsys.readouterr()
    assert main(["audit", "--repo", str(service), "--since", person]) == 0


def test_audit_does_not_count_a_merge_no_gate_ran_on(
    service: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_agentgate import Engine, GateSpec
    from pytest_agentgate.cli.main import main

    start = git(service, "rev-parse", "main")
    e = Engine.open(service, "main", promote=True, workdir=service.parent / "work",
                    base=start, gate=GateSpec(outcome_is_enough=True))  # fmt: skip
    for name in ("a", "b"):  # both from the same base: the second lands as a merge
        ws = e.fork(task=name)
        (ws.path / f"{name}.txt").write_text(name)
        assert e.run_attempt(ws, task=name).verdict.status == "promoted"
    merge = git(service, "rev-parse", "main")
    assert git(service, "rev-list", "--count", "--merges", f"{start}..main") == "1"
    assert main(["audit", "--repo", str(service), "--since", start, "--json"]) == 1
    assert [r["commit"] for r in json.loads(capsys.readouterr().out)] == [merge]


def test_prune_removes_old_scratch_refs_and_keeps_a_recent_one(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    land(service, {"y.txt": "y\n"}, task="dry one", promote=False)  # a run's scratch ref, now
    main = git(service, "rev-parse", "main")
    old = "refs/agentgate/dryruns/run-gone/main"
    git(service, "update-ref", old, main)  # a run's, never used since: no log line
    code, out, _ = agentgate(capsys, "prune", "--repo", str(service), "--older-than", "0s")
    assert code == 0
    assert f"removed {old} (an old dry run's scratch ref)" in out
    assert git(service, "for-each-ref", old) == ""
    # Used minutes ago, so perhaps by a run still going: kept whatever the cutoff.
    assert len(git(service, "for-each-ref", "refs/agentgate/dryruns/").splitlines()) == 1


def test_an_attempt_number_is_never_claimed_again_after_prune(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    """Pruning the newest attempts of a task frees their refs, not their numbers: a later
    attempt at the task gets the next number, so a number names one attempt for good."""
    from pytest_agentgate.store import attempts

    for _ in range(3):
        land(service, {}, task="again", promote=False)
    repo = BaseRepo(service / ".git", service)
    assert attempts.high_water(repo, "again") == 0  # a claim is its ref: no mark written yet
    code, _, _ = agentgate(
        capsys, "prune", "--repo", str(service), "--older-than", "0s", "--keep-last", "0"
    )
    assert code == 0
    assert git(service, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/") == ""
    # Prune kept the mark before deleting.
    assert attempts.high_water(repo, "again") == 3
    after = land(service, {}, task="again", promote=False)
    assert after.record_ref == "refs/agentgate/attempts/again/4"


def test_land_judges_a_rejected_attempt_again_once_its_gate_is_fixed(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    """An attempt rejected by a gate that failed for a reason outside the code (a flaky
    service, a broken runner) lands with `agentgate land`, without its agent, onto the
    target as it is now: judged against its own base, merged, re-tested, recorded anew."""
    from pytest_agentgate import Engine, GateSpec

    flag = tmp_path / "service-up"
    gate = f'{sys.executable} -c "import pathlib, sys; sys.exit(0 if pathlib.Path({str(flag)!r}).exists() else 1)"'
    e = Engine.open(
        service, "main", promote=True, workdir=service.parent / "work",
        gate=GateSpec(commands=(gate,), exit_code=(gate,)), sandbox=Settings(mode="none"),
    )  # fmt: skip
    ws = e.fork(task="add notes")
    (ws.path / "notes.txt").write_text("notes\n")
    first = e.run_attempt(ws, task="add notes")
    assert first.verdict.status == "rejected"
    land(service, {"other.txt": "o\n"}, task="meanwhile")  # the target moves on
    flag.touch()  # the outside problem is fixed
    code, out, _ = agentgate(
        capsys, "land", "--repo", str(service), first.record_ref, "--gate-exit-code", gate,
        "--sandbox", "none",
    )  # fmt: skip
    assert code == 0, out
    assert (
        "judged again: promoted" in out and "recorded as refs/agentgate/attempts/add-notes/2" in out
    )
    on_main = git(service, "ls-tree", "--name-only", "main").splitlines()
    assert {"notes.txt", "other.txt"} <= set(on_main)
    git(service, "fsck", "--strict", "--no-progress")


def test_land_dry_run_writes_nothing(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    """``land --dry-run`` wrote a record and a scratch ref and printed a fast-forward: it
    says what would land, and no ref of the repository changes."""
    from pytest_agentgate import Engine, GateSpec

    e = Engine.open(
        service, "main", promote=True, workdir=service.parent / "work",
        gate=GateSpec(commands=("false",), exit_code=("false",)), sandbox=Settings(mode="none"),
    )  # fmt: skip
    ws = e.fork(task="add notes")
    (ws.path / "notes.txt").write_text("notes\n")
    first = e.run_attempt(ws, task="add notes")
    assert first.verdict.status == "rejected"
    before = git(service, "for-each-ref", "--format=%(refname) %(objectname)")
    code, out, _ = agentgate(
        capsys, "land", "--repo", str(service), first.record_ref, "--gate-exit-code", "true",
        "--sandbox", "none", "--dry-run",
    )  # fmt: skip
    assert code == 0, out
    assert "would land on main (fast-forward); nothing was written" in out
    after = git(service, "for-each-ref", "--format=%(refname) %(objectname)")
    assert [r for r in after.splitlines() if "refs/agentgate/results/" not in r] == [
        r for r in before.splitlines() if "refs/agentgate/results/" not in r
    ]


def test_log_hides_the_journal_s_lines_unless_asked(
    capsys: pytest.CaptureFixture[str], service: Path, history: dict[str, str]
) -> None:
    """A promotion writes pending and pending-done lines around its move: how its record was
    settled, not a move. The default view shows moves; --all shows the journal too."""
    shown = agentgate(capsys, "log", "--repo", str(service))[1]
    every = agentgate(capsys, "log", "--repo", str(service), "--all")[1]
    assert "promote" in shown and " pending" not in shown and "pending-done" not in shown
    assert " pending " in every and "pending-done" in every
    assert len(every.splitlines()) > len(shown.splitlines())


def test_attempts_keeps_its_columns_with_long_names(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    long_task = "make the ledger report totals per account and per month " * 2
    land(service, {"a.txt": "a"}, task=long_task, agent="an-agent-with-a-long-name-v2")
    land(service, {"b.txt": "b"}, task="short", agent="b")
    out = agentgate(capsys, "attempts", "--repo", str(service))[1].splitlines()
    assert "an-agent-with-a-long-name-v2" in out[1] + out[2]  # never cut
    starts = [[line.index(col) for col in ("promoted",)] for line in out[1:3]]
    assert starts[0] == starts[1]  # the verdict column lines up
    head = out[0]
    for line in out[1:3]:
        agent_at = head.index("AGENT")
        assert line[agent_at - 2 : agent_at] == "  "  # each column starts where its head does


def test_audit_by_default_covers_what_came_after_the_first_record(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    """The history before the plugin's first record could not have been gated: by default
    it is not listed (it made every audit of a real repository exit 1); --all lists it."""
    start, person = landed_then_pushed_by_hand(service)
    assert main(["audit", "--repo", str(service), "--json"]) == 1
    assert [r["commit"] for r in json.loads(capsys.readouterr().out)] == [person]
    assert main(["audit", "--repo", str(service), "--all", "--json"]) == 1
    assert [r["commit"] for r in json.loads(capsys.readouterr().out)] == [person, start]


def test_a_missing_repository_is_named_with_the_option_that_names_it(
    capsys: pytest.CaptureFixture[str], pytester: pytest.Pytester, tmp_path: Path
) -> None:
    code, _, err = agentgate(capsys, "log", "--repo", str(tmp_path / "nowhere"))
    assert code == 2 and "--repo PATH" in err
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gated(task="t")
        def test_t(agent_workspace):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 4
    assert "name another with --agentgate-repo=PATH" in result.stderr.str()


def test_land_of_an_attempt_rejected_on_a_buggy_base_lands_after_the_fix(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    """The agent's new test used a base function that was wrong: rejected. A person fixes
    the function on main. `agentgate land` judges the attempt merged onto main as it is now,
    against main's own results, and lands it without its agent, keeping the fix; judged on
    its own base again it was rejected again."""
    from pytest_agentgate import Engine, GateSpec

    gate = f"{sys.executable} -m pytest -q -p no:cacheprovider tests"
    store = (service / "ledger" / "store.py").read_text()
    (service / "ledger" / "half.py").write_text("def half(n):\n    return n // 3\n")  # the bug
    git(service, "add", "-A")
    git(service, "commit", "-qm", "a helper, wrong")
    e = Engine.open(service, "main", promote=True, workdir=service.parent / "work",
                    gate=GateSpec(commands=(gate,)), sandbox=Settings(mode="none"))  # fmt: skip
    ws = e.fork(task="use half")
    (ws.path / "tests" / "test_half.py").write_text(
        "from ledger.half import half\n\n\ndef test_half():\n    assert half(10) == 5\n"
    )
    first = e.run_attempt(ws, task="use half")
    assert first.verdict.status == "rejected", first.verdict
    e.close()
    (service / "ledger" / "half.py").write_text("def half(n):\n    return n // 2\n")  # the fix
    git(service, "commit", "-qam", "fix half")
    fixed = git(service, "rev-parse", "main")
    code, out, err = agentgate(
        capsys, "land", "--repo", str(service), first.record_ref, "--gate", gate, "--sandbox", "none"
    )  # fmt: skip
    assert code == 0, out + err
    assert "judged again: promoted" in out
    assert git(service, "merge-base", "--is-ancestor", fixed, "main") == ""
    assert "n // 2" in git(service, "show", "main:ledger/half.py")  # the fix is kept
    assert "test_half" in git(service, "show", "main:tests/test_half.py")
    assert (service / "ledger" / "store.py").read_text() == store
    fsck(service)


def test_attempts_marks_what_a_revert_or_a_rollback_undid(
    capsys: pytest.CaptureFixture[str], service: Path, history: dict[str, str]
) -> None:
    """Once, ``attempts`` said 'promoted' for landings reverted or rolled back since."""
    code, _, err = agentgate(capsys, "revert", "--repo", str(service), "add-b")
    assert code == 0, err
    revert = git(service, "rev-parse", "main")
    code, _, err = agentgate(capsys, "rollback", "--repo", str(service), "--to", history["a"])
    assert code == 0, err
    rollback = git(service, "rev-parse", "main")
    code, out, _ = agentgate(capsys, "attempts", "--repo", str(service))
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert f"promoted (reverted by {revert[:12]})" in lines["add-b/1"]
    assert f"promoted (rolled back by {rollback[:12]})" in lines["add-c/1"]
    assert "rolled back" not in lines["add-a/1"] and "reverted" not in lines["add-a/1"]
    code, out, _ = agentgate(capsys, "attempts", "--repo", str(service), "--json")
    undone = {row["ref"].rsplit("/", 2)[-2]: row["undone"] for row in json.loads(out)}
    assert undone == {
        "add-a": "", "add-b": f"reverted by {revert[:12]}",
        "add-c": f"rolled back by {rollback[:12]}",
    }  # fmt: skip
