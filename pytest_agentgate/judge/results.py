"""Per-test results of a gate, and how an attempt's compare with its base's.

A gate command that exits 0 proves little: a configuration can collect nothing, a module can
``os._exit(0)``, a decorator can skip the failing test. So a pytest gate writes a JUnit XML
report outside the checkout (the plugin adds the option), any other command can declare the
JUnit file it writes, and the verdict is made from what the tests did:

- every test that passed on the base must pass on the attempt: not fail, error, skip or xfail,
  not go missing (``allow_removed`` lets a task remove tests on purpose);
- every test the attempt adds must pass;
- tests that fail on the base are not required of the attempt.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import stat
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PASSED, FAILED, ERROR, SKIPPED, XFAIL = "passed", "failed", "error", "skipped", "xfail"
#: How bad each outcome is: where one test has two (two phases, two sessions, two lines
#: sent), the worse one stands.
RANK = {PASSED: 1, SKIPPED: 2, XFAIL: 2, FAILED: 3, ERROR: 3}
#: A baseline's word for a test that failed and then passed on the base: not required.
FLAKY = "flaky"
#: Shell syntax: a command holding any of these runs through ``sh -c``, not exec'd directly.
_SHELL = set("|&;<>()$`\\\"'*?[]{}~#\n")


def command_argv(command: str) -> list[str] | None:
    """The argument list of a simple command (no shell syntax), else None (run via sh -c).

    A simple command is exec'd by the plugin itself, so a program that is not there is the
    plugin's own failed launch (a harness error), never an exit code the agent's code chose.
    """
    if _SHELL & set(command):
        return None
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    return argv or None


#: A gate command: a string as a person writes it, or an argument list the plugin built.
Command = str | tuple[str, ...]


def argv_of(command: Command) -> list[str] | None:
    """The argument list a command is exec'd with, or None when it runs through ``sh -c``."""
    return list(command) if isinstance(command, tuple) else command_argv(command)


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def split_assignments(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``VAR=value ... program args`` as a shell reads it: the environment for the program,
    and the program's own argument list. ``env VAR=value program`` (``env`` with no option
    of its own) reads the same way."""
    words = list(argv)
    if words and Path(words[0]).name == "env" and len(words) > 1 and not words[1].startswith("-"):
        words = words[1:]
    assigned: dict[str, str] = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        assigned[name] = value
    return assigned, words


def display(command: Command) -> str:
    return command if isinstance(command, str) else shlex.join(command)


def is_pytest(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs pytest (``pytest ...``, ``python -m pytest ...``)."""
    if not argv:
        return False
    program = Path(argv[0]).name
    if program in ("pytest", "py.test") or program.startswith("pytest-"):
        return True
    return program.startswith("python") and list(argv[1:3]) == ["-m", "pytest"]


