"""What is kept of a command's output: all of it up to LOG_BYTES, else its head and its end
with the size left out said."""

from __future__ import annotations

import tempfile

from pytest_agentgate.sandbox import process


def test_output_up_to_the_bound_is_kept_whole_and_past_it_head_and_end() -> None:
    with tempfile.TemporaryFile() as sink:
        sink.write(b"start\n" + b"x" * 1000 + b"\nend\n")
        assert process._kept(sink, sink.tell()) == b"start\n" + b"x" * 1000 + b"\nend\n"
    with tempfile.TemporaryFile() as sink:
        size = process.LOG_BYTES + 1_000_000
        sink.write(b"first line\n" + b"y" * (size - len(b"first line\n") - 10) + b"last line\n")
        kept = process._kept(sink, sink.tell())
        assert kept.startswith(b"first line\n") and kept.endswith(b"last line\n")
        assert b"[... 1000000 bytes of output left out ...]" in kept
        assert len(kept) < process.LOG_BYTES + 100
