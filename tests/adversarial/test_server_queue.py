"""The server's queue, attacked by whoever can push to the server: a posted attempt or a
verdict written by hand. The leader re-judges what is posted (protection, the harness, the
limits, its base) and re-tests it; a poster believes a landing only when the server's branch
shows it. Against a real ``git daemon``, with a real engine's judge."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from helpers import fsck, git, git_daemon

from pytest_agentgate import Engine, GateSpec
from pytest_agentgate.land.queue import Entry, Outcome
from pytest_agentgate.land.retest import Retested
from pytest_agentgate.remote.server_queue import POSTED_TITLE, VERDICT_TITLE
from pytest_agentgate.store.record import Record

KEY = "ab" * 12


@pytest.fixture
def daemon(service: Path, tmp_path: Path) -> Iterator[str]:
    """A bare copy of the service, served by ``git daemon`` with pushes enabled."""
    bare = tmp_path / "server" / "ledger.git"
    bare.parent.mkdir()
    git(tmp_path, "clone", "-q", "--bare", str(service), str(bare))
    with git_daemon(bare) as url:
        yield url


def _server(tmp_path: Path) -> Path:
    return tmp_path / "server" / "ledger.git"


def _clone(url: str, where: Path) -> Path:
    git(where.parent, "clone", "-q", url, str(where))
    git(where, "config", "user.name", "someone")
    git(where, "config", "user.email", "someone@example.com")
    return where


def _change(work: Path, base: str, files: dict[str, str], message: str = "change") -> str:
    """A commit on ``base`` that writes ``files`` (plumbing only: no checkout moves)."""
    index = work / ".git" / f"index-{uuid.uuid4().hex}"
    env_git = ["git", "-C", str(work)]
    env = {"GIT_INDEX_FILE": str(index)}
    full = {**os.environ, **env}
    subprocess.run([*env_git, "read-tree", base], env=full, check=True)
    for path, text in files.items():
        blob = subprocess.run(
            [*env_git, "hash-object", "-w", "--stdin"], input=text.encode(), env=full,
            capture_output=True, check=True,
        ).stdout.decode().strip()  # fmt: skip
        subprocess.run(
            [*env_git, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}"],
            env=full, check=True,
        )  # fmt: skip
    tree = (
        subprocess.run([*env_git, "write-tree"], env=full, capture_output=True, check=True)
        .stdout.decode()
        .strip()
    )
    index.unlink()
    return git(work, "commit-tree", tree, "-p", base, "-m", message)


def _post(
    forger: Path,
    url: str,
    change: str,
    base: str,
    *,
    machine: str = "elsewhere",
    at: float = 0,
    key: Path | None = None,
    **more: object,
) -> str:
    """Post ``change`` on the server's queue by hand, with a heartbeat for ``machine``
    written ``at`` seconds from now."""
    uid = uuid.uuid4().hex
    body = json.dumps(
        {"key": KEY, "base": base, "agent": "forger", "task": f"posted {uid[:6]}",
         "uid": uid, "machine": machine, "posted": time.time(), "protect": [], **more}
    )  # fmt: skip
    empty = git(forger, "hash-object", "-t", "tree", "-w", "/dev/null")
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingKey={key}"] if key else []
    commit = git(
        forger, *sign, "commit-tree", *(["-S"] if key else []), empty, "-p", change,
        "-m", f"{POSTED_TITLE}\n{body}",
    )  # fmt: skip
    beat = git(forger, "commit-tree", empty, "-m", f"alive\n\nAt: {time.time() + at:.3f}")
    git(forger, "push", "-q", url, f"{commit}:refs/agentgate/queue/main/{KEY}/{uid}",
        f"+{beat}:refs/agentgate/alive/main/{machine}")  # fmt: skip
    return uid


class Leader:
    """A machine's engine leading the server's queue: its own attempt, re-tests counted."""

    def __init__(self, url: str, tmp_path: Path, **settings: object) -> None:
        self.work = _clone(url, tmp_path / "leader")
        settings = {"unsigned_posts": True, **settings}
        # Unsigned posts taken: these trials are of what a leader checks beyond the
        # signature (see test_a_post_is_taken_only_when_an_allowed_key_signed_it).
        self.engine = Engine.open(
            self.work, "main", remote="origin", promote=True, workdir=tmp_path / "ws",
            gate=GateSpec(commands=("true",), exit_code=("true",)),
            **settings,  # type: ignore[arg-type]
        )  # fmt: skip
        self.retested: list[str] = []

    def retest(
        self,
        tree: str,
        tip: str,
        bases: Sequence[str],
        *,
        ahead: bool = False,
        running=None,
        reuse=None,
    ) -> Retested:
        self.retested.append(tree)
        return Retested(True)

    def land_own(self, name: str, key: str = KEY) -> Outcome:
        """Land one attempt of the leader's own that needs a merge (the server moved)."""
        base = git(self.work, "rev-parse", "HEAD")
        change = _change(self.work, base, {f"{name}.txt": f"{name}\n"})
        queue = self.engine.queue
        uid = uuid.uuid4().hex
        return queue.land(
            _record(uid, name, base, git(self.work, "rev-parse", f"{change}^{{tree}}")), change,
            key, self.retest,
            judge=lambda c, b, d: self.engine.lander.judge_posted(self.engine.gate, c, b, d),
        )  # fmt: skip


