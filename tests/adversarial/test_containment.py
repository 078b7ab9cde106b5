"""An agent with a shell in its workspace tries to get around the tested tree.

Each test is one way broken code reached the target, or files outside the workspace were
touched, before the sandbox and the supervisor existed. They run with a real bubblewrap
sandbox (as root, as CI runs) and, where the guarantee must hold without one, uncontained.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import SERVICE, fsck, git, write

from pytest_agentgate import Engine, GateSpec
from pytest_agentgate.sandbox.containment import Settings
from pytest_agentgate.sandbox.network import Network

GOOD_STORE = textwrap.dedent(SERVICE["ledger/store.py"]).lstrip("\n")
BROKEN_STORE = GOOD_STORE.replace("self._rows.append(amount)", "pass")
PYTEST_GATE = f"{sys.executable} -m pytest -q -p no:cacheprovider tests"


def engine(
    repo: Path,
    mode: str,
    *,
    commands: tuple[str, ...] = (),
    promote: bool = True,
    **settings: object,
) -> Engine:
    extra = {
        k: settings.pop(k) for k in ("isolation", "allow_symlinks", "recycle") if k in settings
    }
    return Engine.open(
        repo,
        "main",
        promote=promote,
        workdir=repo.parent / "work",
        gate=GateSpec(
            commands=commands,
            exit_code=tuple(c for c in commands if "pytest" not in c),
            outcome_is_enough=not commands,
            timeout=60,
        ),
        sandbox=Settings(mode=mode, **settings),  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )


def watchers(number: int) -> list[int]:
    """Live processes whose command line carries the word ``watcher-<number>`` (a number of
    each test's own: tests running at once have watchers of their own)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                args = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"watcher-{number}".encode() in args:
                found.append(int(name))
    return found


# A process that outlives the agent's command and rewrites every copy of the store it can
# find (the gate's checkout is one) with working code, for 20 seconds.
WATCHER = textwrap.dedent(
    """
    import os, sys, time
    good = sys.argv[1]
    root = sys.argv[2]
    spared = sys.argv[4] if len(sys.argv) > 4 else None  # the agent's own workspace
    end = time.time() + 20
    while time.time() < end:
        for dirpath, dirnames, filenames in os.walk(root):
            if spared and (dirpath + "/").startswith(spared + "/"):
                continue
            if dirpath.endswith("/ledger") and "store.py" in filenames:
                try:
                    with open(os.path.join(dirpath, "store.py")) as f:
                        if f.read() != good:
                            with open(os.path.join(dirpath, "store.py"), "w") as out:
                                out.write(good)
                except OSError:
                    pass
        time.sleep(0.005)
    """
)


@pytest.mark.parametrize("how", ["setsid", "double-fork"])
def test_a_process_that_outlives_the_agent_cannot_fix_the_gate_checkout(
    service: Path, sandbox_mode: str, how: str
) -> None:
    e = engine(service, sandbox_mode, commands=(PYTEST_GATE,))
    ws = e.fork(task="watcher")
    (ws.path / "watcher.py").write_text(WATCHER)
    (ws.path / "good.txt").write_text(GOOD_STORE)
    number = random.randrange(10**6, 10**7)  # the shell's line says it as a sum, not the word
    start = f'python3 watcher.py "$(cat good.txt)" {e.workdir} watcher-$(({number - 1}+1))'
    command = f"setsid {start} &" if how == "setsid" else f"( ( {start} & ) & )"
    assert ws.run(command).returncode == 0
    assert not watchers(number), "the watcher outlived the command that started it"
    (ws.path / "ledger" / "store.py").write_text(BROKEN_STORE)
    before = git(service, "rev-parse", "main")
    attempt = e.run_attempt(ws, task="watcher")
    assert attempt.verdict.status == "rejected", attempt.verdict
    assert "no longer pass: tests/test_ledger.py::test_build" in attempt.verdict.reason
    assert git(service, "rev-parse", "main") == before
    assert not watchers(number)


def test_a_process_the_test_body_started_is_ended_before_the_snapshot(service: Path) -> None:
    e = engine(service, "none", commands=(PYTEST_GATE,))
    ws = e.fork(task="body watcher")
    number = random.randrange(10**6, 10**7)
    (ws.path / "watcher.py").write_text(WATCHER)
    proc = subprocess.Popen(
        [
            sys.executable,
            "watcher.py",
            GOOD_STORE,
            str(e.workdir),
            f"watcher-{number}",
            str(ws.path),
        ],
        cwd=ws.path,
        start_new_session=True,
    )
    # It fixes only gate checkouts: what the agent left in its workspace stays its own (a
    # watcher fixing the workspace before the snapshot would be the agent's own work).
    (ws.path / "ledger" / "store.py").write_text(BROKEN_STORE)
    attempt = e.run_attempt(ws, task="body watcher")
    proc.wait(timeout=10)  # ended before the snapshot, so the gate saw the broken store
    assert attempt.verdict.status == "rejected", attempt.verdict
    assert not watchers(number)


def test_ending_what_is_at_work_in_a_folder_spares_the_shell_that_started_pytest(
    tmp_path: Path,
) -> None:
    """A person's shell left in a workspace (it started pytest there) is at work in it too:
    ending the workspace's processes killed the shell, and with it the run. What the shell
    started beside pytest is ended; the shell and pytest are not."""
    end = (
        "from pathlib import Path; from pytest_agentgate.sandbox.process import "
        "end_processes_in; print('left', end_processes_in(Path.cwd()))"
    )
    script = 'sleep 30 & "$0" -c "$1"; echo shell still here; kill $! 2>/dev/null && echo sleep too; exit 0'
    ran = subprocess.run(
        ["sh", "-c", script, sys.executable, end],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran
    assert ran.stdout.split("\n")[:2] == ["left 0", "shell still here"], ran
    assert "sleep too" not in ran.stdout, ran


def test_gate_checkouts_are_private_and_unguessable(service: Path) -> None:
    e = engine(service, "none", commands=("pwd > /dev/null",))
    ws = e.fork(task="where")
    private = e.private_root()
    assert private.parent == e.workdir and oct(private.stat().st_mode & 0o777) == "0o700"
    assert ws.path.parent == e.workdir and not str(ws.path).startswith(str(private))
    seen: list[str] = []
    gate = f"{sys.executable} -c \"import os; open(os.environ['AGENTGATE_MARK'], 'a').write(os.getcwd() + chr(10))\""
    mark = service.parent / "seen.txt"
    spec = GateSpec(commands=(gate,), exit_code=(gate,), env={"AGENTGATE_MARK": str(mark)})
    (ws.path / "x.txt").write_text("x")
    assert e.run_attempt(ws, task="where", spec=spec).verdict.status == "promoted"
    seen = mark.read_text().split()
    for checkout in seen:
        assert Path(checkout).parent == private
        assert len(Path(checkout).name.split("-")[0]) == 32  # 128 random bits
    # Kept for the next gate run (reset before it, see test_judging), removed with the run.
    e.close()
    assert seen and not any(Path(checkout).exists() for checkout in seen)


# -- symlinks --------------------------------------------------------------------------


def _links(ws: Path, service: Path) -> dict[str, tuple[str, str]]:
    store = ws / "ledger" / "store.py"
    return {
        "absolute, to the base checkout's copy": ("ledger/store.py", str(service / "ledger" / "store.py")),
        "relative, climbing to the base checkout": (
            "ledger/store.py", os.path.relpath(service / "ledger" / "store.py", store.parent)
        ),
        "relative, out and back into the workspace's ignored files": (
            "ledger/store.py", os.path.join("..", "..", ws.name, "build", "store.py")
        ),
        "to itself": ("loop", "loop"),
        "through another link that leaves": ("ledger/store.py", "../up/store.py"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "absolute, to the base checkout's copy",
        "relative, climbing to the base checkout",
        "relative, out and back into the workspace's ignored files",
        "to itself",
        "through another link that leaves",
    ],
)
def test_a_symlink_out_of_the_tree_rejects(service: Path, case: str) -> None:
    write(service, {".gitignore": "__pycache__/\n*.pyc\nbuild/\n"})
    git(service, "commit", "-qam", "ignore build")
    e = engine(service, "none", commands=(PYTEST_GATE,))
    ws = e.fork(task="link out")
    (ws.path / "build").mkdir()
    (ws.path / "build" / "store.py").write_text(GOOD_STORE)
    path, target = _links(ws.path, service)[case]
    if case == "through another link that leaves":
        os.symlink("..", ws.path / "up")
    (ws.path / path).unlink(missing_ok=True)
    os.symlink(target, ws.path / path)
    before = git(service, "rev-parse", "main")
    attempt = e.run_attempt(ws, task="link out")
    assert attempt.verdict.status == "rejected"
    assert attempt.verdict.check == "snapshot"
    assert f"{path} -> {target}" in attempt.verdict.reason
    assert git(service, "rev-parse", "main") == before


def test_links_inside_the_tree_land_and_the_base_s_own_links_are_not_blamed(
    service: Path,
) -> None:
    os.symlink("/usr/bin", service / "system-bin")  # the base's own link out
    git(service, "add", "system-bin")
    git(service, "commit", "-qm", "a link the base has")
    e = engine(service, "none")
    ws = e.fork(task="links in")
    os.symlink("ledger/store.py", ws.path / "alias.py")
    os.symlink("../ledger/api.py", ws.path / "ledger" / "api_alias.py")
    os.symlink("../tests", ws.path / "ledger" / "tests_link")
    attempt = e.run_attempt(ws, task="links in")
    assert attempt.verdict.status == "promoted", attempt.verdict
    # A new link through the base's link out does leave the tree.
    ws = e.fork(task="through the base link")
    os.symlink("system-bin/python3", ws.path / "python")
    attempt = e.run_attempt(ws, task="through the base link")
    assert attempt.verdict.status == "rejected"
    assert "python -> system-bin/python3" in attempt.verdict.reason


# -- code run by the gate ----------------------------------------------------------------


def test_code_the_gate_runs_cannot_plant_hooks_or_move_the_target_later(
    service: Path, sandbox_mode: str
) -> None:
    git(service, "checkout", "-qb", "side")
    write(service, {"ledger/store.py": BROKEN_STORE})
    git(service, "commit", "-qam", "a broken commit, not on main")
    forged = git(service, "rev-parse", "side")
    git(service, "checkout", "-q", "main")
    hook = service / ".git" / "hooks" / "post-checkout"
    evil = f"""
        import subprocess


        def test_evil():
            try:
                with open({str(hook)!r}, "w") as f:
                    f.write("#!/bin/sh\\ntouch /tmp/pwned\\n")
            except OSError:
                pass
            mover = (
                "sleep 2; git -C {service} update-ref -m 'agentgate promote: forged' "
                "refs/heads/main {forged}"
            )
            subprocess.Popen(["setsid", "sh", "-c", mover], start_new_session=True)
        """
    e = engine(service, sandbox_mode, commands=(PYTEST_GATE,))
    ws = e.fork(task="evil test")
    write(ws.path, {"tests/test_evil.py": evil})
    attempt = e.run_attempt(ws, task="evil test")
    assert attempt.verdict.status == "promoted", attempt.verdict
    landed = git(service, "rev-parse", "main")
    time.sleep(3)
    assert git(service, "rev-parse", "main") == landed  # the mover was ended with the gate
    if sandbox_mode == "bwrap":
        assert not hook.exists()  # the base repository is not even visible in the sandbox
    fsck(service)


def test_a_move_with_a_reflog_message_like_the_plugin_s_is_still_external(
    service: Path,
) -> None:
    e = engine(service, "none")
    ws = e.fork(task="first")
    (ws.path / "first.txt").write_text("1")
    assert e.run_attempt(ws, task="first").verdict.status == "promoted"
    write(service, {"person.txt": "p"})
    git(service, "add", "person.txt")
    tree = git(service, "write-tree")
    forged = git(service, "commit-tree", tree, "-p", "main", "-m", "slipped in")
    git(service, "update-ref", "-m", "agentgate promote: first by agent", "refs/heads/main", forged)
    git(service, "reset", "-q", "--hard")
    e2 = engine(service, "none")
    ws = e2.fork(task="second", base=git(service, "rev-parse", "main~1"))
    (ws.path / "second.txt").write_text("2")
    attempt = e2.run_attempt(ws, task="second")
    assert attempt.verdict.status == "promoted"
    assert attempt.external_move == "agentgate promote: first by agent"


# -- deletion through a swapped symlink ------------------------------------------------------


def test_recycling_never_deletes_through_a_swapped_symlink(service: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "tmp.txt").write_text("keep me")
    (victim / "store.py").write_text("keep me too")
    e = engine(service, "none")
    ws = e.fork(task="swap")
    (ws.path / "x.txt").write_text("x")
    assert e.run_attempt(ws, task="swap").verdict.status == "promoted"
    base = git(service, "rev-parse", "main")
    nobody = _nobody()
    stop = threading.Event()
    swapper = textwrap.dedent(
        f"""
        import os, time
        ws, victim = {str(ws.path)!r}, {str(victim)!r}
        end = time.time() + 30
        while time.time() < end:
            try:
                os.makedirs(ws + "/ledger", exist_ok=True)
                open(ws + "/ledger/tmp.txt", "w").write("agent's")
                os.rename(ws + "/ledger", ws + "/ledger.real")
                os.symlink(victim, ws + "/ledger")
                time.sleep(0.0005)
                os.unlink(ws + "/ledger")
                os.rename(ws + "/ledger.real", ws + "/ledger")
            except OSError:
                pass
        """
    )
    if nobody is not None:
        subprocess.run(
            ["chown", "-R", f"{nobody.pw_uid}:{nobody.pw_gid}", str(ws.path)], check=True
        )
    # Another user's process needs an interpreter it can reach (not one under /root).
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") if nobody else None
    if nobody is not None and python is None:
        nobody = None
    proc = subprocess.Popen(
        [python or sys.executable, "-c", swapper],
        cwd="/",
        user=nobody.pw_uid if nobody else None,
        start_new_session=True,
    )
    try:
        for _ in range(25):
            from pytest_agentgate.workspace import recycle as workspace

            with contextlib.suppress(workspace.RecycleFailed):  # falling back is fine
                workspace.recycle(ws, base)
            assert (victim / "tmp.txt").read_text() == "keep me"
            assert (victim / "store.py").read_text() == "keep me too"
    finally:
        stop.set()
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in victim.iterdir()) == ["store.py", "tmp.txt"]


def _nobody() -> pwd.struct_passwd | None:
    if os.getuid() != 0:
        return None
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


def test_a_command_that_kills_its_supervisor_leaves_nothing_running(service: Path) -> None:
    from helpers import Sleeper

    sleeper = Sleeper()
    _require_pids_cgroup()
    e = engine(service, "none")
    ws = e.fork(task="kill the supervisor")
    escape = f'setsid sh -c "cd / && exec {sleeper.command}" < /dev/null > /dev/null 2>&1 &'
    result = ws.run(f"{escape} sleep 0.2; kill -9 $PPID; sleep 5")
    assert "exit status was lost" in result.launch_error and not result.ok
    assert not sleeper.alive()


def test_removal_walks_without_following_links(tmp_path: Path) -> None:
    from pytest_agentgate.sandbox.removal import UnsafePath, remove_tree, remove_under

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "tmp.txt").write_text("keep")
    root = tmp_path / "ws"
    (root / "real").mkdir(parents=True)
    os.symlink(victim, root / "ledger")
    with pytest.raises(UnsafePath):
        remove_under(root, "ledger/tmp.txt")
    os.symlink(victim, root / "real" / "inner")
    remove_under(root, "real")  # the directory goes, the link inside it as a link
    assert not (root / "real").exists() and (victim / "tmp.txt").exists()
    remove_under(root, "ledger")  # a link is removed as a link
    assert not os.path.lexists(root / "ledger") and (victim / "tmp.txt").exists()
    swapped = tmp_path / "swapped"
    os.symlink(victim, swapped)
    remove_tree(swapped)
    assert (victim / "tmp.txt").exists()


