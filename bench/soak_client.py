"""How many streamed SSE events per second the soak client absorbs on one core.

A loopback server (its own process) streams vLLM-shaped chat completion chunks
as fast as it can; in the same run, with the same server, we measure:

- ``fleetctl``: ``fleetctl.soak.client.Client.chat`` with its full per-event
  JSON parsing, TTFT stamping, usage and error-event handling, the garbage checks
  on every delta's text and the finish_reason/completion_tokens validation;
- ``bare aiohttp``: ``async for line in resp.content`` counting ``data:`` lines
  (the loop behind ``vllm bench serve``);
- ``bare httpx``: ``async for line in resp.aiter_lines()`` (the loop behind guidellm).

Throughput is reported per wall second and per client CPU second (the client is
one asyncio thread, so it never uses more than one core). The goal: fleetctl
>= 0.85x the bare aiohttp loop with the text checks on. TTFT overhead: the server waits 20 ms before
its first event; what each client measures above that is its overhead.

    .venv/bin/python bench/soak_client.py [--events 4000] [--streams 16] [--rounds 3]

Prints a table and writes bench/results/soak_client.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from fleetctl.soak.client import ChatRequest, Client, SampleTag

FIRST_EVENT_DELAY = 0.020


def _event(i: int, finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "delta": {"content": f" tok{i % 97}"},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _body(events: int) -> bytes:
    # One HTTP chunk per SSE event, as uvicorn sends vLLM's stream; built once, written at once.
    parts = []
    for i in range(events):
        ev = _event(i, "length" if i == events - 1 else None)
        parts.append(b"%x\r\n%s\r\n" % (len(ev), ev))
    usage = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "bench",
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": events, "total_tokens": events + 10},
    }
    for ev in (b"data: " + json.dumps(usage).encode() + b"\n\n", b"data: [DONE]\n\n"):
        parts.append(b"%x\r\n%s\r\n" % (len(ev), ev))
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


def _serve(port: int, events: int, ready: Any) -> None:
    body = _body(events)
    first_len = body.index(b"\r\n", body.index(b"\r\n") + 2) + 2
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"connection: keep-alive\r\n\r\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                writer.write(head)
                if b"X-Delay: 1" in header:
                    # TTFT mode: the first event 20 ms after the headers, then the rest.
                    await writer.drain()
                    await asyncio.sleep(FIRST_EVENT_DELAY)
                    writer.write(body[:first_len])
                    await writer.drain()
                    writer.write(body[first_len:])
                else:
                    writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=512)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


#: Tokens per response (the server's completion_tokens; the client validates it against max_tokens).
_TOKENS = {"n": 4000}


async def _fleetctl(url: str, streams: int, per_stream: int, ttft: bool) -> tuple[int, list[float]]:
    events = 0
    ttfts: list[float] = []
    async with Client(url, connections=streams + 4) as c:
        # The delay header is how the bench asks its server for a first-event delay.
        c.session.headers["X-Delay"] = "1" if ttft else "0"

        async def one() -> None:
            nonlocal events
            for _ in range(per_stream):
                s = await c.chat(
                    ChatRequest("bench", "hi", _TOKENS["n"], ignore_eos=True),
                    SampleTag("bench", "bench", streams, 0.0),
                )
                if not s.ok or s.garbage:
                    raise RuntimeError(s.error or s.garbage)
                events += s.events
                if s.ttft is not None:
                    ttfts.append(s.ttft)

        await asyncio.gather(*(one() for _ in range(streams)))
    return events, ttfts


async def _aiohttp(url: str, streams: int, per_stream: int, ttft: bool) -> tuple[int, list[float]]:
    events = 0
    ttfts: list[float] = []
    conn = aiohttp.TCPConnector(limit=streams + 4)
    async with aiohttp.ClientSession(
        connector=conn, headers={"X-Delay": "1" if ttft else "0"}
    ) as s:

        async def one() -> None:
            nonlocal events
            for _ in range(per_stream):
                t0 = time.monotonic()
                first = True
                async with s.post(url + "/v1/chat/completions", data=b'{"model":"bench"}') as resp:
                    async for line in resp.content:
                        if line.startswith(b"data:"):
                            events += 1
                            if first:
                                ttfts.append(time.monotonic() - t0)
                                first = False

        await asyncio.gather(*(one() for _ in range(streams)))
    return events, ttfts


async def _httpx(url: str, streams: int, per_stream: int, ttft: bool) -> tuple[int, list[float]]:
    events = 0
    ttfts: list[float] = []
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    async with httpx.AsyncClient(
        limits=limits, timeout=60, headers={"X-Delay": "1" if ttft else "0"}
    ) as c:

        async def one() -> None:
            nonlocal events
            for _ in range(per_stream):
                t0 = time.monotonic()
                first = True
                async with c.stream(
                    "POST", url + "/v1/chat/completions", content=b'{"model":"bench"}'
                ) as resp:
                    async for line in resp.aiter_lines():
                        if line.startswith("data:"):
                            events += 1
                            if first:
                                ttfts.append(time.monotonic() - t0)
                                first = False

        await asyncio.gather(*(one() for _ in range(streams)))
    return events, ttfts


Runner = Callable[[str, int, int, bool], Awaitable[tuple[int, list[float]]]]
CLIENTS: dict[str, Runner] = {"fleetctl": _fleetctl, "bare aiohttp": _aiohttp, "bare httpx": _httpx}


def measure(fn: Runner, url: str, streams: int, per_stream: int) -> dict[str, float]:
    """One throughput run: events per wall second and per client CPU second."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    events, _ = asyncio.run(fn(url, streams, per_stream, False))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    return {"events": events, "wall_s": wall, "cpu_s": cpu, "events_per_s": events / wall,
            "events_per_cpu_s": events / cpu if cpu else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=4000, help="events per streamed response")
    ap.add_argument("--streams", type=int, default=16, help="concurrent streams")
    ap.add_argument("--per-stream", type=int, default=4, help="responses per stream per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the median is reported)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak_client.json"))
    args = ap.parse_args()
    _TOKENS["n"] = args.events

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_serve, args=(port, args.events, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(10):
            raise SystemExit("bench server did not start")
        url = f"http://127.0.0.1:{port}"
        results: dict[str, dict[str, Any]] = {}
        for fn in CLIENTS.values():
            measure(fn, url, 2, 1)  # warm-up: imports, connection setup
        runs: dict[str, list[dict[str, float]]] = {n: [] for n in CLIENTS}
        for _ in range(args.rounds):  # interleaved so machine noise hits every client alike
            for name, fn in CLIENTS.items():
                runs[name].append(measure(fn, url, args.streams, args.per_stream))
        for name, fn in CLIENTS.items():
            _, ttfts = asyncio.run(fn(url, 1, 10, True))  # one stream: the client's own overhead
            over = [t - FIRST_EVENT_DELAY for t in ttfts]
            results[name] = {
                "events_per_s": statistics.median(r["events_per_s"] for r in runs[name]),
                "events_per_cpu_s": statistics.median(r["events_per_cpu_s"] for r in runs[name]),
                "ttft_overhead_ms_p50": 1000 * statistics.median(over),
                "ttft_overhead_ms_max": 1000 * max(over),
                "runs": runs[name],
            }
    finally:
        server.terminate()
        server.join(5)

    base = results["bare aiohttp"]["events_per_cpu_s"]
    for r in results.values():
        r["vs_bare_aiohttp"] = r["events_per_cpu_s"] / base if base else 0.0
    # A Spark peaks at ~800 tok/s; with speculative decoding an event carries >= 1 token.
    sparks = results["fleetctl"]["events_per_cpu_s"] / 800.0
    print(
        f"{'client':<14} {'events/s':>10} {'events/CPU-s':>13} {'vs bare aiohttp':>16} "
        f"{'TTFT overhead p50':>18}"
    )
    for name, r in results.items():
        print(
            f"{name:<14} {r['events_per_s']:>10.0f} {r['events_per_cpu_s']:>13.0f} "
            f"{r['vs_bare_aiohttp']:>15.2f}x "
            f"{r['ttft_overhead_ms_p50']:>15.2f} ms"
        )
    print(
        f"one controller core keeps up with ~{sparks:.0f} Sparks streaming 800 tok/s (1 token per "
        "event, worst case)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": {
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                },
                "settings": vars(args),
                "results": results,
                "sparks_at_800_tok_s_per_core": sparks,
                "goal": "fleetctl (text checks on) >= 0.85x bare aiohttp events per CPU second",
                "goal_met": results["fleetctl"]["vs_bare_aiohttp"] >= 0.85,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
