"""Inside the sandbox: carry a command's TCP connections to the egress proxy, then run it.

Run as a script by path with ``python -I`` (the standard library only: nothing the workspace
holds can shadow it), as the first process of a command whose network is an allow-list::

    relay.py SOCKET PROXY_PORT [HOST:PORT ...] -- COMMAND...

It listens on loopback at ``PROXY_PORT`` (the address in the command's ``HTTPS_PROXY``) and
at each loopback ``HOST:PORT`` of the list (a model server on the machine, reached inside at
the address it has outside); the first kind is carried to the proxy as it is, the second
opened with a ``CONNECT`` first. Then it starts the command, and ends with its status.

Nothing here decides what may be reached: the proxy outside does. A command that kills this
relay only loses its own way out.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import threading

_OPENED = b"HTTP/1.1 200"


def _listen(host: str, port: int) -> list[socket.socket]:
    found = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        if host not in ("localhost", address):
            continue
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(64)
        except OSError:
            continue
        found.append(sock)
    return found


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def splice(one: socket.socket, other: socket.socket) -> None:
    """Copy bytes both ways until both sides are done (the egress proxy's too)."""
    back = threading.Thread(target=_pump, args=(other, one), daemon=True)
    back.start()
    _pump(one, other)
    back.join()


def _carry(client: socket.socket, proxy_path: str, target: str | None) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(proxy_path)
        if target is not None:
            upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = upstream.recv(4096)
                if not chunk:
                    return
                head += chunk
            if not head.startswith(_OPENED):
                return
            rest = head.partition(b"\r\n\r\n")[2]
            if rest:
                client.sendall(rest)
        splice(client, upstream)
    except OSError:
        pass
    finally:
        upstream.close()
        client.close()


def _serve(listeners: dict[socket.socket, str | None], proxy_path: str) -> None:
    chooser = selectors.DefaultSelector()
    for sock in listeners:
        chooser.register(sock, selectors.EVENT_READ)
    while True:
        for key, _ in chooser.select():
            listener = key.fileobj
            assert isinstance(listener, socket.socket)
            try:
                client, _ = listener.accept()
            except OSError:
                continue
            target = listeners[listener]
            threading.Thread(target=_carry, args=(client, proxy_path, target), daemon=True).start()


def main(argv: list[str]) -> int:
    split = argv.index("--")
    proxy_path, proxy_port, *forwards = argv[:split]
    command = argv[split + 1 :]
    listeners: dict[socket.socket, str | None] = {}
    for sock in _listen("127.0.0.1", int(proxy_port)):
        listeners[sock] = None
    for entry in forwards:
        host, _, port = entry.rpartition(":")
        for sock in _listen(host.strip("[]"), int(port)):
            listeners[sock] = entry
    child = os.fork()
    if child == 0:
        for sock in listeners:
            sock.close()
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            sys.stderr.write(f"{command[0]}: {exc.strerror}\n")
            os._exit(127)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    threading.Thread(target=_serve, args=(listeners, proxy_path), daemon=True).start()
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
