"""What each known agent CLI needs to run contained, filled in by ``--agentgate-agent=NAME``.

A preset gives the command for one task in the CLI's non-interactive mode, the environment
names it reads (its key, its base URL, its model), fixed settings that keep it from calling
anywhere but its model API, its network allow-list (the model API's host, and the host of its
base URL when one is set), where its transcript lies and how its usage is read. Every field
can be overridden by the option that sets it (``agentgate_agent_command``,
``agentgate_agent_env``, ``agentgate_agent_network``, ``agentgate_agent_usage``).

Each CLI gets a private, empty home of its own (``{home}``, outside the workspace: what it
writes there never lands). The prompt names the feedback file, which holds the earlier
tries' verdicts and failing output.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..sandbox.network import Network

#: The prompt every preset gives its CLI.
PROMPT = (
    "{task}\n\nWork in the current directory. What earlier tries of this task did, and why "
    "they were not accepted, is in {feedback} (read it first if it has earlier tries)."
)


@dataclass(frozen=True)
class Preset:
    """One CLI's defaults."""

    name: str
    command: str
    #: Environment variables passed through when set (its key, base URL, model...).
    env_names: tuple[str, ...]
    #: Set for every run (they switch off telemetry, update checks, colour).
    fixed_env: Mapping[str, str] = field(default_factory=dict)
    #: Its model API, reachable by default.
    hosts: tuple[str, ...] = ()
    #: Variables holding a base URL: when set, that host is reachable too.
    base_url_env: tuple[str, ...] = ()
    #: How its usage is read (a name in :data:`.usage.READERS`).
    usage: str = ""
    #: A file in ``{home}`` that holds its transcript; empty: what it printed.
    transcript_file: str = ""
    #: Where to install it from, for the docs and the test suite.
    install: str = ""
    #: Arguments the command gets from the environment it runs in (a base URL that the CLI
    #: reads from its configuration only), before the prompt.
    configured: Callable[[Mapping[str, str]], str] | None = None

    def template(self, environ: Mapping[str, str]) -> str:
        """The command template, with what :attr:`configured` reads from ``environ``."""
        extra = self.configured(environ) if self.configured is not None else ""
        return self.command.replace(" {configured}", f" {extra}" if extra else "")

    def network(self, environ: Mapping[str, str]) -> Network:
        """The default allow-list: the model API's hosts and each base URL set."""
        hosts = list(self.hosts)
        for name in self.base_url_env:
            url = environ.get(name, "")
            parts = urlsplit(url) if "://" in url else None
            if parts is not None and parts.hostname:
                port = parts.port or (443 if parts.scheme == "https" else 80)
                host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
                hosts.append(f"{host}:{port}")
        return Network.parse("allow:" + ",".join(dict.fromkeys(hosts)), f"preset {self.name}")


_QUIET = {"NO_COLOR": "1", "TERM": "dumb"}


def _codex_provider(environ: Mapping[str, str]) -> str:
    """Codex reads a base URL from its configuration only (``OPENAI_BASE_URL`` is not read):
    a provider of its own, on the Responses API, that never tries a WebSocket first and
    never retries without end when its server is gone."""
    url = environ.get("OPENAI_BASE_URL", "").strip()
    if not url:
        return ""
    provider = (
        f'{{{{name="agentgate",base_url="{url}",wire_api="responses",'
        'env_key="OPENAI_API_KEY",supports_websockets=false}}'
    )
    model = environ.get("OPENAI_MODEL", "").strip()
    args = ["-c", "model_provider=agentgate", "-c", f"model_providers.agentgate={provider}"]
    return shlex.join(args) + (f" -m {shlex.quote(model)}" if model else "")


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="claude-code",
            command=(
                'claude -p "' + PROMPT + '" --output-format stream-json --verbose '
                "--dangerously-skip-permissions --max-turns 60"
            ),
            env_names=(
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_AUTH_TOKEN",
                "ANTHROPIC_BASE_URL",
                "ANTHROPIC_MODEL",
                "ANTHROPIC_SMALL_FAST_MODEL",
            ),
            fixed_env={
                **_QUIET,
                # One switch stops every call but the model's (feature flags, event logs,
                # the bootstrap and update checks): without it the CLI reaches for
                # api.anthropic.com even with a base URL set.
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
            },
            hosts=("api.anthropic.com",),
            base_url_env=("ANTHROPIC_BASE_URL",),
            usage="claude-stream",
            install="npm install @anthropic-ai/claude-code",
        ),
        Preset(
            name="codex",
            command=(
                "codex exec --json --skip-git-repo-check "
                "--dangerously-bypass-approvals-and-sandbox --disable plugins "
                "--disable unbounded_connection_retries -c analytics.enabled=false "
                '-c check_for_update_on_startup=false {configured} "' + PROMPT + '"'
            ),
            env_names=("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "CODEX_API_KEY"),
            fixed_env=dict(_QUIET),
            hosts=("api.openai.com",),
            base_url_env=("OPENAI_BASE_URL",),
            usage="codex-json",
            install="npm install @openai/codex",
            configured=_codex_provider,
        ),
        Preset(
            name="aider",
            # No git of its own (it would commit, and ask its model for the messages), no
            # lint, no repository map; its histories in its home, never in the workspace.
            command=(
                "aider --yes-always --no-git --no-auto-lint --map-tokens 0 --no-check-update "
                "--analytics-disable --no-show-model-warnings --no-show-release-notes "
                "--no-pretty --no-stream --no-fancy-input --edit-format whole "
                "--chat-history-file {home}/aider.chat.history.md "
                "--input-history-file {home}/aider.input.history --read {feedback} "
                '--message "' + PROMPT + '"'
            ),
            env_names=("OPENAI_API_KEY", "OPENAI_API_BASE", "ANTHROPIC_API_KEY", "AIDER_MODEL"),
            fixed_env={**_QUIET, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            hosts=("api.openai.com", "api.anthropic.com"),
            base_url_env=("OPENAI_API_BASE",),
            usage="aider-text",
            transcript_file="aider.chat.history.md",
            install="pip install aider-chat",
        ),
        Preset(
            name="mini-swe-agent",
            command=(
                'mini -y --exit-immediately -l 0 -o {home}/trajectory.json -t "' + PROMPT + '"'
            ),
            env_names=(
                "OPENAI_API_KEY",
                "OPENAI_API_BASE",
                "ANTHROPIC_API_KEY",
                "MSWEA_MODEL_NAME",
            ),
            fixed_env={
                **_QUIET,
                "MSWEA_CONFIGURED": "true",  # no first-run wizard
                "MSWEA_SILENT_STARTUP": "1",
                # A model LiteLLM has no price for stops the run otherwise.
                "MSWEA_COST_TRACKING": "ignore_errors",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            },
            hosts=("api.openai.com", "api.anthropic.com"),
            base_url_env=("OPENAI_API_BASE",),
            usage="mini-trajectory",
            transcript_file="trajectory.json",
            install="pip install mini-swe-agent",
        ),
    )
}


def find(name: str) -> Preset | None:
    return PRESETS.get(name.strip().lower())
