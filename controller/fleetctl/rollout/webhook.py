"""Webhook events: a JSON POST to a configured URL on start, each wave, pause, failure, rollback, completion.

The URL comes from ``--webhook``, ``$FLEETCTL_WEBHOOK_URL`` or the inventory's
``fleetctl_webhook_url``. It is checked when the command starts (before any
host is touched): ``https`` only, since chat webhooks carry their token in the
URL and a body says which hosts fail; plain ``http`` needs the inventory's
explicit ``fleetctl_webhook_allow_http: true`` (a loopback or lab receiver).

A webhook never stops or slows a rollout (the ledger is the record; a chat
message is a courtesy): events go to a queue that one background thread posts
from, every error is caught and reported as a progress event, and
:meth:`Webhook.close` waits for the queue at most :data:`CLOSE_DEADLINE`
seconds in all. The URL is never shown: messages name the event and at most
the receiver's host (:func:`redact`); redirects are not followed.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.progress import NULL, Event, Progress

#: Event names a receiver can rely on.
EVENTS = ("start", "wave", "pause", "failure", "rollback", "completion", "bake", "breach")
#: Seconds one POST may take, connection included.
POST_TIMEOUT = 5.0
#: Seconds :meth:`Webhook.close` waits for undelivered events at the end of a command, in all.
CLOSE_DEADLINE = 10.0
#: Events kept waiting at most; beyond, the oldest is dropped (a dead receiver must not grow memory).
MAX_QUEUED = 100
_REDACTED_PATH = "/<redacted>"


@dataclass(frozen=True)
class Delivery:
    """What happened to one event: delivered (HTTP status) or the error."""

    event: str
    status: int | None
    error: str | None


def redact(url: str) -> str:
    """``scheme://host[:port]/<redacted>``: where events go, without the path or query holding a token."""
    try:
        u = urllib.parse.urlsplit(url)
        host = u.hostname or "?"
        port = f":{u.port}" if u.port else ""
    except ValueError:
        return "<webhook URL>"
    host = f"[{host}]" if ":" in host else host
    return f"{u.scheme or '?'}://{host}{port}{_REDACTED_PATH}"


def validate(url: str, allow_http: bool = False) -> str:
    """``url`` when it can be posted to safely; a FleetError (URL redacted) otherwise."""
    shown = redact(url)
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise FleetError(f"the webhook URL {shown} contains whitespace or control characters",
                         fix="quote the URL exactly as the receiver gave it")
    try:
        u = urllib.parse.urlsplit(url)
        port_ok = u.port is None or 0 < u.port < 65536
    except ValueError:
        port_ok = False
        u = urllib.parse.urlsplit("")
    if not port_ok or not u.hostname:
        raise FleetError(f"the webhook URL {shown} has no valid host or port",
                         fix="give a full URL, e.g. https://hooks.example.com/T0/B0/XXXX")
    if u.username is not None or u.password is not None:
        raise FleetError(f"the webhook URL {shown} carries a user name or password",
                         fix="put the receiver's token where it expects it (path or query), not in user:pass@")
    if u.scheme == "https":
        return url
    if u.scheme == "http" and allow_http:
        return url
    if u.scheme == "http":
        raise FleetError(f"the webhook URL {shown} is plain http: its token and the events would cross the network "
                         "unencrypted",
                         fix="use the receiver's https URL (for a lab receiver only: set "
                             "fleetctl_webhook_allow_http: true in the inventory)")
    raise FleetError(f"the webhook URL {shown} is not an https URL",
                     fix="give the receiver's https:// URL")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook answering with a redirect gets an error, not the event sent elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class Webhook:
    """Posts events for one rollout from a background thread; ``url`` None makes it a no-op.

    ``url`` is validated here (see :func:`validate`); call :meth:`close` at the end.
    """

    def __init__(self, url: str | None, rollout_id: str, fleet: str, progress: Progress = NULL,
                 timeout: float = POST_TIMEOUT, *, allow_http: bool = False) -> None:
        self.url = validate(url, allow_http) if url else None
        self.rollout_id = rollout_id
        self.fleet = fleet
        self.progress = progress
        self.timeout = timeout
        self.deliveries: list[Delivery] = []
        self._queue: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, event: str, **data: Any) -> None:
        """Queue ``{"event", "rollout", "fleet", "at", **data}`` for posting; never blocks, never raises
        (an unknown event name is a bug in fleetctl: ValueError)."""
        if not self.url:
            return
        if event not in EVENTS:
            raise ValueError(f"unknown webhook event {event!r}")
        body = {"event": event, "rollout": self.rollout_id, "fleet": self.fleet,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **_plain(data)}
        with self._lock:
            if self._queue.qsize() >= MAX_QUEUED:
                try:
                    dropped = self._queue.get_nowait()
                except queue.Empty:
                    dropped = None
                if dropped is not None:
                    self._record(Delivery(dropped[0], None, "dropped: too many events waiting"))
            self._queue.put((event, json.dumps(body).encode()))
            if self._thread is None:
                self._thread = threading.Thread(target=self._worker, name="fleetctl-webhook", daemon=True)
                self._thread.start()

    def close(self, deadline: float = CLOSE_DEADLINE) -> list[Delivery]:
        """Wait up to ``deadline`` seconds in all for queued events; what was not sent is reported."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return list(self.deliveries)
            self._queue.put(None)
        thread.join(max(0.0, deadline))
        if thread.is_alive():
            # The thread is a daemon: it dies with the process; the events still queued are reported.
            left = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    left.append(item[0])
            for ev in left:
                self._record(Delivery(ev, None, f"not sent within {deadline:.0f}s"))
        return list(self.deliveries)

    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._record(self._post(*item))

    def _post(self, event: str, body: bytes) -> Delivery:
        assert self.url is not None
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "fleetctl"})
        try:
            with _OPENER.open(req, timeout=self.timeout) as resp:
                return Delivery(event, int(resp.status), None)
        except urllib.error.HTTPError as e:
            return Delivery(event, e.code, f"HTTP {e.code}")
        except urllib.error.URLError as e:
            return Delivery(event, None, self._scrub(str(e.reason)))
        except Exception as e:  # a courtesy message must never take the rollout down
            return Delivery(event, None, self._scrub(f"{type(e).__name__}: {e}"))

    def _scrub(self, text: str) -> str:
        """An error text without the URL or any part of its path and query (where tokens live)."""
        if not self.url:
            return text
        u = urllib.parse.urlsplit(self.url)
        for part in sorted({self.url, u.path, u.query, *u.path.split("/"), *u.query.split("&")}, key=len,
                           reverse=True):
            if len(part) >= 4:
                text = text.replace(part, "<redacted>")
        return text

    def _record(self, d: Delivery) -> None:
        self.deliveries.append(d)
        if d.error:
            self.progress(Event("webhook", f"{d.event} event to {redact(self.url or '')} not delivered: {d.error}"))


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(json.dumps(dict(data), default=str)).items()}
