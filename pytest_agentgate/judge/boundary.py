"""Where a gate's pytest stops looking for its configuration: at its checkout, as it would in
the project.

pytest looks for a configuration file in every folder up from its arguments and takes the
first it finds; the folder of that file is where ``-o pythonpath=src``, ``testpaths`` and
every other path setting are read from, and ``conftest.py`` files are loaded up to it. So
nothing above a checkout may be found (a user's own project, or what an uncontained agent
left there), and what is found must sit where the project's own would:

- a checkout whose root holds pytest's configuration (``pyproject.toml`` with its table,
  ``pytest.ini``, ``tox.ini`` with ``[pytest]``...) stops the search there, as in the
  project;
- a checkout without one gets an empty ``.pytest.ini`` at its root, untracked: the search
  stops in the same folder a project's ``pyproject.toml`` without a pytest table would have
  stopped it (and where a person types the command), so ``-o pythonpath=src`` means the
  checkout's ``src``;
- the folder above every checkout holds a ``pytest.ini`` too, as a second line for a
  pytest started from outside its checkout; in the sandbox that folder is a read-only view
  holding only it (:func:`above`).
"""

from __future__ import annotations

import os
import secrets
import tomllib
from pathlib import Path

import iniconfig

#: An empty configuration: a ``pytest.ini`` (or ``.pytest.ini``) is one even when it sets
#: nothing.
BOUNDARY_INI = (
    "# Written by pytest-agentgate: a gate reads only its checkout's configuration.\n[pytest]\n"
)
#: The name of the one at a checkout's root (hidden, as a project would keep it).
ROOT_NAME = ".pytest.ini"
#: pytest's configuration files at a folder, each with the section that makes it one
#: (None: the file is one whatever it holds).
_CONFIGS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("pytest.toml", None),
    (".pytest.toml", None),
    ("pytest.ini", None),
    (".pytest.ini", None),
    ("pyproject.toml", ("tool.pytest.ini_options", "tool.pytest")),
    ("tox.ini", ("pytest",)),
    ("setup.cfg", ("tool:pytest", "pytest")),
)


def has_configuration(folder: Path) -> bool:
    """Whether pytest's search for a configuration ends at ``folder``. A file that cannot
    be read or parsed counts: pytest stops there too, with its own error."""
    for name, sections in _CONFIGS:
        path = folder / name
        if not path.is_file():
            continue
        if sections is None:
            return True
        try:
            text = path.read_text(encoding="utf-8")
            if name.endswith(".toml"):
                data = tomllib.loads(text)
                if any(_has_table(data, s) for s in sections):
                    return True
            elif any(s in iniconfig.IniConfig(str(path), data=text) for s in sections):
                return True
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, iniconfig.ParseError):
            return True
    return False


def _has_table(data: object, dotted: str) -> bool:
    for key in dotted.split("."):
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


def write(checkout: Path) -> None:
    """The boundaries of one run in ``checkout``: the empty ``.pytest.ini`` at its root
    when it has no configuration there, and the ``pytest.ini`` in the folder above.

    Each is replaced, never opened: a link left in its place is not followed, and a gate
    running beside this one (--agentgate-gate-jobs) never finds one missing or half
    written. The one at the root is read-only, an untracked file the tree never holds.
    """
    _replace(checkout.parent / "pytest.ini")
    if not has_configuration(checkout):
        _replace(checkout / ROOT_NAME, mode=0o444)


def _replace(path: Path, mode: int = 0o644) -> None:
    fresh = path.parent / f".agentgate-ini.{secrets.token_hex(8)}"
    fresh.write_text(BOUNDARY_INI, encoding="utf-8")
    os.chmod(fresh, mode)
    os.replace(fresh, path)


def above(checkout: Path, private: Path) -> Path:
    """What a contained command sees in the folder above its checkout: the boundary
    ``pytest.ini`` and nothing else, read-only (the places its checkout and its ``$HOME``
    are bound at, empty): no process of the gate can leave a configuration or a conftest
    there for a pytest it starts later, nor move the folder away."""
    view = private / "above"
    (view / checkout.name).mkdir(parents=True)
    if private.parent == checkout.parent:
        (view / private.name / "home").mkdir(parents=True)
    (view / "pytest.ini").write_text(BOUNDARY_INI, encoding="utf-8")
    return view
