"""Messages name what happened: each once said something else on a real project.

A module that failed to import was reported as thousands of lost tests; an ``os._exit`` in a
new test module was blamed on 'pytest session 2' (a pid of the sandbox's, read as a count)
and tagged as judged by exit code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_judging import attempt, engine

#: Each test judges attempts on the service's base: its results are computed once a worker.
pytestmark = pytest.mark.shared_baselines


def test_a_module_that_fails_to_import_is_named_as_a_collection_error(
    service: Path, sandbox_mode: str
) -> None:
    e = engine(service, sandbox=sandbox_mode)
    broken = "import ledger.nowhere\n\n\ndef test_x():\n    pass\n"
    verdict = attempt(e, {"tests/test_new.py": broken}, "import error").verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    assert verdict.reason.startswith("1 test file(s) could not be collected (tests/test_new.py: ")
    assert "ModuleNotFoundError: No module named 'ledger.nowhere'" in verdict.reason


def test_a_base_module_broken_by_the_code_is_named_as_a_collection_error(service: Path) -> None:
    e = engine(service, sandbox="none")
    verdict = attempt(e, {"ledger/api.py": "raise ImportError('gone')\n"}, "break api").verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    assert "could not be collected (tests/test_ledger.py: ImportError: gone)" in verdict.reason
    assert "so 2 test(s) that passed on the base no longer pass" in verdict.reason


@pytest.mark.parametrize("where", ["a new module", "an existing module"])
def test_an_exit_from_inside_a_test_names_the_test_and_no_session_count(
    service: Path, sandbox_mode: str, where: str
) -> None:
    e = engine(service, sandbox=sandbox_mode)
    exits = "import os\n\n\ndef test_leave():\n    os._exit(0)\n"
    path = "tests/test_leave.py" if where == "a new module" else "tests/test_ledger.py"
    done = attempt(e, {path: exits}, "exit")
    verdict = done.verdict  # type: ignore[attr-defined]
    assert verdict.status in ("rejected", "error"), verdict
    assert "ended without reporting its end during tests/" in verdict.reason, verdict.reason
    assert "test_leave" in verdict.reason
    assert " of " not in verdict.reason.split("ended without")[0]  # one session: no count
    assert "judged_by_exit_code" not in (done.results or {})  # type: ignore[attr-defined]


def test_the_whole_gate_log_is_kept_beside_the_record(
    service: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once the output was cut to 40 lines and kept nowhere whole: with --showlocals a dump
    of locals filled the window, and the frames that named the cause were left out."""
    import sys

    from helpers import git

    from pytest_agentgate.cli.main import main

    gate = f"{sys.executable} -m pytest -q --showlocals -p no:cacheprovider tests"
    e = engine(service, sandbox="none", command=gate)
    noisy = (
        "def test_noisy():\n    for i in range(3000):\n        print(f'key{i}')\n"
        "    big = {'key1': 'v'}\n    assert big['key1'] == 'the cause of it all'\n"
    )
    done = attempt(e, {"tests/test_noisy.py": noisy}, "noisy")
    assert done.verdict.status == "rejected"  # type: ignore[attr-defined]
    message = git(service, "log", "-1", "--format=%B", done.record_ref)  # type: ignore[attr-defined]
    assert "Gate log: 2 command(s)" in message  # the base's tests, then the attempt's
    assert len(message) < 64 << 10
    capsys.readouterr()
    assert main(["show", "--repo", str(service), "--log", done.record_ref]) == 0  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "--showlocals" in out and "the cause of it all" in out
    assert "key0\n" in out and "key2999" in out  # the whole output, not its tail alone
    assert main(["prune", "--repo", str(service), "--older-than", "0d", "--keep-last", "0"]) == 0
    assert not git(service, "for-each-ref", "refs/agentgate/logs/")  # pruned with its record


