"""Every setting, declared once: its name (the flag ``--agentgate-<name>``, the ini key
``agentgate_<name>``), any environment variable, its kind and default, its help, how its raw
value is parsed and checked, and the field of the value it fills.

The fields it fills are those of :class:`~pytest_agentgate.engine.EngineSettings`
(``engine.``), of its :class:`~pytest_agentgate.judge.gate.GateSpec` (``gate.``) and sandbox
settings (``sandbox.``), the plugin's own (``run.``: where reports go, the agent command), or
of that agent command (``command.``, folded into it once it is known).
:func:`resolve` turns raw values into those fields in one pass; the plugin reads raw values
from pytest's command line and ini file, the command from its own arguments, and both resolve
through here. The idea is tox's ``add_config`` (one declaration carries the keys, the
default, the help and the conversion); the code is this project's own.

Loaded with the plugin in every pytest run, so it imports nothing but the shared constants
at import time: a parser imports what it needs when a value is resolved.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .._constants import (
    DEFAULT_AGENT_TIMEOUT_S,
    DEFAULT_BATCH_MAX,
    DEFAULT_EXCLUDE,
    DEFAULT_FILE_BYTES,
    DEFAULT_GATE_TIMEOUT_S,
    DEFAULT_KEEP_RUNS,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    DEFAULT_PIDS_MAX,
    DEFAULT_TESTS_OF,
    ISOLATIONS,
    LANDINGS,
    SANDBOX_MODES,
)

AGENT_ENV = "AGENTGATE_AGENT"
#: The values fields are grouped into (see the module's docstring).
GROUPS = ("run", "engine", "gate", "sandbox", "command")

#: A raw value (parsed by its kind) to the field's value; raises ValueError (or
#: ConfigError) with the reason when the value is bad.
Parse = Callable[[Any], Any]


class Option(NamedTuple):
    """One setting, declared once."""

    name: str
    help: str
    #: ``group.field``: the value it fills.
    into: str
    kind: str = "string"  # string, linelist, bool, float, int
    default: Any = None
    metavar: str | None = None
    env: str | None = None  # an environment variable that sets it, below the command line
    choices: tuple[str, ...] = ()  # case-folded
    parse: Parse | None = None
    #: A number that may be 0 (none: no re-runs, no old run kept); else it must be above 0.
    zero: bool = False

    @property
    def flag(self) -> str:
        return "--agentgate-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "agentgate_" + self.name

    @property
    def group(self) -> str:
        return self.into.partition(".")[0]

    @property
    def field(self) -> str:
        return self.into.partition(".")[2]


# -- the parsers: each turns one raw value into its field's -----------------------------


def _optional(value: Any) -> Any:
    return value or None


def _negated(value: Any) -> bool:
    return not value


def _words(values: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in values or () if v.strip())


def _commands(values: Sequence[str] | None) -> tuple[str, ...]:
    """The commands a repeatable option or an ini list names, blank lines left out."""
    return tuple(c for c in values or () if c.strip())


def _path(value: Any) -> Path | None:
    return Path(str(value)).expanduser() if value else None


def _writable(value: Any) -> Path | None:
    """A file the run writes: its folder, or the nearest one that exists (the folders
    between are made when it is written), must be a folder this user can write in."""
    path = _path(value)
    if path is not None:
        folder = path.resolve().parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not (folder.is_dir() and os.access(folder, os.W_OK)):
            raise ValueError("its directory cannot be made or is not writable")
    return path


def _existing_file(value: Any) -> Path | None:
    path = _path(value)
    if path is not None and not path.resolve().is_file():
        raise ValueError("it is not a file")
    return path.resolve() if path is not None else None


def _directory(value: Any) -> Path | None:
    path = _path(value)
    if path is not None and path.exists() and not path.is_dir():
        raise ValueError("it is not a directory")
    return path


def _env_names(values: Sequence[str] | None) -> tuple[str, ...]:
    names = _words(values)
    for name in names:
        if not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ValueError(f"expected the name of an environment variable, not {name!r}")
    return names


def _agent_name(value: Any) -> str | None:
    from ..store.records import check_name

    return check_name(str(value), "agent name") if value else None


def _agent_command(value: Any) -> Any:
    if not value or not str(value).strip():
        return None
    from ..sandbox.agent_command import AgentCommand, AgentCommandError

    try:
        return AgentCommand.parse(str(value))
    except AgentCommandError as exc:
        raise ValueError(exc.reason) from None


def _usage_fields(values: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    from ..agents.usage import parse_fields

    return parse_fields(values or ())


def _network(value: Any) -> Any:
    from ..sandbox.network import Network

    return Network.parse(str(value), "")


def _binds(values: Sequence[str] | None) -> tuple[Any, ...]:
    from ..sandbox.containment import Bind

    return tuple(Bind.parse(text, "") for text in _words(values))


def _reads(values: Sequence[str] | None) -> tuple[Path, ...]:
    return tuple(bind.path for bind in _binds(values))


def _harness(values: Sequence[str] | None) -> tuple[str, ...]:
    """The harness rules in force: every rule but those lifted by name."""
    from ..judge.harness import DEFAULT_HARNESS, unknown_rules

    lifted = _words(values)
    unknown = unknown_rules(lifted)
    if unknown:
        raise ValueError(f"{unknown[0]!r} is no rule; the rules are {', '.join(DEFAULT_HARNESS)}")
    return tuple(rule for rule in DEFAULT_HARNESS if rule not in lifted)


def _exclude(values: Sequence[str] | None) -> tuple[str, ...] | None:
    return tuple(values) if values is not None else None


OPTIONS = (
    Option(
        "repo",
        "the repository the agents edit (default: the one around the rootdir)",
        "run.repo",
        metavar="PATH",
        parse=_optional,
    ),
    Option(
        "target",
        "the branch attempts are promoted to (default: the checked-out branch)",
        "engine.target",
        metavar="BRANCH",
    ),
    Option(
        "base",
        "fork every workspace from this commit instead of the tip the agent finds (which "
        "holds what earlier agents of the run landed); run-start: the target's tip when the "
        "run started, for every agent and every xdist worker",
        "engine.base",
        metavar="REV",
        parse=_optional,
    ),
    Option(
        "remote",
        "the target lives on this remote of the repository: promote by push with a lease",
        "engine.remote",
        metavar="NAME",
        parse=_optional,
    ),
    Option(
        "lease_seconds",
        "with --agentgate-remote: how long the server's lease on the branch (one batch leader "
        "across machines) lasts unless renewed; a dead leader's is taken over after it",
        "engine.lease_seconds",
        "float",
        DEFAULT_LEASE_S,
        "SECONDS",
    ),
    Option(
        "signing_key",
        "with --agentgate-remote: an SSH private key this machine signs the attempts it "
        "posts on the server's queue with (without one, it posts none and leads its own)",
        "engine.signing_key",
        metavar="PATH",
        parse=_existing_file,
    ),
    Option(
        "allowed_signers",
        "with --agentgate-remote: git's allowed-signers file; a leader takes another "
        "machine's posted attempt only when a key it names signed it",
        "engine.allowed_signers",
        metavar="PATH",
        parse=_existing_file,
    ),
    Option(
        "unsigned_posts",
        "with --agentgate-remote: post unsigned and take unsigned posts (anyone who can push "
        "to the server could then post an attempt)",
        "engine.unsigned_posts",
        "bool",
        False,
    ),
    Option(
        "push_state",
        "with --agentgate-remote: push each attempt's state and its checkpoints to the server "
        "too, not only its record (state can hold a whole database)",
        "engine.push_state",
        "bool",
        False,
    ),
    Option(
        "gate",
        "a command that must exit 0 in a clean checkout of the attempt; repeatable (ini: one per line)",
        "gate.commands",
        "linelist",
        metavar="CMD",
        parse=_commands,
    ),
    Option(
        "gate_exit_code",
        "a gate command judged by its exit code alone (one that runs no pytest: a linter, a "
        "type check); repeatable. Every other gate command must report per-test results "
        "when promoting",
        "gate.exit_code",
        "linelist",
        metavar="CMD",
        parse=_commands,
    ),
    Option(
        "gate_setup",
        "a command run once in each gate checkout before its gate commands (what a build "
        "must generate: a version file, compiled parts); contained like them, judged by its "
        "exit code; repeatable",
        "gate.setup",
        "linelist",
        metavar="CMD",
        parse=_commands,
    ),
    Option(
        "gate_timeout",
        "seconds a gate command may run before its process group is killed",
        "gate.timeout",
        "float",
        DEFAULT_GATE_TIMEOUT_S,
        "SECONDS",
    ),
    Option(
        "gate_jobs",
        "how many gate commands of one attempt run at once, each in its own checkout",
        "gate.jobs",
        "int",
        1,
        "N",
    ),
    Option(
        "promote",
        "move the target for real (default: a dry run onto a scratch ref of the run's own)",
        "engine.promote",
        "bool",
        False,
    ),
    Option(
        "no_retest",
        "do not re-run the gate on a merge onto a target that moved",
        "engine.retest",
        "bool",
        False,
        parse=_negated,
    ),
    Option(
        "no_early_retest",
        "do not test a batch's merged tree while its attempts' own gates run (a gate run "
        "fewer when one of them fails; a gate's duration more of waiting for the rest)",
        "engine.early_retest",
        "bool",
        False,
        parse=_negated,
    ),
    Option(
        "batch_max",
        "most attempts one re-test of a merge lands together (1: every merge is tested alone)",
        "engine.batch_max",
        "int",
        DEFAULT_BATCH_MAX,
        "N",
    ),
    Option(
        "agent_command",
        "what agent_workspace.run_agent() runs: a template split into arguments (no shell) "
        "with {task} {workspace} {agent} {attempt} {feedback}",
        "run.agent_command",
        metavar="TEMPLATE",
        parse=_agent_command,
    ),
    Option(
        "agent_timeout",
        "seconds run_agent() lets the agent run before every process of it is ended "
        "(the attempt's verdict is then error)",
        "run.agent_timeout",
        "float",
        DEFAULT_AGENT_TIMEOUT_S,
        "SECONDS",
    ),
    Option(
        "agent",
        "the agent's name on attempts and log records; "
        "a preset's name (claude-code, codex, aider, mini-swe-agent) also fills in its "
        "command, environment, network and usage",
        "engine.agent",
        default="agent",
        metavar="NAME",
        env=AGENT_ENV,
        parse=_agent_name,
    ),
    Option(
        "report",
        "write a JSON report of every attempt to this path",
        "run.report",
        metavar="PATH",
        parse=_writable,
    ),
    Option(
        "markdown",
        "append a Markdown table of the attempts to this file (default: $GITHUB_STEP_SUMMARY)",
        "run.markdown",
        metavar="PATH",
        env="GITHUB_STEP_SUMMARY",
        parse=_writable,
    ),
    Option(
        "workdir",
        "where workspaces and gate checkouts are made (default: pytest's temporary directory)",
        "run.workdir",
        metavar="DIR",
        parse=_directory,
    ),
    Option(
        "exclude",
        "globs never snapshotted (secrets): naming any replaces the default list; one per "
        "line in the ini file",
        "engine.exclude",
        "linelist",
        DEFAULT_EXCLUDE,
        metavar="GLOB",
        parse=_exclude,
    ),
    Option(
        "protect",
        "a glob of paths an attempt may not change, added to the protected test harness "
        "(conftest.py, pytest configuration...); 'none' protects nothing; repeatable",
        "gate.protect",
        "linelist",
        metavar="GLOB",
        parse=_words,
    ),
    Option(
        "unprotect",
        "lift one rule of the protected harness by its name (conftest.py, "
        "pyproject.toml:[tool.pytest.ini_options], __init__.py, pytest_plugins...); repeatable",
        "gate.harness",
        "linelist",
        (),
        metavar="NAME",
        parse=_harness,
    ),
    Option(
        "rerun_gate",
        "run a failing gate command again on the same tree up to N times (a test that then "
        "passes is flaky)",
        "gate.rerun",
        "int",
        0,
        "N",
        zero=True,
    ),
    Option(
        "flaky",
        "what a flaky test does to its attempt: reject (default) or accept",
        "gate.flaky",
        default="reject",
        metavar="POLICY",
        choices=("reject", "accept"),
    ),
    Option(
        "tests_of",
        "whose tests judge the code: base (default: the base's test files in a session of "
        "their own, then the attempt's added and changed test modules) or attempt (its whole "
        "tree in one session, its tests as it left them)",
        "gate.tests_of",
        default=DEFAULT_TESTS_OF,
        metavar="WHOSE",
        choices=("base", "attempt"),
    ),
    Option(
        "land",
        "how a passing attempt lands on a target that moved past its base: merge (default: "
        "a merge commit), squash (one commit, the task its subject, the agent its author, "
        "on the base too) or rebase (its commit replayed on the tip); each re-tested alike",
        "gate.landing",
        default="merge",
        metavar="HOW",
        choices=LANDINGS,
    ),
    Option(
        "allow_changed",
        "test files (globs) or test ids every task may change: a file named here is the "
        "attempt's in the base's session (the marker's allow_changed= adds to it)",
        "gate.allow_changed",
        kind="linelist",
        metavar="GLOB",
        parse=_words,
    ),
    Option(
        "gate_results",
        "the JUnit XML file a gate command that is not pytest writes, relative to its checkout",
        "gate.results_file",
        metavar="PATH",
        parse=_optional,
    ),
    Option(
        "keep_runs",
        "with --agentgate-workdir: how many runs' directories to keep (default 3; 0: none "
        "but a live run's)",
        "run.keep_runs",
        "int",
        DEFAULT_KEEP_RUNS,
        "N",
        zero=True,
    ),
    Option(
        "fresh_workspaces",
        "check out every workspace afresh instead of recycling the ones promoted attempts used",
        "engine.recycle",
        "bool",
        False,
        parse=_negated,
    ),
    Option(
        "sandbox",
        "contain agent commands and gates: auto (bwrap when it works, else uncontained with a "
        "warning), bwrap (required), none",
        "sandbox.mode",
        default="auto",
        metavar="MODE",
        env="AGENTGATE_SANDBOX",
        choices=SANDBOX_MODES,
    ),
    Option(
        "sandbox_bind",
        "a path to make visible in the sandbox, read-only, or writable as PATH:rw; repeatable",
        "sandbox.binds",
        "linelist",
        metavar="PATH[:rw]",
        parse=_binds,
    ),
    Option(
        "sandbox_read",
        "a path commands may read beyond the default view (the system's directories, the "
        "Python environment, the directories on PATH); repeatable",
        "sandbox.reads",
        "linelist",
        metavar="PATH",
        parse=_reads,
    ),
    Option(
        "agent_network",
        "network for agent commands: none, host, or allow:HOST[,HOST:PORT...] (only those "
        "hosts, through a proxy outside the sandbox; default: none, or a preset's model API)",
        "sandbox.agent_network",
        default="none",
        metavar="NET",
        parse=_network,
    ),
    Option(
        "gate_network",
        "network for gate commands: none, host, or allow:HOST[,HOST:PORT...]",
        "sandbox.gate_network",
        default="none",
        metavar="NET",
        parse=_network,
    ),
    Option(
        "agent_network_strict",
        "reject an attempt whose agent reached for a host its allow-list refused",
        "run.agent_network_strict",
        "bool",
        False,
    ),
    Option(
        "agent_usage",
        "what the agent reports of its usage: FIELD=PATH, a note field and a dotted path into "
        "the last JSON line of its output that holds it (tokens=usage.total_tokens); repeatable",
        "command.usage_fields",
        "linelist",
        metavar="FIELD=PATH",
        parse=_usage_fields,
    ),
    Option(
        "agent_env",
        "an environment variable agent commands may see (beyond PATH, locale, TERM, VIRTUAL_ENV, "
        "PYTHONPATH, PYTHONHASHSEED, AGENTGATE_*); repeatable",
        "sandbox.agent_env",
        "linelist",
        metavar="NAME",
        parse=_env_names,
    ),
    Option(
        "gate_env",
        "an environment variable gate commands may see; repeatable",
        "sandbox.gate_env",
        "linelist",
        metavar="NAME",
        parse=_env_names,
    ),
    Option(
        "sandbox_pids",
        "most processes one command may run at once",
        "sandbox.pids_max",
        "int",
        DEFAULT_PIDS_MAX,
        "N",
    ),
    Option(
        "sandbox_file_bytes",
        "largest file one command may write (its /tmp and its directory)",
        "sandbox.file_bytes",
        "int",
        DEFAULT_FILE_BYTES,
        "BYTES",
    ),
    Option(
        "allow_symlink",
        "a glob of paths where an attempt may add a symlink that leaves the tree; repeatable",
        "engine.allow_symlinks",
        "linelist",
        metavar="GLOB",
        parse=_words,
    ),
    Option(
        "isolation",
        "shared (the agent's .git borrows the base's objects) or sealed (only the base commit's)",
        "engine.isolation",
        default="shared",
        metavar="MODE",
        choices=ISOLATIONS,
    ),
    Option(
        "max_files",
        "reject an attempt that changes more files than this",
        "engine.max_files",
        "int",
        DEFAULT_MAX_FILES,
        "N",
    ),
    Option(
        "max_bytes",
        "reject an attempt that writes more bytes than this",
        "engine.max_bytes",
        "int",
        DEFAULT_MAX_BYTES,
        "BYTES",
    ),
    Option(
        "max_state_bytes",
        "reject an attempt whose declared state (state=[...]) holds more bytes than this",
        "engine.max_state_bytes",
        "int",
        DEFAULT_MAX_BYTES,
        "BYTES",
    ),
)
BY_NAME = {option.name: option for option in OPTIONS}


def markdown_table() -> str:
    """The options page's table, made from :data:`OPTIONS` (a test holds the page to it)."""
    rows = [
        "| option | ini key | default | meaning |",
        "|---|---|---|---|",
    ]
    for option in OPTIONS:
        flag = f"{option.flag} {option.metavar}" if option.metavar else option.flag
        ini = f"`{option.ini}`" + (" (one per line)" if option.kind == "linelist" else "")
        meaning = option.help.replace("|", "\\|")
        if option.env:
            meaning += f"; also `${option.env}`"
        default = _shown(option)
        rows.append(f"| `{flag}` | {ini} | {f'`{default}`' if default else ''} | {meaning} |")
    return "\n".join(rows) + "\n"


def _shown(option: Option) -> str:
    """An option's default as a reader wants it (1 GiB, not 1073741824)."""
    value = option.default
    if value is None or value is False or value == ():
        return ""
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 30} GiB" if value % (1 << 30) == 0 else f"{value >> 20} MiB"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int) and value >= 10_000:
        return f"{value:,}"
    if isinstance(value, tuple):
        return " ".join(value)
    return str(value)
