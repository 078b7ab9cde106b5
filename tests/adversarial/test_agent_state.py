"""Attacks on what a retry resumes: checkpoints, state outside the workspace, notes.

Each test is an attack that worked in a trial of the first version of retries and
checkpoints, kept so it stays stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import git

from pytest_agentgate import Engine, GateSpec
from pytest_agentgate.errors import AgentgateError, ConfigError


def engine(service: Path, **options: object) -> Engine:
    return Engine.open(
        service, "main", promote=True, workdir=service.parent / "work",
        gate=GateSpec(outcome_is_enough=True), **options,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_forged_trailer_in_a_checkpoint_message_restores_nothing(
    service: Path, tmp_path: Path
) -> None:
    """The agent builds a tree holding ``@abs/<a host path>`` and gets its id into the
    checkpoint's message (a test body that checkpoints with the agent's own progress notes):
    a full resume must never take it for the checkpoint's state and write it to the host."""
    target = tmp_path / "host" / "owned-by-agent.txt"
    e = engine(service)
    ws = e.fork(task="forge")
    payload = tmp_path / "payload"
    (payload / "@abs" / str(target).lstrip("/")).parent.mkdir(parents=True)
    (payload / "@abs" / str(target).lstrip("/")).write_text("written by the plugin\n")
    index = tmp_path / "forge-index"
    env = {**os.environ, "GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": str(payload)}
    subprocess.run(["git", "-C", str(service), "add", "-A"], env=env, check=True)
    tree = subprocess.run(
        ["git", "-C", str(service), "write-tree"], env=env, check=True, capture_output=True,
        text=True,
    ).stdout.strip()  # fmt: skip
    (ws.path / "x.txt").write_text("x\n")
    point = ws.checkpoint(f"migrated half the schema\n\nAgentgate-State: {tree}\n")
    child = e.fork(task="forge", resume_from=point, mode="full")
    assert not target.exists()
    assert (child.path / "x.txt").exists()  # the checkpoint's code still resumes
    message = git(service, "log", "-1", "--format=%B", point)
    assert message.splitlines()[0].endswith("migrated half the schema Agentgate-State: " + tree)


def test_a_checkpoint_naming_a_state_that_is_not_its_parent_is_refused(
    service: Path, tmp_path: Path
) -> None:
    from pytest_agentgate.git.repo import Author, BaseRepo
    from pytest_agentgate.store import checkpoints

    repo = BaseRepo(service / ".git", service)
    base = repo.history.resolve_commit("main")
    forged = repo.commit_tree(
        repo.tree_of(base), [base],
        f"agentgate: checkpoint: x\n\nAgentgate-State: {base}\n", Author("a", "a@e"),
    )  # fmt: skip
    assert repo.refs.update(f"{checkpoints.PREFIX}forged/t/1", forged, None, "test")
    with pytest.raises(checkpoints.CheckpointError, match="not its parents"):
        checkpoints.read(repo, forged)


def test_overlapping_state_paths_are_refused(tmp_path: Path) -> None:
    """``state=[S/sub/db, S]``: the agent replaced ``S/sub`` by a link to a host folder, and
    putting the inner path back deleted a host file through it (capture read one)."""
    from pytest_agentgate.pytest_plugin.marker import gated

    outer = str(tmp_path / "S")
    with pytest.raises(TypeError, match="overlap: declare the outer one alone"):
        gated("t", state=[f"{outer}/sub/db", outer])
    with pytest.raises(TypeError, match="overlap"):
        gated("t", state=["var/", "var/app.db"])


def test_a_state_path_reached_through_a_link_is_refused(service: Path, tmp_path: Path) -> None:
    """Put back through a linked ancestor, git replaced the host's link by a folder."""
    real = tmp_path / "real" / "a"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    e = engine(service)
    ws = e.fork(task="linked")
    with (
        pytest.raises(ConfigError, match="reached through a symbolic link"),
        e.state_held(ws, [str(tmp_path / "link" / "a")]),
    ):
        pass
    assert (tmp_path / "link").is_symlink()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to run as nobody")
