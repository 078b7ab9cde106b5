"""The run's settings: every ``--agentgate-*`` option, resolved once into a frozen object.

Each setting is a command-line flag, an ini key (``agentgate_<name>``) and sometimes an
environment variable; the command line wins over the environment, which wins over the ini
file. :meth:`Settings.from_config` reads and checks them all in one place (each bad value is
a usage error naming the setting and where its value came from), and :meth:`Settings.for_test`
is the one place a test's marker refines them. The idea is pytest-timeout's ``Settings`` and
pytest's ``from_config`` constructors; the code is this project's own.

Imported the first time a run needs its settings (a gated test was collected); the engine's
types are imported when a gate is first built. The option table itself is :mod:`.options`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from .. import _constants
from .marker import LANDINGS
from .options import BY_NAME, MODES, OPTIONS, raw_setting, usage

if TYPE_CHECKING:
    from ..engine import EngineSettings
    from ..git.repo import BaseRepo
    from ..judge.gate import GateSpec
    from ..sandbox.agent_command import AgentCommand
    from ..store.record import Landing
    from .marker import GatedMarker


@dataclass(frozen=True)
class _Checked:
    """The raw settings and where each came from, with the checks that need both (a bad
    value is a usage error that names its flag and its source)."""

    values: dict[str, Any]
    sources: dict[str, str]

    def choice(self, name: str, allowed: Sequence[str], *, lower: bool = False) -> str:
        raw = self.values[name]
        value = str(raw) if not lower else str(raw).strip().lower()
        if value not in allowed:
            expected = " or ".join(allowed) if not lower else "one of " + ", ".join(allowed)
            raise usage(
                f"invalid {BY_NAME[name].flag} {value!r} (from {self.sources[name]}): "
                f"expected {expected}"
            )
        return value

    def preset(
        self, agent: str, command: AgentCommand | None
    ) -> tuple[AgentCommand | None, tuple[str, ...], str]:
        """The agent command, its environment names and its network, with what the preset
        named by ``agent`` fills in where nobody set them."""
        from dataclasses import replace

        from ..agents import presets
        from ..agents.usage import parse_fields
        from ..sandbox.agent_command import AgentCommand

        env = _env_names(self.values["agent_env"], "agent_env", self.sources["agent_env"])
        network = self.network("agent_network")
        try:
            fields = parse_fields(self.values["agent_usage"] or ())
        except ValueError as exc:
            raise usage(
                f"invalid --agentgate-agent-usage (from {self.sources['agent_usage']}): {exc}"
            ) from None
        found = presets.find(agent)
        if found is None:
            return (replace(command, usage_fields=fields) if command else None), env, network
        if command is None:
            command = AgentCommand.parse(found.template(os.environ))
        command = replace(
            command,
            env=tuple(found.fixed_env.items()),
            usage=found.usage,
            usage_fields=fields,
            transcript_file=found.transcript_file,
            preset=found.name,
        )
        if self.sources["agent_network"] == "default":
            network = str(found.network(os.environ))
        return command, tuple(dict.fromkeys((*found.env_names, *env))), network

    def network(self, name: str) -> str:
        from ..errors import ConfigError
        from ..sandbox.network import Network

        try:
            return str(Network.parse(str(self.values[name])))
        except ConfigError as exc:
            raise usage(
                f"invalid {BY_NAME[name].flag} {self.values[name]!r} (from {self.sources[name]}): "
                f"{exc}"
            ) from None

    def agent(self) -> str:
        agent = str(self.values["agent"] or "agent")
        if any(ord(c) < 32 or ord(c) in (127, 0x85, 0x2028, 0x2029) for c in agent):
            raise usage(
                f"invalid --agentgate-agent {agent!r} (from {self.sources['agent']}): it "
                "contains a control character (a newline, a tab...); use a plain name"
            )
        return agent

    def agent_command(self) -> AgentCommand | None:
        text = self.values["agent_command"]
        if not text or not str(text).strip():
            return None
        from ..sandbox.agent_command import AgentCommand, AgentCommandError

        try:
            return AgentCommand.parse(str(text))
        except AgentCommandError as exc:
            raise usage(
                f"invalid --agentgate-agent-command (from {self.sources['agent_command']}): "
                f"{exc.reason}"
            ) from exc

    def positive_seconds(self, name: str) -> None:
        if float(self.values[name]) <= 0:
            raise usage(
                f"invalid --agentgate-{name.replace('_', '-')} {self.values[name]!r} (from "
                f"{self.sources[name]}): give a number of seconds above 0"
            )

    def writable(self, name: str) -> None:
        path = self.values[name]
        if path and not _writable_parent(Path(path)):
            raise usage(
                f"cannot write --agentgate-{name} {path!r} (from {self.sources[name]}): its "
                "directory does not exist or is not writable"
            )

    def workdir(self) -> Path | None:
        raw = self.values["workdir"]
        workdir = Path(raw).expanduser() if raw else None
        if workdir is not None and workdir.exists() and not workdir.is_dir():
            raise usage(
                f"--agentgate-workdir {raw!r} (from {self.sources['workdir']}) is not a directory"
            )
        return workdir

    def unprotect(self) -> tuple[str, ...]:
        unprotect = _words(self.values["unprotect"])
        if unprotect:
            from ..judge.harness import DEFAULT_HARNESS, unknown_rules

            unknown = unknown_rules(unprotect)
            if unknown:
                raise usage(
                    f"invalid --agentgate-unprotect {unknown[0]!r} (from "
                    f"{self.sources['unprotect']}): the rules are {', '.join(DEFAULT_HARNESS)}"
                )
        return unprotect


def _words(values: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in values or () if v.strip())


@dataclass(frozen=True)
class Settings:
    """Every setting of the run, checked; made once per pytest run by :meth:`from_config`."""

    rootpath: Path
    repo: str | None = None
    target: str | None = None
    base: str | None = None
    remote: str | None = None
    promote: bool = False
    retest: bool = True
    batch_max: int = _constants.DEFAULT_BATCH_MAX
    early_retest: bool = True
    push_state: bool = False
    lease_seconds: float = _constants.DEFAULT_LEASE_S
    signing_key: Path | None = None
    allowed_signers: Path | None = None
    unsigned_posts: bool = False
    agent: str = "agent"
    agent_command: AgentCommand | None = None
    agent_timeout: float = _constants.DEFAULT_AGENT_TIMEOUT_S
    gate: tuple[str, ...] = ()
    gate_exit_code: tuple[str, ...] = ()
    gate_setup: tuple[str, ...] = ()
    gate_timeout: float = _constants.DEFAULT_GATE_TIMEOUT_S
    gate_jobs: int = 1
    protect: tuple[str, ...] = ()
    unprotect: tuple[str, ...] = ()
    rerun_gate: int = 0
    flaky: str = "reject"
    tests_of: str = _constants.DEFAULT_TESTS_OF
    land: str = "merge"
    allow_changed: tuple[str, ...] = ()
    gate_results: str | None = None
    report: Path | None = None
    markdown: Path | None = None
    workdir: Path | None = None
    keep_runs: int = _constants.DEFAULT_KEEP_RUNS
    exclude: tuple[str, ...] | None = None
    recycle: bool = True
    max_files: int = _constants.DEFAULT_MAX_FILES
    max_bytes: int = _constants.DEFAULT_MAX_BYTES
    max_state_bytes: int = _constants.DEFAULT_MAX_BYTES
    isolation: str = "shared"
    allow_symlinks: tuple[str, ...] = ()
    sandbox: str = "auto"
    sandbox_binds: tuple[str, ...] = ()
    sandbox_reads: tuple[str, ...] = ()
    agent_network: str = "none"
    agent_network_strict: bool = False
    gate_network: str = "none"
    agent_env: tuple[str, ...] = ()
    gate_env: tuple[str, ...] = ()
    sandbox_pids: int = _constants.DEFAULT_PIDS_MAX
    sandbox_file_bytes: int = _constants.DEFAULT_FILE_BYTES
    #: Where each value came from, for error messages.
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Read and check every setting; a bad value is a usage error (exit code 4)."""
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for option in OPTIONS:
            values[option.name], sources[option.name] = raw_setting(config, option.name)
        read = _Checked(values, sources)
        choice = read.choice
        agent, command = read.agent(), read.agent_command()
        command, agent_env, agent_network = read.preset(agent, command)
        for name in ("lease_seconds", "agent_timeout"):
            read.positive_seconds(name)
        for name in ("report", "markdown"):
            read.writable(name)
        workdir = read.workdir()
        protect, unprotect = _words(values["protect"]), read.unprotect()
        return cls(
            rootpath=config.rootpath,
            repo=values["repo"] or None,
            target=values["target"],
            base=values["base"] or None,
            remote=values["remote"] or None,
            promote=bool(values["promote"]),
            retest=not values["no_retest"],
            batch_max=int(values["batch_max"]),
            early_retest=not values["no_early_retest"],
            push_state=bool(values["push_state"]),
            lease_seconds=float(values["lease_seconds"]),
            signing_key=_existing_file(values, sources, "signing_key"),
            allowed_signers=_existing_file(values, sources, "allowed_signers"),
            unsigned_posts=bool(values["unsigned_posts"]),
            agent=agent,
            agent_command=command,
            agent_timeout=float(values["agent_timeout"]),
            **{name: _commands(values[name]) for name in ("gate", "gate_exit_code", "gate_setup")},
            gate_timeout=float(values["gate_timeout"]),
            gate_jobs=int(values["gate_jobs"]),
            protect=protect,
            unprotect=unprotect,
            rerun_gate=int(values["rerun_gate"]),
            flaky=choice("flaky", ("reject", "accept")),
            tests_of=choice("tests_of", ("base", "attempt")),
            land=choice("land", LANDINGS),
            allow_changed=_words(values["allow_changed"]),
            gate_results=values["gate_results"] or None,
            report=Path(values["report"]) if values["report"] else None,
            markdown=Path(values["markdown"]) if values["markdown"] else None,
            workdir=workdir,
            keep_runs=int(values["keep_runs"]),
            exclude=tuple(values["exclude"]) if values["exclude"] is not None else None,
            recycle=not values["fresh_workspaces"],
            max_files=int(values["max_files"]),
            max_bytes=int(values["max_bytes"]),
            max_state_bytes=int(values["max_state_bytes"]),
            isolation=choice("isolation", ("shared", "sealed")),
            allow_symlinks=_words(values["allow_symlink"]),
            sandbox=choice("sandbox", MODES, lower=True),
            sandbox_binds=_words(values["sandbox_bind"]),
            sandbox_reads=_words(values["sandbox_read"]),
            agent_network=agent_network,
            agent_network_strict=bool(values["agent_network_strict"]),
            gate_network=read.network("gate_network"),
            agent_env=agent_env,
            gate_env=_env_names(values["gate_env"], "gate_env", sources["gate_env"]),
            sandbox_pids=int(values["sandbox_pids"]),
            sandbox_file_bytes=int(values["sandbox_file_bytes"]),
            sources=sources,
        )

    # -- what the engine is given --------------------------------------------------------

    @property
    def protects_nothing(self) -> bool:
        return self.protect == ("none",)

    def gate_spec(self) -> GateSpec:
        """The run's gate (the marker refines it per test, in :meth:`for_test`)."""
        from ..judge.gate import GateSpec
        from ..judge.harness import DEFAULT_HARNESS

        rules = (
            ()
            if self.protects_nothing
            else tuple(r for r in DEFAULT_HARNESS if r not in self.unprotect)
        )
        return GateSpec(
            commands=tuple(dict.fromkeys((*self.gate, *self.gate_exit_code))),
            exit_code=self.gate_exit_code,
            setup=self.gate_setup,
            timeout=self.gate_timeout,
            harness=rules,
            protect=() if self.protects_nothing else self.protect,
            results_file=self.gate_results,
            rerun=self.rerun_gate,
            flaky=self.flaky,
            jobs=self.gate_jobs,
            tests_of=self.tests_of,
            allow_changed=self.allow_changed,
            landing=cast("Landing", self.land),
        )

    def engine_settings(self, workdir: Path, run_id: str = "") -> EngineSettings:
        """What the engine is made with; ``workdir`` is this run's own directory."""
        from ..engine import EngineSettings
        from ..errors import ConfigError
        from ..sandbox.containment import Bind
        from ..sandbox.containment import Settings as SandboxSettings
        from ..sandbox.network import Network

        try:
            binds = tuple(
                Bind.parse(b, self.sources.get("sandbox_bind", "")) for b in self.sandbox_binds
            )
            reads = tuple(
                Bind.parse(r, self.sources.get("sandbox_read", "")).path for r in self.sandbox_reads
            )
        except ConfigError as exc:
            raise usage(str(exc)) from None
        contained = SandboxSettings(
            mode=self.sandbox,
            binds=binds,
            agent_network=Network.parse(self.agent_network),
            gate_network=Network.parse(self.gate_network),
            agent_env=self.agent_env,
            gate_env=self.gate_env,
            pids_max=self.sandbox_pids,
            file_bytes=self.sandbox_file_bytes,
            reads=reads,
        )
        options: dict[str, Any] = {}
        if self.exclude is not None:
            options["exclude"] = self.exclude
        if run_id:
            options["run_id"] = run_id
        return EngineSettings(
            target=self.target,
            promote=self.promote,
            remote=self.remote,
            base=self.base,
            workdir=workdir,
            gate=self.gate_spec(),
            retest=self.retest,
            batch_max=self.batch_max,
            early_retest=self.early_retest,
            push_state=self.push_state,
            lease_seconds=self.lease_seconds,
            signing_key=self.signing_key,
            allowed_signers=self.allowed_signers,
            unsigned_posts=self.unsigned_posts,
            max_files=self.max_files,
            max_bytes=self.max_bytes,
            max_state_bytes=self.max_state_bytes,
            agent=self.agent,
            recycle=self.recycle,
            sandbox=contained,
            isolation=self.isolation,
            allow_symlinks=self.allow_symlinks,
            **options,
        )

    def engine_sources(self) -> dict[str, str]:
        """Where ``repo``/``target``/``base``/``remote`` came from, for the engine's errors."""
        return {
            "repo": self.sources.get("repo", "default")
            if self.repo
            else "pytest's rootdir; name another with --agentgate-repo=PATH",
            "target": self.sources.get("target", "default"),
            "base": self.sources.get("base", "default"),
            "remote": self.sources.get("remote", "default"),
        }

    def for_test(
        self, gate: GateSpec, marker: GatedMarker, checks: Sequence[Any], repo: BaseRepo
    ) -> GateSpec:
        """The one place a test's marker refines the run's gate."""
        from dataclasses import replace

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
            tests_from = repo.resolve_commit(marker.tests_from, "tests_from")
        except RevisionNotFound as exc:
            raise usage(str(exc)) from exc
    return Grading(marker.fail_to_pass, marker.pass_to_pass, tests_from)


def _env_names(values: Sequence[str] | None, name: str, source: str) -> tuple[str, ...]:
    names = _words(values)
    for value in names:
        if not value.replace("_", "a").isalnum() or value[0].isdigit():
            raise usage(
                f"invalid --agentgate-{name.replace('_', '-')} {value!r} (from {source}): "
                "expected the name of an environment variable"
            )
    return names


def _existing_file(values: dict[str, Any], sources: dict[str, str], name: str) -> Path | None:
    """A setting that names a file which must exist (a key, an allowed-signers file)."""
    if not values[name]:
        return None
    path = Path(str(values[name])).expanduser().resolve()
    if not path.is_file():
        raise usage(
            f"--agentgate-{name.replace('_', '-')} {values[name]!r} (from {sources[name]}) is "
            "not a file"
        )
    return path


def _writable_parent(path: Path) -> bool:
    parent = path.resolve().parent
    return parent.is_dir() and os.access(parent, os.W_OK)


def _commands(given: Sequence[str] | None) -> tuple[str, ...]:
    """The commands a repeatable option or an ini list names, blank lines left out."""
    return tuple(c for c in given or () if c.strip())
