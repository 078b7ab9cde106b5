"""Around one run of an agent command: what it must see, and what it left to read.

Before: the folder its program is installed in, made readable (an npm package's whole
``node_modules``, a virtual environment), so a CLI installed anywhere runs without a
``--agentgate-sandbox-read`` for it. After: its usage (:mod:`.usage`) and its transcript,
from what it printed or the file its preset names in its home.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..sandbox.agent_command import AgentCommand
from .usage import READERS, Notes, by_paths

#: The most of one transcript kept with an attempt (its end, when longer).
TRANSCRIPT_BYTES = 4 * 1024 * 1024


def program_roots(program: str, search_path: str) -> tuple[Path, ...]:
    """Where the program ``program`` is installed: the folder holding the outermost
    ``node_modules`` of its real path, the virtual environment of its ``bin`` folder, or its
    own folder. Empty when it is not found."""
    found = shutil.which(program, path=search_path) if "/" not in program else program
    if not found or not os.path.exists(found):
        return ()
    real = Path(os.path.realpath(found))
    roots = []
    for candidate in (Path(found).parent, real.parent):
        parts = candidate.parts
        if "node_modules" in parts:
            roots.append(Path(*parts[: parts.index("node_modules") + 1]))
        elif candidate.name == "bin" and (candidate.parent / "pyvenv.cfg").exists():
            roots.append(candidate.parent)
        else:
            roots.append(candidate)
    return tuple(dict.fromkeys(roots))


@dataclass(frozen=True)
class RunRead:
    """What one run of the agent left to read: its usage and its transcript's bytes."""

    notes: Notes
    transcript: bytes
    transcript_size: int


def read_run(command: AgentCommand, output: str, home: Path) -> RunRead:
    """The usage and transcript of one run of ``command`` (which printed ``output``)."""
    trajectory = ""
    if command.transcript_file:
        try:
            trajectory = (home / command.transcript_file).read_text("utf-8", "replace")
        except OSError:
            trajectory = ""
    notes: Notes = {}
    reader = READERS.get(command.usage)
    if reader is not None:
        notes.update(reader(output, trajectory))
    if command.usage_fields:
        notes.update(by_paths(command.usage_fields)(output, trajectory))
    raw = (trajectory or output).encode("utf-8", "replace")
    size = len(raw)
    if size > TRANSCRIPT_BYTES:
        raw = raw[-TRANSCRIPT_BYTES:]
    return RunRead(notes, raw, size)