def test_a_showlocals_dump_does_not_push_the_cause_out_of_the_excerpt(service: Path) -> None:
    """With ``--showlocals`` each frame of a failure dumps its locals: 80 locals in the
    test and 40 in the helper it calls once filled the 40 lines of the excerpt, and the
    lines naming the cause were left out. The dumps are folded and the cause is kept."""
    import sys

    gate = f"{sys.executable} -m pytest -q --showlocals -p no:cacheprovider tests"
    e = engine(service, sandbox="none", command=gate)
    helper_locals = "".join(f"    h{i} = {i}\n" for i in range(40))
    test_locals = "".join(f"    v{i} = 'x' * {i}\n" for i in range(80))
    noisy = (
        f"def check(total):\n{helper_locals}    assert total == 'the cause of it all'\n\n\n"
        f"def test_noisy():\n{test_locals}    check(sum([1, 2]))\n"
    )
    done = attempt(e, {"tests/test_noisy.py": noisy}, "noisy")
    e.close()
    verdict = done.verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    shown = verdict.output.splitlines()
    assert len(shown) <= 40, verdict.output
    assert any(line.startswith("E ") and "the cause of it all" in line for line in shown), shown
    assert any(line.startswith("tests/test_noisy.py:") for line in shown), shown  # where
    assert any("local variable(s) left out" in line for line in shown), shown
    assert not any(line.startswith(("v7 ", "h7 ")) for line in shown), shown
    assert "FAILED tests/test_noisy.py::test_noisy" in verdict.output  # the summary whole
    assert shown[-1].endswith("s") and "1 failed" in shown[-1]


def _rename_docstring_and_caller(service: Path, conflict: bool = False) -> list[object]:
    """Three agents from one base: a rename of ``add_entry``, an innocent docstring, and a
    new caller of the old name (or, with ``conflict``, an edit of the renamed line)."""
    e = engine(service, sandbox="none")
    rename, docstring, caller = (e.fork(task=t) for t in ("Rename add_entry", "Reword", "Use"))
    for rel in ("ledger/store.py", "ledger/report.py", "ledger/api.py"):
        path = rename.path / rel
        path.write_text(path.read_text().replace("add_entry", "add"))
    (docstring.path / "ledger/__init__.py").write_text('"""The ledger service."""\n')
    if conflict:
        api = caller.path / "ledger/api.py"
        api.write_text(api.read_text().replace("store.add_entry(0)", "store.add_entry(1)"))
    else:
        (caller.path / "ledger/summary.py").write_text(
            "from ledger.report import build\n\n\ndef summary(xs):\n"
            "    store = build(xs)\n    store.add_entry(100)\n    return len(store.entries())\n"
        )
        (caller.path / "tests/test_summary.py").write_text(
            "from ledger.summary import summary\n\n\ndef test_summary():\n"
            "    assert summary([1, 2]) == 3\n"
        )
    done = [
        e.run_attempt(rename, task="Rename add_entry", agent="agent-a"),
        e.run_attempt(docstring, task="Reword the docstring", agent="agent-b"),
        e.run_attempt(caller, task="Use add_entry in a summary", agent="agent-c"),
    ]
    e.close()
    return done


def test_a_semantic_clash_names_the_landed_rename_not_an_innocent_neighbour(
    service: Path,
) -> None:
    from helpers import git

    rename, docstring, caller = _rename_docstring_and_caller(service)
    assert rename.verdict.status == docstring.verdict.status == "promoted"  # type: ignore[attr-defined]
    verdict = caller.verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected" and verdict.check == "retest", verdict
    assert "tests/test_summary.py::test_summary" in verdict.reason  # the test that shows it
    landed = git(service, "rev-parse", "main~1")[:12]  # the rename, below the docstring
    assert f"it most likely clashes with {landed} 'Rename add_entry' by agent-a" in verdict.reason
    assert "Reword" not in verdict.reason, verdict.reason
    # The test the merge lost exists on the attempt only: it is not called the base's.
    assert "passed on the base" not in verdict.reason


def test_a_conflict_names_the_landed_commit_that_changed_the_path(service: Path) -> None:
    rename, _, caller = _rename_docstring_and_caller(service, conflict=True)
    verdict = caller.verdict  # type: ignore[attr-defined]
    assert verdict.status == "conflict", verdict
    landed = rename.move.new[:12]  # type: ignore[attr-defined]
    assert (
        f"it clashes with {landed} 'Rename add_entry' by agent-a, which changed ledger/api.py"
        in (verdict.reason)
    ), verdict.reason
