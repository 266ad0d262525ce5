"""Users' traffic for the lab: a steady stream of real streaming chat requests, and what became of
them.

``run(url, model, rate, duration)`` starts one request every ``1/rate`` seconds for ``duration``
seconds (``POST /v1/chat/completions`` with ``"stream": true``), each on its own connection, at most
``concurrency`` open at once (a request that would exceed it is counted failed, cause ``client
limit``, never queued: the schedule stays steady). A request is ``ok`` when it got a 200 and its
stream ended with ``data: [DONE]`` without an error event; anything else is ``failed`` with a cause
(connection refused, HTTP 503, stream cut, error event, timeout). Latency is from the request's
start to the end of its stream, for ok requests.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.progress import NULL, Event, Progress

#: Requests open at once at most (each is a thread and a connection).
MAX_CONCURRENCY = 256
#: Seconds one request may take in all.
REQUEST_TIMEOUT = 120.0


@dataclass(frozen=True)
class TrafficReport:
    """What happened to the requests of one run."""

    url: str
    model: str
    rate: float
    duration: float
    sent: int
    ok: int
    failed: int
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    seconds: float
    #: cause -> count, for the failed requests.
    causes: dict[str, int] = field(default_factory=dict)
    #: (seconds since the start, cause) of each failed request, first 50.
    failures: list[tuple[float, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "rate": self.rate,
            "duration": self.duration,
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "p50_s": self.p50_s,
            "p95_s": self.p95_s,
            "max_s": self.max_s,
            "seconds": round(self.seconds, 3),
            "causes": dict(self.causes),
            "failures": [{"at_s": round(t, 3), "cause": c} for t, c in self.failures],
        }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))], 4)


def one_request(url: str, model: str, api_key: str | None, max_tokens: int,
                timeout: float = REQUEST_TIMEOUT) -> tuple[bool, str, float]:
    """One streaming chat request: (ok, cause when not ok, seconds)."""
    u = urllib.parse.urlsplit(url)
    t0 = time.monotonic()
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Say something short about load balancers."}],
        }
    )
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request(
            "POST", (u.path.rstrip("/") or "") + "/v1/chat/completions", body=body, headers=headers
        )
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            return False, f"HTTP {r.status}", time.monotonic() - t0
        done = False
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            if '"error"' in payload:
                try:
                    event = json.loads(payload)
                except ValueError:
                    event = None
                if isinstance(event, dict) and "error" in event:
                    return False, "error event in the stream", time.monotonic() - t0
        if not done:
            return False, "stream cut before [DONE]", time.monotonic() - t0
        return True, "", time.monotonic() - t0
    except ConnectionRefusedError:
        return False, "connection refused", time.monotonic() - t0
    except TimeoutError:
        return False, "timeout", time.monotonic() - t0
    except (OSError, http.client.HTTPException) as e:
        return False, f"{type(e).__name__}", time.monotonic() - t0
    finally:
        conn.close()


def run(
    url: str,
    model: str,
    rate: float,
    duration: float,
    *,
    api_key: str | None = None,
    max_tokens: int = 16,
    concurrency: int = MAX_CONCURRENCY,
    progress: Progress = NULL,
    stop: threading.Event | None = None,
) -> TrafficReport:
    """Send ``rate`` requests a second for ``duration`` seconds to ``url``; wait for every one;
    report.

    ``stop`` set ends the sending early (the requests already sent are still waited for and
    counted)."""
    if rate <= 0 or duration <= 0:
        raise FleetError(f"--rate {rate} / --duration {duration}: both must be above 0",
                         fix="e.g. --rate 5 --duration 60s")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise FleetError(
            f"concurrency {concurrency} is outside 1..{MAX_CONCURRENCY}", fix="pass a smaller one"
        )
    total = max(1, int(rate * duration))
    mu = threading.Lock()
    latencies: list[float] = []
    causes: Counter[str] = Counter()
    failures: list[tuple[float, str]] = []
    open_now = 0
    t_start = time.monotonic()

    def note_failure(at: float, cause: str) -> None:
        causes[cause] += 1
        if len(failures) < 50:
            failures.append((round(at, 3), cause))

    def send(at: float) -> None:
        nonlocal open_now
        try:
            ok, cause, secs = one_request(url, model, api_key, max_tokens)
        finally:
            with mu:
                open_now -= 1
        with mu:
            if ok:
                latencies.append(secs)
            else:
                note_failure(at, cause)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fleetctl-traffic") as pool:
        sent = 0
        for i in range(total):
            due = t_start + i / rate
            delay = due - time.monotonic()
            if stop is not None:
                if stop.wait(max(0.0, delay)):
                    break
            elif delay > 0:
                time.sleep(delay)
            sent += 1
            at = time.monotonic() - t_start
            with mu:
                full = open_now >= concurrency
                if not full:
                    open_now += 1
                else:
                    note_failure(at, "client limit")
            if not full:
                pool.submit(send, at)
            if i and i % max(1, int(rate * 5)) == 0:
                with mu:
                    progress(
                        Event(
                            "traffic",
                            f"{i} sent, {len(latencies)} ok, {sum(causes.values())} failed",
                        )
                    )
    seconds = time.monotonic() - t_start
    failed = sum(causes.values())
    return TrafficReport(
        url,
        model,
        rate,
        duration,
        sent,
        len(latencies),
        failed,
        _percentile(latencies, 0.5),
        _percentile(latencies, 0.95),
        round(max(latencies), 4) if latencies else None,
        seconds,
        dict(causes),
        sorted(failures),
    )


def lab_target() -> tuple[str, str, str | None]:
    """(the lab front door's URL, the lab's default served model name, the API key if its recipe
    needs one)."""
    from fleetctl import inventory, recipes, secretenv
    from fleetctl.lab.frontdoor import LabFrontDoor
    from fleetctl.lab.layout import current

    lay = current()
    door = LabFrontDoor(lay)
    if not door.running():
        raise FleetError(
            f"the lab's front door does not run ({door.url})",
            fix="`fleetctl lab up` starts it (with FLEETCTL_LAB_DIR/FLEETCTL_LAB_SUBNET of your "
                "lab)",
        )
    recipe = recipes.recipe_for(inventory.load(lay.inventory))
    return (
        door.url,
        recipe.served_model_names[0],
        secretenv.api_key(recipe.secret_env, recipe=recipe.name),
    )
