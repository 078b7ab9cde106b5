"""The run's settings: every ``--agentgate-*`` option, resolved once into frozen values.

Each setting is declared once, in :mod:`..engine.options` (its flag, ini key, environment
variable, default, parser and the field it fills); the command line wins over the
environment, which wins over the ini file. :meth:`Settings.from_config` reads them all and
resolves them through those declarations in one pass (each bad value is a usage error naming
the setting and where its value came from), and :meth:`Settings.for_test` is the one place a
test's marker refines them. The idea is pytest-timeout's ``Settings`` and pytest's
``from_config`` constructors; the code is this project's own.

Imported the first time a run needs its settings (a gated test was collected); the engine's
types are imported then too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from .. import _constants
from ..engine.options import OPTIONS
from ..engine.resolving import resolve
from .options import given, usage

if TYPE_CHECKING:
    from ..engine import EngineSettings
    from ..git.repo import BaseRepo
    from ..judge.gate import GateSpec
    from ..sandbox.agent_command import AgentCommand
    from ..store.record import Landing
    from .marker import GatedMarker


@dataclass(frozen=True)
class RunSettings:
    """The plugin's own settings (``run.`` in the option table): where the run's files go,
    what ``run_agent()`` runs."""

    repo: str | None = None
    agent_command: AgentCommand | None = None
    agent_timeout: float = _constants.DEFAULT_AGENT_TIMEOUT_S
    agent_network_strict: bool = False
    report: Path | None = None
    markdown: Path | None = None
    workdir: Path | None = None
    keep_runs: int = _constants.DEFAULT_KEEP_RUNS


@dataclass(frozen=True)
class Settings:
    """Every setting of the run, checked; made once per pytest run by :meth:`from_config`:
    the plugin's own, and the engine's (its gate's and sandbox's inside)."""

    rootpath: Path
    run: RunSettings
    #: The engine's settings; its work directory and run id are set when it opens.
    engine: EngineSettings
    #: Where each given value came from, for error messages (a setting not given: none).
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Read and check every setting; a bad value is a usage error (exit code 4)."""
        from ..engine import EngineSettings
        from ..errors import ConfigError

        raws = {option.name: given(config, option.name) for option in OPTIONS}
        try:
            resolved = resolve({name: raw for name, raw in raws.items() if raw is not None})
            engine = EngineSettings.resolved(resolved)
        except ConfigError as exc:
            raise usage(str(exc)) from None
        return cls(config.rootpath, RunSettings(**resolved.of("run")), engine, resolved.sources)

    # -- what the engine is given --------------------------------------------------------

    @property
    def agent(self) -> str:
        return self.engine.agent

    def gate_spec(self) -> GateSpec:
        """The run's gate (the marker refines it per test, in :meth:`for_test`)."""
        return self.engine.gate

    def engine_settings(self, workdir: Path, run_id: str = "") -> EngineSettings:
        """What the engine is made with; ``workdir`` is this run's own directory."""
        return replace(self.engine, workdir=workdir, run_id=run_id or self.engine.run_id)

    def engine_sources(self) -> dict[str, str]:
        """Where ``repo``/``target``/``base``/``remote`` came from, for the engine's errors."""
        return {
            "repo": self.sources.get("repo", "default")
            if self.run.repo
            else "pytest's rootdir; name another with --agentgate-repo=PATH",
            "target": self.sources.get("target", "default"),
            "base": self.sources.get("base", "default"),
            "remote": self.sources.get("remote", "default"),
        }

    def for_test(
        self, gate: GateSpec, marker: GatedMarker, checks: Sequence[Any], repo: BaseRepo
    ) -> GateSpec:
        """The one place a test's marker refines the run's gate."""
        return replace(
            gate,
            commands=gate.commands if marker.gate is None else marker.gate,
            results_mode=marker.results or gate.results_mode,
            outcome_is_enough=marker.gate == (),
            checks=tuple(checks),
            protect=(*gate.protect, *marker.protect),
            max_changed_lines=marker.max_changed_lines,
            landing=cast("Landing", marker.land or gate.landing),
            allow_removed=marker.allow_removed,
            allow_changed=(*gate.allow_changed, *marker.allow_changed),
            grading=_grading_for(marker, repo),
        )


def _grading_for(marker: GatedMarker, repo: BaseRepo) -> Any:
    if not marker.fail_to_pass:
        return None
    from ..errors import RevisionNotFound
    from ..judge.grading import Grading

    tests_from = None
    if marker.tests_from:
        try:
            tests_from = repo.history.resolve_commit(marker.tests_from, "tests_from")
        except RevisionNotFound as exc:
            raise usage(str(exc)) from exc
    return Grading(marker.fail_to_pass, marker.pass_to_pass, tests_from)