def read_inside(root: Path, relative: str, limit: int = 64 << 20) -> bytes:
    """The bytes of the regular file ``relative`` below ``root``, never through a link.

    Each folder on the way is opened relative to the one before with ``O_NOFOLLOW``, so a
    symbolic link anywhere on the path (planted by what the gate ran) is an ``OSError``,
    never a way to read a file elsewhere.
    """
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(f"{relative!r} is not a path inside the checkout")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            inner = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = inner
        leaf = os.open(
            parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd
        )
    finally:
        os.close(fd)
    with os.fdopen(leaf, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{relative!r} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{relative!r} is larger than {limit >> 20} MiB")
    return data


def parse_junit(data: bytes) -> dict[str, str]:
    """Test id -> outcome, from a JUnit XML document (pytest's ``--junitxml`` and its kin)."""
    root = ET.fromstring(data)
    found: dict[str, str] = {}
    for case in root.iter("testcase"):
        test = _node_id(case.get("file", ""), case.get("classname", ""), case.get("name", ""))
        outcome = PASSED
        for child in case:
            if child.tag == "failure":
                outcome = FAILED
            elif child.tag == "error":
                outcome = ERROR
            elif child.tag == "skipped":
                kind = child.get("type", "")
                outcome = XFAIL if "xfail" in kind else SKIPPED
        # A test that errors in setup and fails in its call is listed twice: the worse wins.
        if found.get(test) in (FAILED, ERROR):
            continue
        found[test] = outcome
    return found


def _node_id(file: str, classname: str, name: str) -> str:
    """pytest's node id (``tests/test_x.py::TestY::test_z``) from a JUnit test case.

    pytest's xunit1 reports name the file; the class part is what of the dotted classname
    follows the module. Other JUnit writers (no file) keep ``classname::name``.
    """
    if not file.endswith(".py"):
        return f"{classname}::{name}" if classname else name
    module = file[: -len(".py")].replace("/", ".")
    inner = classname[len(module) :].lstrip(".") if classname.startswith(module) else ""
    return "::".join(part for part in (file, *inner.split("."), name) if part)


@dataclass(frozen=True)
class Comparison:
    """An attempt's results against its base's."""

    lost: tuple[str, ...] = ()  # passed on the base, not passing now
    failed: tuple[str, ...] = ()  # tests the attempt added that do not pass
    new: tuple[str, ...] = ()  # tests the base does not have
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.failed

    def reason(self, limit: int = 5, *, before: str = "") -> str:
        """Why it fails; ``before`` says where the lost tests passed (default: on the base)."""
        parts = []
        if self.lost:
            parts.append(
                f"{len(self.lost)} test(s) that passed {before or 'on the base'} no longer "
                "pass: " + _names(self.lost, limit)
            )
        if self.failed:
            parts.append(
                f"{len(self.failed)} new test(s) do not pass: " + _names(self.failed, limit)
            )
        return "; ".join(parts)

    def as_dict(self) -> dict[str, object]:
        return {**self.counts, "lost_ids": list(self.lost), "failed_ids": list(self.failed)}


def _names(ids: Sequence[str], limit: int) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def compare(
    attempt: Mapping[str, str],
    base: Mapping[str, str] | None,
    allow_removed: Iterable[str] = (),
    ignore: Sequence[str] = (),
) -> Comparison:
    """Judge ``attempt``'s per-test outcomes against ``base``'s.

    With no baseline known (None) nothing can be lost, and a test is held only to not failing.
    Tests matching ``ignore`` (ids or globs) are left out on both sides.
    """
    allowed = tuple(allow_removed)
    known = base is not None
    base = base or {}
    if ignore:
        attempt = {t: o for t, o in attempt.items() if not _allowed(t, ignore)}
        base = {t: o for t, o in base.items() if not _allowed(t, ignore)}
    lost = tuple(
        sorted(
            test
            for test, outcome in base.items()
            if outcome == PASSED
            and attempt.get(test) != PASSED
            and not (test not in attempt and _allowed(test, allowed))
        )
    )
    # A file of the base's tests that no longer collects reports under its own path: its
    # tests are lost (said so), not a new test of the attempt's.
    files = {t.partition("::")[0] for t in base}
    new = tuple(sorted(t for t in attempt if t not in base and not ("::" not in t and t in files)))
    failed = tuple(
        t for t in new if (attempt[t] != PASSED if known else attempt[t] in (FAILED, ERROR))
    )
    return _comparison(attempt, lost, failed, new)


def compare_additions(attempt: Mapping[str, str], base: Mapping[str, str] | None) -> Comparison:
    """The tests of the attempt's own added and changed test modules: each must pass, unless
    it does not pass on the base either. None is lost for being absent: the base's versions
    of those files run in a session of their own."""
    base = base or {}
    held = [t for t, o in attempt.items() if o != PASSED and base.get(t, PASSED) == PASSED]
    lost = tuple(sorted(t for t in held if t in base))
    failed = tuple(sorted(t for t in held if t not in base))
    new = tuple(sorted(t for t in attempt if t not in base))
    return _comparison(attempt, lost, failed, new)


def _comparison(
    attempt: Mapping[str, str], lost: tuple[str, ...], failed: tuple[str, ...], new: tuple[str, ...]
) -> Comparison:
    """The comparison of ``attempt``'s outcomes, with its counts."""
    counts = {
        "passed": sum(1 for o in attempt.values() if o == PASSED),
        "failed": sum(1 for o in attempt.values() if o in (FAILED, ERROR)),
        "skipped": sum(1 for o in attempt.values() if o in (SKIPPED, XFAIL)),
        "new": len(new),
        "lost": len(lost),
    }
    return Comparison(lost, failed, new, counts)


def matches(test: str, patterns: Sequence[str]) -> bool:
    """Whether ``test`` is one of ``patterns`` (ids or globs)."""
    return _allowed(test, patterns)


def _allowed(test: str, patterns: Sequence[str]) -> bool:
    return any(test == p or fnmatch.fnmatchcase(test, p) for p in patterns)


def failing(results: Mapping[str, str]) -> list[str]:
    return sorted(t for t, o in results.items() if o in (FAILED, ERROR))
