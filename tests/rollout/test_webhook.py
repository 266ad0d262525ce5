"""Webhook events reach a real loopback HTTP server as JSON; a dead receiver never raises."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetctl.errors import FleetError
from fleetctl.progress import Recorder
from fleetctl.rollout.webhook import Webhook, redact, validate
from tests.plugins.webhook import Receiver


def test_events_are_posted_as_json(receiver: Receiver) -> None:
    hook = Webhook(f"http://127.0.0.1:{receiver.server_port}/hook?token=s3cret", "ro-1", "lab", allow_http=True)
    hook.send("start", tag="2026-07-01-v0.24.0", hosts=["a", "b"])
    hook.send("wave", wave=1, of=2)
    hook.send("completion", tag="t")
    deliveries = hook.close()
    assert [b["event"] for b in receiver.bodies] == ["start", "wave", "completion"]
    assert receiver.bodies[0]["rollout"] == "ro-1" and receiver.bodies[0]["hosts"] == ["a", "b"]
    assert len(deliveries) == 3 and all(d.status == 204 and d.error is None for d in deliveries)
    with pytest.raises(ValueError):
        hook.send("bogus")


def test_failed_delivery_is_reported_without_the_url(receiver: Receiver) -> None:
    receiver.status = 500
    rec = Recorder()
    hook = Webhook(f"http://127.0.0.1:{receiver.server_port}/hook?token=s3cret", "ro-1", "lab", rec,
                   allow_http=True)
    hook.send("failure", error="canary failed")
    (d,) = hook.close()
    assert d.status == 500
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    hook2 = Webhook(f"http://127.0.0.1:{dead}/x/T0KEN-PATH?token=s3cret", "ro-1", "lab", rec, timeout=2,
                    allow_http=True)
    hook2.send("pause")
    (d2,) = hook2.close()
    assert d2.status is None and d2.error
    assert len(rec.events) == 2
    assert all("s3cret" not in e.message and "T0KEN" not in e.message for e in rec.events)
    assert "http://127.0.0.1" in rec.events[1].message


def test_no_url_is_a_no_op() -> None:
    hook = Webhook(None, "ro-1", "lab")
    hook.send("start")
    assert hook.close() == []


@pytest.mark.parametrize("url, why", [
    ("http://hooks.example.com/T0/B0/s3cretT0KEN", "plain http"),
    ("ftp://hooks.example.com/s3cretT0KEN", "not an https URL"),
    ("https:///s3cretT0KEN", "no valid host"),
    ("https://hooks.example.com:99999/s3cretT0KEN", "no valid host or port"),
    ("https://user:s3cretT0KEN@hooks.example.com/x", "user name or password"),
    ("https://hooks.example.com/s3cret T0KEN", "whitespace"),
])
def test_a_bad_url_is_refused_at_start_without_showing_it(url: str, why: str) -> None:
    with pytest.raises(FleetError) as e:
        Webhook(url, "ro-1", "lab")
    assert why in e.value.cause and e.value.fix
    assert "s3cret" not in e.value.message() and "T0KEN" not in e.value.message()


def test_plain_http_only_with_the_explicit_opt_in() -> None:
    assert validate("http://127.0.0.1:9/x", allow_http=True) == "http://127.0.0.1:9/x"
    assert validate("https://hooks.example.com/x") == "https://hooks.example.com/x"
    assert redact("https://hooks.example.com:8443/services/T0/B0/XXXX?t=1") == "https://hooks.example.com:8443/<redacted>"


class _Stall(BaseHTTPRequestHandler):
    """Accepts the request, then never answers within the client's timeout."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        threading.Event().wait(30)


class _Redirect(BaseHTTPRequestHandler):
    server: Receiver

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.server.bodies.append({"redirected": True})
        self.send_response(307)
        self.send_header("Location", "http://127.0.0.1:1/elsewhere")
        self.end_headers()


def test_a_stalled_receiver_never_blocks_the_sender_and_close_has_a_deadline() -> None:
    s = ThreadingHTTPServer(("127.0.0.1", 0), _Stall)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        rec = Recorder()
        hook = Webhook(f"http://127.0.0.1:{s.server_port}/x", "ro-1", "lab", rec, timeout=20, allow_http=True)
        for ev in ("start", "wave", "completion"):
            hook.send(ev)  # returns at once: the POST happens on the background thread
        got = hook.close(deadline=0.5)
        # the first POST is still waiting: every queued event is reported as not sent, none raised
        assert [d.event for d in got] == ["wave", "completion"]
        assert all(d.status is None and d.error and "not sent" in d.error for d in got)
    finally:
        s.shutdown()
        s.server_close()


def test_a_redirect_is_not_followed() -> None:
    s = Receiver(("127.0.0.1", 0), _Redirect)
    s.bodies = []
    threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        hook = Webhook(f"http://127.0.0.1:{s.server_port}/x", "ro-1", "lab", allow_http=True)
        hook.send("start")
        (d,) = hook.close()
        assert d.status == 307 and d.error == "HTTP 307"
        assert s.bodies == [{"redirected": True}]
    finally:
        s.shutdown()
        s.server_close()
