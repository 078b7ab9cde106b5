"""Formats that can change: records, the report and the refs layout carry a version; an
older one is read as it was, a newer one is refused with a message saying to upgrade."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import git, land

from pytest_agentgate.cli.main import main
from pytest_agentgate.git.repo import BaseRepo
from pytest_agentgate.store.schema import LAYOUT_REF, RECORD_VERSION, REFS_LAYOUT, REPORT_VERSION

AGENT = """
import pytest

@pytest.mark.gated(task="versioned", gate=["true"], results="exit-code")
def test_versioned(agent_workspace):
    (agent_workspace.path / "v.txt").write_text("v\\n")
"""


def test_a_run_writes_each_version(pytester: pytest.Pytester, service: Path) -> None:
    report = pytester.path / "report.json"
    pytester.makepyfile(test_agent=AGENT)
    result = pytester.runpytest(
        f"--agentgate-repo={service}", "--agentgate-promote", f"--agentgate-report={report}"
    )
    result.assert_outcomes(passed=1)
    assert json.loads(report.read_text())["schema_version"] == REPORT_VERSION
    message = git(service, "log", "-1", "--format=%B", "refs/agentgate/attempts/versioned/1")
    assert f"Agentgate-Schema: {RECORD_VERSION}" in message
    layout = git(service, "cat-file", "blob", LAYOUT_REF)
    assert layout == f"pytest-agentgate refs layout {REFS_LAYOUT}"


def test_a_newer_refs_layout_stops_the_run_before_anything_is_written(
    pytester: pytest.Pytester, service: Path
) -> None:
    repo = BaseRepo.open(service)
    blob = repo.hash_blob(b"pytest-agentgate refs layout 99\n")
    git(service, "update-ref", LAYOUT_REF, blob)
    main_before = git(service, "rev-parse", "main")
    pytester.makepyfile(test_agent=AGENT)
    result = pytester.runpytest(f"--agentgate-repo={service}", "--agentgate-promote")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*newer pytest-agentgate (version 99*upgrade*"])
    assert git(service, "for-each-ref", "refs/agentgate/attempts/") == ""
    assert git(service, "rev-parse", "main") == main_before


def test_an_older_layout_is_marked_and_a_record_without_a_version_is_read(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    """A repository 0.1 or 0.2 wrote (no layout ref, records without Agentgate-Schema)."""
    found = land(service, {"old.txt": "old\n"}, task="old record")
    assert found.verdict.status == "promoted"
    ref = found.record_ref
    assert ref is not None
    # Make it look as 0.2 wrote it: no Schema trailer, and no layout ref.
    message = git(service, "log", "-1", "--format=%B", ref)
    old = "\n".join(line for line in message.splitlines() if "Agentgate-Schema" not in line)
    tree, parent = (
        git(service, "rev-parse", f"{ref}^{{tree}}"),
        git(service, "rev-parse", f"{ref}^"),
    )
    commit = git(service, "commit-tree", tree, "-p", parent, "-m", old)
    git(service, "update-ref", ref, commit)
    git(service, "update-ref", "-d", LAYOUT_REF)
    assert main(["restore", "--repo", str(service), ref, "--to", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "old.txt").read_text() == "old\n"
    # A new record schema the next landing writes; the layout is marked again.
    assert land(service, {"new.txt": "new\n"}, task="new").verdict.status == "promoted"
    assert git(service, "cat-file", "blob", LAYOUT_REF).endswith(f"layout {REFS_LAYOUT}")


def test_a_record_in_a_newer_schema_is_shown_but_not_acted_on(
    capsys: pytest.CaptureFixture[str], service: Path, tmp_path: Path
) -> None:
    found = land(service, {"f.txt": "f\n"}, task="future")
    ref = found.record_ref
    assert ref is not None
    message = git(service, "log", "-1", "--format=%B", ref).replace(
        f"Agentgate-Schema: {RECORD_VERSION}", "Agentgate-Schema: 7"
    )
    tree, parent = (
        git(service, "rev-parse", f"{ref}^{{tree}}"),
        git(service, "rev-parse", f"{ref}^"),
    )
    git(service, "update-ref", ref, git(service, "commit-tree", tree, "-p", parent, "-m", message))
    assert main(["show", "--repo", str(service), ref]) == 0
    capsys.readouterr()
    code = main(["restore", "--repo", str(service), ref, "--to", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0 and "newer pytest-agentgate (version 7" in err and "upgrade" in err
    assert not (tmp_path / "out").exists()
