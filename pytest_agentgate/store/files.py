"""Files the plugin's processes share, written so that no reader sees half of one."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Write ``path`` through a file of this process and thread, renamed over it: a reader
    sees the old text or the new, never part of either (and two writers never share a
    temporary file, threads of one process included)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: leave no half-written file behind
        raise