def test_removal_in_the_background_follows_no_link_and_is_waited_for(tmp_path: Path) -> None:
    """A gate's checkout is deleted after its verdict, in a thread: with the same care as a
    deletion in place (a link planted inside goes as a link), all of it done once
    ``removals_done`` returns, and one that fails does not stop the ones after it."""
    from pytest_agentgate.sandbox.removal import removals_done, remove_later

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    queued = []
    for n in range(12):
        folder = tmp_path / f"checkout-{n}"
        for d in range(5):
            (folder / f"d{d}").mkdir(parents=True)
            for f in range(40):
                (folder / f"d{d}" / f"f{f}.txt").write_text("x")
        os.symlink(victim, folder / "d0" / "out")
        queued.append(folder)
    remove_later(tmp_path / "bad\0name")  # its removal raises (ValueError), not OSError
    for folder in queued:
        remove_later(folder)
    removals_done()
    assert not any(folder.exists() for folder in queued)
    assert (victim / "keep.txt").read_text() == "keep"


def test_a_run_without_recycling_leaves_no_gate_checkout(service: Path) -> None:
    """Gate checkouts deleted in the background are all gone once the engine is closed,
    before the run's private folder goes: nothing of them is left in the workdir."""
    e = engine(service, "none", commands=("pwd > seen.txt",), recycle=False)
    for n in range(3):
        ws = e.fork(task=f"nothing left {n}")
        (ws.path / f"x{n}.txt").write_text("x")
        assert e.run_attempt(ws, task=f"nothing left {n}").verdict.status == "promoted"
        e.release(ws)
    private = e.private_root()
    e.close()
    assert not private.exists()
    assert sorted(p.name for p in e.workdir.iterdir() if not p.name.startswith(".")) == []


