"""Webhook events: a JSON POST to a configured URL on start, each wave, pause, failure, rollback,
completion.

The URL comes from ``--webhook``, ``$FLEETCTL_WEBHOOK_URL`` or the inventory's
``fleetctl_webhook_url``. It is checked when the command starts (before any
host is touched): ``https`` only, since chat webhooks carry their token in the
URL and a body says which hosts fail; plain ``http`` needs the inventory's
explicit ``fleetctl_webhook_allow_http: true`` (a loopback or lab receiver).

Besides those coarse events, a ``progress`` event carries the hosts' progress: the same
:class:`~fleetctl.progress.Event` s every view gets (:meth:`Webhook.watch`), folded to each host's
latest phase, message and figures, and posted at most once per :data:`PROGRESS_INTERVAL` seconds
with at most :data:`PROGRESS_HOSTS` hosts (those that changed since the last post, longest waiting
first; the rest go in the next). A fleet of hundreds of hosts therefore costs a receiver one POST
per interval, not one per host or per event. Secret values (the hosts' become passwords, the
environment's tokens, keys and passwords, the URL's own path and query) are replaced in every
string of a body.

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
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetctl import httpbound
from fleetctl.ansible.redaction import Redactor
from fleetctl.errors import FleetError
from fleetctl.progress import NULL, Event, Progress
from fleetctl.urls import url_host

#: Event names a receiver can rely on.
EVENTS = (
    "start",
    "wave",
    "pause",
    "failure",
    "rollback",
    "completion",
    "progress",
    "bake",
    "breach",
    "remediation",
)
#: Seconds between two ``progress`` posts at least.
PROGRESS_INTERVAL = 10.0
#: Hosts in one ``progress`` post at most (the others wait for the next).
PROGRESS_HOSTS = 100
#: The figures of a host's progress a receiver gets (the live view's, without the internals).
PROGRESS_FIGURES = (
    "wave",
    "tag",
    "digest",
    "health",
    "task",
    "step",
    "steps",
    "level",
    "concurrency",
    "requests",
    "planned_requests",
    "errors",
    "tok_s",
    "baseline",
    "acceptance_rate",
    "elapsed",
    "level_elapsed",
    "level_seconds",
    "waited",
    "timeout",
    "bytes",
    "bytes_total",
    "layers",
    "layers_total",
)
#: A part of the URL's path or query this long is taken for a token, kept out of bodies.
TOKEN_PART = 12
#: A host's message is cut to this many characters in a ``progress`` post.
PROGRESS_MESSAGE = 300
#: Seconds one wait of a POST may take (connecting, or between two reads of the answer).
POST_TIMEOUT = 5.0
#: Seconds one POST may take in all, however slowly the receiver drips its answer's headers (a
#: watchdog shuts the socket: fleetctl.httpbound); past it the event is reported not delivered.
POST_DEADLINE = 10.0
#: Seconds :meth:`Webhook.close` waits for undelivered events at the end of a command, in all.
CLOSE_DEADLINE = 10.0
#: Events kept waiting at most; beyond, the oldest is dropped (a dead receiver must not grow
#: memory).
MAX_QUEUED = 100
_REDACTED_PATH = "/<redacted>"


@dataclass(frozen=True)
class Delivery:
    """What happened to one event: delivered (HTTP status) or the error."""

    event: str
    status: int | None
    error: str | None


def redact(url: str) -> str:
    """``scheme://host[:port]/<redacted>``: where events go, without the path or query holding a
    token."""
    try:
        u = urllib.parse.urlsplit(url)
        host = u.hostname or "?"
        port = f":{u.port}" if u.port else ""
    except ValueError:
        return "<webhook URL>"
    host = url_host(host)
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
        raise FleetError(
            f"the webhook URL {shown} carries a user name or password",
            fix="put the receiver's token where it expects it (path or query), not in user:pass@",
        )
    if u.scheme == "https":
        return url
    if u.scheme == "http" and allow_http:
        return url
    if u.scheme == "http":
        raise FleetError(
            f"the webhook URL {shown} is plain http: its token and the events would cross the "
            "network "
            "unencrypted",
            fix="use the receiver's https URL (for a lab receiver only: set "
            "fleetctl_webhook_allow_http: true in the inventory)",
        )
    raise FleetError(f"the webhook URL {shown} is not an https URL",
                     fix="give the receiver's https:// URL")


@dataclass(frozen=True)
class Posting:
    """How a webhook posts: plain http allowed (a lab receiver only), each post's timeout, the
    seconds between two progress posts, and the values no body may carry (kept out of repr)."""

    allow_http: bool = False
    timeout: float = POST_TIMEOUT
    interval: float = PROGRESS_INTERVAL
    secrets: Collection[str] = field(default=(), repr=False)


class Webhook:
    """Posts events for one rollout from a background thread; ``url`` None makes it a no-op.

    ``url`` is validated here (see :func:`validate`); call :meth:`close` at the end.
    """

    def __init__(
        self,
        url: str | None,
        rollout_id: str,
        fleet: str,
        progress: Progress = NULL,
        *,
        posting: Posting = Posting(),
        on_close: Callable[[Webhook], None] | None = None,
    ) -> None:
        allow_http, secrets, interval = posting.allow_http, posting.secrets, posting.interval
        timeout = posting.timeout
        self.url = validate(url, allow_http) if url else None
        parts: list[str] = []
        if self.url:
            u = urllib.parse.urlsplit(self.url)
            parts = [self.url, u.path, u.query, *u.path.split("/"), *u.query.split("&")]
        #: Every string of a body goes through it: secret values, the URL and its token-like parts.
        self.redactor = Redactor([*secrets, *(p for p in parts if len(p.strip("/")) >= TOKEN_PART)])
        self.on_close = on_close
        self.interval = interval
        #: Host -> when it first waited, and its latest event not yet posted (with its epoch time).
        self._pending: dict[str, tuple[float, tuple[Event, float]]] = {}
        self._last_progress = float("-inf")
        self._closed = False
        self.rollout_id = rollout_id
        self.fleet = fleet
        self.progress = progress
        self.timeout = timeout
        self.deliveries: list[Delivery] = []
        self._queue: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: The event being posted now (reported as not delivered if close cannot wait for it).
        self._in_flight: str | None = None

    def send(self, event: str, **data: Any) -> None:
        """Queue ``{"event", "rollout", "fleet", "at", **data}`` for posting; never blocks, never
        raises
        (an unknown event name is a bug in fleetctl: ValueError)."""
        if not self.url:
            return
        if event not in EVENTS:
            raise ValueError(f"unknown webhook event {event!r}")
        body = self.redactor.tree({"event": event, "rollout": self.rollout_id, "fleet": self.fleet,
                                   "at": _now(), **_plain(data)})
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
                self._thread = threading.Thread(
                    target=self._worker, name="fleetctl-webhook", daemon=True
                )
                self._thread.start()

    def watch(self, event: Event) -> None:
        """A progress sink: a host's event becomes its pending progress, posted in the next
        ``progress`` event (at most one per :attr:`interval`); fleet-wide events are the coarse
        events'
        business."""
        if not self.url or event.host is None or self._closed:
            return
        now = time.monotonic()
        with self._lock:
            since = self._pending[event.host][0] if event.host in self._pending else now
            # The event itself is kept; its entry is made when it is posted (most are replaced
            # before).
            self._pending[event.host] = (since, (event, time.time()))
            due = now - self._last_progress >= self.interval
        if due:
            self._flush_progress(now)

    def _flush_progress(self, now: float) -> None:
        """Post the hosts waiting longest (at most :data:`PROGRESS_HOSTS`) as one ``progress``
        event."""
        with self._lock:
            if not self._pending:
                return
            order = sorted(self._pending, key=lambda h: self._pending[h][0])[:PROGRESS_HOSTS]
            hosts = [_entry(*self._pending.pop(h)[1]) for h in order]
            self._last_progress = now
            waiting = len(self._pending)
        self.send("progress", hosts=hosts, waiting=waiting)

    def close(self, deadline: float = CLOSE_DEADLINE) -> list[Delivery]:
        """Post the hosts' last progress, then wait up to ``deadline`` seconds in all for queued
        events;
        what was not sent is reported."""
        if self.url and not self._closed:
            while self._pending:
                self._flush_progress(time.monotonic())
        self._closed = True
        if self.on_close is not None:
            self.on_close(self)
        with self._lock:
            thread = self._thread
            if thread is None:
                return list(self.deliveries)
            self._queue.put(None)
        thread.join(max(0.0, deadline))
        if thread.is_alive():
            # The thread is a daemon: it dies with the process; the events still queued are
            # reported.
            left = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    left.append(item[0])
            posting = self._in_flight
            if posting is not None:
                self._record(Delivery(posting, None, f"no answer within {deadline:.0f}s "
                                      "(being posted when the command ended)"))
            for ev in left:
                self._record(Delivery(ev, None, f"not sent within {deadline:.0f}s"))
        return list(self.deliveries)

    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._in_flight = item[0]
            d = self._post(*item)
            self._in_flight = None
            self._record(d)

    def _post(self, event: str, body: bytes) -> Delivery:
        assert self.url is not None
        req = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "fleetctl"},
        )
        deadline = max(self.timeout, POST_DEADLINE)
        try:
            # redirects are answers (not followed), the body is not read
            a = httpbound.exchange(req, timeout=self.timeout, deadline=deadline, max_bytes=0)
            return Delivery(event, a.status, f"HTTP {a.status}" if a.status >= 300 else None)
        except httpbound.Expired:
            return Delivery(event, None, f"no answer within {deadline:.0f}s")
        except urllib.error.URLError as e:
            return Delivery(event, None, self._scrub(str(e.reason)))
        except Exception as e:  # a courtesy message must never take the rollout down
            return Delivery(event, None, self._scrub(f"{type(e).__name__}: {e}"))

    def _scrub(self, text: str) -> str:
        """An error text without the URL or any part of its path and query (where tokens live)."""
        if not self.url:
            return text
        u = urllib.parse.urlsplit(self.url)
        for part in sorted(
            {self.url, u.path, u.query, *u.path.split("/"), *u.query.split("&")},
            key=len,
            reverse=True,
        ):
            if len(part) >= 4:
                text = text.replace(part, "<redacted>")
        return self.redactor.text(text)

    def _record(self, d: Delivery) -> None:
        self.deliveries.append(d)
        if d.error:
            self.progress(
                Event(
                    "webhook",
                    f"{d.event} event to {redact(self.url or '')} not delivered: {d.error}",
                )
            )


def _now(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _entry(event: Event, at: float) -> dict[str, Any]:
    """One host's part of a ``progress`` body: its latest event's phase, message (cut) and
    figures."""
    figures = {k: event.data[k] for k in PROGRESS_FIGURES if event.data.get(k) is not None}
    return {
        "host": event.host,
        "phase": event.phase,
        "message": event.message[:PROGRESS_MESSAGE],
        "at": _now(at),
        **figures,
    }


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(json.dumps(dict(data), default=str)).items()}