def test_a_read_only_folder_an_agent_left_in_state_is_still_put_back(tmp_path: Path) -> None:
    """As an unprivileged user (the agent is the same user in its sandbox), a folder the
    agent made read-only kept what it wrote past the put back, silently."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    import tempfile

    # Somewhere the unprivileged user can reach (pytest's own folders are root's alone).
    place = Path(tempfile.mkdtemp(prefix="agentgate-nobody-", dir="/tmp"))
    os.chmod(place, 0o755)
    state = place / "state"
    (state / "keep").mkdir(parents=True)
    (state / "keep" / "backdoor.txt").write_text("planted by a rejected try\n")
    os.chmod(state / "keep", 0o555)
    subprocess.run(["chown", "-R", "65534:65534", str(state)], check=True)
    # What the unprivileged user runs is a copy of the removal module where it can read it,
    # with an interpreter it can start: a clone in a private folder (mktemp -d, mode 0700)
    # is out of its reach, and so is a virtual environment inside it.
    from pytest_agentgate.sandbox import removal

    shutil.copy(removal.__file__, place / "removal.py")
    os.chmod(place / "removal.py", 0o644)
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    python = next(
        (
            exe
            for exe in dict.fromkeys((sys.executable, sys._base_executable, "/usr/bin/python3"))
            if os.path.exists(exe)
            and subprocess.run([*as_nobody, exe, "-I", "-c", "pass"], check=False).returncode == 0
        ),
        None,
    )
    if python is None:
        shutil.rmtree(place, ignore_errors=True)
        pytest.skip("no Python interpreter the unprivileged user can start")
    script = (
        f"import sys; sys.path.insert(0, {str(place)!r}); from pathlib import Path; "
        f"from removal import empty_dir; empty_dir(Path({str(state)!r}))"
    )
    done = subprocess.run(
        [*as_nobody, python, "-I", "-c", script], capture_output=True, text=True, check=False
    )
    try:
        assert done.returncode == 0, done.stderr
        assert state.is_dir() and list(state.iterdir()) == []
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -5, 10**308])
def test_a_note_that_could_never_reach_a_budget_is_refused(service: Path, value: float) -> None:
    ws = engine(service).fork(task="notes")
    with pytest.raises(AgentgateError, match="finite, not negative, and its sum"):
        ws.note(tokens=value)


def test_notes_whose_sum_overflows_or_whose_kind_changes_are_refused(service: Path) -> None:
    """Found by a third trial: two notes of 10**300 each passed, their sum overflowed the
    budget's float after the attempt was promoted (its report row was lost); and a string in
    place of a number reset the try's count, so the budget never bound."""
    ws = engine(service).fork(task="notes")
    ws.note(tokens=2**52)
    with pytest.raises(AgentgateError, match="its sum in a try at most"):
        ws.note(tokens=2**52 + 1)
    with pytest.raises(AgentgateError, match="was noted as int"):
        ws.note(tokens="done")
    ws.note(model="stand-in")
    with pytest.raises(AgentgateError, match="was noted as str"):
        ws.note(model=3)
    assert ws.notes == {"tokens": 2**52, "model": "stand-in"}


def test_a_checkpoint_of_a_huge_agent_git_is_refused(service: Path) -> None:
    """An agent that fills its .git made each checkpoint copy gigabytes."""
    from pytest_agentgate.store.checkpoints import CheckpointError

    e = engine(service, max_bytes=100_000)
    ws = e.fork(task="huge")
    with open(ws.path / ".git" / "blob0", "wb") as out:
        out.truncate(1 << 20)
    with pytest.raises(CheckpointError, match="bytes, more than 100,000"):
        ws.checkpoint("step")


