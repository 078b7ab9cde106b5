"""The real agent CLIs the suite runs, installed once into a cache from their registries.

npm for Claude Code and Codex, PyPI (a virtual environment each) for Aider and
mini-swe-agent, at pinned versions. Each is installed into a folder beside its final place
marked complete at its end, under a lock (xdist's workers ask at once), so a half-finished
install is never used. ``python tests/agent_clis.py`` installs them all
(``.ci/run`` does, before the tests); a test that needs one installs it when missing.

The cache is ``$AGENTGATE_CLI_CACHE``, else ``~/.cache/pytest-agentgate/clis``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Cli:
    name: str  # the preset's name
    package: str  # what the registry installs, pinned
    program: str  # the command it puts on PATH
    registry: str  # "npm" or "pypi"

    @property
    def folder(self) -> Path:
        version = self.package.replace("@", "-").replace("/", "-").replace("=", "-")
        return cache() / version.strip("-")

    @property
    def bin(self) -> Path:
        if self.registry == "npm":
            return self.folder / "node_modules" / ".bin"
        return self.folder / "bin"


CLIS = {
    cli.name: cli
    for cli in (
        Cli("claude-code", "@anthropic-ai/claude-code@2.1.332", "claude", "npm"),
        Cli("codex", "@openai/codex@0.171.0", "codex", "npm"),
        Cli("aider", "aider-chat==0.86.2", "aider", "pypi"),
        Cli("mini-swe-agent", "mini-swe-agent==2.4.6", "mini", "pypi"),
    )
}


#: Read once, at import: the suite's fixtures give each test a $HOME of its own.
_CACHE = Path(
    os.environ.get("AGENTGATE_CLI_CACHE") or Path.home() / ".cache" / "pytest-agentgate" / "clis"
)


def cache() -> Path:
    return _CACHE


class NotInstalled(Exception):
    """The CLI could not be installed here (no registry, no npm): says why."""


def install(cli: Cli) -> Path:
    """The folder holding ``cli``'s program, installed first when missing."""
    done = cli.folder / ".installed"
    if done.exists():
        return cli.bin
    cache().mkdir(parents=True, exist_ok=True)
    with open(cache() / f".{cli.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():  # another worker installed it meanwhile
            return cli.bin
        shutil.rmtree(cli.folder, ignore_errors=True)  # what an interrupted install left
        cli.folder.mkdir()
        try:
            _install_into(cli, cli.folder)
        except (OSError, subprocess.SubprocessError) as exc:
            shutil.rmtree(cli.folder, ignore_errors=True)
            raise NotInstalled(f"{cli.package} could not be installed: {exc}") from exc
        except NotInstalled:
            shutil.rmtree(cli.folder, ignore_errors=True)
            raise
        done.write_text(cli.package + "\n")
    return cli.bin


def _install_into(cli: Cli, folder: Path) -> None:
    if cli.registry == "npm":
        npm = shutil.which("npm")
        if npm is None:
            raise NotInstalled("npm is not on PATH (Node.js and npm install it)")
        command = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder),
                   cli.package]  # fmt: skip
        _run(command)
    else:
        _run([sys.executable, "-m", "venv", str(folder)])
        _run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", cli.package])
    if not (
        folder / ("node_modules/.bin" if cli.registry == "npm" else "bin") / cli.program
    ).exists():
        raise NotInstalled(f"{cli.package} installed no {cli.program}")


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise NotInstalled(f"{' '.join(command[:3])} failed: {' / '.join(tail)}")


if __name__ == "__main__":
    for each in CLIS.values():
        print(f"{each.name}: {install(each)}", flush=True)
