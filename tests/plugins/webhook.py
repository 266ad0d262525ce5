"""The ``receiver`` fixture: a real loopback HTTP server that keeps every JSON body POSTed to it (a
webhook's
receiver); ``reply_json`` for other loopback servers standing for an API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


def reply_json(handler: BaseHTTPRequestHandler, code: int, body: Any) -> None:
    """Answer ``handler``'s request with ``body`` as JSON (loopback servers standing for an API)."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class Receiver(ThreadingHTTPServer):
    """The bodies received, in order; ``status`` is what it answers."""

    bodies: list[dict[str, Any]]
    status = 204


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        n = int(self.headers["Content-Length"])
        assert self.headers["Content-Type"] == "application/json"
        self.server.bodies.append(json.loads(self.rfile.read(n)))
        self.send_response(self.server.status)
        self.end_headers()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on a free loopback port (``receiver.server_port``), stopped afterwards."""
    s = Receiver(("127.0.0.1", 0), _Handler)
    s.bodies = []
    threading.Thread(target=s.serve_forever, daemon=True).start()
    yield s
    s.shutdown()
    s.server_close()