def test_overlap_is_found_whatever_the_spelling(tmp_path: Path) -> None:
    """Found by a second trial: ``/x/./state`` or ``/x//state`` beside ``/x/state/sub/db``
    passed the overlap check, and the put back deleted a host file through the agent's link."""
    from pytest_agentgate.pytest_plugin.marker import gated

    outer = tmp_path / "state"
    for spelling in (f"{tmp_path}/./state", f"{tmp_path}//state", f"{outer}/."):
        with pytest.raises(TypeError, match="overlap"):
            gated("t", state=[f"{outer}/sub/db", spelling])


def test_a_state_path_spelled_oddly_is_put_back_whole(service: Path, tmp_path: Path) -> None:
    """Found by a second trial: a declared ``/x//state`` was compared unnormalised with what
    the capture named, so the put back emptied the folder and then refused to restore it."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "precious.db").write_text("the user's\n")
    e = engine(service)
    ws = e.fork(task="odd spelling")
    with e.state_held(ws, [f"{tmp_path}//state/"]):
        (state / "precious.db").write_text("the agent's\n")
        (state / "planted.txt").write_text("x\n")
        e.put_back_state(ws)
    assert sorted(p.name for p in state.iterdir()) == ["precious.db"]
    assert (state / "precious.db").read_text() == "the user's\n"


def test_land_holds_an_attempt_to_its_test_s_own_rules(
    capsys: pytest.CaptureFixture[str], service: Path
) -> None:
    """Found by a second trial: ``agentgate land`` of an attempt rejected by its marker's
    ``protect=`` landed it (land judged it by the run's rules alone)."""
    from pytest_agentgate.cli.main import main

    e = engine(service)
    spec = GateSpec(commands=("true",), exit_code=("true",), protect=("ledger/api.py",))
    ws = e.fork(task="backdoor")
    (ws.path / "ledger" / "api.py").write_text("BACKDOOR = True\n")
    first = e.run_attempt(ws, task="backdoor", spec=spec)
    assert first.verdict.status == "rejected" and first.verdict.check == "protect"
    capsys.readouterr()
    code = main(
        [
            "land",
            "--repo",
            str(service),
            first.record_ref,
            "--gate-exit-code",
            "true",
            "--sandbox",
            "none",
        ]
    )
    assert code == 1 and "is not one land judges again" in capsys.readouterr().err
    assert "BACKDOOR" not in git(service, "show", "main:ledger/api.py")
    record = git(service, "log", "-1", "--format=%B", first.record_ref)
    assert 'Agentgate-Protect: ["ledger/api.py"]' in record


def test_restore_sends_no_state_through_a_link_the_restored_code_holds(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    """Found by a second trial (with an allow-symlink glob matching it): the code restored
    first held ``.agentgate-state-root -> /``, and the state then went to the host's paths."""
    from pytest_agentgate.cli.main import main

    host = tmp_path / "host-state"
    host.mkdir()
    e = engine(service, allow_symlinks=(".agentgate-state-root",))
    ws = e.fork(task="root link")
    with e.state_held(ws, [str(host)]):
        (host / "planted.txt").write_text("planted by a rejected agent\n")
        (ws.path / ".agentgate-state-root").symlink_to("/")
        attempt = e.run_attempt(ws, task="root link", state=[str(host)])
        e.put_back_state(ws)
    assert not (host / "planted.txt").exists()
    out = tmp_path / "restored"
    capsys.readouterr()
    code = main(
        ["restore", "--repo", str(service), attempt.record_ref, "--to", str(out), "--state"]
    )
    assert code == 1 and "reached through a symbolic link" in capsys.readouterr().err
    assert not (host / "planted.txt").exists()


@pytest.mark.parametrize("how", ["a timeout", "a check named like the gate"])
def test_land_refuses_what_it_cannot_judge_again(
    capsys: pytest.CaptureFixture[str], service: Path, how: str
) -> None:
    """Found by a third trial: land took any ``error`` verdict (an agent's timeout, a state
    problem) for one it could judge, and a Python check named ``gate_policy`` for the gate."""
    from pytest_agentgate.cli.main import main

    e = engine(service)
    ws = e.fork(task="refused")
    (ws.path / "EVIL.md").write_text("the test refuses me\n")
    if how == "a timeout":
        found = e.run_attempt(ws, task="refused", agent_error="agent timed out after 3 s")
    else:

        def gate_policy(attempt: object) -> bool:
            return False

        found = e.run_attempt(ws, task="refused", extra_checks=[gate_policy])
    assert found.verdict.status in ("error", "rejected")
    capsys.readouterr()
    code = main(["land", "--repo", str(service), found.record_ref, "--gate-exit-code", "true",
                 "--sandbox", "none"])  # fmt: skip
    assert code == 1 and "is not one land judges again" in capsys.readouterr().err
    assert "EVIL.md" not in git(service, "ls-tree", "--name-only", "main")


# -- declared state is put back exactly, or refused before any agent works ---------------

STATE_AGENT = """
import pathlib
import pytest

@pytest.mark.gated(task="Tune the settings", state=[{appdata!r}], gate=["false"],
                   results="exit-code")
def test_agent_edits_appdata(agent_workspace):
    pathlib.Path({ran!r}).write_text("the agent ran")
    pathlib.Path({appdata!r}, "settings.json").write_text('{{"debug": true}}\\n')
    (agent_workspace.path / "fix.py").write_text("FIXED = True\\n")
"""


def _listing(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry under ``root``: its kind, its mode, a file's text."""
    import stat

    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            text = path.read_text() if stat.S_ISREG(info.st_mode) else ""
            found[str(path.relative_to(root))] = (
                stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), text,
            )  # fmt: skip
    return found


def _appdata(tmp_path: Path) -> Path:
    appdata = tmp_path / "appdata"
    (appdata / "tls").mkdir(parents=True)
    (appdata / "settings.json").write_text('{"debug": false}\n')
    (appdata / "tls" / "chain.txt").write_text("issuer\n")
    return appdata


UNCAPTURABLE = {
    "a secret": lambda a: (a / ".env").write_text("DB_PASSWORD=hunter2\n"),
    "a file of mode 0600": lambda a: (a / "tls" / "chain.txt").chmod(0o600),
    "an empty folder": lambda a: (a / "uploads" / "2024").mkdir(parents=True),
    "a FIFO": lambda a: os.mkfifo(a / "events.fifo"),
    "a folder of mode 0700": lambda a: (a / "tls").chmod(0o700),
}


@pytest.mark.parametrize("what", sorted(UNCAPTURABLE))
def test_declared_state_that_cannot_be_put_back_exactly_stops_the_run_first(
    pytester: pytest.Pytester, service: Path, tmp_path: Path, what: str
) -> None:
    """Once, a rejected attempt's put-back emptied the folder and wrote back only what the
    capture held: secrets, empty folders, special files and modes were lost."""
    appdata = _appdata(tmp_path)
    UNCAPTURABLE[what](appdata)
    before = _listing(appdata)
    ran = tmp_path / "ran"
    pytester.makepyfile(test_agents=STATE_AGENT.format(appdata=str(appdata), ran=str(ran)))
    result = pytester.runpytest(f"--agentgate-repo={service}", "--agentgate-sandbox=none")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*cannot be put back exactly after a rejected attempt*"])
    assert not ran.exists()  # no agent worked
    assert _listing(appdata) == before


def test_declared_state_is_put_back_exactly_after_a_rejected_attempt(
    pytester: pytest.Pytester, service: Path, tmp_path: Path
) -> None:
    appdata = _appdata(tmp_path)
    (appdata / "run.sh").write_text("#!/bin/sh\n")
    (appdata / "run.sh").chmod(0o755)
    before = _listing(appdata)
    ran = tmp_path / "ran"
    pytester.makepyfile(test_agents=STATE_AGENT.format(appdata=str(appdata), ran=str(ran)))
    result = pytester.runpytest(f"--agentgate-repo={service}", "--agentgate-sandbox=none")
    result.assert_outcomes(failed=1)
    assert ran.exists()
    assert _listing(appdata) == before