def _record(uid: str, task: str, base: str, tree: str) -> Record:
    return Record(task, "leader", base, tree, uid=uid)


def _queued_and_posted(
    machine: Leader, task: str, change: str, base: str, pid: int | None = None
) -> Entry:
    """An attempt of ``machine``'s own, in its queue and posted on the server (as a waiter
    that found another machine leading leaves it)."""
    queue, shared = machine.engine.queue, machine.engine.target.server_queue()
    uid = uuid.uuid4().hex
    tree = git(machine.work, "rev-parse", f"{change}^{{tree}}")
    entry = queue.enqueue(
        Entry(seq=0, uid=uid, key=KEY, change_commit=change, record=_record(uid, task, base, tree),
              pid=pid or os.getpid())
    )  # fmt: skip
    posted = shared.post(uid, change, KEY, {"key": KEY, "base": base})
    assert posted is not None
    queue.files.mark_posted(uid, posted, KEY)
    return entry


def _verdict(server: Path, uid: str) -> dict[str, object]:
    message = git(server, "log", "-1", "--format=%B", f"refs/agentgate/verdicts/main/{uid}")
    title, _, body = message.partition("\n")
    assert title == VERDICT_TITLE
    return json.loads(body)


def _refs(server: Path, prefix: str) -> list[str]:
    return git(server, "for-each-ref", "--format=%(refname)", prefix).splitlines()


def test_a_posted_attempt_is_batched_re_tested_and_its_verdict_written_with_the_move(
    daemon: str, tmp_path: Path
) -> None:
    """Another machine's posted attempt, on the tip it was made on (a fast-forward, on that
    machine's word): the leader batches it with its own, re-tests the top, and lands both
    in one push that also takes the queue ref and writes the verdict."""
    forger = _clone(daemon, tmp_path / "other")
    base = git(forger, "rev-parse", "HEAD")
    uid = _post(forger, daemon, _change(forger, base, {"theirs.txt": "theirs\n"}), base)
    leader = Leader(daemon, tmp_path)
    found = leader.land_own("mine")
    server = _server(tmp_path)
    names = git(server, "ls-tree", "--name-only", "main").splitlines()
    assert {"mine.txt", "theirs.txt"} <= set(names)
    assert len(leader.retested) == 1  # one re-test for both, never the poster's word alone
    assert found.status == "promoted"
    assert _refs(server, "refs/agentgate/queue/") == []
    said = _verdict(server, uid)
    assert said["status"] == "promoted" and said["retested"] is True
    assert git(server, "merge-base", "--is-ancestor", str(said["new"]), "main") == ""
    fsck(server)


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"conftest.py": "import pytest\n"}, "changes protected paths: conftest.py"),
        ({"tests/conftest.py": "collect_ignore = ['.']\n"}, "changes protected paths"),
        ({"pytest.ini": "[pytest]\naddopts = --collect-only\n"}, "changes protected paths"),
        ({"sitecustomize.py": "import os\n"}, "changes protected paths"),
        ({".env": "TOKEN=1\n"}, "keeps out"),
    ],
    ids=["conftest", "nested conftest", "pytest.ini", "shadowing", "excluded secret"],
)
def test_a_posted_attempt_that_rewrites_the_harness_is_refused_by_the_leader(
    daemon: str, tmp_path: Path, files: dict[str, str], why: str
) -> None:
    """Whoever can push can post an attempt that no workspace's gate would pass: the leader
    judges it with its own harness rules, rejects it on the server, and lands only its own."""
    forger = _clone(daemon, tmp_path / "other")
    base = git(forger, "rev-parse", "HEAD")
    uid = _post(forger, daemon, _change(forger, base, files), base)
    leader = Leader(daemon, tmp_path)
    leader.land_own("mine")
    server = _server(tmp_path)
    names = git(server, "ls-tree", "-r", "--name-only", "main").splitlines()
    assert "mine.txt" in names
    assert not set(files) & set(names)
    said = _verdict(server, uid)
    assert said["status"] == "rejected" and why in str(said["reason"]), said
    assert _refs(server, "refs/agentgate/queue/") == []
    fsck(server)


def test_a_posted_attempt_on_a_base_outside_the_history_is_refused(
    daemon: str, tmp_path: Path
) -> None:
    """A base of the poster's choosing (an orphan commit where the tests are weaker) would
    be judged against that base: refused, since it is not in the target's history."""
    forger = _clone(daemon, tmp_path / "other")
    empty = git(forger, "hash-object", "-t", "tree", "-w", "/dev/null")
    orphan = git(forger, "commit-tree", empty, "-m", "a base of my own")
    uid = _post(forger, daemon, _change(forger, orphan, {"x.txt": "x\n"}), orphan)
    leader = Leader(daemon, tmp_path)
    leader.land_own("mine")
    server = _server(tmp_path)
    said = _verdict(server, uid)
    assert said["status"] == "rejected" and "history" in str(said["reason"]), said
    assert "x.txt" not in git(server, "ls-tree", "--name-only", "main").splitlines()


