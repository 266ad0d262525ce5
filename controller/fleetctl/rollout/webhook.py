"""Webhook events: a JSON POST to a configured URL on start, each wave, pause, failure, rollback, completion.

The URL comes from ``--webhook``, ``$FLEETCTL_WEBHOOK_URL`` or the inventory's
``fleetctl_webhook_url``. A webhook that fails never stops a rollout (the
ledger is the record; a chat message is a courtesy): the failure is reported
as a progress event and returned.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl.progress import NULL, Event, Progress

#: Event names a receiver can rely on.
EVENTS = ("start", "wave", "pause", "failure", "rollback", "completion")


@dataclass(frozen=True)
class Delivery:
    """What happened to one event: delivered (HTTP status) or the error."""

    event: str
    status: int | None
    error: str | None


class Webhook:
    """Posts events for one rollout; ``url`` None makes it a no-op."""

    def __init__(self, url: str | None, rollout_id: str, fleet: str, progress: Progress = NULL,
                 timeout: float = 5.0) -> None:
        self.url = url
        self.rollout_id = rollout_id
        self.fleet = fleet
        self.progress = progress
        self.timeout = timeout
        self.deliveries: list[Delivery] = []

    def send(self, event: str, **data: Any) -> Delivery | None:
        """POST ``{"event", "rollout", "fleet", "at", **data}``; never raises."""
        if not self.url:
            return None
        if event not in EVENTS:
            raise ValueError(f"unknown webhook event {event!r}")
        body = {"event": event, "rollout": self.rollout_id, "fleet": self.fleet,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **_plain(data)}
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "fleetctl"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                d = Delivery(event, resp.status, None)
        except urllib.error.HTTPError as e:
            d = Delivery(event, e.code, f"HTTP {e.code}")
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            d = Delivery(event, None, str(getattr(e, "reason", e)))
        if d.error:
            # The URL may embed a token (chat webhooks do): name the event, never the URL.
            self.progress(Event("webhook", f"{event} event not delivered: {d.error}"))
        self.deliveries.append(d)
        return d


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(json.dumps(dict(data), default=str)).items()}
