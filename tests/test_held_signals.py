"""What the plugin holds while it holds a lock of its own: Ctrl-C, SIGTERM and SIGHUP wait
for the block, and are then delivered as they would have been, whatever the block did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_agentgate import _faults


@pytest.fixture
def handlers() -> Iterator[None]:
    """The test's signal handlers, put back after it."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_held_by_a_block_that_raises_is_still_delivered() -> None:
    """SIGTERM nobody handles, received while a move is under way that then fails: the
    process ends once the block is done, as it would have without it."""
    script = (
        "import os, signal\n"
        "from pytest_agentgate import _faults\n"
        "try:\n"
        "    with _faults.uninterrupted():\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        raise ValueError('the move failed')\n"
        "except ValueError:\n"
        "    pass\n"
        "print('still alive')\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert ran.returncode == -signal.SIGTERM and "still alive" not in ran.stdout, ran


@pytest.mark.usefixtures("handlers")
def test_every_held_signal_is_delivered_though_one_handler_raises() -> None:
    got: list[str] = []

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("terminated")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, lambda signum, frame: got.append("hup"))
    with pytest.raises(KeyboardInterrupt), _faults.uninterrupted():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
        assert got == []  # held
    assert got == ["hup"]
    assert signal.getsignal(signal.SIGTERM) is on_term


@pytest.mark.usefixtures("handlers")
def test_an_interrupt_while_the_handlers_are_put_back_leaves_none_of_the_block_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second Ctrl-C just as Ctrl-C's own handler is back: every other handler is already
    back (the block's never stays to swallow a SIGTERM for the rest of the run), and an
    ignored signal was never taken over."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    real = signal.signal
    seen: list[object] = []

    def putting_back(sig: int, handler: object) -> object:
        old = real(sig, handler)  # type: ignore[arg-type]
        if sig == signal.SIGINT and handler is signal.default_int_handler:
            os.kill(os.getpid(), signal.SIGINT)
        return old

    monkeypatch.setattr(signal, "signal", putting_back)
    with pytest.raises(KeyboardInterrupt), _faults.uninterrupted():
        seen.append(signal.getsignal(signal.SIGHUP))
    monkeypatch.undo()
    assert seen == [signal.SIG_IGN]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_forked_child_removes_in_the_background_too(tmp_path: Path) -> None:
    """A process forked while a removal runs (a test's own multiprocessing) starts with a
    remover of its own: its removals finish, none of the parent's is waited for forever."""
    script = (
        "import os, sys, threading\n"
        "from pathlib import Path\n"
        "from pytest_agentgate.sandbox.removal import remove_later, removals_done\n"
        "root = Path(sys.argv[1])\n"
        "for i in range(100):\n"
        "    (root / 'parent' / str(i)).mkdir(parents=True)\n"
        "    for j in range(20): (root / 'parent' / str(i) / str(j)).write_text('x')\n"
        "(root / 'child').mkdir()\n"
        "remove_later(root / 'parent')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    remove_later(root / 'child')\n"
        "    done = threading.Thread(target=removals_done, daemon=True)\n"
        "    done.start(); done.join(10)\n"
        "    os._exit(1 if done.is_alive() or (root / 'child').exists() else 0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "removals_done()\n"
        "sys.exit(os.waitstatus_to_exitcode(status) or (root / 'parent').exists())\n"
    )
    ran = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, check=False, timeout=60)  # fmt: skip
    assert ran.returncode == 0, ran
