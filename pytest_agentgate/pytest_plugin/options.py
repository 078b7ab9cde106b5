"""The ``--agentgate-*`` options in pytest: each declared setting (:mod:`..engine.options`)
as a flag and an ini key, and how one raw value is read (the command line over the
environment over the ini file).

Loaded with the plugin in every pytest run, so it holds only the reader; the checked
:class:`~pytest_agentgate.pytest_plugin.settings.Settings` of a run are made on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ..engine.options import AGENT_ENV, BY_NAME, OPTIONS, Option

if TYPE_CHECKING:
    from ..engine.resolving import Given

__all__ = ["AGENT_ENV", "OPTIONS", "Option", "add_options", "given", "one_setting", "usage"]


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


def given(config: pytest.Config, name: str) -> Given | None:
    """One setting's raw value and where it came from: the command line over the
    environment over the ini file; None when none of them names it (its default holds)."""
    from ..engine.resolving import Given, first_given

    option = BY_NAME[name]
    found = first_given(option, config.getoption(option.flag), option.flag)
    if found is not None:
        return found
    try:
        raw = config.getini(option.ini)
    except ValueError as exc:
        raise usage(f"invalid ini {option.ini}: {exc}") from None
    if raw in (None, "", []):
        return None
    return Given(raw, f"ini {option.ini}")


def one_setting(config: pytest.Config, name: str) -> Any:
    """One setting's value through its declaration, read alone (the end of a run without a
    gated test needs a few and checks nothing else); a bad one is a usage error."""
    from ..engine.resolving import Given, one
    from ..errors import SettingError

    raw = given(config, name)
    try:
        return one(BY_NAME[name], raw if raw is not None else Given(BY_NAME[name].default))
    except SettingError as exc:
        raise usage(str(exc)) from None


def usage(message: str) -> pytest.UsageError:
    return pytest.UsageError(f"agentgate: {message}")
