"""What a record and an agent's feedback show of a gate command's output: the part that
names the cause, in a bounded number of lines.

pytest's output is read for its last session's failures section and short test summary
(whatever a command printed after them is left out). In the failures section, what fills a
window without saying why is folded first: the dumps of ``--showlocals`` (a ``name = value``
line for each local of each frame) and reprs longer than a line. Should it still not fit, the
lines that say what failed are kept before the rest: each failing test's header, the
``>`` line it failed at, the ``E`` lines, and the ``file:line: Error`` locations.
"""

from __future__ import annotations

import re

_SECTION = re.compile(r"^=+ (FAILURES|ERRORS|short test summary info) =+$")
_FINAL = re.compile(r"^=+ .*\b(passed|failed|error|errors|no tests ran)\b.* =+$")
#: A local of ``--showlocals``: its name at the start of the line, padded, `` = ``, its repr.
#: (Source lines in a traceback are indented or start with ``>``.)
_LOCAL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\s* = ")
#: What says what failed: a test's header, the line it failed at, its error, where.
_CAUSE = re.compile(r"^(_{3,} .* _{3,}|>|E |\S+:\d+: \S)")
#: The longest line kept whole (a repr of a large value is cut after it).
LINE_CHARS = 240


def pytest_failures(text: list[str], limit: int) -> str:
    """The last pytest session's failures section (folded and cut to fit) and its short
    test summary, in at most ``limit`` lines; empty when the output has no summary of
    pytest's."""
    marks = [(i, m[1]) for i, line in enumerate(text) if (m := _SECTION.match(line))]
    summaries = [i for i, name in marks if name == "short test summary info"]
    if not summaries:
        return ""
    at = summaries[-1]
    end = next((i for i in range(at + 1, len(text)) if _FINAL.match(text[i])), len(text) - 1)
    summary = [_cut(line) for line in text[at : end + 1][:limit]]
    starts = [i for i, name in marks if name != "short test summary info" and i < at]
    room = limit - len(summary)
    if not starts or room <= 1:
        return "\n".join(summary)
    failures = fit(fold_locals([_cut(line) for line in text[starts[-1] : at]]), room)
    return "\n".join([*failures, *summary])


def _cut(line: str) -> str:
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_CHARS]}... ({len(line) - LINE_CHARS} characters left out)"


def fold_locals(lines: list[str]) -> list[str]:
    """``lines`` with each run of ``--showlocals`` dumps made one line saying how many."""
    out: list[str] = []
    run = 0
    for line in [*lines, ""]:
        if _LOCAL.match(line):
            run += 1
            continue
        if run:
            out.append(f"    [{run} local variable(s) left out]")
            run = 0
        out.append(line)
    return out[:-1]


def fit(lines: list[str], room: int) -> list[str]:
    """At most ``room`` of ``lines``: all when they fit; else the lines that say what
    failed, then as much of the context after each as fits, each gap marked with how many
    lines it left out."""
    if len(lines) <= room:
        return lines
    causes = [i for i, line in enumerate(lines) if _CAUSE.match(line)]
    if len(causes) >= room:
        kept = causes[: room - 1]
        return [*(lines[i] for i in kept), f"... ({len(lines) - len(kept)} lines left out)"]
    for extra in range(room - len(causes), -1, -1):
        chosen = sorted(set(causes) | set(_context(len(lines), causes, extra)))
        shown = _with_gaps(lines, chosen)
        if len(shown) <= room:
            return shown
    return [*(lines[i] for i in causes[: room - 1]), "... (lines left out)"]


def _context(count: int, causes: list[int], extra: int) -> list[int]:
    """``extra`` lines of context, taken in turn after each cause (the source line before
    an ``E`` line is a ``>`` line, itself a cause)."""
    taken: list[int] = []
    step = 1
    while len(taken) < extra and step < count:
        for i in causes:
            if i + step < count and i + step not in causes and i + step not in taken:
                taken.append(i + step)
                if len(taken) == extra:
                    break
        step += 1
    return taken


def _with_gaps(lines: list[str], chosen: list[int]) -> list[str]:
    out: list[str] = []
    last = -1
    for i in chosen:
        if i > last + 1:
            out.append(f"... ({i - last - 1} lines left out)")
        out.append(lines[i])
        last = i
    if last < len(lines) - 1:
        out.append(f"... ({len(lines) - 1 - last} lines left out)")
    return out
