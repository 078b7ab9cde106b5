"""Every move keeps its record, whatever the agent's bytes: records of any size, names that
are not UTF-8, and an operations log with a damaged line.

A record once reached git as a command-line argument (``update-ref -m <the whole message>``:
over 128 KiB, E2BIG) and was written with a strict UTF-8 encoder (a file named ``\\xff``:
UnicodeEncodeError), in both cases after the target had moved; every later command then
repeated the error while settling the move.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from pathlib import Path

from helpers import fsck, git, write

from pytest_agentgate import Engine, GateSpec
from pytest_agentgate.cli.main import main
from pytest_agentgate.sandbox.containment import Settings
from pytest_agentgate.store import oplog

GATE = f"{sys.executable} -m pytest -q -p no:cacheprovider tests"


def engine(repo: Path) -> Engine:
    return Engine.open(
        repo, "main", promote=True, workdir=repo.parent / "work",
        gate=GateSpec(commands=(GATE,), timeout=120), sandbox=Settings(mode="none"),
    )  # fmt: skip


def put(root: Path, rel: bytes, data: bytes) -> None:
    with open(os.path.join(os.fsencode(str(root)), rel), "wb") as file:
        file.write(data)


def recorded(repo: Path, done: object) -> str:
    """The record's message, once it is checked to exist."""
    assert done.record_problem is None, done.record_problem  # type: ignore[attr-defined]
    assert done.record_ref, done  # type: ignore[attr-defined]
    return git(repo, "log", "-1", "--format=%B", done.record_ref)  # type: ignore[attr-defined]


def test_a_record_naming_thousands_of_left_out_files_is_written(service: Path) -> None:
    """3,500 secrets left out beside an honest change: the message names the first and
    counts the rest, and no part of it reaches a command line."""
    before = git(service, "rev-parse", "main")
    e = engine(service)
    ws = e.fork(task="many secrets")
    for i in range(3500):
        (ws.path / f".env.{hashlib.sha1(str(i).encode()).hexdigest()}").write_text("x")
    write(ws.path, {"ledger/extra.py": "X = 1\n"})
    done = e.run_attempt(ws, task="many secrets")
    assert done.verdict.status == "promoted", done.verdict
    assert git(service, "rev-parse", "main") != before
    message = recorded(service, done)
    assert "and 3450 more" in message
    assert len(message) < 32 << 10
    assert "error" not in fsck(service)


def test_a_record_of_a_huge_failing_output_is_written(service: Path) -> None:
    """A failing test that prints 400 KB that does not compress: the record keeps its tail."""
    e = engine(service)
    ws = e.fork(task="loud failure")
    noise = "import os\n\n\ndef test_loud():\n    for _ in range(40):\n"
    noise += "        print(os.urandom(5000).hex())\n    assert False\n"
    write(ws.path, {"tests/test_loud.py": noise})
    done = e.run_attempt(ws, task="loud failure")
    assert done.verdict.status == "rejected", done.verdict
    message = recorded(service, done)
    assert "test_loud" in message and len(message) < 64 << 10


def test_a_secret_with_a_name_that_is_not_utf8_beside_an_honest_change(service: Path) -> None:
    before = git(service, "rev-parse", "main")
    e = engine(service)
    ws = e.fork(task="odd secret")
    put(ws.path, b".env.\xff", b"TOKEN=1\n")
    write(ws.path, {"ledger/extra.py": "X = 1\n"})
    done = e.run_attempt(ws, task="odd secret")
    assert done.verdict.status == "promoted", done.verdict
    assert git(service, "rev-parse", "main") != before
    assert ".env.\\xff" in recorded(service, done)


def test_a_failing_test_in_a_file_whose_name_is_not_utf8_is_recorded(service: Path) -> None:
    e = engine(service)
    ws = e.fork(task="odd test")
    put(ws.path, b"tests/test_\xff.py", b"def test_bad():\n    assert False\n")
    done = e.run_attempt(ws, task="odd test")
    assert done.verdict.status == "rejected", done.verdict
    assert "test_\\xff.py" in recorded(service, done)


def _pending(repo: Path, record: object, **line: object) -> None:
    tip = git(repo, "rev-parse", "main")
    oplog.append(
        repo / ".git",
        oplog.OpRecord(
            op="pending", ref="refs/heads/main", old=tip, new=tip, agent="agent",
            task="odd secret", pending="p" * 32, host="elsewhere", record=record,  # type: ignore[arg-type]
            **line,  # type: ignore[arg-type]
        ),
    )  # fmt: skip


def test_commands_settle_a_pending_record_holding_bytes_that_are_not_utf8(service: Path) -> None:
    """A dead writer's pending line whose record names ``.env.\\xff``: every command that
    opens the repository completes it, none raises."""
    record = {
        "task": "odd secret", "agent": "agent", "base": git(service, "rev-parse", "main"),
        "tree": git(service, "rev-parse", "main^{tree}"), "uid": "0" * 32,
        "status": "promoted", "excluded": [".env.\udcff"],
    }  # fmt: skip
    assert socket.gethostname() != "elsewhere"
    _pending(service, record)
    for command in (["log"], ["attempts"], ["audit"]):
        assert main([*command, "--repo", str(service)]) in (0, 1)
    assert "odd-secret/1" in git(service, "for-each-ref", "refs/agentgate/attempts")


def test_a_damaged_log_line_stops_no_command(service: Path, capsys: object) -> None:
    """Lines of the log a person or a full disk damaged: a field missing or of the wrong
    type, a pending line whose record is not an object. Every command still runs; the
    pending line that cannot be completed is said once, kept, and can be set aside."""
    log = oplog.log_path(service / ".git")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write('{"op": "promote", "ref": "refs/heads/main"}\n')
        f.write('{"op": "promote", "ref": "refs/heads/main", "old": null, "new": null, '
                '"duration_ms": "x"}\n')  # fmt: skip
    _pending(service, "oops")  # type: ignore[arg-type]
    for command in (["log"], ["log", "--all"], ["attempts"], ["audit"]):
        assert main([*command, "--repo", str(service)]) in (0, 1), command
    said = capsys.readouterr().err  # type: ignore[attr-defined]
    assert said.count("could not complete the record") == 1, said
    assert main(["pending", "--repo", str(service)]) == 1  # one is stuck, with its reason
    assert main(["pending", "--repo", str(service), "--set-aside", "ppp"]) == 0
    assert main(["pending", "--repo", str(service)]) == 0
    assert any(r.op == "pending" for r in oplog.read(service / ".git"))  # its data is kept


def test_a_nul_byte_in_what_the_agent_printed_or_the_gate_output_keeps_the_record(
    service: Path,
) -> None:
    """Found by an attack: git refuses a commit message holding NUL, and the transcript or
    the failing output reached the message as it was; the target moved with no record."""
    e = engine(service)
    ws = e.fork(task="nul transcript")
    ws.run([sys.executable, "-c", r"import sys; sys.stdout.buffer.write(b'hello\x00world\n')"])
    write(ws.path, {"ledger/extra.py": "X = 1\n"})
    done = e.run_attempt(ws, task="nul transcript")
    assert done.verdict.status == "promoted", done.verdict
    assert "hello\\x00world" in recorded(service, done)
    ws = e.fork(task="nul output")
    failing = "def test_nul():\n    print('a\\x00b')\n    assert False\n"
    write(ws.path, {"tests/test_nul.py": failing})
    done = e.run_attempt(ws, task="nul output")
    assert done.verdict.status == "rejected", done.verdict
    assert "test_nul" in recorded(service, done)