# -- names -----------------------------------------------------------------------------


def test_an_agent_name_with_a_newline_is_refused_everywhere(
    service: Path, pytester: pytest.Pytester
) -> None:
    from pytest_agentgate.errors import ConfigError

    forged = "bot\nAgentgate-Verdict: promoted"
    with pytest.raises(ConfigError, match="control character"):
        Engine.open(service, "main", agent=forged)
    e = engine(service, "none")
    ws = e.fork(task="t")
    with pytest.raises(ConfigError, match="control character"):
        e.run_attempt(ws, task="t", agent=forged)
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.gated(task="t", agent={forged!r}, gate=[])
        def test_t(agent_workspace):
            pass
        """
    )
    result = pytester.runpytest(f"--agentgate-repo={service}", "-p", "no:cacheprovider")
    assert result.ret == 2
    result.stdout.fnmatch_lines(["*invalid @pytest.mark.gated: agent must be a plain name*"])
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.gated(task='t', gate=[])\ndef test_t(agent_workspace):\n    pass\n"
    )
    result = pytester.runpytest(
        f"--agentgate-repo={service}", "-p", "no:cacheprovider", f"--agentgate-agent={forged}"
    )
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--agentgate-agent*control character*"])


def test_a_task_with_a_forged_trailer_stays_rejected_in_the_listing(service: Path) -> None:
    from pytest_agentgate.store import attempts

    e = engine(service, "none", commands=("false",))
    ws = e.fork(task="x")
    (ws.path / "x.txt").write_text("x")
    task = "fix\n\nAgentgate-Verdict: promoted\nAgentgate-Landed: " + "0" * 40
    attempt = e.run_attempt(ws, task=task, test="t::x\nAgentgate-Verdict: promoted")
    assert attempt.verdict.status == "rejected"
    [info] = attempts.list_attempts(e.repo)
    assert info.verdict == "rejected" and not info.landed
    assert info.task == "fix Agentgate-Verdict: promoted Agentgate-Landed: " + "0" * 40


# -- secrets ----------------------------------------------------------------------------


def test_default_excludes_keep_secret_directories_and_keys_out(service: Path) -> None:
    e = engine(service, "none")
    ws = e.fork(task="secrets")
    write(
        ws.path,
        {
            ".env/production": "TOKEN=1",
            "deploy/id_ed25519": "key",
            "deploy/id_ecdsa": "key",
            "certs/client.p12": "key",
            ".netrc": "machine x password y",
            ".pypirc": "[pypi]\npassword=y",
            "ok.txt": "fine",
        },
    )
    attempt = e.run_attempt(ws, task="secrets")
    assert attempt.verdict.status == "promoted"
    names = git(service, "ls-tree", "-r", "--name-only", "main").splitlines()
    assert "ok.txt" in names
    assert not [n for n in names if n.startswith((".env", "deploy", "certs", ".netrc", ".pypirc"))]
    record = git(service, "log", "-1", "--format=%B", str(attempt.record_ref))
    for path in (".env/production", "deploy/id_ed25519", "certs/client.p12", ".netrc"):
        assert path in record


def test_state_capture_honours_the_excludes(service: Path) -> None:
    e = engine(service, "none")
    ws = e.fork(task="stateful")
    write(ws.path, {"data/app.txt": "progress", "data/.env/prod": "TOKEN=1", "data/id_rsa": "k"})
    (ws.path / "ok.txt").write_text("x")
    attempt = e.run_attempt(ws, task="stateful", state=["data"])
    assert attempt.state is not None
    listing = git(service, "ls-tree", "-r", "--name-only", attempt.state).splitlines()
    assert listing == ["data/app.txt"]
    record = git(service, "log", "-1", "--format=%B", str(attempt.record_ref))
    assert "data/.env/prod" in record and "data/id_rsa" in record


def test_secrets_reach_commands_only_when_named(
    service: Path, sandbox_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEPLOY_TOKEN", "s3cr3t-value")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-agent")
    check = 'test -z "$DEPLOY_TOKEN" && test -z "$OPENAI_API_KEY"'
    e = engine(service, sandbox_mode, commands=(f"sh -c '{check}'",))
    ws = e.fork(task="env")
    assert ws.run(check).returncode == 0
    (ws.path / "x.txt").write_text("x")
    assert e.run_attempt(ws, task="env").verdict.status == "promoted"
    named = engine(
        service,
        sandbox_mode,
        commands=('sh -c \'test "$DEPLOY_TOKEN" = s3cr3t-value && test -z "$OPENAI_API_KEY"\'',),
        agent_env=("OPENAI_API_KEY",),
        gate_env=("DEPLOY_TOKEN",),
    )
    ws = named.fork(task="env named")
    assert ws.run('test "$OPENAI_API_KEY" = sk-agent && test -z "$DEPLOY_TOKEN"').returncode == 0
    (ws.path / "y.txt").write_text("y")
    assert named.run_attempt(ws, task="env named").verdict.status == "promoted"


def test_a_sealed_workspace_cannot_read_other_attempts(service: Path) -> None:
    shared = engine(service, "none", commands=("false",))
    ws = shared.fork(task="leaky")
    (ws.path / "answer.txt").write_text("the hidden answer")
    other = shared.run_attempt(ws, task="leaky")
    assert other.verdict.status == "rejected" and other.record_commit
    ws = shared.fork(task="reader")
    assert ws.run(f"git cat-file -e {other.record_commit}").returncode == 0  # shared: readable
    sealed = engine(service, "none", isolation="sealed")
    ws = sealed.fork(task="sealed reader")
    assert not (ws.path / ".git" / "objects" / "info" / "alternates").exists()
    assert ws.run(f"git cat-file -e {other.record_commit}").returncode != 0
    base = git(service, "rev-parse", "main")
    result = ws.run("git log --format=%H && git status --porcelain")
    assert result.returncode == 0 and result.output.split() == [base]
    (ws.path / "z.txt").write_text("z")
    assert sealed.run_attempt(ws, task="sealed reader").verdict.status == "promoted"
    fsck(service)


# -- the sandbox itself (bwrap) ----------------------------------------------------------------


def test_inside_the_sandbox_root_keeps_no_power(service: Path, bwrap: str) -> None:
    host_file = Path("/var/tmp") / f"agentgate-host-{os.getpid()}.txt"
    host_file.write_text("host")
    e = engine(service, "bwrap")
    ws = e.fork(task="root")
    tries = {
        "remount": "mount -o remount,rw / 2>&1",
        "write a host file": f"echo pwned > {host_file}",
        "write /etc": "echo x > /etc/agentgate-probe",
        "write the python env": f"touch {sys.prefix}/agentgate-probe.pth",
        # uid 0 writes sysctls by file mode alone: kernel.core_pattern would run a program of
        # the agent's as the host's root. (hostname is per UTS namespace: harmless to try.)
        "write a sysctl": "echo agentgate > /proc/sys/kernel/hostname",
        "write the core pattern, or the sysrq trigger": (
            'python3 -c "import os, sys; sys.exit(not any(os.access(p, os.W_OK) for p in '
            "('/proc/sys/kernel/core_pattern', '/proc/sysrq-trigger')))\""
        ),
    }
    for name, command in tries.items():
        result = ws.run(command)
        assert result.returncode != 0, f"{name} worked: {result.output}"
    assert host_file.read_text() == "host"
    host_file.unlink()
    assert not Path("/etc/agentgate-probe").exists()
    caps = ws.run("grep CapEff /proc/self/status").output.split()
    assert caps[-1] == "0000000000000000"


def test_what_the_sandbox_hides(service: Path, bwrap: str, tmp_path: Path) -> None:
    shm = Path("/dev/shm") / f"agentgate-{os.getpid()}"
    shm.write_text("host shm")
    home = Path.home()
    # What a command needs stays in view: the Python environment, the folders on its PATH.
    needed = (sys.prefix, sys.base_prefix, os.path.realpath(sys.executable))
    needed += tuple(os.environ.get("PATH", "").split(":"))
    kept = {
        Path(p).resolve().relative_to(home).parts[0]
        for p in needed
        if p and Path(p).resolve().is_relative_to(home) and Path(p).resolve() != home
    }
    python_in_home = "".join(f" | grep -vx {name}" for name in sorted(kept))
    (tmp_path / "host-secret.txt").write_text("host")
    try:
        e = engine(service, "bwrap")
        ws = e.fork(task="look")
        other = e.fork(task="other")
        (other.path / "other-secret.txt").write_text("x")
        hidden = {
            "another workspace": f"ls -A {other.path}",
            "the base working tree": f"ls -A {service} | grep -vx .git",
            "the base git directory, but its objects": f"ls -A {service}/.git | grep -vx objects",
            "the base git directory": f"cat {service}/.git/config",
            "the empty $HOME": "ls -A $HOME",
            "the user's home, but the Python environment": f"ls -A {Path.home()} {python_in_home}",
            "the host /dev/shm": f"cat {shm}",
            "the host /tmp": f"cat {tmp_path / 'host-secret.txt'}",
        }
        for name, command in hidden.items():
            result = ws.run(command)
            assert result.returncode != 0 or not result.output.strip(), f"{name}: {result.output}"
        # What it needs stays: its own files, the borrowed objects, the Python environment.
        assert ws.run("git log --oneline -1 && git status --porcelain").returncode == 0
        assert ws.run(f"{sys.executable} -c 'import pytest_agentgate'").returncode == 0
        assert ws.run("echo hi > /tmp/x && cat /tmp/x").output.strip() == "hi"
    finally:
        shm.unlink()


def test_network_is_off_unless_asked_for(service: Path, bwrap: str) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    port = server.getsockname()[1]
    connect = (
        f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\""
    )
    try:
        off = engine(service, "bwrap").fork(task="offline")
        assert off.run(connect).returncode != 0
        on = engine(service, "bwrap", agent_network=Network("host")).fork(task="online")
        assert on.run(connect).returncode == 0
    finally:
        server.close()


def _require_pids_cgroup() -> None:
    from pytest_agentgate.sandbox.supervisor import Cgroup

    probe = Cgroup.create(8)
    if not probe.path:
        reason = f"this machine gives no pids cgroup to the plugin: {probe.problem}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    probe.remove()


def test_a_command_cannot_run_more_processes_than_the_cap(service: Path, sandbox_mode: str) -> None:
    _require_pids_cgroup()
    ws = engine(service, sandbox_mode, pids_max=16).fork(task="fork bomb")
    result = ws.run("for i in $(seq 40); do sleep 2 & done; wait", timeout=30)
    assert "fork" in result.output.lower() or "resource" in result.output.lower(), result.output


def test_no_file_a_command_writes_grows_past_the_limit(service: Path, sandbox_mode: str) -> None:
    ws = engine(service, sandbox_mode, file_bytes=10_000).fork(task="big file")
    result = ws.run("head -c 100000 /dev/zero > big.bin")
    assert not result.ok
    assert (ws.path / "big.bin").stat().st_size <= 10_000


def test_a_command_holds_no_descriptor_but_its_own(service: Path, sandbox_mode: str) -> None:
    """Nothing of the plugin's (the status pipe, the pipe bwrap reads its options from, a
    lock) is open in the command: it has stdin, and stdout and stderr on its output."""
    ws = engine(service, sandbox_mode).fork(task="descriptors")
    assert ws.run("ls /proc/$$/fd").output.split() == ["0", "1", "2"]


def test_a_contained_command_cannot_forge_its_exit_status(service: Path, bwrap: str) -> None:
    """bwrap reports the exit code on a pipe only it holds: a command that writes bwrap's
    report to every descriptor it can find, its own and its parents', still failed."""
    ws = engine(service, "bwrap").fork(task="forge the status")
    forge = (
        "for fd in /proc/self/fd/* /proc/1/fd/* /proc/$PPID/fd/*; do "
        'printf \'{ "exit-code": 0 }\\n\' > "$fd" 2>/dev/null; done; exit 3'
    )
    result = ws.run(forge)
    assert result.returncode == 3 and not result.ok, result


