"""Webhook events reach a real loopback HTTP server as JSON; a dead receiver never raises."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetctl.progress import Recorder
from fleetctl.rollout.webhook import Webhook


class _Receiver(ThreadingHTTPServer):
    bodies: list[dict[str, Any]]
    status = 204


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        n = int(self.headers["Content-Length"])
        assert self.headers["Content-Type"] == "application/json"
        self.server.bodies.append(json.loads(self.rfile.read(n)))
        self.send_response(self.server.status)
        self.end_headers()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    s = _Receiver(("127.0.0.1", 0), _Handler)
    s.bodies = []
    threading.Thread(target=s.serve_forever, daemon=True).start()
    yield s
    s.shutdown()
    s.server_close()


def test_events_are_posted_as_json(receiver: _Receiver) -> None:
    hook = Webhook(f"http://127.0.0.1:{receiver.server_port}/hook?token=s3cret", "ro-1", "lab")
    hook.send("start", tag="2026-07-01-v0.24.0", hosts=["a", "b"])
    hook.send("wave", wave=1, of=2)
    hook.send("completion", tag="t")
    assert [b["event"] for b in receiver.bodies] == ["start", "wave", "completion"]
    assert receiver.bodies[0]["rollout"] == "ro-1" and receiver.bodies[0]["hosts"] == ["a", "b"]
    assert all(d.status == 204 and d.error is None for d in hook.deliveries)
    with pytest.raises(ValueError):
        hook.send("bogus")


def test_failed_delivery_is_reported_without_the_url(receiver: _Receiver) -> None:
    receiver.status = 500
    rec = Recorder()
    hook = Webhook(f"http://127.0.0.1:{receiver.server_port}/hook?token=s3cret", "ro-1", "lab", rec)
    d = hook.send("failure", error="canary failed")
    assert d is not None and d.status == 500
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    hook2 = Webhook(f"http://127.0.0.1:{dead}/x?token=s3cret", "ro-1", "lab", rec, timeout=2)
    d2 = hook2.send("pause")
    assert d2 is not None and d2.status is None and d2.error
    assert len(rec.events) == 2 and all("s3cret" not in e.message for e in rec.events)


def test_no_url_is_a_no_op() -> None:
    assert Webhook(None, "ro-1", "lab").send("start") is None
