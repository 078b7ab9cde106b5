"""Settings resolved through their declarations (:mod:`.options`): each raw value
checked and parsed into the field it fills, then the few that read each other (an agent
preset, ``protect=none``, the exit-code commands among the gate's).

Both faces resolve here: the plugin what pytest read, the command what its arguments say.
Loaded by the plugin only when a run resolves a setting.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import ConfigError, SettingError
from .options import BY_NAME, GROUPS, Option


class Given(NamedTuple):
    """One setting's raw value (parsed by its kind) and where it came from."""

    value: Any
    source: str = "default"


@dataclass(frozen=True)
class Resolved:
    """The fields the settings fill, by group (a value a setting was not given is left out,
    so the value it fills keeps its own default), and where each setting came from."""

    groups: Mapping[str, Mapping[str, Any]]
    sources: Mapping[str, str] = field(default_factory=dict)

    def of(self, group: str) -> dict[str, Any]:
        return dict(self.groups.get(group, {}))

    def value(self, name: str) -> Any:
        """One setting's field value: what it was given, else its default resolved through
        its declaration (``no_retest`` not given: ``retest`` is True)."""
        option = BY_NAME[name]
        held = self.groups.get(option.group, {})
        return held[option.field] if option.field in held else one(option, Given(option.default))


def first_given(option: Option, value: Any, flag: str) -> Given | None:
    """What a face read for ``option`` on its own command line (spelled ``flag``; None: not
    there) over the option's environment variable; None when neither names it."""
    if value is not None:
        return Given(value, f"command line {flag}")
    if option.env and os.environ.get(option.env):
        return Given(os.environ[option.env], f"environment {option.env}")
    return None


def one(option: Option, given: Given, spelled: str | None = None) -> Any:
    """One setting's field value from its raw one: its choices checked, its parser run. A bad
    value is a :class:`SettingError` naming the setting (``spelled``: as the face that read
    it spells it) and where the value came from."""
    flag = spelled or option.flag
    value = given.value
    try:
        value = _by_kind(option, value)
        if option.choices and value is not None:
            value = str(value).strip().lower()
            if value not in option.choices:
                raise ValueError("expected " + _either(option.choices))
        if option.parse is not None and value is not None:
            value = option.parse(value)
    except (ValueError, ConfigError) as exc:
        # A repeated option given once names its one value, as it was typed.
        shown = given.value
        if isinstance(shown, list | tuple) and len(shown) == 1:
            shown = shown[0]
        raise SettingError(flag, shown, given.source, str(exc)) from None
    return value


def resolve(
    given: Mapping[str, Given],
    *,
    spelled: Callable[[Option], str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """Every setting ``given`` names, each through its declaration, then the few that read
    each other (an agent preset, ``protect=none``, the exit-code commands among the gate's).
    Settings not given keep the defaults of the values they fill."""
    groups: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
    for name, raw in given.items():
        option = BY_NAME[name]
        value = one(option, raw, spelled(option) if spelled else None)
        if value is not None:
            groups[option.group][option.field] = value
    sources = {name: raw.source for name, raw in given.items()}
    _protect_none(groups["gate"])
    _gate_commands(groups["gate"])
    _preset(groups, sources, os.environ if environ is None else environ)
    return Resolved(groups, sources)


def _by_kind(option: Option, value: Any) -> Any:
    """A raw value as its option's kind: a number (above 0, or 0 too where the option takes
    it: no re-runs, no old run kept), a flag from ini or environment text."""
    kind = option.kind
    if value is None:
        return None
    if kind in ("int", "float"):
        try:
            number = int(str(value).strip()) if kind == "int" else float(str(value).strip())
        except ValueError:
            raise ValueError(
                f"expected a {'whole number' if kind == 'int' else 'number'}"
            ) from None
        if number < 0 or (number == 0 and not option.zero):
            raise ValueError("expected 0 or more" if option.zero else "expected a number above 0")
        return number
    if kind == "bool" and isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return value


def _either(choices: Iterable[str]) -> str:
    names = list(choices)
    return " or ".join(names) if len(names) == 2 else "one of " + ", ".join(names)


def _protect_none(gate: dict[str, Any]) -> None:
    """``--agentgate-protect=none``: no harness rule, no glob."""
    if gate.get("protect") == ("none",):
        gate["protect"], gate["harness"] = (), ()


def _gate_commands(gate: dict[str, Any]) -> None:
    """The gate's commands, each once: a command judged by its exit code is one of them."""
    if gate.get("commands") or gate.get("exit_code"):
        both = (*gate.get("commands", ()), *gate.get("exit_code", ()))
        gate["commands"] = tuple(dict.fromkeys(both))


def _preset(
    groups: dict[str, dict[str, Any]], sources: Mapping[str, str], environ: Mapping[str, str]
) -> None:
    """What the preset the agent's name names fills in where nobody set it: the command,
    its environment, its network (the model API), how its usage is read."""
    from dataclasses import replace

    run, box = groups["run"], groups["sandbox"]
    command = run.get("agent_command")
    usage_fields = groups.pop("command").get("usage_fields", ())
    from ..agents import presets

    found = presets.find(str(groups["engine"].get("agent", "agent")))
    if found is None:
        if command is not None:
            run["agent_command"] = replace(command, usage_fields=usage_fields)
        return
    from ..sandbox.agent_command import AgentCommand

    if command is None:
        command = AgentCommand.parse(found.template(environ))
    run["agent_command"] = replace(
        command,
        env=tuple(found.fixed_env.items()),
        usage=found.usage,
        usage_fields=usage_fields,
        transcript_file=found.transcript_file,
        preset=found.name,
    )
    if sources.get("agent_network", "default") == "default":
        box["agent_network"] = found.network(environ)
    box["agent_env"] = tuple(dict.fromkeys((*found.env_names, *box.get("agent_env", ()))))