def test_a_sandbox_that_cannot_start_is_an_error_or_a_warning(
    service: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_agentgate.errors import ConfigError
    from pytest_agentgate.sandbox import containment as sandbox

    monkeypatch.setenv(sandbox.BWRAP_ENV, "/bin/false")
    sandbox.probe.cache_clear()
    with pytest.raises(ConfigError, match="cannot start a sandbox"):
        engine(service, "bwrap")
    quiet = engine(service, "auto")
    assert not quiet.sandbox.active and "/bin/false" in quiet.sandbox.label
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.gated(task='t', gate=[])\ndef test_t(agent_workspace):\n"
        "    (agent_workspace.path / 't.txt').write_text('t')\n"
    )
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        f"--agentgate-repo={service}", "-p", "no:cacheprovider", f"--agentgate-report={report}"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["WARNING agentgate sandbox none (*/bin/false*): agent commands*"])
    import json

    [row] = json.loads(report.read_text())["attempts"]
    assert row["sandbox"].startswith("none (")
    result = pytester.runpytest(
        f"--agentgate-repo={service}", "-p", "no:cacheprovider", "--agentgate-sandbox=bwrap"
    )
    assert result.ret == 4
    sandbox.probe.cache_clear()


def test_a_misspelled_gate_program_is_the_harness_s_error(service: Path, sandbox_mode: str) -> None:
    e = engine(service, sandbox_mode, commands=("sh -c true",))
    ws = e.fork(task="gate program")
    (ws.path / "x.txt").write_text("x")
    from pytest_agentgate.judge import gate

    context = e.gate_context()
    result = gate.run_commands(
        e.repo, git(service, "rev-parse", "main^{tree}"), GateSpec(commands=()), context
    )
    assert result.ok
    from pytest_agentgate.sandbox.containment import Mounts, run_contained

    missing = run_contained(
        context.sandbox, context.role, ["no-such-gate-program"],
        Mounts(ws.path, e.private_root() / "p"), timeout=10,
    )  # fmt: skip
    assert missing.launch_error and not missing.ok
    shutil.rmtree(e.private_root() / "p", ignore_errors=True)


