"""A batch's merged tree tested while its attempts' own gates still run: the early re-test.

Under pytest-xdist the workers fall into step: one landing releases them all, their gates
run together, and all but one of their attempts then need a merge, re-tested once the
gates are over: a whole gate's duration more per test, for every test. Instead, as an
attempt's own gate begins, one process merges every attempt of the same batch key that is
being judged now, or queued, onto the tip, and runs the gate on that tree at the same time
(in a thread, beside its own gate).

Its result is kept by the tree it tested. When a leader then makes a batch whose top is
exactly that tree, the result stands for the batch's re-test, checked against what passed
on the tip the batch lands on (the run could not know that tip: an attempt of it may have
fast-forwarded meanwhile). Any other batch never uses it. So what lands is still exactly a
tree that was tested, and nothing in the queue's rules changes: only when the test runs.
Zuul's speculative pipelines test a change on the ones ahead of it before those land; this
also tests before the attempts themselves are judged (as an idea).

The cost is a gate run that may go unused (one of the attempts fails its own gate, or the
batch forms otherwise): at most one early re-test per batch key runs at a time, on this
machine. ``--agentgate-no-early-retest`` turns it off.

Files, in the queue's folder: ``early/<key>-<tree>.json`` (a result), ``.running`` (a
run under way, with its process id) and ``.decided`` (a leader re-tested that tree itself:
its answer stands, and an early result of the same tree, written before or after, is never
used: a tree seen failing once must not land on an older pass); the lock
``early/<target>/<key>`` is held while one runs, so a leader waiting for it blocks on the
lock, not on a poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..git.repo import Author
from ..sandbox.process import Running
from ..store import locks, pending
from ..store.files import write_whole as _write

if TYPE_CHECKING:
    from ..git.repo import BaseRepo
    from .retest import BatchRetest
    from .target import Target


class Queued(Protocol):
    """What an early re-test reads of one queued attempt."""

    @property
    def uid(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def change_commit(self) -> str: ...
    @property
    def base(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def foreign(self) -> bool: ...


class QueueView(Protocol):
    """What early re-tests read of their target's landing queue (a narrow view, not the
    queue itself: the queue uses early re-tests, never the other way round)."""

    repo: BaseRepo
    target: Target
    batch_max: int

    @property
    def folder(self) -> Path: ...

    def entries(self) -> Sequence[Queued]: ...

    def intents(self, key: str | None) -> list[tuple[str, dict[str, object]]]: ...


#: How long the attempts of a batch key must have stopped beginning their gates before the
#: early re-test merges them (seconds) ... (0.25 was measured too: on an idle machine 16
#: tests under -n 4 took 7.1-8.4 gate durations against 6.5-6.7; under load, a worker that
#: begins later than this is left out, and the run is a gate run for nothing) ...
SETTLE_S = 0.15
#: ... and the longest it waits for that: workers released by one landing begin together.
WINDOW_S = 0.5
#: How long a result is kept unused (seconds): a batch forms within a gate's duration.
KEEP_S = 3600.0
#: The least a leader waits for an early re-test under way (seconds; else three gates).
WAIT_FLOOR_S = 30.0
#: No early re-test when this process's last gate took less (seconds): its attempts are
#: queued before the settling is over, and a re-test costs next to nothing anyway.
MIN_GATE_S = 0.5

_AUTHOR = Author("agentgate", "early-retest@agentgate.invalid")


@dataclass(frozen=True)
class Found:
    """An early re-test's result, as kept: passed or not, why not, its output's tail, and its
    per-test results (None when the gate reports none)."""

    ok: bool
    why: str
    output: str
    tests: dict[str, str] | None
    fingerprint: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Item:
    """One attempt to merge: its id, a commit of its change, the base it stands on."""

    uid: str
    commit: str
    base: str


class EarlyRetests:
    """The early re-tests of one target's queue, started and read by its processes."""

    def __init__(self, queue: QueueView, *, enabled: bool = True) -> None:
        self.queue = queue
        self.enabled = enabled
        self._running = Running()
        self._threads: list[threading.Thread] = []

    @property
    def folder(self) -> Path:
        return self.queue.folder / "early"

    # -- starting one ---------------------------------------------------------------------

    def begin(self, uid: str, key: str, retest: BatchRetest, *, last_gate_s: float = 0.0) -> None:
        """The gate of ``uid`` (batch key ``key``) begins: test, beside it, the tree its
        batch will most likely land, unless an early re-test of the key already runs.
        ``last_gate_s``: how long this process's last gate took (0: none yet)."""
        if not self.enabled or self.queue.batch_max < 2 or 0 < last_gate_s < MIN_GATE_S:
            return
        thread = threading.Thread(
            target=self._run, args=(key, retest), name=f"agentgate-early-{uid[:8]}", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _run(self, key: str, retest: BatchRetest) -> None:
        try:
            with locks.ref_lock_unless(self.queue.repo, self._lock_name(key), lambda: True) as got:
                if got is None:
                    return  # one runs already: this attempt joins the batch after it
                self._settle(key)
                self._test(key, retest)
        except BaseException:  # an optimisation, never a failure (ended: an interrupt)
            return

    def _settle(self, key: str) -> None:
        """Wait until the attempts of ``key`` have stopped beginning their gates (a bounded
        time), so that the batch tested is the one that forms."""
        deadline = time.monotonic() + WINDOW_S
        seen = len(self.queue.intents(key))
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and not self._running.ended:
            time.sleep(0.03)
            now = len(self.queue.intents(key))
            if now != seen:
                seen, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= SETTLE_S:
                return

    def _test(self, key: str, retest: BatchRetest) -> None:
        tip = self.queue.target.tip()
        if tip is None or self._running.ended:
            return
        made = self._chain(tip, self._items(key))
        if made is None:
            return
        top, bases = made
        result, marker, decided = self._paths(key, top)
        if result.exists() or marker.exists() or decided.exists():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self._sweep()
        _write(marker, json.dumps({"pid": os.getpid(), "tip": tip, "since": time.time()}))
        try:
            found = retest(top, tip, bases, ahead=True, running=self._running)
            if self._running.ended or decided.exists():
                return  # ended half-way, or a leader tested that tree meanwhile
            kept = {
                **asdict(found),
                "fingerprint": sorted(found.fingerprint),
                "bases": bases,
                "tip": tip,
                "at": time.time(),
            }
            _write(result, json.dumps(kept))
        finally:
            marker.unlink(missing_ok=True)

    def _items(self, key: str) -> list[_Item]:
        """What the batch of ``key`` would hold: the queued attempts (arrival order), then
        the ones being judged (in the order their gates began); none when they are more
        than a batch holds, as which of them the first batch takes depends on the order
        they arrive in, not known yet (16 separate processes spent a gate run more with an
        early re-test of 8 of them)."""
        items = [
            _Item(e.uid, e.change_commit, e.base)
            for e in self.queue.entries()
            if e.key == key and not e.foreign and pending.pid_alive(e.pid)
        ]
        seen = {item.uid for item in items}
        repo = self.queue.repo
        for uid, intent in self.queue.intents(key):
            tree, base = str(intent.get("tree", "")), str(intent.get("base", ""))
            if uid in seen or not tree or not base:
                continue
            commit = repo.commit_tree(tree, [base], "agentgate: early re-test", _AUTHOR)
            items.append(_Item(uid, commit, base))
        return items if len(items) <= self.queue.batch_max else []

    def _chain(self, tip: str, items: Sequence[_Item]) -> tuple[str, list[str]] | None:
        """``items`` merged one after another onto ``tip``, as a leader's batch merges them
        (one that conflicts, or is there already, left out): the top tree, and the bases;
        None when that tree is nothing a batch would need re-tested."""
        repo = self.queue.repo
        head, merged, bases = tip, 0, []
        for item in items:
            if head == item.base:
                head = item.commit  # a fast-forward: the attempt's own tree
            else:
                preview = repo.merge_preview(head, item.commit)
                if preview.conflicts or preview.tree == repo.tree_of(head):
                    continue
                head = repo.commit_tree(
                    preview.tree, [head, item.commit], "agentgate: early re-test", _AUTHOR
                )
                merged += 1
            bases.append(item.base)
        if not merged:
            return None  # the tip itself, or one attempt's own tree: its own gate tests it
        return repo.tree_of(head), bases

    # -- reading one ----------------------------------------------------------------------

    def result(self, key: str, tree: str, gate_s: float = 0.0) -> Found | None:
        """The early re-test of exactly ``tree`` for ``key``: waited for while it runs (it
        began before a re-test begun now would), None when there is none. The wait ends
        with its lock, with its process, or after a few gates' durations (``gate_s``, how
        long one takes), whichever comes first: a process stopped (SIGSTOP) holding it must
        not stall the queue."""
        if not self.enabled:
            return None
        result, marker, decided = self._paths(key, tree)
        if decided.exists():
            return None
        if _running(marker):
            deadline = time.monotonic() + max(WAIT_FLOOR_S, 3 * gate_s)

            def given_up() -> bool:
                return time.monotonic() > deadline or not _running(marker)

            with (
                contextlib.suppress(OSError),
                locks.ref_lock_unless(self.queue.repo, self._lock_name(key), given_up),
            ):
                pass  # it ends with its lock
        try:
            data = json.loads(result.read_text(encoding="utf-8"))
            tests = data.get("tests")
            found = Found(
                data["ok"] is True,
                str(data.get("why", "")),
                str(data.get("output", "")),
                {str(k): str(v) for k, v in tests.items()} if isinstance(tests, dict) else None,
                frozenset(str(e) for e in data.get("fingerprint") or ()),
            )
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None
        if decided.exists():
            return None  # a leader tested it itself meanwhile: its answer stands
        result.unlink(missing_ok=True)  # one batch lands that tree, once
        return found

    def decide(self, key: str, tree: str) -> None:
        """A leader re-tests ``tree`` itself (no early result of it was there): from now on
        its answer stands for that tree, and no early result of it is written or used.
        Else an early pass of a tree written after the leader's own run failed it could
        let a later batch with that top land on the pass."""
        if not self.enabled:
            return
        with contextlib.suppress(OSError):
            self.folder.mkdir(parents=True, exist_ok=True)
            result, _, decided = self._paths(key, tree)
            _write(decided, str(time.time()))
            result.unlink(missing_ok=True)

    def close(self) -> None:
        """At this process's end (a pytest-xdist worker's last test done): let its early
        re-tests finish while another process's attempts may land on them, else end them.
        Found under ``-n 2``: a worker that ended its run killed the early re-test the other
        worker's leader was waiting for, which then re-tested itself."""
        for thread in self._threads:
            while thread.is_alive():
                if not self._wanted():
                    self._running.end_all()
                thread.join(0.2)

    def _wanted(self) -> bool:
        """Whether another live process has an attempt queued or being judged here."""
        me = os.getpid()
        try:
            return any(
                e.pid != me and pending.pid_alive(e.pid) for e in self.queue.entries()
            ) or any(intent.get("pid") != me for _, intent in self.queue.intents(None))
        except (OSError, ValueError, TypeError):
            return False  # unreadable: nobody to wait for

    # -- files ----------------------------------------------------------------------------

    def _paths(self, key: str, tree: str) -> tuple[Path, Path, Path]:
        name = f"{key}-{tree}"
        return (
            self.folder / f"{name}.json",
            self.folder / f"{name}.running",
            self.folder / f"{name}.decided",
        )

    def _lock_name(self, key: str) -> str:
        return f"early/{self.queue.target.ref}/{key}"

    def _sweep(self) -> None:
        """Remove results nobody used, and markers of runs whose process is gone."""
        now = time.time()
        for path in self.folder.iterdir():
            with contextlib.suppress(OSError):
                stale = (
                    not _running(path)
                    if path.suffix == ".running"
                    else path.suffix in (".json", ".decided")
                    and now - path.stat().st_mtime > KEEP_S
                )
                if stale:
                    path.unlink()


def _running(marker: Path) -> bool:
    """Whether the run ``marker`` announces is under way (its process alive)."""
    try:
        return pending.pid_alive(int(json.loads(marker.read_text(encoding="utf-8"))["pid"]))
    except (OSError, ValueError, TypeError, KeyError):
        return False