def test_a_posted_attempt_on_a_tip_the_leader_has_not_fetched_yet_is_batched(
    daemon: str, tmp_path: Path
) -> None:
    """Another machine forked from a tip that landed after the leader last fetched: that
    base is in the server's history, only not yet in the leader's view of it; it is read
    again before the attempt is judged (it used to be refused, for good)."""
    leader = Leader(daemon, tmp_path)
    other = _clone(daemon, tmp_path / "other")
    base = git(other, "rev-parse", "HEAD")
    newer = _change(other, base, {"landed-elsewhere.txt": "x\n"})
    git(other, "push", "-q", daemon, f"{newer}:refs/heads/main")
    uid = _post(other, daemon, _change(other, newer, {"theirs.txt": "theirs\n"}), newer)
    leader.land_own("mine")
    server = _server(tmp_path)
    said = _verdict(server, uid)
    assert said["status"] == "promoted", said
    names = git(server, "ls-tree", "--name-only", "main").splitlines()
    assert {"mine.txt", "theirs.txt", "landed-elsewhere.txt"} <= set(names)
    fsck(server)


def test_a_posted_attempt_whose_change_is_not_a_child_of_its_base_is_refused(
    daemon: str, tmp_path: Path
) -> None:
    """The base names what the harness is judged against: a change two commits past it
    (the first rewriting the tests) must not be judged as one."""
    forger = _clone(daemon, tmp_path / "other")
    base = git(forger, "rev-parse", "HEAD")
    weaker = _change(forger, base, {"conftest.py": "# weaker\n"})
    change = _change(forger, weaker, {"y.txt": "y\n"})
    uid = _post(forger, daemon, change, base)
    leader = Leader(daemon, tmp_path)
    leader.land_own("mine")
    said = _verdict(_server(tmp_path), uid)
    assert said["status"] == "rejected" and "parent" in str(said["reason"]), said


@pytest.mark.parametrize(
    "beat", ["none", -3600.0, float("nan")], ids=["no heartbeat", "an hour old", "nan"]
)
def test_a_posted_attempt_whose_machine_stopped_waiting_never_lands(
    daemon: str, tmp_path: Path, beat: str | float
) -> None:
    """No heartbeat for the poster's machine, one older than a lease length plus the margin
    (its machine died, or its leader died holding the lease), or one with no time: nobody
    would report it, so it is not landed."""
    forger = _clone(daemon, tmp_path / "other")
    base = git(forger, "rev-parse", "HEAD")
    change = _change(forger, base, {"z.txt": "z\n"})
    uid = _post(forger, daemon, change, base, at=0.0 if beat == "none" else float(beat))
    if beat == "none":
        git(forger, "push", "-q", daemon, ":refs/agentgate/alive/main/elsewhere")
    leader = Leader(daemon, tmp_path)
    leader.land_own("mine")
    server = _server(tmp_path)
    assert "z.txt" not in git(server, "ls-tree", "--name-only", "main").splitlines()
    said = _verdict(server, uid)
    assert said["status"] == "error" and "stopped waiting" in str(said["reason"])


def test_a_posted_attempt_of_a_newer_format_is_left_to_its_machine(
    daemon: str, tmp_path: Path
) -> None:
    """What a newer version posts may mean something this one does not know: it is neither
    landed nor refused here, and stays on the server for its own machine to lead."""
    forger = _clone(daemon, tmp_path / "other")
    base = git(forger, "rev-parse", "HEAD")
    uid = _post(forger, daemon, _change(forger, base, {"n.txt": "n\n"}), base, format=2)
    leader = Leader(daemon, tmp_path)
    leader.land_own("mine")
    server = _server(tmp_path)
    assert "n.txt" not in git(server, "ls-tree", "--name-only", "main").splitlines()
    assert _refs(server, "refs/agentgate/queue/") == [f"refs/agentgate/queue/main/{KEY}/{uid}"]
    assert _refs(server, "refs/agentgate/verdicts/") == []


def test_a_forged_verdict_of_a_landing_is_not_believed(daemon: str, tmp_path: Path) -> None:
    """A waiter reads its verdict from the server; one that says it landed, written by
    hand, is not believed unless the server's branch has its change: it stays queued and
    lands for real."""
    leader = Leader(daemon, tmp_path)
    work = leader.work
    base = git(work, "rev-parse", "HEAD")
    change = _change(work, base, {"real.txt": "real\n"})
    queue, shared = leader.engine.queue, leader.engine.target.server_queue()
    entry = _queued_and_posted(leader, "real", change, base)
    # The forger takes the queue ref and writes "promoted" at the tip it never reached.
    server = _server(tmp_path)
    tip = git(server, "rev-parse", "main")
    empty = git(work, "hash-object", "-t", "tree", "-w", "/dev/null")
    body = json.dumps({"status": "promoted", "kind": "merge", "new": tip, "uid": entry.uid})
    forged = git(work, "commit-tree", empty, "-p", tip, "-m", f"{VERDICT_TITLE}\n{body}")
    git(work, "push", "-q", daemon, f":refs/agentgate/queue/main/{KEY}/{entry.uid}",
        f"{forged}:refs/agentgate/verdicts/main/{entry.uid}")  # fmt: skip
    queue.posts.sync_posted(shared, shared.listing())
    assert queue.verdict(entry.uid) is None  # not believed: still this machine's to land
    with leader.engine.target.lock():
        queue.lead(KEY, leader.retest)
    found = queue.verdict(entry.uid)
    assert found is not None and found.status == "promoted", found
    assert "real.txt" in git(server, "ls-tree", "--name-only", "main").splitlines()
    fsck(server)


