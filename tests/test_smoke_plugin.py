from __future__ import annotations

import pytest
from helpers import git


def test_gated_promotes(pytester: pytest.Pytester, service) -> None:
    pytester.makepyfile(
        test_agent="""
        import pytest

        @pytest.mark.gated(task="Add total", agent="agent-a")
        def test_total(agent_workspace):
            p = agent_workspace.path / "ledger" / "store.py"
            p.write_text(p.read_text() + "\\n    def total(self):\\n        return sum(self._rows)\\n")
        """
    )
    before = git(service, "rev-parse", "main")
    result = pytester.runpytest(
        f"--agentgate-repo={service}",
        "--agentgate-gate=python -m pytest -q -p no:cacheprovider tests",
        "--agentgate-promote",
    )
    result.stdout.fnmatch_lines(["*agentgate*", "PROMOTED*test_total*"])
    result.assert_outcomes(passed=1)
    assert git(service, "rev-parse", "main") != before
