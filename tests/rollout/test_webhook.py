"""Webhook events reach a real loopback HTTP server as JSON; a dead receiver never raises."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory
from fleetctl.errors import FleetError
from fleetctl.progress import Event, Recorder, event_from_json
from fleetctl.rollout import webhook
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options
from fleetctl.rollout.session import Seams
from fleetctl.rollout.webhook import Posting, Webhook, redact, validate
from tests.plugins.webhook import Receiver

from .sim import OK, SimFleet, SimGates
from .test_capacity_harness import HOSTS, LIMIT, _inventory


def test_events_are_posted_as_json(receiver: Receiver) -> None:
    hook = Webhook(f"http://127.0.0.1:{receiver.server_port}/hook?token=s3cret", "ro-1", "lab",
                   posting=Posting(allow_http=True))
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
    hook = Webhook(f"http://127.0.0.1:{receiver.server_port}/hook?token=s3cret", "ro-1", "lab",
                   rec, posting=Posting(allow_http=True))
    hook.send("failure", error="canary failed")
    (d,) = hook.close()
    assert d.status == 500
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    hook2 = Webhook(f"http://127.0.0.1:{dead}/x/T0KEN-PATH?token=s3cret", "ro-1", "lab", rec,
                    posting=Posting(timeout=2, allow_http=True))
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
        hook = Webhook(f"http://127.0.0.1:{s.server_port}/x", "ro-1", "lab", rec,
                       posting=Posting(timeout=20, allow_http=True))
        for ev in ("start", "wave", "completion"):
            hook.send(ev)  # returns at once: the POST happens on the background thread
        got = hook.close(deadline=0.5)
        # the first POST is still waiting: it and every queued event are reported as not
        # delivered, none raised
        assert [d.event for d in got] == ["start", "wave", "completion"]
        assert got[0].error is not None and "being posted" in got[0].error
        assert all(d.status is None and d.error and "not sent" in d.error for d in got[1:])
    finally:
        s.shutdown()
        s.server_close()


class _Drip(BaseHTTPRequestHandler):
    """Issue 39, low 9: answers the status line, then a header a byte every 0.05 s for 30 s (every
    read well within the 5 s timeout: the POST was held for good)."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Pad: ")
        for _ in range(600):
            try:
                self.wfile.write(b"a")
                self.wfile.flush()
            except OSError:
                return
            threading.Event().wait(0.05)


def test_a_dripping_receiver_is_given_up_at_the_posts_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(webhook, "POST_DEADLINE", 1.5)
    s = ThreadingHTTPServer(("127.0.0.1", 0), _Drip)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        rec = Recorder()
        hook = Webhook(f"http://127.0.0.1:{s.server_port}/x", "ro-1", "lab", rec,
                       posting=Posting(allow_http=True, timeout=1))
        hook.send("start")
        hook.send("completion")
        got = hook.close(deadline=8)
        # each POST ends at its deadline and is reported; the next event still goes out
        assert [(d.event, d.error) for d in got] == [("start", "no answer within 2s"),
                                                     ("completion", "no answer within 2s")]
        assert any("start event" in e.message and "not delivered" in e.message
                   for e in rec.events)
    finally:
        s.shutdown()
        s.server_close()


def test_a_redirect_is_not_followed() -> None:
    s = Receiver(("127.0.0.1", 0), _Redirect)
    s.bodies = []
    threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        hook = Webhook(f"http://127.0.0.1:{s.server_port}/x", "ro-1", "lab",
                       posting=Posting(allow_http=True))
        hook.send("start")
        (d,) = hook.close()
        assert d.status == 307 and d.error == "HTTP 307"
        assert s.bodies == [{"redirected": True}]
    finally:
        s.shutdown()
        s.server_close()


FIXTURE = Path(__file__).parents[1] / "cli" / "fixtures" / "rollout-events.jsonl"


def test_the_hosts_progress_is_posted_batched_bounded_and_without_secrets(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recorded rollout's events (the ones every view gets) reach the receiver as ``progress``
    events: one post per interval whatever the number of events, at most PROGRESS_HOSTS hosts in
    one, each host's latest
    phase and figures, no secret value and no part of the URL's token."""
    monkeypatch.setattr(webhook, "PROGRESS_HOSTS", 3)
    url = f"http://127.0.0.1:{receiver.server_port}/hook/T0KEN-0123456789abcdef"
    hook = Webhook(url, "ro-1", "lab", posting=Posting(allow_http=True, secrets=["hunter2-sudo"],
                                                       interval=3600))
    events = [event_from_json(json.loads(ln))[1] for ln in FIXTURE.read_text().splitlines()]
    events.append(
        Event(
            "failed",
            "sudo said hunter2-sudo is wrong; see T0KEN-0123456789abcdef",
            "spark-05",
            {"tag": "v0.24.0", "soak_phase": "internal", "bytes": 5, "bytes_total": 10},
        )
    )
    for e in events:
        hook.watch(e)
    assert len(receiver.bodies) <= 1, "one post per interval, whatever the number of events"
    hook.close()
    hook.watch(Event("done", "after close", "spark-01"))  # a closed webhook takes no more
    posts = [b for b in receiver.bodies if b["event"] == "progress"]
    # The first post went at the first event; the rest at close, in posts of at most 3 hosts.
    assert len(posts) == 3 and [len(p["hosts"]) for p in posts[1:]] == [3, 2]
    assert posts[1]["waiting"] == 2 and posts[2]["waiting"] == 0
    last = {h["host"]: h for p in posts[1:] for h in p["hosts"]}
    expected = {e.host: e for e in events if e.host}
    assert {h: e["phase"] for h, e in last.items()} == {h: e.phase for h, e in expected.items()}
    assert last["spark-05"]["bytes"] == 5 and "soak_phase" not in last["spark-05"]
    text = json.dumps(receiver.bodies)
    assert (
        "hunter2-sudo" not in text
        and "T0KEN-0123456789abcdef" not in text
        and "<redacted by fleetctl>" in text
    )


def test_a_rollout_posts_each_hosts_progress_once_from_one_webhook(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the engine (simulated fleet): the run's events reach the webhook as progress, the
    last state
    of every host once at the end; the webhook checked before the plan is not a second watcher."""
    monkeypatch.delenv("FLEETCTL_WEBHOOK_URL", raising=False)
    fleet = SimFleet(dict.fromkeys(HOSTS, "v1"), {"v1": OK, "v2": OK})
    inv = inventory.load(_inventory(tmp_path))
    (inv.path.parent / "group_vars" / "all" / "hook.yml").write_text(
        "fleetctl_webhook_allow_http: true\n"
    )
    eng = Engine(inventory.load(inv.path), state_dir=tmp_path / "state", secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    try:
        r = eng.rollout(Options(tag="v2", limit=LIMIT, soak=1.0,
                                webhook=f"http://127.0.0.1:{receiver.server_port}/hook/T0KEN-0123456789abcdef"))
    finally:
        eng.close()
    assert r.status == "completed", r.error
    kinds = [b["event"] for b in receiver.bodies]
    assert "start" in kinds and "completion" in kinds
    # One watcher: its first post at the first event, then (the run is shorter than the interval)
    # the rest at the end, every host's last state once.
    posts = [b for b in receiver.bodies if b["event"] == "progress"]
    assert len(posts) == 2, kinds
    last = posts[-1]["hosts"]
    assert sorted(h["host"] for h in last) == HOSTS and {h["phase"] for h in last} == {"done"}
    assert all(h["tag"] for h in last)
