"""The CI recipe in examples/ci/ is checked: against GitHub's workflow schema, and by running
its pytest command against a bare repository standing for the server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import git

RECIPE = Path(__file__).resolve().parent.parent / "examples" / "ci" / "github-actions.yml"


def _need(program: str) -> str:
    found = shutil.which(program) or (
        str(Path(sys.executable).parent / program)
        if (Path(sys.executable).parent / program).exists()
        else None
    )
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{program} is missing: the test extra installs it")
        pytest.skip(f"{program} is not installed (pip install -e '.[test]')")
    return found


def test_the_recipe_is_a_valid_github_workflow() -> None:
    checker = _need("check-jsonschema")
    done = subprocess.run(
        [checker, "--builtin-schema", "vendor.github-workflows", str(RECIPE)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_recipe_keeps_its_promises() -> None:
    text = RECIPE.read_text()
    assert "persist-credentials: false" in text  # no token in .git/config
    assert "--agentgate-sandbox=bwrap" in text  # never quietly uncontained
    assert "apparmor_restrict_unprivileged_userns=0" in text  # so bwrap can start
    assert '--agentgate-target="$TARGET"' in text  # checkouts are detached: say the target


def _pytest_command() -> str:
    for line in RECIPE.read_text().splitlines():
        if line.strip().startswith("python -m pytest agents/"):
            return line.strip().removesuffix(" || status=$?")
    raise AssertionError("the recipe has no pytest command")


def _step(name: str) -> dict[str, object]:
    import yaml

    steps = yaml.safe_load(RECIPE.read_text())["jobs"]["agents"]["steps"]
    return next(step for step in steps if step.get("name") == name)


AGENTS = """
import pytest

@pytest.mark.gated(task="add a changelog")
def test_changelog(agent_workspace):
    (agent_workspace.path / "CHANGELOG.md").write_text("- a changelog\\n")

@pytest.mark.gated(task="break the store")
def test_break(agent_workspace):
    (agent_workspace.path / "src" / "ledger" / "store.py").write_text("def broken(:\\n")
"""


def test_the_recipe_s_agent_step_runs_as_written_on_a_src_layout(
    service: Path, tmp_path: Path, bwrap: str
) -> None:
    """The "Run the agents" step's shell script, run by bash as GitHub runs it, in a clone
    whose origin stands for GitHub, on a project with a src layout: one agent lands on the
    staging branch, one is rejected; the step fails, and still writes its outputs."""
    (service / "src").mkdir()
    git(service, "mv", "ledger", "src/ledger")
    (service / "agents").mkdir()
    (service / "agents" / "test_agents.py").write_text(AGENTS)
    (service / "agents" / "requirements.txt").write_text("")
    git(service, "add", "-A")
    git(service, "commit", "-qm", "a src layout and an agent suite")
    server = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(service), str(server))
    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(server), str(checkout))
    git(checkout, "checkout", "-q", "--detach")  # as CI checkouts are
    target = "agents/staging"
    git(checkout, "push", "-q", "origin", f"HEAD:refs/heads/{target}")  # the recipe's step
    script = str(_step("Run the agents")["run"])
    script = script.replace("python -m pytest agents/", f"{sys.executable} -m pytest agents/")
    script = script.replace(" || status=$?", f" --basetemp={tmp_path / 'tmp'} || status=$?")
    outputs = tmp_path / "outputs"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    env.update(TARGET=target, AGENTGATE_AGENT="ci-1", GITHUB_OUTPUT=str(outputs))
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]  # a rejected agent fails the step
    said = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert said == {"report": "agentgate-report.json", "summary": "agentgate-summary.md",
                    "status": "1"}  # fmt: skip
    rows = json.loads((checkout / "agentgate-report.json").read_text())["attempts"]
    assert sorted(r["verdict"] for r in rows) == ["promoted", "rejected"], rows
    assert all(r["sandbox"] == "bwrap" for r in rows)
    assert git(server, "show", f"{target}:CHANGELOG.md") == "- a changelog"
    assert "rejected" in (checkout / "agentgate-summary.md").read_text()
    assert "CHANGELOG.md" not in git(server, "ls-tree", "--name-only", "main")  # staging only


def test_the_offer_to_main_is_made_after_a_rejection_too() -> None:
    offer = _step("Offer the staging branch to main")
    condition = str(offer["if"])
    assert condition.startswith("always()") and "success()" not in condition
    assert "ahead_by" in str(offer["run"])  # no request when staging has nothing new


def test_the_local_dry_run_runs_what_ci_runs_without_promoting() -> None:
    import configparser

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(RECIPE.parent / "tox.ini")
    local = tox["testenv:agents"]["commands"].replace("\\\n", " ")
    ci = _pytest_command()
    gate = '--agentgate-gate="env PYTHONPATH=src python -m pytest -q tests"'  # a src layout too
    for flag in ("--agentgate-sandbox=bwrap", gate):
        assert flag in local and flag in ci
    assert "--agentgate-promote" in ci and "--agentgate-promote" not in local
