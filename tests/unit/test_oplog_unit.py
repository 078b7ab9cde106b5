"""The operations log's records: stamped, one line each, torn lines skipped and closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def _fresh(log: oplog.OpLog) -> list[oplog.OpRecord]:
    """The log parsed from scratch, with nothing this process kept."""
    oplog._parsed_files.clear()
    return list(log.read())


def test_what_is_kept_between_reads_is_what_a_fresh_read_finds(tmp_path: Path) -> None:
    """Each read parsed the whole log again (a gated test's cost grew by about 8 ms a
    thousand lines); only what was appended since is parsed now, and a log replaced,
    truncated or rewritten in place is parsed again from its start."""
    log = oplog.OpLog(tmp_path)
    for n in range(3):
        log.append(oplog.OpRecord(op="promote", ref="r", old=None, new=str(n)))
    assert [r.new for r in log.read()] == ["0", "1", "2"]
    log.append(oplog.OpRecord(op="rollback", ref="r", old="2", new="1"))
    kept = list(log.read())
    assert kept == _fresh(log) and [r.op for r in kept][-1] == "rollback"
    # Its end rewritten in place, same inode, same length, as a tool that rewrites the
    # file would leave it: the bytes kept from before the parsed end tell.
    text = log.path.read_text()
    with open(log.path, "r+", encoding="ascii") as f:
        f.write(
            text[: text.rindex('"new": "1"')]
            + '"new": "7"'
            + text[text.rindex('"new": "1"') + 10 :]
        )
    assert [r.new for r in log.read()] == ["0", "1", "2", "7"]
    # Replaced by a shorter file (a rotation moves it away; a new one starts).
    log.path.rename(log.path.with_name(oplog.FILE_NAME + ".1"))
    log.append(oplog.OpRecord(op="promote", ref="r", old="1", new="9"))
    assert [r.new for r in log.read()] == ["0", "1", "2", "7", "9"] == [r.new for r in _fresh(log)]
    # Truncated in place.
    log.path.write_text("")
    assert [r.new for r in log.read()] == ["0", "1", "2", "7"]


def test_a_line_still_being_written_is_read_once_it_is_whole(tmp_path: Path) -> None:
    log = oplog.OpLog(tmp_path)
    log.append(oplog.OpRecord(op="promote", ref="r", old=None, new="1"))
    line = json.dumps({"op": "promote", "ref": "r", "old": "1", "new": "2"})
    with open(log.path, "a", encoding="ascii") as out:
        out.write(line[:20])
        out.flush()
        assert [r.new for r in log.read()] == ["1"]
        out.write(line[20:] + "\n")
    assert [r.new for r in log.read()] == ["1", "2"] == [r.new for r in _fresh(log)]


def test_what_is_kept_is_bounded_and_what_was_dropped_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records of every log file read stayed for the life of the process, rotated files and
    other repositories' logs included; past a bound the least recently read are dropped."""
    monkeypatch.setattr(oplog, "_KEEP_RECORDS", 5)
    oplog._parsed_files.clear()
    logs = [oplog.OpLog(tmp_path / name) for name in ("a", "b")]
    for n, log in enumerate(logs):
        log.git_dir.mkdir()
        for k in range(4):
            log.append(oplog.OpRecord(op="promote", ref="r", old=None, new=f"{n}-{k}"))
    assert [r.new for r in logs[0].read()] == [f"0-{k}" for k in range(4)]
    assert [r.new for r in logs[1].read()] == [f"1-{k}" for k in range(4)]
    assert list(oplog._parsed_files) == [str(logs[1].path)]  # 8 kept would be over 5
    assert [r.new for r in logs[0].read()] == [f"0-{k}" for k in range(4)]
    assert list(oplog._parsed_files) == [str(logs[0].path)]