def test_prune_on_the_server_removes_the_queue_s_old_leftovers_only(
    daemon: str, tmp_path: Path
) -> None:
    """A machine that died leaves its posted attempt and heartbeat, a poster that died its
    verdict: ``prune --remote`` removes those older than the cutoff, by compare-and-swap,
    and keeps what is recent (a machine may be waiting on it now)."""
    import sys

    forger = _clone(daemon, tmp_path / "other")
    empty = git(forger, "hash-object", "-t", "tree", "-w", "/dev/null")
    old_env = {**os.environ, "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}

    def commit(message: str, env: dict[str, str]) -> str:
        return subprocess.run(
            ["git", "-C", str(forger), "commit-tree", empty, "-m", message], env=env,
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip

    refs = {
        f"refs/agentgate/queue/main/{KEY}/" + "a" * 32: commit("old posted", old_env),
        "refs/agentgate/verdicts/main/" + "b" * 32: commit("old verdict", old_env),
        "refs/agentgate/alive/main/gone": commit("old heartbeat", old_env),
        "refs/agentgate/alive/main/here": commit("new heartbeat", dict(os.environ)),
    }
    git(forger, "push", "-q", daemon, *(f"{c}:{r}" for r, c in refs.items()))
    found = subprocess.run(
        [sys.executable, "-m", "pytest_agentgate", "prune", "--repo", str(forger), "--remote",
         "origin", "--older-than", "1d"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    server = _server(tmp_path)
    left = set(_refs(server, "refs/agentgate/"))
    assert left == {"refs/agentgate/alive/main/here"}, left
    for ref in refs:
        if ref != "refs/agentgate/alive/main/here":
            assert f"removed {ref} on origin" in found.stdout, found.stdout
    fsck(server)


def test_a_server_that_refuses_the_queue_is_asked_once_and_landings_go_on(
    daemon: str, tmp_path: Path
) -> None:
    """A hook that refuses ``refs/agentgate/queue/*`` (the lease it keeps): posting is tried
    once, not at every read while the machine waits; its own attempt still lands."""
    server = _server(tmp_path)
    pushes = tmp_path / "pushes.log"
    hook = server / "hooks" / "pre-receive"
    hook.write_text(
        "#!/bin/sh\nwhile read old new ref; do echo $ref >> "
        f"{pushes}; case $ref in refs/agentgate/queue/*) refuse=1;; esac; done\n"
        '[ -z "$refuse" ] || { echo "no queue here" >&2; exit 1; }\n'
    )
    hook.chmod(0o755)
    leader = Leader(daemon, tmp_path)
    shared = leader.engine.target.server_queue()
    base = git(leader.work, "rev-parse", "HEAD")
    change = _change(leader.work, base, {"p.txt": "p\n"})
    assert shared.post(uuid.uuid4().hex, change, KEY, {"key": KEY}) is None
    assert shared.post(uuid.uuid4().hex, change, KEY, {"key": KEY}) is None
    tried = [r for r in pushes.read_text().splitlines() if r.startswith("refs/agentgate/queue/")]
    assert len(tried) == 1, tried
    leader.land_own("mine")
    assert "mine.txt" in git(server, "ls-tree", "--name-only", "main").splitlines()
    fsck(server)


POSTER = """
import sys
from pathlib import Path
from pytest_agentgate import Engine, GateSpec

work, where = Path(sys.argv[1]), Path(sys.argv[2])
engine = Engine.open(work, "main", remote="origin", promote=True, workdir=where,
                     gate=GateSpec(commands=("true",), exit_code=("true",)), unsigned_posts=True)
ws = engine.fork(task="poster task")
(ws.path / "posted.txt").write_text("posted\\n")
try:
    engine.run_attempt(ws, task="poster task")
except KeyboardInterrupt:
    sys.exit(42)
"""


def test_a_poster_interrupted_after_its_landing_records_it_as_landed(
    daemon: str, tmp_path: Path
) -> None:
    """Another machine's leader landed the attempt; Ctrl-C reaches the poster as it reads
    that verdict: the change is on the branch, so its record says it landed (it used to say
    "interrupted", and no record named the landing)."""
    leader = Leader(daemon, tmp_path)
    engine = leader.engine
    key = engine.lander.batch_key(engine.gate)
    poster = _clone(daemon, tmp_path / "poster")
    server = _server(tmp_path)
    with engine.target.lease():  # machine A leads: the poster posts and waits
        proc = subprocess.Popen(
            [sys.executable, "-c", POSTER, str(poster), str(tmp_path / "poster-ws")],
            env={**os.environ, "AGENTGATE_FAULT": "verdict-read:int"},
            start_new_session=True,  # the fault's SIGINT goes to the poster's group alone
        )
        deadline = time.monotonic() + 60
        while not _refs(server, "refs/agentgate/queue/"):
            assert time.monotonic() < deadline and proc.poll() is None, "nothing was posted"
            time.sleep(0.05)
        leader.land_own("mine", key)
    assert proc.wait(timeout=60) == 42
    names = git(server, "ls-tree", "--name-only", "main").splitlines()
    assert {"mine.txt", "posted.txt"} <= set(names)
    records = {
        ref: git(server, "log", "-1", "--format=%B", ref)
        for ref in _refs(server, "refs/agentgate/attempts/poster-task/")
    }
    assert len(records) == 1, records
    (message,) = records.values()
    assert "Agentgate-Verdict: promoted" in message and "Agentgate-Landed: " in message, message
    fsck(server)


def _post_raw(forger: Path, url: str, change: str, body: str) -> str:
    """A queue ref whose message is ``body`` (after the title), written by hand."""
    uid = uuid.uuid4().hex
    empty = git(forger, "hash-object", "-t", "tree", "-w", "/dev/null")
    message = forger / "message.txt"
    message.write_text(f"{POSTED_TITLE}\n{body.replace('UID', uid)}")
    commit = git(forger, "commit-tree", empty, "-p", change, "-F", str(message))
    git(forger, "push", "-q", url, f"{commit}:refs/agentgate/queue/main/{KEY}/{uid}")
    return uid


@pytest.mark.parametrize(
    "body",
    [
        '{"uid": "UID", "machine": "elsewhere", "posted": "x"}',
        '{"uid": "UID", "machine": "elsewhere", "posted": null}',
        '{"uid": "UID", "machine": "elsewhere", "posted": [1]}',
        "[" * 60000 + "]" * 60000,
    ],
    ids=["posted a word", "posted null", "posted a list", "nested past the limit"],
)
def test_a_posted_attempt_that_cannot_be_read_never_stops_a_leader(
    daemon: str, tmp_path: Path, body: str
) -> None:
    """Found by attack: a post whose time is not a number crashed every leader of the
    branch (whatever its gate), and one nested deeper than Python's limit too."""
    forger = _clone(daemon, tmp_path / "other")
    base = git(forger, "rev-parse", "HEAD")
    _post_raw(forger, daemon, _change(forger, base, {"j.txt": "j\n"}), body)
    leader = Leader(daemon, tmp_path)
    assert leader.land_own("mine").status == "promoted"
    assert "mine.txt" in git(_server(tmp_path), "ls-tree", "--name-only", "main").splitlines()


@pytest.mark.parametrize("where", ["verdict", "heartbeat", "moves"])
def test_a_ref_in_the_way_of_the_queue_s_refs_never_stops_a_landing(
    daemon: str, tmp_path: Path, where: str
) -> None:
    """Found by attack: a ref below the name of a posted attempt's verdict, of the leader's
    heartbeat or of the chain of moves (git then cannot write that name) made every landing
    push fail, the leader's own attempts with it."""
    forger = _clone(daemon, tmp_path / "other")
    base = git(forger, "rev-parse", "HEAD")
    uid = _post(forger, daemon, _change(forger, base, {"theirs.txt": "t\n"}), base)
    leader = Leader(daemon, tmp_path)
    shared = leader.engine.target.server_queue()
    empty = git(forger, "hash-object", "-t", "tree", "-w", "/dev/null")
    junk = git(forger, "commit-tree", empty, "-m", "in the way")
    in_the_way = {
        "verdict": f"refs/agentgate/verdicts/main/{uid}/x",
        "heartbeat": f"refs/agentgate/alive/main/{shared.machine}/x",
        "moves": "refs/agentgate/moves/main/x",
    }[where]
    git(forger, "push", "-q", daemon, f"{junk}:{in_the_way}")
    assert leader.land_own("mine").status == "promoted"
    server = _server(tmp_path)
    assert "mine.txt" in git(server, "ls-tree", "--name-only", "main").splitlines()
    fsck(server)


@pytest.mark.parametrize("how", ["deleted", "a blob"])
def test_a_chain_of_moves_changed_by_hand_never_loops_the_leader(
    daemon: str, tmp_path: Path, how: str
) -> None:
    """Found by attack: with the chain deleted on the server after a clone had fetched it,
    every move failed as a lost race and was re-tested again (555 gate runs, never landed);
    with the chain pointing at a blob, every move failed."""
    leader = Leader(daemon, tmp_path)
    leader.land_own("first")  # the chain exists, and this clone has fetched it
    server = _server(tmp_path)
    if how == "deleted":
        git(server, "update-ref", "-d", "refs/agentgate/moves/main")
    else:
        blob = git(server, "hash-object", "-w", "--stdin")
        git(server, "update-ref", "refs/agentgate/moves/main", blob)
    person = _clone(daemon, tmp_path / "person")  # and the branch moved meanwhile
    moved = _change(person, git(person, "rev-parse", "HEAD"), {"p.txt": "p\n"})
    git(person, "push", "-q", daemon, f"{moved}:refs/heads/main")
    leader.retested.clear()
    assert leader.land_own("second").status == "promoted"
    assert len(leader.retested) <= 1, leader.retested
    assert git(server, "cat-file", "-t", "refs/agentgate/moves/main") == "commit"
    fsck(server)


def test_a_rejection_written_over_a_landing_is_not_believed(daemon: str, tmp_path: Path) -> None:
    """Found by attack: after another machine's leader landed an attempt, a verdict of
    "rejected" written over the real one was believed, and the waiter would have reported
    a failure for a change that is on the branch. Now it is not believed: the change is
    found already on the target, and that is its verdict."""
    (tmp_path / "p").mkdir()
    (tmp_path / "l").mkdir()
    poster = Leader(daemon, tmp_path / "p")
    work = poster.work
    base = git(work, "rev-parse", "HEAD")
    change = _change(work, base, {"landed.txt": "l\n"})
    queue, shared = poster.engine.queue, poster.engine.target.server_queue()
    entry = _queued_and_posted(poster, "landed", change, base)
    uid = entry.uid
    # Another machine's leader lands it (with its own attempt).
    leader = Leader(daemon, tmp_path / "l")
    leader.land_own("mine")
    server = _server(tmp_path)
    assert "landed.txt" in git(server, "ls-tree", "--name-only", "main").splitlines()
    # The forger writes "rejected" over the real verdict.
    empty = git(work, "hash-object", "-t", "tree", "-w", "/dev/null")
    body = json.dumps({"status": "rejected", "reason": "forged", "uid": uid})
    forged = git(work, "commit-tree", empty, "-m", f"{VERDICT_TITLE}\n{body}")
    git(work, "push", "-q", "-f", daemon, f"{forged}:refs/agentgate/verdicts/main/{uid}")
    queue.posts.sync_posted(shared, shared.listing())
    assert queue.verdict(uid) is None  # not believed
    with poster.engine.target.lock():
        queue.lead(KEY, poster.retest)
    found = queue.verdict(entry.uid)
    assert found is not None and found.status == "promoted" and found.kind == "already", found


def test_each_clone_is_a_machine_of_its_own_and_stays_one(daemon: str, tmp_path: Path) -> None:
    """The machine name is drawn once per clone and kept: the same hostname and path (two
    containers) would otherwise make two machines one, each deleting the other's posts."""
    from pytest_agentgate.git.repo import BaseRepo
    from pytest_agentgate.land.remote_branch import RemoteBranch
    from pytest_agentgate.store import oplog

    names = []
    for who in ("one", "two", "one"):
        work = tmp_path / who
        if not work.exists():
            _clone(daemon, work)
        repo = BaseRepo(work / ".git", work)
        names.append(
            RemoteBranch(repo, "origin", "main", oplog.OpLog(repo.common_dir))
            .server_queue()
            .machine
        )
    assert names[0] == names[2] != names[1]


def test_a_machine_waiting_for_the_lease_keeps_its_heartbeat(daemon: str, tmp_path: Path) -> None:
    """Found by reading: a process waiting for the lease outside the queue (a promotion
    without re-test, a rollback) let its machine's heartbeat lapse, and its other processes'
    posted attempts (waiting behind it for the lock) were dropped as a dead machine's."""
    import threading

    from pytest_agentgate.git.repo import BaseRepo
    from pytest_agentgate.land.remote_branch import RemoteBranch
    from pytest_agentgate.store import oplog

    work = _clone(daemon, tmp_path / "waiter")
    repo = BaseRepo(work / ".git", work)
    target = RemoteBranch(repo, "origin", "main", oplog.OpLog(repo.common_dir), lease_seconds=0.6)
    shared = target.server_queue()
    server = _server(tmp_path)
    # This machine has a heartbeat there (it posted); another machine holds the lease.
    git(work, "push", "-q", daemon, f"+{shared.heartbeats()[0].new}:{shared.alive_ref}")
    empty = git(work, "hash-object", "-t", "tree", "-w", "/dev/null")
    held = git(
        work,
        "commit-tree",
        empty,
        "-m",
        f"lease\n\nAgentgate-Holder: other\nAgentgate-Expires: {time.time() + 2.5:.3f}",
    )
    git(work, "push", "-q", daemon, f"{held}:refs/agentgate/lease/main")
    before = git(server, "rev-parse", shared.alive_ref)
    done = threading.Event()

    def wait() -> None:
        with target.lease():
            done.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(1.5)  # waiting, the lease another's
    during = git(server, "rev-parse", shared.alive_ref)
    thread.join(timeout=30)
    assert done.is_set()
    assert during != before  # renewed while it waited


def test_a_ref_in_the_way_of_the_lease_still_leaves_the_chain_of_moves(
    pytester: pytest.Pytester, daemon: str, tmp_path: Path
) -> None:
    """Found by attack: a ref below the lease's name made taking the lease fail, and the
    move then left out its link (as for a server that keeps no refs/agentgate/*), so
    another machine logged the landing as a person's push. The link goes in now (one leader
    is lost while that ref is there: the README says so)."""
    forger = _clone(daemon, tmp_path / "other")
    empty = git(forger, "hash-object", "-t", "tree", "-w", "/dev/null")
    junk = git(forger, "commit-tree", empty, "-m", "in the way")
    git(forger, "push", "-q", daemon, f"{junk}:refs/agentgate/lease/main/x")
    a, b = _clone(daemon, tmp_path / "a"), _clone(daemon, tmp_path / "b")
    pytester.makepyfile(
        **{
            f"test_agent_{n}": f"""
import pytest

@pytest.mark.gated(task="change {n}", gate=["true"], results="exit-code")
def test_change(agent_workspace):
    (agent_workspace.path / "change-{n}.txt").write_text("{n}")
"""
            for n in range(3)
        }
    )
    flags = ["--agentgate-remote=origin", "--agentgate-promote"]
    pytester.runpytest("test_agent_0.py", f"--agentgate-repo={b}", *flags).assert_outcomes(passed=1)
    pytester.runpytest("test_agent_1.py", f"--agentgate-repo={a}", *flags).assert_outcomes(passed=1)
    third = pytester.runpytest("test_agent_2.py", f"--agentgate-repo={b}", *flags)
    third.assert_outcomes(passed=1)
    assert "moved outside agentgate" not in third.stdout.str()


def test_a_poster_that_died_waiting_is_recorded_by_its_machine_s_next_run(
    daemon: str, tmp_path: Path
) -> None:
    """Found by attack: a poster SIGKILLed as it waited, its machine's heartbeat still
    fresh: another machine's leader landed it, and no record anywhere named the landing
    (that leader records its own machine's attempts only). Its machine's next run reads
    the verdict and writes the record."""
    (tmp_path / "p").mkdir()
    (tmp_path / "l").mkdir()
    poster = Leader(daemon, tmp_path / "p")
    base = git(poster.work, "rev-parse", "HEAD")
    change = _change(poster.work, base, {"orphan.txt": "o\n"})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process that has died: the poster, SIGKILLed while it waited
    entry = _queued_and_posted(poster, "orphan", change, base, pid=gone.pid)
    leader = Leader(daemon, tmp_path / "l")
    leader.land_own("mine")
    server = _server(tmp_path)
    assert "orphan.txt" in git(server, "ls-tree", "--name-only", "main").splitlines()
    assert _refs(server, "refs/agentgate/attempts/orphan/") == []  # nobody recorded it yet
    again = Engine.open(
        poster.work, "main", remote="origin", promote=True, workdir=tmp_path / "p" / "ws2",
        gate=GateSpec(commands=("true",), exit_code=("true",)),
    )  # fmt: skip
    again.start()
    assert any("orphan" in line and "promoted" in line for line in again.settled), again.settled
    (record,) = _refs(server, "refs/agentgate/attempts/orphan/")
    message = git(server, "log", "-1", "--format=%B", record)
    assert "Agentgate-Verdict: promoted" in message and "Agentgate-Landed: " in message
    assert again.queue.verdict(entry.uid) is None  # read, and gone


def _in_the_way_of_the_chain(forger: Path, url: str, server: Path) -> None:
    """No chain of moves, and a ref below its name: git cannot write the chain there."""
    empty = git(forger, "hash-object", "-t", "tree", "-w", "/dev/null")
    junk = git(forger, "commit-tree", empty, "-m", "in the way")
    if _refs(server, "refs/agentgate/moves/main"):
        git(forger, "push", "-q", url, ":refs/agentgate/moves/main")
    git(forger, "push", "-q", url, f"{junk}:refs/agentgate/moves/main/x")


def test_with_the_chain_blocked_a_posted_attempt_still_gets_its_verdict_with_the_move(
    daemon: str, tmp_path: Path
) -> None:
    """Found by attack: with a ref in the way of the chain, the landing push went again
    without every extra, the verdicts and the queue refs' compare-and-swap with it: the
    posted attempt landed but was later judged "already there, nothing moved", and its
    poster, interrupted in between, took back (reported withdrawn) a landed change. Now
    only the ref that could not be written is left out."""
    (tmp_path / "p").mkdir()
    (tmp_path / "l").mkdir()
    poster = Leader(daemon, tmp_path / "p")
    base = git(poster.work, "rev-parse", "HEAD")
    entry = _queued_and_posted(
        poster, "posted", _change(poster.work, base, {"posted.txt": "p\n"}), base
    )
    server = _server(tmp_path)
    _in_the_way_of_the_chain(poster.work, daemon, server)
    leader = Leader(daemon, tmp_path / "l")
    assert leader.land_own("mine").status == "promoted"
    said = _verdict(server, entry.uid)
    assert said["status"] == "promoted" and said["kind"] == "merge", said
    assert git(server, "merge-base", "--is-ancestor", str(said["new"]), "main") == ""
    assert _refs(server, "refs/agentgate/queue/") == []  # taken, once
    assert poster.engine.queue.posts.take_back(entry) is False  # landed: not withdrawn
    found = poster.engine.queue.verdict(entry.uid)
    assert found is not None and found.kind == "merge", found
    fsck(server)


def test_the_same_uid_under_another_folder_never_hides_a_poster_s_own_post(
    daemon: str, tmp_path: Path
) -> None:
    """Found by attack: a junk ref with a waiting poster's uid under another key folder
    made the poster take its real post for gone and forget it; landed later, it was never
    read, and a Ctrl-C then reported withdrawn a change on the branch."""
    (tmp_path / "p").mkdir()
    (tmp_path / "l").mkdir()
    poster = Leader(daemon, tmp_path / "p")
    work = poster.work
    base = git(work, "rev-parse", "HEAD")
    entry = _queued_and_posted(poster, "posted", _change(work, base, {"posted.txt": "p\n"}), base)
    queue, shared = poster.engine.queue, poster.engine.target.server_queue()
    empty = git(work, "hash-object", "-t", "tree", "-w", "/dev/null")
    junk = git(work, "commit-tree", empty, "-m", "junk")
    elsewhere = f"refs/agentgate/queue/main/{'f' * 24}/{entry.uid}"
    git(work, "push", "-q", daemon, f"{junk}:{elsewhere}")
    queue.posts.sync_posted(shared, shared.listing())
    assert queue.files.post_of(entry.uid)  # still its own post
    git(work, "push", "-q", daemon, f":{elsewhere}")
    Leader(daemon, tmp_path / "l").land_own("mine")
    queue.posts.sync_posted(shared, shared.listing())
    found = queue.verdict(entry.uid)
    assert found is not None and found.status == "promoted", found
    assert "posted.txt" in git(_server(tmp_path), "ls-tree", "--name-only", "main").splitlines()


@pytest.mark.parametrize(
    "left", ["", "abc", "not an id!", "\u00e9" * 10], ids=["empty", "short", "odd", "non-ascii"]
)
def test_a_machine_id_cut_short_is_drawn_again(daemon: str, tmp_path: Path, left: str) -> None:
    """Found by attack: a machine-id file a kill or a full disk cut short made every queued
    landing of the clone fail with RecursionError, run after run."""
    from pytest_agentgate.git.repo import BaseRepo
    from pytest_agentgate.land.remote_branch import RemoteBranch
    from pytest_agentgate.store import oplog

    work = _clone(daemon, tmp_path / "work")
    repo = BaseRepo(work / ".git", work)
    repo.private_dir.mkdir(parents=True, exist_ok=True)
    (repo.private_dir / "machine-id").write_text(left)
    name = RemoteBranch(repo, "origin", "main", oplog.OpLog(repo.common_dir)).server_queue().machine
    kept = (repo.private_dir / "machine-id").read_text()
    assert kept.isalnum() and len(kept) >= 8 and name.endswith(kept)
    again = RemoteBranch(repo, "origin", "main", oplog.OpLog(repo.common_dir)).server_queue()
    assert again.machine == name


def test_a_heartbeat_renewed_between_listing_and_reading_is_alive(
    daemon: str, tmp_path: Path
) -> None:
    """Found as a rare failure of two machines at once (1 in 3 CI runs): a heartbeat renewed
    just after the leader listed it could no longer be fetched (the server holds the newer
    one), was read as no time, and the waiting machine's attempt was refused as stopped."""
    from pytest_agentgate.remote.server_queue import Listing

    leader = Leader(daemon, tmp_path)
    shared = leader.engine.target.server_queue()
    elsewhere = _clone(daemon, tmp_path / "other")
    empty = git(elsewhere, "hash-object", "-t", "tree", "-w", "/dev/null")
    gone = git(elsewhere, "commit-tree", empty, "-m", f"alive\n\nAt: {time.time():.3f}")
    # Listed as that commit, which the server no longer holds (renewed since).
    assert shared.waiting(Listing(alive={"elsewhere": gone}), "elsewhere")
    # One that can be read, and is an hour old, is not waiting.
    old = git(leader.work, "commit-tree", empty, "-m", f"alive\n\nAt: {time.time() - 3600:.3f}")
    assert not shared.waiting(Listing(alive={"elsewhere": old}), "elsewhere")


def _key(where: Path, name: str) -> tuple[Path, str]:
    """A fresh SSH key pair: its private key's path, and its public key's line."""
    key = where / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True
    )
    return key, " ".join(Path(f"{key}.pub").read_text().split()[:2])


def test_a_post_is_taken_only_when_an_allowed_key_signed_it(daemon: str, tmp_path: Path) -> None:
    """Anyone who can push can post an attempt: before, the leader judged it by the tree
    rules and a re-test only, and landed it. Now it takes a post only when a key its
    allowed-signers file names signed it; an unsigned post or one signed by another key
    is refused with a verdict that says so."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    good, good_pub = _key(tmp_path, "machine-a")
    other, _ = _key(tmp_path, "intruder")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"machine-a {good_pub}\n")
    (tmp_path / "l").mkdir()
    leader = Leader(daemon, tmp_path / "l", unsigned_posts=False, allowed_signers=allowed)
    forger = _clone(daemon, tmp_path / "forger")
    base = git(forger, "rev-parse", "HEAD")
    posts = {
        name: _post(forger, daemon, _change(forger, base, {f"{name}.txt": name}), base, key=key)
        for name, key in (("unsigned", None), ("intruder", other), ("signed", good))
    }
    leader.land_own("mine")
    server = _server(tmp_path)
    landed = git(server, "ls-tree", "--name-only", "main").splitlines()
    assert "signed.txt" in landed and "mine.txt" in landed
    assert "unsigned.txt" not in landed and "intruder.txt" not in landed
    for name in ("unsigned", "intruder"):
        verdict = _verdict(server, posts[name])
        assert verdict["status"] == "rejected"
        assert "not signed by a key --agentgate-allowed-signers names" in str(verdict["reason"])
    assert _verdict(server, posts["signed"])["status"] == "promoted"
    fsck(server)


def test_a_leader_runs_the_checks_of_the_post_s_test(daemon: str, tmp_path: Path) -> None:
    """A post of a test this run has: its Python checks ran only on the poster's machine, so
    a forged post skipped them (it was judged by the tree rules and a re-test alone). The
    leader runs them itself, on the posted tree."""
    (tmp_path / "l").mkdir()
    leader = Leader(daemon, tmp_path / "l")

    def no_secrets(attempt: object) -> bool:
        return not (attempt.path / "secret.txt").exists()  # type: ignore[attr-defined]

    leader.engine.checks_by_test["test_agents.py::test_task"] = (no_secrets,)
    forger = _clone(daemon, tmp_path / "forger")
    base = git(forger, "rev-parse", "HEAD")
    bad = _post(forger, daemon, _change(forger, base, {"secret.txt": "s"}), base,
                test="test_agents.py::test_task")  # fmt: skip
    good = _post(forger, daemon, _change(forger, base, {"fine.txt": "f"}), base,
                 test="test_agents.py::test_task")  # fmt: skip
    leader.land_own("mine")
    server = _server(tmp_path)
    landed = git(server, "ls-tree", "--name-only", "main").splitlines()
    assert "fine.txt" in landed and "secret.txt" not in landed
    verdict = _verdict(server, bad)
    assert verdict["status"] == "rejected"
    assert "its test's check no_secrets failed here" in str(verdict["reason"]), verdict
    assert _verdict(server, good)["status"] == "promoted"
