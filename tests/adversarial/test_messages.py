"""Messages name what happened: each once said something else on a real project.

A module that failed to import was reported as thousands of lost tests; an ``os._exit`` in a
new test module was blamed on 'pytest session 2' (a pid of the sandbox's, read as a count)
and tagged as judged by exit code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_judging import attempt, engine


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
