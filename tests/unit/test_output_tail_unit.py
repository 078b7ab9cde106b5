"""What a record and an agent's feedback keep of a gate's output: pytest's failures and its
short summary, not the last lines of whatever the command printed after them."""

from __future__ import annotations

from pytest_agentgate.sandbox.process import CommandResult, pytest_failures

PYTEST_RUN = [
    "============================= test session starts ==============================",
    "collected 3 items",
    "tests/test_ledger.py .F.                                                  [100%]",
    "=================================== FAILURES ===================================",
    "__________________________________ test_total __________________________________",
    "    def test_total():",
    ">       assert total([1, 2]) == 3",
    "E       assert 4 == 3",
    "tests/test_ledger.py:9: AssertionError",
    "=========================== short test summary info ============================",
    "FAILED tests/test_ledger.py::test_total - assert 4 == 3",
    "========================= 1 failed, 2 passed in 0.05s ==========================",
]
TABLE = [f"row {i:>3}  {'x' * 20}  {i * 1.5:.1f} ms" for i in range(60)]


def result(lines: list[str]) -> CommandResult:
    return CommandResult("make check", 1, "\n".join(lines), 1.0)


def test_the_failures_and_the_summary_are_kept_over_a_table_printed_after_them() -> None:
    shown = result([*PYTEST_RUN, *TABLE]).tail(40).splitlines()
    assert "E       assert 4 == 3" in shown
    assert "FAILED tests/test_ledger.py::test_total - assert 4 == 3" in shown
    assert not any(line.startswith("row ") for line in shown)


def test_a_long_failures_section_is_cut_and_the_summary_kept_whole() -> None:
    long = [*PYTEST_RUN[:5], *(f"    line {i}" for i in range(200)), *PYTEST_RUN[5:]]
    shown = result(long).tail(20).splitlines()
    assert len(shown) <= 20
    assert shown[-1].startswith("===") and "1 failed" in shown[-1]
    assert any("lines left out" in line for line in shown)


def test_output_that_is_not_pytest_s_keeps_its_last_lines() -> None:
    assert result(TABLE).tail(5).splitlines() == TABLE[-5:]
    assert pytest_failures(TABLE, 40) == ""


def test_showlocals_dumps_are_folded_and_the_cause_kept() -> None:
    from pytest_agentgate.sandbox.excerpt import fold_locals

    frame = [
        "    def test_total():",
        *(f"{'v' + str(i):<10} = {i!r}" for i in range(30)),
        ">       assert total([1, 2]) == 3",
        "E       assert 4 == 3",
        "",
        *(f"{'w' + str(i):<10} = 'x'" for i in range(30)),
        "tests/test_ledger.py:9: AssertionError",
    ]
    folded = fold_locals(frame)
    assert folded.count("    [30 local variable(s) left out]") == 2
    assert "E       assert 4 == 3" in folded and "    def test_total():" in folded
    run = [*PYTEST_RUN[:5], *frame, *PYTEST_RUN[9:]]
    shown = result(run).tail(12).splitlines()
    assert len(shown) <= 12
    assert "E       assert 4 == 3" in shown and "tests/test_ledger.py:9: AssertionError" in shown


def test_when_the_causes_alone_overflow_they_are_kept_first() -> None:
    from pytest_agentgate.sandbox.excerpt import fit

    lines = [f"_____ test_{i} _____" if i % 3 == 0 else f"    context {i}" for i in range(90)]
    shown = fit(lines, 10)
    assert len(shown) == 10 and shown[-1].startswith("... (")
    assert all(line.startswith("_____") for line in shown[:-1])
    assert fit(lines[:5], 10) == lines[:5]


def test_a_long_repr_is_cut() -> None:
    long = "E       assert " + "x" * 5000
    shown = result([*PYTEST_RUN[:7], long, *PYTEST_RUN[8:]]).tail(40)
    assert "characters left out" in shown and len(shown) < 2000
