"""`fleetctl lab traffic`'s client against a loopback server that streams as vLLM does, cuts a
stream, refuses
with 503, or sends an error event: each request is counted ok or failed with its cause."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetctl.errors import FleetError
from fleetctl.lab import traffic


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """Answers in turn from ``modes`` (ok, cut, 503, error), cycling."""
    modes: list[str] = ["ok"]
    turn = itertools.count()
    seen: list[dict[str, object]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            mode = modes[next(turn) % len(modes)]
            if mode == "503":
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            chunk = {"choices": [{"delta": {"content": "hi"}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if mode == "cut":
                self.wfile.flush()
                return
            if mode == "error":
                self.wfile.write(b'data: {"error": {"message": "engine dead", "code": 500}}\n\n')
            self.wfile.write(b"data: [DONE]\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", modes
    finally:
        srv.shutdown()
        srv.server_close()
    assert all(b["stream"] is True and b["model"] == "m" for b in seen)


def test_every_request_is_ok_or_failed_with_its_cause(server: tuple[str, list[str]]) -> None:
    url, modes = server
    rep = traffic.run(url, "m", rate=40, duration=0.5)
    assert (rep.sent, rep.ok, rep.failed) == (20, 20, 0) and rep.p95_s is not None
    modes[:] = ["ok", "cut", "503", "error"]
    rep = traffic.run(url, "m", rate=40, duration=1)
    assert (rep.sent, rep.ok, rep.failed) == (40, 10, 30)
    assert rep.causes == {
        "stream cut before [DONE]": 10,
        "HTTP 503": 10,
        "error event in the stream": 10,
    }
    d = rep.to_dict()
    assert {"sent", "ok", "failed", "p95_s"} <= d.keys() and len(d["failures"]) == 30


def test_nothing_listening_is_connection_refused() -> None:
    from tests.frontdoor.servers import free_port

    rep = traffic.run(f"http://127.0.0.1:{free_port()}", "m", rate=10, duration=0.5)
    assert (rep.ok, rep.failed, rep.causes) == (0, 5, {"connection refused": 5})


def test_bad_rate_is_refused() -> None:
    with pytest.raises(FleetError, match="--rate 0"):
        traffic.run("http://127.0.0.1:1", "m", rate=0, duration=1)
