"""The way out of the sandbox for a command allowed named hosts: an HTTP proxy outside it.

A command run with ``allow:HOST,...`` has a network namespace with loopback only. Its one way
out is a Unix socket, bound read-only into the sandbox, on which this proxy listens in the
plugin's process; a relay inside (:mod:`.relay`) carries TCP connections to it. The proxy
reads one request head per connection (``CONNECT host:port`` or an absolute-form request),
and connects on only when the host and port are on the list; the name is resolved here, never
inside. Every other request is answered 403 and noted (host, port, time) for the attempt's
record. The list lives in this process's memory: nothing inside the sandbox holds it.

A connection let through is fixed to that host: bytes the client sends after its first request
(a second request naming another host) still go to the host it was let through to.

Each command gets a proxy of its own (its refusals are its own) on a socket in a fresh 0700
folder of the system's temporary directory (a socket path has 107 bytes at most).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .network import Network
from .relay import splice

#: The longest request head the proxy reads before it refuses the request.
HEAD_BYTES = 16 * 1024
#: How long one upstream connection may take to open.
CONNECT_TIMEOUT_S = 15.0
#: Where the relay inside listens for proxy requests (the next free one if a forward has it).
PROXY_PORT = 3128
#: Refusals kept per command (an agent looping on a refused host must not fill memory).
REFUSALS_KEPT = 200


@dataclass(frozen=True)
class Refusal:
    """A connection the proxy did not let through."""

    host: str
    port: int
    at: float  # seconds since the epoch
    why: str = "not on the allow-list"

    def __str__(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        return f"{self.host}:{self.port} at {when} ({self.why})"


@dataclass
class EgressProxy:
    """One command's proxy: start it, hand :attr:`socket_path` to the sandbox, stop it."""

    network: Network
    folder: Path = field(init=False)
    refusals: list[Refusal] = field(default_factory=list)
    refused_count: int = 0
    _server: socket.socket | None = None
    _thread: threading.Thread | None = None
    _open: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def socket_path(self) -> Path:
        return self.folder / "proxy.sock"

    @property
    def proxy_port(self) -> int:
        """The port inside at which the relay takes proxy requests (none of the forwards')."""
        taken = {rule.ports[0] for rule in self.network.forwards()}
        return next(p for p in range(PROXY_PORT, PROXY_PORT + 64) if p not in taken)

    def environment(self) -> dict[str, str]:
        """What points a command's HTTP clients at the proxy (both spellings: tools read
        one or the other); loopback goes straight to the relay's forwards."""
        url = f"http://127.0.0.1:{self.proxy_port}"
        env = {}
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
            env[name] = env[name.lower()] = url
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
        return env

    def relayed(self, argv: list[str]) -> list[str]:
        """``argv`` started by the relay inside (which first opens the way out)."""
        forwards = [_authority(rule.name, rule.ports[0]) for rule in self.network.forwards()]
        relay = str(self.folder / "relay.py")
        return [
            sys.executable, "-I", "-S", relay, str(self.socket_path), str(self.proxy_port),
            *forwards, "--", *argv,
        ]  # fmt: skip

    def start(self) -> EgressProxy:
        self.folder = Path(tempfile.mkdtemp(prefix="agentgate-egress-"))
        shutil.copyfile(Path(__file__).with_name("relay.py"), self.folder / "relay.py")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.socket_path))
        server.listen(64)
        self._server = server
        self._thread = threading.Thread(target=self._serve, name="agentgate-egress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every connection still open; the folder goes."""
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        with self._lock:
            for conn in list(self._open):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while (server := self._server) is not None:
            try:
                client, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _track(self, *conns: socket.socket, add: bool = True) -> None:
        with self._lock:
            for conn in conns:
                (self._open.add if add else self._open.discard)(conn)

    def _handle(self, client: socket.socket) -> None:
        self._track(client)
        upstream: socket.socket | None = None
        try:
            head, rest = _read_head(client)
            target = _target(head)
            if target is None:
                client.sendall(_answer(400, "agentgate: not a proxy request"))
                return
            host, port, forward = target
            if not self.network.allows(host, port):
                self._refuse(host, port)
                client.sendall(_answer(403, f"agentgate: {host}:{port} is not on the allow-list"))
                return
            try:
                upstream = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
            except OSError as exc:
                client.sendall(_answer(502, f"agentgate: {host}:{port}: {exc.strerror or exc}"))
                return
            upstream.settimeout(None)
            self._track(upstream)
            if forward is None:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(forward)
            if rest:
                upstream.sendall(rest)
            splice(client, upstream)
        except OSError:
            pass
        finally:
            for conn in (client, upstream):
                if conn is not None:
                    self._track(conn, add=False)
                    conn.close()

    def _refuse(self, host: str, port: int) -> None:
        with self._lock:
            self.refused_count += 1
            if len(self.refusals) < REFUSALS_KEPT:
                self.refusals.append(Refusal(host, port, time.time()))


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """The request head (through its blank line) and what came after it."""
    conn.settimeout(CONNECT_TIMEOUT_S)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk or len(data) > HEAD_BYTES:
            return b"", b""
        data += chunk
    conn.settimeout(None)
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _target(head: bytes) -> tuple[str, int, bytes | None] | None:
    """(host, port, the head to send upstream or None for a tunnel), None when the head is
    no proxy request."""
    first, _, headers = head.partition(b"\r\n")
    parts = first.decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    method, target, version = parts
    if method.upper() == "CONNECT":
        hostport = _host_port(target, None)
        return (*hostport, None) if hostport else None
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        return None
    authority, slash, path = rest.partition("/")
    hostport = _host_port(authority.rpartition("@")[2], 80)
    if hostport is None:
        return None
    line = f"{method} {slash}{path} {version}\r\n".encode("latin-1")
    return (*hostport, line + headers)


def _host_port(authority: str, default: int | None) -> tuple[str, int] | None:
    if authority.startswith("["):
        host, _, port = authority[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not port and default is not None:
        return (host.lower(), default) if host else None
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.lower(), int(port)


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _answer(status: int, text: str) -> bytes:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    body = (text + "\n").encode("utf-8", "replace")
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1") + body
