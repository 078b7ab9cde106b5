"""The README and the documentation site: their examples run as written, the options table
is the option declaration's, and the site builds strict (a broken link fails it)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import git

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def test_quick_start_commands_are_what_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    quick = text[text.index("## Quick start") : text.index("## What a gated task looks like")]
    commands = re.findall(r"```sh\n(.*?)\n```", quick, re.S)
    assert commands[0] == "python -m pip install . && agentgate demo"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci.splitlines()  # .ci/run runs exactly the README's test command


def test_the_readme_is_a_front_page_whose_links_all_lead_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing


def test_the_options_table_is_the_declaration_s() -> None:
    """docs/options.md holds the table made from OPTIONS, byte for byte: a new option, a
    changed default or help, is in the docs or this fails (write the new table in)."""
    from pytest_agentgate.engine.options import OPTIONS, markdown_table

    page = (DOCS / "options.md").read_text(encoding="utf-8")
    begin = page.index("-->\n", page.index("<!-- options table")) + len("-->\n")
    end = page.index("<!-- end of options table -->")
    assert page[begin:end] == markdown_table()
    assert all(f"`{option.flag}" in page for option in OPTIONS)


def test_every_python_example_compiles() -> None:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    blocks = [(page.name, block) for page in pages for block in python_blocks(page)]
    assert len(blocks) >= 6
    for name, block in blocks:
        compile(block, name, "exec")


def test_the_python_api_example_runs(service: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = python_blocks(DOCS / "api.md")[0]
    code = code.replace('"../service"', repr(str(service)))
    code = code.replace("...                                    # the agent edits ws.path",
                        "(ws.path / 'ledger' / 'extra.py').write_text('X = 1\\n')")  # fmt: skip
    code = code.replace(
        '"python -m pytest -q tests"', '"python -m pytest -q -p no:cacheprovider tests"'
    )
    exec(compile(code, "api.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("promoted refs/agentgate/attempts/add-total/1 Move(")
    assert git(service, "show", "main:ledger/extra.py") == "X = 1"


def test_the_readme_example_runs_as_written(pytester: pytest.Pytester, service: Path) -> None:
    """The gated test and the command of "What a gated task looks like", with an agent that
    adds the method: the attempt is promoted and the target holds its change."""
    text = README.read_text(encoding="utf-8")
    example = python_blocks(README)[0]
    command = re.findall(r"```sh\n(.*?)\n```", text, re.S)[2]
    pytester.makepyfile(
        my_agent="""
        from pathlib import Path

        def run(prompt, cwd):
            store = Path(cwd) / "ledger" / "extra.py"
            store.write_text("def total(values):\\n    return sum(values)\\n")
        """
    )
    pytester.makepyfile(test_task="import my_agent\n" + example)
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:2] == ["pytest", "agent_tasks/"]
    flags = [w.replace("=../service", f"={service}") for w in words[2:]]
    assert f"--agentgate-repo={service}" in flags
    result = pytester.runpytest_subprocess("test_task.py", *flags)
    assert result.ret == 0, result.stdout.str()
    assert "(fast-forward)" in result.stdout.str()
    assert git(service, "show", "main:ledger/extra.py").startswith("def total")


def test_the_attributes_the_docs_name_in_prose_exist() -> None:
    """Every name written as a backquoted attribute of what run_agent() returns is one."""
    from pytest_agentgate.sandbox.process import CommandResult

    text = (DOCS / "agents.md").read_text(encoding="utf-8")
    said = text[text.index("run_agent") :].split("returns what it did (", 1)[1].split(")", 1)[0]
    names = re.findall(r"`(\w+)`", said)
    assert names and all(
        hasattr(CommandResult, n) or n in CommandResult.__dataclass_fields__ for n in names
    ), names


def _mkdocs() -> list[str]:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("mkdocs is not installed (CI=true: the docs build must run)")
        pytest.skip("mkdocs is not installed (the test extra brings it)")
    return [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
    ]  # --quiet would hide the warnings strict counts


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_mkdocs(), "--config-file", str(root / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )


def test_the_docs_build_strict(tmp_path: Path) -> None:
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "run_attempt" in api and "EngineSettings" in api  # made from the docstrings
    options = (tmp_path / "site" / "options" / "index.html").read_text(encoding="utf-8")
    assert "--agentgate-gate-exit-code" in options


@pytest.mark.parametrize(
    "broken",
    ["a link to a page that is not there", "an anchor that is not there", "a missing reference"],
)
def test_a_broken_link_fails_the_docs_build(tmp_path: Path, broken: str) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(DOCS, copy / "docs")
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "pytest_agentgate", copy / "pytest_agentgate")
    line = {
        "a link to a page that is not there": "See [the guide](no-such-page.md).",
        "an anchor that is not there": "See [options](options.md#no-such-heading).",
        "a missing reference": "::: pytest_agentgate.engine.NoSuchThing",
    }[broken]
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")
    built = _build(copy, tmp_path / "site")
    assert built.returncode != 0, broken