def test_an_editable_install_from_the_base_repository_stays_hidden() -> None:
    """The gate must test its checkout: sources installed editable from the base's working
    tree are not bound into the sandbox, and a failing gate says why it may have failed."""
    import pytest_agentgate
    from pytest_agentgate.judge.notes import hidden_editable as _hidden_editable_note
    from pytest_agentgate.sandbox import containment as sandbox

    source = Path(pytest_agentgate.__file__).resolve().parent
    if source not in sandbox.editable_sources():
        pytest.skip("pytest-agentgate is not installed in editable mode here")
    project = source.parent  # as if this checkout were the base repository agents edit
    assert source in sandbox.python_paths(None)
    assert source not in sandbox.python_paths(project)
    assert sandbox.hidden_editable_sources(project) == [source]
    contained = sandbox.Sandbox(sandbox.Settings(), "/usr/bin/bwrap", base_tree=project)
    assert f"{source} is installed in editable mode from the base" in _hidden_editable_note(
        contained
    )
    assert _hidden_editable_note(sandbox.Sandbox(sandbox.Settings(), "/usr/bin/bwrap")) == ""


# -- found by a second adversarial trial ------------------------------------------------------


def test_a_state_file_named_like_a_uri_path_cannot_capture_another_database(
    service: Path, tmp_path: Path
) -> None:
    import sqlite3

    secret_db = tmp_path / "hidden" / "dev.sqlite"
    secret_db.parent.mkdir()
    with sqlite3.connect(secret_db) as db:
        db.execute("create table t (v)")
        db.execute("insert into t values ('HOST-ONLY-SECRET-4711')")
    e = engine(service, "none")
    ws = e.fork(task="uri")
    (ws.path / "build" / "x").mkdir(parents=True)
    depth = len(ws.path.parts) + 2
    name = "x" + "%2F.." * depth + "%2F".join(["", *secret_db.parts[1:]])
    (ws.path / "build" / name).write_bytes(b"SQLite format 3\0" + b"\0" * 100)
    (ws.path / "x.txt").write_text("x")
    attempt = e.run_attempt(ws, task="uri", state=["build"])
    assert "HOST-ONLY-SECRET-4711" not in git(service, "log", "-p", "--all", "--format=%B")
    if attempt.state is not None:
        for oid in git(service, "rev-list", "--objects", attempt.state).split():
            kind = git(service, "cat-file", "-t", oid.split()[0])
            if kind == "blob":
                assert b"HOST-ONLY" not in subprocess.run(
                    ["git", "cat-file", "blob", oid.split()[0]], cwd=service, capture_output=True,
                    check=True,
                ).stdout  # fmt: skip


