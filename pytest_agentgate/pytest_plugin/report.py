"""What a run tells people: the terminal summary section, the JSON report, CI Markdown."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_WORD = {
    "promoted": "PROMOTED",
    "passed": "WOULD PROMOTE",
    "rejected": "REJECTED",
    "conflict": "CONFLICT",
    "error": "ERROR",
}


#: How many lines of a failed try's output its feedback keeps.
OUTPUT_LINES = 60


def feedback_text(task: str, attempt: int, history: Iterable[Mapping[str, Any]]) -> str:
    """What the agent's ``{feedback}`` file says before a try: the task, which try this is,
    and each earlier try's verdict, reason and failing output (Markdown, for people too)."""
    out = [f"# Feedback for try {attempt} at: {task}", ""]
    earlier = list(history)
    if not earlier:
        out.append("This is the first try: there is no earlier verdict.")
    for entry in earlier:
        out += [
            f"## Try {entry.get('attempt')}: {entry.get('verdict')}",
            "",
            f"- reason: {entry.get('reason') or '-'}",
            f"- check: {entry.get('check') or '-'}",
            f"- record: {entry.get('attempt_ref') or 'not recorded'}",
        ]
        if entry.get("next_starts_from"):
            out.append(f"- the next try starts from: {entry['next_starts_from']}")
        output = str(entry.get("output") or "").rstrip()
        if output:
            out += ["", "~~~", output.replace("~~~", "~ ~ ~"), "~~~"]
        steps = str(entry.get("transcript") or "").rstrip()
        if steps:
            out += ["", "What the agent did (the end of its transcript):", "", "~~~",
                    steps.replace("~~~", "~ ~ ~"), "~~~"]  # fmt: skip
        out.append("")
    return "\n".join(out) + "\n"


def short(oid: object) -> str:
    return str(oid)[:12] if oid else "-"


def summary_line(row: Mapping[str, Any]) -> str:
    """One line per gated test: verdict, test, attempt commit, target old -> new."""
    verdict = _WORD.get(str(row.get("verdict")), str(row.get("verdict")).upper())
    old, new = row.get("target_old"), row.get("target_new")
    target = row.get("target", "target")
    landed = row.get("verdict") in ("promoted", "passed")
    if landed and old and old == new:
        verdict = "ALREADY ON"  # its change was on the target already: nothing moved
    line = f"{verdict:<13} {row.get('test') or row.get('task')}  attempt {short(row.get('attempt_commit'))}"
    if int(row.get("try") or 1) > 1:
        # The try of this test, and the record's own number (tries of earlier runs count).
        ref = str(row.get("attempt_ref") or "")
        recorded = "/".join(ref.split("/")[-2:]) if ref else ""
        line += f" (try {row['try']}" + (f", recorded as {recorded}" if recorded else "") + ")"
    if landed and old and old == new:
        line += f"  already on {target} at {short(old)}: nothing moved"
    elif landed:
        how = row.get("promotion") or ""
        if row.get("retest_skipped"):
            how += ", re-test skipped (--agentgate-no-retest)"
        elif row.get("retested"):
            how += ", re-tested"
        line += f"  {target}: {short(old)} -> {short(new)} ({how})"
        if row.get("external_move"):
            line += f"  [target had moved outside agentgate: {row['external_move']}]"
        if row.get("reason"):
            line += f"  [{_clip(str(row['reason']).splitlines()[0], 160)}]"
    else:
        line += f"  {target} stays at {short(old)}"
        if row.get("reason"):
            line += f"  [{_clip(str(row['reason']).splitlines()[0], 160)}]"
    if row.get("record_problem"):
        line += f"  [{row['record_problem']}]"
    budget = row.get("budget") or {}
    if budget:
        line += (
            "  [budget "
            + ", ".join(
                f"{name} {_number(used)}/{_number(limit)}" for name, (used, limit) in budget.items()
            )
            + "]"
        )
    others = row.get("landed_for_others") or []
    if others:
        shown = ", ".join(f"{o.get('task')} ({o.get('agent')}, {o.get('machine')})" for o in others)
        line += f"  [landed for other machines: {_clip(shown, 200)}]"
    by_exit_code = (row.get("results") or {}).get("judged_by_exit_code")
    if by_exit_code:
        line += f"  [judged by exit code: {_clip(', '.join(by_exit_code), 120)}]"
    flaky = (row.get("results") or {}).get("flaky_ids")
    if flaky:
        line += f"  [flaky: {_clip(', '.join(flaky), 120)}]"
    return line


def _number(value: float) -> str:
    return f"{value:g}" if not float(value).is_integer() else str(int(value))


def _clip(text: str, limit: int) -> str:
    """``text`` cut at a word boundary, with an ellipsis, when longer than ``limit``."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


def terminal_lines(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    return [summary_line(row) for row in rows]


def write_json(path: Path, rows: list[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    from ..store.schema import REPORT_VERSION

    document = {"schema_version": REPORT_VERSION, **meta, "attempts": rows}
    tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def markdown(rows: Iterable[Mapping[str, Any]]) -> str:
    """A table for CI step summaries (``$GITHUB_STEP_SUMMARY`` and the like)."""
    out = ["| verdict | test | attempt | target |", "|---|---|---|---|"]
    for row in rows:
        target = f"{short(row.get('target_old'))} -> {short(row.get('target_new'))}"
        out.append(
            f"| {row.get('verdict')} | `{row.get('test')}` | `{row.get('attempt_ref')}` | {target} |"
        )
    notes = [f"\n> {line}" for line in sandbox_warnings(rows)]
    return "\n".join(out) + "\n" + "".join(notes)


def sandbox_warnings(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per distinct reason the attempts ran uncontained (none when all were)."""
    from ..sandbox.containment import HOW_TO_GET, UNPROTECTED

    reasons = sorted(
        {str(r.get("sandbox", "")) for r in rows if str(r.get("sandbox", "")).startswith("none")}
    )
    return [
        f"WARNING agentgate sandbox {reason}: {UNPROTECTED}. To contain them: {HOW_TO_GET}."
        for reason in reasons
    ]


def rejection_message(row: Mapping[str, Any], repo_label: str, output: str, workspace: str) -> str:
    """What a failed gated test says in pytest's report: the verdict, the deciding check,
    where the attempt's record is and how to read it, and the failing output's tail."""
    import shlex

    ref = row.get("attempt_ref")
    lines = [
        f"agentgate {row.get('verdict')}: {row.get('reason')}",
        f"  check:   {row.get('check') or '-'}",
        f"  attempt: {ref}  (read it: git -C {shlex.quote(repo_label)} show {ref})"
        if ref
        else f"  attempt: not recorded ({row.get('record_problem') or 'no record'})",
        f"  workspace kept at {workspace}",
    ]
    if output.strip():
        lines += ["  output (last lines):", *("    " + line for line in output.splitlines())]
    return "\n".join(lines)


def write_all(
    rows: list[Mapping[str, Any]],
    *,
    json_path: Path | None,
    markdown_path: Path | None,
    meta: Mapping[str, Any],
) -> None:
    """The run's reports: the JSON file (always, when asked for) and the Markdown table
    (appended, when there is anything to say)."""
    if json_path is not None:
        write_json(json_path, rows, meta)
    if markdown_path is not None and rows:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        with open(markdown_path, "a", encoding="utf-8") as out:
            out.write("### agentgate\n\n" + markdown(rows) + "\n")
