"""The ``--agentgate-*`` options: each a flag, an ini key and sometimes an environment
variable, and how one raw value is read (the command line over the environment over the ini
file over the default).

Loaded with the plugin in every pytest run, so it holds only the table and the reader; the
checked :class:`~pytest_agentgate.pytest_plugin.settings.Settings` of a run are made from them on first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from .._constants import (
    DEFAULT_AGENT_TIMEOUT_S,
    DEFAULT_BATCH_MAX,
    DEFAULT_FILE_BYTES,
    DEFAULT_GATE_TIMEOUT_S,
    DEFAULT_KEEP_RUNS,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    DEFAULT_PIDS_MAX,
    DEFAULT_TESTS_OF,
)

AGENT_ENV = "AGENTGATE_AGENT"
MODES = ("auto", "bwrap", "none")


class Option(NamedTuple):
    """One setting: its command-line flag, its ini key, its help and how to parse it."""

    name: str
    help: str
    kind: str = "string"  # string, linelist, bool, float, int
    default: Any = None
    metavar: str | None = None
    env: str | None = None  # an environment variable that sets it, below the command line

    @property
    def flag(self) -> str:
        return "--agentgate-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "agentgate_" + self.name


OPTIONS = (
    Option(
        "repo",
        "the repository the agents edit (default: the one around the rootdir)",
        metavar="PATH",
    ),
    Option(
        "target",
        "the branch attempts are promoted to (default: the checked-out branch)",
        metavar="BRANCH",
    ),
    Option(
        "base",
        "fork every workspace from this commit instead of the tip the agent finds (which "
        "holds what earlier agents of the run landed); run-start: the target's tip when the "
        "run started, for every agent and every xdist worker",
        metavar="REV",
    ),
    Option(
        "remote",
        "the target lives on this remote of the repository: promote by push with a lease",
        metavar="NAME",
    ),
    Option(
        "lease_seconds",
        "with --agentgate-remote: how long the server's lease on the branch (one batch leader "
        "across machines) lasts unless renewed; a dead leader's is taken over after it",
        "float",
        DEFAULT_LEASE_S,
        "SECONDS",
    ),
    Option(
        "signing_key",
        "with --agentgate-remote: an SSH private key this machine signs the attempts it "
        "posts on the server's queue with (without one, it posts none and leads its own)",
        metavar="PATH",
    ),
    Option(
        "allowed_signers",
        "with --agentgate-remote: git's allowed-signers file; a leader takes another "
        "machine's posted attempt only when a key it names signed it",
        metavar="PATH",
    ),
    Option(
        "unsigned_posts",
        "with --agentgate-remote: post unsigned and take unsigned posts (anyone who can push "
        "to the server could then post an attempt)",
        "bool",
        False,
    ),
    Option(
        "push_state",
        "with --agentgate-remote: push each attempt's state and its checkpoints to the server "
        "too, not only its record (state can hold a whole database)",
        "bool",
        False,
    ),
    Option(
        "gate",
        "a command that must exit 0 in a clean checkout of the attempt; repeatable (ini: one per line)",
        "linelist",
        metavar="CMD",
    ),
    Option(
        "gate_exit_code",
        "a gate command judged by its exit code alone (one that runs no pytest: a linter, a "
        "type check); repeatable. Every other gate command must report per-test results "
        "when promoting",
        "linelist",
        metavar="CMD",
    ),
    Option(
        "gate_setup",
        "a command run once in each gate checkout before its gate commands (what a build "
        "must generate: a version file, compiled parts); contained like them, judged by its "
        "exit code; repeatable",
        "linelist",
        metavar="CMD",
    ),
    Option(
        "gate_timeout",
        "seconds a gate command may run before its process group is killed",
        "float",
        DEFAULT_GATE_TIMEOUT_S,
        "SECONDS",
    ),
    Option(
        "gate_jobs",
        "how many gate commands of one attempt run at once, each in its own checkout",
        "int",
        1,
        "N",
    ),
    Option(
        "promote",
        "move the target for real (default: a dry run onto a scratch ref of the run's own)",
        "bool",
        False,
    ),
    Option(
        "no_retest", "do not re-run the gate on a merge onto a target that moved", "bool", False
    ),
    Option(
        "no_early_retest",
        "do not test a batch's merged tree while its attempts' own gates run (a gate run "
        "fewer when one of them fails; a gate's duration more of waiting for the rest)",
        "bool",
        False,
    ),
    Option(
        "batch_max",
        "most attempts one re-test of a merge lands together (1: every merge is tested alone)",
        "int",
        DEFAULT_BATCH_MAX,
        "N",
    ),
    Option(
        "agent_command",
        "what agent_workspace.run_agent() runs: a template split into arguments (no shell) "
        "with {task} {workspace} {agent} {attempt} {feedback}",
        metavar="TEMPLATE",
    ),
    Option(
        "agent_timeout",
        "seconds run_agent() lets the agent run before every process of it is ended "
        "(the attempt's verdict is then error)",
        "float",
        DEFAULT_AGENT_TIMEOUT_S,
        "SECONDS",
    ),
    Option(
        "agent",
        "the agent's name on attempts and log records (default: $AGENTGATE_AGENT or 'agent'); "
        "a preset's name (claude-code, codex, aider, mini-swe-agent) also fills in its "
        "command, environment, network and usage",
        metavar="NAME",
        env=AGENT_ENV,
    ),
    Option("report", "write a JSON report of every attempt to this path", metavar="PATH"),
    Option(
        "markdown",
        "append a Markdown table of the attempts to this file (default: $GITHUB_STEP_SUMMARY)",
        metavar="PATH",
        env="GITHUB_STEP_SUMMARY",
    ),
    Option(
        "workdir",
        "where workspaces and gate checkouts are made (default: pytest's temporary directory)",
        metavar="DIR",
    ),
    Option(
        "exclude",
        "globs never snapshotted (secrets); one per line in the ini file",
        "linelist",
        metavar="GLOB",
    ),
    Option(
        "protect",
        "a glob of paths an attempt may not change, added to the protected test harness "
        "(conftest.py, pytest configuration...); 'none' protects nothing; repeatable",
        "linelist",
        metavar="GLOB",
    ),
    Option(
        "unprotect",
        "lift one rule of the protected harness by its name (conftest.py, "
        "pyproject.toml:[tool.pytest.ini_options], __init__.py, pytest_plugins...); repeatable",
        "linelist",
        metavar="NAME",
    ),
    Option(
        "rerun_gate",
        "run a failing gate command again on the same tree up to N times (a test that then "
        "passes is flaky)",
        "int",
        0,
        "N",
    ),
    Option(
        "flaky",
        "what a flaky test does to its attempt: reject (default) or accept",
        default="reject",
        metavar="POLICY",
    ),
    Option(
        "tests_of",
        "whose tests judge the code: base (default: the base's test files in a session of "
        "their own, then the attempt's added and changed test modules) or attempt (its whole "
        "tree in one session, its tests as it left them)",
        default=DEFAULT_TESTS_OF,
        metavar="WHOSE",
    ),
    Option(
        "land",
        "how a passing attempt lands on a target that moved past its base: merge (default: "
        "a merge commit), squash (one commit, the task its subject, the agent its author, "
        "on the base too) or rebase (its commit replayed on the tip); each re-tested alike",
        default="merge",
        metavar="HOW",
    ),
    Option(
        "allow_changed",
        "test files (globs) or test ids every task may change: a file named here is the "
        "attempt's in the base's session (the marker's allow_changed= adds to it)",
        kind="linelist",
        metavar="GLOB",
    ),
    Option(
        "gate_results",
        "the JUnit XML file a gate command that is not pytest writes, relative to its checkout",
        metavar="PATH",
    ),
    Option(
        "keep_runs",
        "with --agentgate-workdir: how many runs' directories to keep (default 3)",
        "int",
        DEFAULT_KEEP_RUNS,
        "N",
    ),
    Option(
        "fresh_workspaces",
        "check out every workspace afresh instead of recycling the ones promoted attempts used",
        "bool",
        False,
    ),
    Option(
        "sandbox",
        "contain agent commands and gates: auto (bwrap when it works, else uncontained with a "
        "warning), bwrap (required), none",
        default="auto",
        metavar="MODE",
        env="AGENTGATE_SANDBOX",
    ),
    Option(
        "sandbox_bind",
        "a path to make visible in the sandbox, read-only, or writable as PATH:rw; repeatable",
        "linelist",
        metavar="PATH[:rw]",
    ),
    Option(
        "sandbox_read",
        "a path commands may read beyond the default view (the system's directories, the "
        "Python environment, the directories on PATH); repeatable",
        "linelist",
        metavar="PATH",
    ),
    Option(
        "agent_network",
        "network for agent commands: none, host, or allow:HOST[,HOST:PORT...] (only those "
        "hosts, through a proxy outside the sandbox; default: none, or a preset's model API)",
        default="none",
        metavar="NET",
    ),
    Option(
        "gate_network",
        "network for gate commands: none, host, or allow:HOST[,HOST:PORT...]",
        default="none",
        metavar="NET",
    ),
    Option(
        "agent_network_strict",
        "reject an attempt whose agent reached for a host its allow-list refused",
        "bool",
        False,
    ),
    Option(
        "agent_usage",
        "what the agent reports of its usage: FIELD=PATH, a note field and a dotted path into "
        "the last JSON line of its output that holds it (tokens=usage.total_tokens); repeatable",
        "linelist",
        metavar="FIELD=PATH",
    ),
    Option(
        "agent_env",
        "an environment variable agent commands may see (beyond PATH, locale, TERM, VIRTUAL_ENV, "
        "PYTHONPATH, PYTHONHASHSEED, AGENTGATE_*); repeatable",
        "linelist",
        metavar="NAME",
    ),
    Option(
        "gate_env",
        "an environment variable gate commands may see; repeatable",
        "linelist",
        metavar="NAME",
    ),
    Option(
        "sandbox_pids", "most processes one command may run at once", "int", DEFAULT_PIDS_MAX, "N"
    ),
    Option(
        "sandbox_file_bytes",
        "largest file one command may write (its /tmp and its directory)",
        "int",
        DEFAULT_FILE_BYTES,
        "BYTES",
    ),
    Option(
        "allow_symlink",
        "a glob of paths where an attempt may add a symlink that leaves the tree; repeatable",
        "linelist",
        metavar="GLOB",
    ),
    Option(
        "isolation",
        "shared (the agent's .git borrows the base's objects) or sealed (only the base commit's)",
        default="shared",
        metavar="MODE",
    ),
    Option(
        "max_files",
        "reject an attempt that changes more files than this",
        "int",
        DEFAULT_MAX_FILES,
        "N",
    ),
    Option(
        "max_bytes",
        "reject an attempt that writes more bytes than this",
        "int",
        DEFAULT_MAX_BYTES,
        "BYTES",
    ),
    Option(
        "max_state_bytes",
        "reject an attempt whose declared state (state=[...]) holds more bytes than this",
        "int",
        DEFAULT_MAX_BYTES,
        "BYTES",
    ),
)
BY_NAME = {option.name: option for option in OPTIONS}


def add_options(parser: pytest.Parser) -> None:
    """Every setting as a flag and an ini key."""
    group = parser.getgroup("agentgate", "gate coding-agent changes behind tests")
    for option in OPTIONS:
        # The destination argparse would take anyway, named: pytest then skips comparing
        # it with every option of every plugin (a scan per option, in every pytest run).
        named = {"default": None, "help": option.help, "dest": option.flag[2:].replace("-", "_")}
        if option.kind == "bool":
            group.addoption(option.flag, action="store_true", **named)
        elif option.kind == "linelist":
            group.addoption(option.flag, action="append", metavar=option.metavar, **named)
        else:
            group.addoption(option.flag, metavar=option.metavar, **named)
        ini_type = {"linelist": "linelist", "bool": "bool"}.get(option.kind, "string")
        parser.addini(option.ini, option.help, type=ini_type, default=None)  # type: ignore[arg-type]


def raw_setting(config: pytest.Config, name: str) -> tuple[Any, str]:
    """One setting's value, parsed by its kind, and where it came from: command line over
    environment over ini over the default. A value that does not parse is a usage error."""
    option = BY_NAME[name]
    value = config.getoption(option.flag)
    source = f"command line {option.flag}"
    if value is None and option.env and os.environ.get(option.env):
        value, source = os.environ[option.env], f"environment {option.env}"
    if value is None:
        try:
            raw = config.getini(option.ini)
        except ValueError as exc:
            raise usage(f"invalid ini {option.ini}: {exc}") from None
        if raw not in (None, "", []):
            value, source = raw, f"ini {option.ini}"
    if value is None:
        return option.default, "default"
    if option.kind in ("int", "float"):
        parse: Callable[[str], Any] = int if option.kind == "int" else float
        try:
            value = parse(str(value).strip())
        except ValueError:
            raise usage(
                f"invalid {option.flag} {value!r} (from {source}): expected a "
                f"{'whole number' if option.kind == 'int' else 'number'}"
            ) from None
        if value <= 0:
            raise usage(f"{option.flag} must be positive, got {value!r} (from {source})")
    if option.kind == "bool" and isinstance(value, str):
        value = value.strip().lower() in ("1", "true", "yes", "on")
    return value, source


def usage(message: str) -> pytest.UsageError:
    return pytest.UsageError(f"agentgate: {message}")


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
    return str(value)


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