def test_a_base_link_that_the_change_makes_leave_the_tree_rejects(service: Path) -> None:
    (service / "a").mkdir()
    (service / "a" / "keep.txt").write_text("k")
    os.symlink("a/..", service / "up")
    git(service, "add", "a", "up")
    git(service, "commit", "-qm", "a link to the root through a")
    e = engine(service, "none")
    ws = e.fork(task="turn a into a link")
    shutil.rmtree(ws.path / "a")
    os.symlink(".", ws.path / "a")
    attempt = e.run_attempt(ws, task="turn a into a link")
    assert attempt.verdict.status == "rejected"
    assert "up -> a/.. (a link of the base that this change makes leave)" in attempt.verdict.reason


def test_a_recycled_workspace_keeps_nothing_git_does_not_list(service: Path) -> None:
    import stat as stat_module

    e = engine(service, "none", isolation="sealed")
    ws = e.fork(task="leave a message")
    (ws.path / "ledger" / ".git").mkdir()
    (ws.path / "ledger" / ".git" / "notes.txt").write_text("answer for the next task: 42")
    (ws.path / "tests" / ".git").write_text("gitdir: /elsewhere\n")
    os.mkfifo(ws.path / "tests" / "fifo")
    (ws.path / "ledger").chmod(0o777)
    (ws.path / "x.txt").write_text("x")
    assert e.run_attempt(ws, task="leave a message").verdict.status == "promoted"
    e.release(ws)
    fresh = e.fork(task="the next task")
    assert fresh.recycled == 1  # the same workspace, recycled, not a fresh fork
    assert not (fresh.path / "ledger" / ".git").exists()
    assert not (fresh.path / "tests" / ".git").exists()
    assert not (fresh.path / "tests" / "fifo").exists()
    assert stat_module.S_IMODE((fresh.path / "ledger").stat().st_mode) == stat_module.S_IMODE(
        (fresh.path / "tests").stat().st_mode
    )
    assert fresh.run("git status --porcelain").output == ""


