"""A scripted model server on loopback: real agent CLIs run against it offline, in CI.

It speaks the three wire formats coding agents use, streaming or not:

- Anthropic's Messages API (``POST /v1/messages``: Claude Code);
- OpenAI's Responses API (``POST /v1/responses``: Codex CLI);
- OpenAI's Chat Completions (``POST /v1/chat/completions``: Aider, mini-swe-agent and most
  others, through LiteLLM or an SDK).

Each agent request is answered with the next step of a script (:mod:`.steps`), spelled as that
agent reads it; a request that offers no tools to an agent that uses tools (a title, a quota
check) gets a short text and does not use up a step. Every answer reports token counts, so an
agent's own usage report has numbers to add up; :attr:`ScriptedModelServer.requests` holds
what each request carried::

    with ScriptedModelServer([Write("calc.py", "..."), Finish("done")]) as server:
        env = {"ANTHROPIC_BASE_URL": server.url, "OPENAI_BASE_URL": server.url + "/v1"}

Several scripts: each conversation (a request in which the assistant has not spoken yet)
takes the next one, the last one again once all were taken: one script a try.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import wire
from .steps import Finish, Run, Step, Write

#: Output tokens each answer reports (input tokens are the request's size over four).
OUTPUT_TOKENS = 64


@dataclass(frozen=True)
class Request:
    """One request the server answered: where, what it carried, which step it got."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    step: int  # -1: an auxiliary request (no tools), answered without a step


@dataclass
class ScriptedModelServer:
    """Serve ``scripts`` on ``127.0.0.1`` (a free port) until :meth:`stop`."""

    #: One script, or one a try (each conversation takes the next).
    scripts: Sequence[Step] | Sequence[Sequence[Step]]
    model: str = "scripted-model"
    requests: list[Request] = field(default_factory=list)
    _conversations: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    _scripts: list[list[Step]] = field(default_factory=list)

    def __post_init__(self) -> None:
        given = list(self.scripts)
        if given and not isinstance(given[0], Sequence):
            self._scripts = [[s for s in given if isinstance(s, Run | Write | Finish)]]
        else:
            self._scripts = [list(s) for s in given if isinstance(s, Sequence)]
        self._scripts = self._scripts or [[Finish()]]

    @property
    def port(self) -> int:
        assert self._server is not None, "start the server first"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (clients of OpenAI's APIs want ``/v1`` after it)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        """What goes on an allow-list: ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> ScriptedModelServer:
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def agent_requests(self) -> list[Request]:
        return [r for r in self.requests if r.step >= 0]

    # -- answering -------------------------------------------------------------------------

    def answer(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> wire.Reply:
        """The reply to one request (a step of the script, or a short text)."""
        dialect = wire.dialect(path)
        offered = wire.tools(dialect, body)
        turns = wire.assistant_turns(dialect, body)
        # Claude Code asks small questions (a title, a topic) without tools: those are
        # answered aside. Other agents offer their tools on every request.
        auxiliary = dialect == "anthropic" and not offered
        whole = wire.aider_style(dialect, offered, body)
        step: Step = Finish("ok")
        script: list[Step] = []
        with self._lock:
            step_no = -1
            if not auxiliary:
                if whole or turns == 0:  # a new conversation: the next script
                    self._conversations += 1
                script = self._scripts[min(self._conversations, len(self._scripts)) - 1]
                step_no = 0 if whole else turns
                step = script[step_no] if step_no < len(script) else Finish()
            self.requests.append(Request(path, body, headers, step_no))
        usage = wire.Usage(max(1, len(json.dumps(body)) // 4), OUTPUT_TOKENS)
        model = str(body.get("model") or self.model)
        if whole:
            return wire.render_aider(script, body, model, usage)
        return wire.render(dialect, step, offered, body, model, usage)


class _Handler(BaseHTTPRequestHandler):
    server_owner: ScriptedModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet: a test's output is its own
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            model = self.server_owner.model
            data = {"object": "list", "data": [{"id": model, "object": "model"}]}
            self._send(200, "application/json", json.dumps(data).encode())
        else:
            self._send(200, "text/plain", b"scripted model server\n")

    def do_HEAD(self) -> None:
        self._send(200, "text/plain", b"")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, "application/json", b'{"error": "the body is not JSON"}')
            return
        path = self.path.split("?")[0]
        if wire.dialect(path) is None:
            if path.endswith("/count_tokens"):
                tokens = {"input_tokens": max(1, len(raw) // 4)}
                self._send(200, "application/json", json.dumps(tokens).encode())
            else:
                self._send(404, "application/json", b'{"error": "not a model endpoint"}')
            return
        headers = {k.lower(): v for k, v in self.headers.items() if "auth" not in k.lower()}
        headers.pop("x-api-key", None)
        reply = self.server_owner.answer(path, body, headers)
        self._send(200, reply.content_type, reply.body)

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
