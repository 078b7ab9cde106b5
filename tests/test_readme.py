"""The README's examples run as written (against a real repository)."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import git

README = Path(__file__).resolve().parent.parent / "README.md"


def block_after(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]  # type: ignore[index]


def test_python_api_example(service: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = block_after("## Python API")
    code = code.replace('"../service"', repr(str(service)))
    code = code.replace("...                                    # the agent edits ws.path",
                        "(ws.path / 'ledger' / 'extra.py').write_text('X = 1\\n')")  # fmt: skip
    code = code.replace(
        '"python -m pytest -q tests"', '"python -m pytest -q -p no:cacheprovider tests"'
    )
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("promoted refs/agentgate/attempts/add-total/1 Move(")
    assert git(service, "show", "main:ledger/extra.py") == "X = 1"


def test_quick_start_commands_are_what_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    quick = text[text.index("## Quick start") : text.index("## What a gated task looks like")]
    commands = re.findall(r"```sh\n(.*?)\n```", quick, re.S)
    assert commands[0] == "python -m pip install . && agentgate demo"
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci.splitlines()  # .ci/run runs exactly the README's test command


def test_the_attributes_the_readme_names_in_prose_exist() -> None:
    """``run_agent()`` returns ``returncode``; the README said ``exit_code``. Every name
    written as a backquoted attribute of what run_agent() returns must be one."""
    from pytest_agentgate.sandbox.process import CommandResult

    text = README.read_text(encoding="utf-8")
    said = text[text.index("run_agent") :].split("returns what it did (", 1)[1].split(")", 1)[0]
    names = re.findall(r"`(\w+)`", said)
    assert names and all(
        hasattr(CommandResult, n) or n in CommandResult.__dataclass_fields__ for n in names
    ), names