def test_a_secret_outside_the_read_view_is_not_readable(service: Path, bwrap: str) -> None:
    """The read view is what a command needs, not the whole filesystem: a secret in a
    directory no view holds (as /srv or /opt would) cannot be read by an agent's command or a
    gate, until a person makes it readable; a gate that fails for it says why."""
    outside = Path("/var/tmp") / f"agentgate-secrets-{os.getpid()}"
    outside.mkdir()
    (outside / "token").write_text("s3cr3t")
    try:
        e = engine(service, "bwrap", commands=(f"cat {outside / 'token'}",))
        ws = e.fork(task="peek")
        result = ws.run(f"cat {outside / 'token'}")
        assert result.returncode != 0 and "s3cr3t" not in result.output
        assert ws.run("ls /srv /opt /mnt /media /home 2>/dev/null").output.strip() == ""
        (ws.path / "x.txt").write_text("x")
        found = e.run_attempt(ws, task="peek")
        assert found.verdict.status in ("rejected", "error")
        assert "--agentgate-sandbox-read" in found.verdict.reason, found.verdict.reason
        wider = engine(service, "bwrap", reads=(outside,))
        ws = wider.fork(task="allowed")
        assert ws.run(f"cat {outside / 'token'}").output.strip() == "s3cr3t"
    finally:
        shutil.rmtree(outside)


@pytest.mark.parametrize("isolation", ["shared", "sealed"])
def test_a_linked_worktree_of_the_base_is_hidden(service: Path, bwrap: str, isolation: str) -> None:
    """Another branch of the base repository checked out by ``git worktree add``: no
    command of an agent reads its files, even where a person made its folder readable."""
    git(service, "branch", "secret-branch")
    place = Path("/var/tmp") / f"agentgate-wt-{os.getpid()}"
    place.mkdir()
    try:
        git(service, "worktree", "add", "-q", str(place / "wt"), "secret-branch")
        (place / "wt" / "plans.txt").write_text("the other branch's plans")
        e = engine(service, "bwrap", isolation=isolation, reads=(place,))
        ws = e.fork(task="look around")
        result = ws.run(f"cat {place / 'wt' / 'plans.txt'}; ls -A {place / 'wt'}")
        assert "the other branch's plans" not in result.output, result.output
        assert ws.run(f"ls -d {place}").returncode == 0  # the folder itself stays readable
    finally:
        git(service, "worktree", "remove", "--force", str(place / "wt"), check=False)
        shutil.rmtree(place, ignore_errors=True)


