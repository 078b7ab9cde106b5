"""The operations log's records: stamped, one line each, torn lines skipped and closed."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_agentgate.store import oplog, pending


def test_append_stamps_and_reads_back(tmp_path: Path) -> None:
    log = oplog.OpLog(tmp_path)
    written = log.append(oplog.OpRecord(op="promote", ref="refs/heads/main", old="a", new="b"))
    assert written.time and written.user and written.host
    (back,) = list(log.read())
    assert back == written


def test_a_torn_last_line_is_skipped_and_closed_by_the_next_writer(tmp_path: Path) -> None:
    log = oplog.OpLog(tmp_path)
    log.append(oplog.OpRecord(op="promote", ref="r", old=None, new="1"))
    with open(log.path, "a", encoding="ascii") as out:
        out.write('{"op": "promote", "ref": "r", "ne')  # a crash mid-write
    assert [r.new for r in log.read()] == ["1"]
    log.append(oplog.OpRecord(op="rollback", ref="r", old="1", new="2"))
    assert [r.op for r in log.read()] == ["promote", "rollback"]
    lines = log.path.read_text().splitlines()
    assert all(json.loads(line) for line in lines if line.startswith("{") and line.endswith("}"))


def test_foreign_lines_are_ignored(tmp_path: Path) -> None:
    log = oplog.OpLog(tmp_path)
    log.path.parent.mkdir(parents=True, exist_ok=True)
    log.path.write_text('["not", "a", "record"]\n{"no": "op"}\nnot json\n')
    assert list(log.read()) == []


def test_open_pending_lines(tmp_path: Path) -> None:
    log = oplog.OpLog(tmp_path)
    for uid in ("a", "b", "c"):
        log.append(oplog.OpRecord(op="pending", ref="r", old=None, new=uid, pending=uid))
    log.append(oplog.OpRecord(op="pending-done", ref="r", old=None, new=None, pending="a"))
    log.append(oplog.OpRecord(op="pending-abandoned", ref="r", old=None, new=None, pending="b"))
    assert [line.pending for line in pending.open_lines(log.read())] == ["c"]
    assert pending.open_lines(log.read(), "other-ref") == []
