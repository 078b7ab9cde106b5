"""An agent that turns its own .git, the environment or its files against the plugin."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from helpers import fsck, git

from pytest_agentgate import Engine, GateSpec


def engine(repo: Path, promote: bool = True, **gate: object) -> Engine:
    spec = GateSpec(**{"outcome_is_enough": True, "results_mode": "exit-code", **gate})  # type: ignore[arg-type]
    return Engine.open(repo, "main", promote=promote, workdir=repo.parent / "work", gate=spec)


def script(path: Path, marker: Path) -> str:
    path.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_hooks_fsmonitor_filters_and_config_in_the_agent_git_never_run(
    service: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    e = engine(service)
    ws = e.fork(task="hostile git")
    evil = script(tmp_path / "evil.sh", marker)
    dotgit = ws.path / ".git"
    (dotgit / "hooks").mkdir(exist_ok=True)
    for hook in (
        "pre-commit",
        "post-commit",
        "reference-transaction",
        "post-checkout",
        "post-index-change",
    ):
        script(dotgit / "hooks" / hook, marker)
    with (dotgit / "config").open("a") as cfg:
        cfg.write(
            f"[core]\n\tfsmonitor = {evil}\n\tpager = {evil}\n\thooksPath = {dotgit / 'hooks'}\n"
            f"\tworktree = {service}\n[diff]\n\texternal = {evil}\n"
            f'[filter "evil"]\n\tclean = {evil}\n\tsmudge = {evil}\n[diff "evil"]\n\ttextconv = {evil}\n'
            f"[include]\n\tpath = {tmp_path / 'more.cfg'}\n"
        )
    (ws.path / ".gitattributes").write_text("* filter=evil diff=evil\n")
    (ws.path / "ledger" / "store.py").write_text("# changed\n")
    attempt = e.run_attempt(ws, task="hostile git")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert not marker.exists()
    assert git(service, "show", "main:ledger/store.py") == "# changed"
    fsck(service)


def test_gitdir_file_pointing_at_the_base_is_ignored(service: Path) -> None:
    base = git(service, "rev-parse", "main")
    e = engine(service)
    ws = e.fork(task="redirect")
    import shutil

    shutil.rmtree(ws.path / ".git")
    (ws.path / ".git").write_text(f"gitdir: {service / '.git'}\n")
    (ws.path / "new.txt").write_text("x\n")
    attempt = e.run_attempt(ws, task="redirect")
    assert attempt.verdict.status == "promoted"
    # The snapshot came from the plugin's private index, not from the base's index or refs.
    assert git(service, "rev-parse", "main^") == base
    assert git(service, "ls-tree", "--name-only", "main", ".git") == ""
    assert git(service, "status", "--porcelain") == ""


def test_inherited_git_variables_do_not_redirect(
    service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    git(decoy, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(decoy / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "decoy-index"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(tmp_path / "decoy-objects"))
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.hooksPath")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(tmp_path))
    e = engine(service)
    ws = e.fork(task="env")
    (ws.path / "new.txt").write_text("x\n")
    attempt = e.run_attempt(ws, task="env")
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_INDEX_FILE")
    monkeypatch.delenv("GIT_OBJECT_DIRECTORY")
    assert attempt.verdict.status == "promoted"
    assert git(service, "show", "main:new.txt") == "x"
    assert not (tmp_path / "decoy-index").exists() and not (tmp_path / "decoy-objects").exists()


def test_agent_without_git_cannot_reach_an_enclosing_repository(service: Path) -> None:
    # Workspaces made inside the base repository's own directory: the worst case.
    e = Engine.open(
        service, "main", workdir=service / "inner-work", gate=GateSpec(outcome_is_enough=True)
    )
    ws = e.fork(task="escape")
    import shutil

    shutil.rmtree(ws.path / ".git")
    result = ws.run("git rev-parse --show-toplevel")
    assert result.returncode != 0 and "not a git repository" in result.output


def test_nested_repository_is_rejected_not_stored(service: Path) -> None:
    e = engine(service)
    ws = e.fork(task="nested")
    inner = ws.path / "vendor" / "lib"
    inner.mkdir(parents=True)
    git(inner, "init", "-q")
    (inner / "x.txt").write_text("x")
    git(inner, "add", "x.txt")
    git(inner, "commit", "-qm", "x")
    attempt = e.run_attempt(ws, task="nested")
    assert attempt.verdict.status == "rejected"
    assert "nested git repository at vendor/lib" in attempt.verdict.reason
    assert "160000" not in git(service, "ls-tree", "-r", attempt.record_ref or "")


def test_gitlinks_in_the_base_pass_through(service: Path) -> None:
    sub = "1234567890123456789012345678901234567890"
    git(service, "update-index", "--add", "--cacheinfo", f"160000,{sub},vendor/sub")
    git(service, "commit", "-qm", "add a submodule gitlink")
    (service / "vendor" / "sub").mkdir(parents=True)  # an uninitialised submodule, as git leaves it
    e = engine(service)
    ws = e.fork(task="keep gitlink")
    (ws.path / "new.txt").write_text("x\n")
    attempt = e.run_attempt(ws, task="keep gitlink")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert git(service, "ls-tree", "main", "vendor/sub").startswith(f"160000 commit {sub}")


@pytest.mark.parametrize("name", [".GIT/config", "sub/.git/hooks/x", ".Git/HEAD"])
def test_paths_git_refuses_reject_the_attempt(service: Path, name: str) -> None:
    e = engine(service)
    ws = e.fork(task="dotgit")
    path = ws.path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    attempt = e.run_attempt(ws, task="dotgit")
    assert attempt.verdict.status == "rejected", attempt.verdict
    assert attempt.verdict.check == "snapshot"


def test_odd_names_round_trip(service: Path) -> None:
    e = engine(service)
    ws = e.fork(task="names")
    names = [b"with space.txt", b"new\nline.txt", b"latin1-\xe9.txt", b"tab\there.txt"]
    for raw in names:
        with open(os.path.join(os.fsencode(ws.path), raw), "wb") as fh:
            fh.write(raw)
    attempt = e.run_attempt(ws, task="names")
    assert attempt.verdict.status == "promoted", attempt.verdict
    import subprocess

    raw_listing = subprocess.run(
        ["git", "ls-tree", "-z", "--name-only", "main"],
        cwd=service,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    assert set(names) <= set(raw_listing)
    for raw in names:  # and each file's content is its own name, byte for byte
        blob = subprocess.run(
            ["git", "cat-file", "blob", b"main:" + raw],
            cwd=service,
            capture_output=True,
            check=True,
        ).stdout
        assert blob == raw


def test_symlink_out_of_the_workspace_is_stored_not_followed(service: Path, tmp_path: Path) -> None:
    secret = tmp_path / "outside-secret.txt"
    secret.write_text("do not read me\n")
    e = engine(service)
    ws = e.fork(task="links")
    os.symlink(secret, ws.path / "link")
    os.symlink(tmp_path, ws.path / "dirlink")
    attempt = e.run_attempt(ws, task="links")
    assert attempt.verdict.status == "rejected"
    assert f"link -> {secret}" in attempt.verdict.reason
    # Allowed by a person, such a link is stored as a link: never followed, never read.
    e = Engine.open(
        service, "main", promote=True, workdir=service.parent / "work",
        gate=GateSpec(outcome_is_enough=True), allow_symlinks=("link", "dirlink"),
    )  # fmt: skip
    ws = e.fork(task="links")
    os.symlink(secret, ws.path / "link")
    os.symlink(tmp_path, ws.path / "dirlink")
    attempt = e.run_attempt(ws, task="links")
    assert attempt.verdict.status == "promoted"
    assert git(service, "cat-file", "-p", "main:link") == str(secret)
    assert "do not read me" not in git(service, "log", "-p", "--all")
    assert git(service, "ls-tree", "main", "dirlink").startswith("120000")


def test_ignored_leftovers_cannot_make_the_gate_pass(service: Path) -> None:
    (service / ".gitignore").write_text("__pycache__/\n*.pyc\n.pytest_cache/\nbuild/\n")
    git(service, "commit", "-qam", "ignore build")
    e = engine(service, commands=("test -f build/ok",), outcome_is_enough=False)
    ws = e.fork(task="leftover")
    (ws.path / "build").mkdir()
    (ws.path / "build" / "ok").write_text("it works on my machine")
    (ws.path / "new.txt").write_text("x\n")
    attempt = e.run_attempt(ws, task="leftover")
    assert attempt.verdict.status == "rejected"
    assert "test -f build/ok" in attempt.verdict.reason


def test_conftest_that_forces_success_is_rejected(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(
        test_agent="""
        import pytest

        @pytest.mark.gated(task="cheat")
        def test_cheat(agent_workspace):
            (agent_workspace.path / "conftest.py").write_text(
                "def pytest_collection_modifyitems(items):\\n    items.clear()\\n"
            )
        """
    )
    result = pytester.runpytest(
        f"--agentgate-repo={service}",
        "--agentgate-gate=python -m pytest -q tests",
        "--agentgate-promote",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*changes protected paths: conftest.py*"])


def test_emptied_suite_exits_5_and_is_rejected(pytester: pytest.Pytester, service: Path) -> None:
    pytester.makepyfile(
        test_agent="""
        import pytest

        @pytest.mark.gated(task="empty the suite")
        def test_empty(agent_workspace):
            (agent_workspace.path / "tests" / "test_ledger.py").write_text("# nothing to see\\n")
        """
    )
    result = pytester.runpytest(
        f"--agentgate-repo={service}",
        "--agentgate-gate=python -m pytest -q -p no:cacheprovider tests",
        "--agentgate-promote",
    )
    result.assert_outcomes(failed=1)
    # The base's tests pass on the untouched code; the attempt's own tree lost them.
    result.stdout.fnmatch_lines(
        ["*the attempt's own test files: 2 test(s) that passed on the base are gone*"]
    )


def test_secrets_are_left_out_and_masked(
    pytester: pytest.Pytester, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEPLOY_TOKEN", "tok-3141592653")
    pytester.makepyfile(
        test_agent="""
        import pytest

        @pytest.mark.gated(task="leak")
        def test_leak(agent_workspace):
            (agent_workspace.path / "config").mkdir()
            (agent_workspace.path / "config" / ".env").write_text("DEPLOY_TOKEN=tok-3141592653")
            (agent_workspace.path / "id_rsa").write_text("-----BEGIN KEY-----")
            (agent_workspace.path / "app.py").write_text("print('hi')")
        """
    )
    report = pytester.path / "r.json"
    result = pytester.runpytest(
        f"--agentgate-repo={service}",
        "--agentgate-gate-exit-code=echo leaked $DEPLOY_TOKEN; false",
        f"--agentgate-report={report}",
    )
    result.assert_outcomes(failed=1)
    assert "tok-3141592653" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*leaked ****"])
    [row] = json.loads(report.read_text())["attempts"]
    record = git(service, "log", "-1", "--format=%B", row["attempt_ref"])
    assert "Left out of the snapshot (secrets): config/.env, id_rsa" in record
    assert "tok-3141592653" not in git(service, "log", "-p", "--all")
    assert "BEGIN KEY" not in git(service, "log", "-p", "--all")


def test_limits_reject_without_reading_everything(service: Path) -> None:
    e = Engine.open(
        service,
        "main",
        workdir=service.parent / "work",
        gate=GateSpec(outcome_is_enough=True),
        max_files=3,
        max_bytes=1000,
    )
    ws = e.fork(task="many")
    for i in range(5):
        (ws.path / f"f{i}.txt").write_text("x")
    attempt = e.run_attempt(ws, task="many")
    assert attempt.verdict.status == "rejected" and "over the limit of 3" in attempt.verdict.reason
    ws = e.fork(task="big")
    (ws.path / "big.bin").write_bytes(b"\0" * 5000)
    attempt = e.run_attempt(ws, task="big")
    assert attempt.verdict.status == "rejected" and "over 1000 bytes" in attempt.verdict.reason
    # The big file never became an object.
    import hashlib

    blob = hashlib.sha1(b"blob 5000\0" + b"\0" * 5000).hexdigest()
    import subprocess

    assert subprocess.run(["git", "cat-file", "-e", blob], cwd=service, check=False).returncode != 0
    assert not (service / ".git" / "objects" / blob[:2] / blob[2:]).exists()


def test_background_processes_are_ended_with_the_command(service: Path, sandbox_mode: str) -> None:
    """Counted where the supervisor ends them itself; contained, the namespace's end (as its
    first process exits with the command) may have ended them before they can be counted."""
    from helpers import Sleeper

    from pytest_agentgate.sandbox.containment import Settings

    sleeper = Sleeper()
    spec = GateSpec(outcome_is_enough=True, results_mode="exit-code")
    e = Engine.open(
        service, "main", workdir=service.parent / "work", gate=spec,
        sandbox=Settings(mode=sandbox_mode),  # type: ignore[arg-type]
    )  # fmt: skip
    ws = e.fork(task="daemon")
    result = ws.run(f"{sleeper.command} &")
    assert result.returncode == 0 and result.survivors >= (sandbox_mode == "none"), result
    assert not sleeper.alive()
    (ws.path / "x.txt").write_text("x")
    e.run_attempt(ws, task="daemon")
    assert not sleeper.alive()


def test_agent_cannot_repoint_a_submodule(service: Path) -> None:
    sub = "1234567890123456789012345678901234567890"
    git(service, "update-index", "--add", "--cacheinfo", f"160000,{sub},vendor/sub")
    git(service, "commit", "-qm", "add a submodule gitlink")
    (service / "vendor" / "sub").mkdir(parents=True)
    e = engine(service)
    ws = e.fork(task="repoint")
    inner = ws.path / "vendor" / "sub"
    git(inner, "init", "-q")
    git(inner, "commit", "-q", "--allow-empty", "-m", "agent's own history")
    (ws.path / "new.txt").write_text("x\n")
    attempt = e.run_attempt(ws, task="repoint")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert attempt.snapshot is not None and attempt.snapshot.kept_gitlinks == ("vendor/sub",)
    assert git(service, "ls-tree", "main", "vendor/sub").startswith(f"160000 commit {sub}")


def test_restructured_paths_are_snapshotted(service: Path) -> None:
    """A file that becomes a directory, a directory that becomes a symlink: ordinary edits."""
    import shutil

    e = engine(service)
    ws = e.fork(task="restructure")
    (ws.path / ".gitignore").unlink()
    (ws.path / ".gitignore").mkdir()
    (ws.path / ".gitignore" / "inner.txt").write_text("now a directory\n")
    shutil.rmtree(ws.path / "tests")
    os.symlink("ledger", ws.path / "tests")
    attempt = e.run_attempt(ws, task="restructure")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert git(service, "cat-file", "-p", "main:.gitignore/inner.txt") == "now a directory"
    assert git(service, "ls-tree", "main", "tests").startswith("120000")


def test_user_filters_are_not_run_on_the_agent_s_say(service: Path, tmp_path: Path) -> None:
    """Filter programs come from trusted config; .gitattributes (the agent's) must not pick them."""
    marker = tmp_path / "filter-ran"
    evil = script(tmp_path / "filter.sh", marker)
    git(service, "config", "filter.lfs.clean", evil)
    git(service, "config", "filter.lfs.smudge", evil)
    git(service, "config", "filter.lfs.required", "true")
    git(service, "checkout", "-q", "-b", "elsewhere")  # the user's checkout is not the target
    e = engine(service, commands=("cat data.bin",), outcome_is_enough=False)
    ws = e.fork(task="attributes")
    (ws.path / ".gitattributes").write_text("* filter=lfs\n")
    (ws.path / "data.bin").write_text("raw bytes\n")
    attempt = e.run_attempt(ws, task="attributes")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert not marker.exists()
    assert git(service, "show", "main:data.bin") == "raw bytes"


def test_colon_and_non_utf8_names_do_not_break_bookkeeping(service: Path) -> None:
    e = engine(service)
    ws = e.fork(task="colons")
    (ws.path / ":x").write_text("colon\n")
    with open(os.path.join(os.fsencode(ws.path), b"caf\xe9.txt"), "wb") as fh:
        fh.write(b"latin-1 name\n")
    attempt = e.run_attempt(ws, task="colons")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert attempt.record_ref and attempt.move is not None
    log = (service / ".git" / "agentgate" / "oplog.jsonl").read_text().splitlines()
    promote_rec = [json.loads(x) for x in log if '"promote"' in x][-1]
    assert promote_rec["objects"] >= 3 and promote_rec["new"] == attempt.move.new


def test_the_user_s_checkout_keeps_the_user_s_filters(service: Path) -> None:
    """In the person's own checkout, git behaves as their git does: their filters apply."""
    git(service, "config", "filter.rot.clean", "tr a-zA-Z n-za-mN-ZA-M")
    git(service, "config", "filter.rot.smudge", "tr a-zA-Z n-za-mN-ZA-M")
    (service / ".gitattributes").write_text("secret.txt filter=rot\n")
    (service / "secret.txt").write_text("hello\n")
    git(service, "add", ".gitattributes", "secret.txt")
    git(service, "commit", "-qm", "a filtered file")
    assert git(service, "cat-file", "-p", "main:secret.txt") == "uryyb"  # stored form
    e = engine(service)
    ws = e.fork(task="touch it")
    assert (ws.path / "secret.txt").read_text() == "uryyb\n"  # workspaces: byte for byte
    (ws.path / "secret.txt").write_text("jbeyq\n")  # the stored form of "world"
    attempt = e.run_attempt(ws, task="touch it")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert (service / "secret.txt").read_text() == "world\n"  # smudged by the user's filter
    assert git(service, "status", "--porcelain") == ""


def test_deleting_a_large_tree_stays_linear(service: Path) -> None:
    """Thousands of deletions (a vendored tree removed) snapshot in one listing, no crash."""
    vendor = {
        f"vendor/pkg{i % 20:02d}/some/long/nested/path/module_{i:05d}.py": "x = 1\n"
        for i in range(3000)
    }
    from helpers import write

    write(service, vendor)
    git(service, "add", "-A")
    git(service, "commit", "-qm", "vendor a tree")
    import shutil

    e = engine(service)
    ws = e.fork(task="drop vendor")
    shutil.rmtree(ws.path / "vendor")
    attempt = e.run_attempt(ws, task="drop vendor")
    assert attempt.verdict.status == "promoted", attempt.verdict
    assert attempt.snapshot is not None and len(attempt.snapshot.changes) == 3000
    assert git(service, "ls-tree", "main", "vendor") == ""
