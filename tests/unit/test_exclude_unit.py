"""The exclude patterns of a snapshot, matched through one compiled expression per kind, must
answer as the pattern-by-pattern ``fnmatchcase`` they replace does, and a path's folders,
looked up once per snapshot, as each path's own walk did."""

from __future__ import annotations

import fnmatch
import os
import random
from pathlib import Path

from pytest_agentgate.workspace.snapshot import DEFAULT_EXCLUDE, _is_file_here, excluded_by


def one_by_one(path: str, patterns: list[str]) -> bool:
    """The matching as it was: each pattern in turn against each name or leading part."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        pattern = raw.strip("/")
        if not pattern:
            continue
        if "/" in pattern:
            if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
                return True
        elif any(fnmatch.fnmatchcase(part, pattern) for part in parts):
            return True
    return False


NAMES = [".env", "id_rsa", "a.pem", "secrets", "x", "[ab]", "a*b", "É", "a\nb", "key.json", "."]
PATTERNS = [*DEFAULT_EXCLUDE, "", "/", "dir/*.txt", "/lead/", "[!a]?", "*[", "x/**/y", "\\*", "É*"]


def test_excluded_by_answers_as_each_pattern_in_turn_did() -> None:
    rng = random.Random(11)
    for _ in range(3000):
        path = "/".join(
            rng.choice([*NAMES, "dir", "lead", "sub"]) for _ in range(rng.randint(1, 4))
        )
        patterns = rng.sample(PATTERNS, rng.randint(0, len(PATTERNS)))
        assert excluded_by(path, patterns) == one_by_one(path, patterns), (path, patterns)


def test_a_path_behind_a_link_or_a_file_is_not_here_whatever_was_seen_before(
    tmp_path: Path,
) -> None:
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "real" / "deep" / "f").write_text("f")
    (tmp_path / "real" / "g").write_text("g")
    os.symlink("real", tmp_path / "link")
    os.symlink("nowhere", tmp_path / "real" / "dangling")
    folders: dict[str, bool] = {}
    asked = {
        "real/deep/f": True,
        "real/g": True,
        "real/dangling": True,  # a link is a file of the tree, followed or not
        "link/g": False,  # through a link
        "real/g/h": False,  # through a file
        "real/deep": False,  # a folder is no file
        "real/deep/missing": False,
        "gone/f": False,
    }
    for _ in range(2):  # the second time from what the first found of each folder
        for rel, here in asked.items():
            assert _is_file_here(tmp_path, rel, folders) is here, rel
    assert folders["real"] is True and folders["link"] is False and folders["real/g"] is False
