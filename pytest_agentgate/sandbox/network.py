"""What a contained command may reach: nothing, everything, or named hosts only.

``none`` (the default) leaves a command a network namespace of its own with only loopback;
``host`` shares the machine's network; ``allow:HOST[,HOST...]`` is ``none`` plus a way out
through a proxy the plugin runs outside the sandbox (:mod:`.egress`), which lets a connection
through only to a named host. A name is matched as written, case aside, never after a DNS
lookup: the command cannot resolve names at all, the proxy resolves those it lets through.

``HOST`` alone allows ports 443 and 80; ``HOST:PORT`` that port; ``*.example.com`` any name
below ``example.com`` (not the name itself). A loopback host (``localhost``, ``127.0.0.1``,
``[::1]``) needs its port: a model server on the machine (Ollama, vLLM, a scripted one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

NETWORK_MODES = ("none", "host", "allow:HOST[,HOST...]")
#: The ports a host named without one may be reached on.
WEB_PORTS = (443, 80)
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
_NAME = re.compile(r"^(\*\.)?[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\.?$")
_V4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


@dataclass(frozen=True)
class HostRule:
    """One entry of an allow-list: a name (or ``*.`` suffix) and the ports it opens."""

    name: str
    ports: tuple[int, ...]

    @property
    def loopback(self) -> bool:
        return self.name in LOOPBACK

    def allows(self, host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        if port not in self.ports:
            return False
        if self.name.startswith("*."):
            return host.endswith(self.name[1:]) and host != self.name[2:]
        return host == self.name

    def __str__(self) -> str:
        shown = f"[{self.name}]" if ":" in self.name else self.name
        return shown if self.ports == WEB_PORTS else f"{shown}:{self.ports[0]}"


@dataclass(frozen=True)
class Network:
    """A command's network: ``mode`` is none, host or allow; ``hosts`` the allow-list."""

    mode: str = "none"
    hosts: tuple[HostRule, ...] = ()

    @property
    def shared(self) -> bool:
        """Whether the command shares the machine's network (no namespace of its own)."""
        return self.mode == "host"

    @property
    def proxied(self) -> bool:
        return self.mode == "allow"

    def allows(self, host: str, port: int) -> bool:
        return self.mode == "host" or any(rule.allows(host, port) for rule in self.hosts)

    def forwards(self) -> tuple[HostRule, ...]:
        """The loopback hosts of the list: reached inside at the same address and port."""
        return tuple(rule for rule in self.hosts if rule.loopback)

    def __str__(self) -> str:
        if self.mode != "allow":
            return self.mode
        return "allow:" + ",".join(str(rule) for rule in self.hosts)

    @classmethod
    def parse(cls, text: str, source: str = "network") -> Network:
        """``none``, ``host`` or ``allow:HOST[,HOST...]``; a :class:`ConfigError` that says
        what is wrong otherwise."""
        raw = text.strip()
        if raw.lower() in ("none", "host"):
            return cls(raw.lower())
        if not raw.lower().startswith("allow:"):
            raise ConfigError(
                f"network must be none, host or allow:HOST[,HOST...], got {text!r}",
                value=text,
                source=source,
            )
        entries = [e.strip() for e in raw[len("allow:") :].split(",") if e.strip()]
        if not entries:
            raise ConfigError(
                f"{text!r} names no host: write allow:api.example.com[,HOST:PORT...]",
                value=text,
                source=source,
            )
        rules = tuple(dict.fromkeys(_rule(entry, text, source) for entry in entries))
        return cls("allow", rules)


def _rule(entry: str, text: str, source: str) -> HostRule:
    """One ``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or ``*.DOMAIN`` entry."""
    name, port = entry.lower(), ""
    if "://" in name:
        raise ConfigError(
            f"{entry!r} in {text!r} is a URL: name the host alone (api.example.com, HOST:PORT)",
            value=text,
            source=source,
        )
    if name.startswith("["):
        name, _, rest = name[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    elif name.count(":") == 1:
        name, port = name.split(":")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(
            f"{entry!r} in {text!r}: the port must be a number from 1 to 65535",
            value=text,
            source=source,
        )
    if not (_NAME.match(name) or _V4.match(name) or name == "::1"):
        raise ConfigError(
            f"{entry!r} in {text!r} is not a host name (HOST, HOST:PORT, *.DOMAIN)",
            value=text,
            source=source,
        )
    if name in LOOPBACK and not port:
        raise ConfigError(
            f"{entry!r} in {text!r}: a loopback host needs its port (localhost:11434)",
            value=text,
            source=source,
        )
    name = "localhost" if name == "ip6-localhost" else name.rstrip(".")
    return HostRule(name, (int(port),) if port else WEB_PORTS)
