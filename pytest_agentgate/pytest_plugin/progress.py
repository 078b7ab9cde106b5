"""One updating line on the terminal while an agent, a gate or a wait in the queue is slow.

Shown only on a terminal: the line is written to the controlling terminal (``/dev/tty``),
never to pytest's output, so captured output, log files and CI logs never hold it; and only
when pytest's own output goes to a terminal and ``CI`` is not set. It appears once a step has
taken ``after_s`` seconds, says which test, which step and for how long, and is erased when
the step ends. The summary keeps the times (each attempt's ``timings_ms``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO


class Progress:
    """The line, and the thread that redraws it once a second."""

    def __init__(self, out: IO[str], *, after_s: float = 3.0) -> None:
        self.out = out
        self.after_s = after_s
        self._lock = threading.Lock()
        self._current: tuple[str, str, float] | None = None
        self._shown = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentgate-progress", daemon=True)
        self._thread.start()

    @classmethod
    def for_terminal(cls, isatty: bool) -> Progress | None:
        """A progress line when pytest writes to a terminal outside CI, else None."""
        if not isatty or os.environ.get("CI"):
            return None
        try:
            out = open("/dev/tty", "w", encoding="utf-8")  # noqa: SIM115 - held for the run
        except OSError:
            return None
        return cls(out)

    def step(self, test: str, step: str) -> None:
        """``test`` enters ``step`` ("" when it is done with it)."""
        with self._lock:
            self._current = (test, step, time.monotonic()) if step else None
            self._erase()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with self._lock:
            self._erase()
        self.out.close()

    def _erase(self) -> None:
        if self._shown:
            self._write("\r\x1b[K")
            self._shown = False

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self._current is None:
                    continue
                test, step, since = self._current
                took = time.monotonic() - since
                if took >= self.after_s:
                    self._write(f"\r\x1b[Kagentgate: {test}: {step} for {took:.0f} s")
                    self._shown = True
