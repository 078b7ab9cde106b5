"""Which files a gate runs before its pytest (rule ``wrappers``): the programs and the
scripts an interpreter is given, never a file a command only tests for or reads."""

from __future__ import annotations

from pytest_agentgate.judge.harness import command_paths, ran_files, wrappers_of


def test_the_files_a_gate_runs() -> None:
    assert ran_files(["sh scripts/test.sh", "./ci.sh --fast", "env A=1 tools/run x"]) == {
        "scripts/test.sh",
        "ci.sh",
        "tools/run",
    }
    assert ran_files(["python run_tests.py -x", "bash -e scripts/x.sh"]) == {
        "run_tests.py",
        "scripts/x.sh",
    }


def test_a_file_a_gate_only_tests_for_is_not_run() -> None:
    """``test ! -e leftover.txt`` and ``test -f ledger/store.py`` made those files harness,
    and an attempt that touched them was refused."""
    assert ran_files(["test ! -e leftover.txt && true", "test -f ledger/store.py"]) == set()
    assert ran_files(["python -m pytest tests", "sh -c 'python x.py'"]) == set()


def test_the_wrappers_and_the_folders_a_gate_puts_on_pythonpath() -> None:
    assert wrappers_of(["make test", "sh -c 'cd x && tox -e py'", "python -m pytest"]) == [
        "make",
        "tox",
    ]
    assert command_paths(["PYTHONPATH=src python -m pytest", "env PYTHONPATH=.:lib pytest"]) == {
        "src",
        "",
        "lib",
    }