def test_a_command_closes_each_descriptor_it_opened_once(
    service: Path, sandbox_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A descriptor closed twice closes, the second time, whatever another thread opened
    under its number in between (a gate's results channel, seen under xdist)."""
    import os as real_os

    opened: set[int] = set()
    twice: list[int] = []
    pipe, close, pidfd_open, real_open = (
        real_os.pipe,
        real_os.close,
        real_os.pidfd_open,
        real_os.open,
    )

    def tracked_pipe() -> tuple[int, int]:
        r, w = pipe()
        opened.update((r, w))
        return r, w

    def tracked_pidfd(pid: int, flags: int = 0) -> int:
        fd = pidfd_open(pid, flags)
        opened.add(fd)
        return fd

    def tracked_open(*args: Any, **kwargs: Any) -> int:
        fd = real_open(*args, **kwargs)
        opened.add(fd)
        return fd

    def tracked_close(fd: int) -> None:
        if fd in opened:
            opened.discard(fd)
        elif fd in seen:
            twice.append(fd)
        seen.add(fd)
        close(fd)

    seen: set[int] = set()
    ws = engine(service, sandbox_mode).fork(task="descriptors")
    monkeypatch.setattr(real_os, "pipe", tracked_pipe)
    monkeypatch.setattr(real_os, "pidfd_open", tracked_pidfd)
    monkeypatch.setattr(real_os, "close", tracked_close)
    monkeypatch.setattr(real_os, "open", tracked_open)
    for command in ("true", "exit 3", "sleep 5"):
        ws.run(command, timeout=0.3)
    monkeypatch.undo()
    assert not twice, f"closed twice: {twice}"


FORGE_THROUGH_INIT = r"""
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(1)
for n in range(3, 64):
    fd = libc.syscall(438, pidfd, n, 0)  # pidfd_getfd: a copy of bwrap's init's descriptor
    if fd >= 0 and "eventfd" in os.readlink(f"/proc/self/fd/{fd}"):
        os.write(fd, struct.pack("Q", 1))  # "the command exited 0", as init tells it
"""

REACH_INTO_INIT = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
tries = {}
tries["ptrace"] = libc.ptrace(16, 1, 0, 0)  # PTRACE_ATTACH to bwrap's init
tries["pidfd_getfd"] = libc.syscall(438, os.pidfd_open(1), 0, 0)
iov = (ctypes.c_char * 8)()
local = (ctypes.c_void_p * 2)(ctypes.cast(iov, ctypes.c_void_p), 8)
tries["process_vm_writev"] = libc.process_vm_writev(1, local, 1, local, 1, 0)
try:
    open("/proc/1/mem", "r+b")
    tries["/proc/1/mem"] = 0
except OSError:
    tries["/proc/1/mem"] = -1
try:
    open("/proc/1/task/1/mem", "r+b")
    tries["/proc/1/task/1/mem"] = 0
except OSError:
    tries["/proc/1/task/1/mem"] = -1
print({k: v for k, v in tries.items() if v >= 0} or "all refused")
"""


def test_a_command_cannot_forge_its_status_through_bwrap_s_init(service: Path, bwrap: str) -> None:
    """bwrap's init tells its monitor the command's exit status on an eventfd: a command that
    copies that descriptor (pidfd_getfd: same user, no capability needed) and writes "exit
    0" to it is refused the copy, and its real status stands."""
    ws = engine(service, "bwrap").fork(task="forge through init")
    (ws.path / "forge.py").write_text(FORGE_THROUGH_INIT)
    result = ws.run(f"{sys.executable} forge.py; sleep 0.5; exit 7")
    assert result.returncode == 7 and not result.ok, result


def test_a_command_cannot_reach_into_bwrap_s_init(service: Path, bwrap: str) -> None:
    """Attached, its memory written or its descriptors copied, bwrap's init could be made to
    report any status or to outlive pytest: every way in is refused."""
    ws = engine(service, "bwrap").fork(task="reach into init")
    (ws.path / "reach.py").write_text(REACH_INTO_INIT)
    result = ws.run(f"{sys.executable} reach.py", timeout=30)
    assert result.ok and result.output.strip() == "all refused", result.output


def test_a_cgroup_made_inside_the_command_s_own_does_not_hide_a_process(tmp_path: Path) -> None:
    """A command that may write its cgroup made one below it, moved a child there and killed
    its supervisor: the plugin's last sweep read only its own cgroup's list, missed the
    child (left running after run_command returned) and could not remove the cgroup."""
    from helpers import Sleeper

    from pytest_agentgate.sandbox.process import Limits, run_command

    _require_pids_cgroup()
    sleeper = Sleeper()
    hide = (
        "cg=/sys/fs/cgroup/pids$(sed -n 's/^[0-9]*:pids://p' /proc/self/cgroup); "
        'if [ ! -f "$cg/cgroup.procs" ]; then cg=/sys/fs/cgroup$(sed -n "s/^0:://p" /proc/self/cgroup); fi; '
        'mkdir "$cg/hide"; '
        f"(echo $(sh -c 'echo $PPID') > \"$cg/hide/cgroup.procs\"; exec setsid {sleeper.command}) & "
        "sleep 0.5; kill -KILL $PPID; sleep 30"
    )
    result = run_command(
        hide, cwd=tmp_path, env={"PATH": os.environ["PATH"]}, timeout=10, limits=Limits(pids_max=64)
    )
    try:
        assert not result.ok, result
        deadline = time.monotonic() + 3
        while sleeper.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleeper.alive() == [], "left running after run_command returned"
    finally:
        for pid in sleeper.alive():
            os.kill(pid, signal.SIGKILL)


def test_what_a_killed_run_left_in_its_cgroup_is_ended_by_the_next() -> None:
    """A command that kept its supervisor stopped as pytest was SIGKILLed outlived both:
    nothing was left to sweep it, and the next run removed only empty cgroups. The next
    run's first command ends what a gone run's cgroup still holds, then removes it."""
    from pytest_agentgate.sandbox.supervisor import Cgroup

    _require_pids_cgroup()
    probe = Cgroup.create(8)
    parent = Path(probe.path).parent
    probe.remove()
    gone = 2**22 + 12346  # above any pid the kernel gives out
    here = os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    left, elsewhere = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    abandoned = parent / f"agentgate-{gone}-1-{here}"
    # A run of another PID namespace: its pid cannot be looked up here.
    other = parent / f"agentgate-{gone}-1-{int(here) + 1}"
    try:
        for folder, proc in ((abandoned, left), (other, elsewhere)):
            folder.mkdir()
            (folder / "cgroup.procs").write_text(str(proc.pid))
        code = "from pytest_agentgate.sandbox.supervisor import Cgroup; Cgroup.create(8).remove()"
        subprocess.run([sys.executable, "-c", code], check=True)
        assert left.wait(timeout=5) == -signal.SIGKILL
        assert not abandoned.exists()
        assert elsewhere.poll() is None and other.exists()
    finally:
        for proc in (left, elsewhere):
            proc.kill()
            proc.wait()
        for folder in (abandoned, other):
            with contextlib.suppress(OSError):
                folder.rmdir()


def test_the_cgroups_of_killed_runs_are_removed_by_the_next(tmp_path: Path) -> None:
    """A run killed with SIGKILL cannot remove its commands' cgroups; the next run's first
    command removes those left empty by a process that is gone, and no other."""
    from pytest_agentgate.sandbox.supervisor import Cgroup

    _require_pids_cgroup()
    probe = Cgroup.create(8)
    parent = Path(probe.path).parent
    probe.remove()
    gone = 2**22 + 12345  # above any pid the kernel gives out
    assert not Path(f"/proc/{gone}").exists()
    alive = subprocess.Popen(["sleep", "30"])
    abandoned, busy = parent / f"agentgate-{gone}-1", parent / f"agentgate-{alive.pid}-1"
    try:
        abandoned.mkdir()
        busy.mkdir()
        code = "from pytest_agentgate.sandbox.supervisor import Cgroup; Cgroup.create(8).remove()"
        subprocess.run([sys.executable, "-c", code], check=True)
        assert not abandoned.exists()
        assert busy.exists()  # its process still runs: it may be at work
    finally:
        alive.kill()
        alive.wait()
        for folder in (abandoned, busy):
            with contextlib.suppress(OSError):
                folder.rmdir()
