"""What ``fleetctl watch`` costs the controller per host and interval, against a bare aiohttp loop.

A loopback server (its own process) answers like a vLLM: /health, /v1/models, /version, a /metrics
of the size a real one has (~300 series, histograms included) and streamed chat completions of 16
chunks. ``--hosts`` targets (the same server under different names) are watched for ``--seconds`` at
``--interval``, ``--parallel`` at a time. In the same run, with the same server:

- ``fleetctl watch``: ``soak.watch.run_watch`` (a canary and a stream per host-interval, the
/metrics
  scrape parsed and judged, samples and scrapes written to disk, the verdicts at the end);
- ``bare aiohttp``: per host-interval the same two streamed requests (lines counted) and the
/metrics
  GET (body read, not parsed), the same semaphore.

Reported: host-intervals done, controller CPU seconds per 1000 host-intervals, and the ratio; the
peak RSS growth of the watch with the hosts (memory per host is meant to be fixed).

    .venv/bin/python bench/watch.py [--hosts 100] [--seconds 6] [--interval 1] [--parallel 64]

Prints a table and writes bench/results/watch.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from fleetctl.soak import prompts
from fleetctl.soak.checks.watching import WatchSettings
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.verdict import SoakTarget
from fleetctl.soak.watch import STREAM_PROMPT, WatchTarget, run_watch

MODEL = "bench-model"


def _metrics_text(n: int) -> str:
    lines = [f'vllm:request_success_total{{model_name="{MODEL}",finished_reason="length"}} {n}',
             f'vllm:request_success_total{{model_name="{MODEL}",finished_reason="error"}} 0',
             f'vllm:num_preemptions_total{{model_name="{MODEL}"}} 0',
             f'vllm:generation_tokens_total{{model_name="{MODEL}"}} {16 * n}']
    for name in (
        "time_to_first_token_seconds",
        "request_time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "inter_token_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
    ):
        bounds = [0.001 * 2 ** i for i in range(24)]
        lines += [
            f'vllm:{name}_bucket{{model_name="{MODEL}",le="{b:g}"}} {n if b > 0.05 else 0}'
            for b in bounds
        ]
        lines += [
            f'vllm:{name}_bucket{{model_name="{MODEL}",le="+Inf"}} {n}',
            f'vllm:{name}_count{{model_name="{MODEL}"}} {n}',
            f'vllm:{name}_sum{{model_name="{MODEL}"}} {0.08 * n}',
        ]
    lines += [
        f'vllm:request_params_max_tokens_bucket{{model_name="{MODEL}",le="{2**i}"}} {n}'
        for i in range(14)
    ]
    return "\n".join(lines) + "\n"


def _answer(prompt: str) -> str:
    for cp in prompts.CANARIES:
        if cp.prompt == prompt:
            return f"The answer is {cp.expect}."
    return " ".join(f"word{i}" for i in range(16))


def _server(port: int) -> None:
    served = [0]

    async def chat(r: web.Request) -> web.StreamResponse:
        body = await r.json()
        words = _answer(str(body["messages"][-1]["content"])).split()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(r)
        for w in words:
            await resp.write(
                b"data: "
                + json.dumps(
                    {
                        "choices": [
                            {"index": 0, "delta": {"content": w + " "}, "finish_reason": None}
                        ]
                    }
                ).encode()
                + b"\n\n"
            )
        await resp.write(
            b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
        )
        await resp.write(
            b"data: "
            + json.dumps(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 12,
                        "completion_tokens": len(words),
                        "total_tokens": 12 + len(words),
                    },
                }
            ).encode()
            + b"\n\n"
        )
        await resp.write(b"data: [DONE]\n\n")
        served[0] += 1
        return resp

    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(text=_metrics_text(served[0]))

    app = web.Application()
    app.router.add_get("/health", lambda _r: web.Response(text=""))
    app.router.add_get("/version", lambda _r: web.json_response({"version": "0.24.0"}))
    app.router.add_get("/v1/models", lambda _r: web.json_response({"data": [{"id": MODEL}]}))
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _bare(url: str, hosts: int, seconds: float, interval: float, parallel: int) -> int:
    done = [0]

    async def stream(s: aiohttp.ClientSession, prompt: str) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 16,
            "stream": True,
        }
        async with s.post(url + "/v1/chat/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data:"):
                    pass

    async def host(sem: asyncio.Semaphore, end: float, i: int) -> None:
        n = 0
        while (tick := time.monotonic()) < end:
            async with sem, aiohttp.ClientSession() as s:
                await stream(s, prompts.CANARIES[n % len(prompts.CANARIES)].prompt)
                await stream(s, STREAM_PROMPT)
                async with s.get(url + "/metrics") as r:
                    await r.read()
            done[0] += 1
            n += 1
            await asyncio.sleep(max(0.0, min(tick + interval, end) - time.monotonic()))

    async def go() -> None:
        sem = asyncio.Semaphore(parallel)
        end = time.monotonic() + seconds
        await asyncio.gather(*(host(sem, end, i) for i in range(hosts)))

    asyncio.run(go())
    return done[0]


def _watch(
    url: str, hosts: int, seconds: float, interval: float, parallel: int, tmp: Path
) -> tuple[int, str]:
    cfg = load_config({}, profile="lab", served_model_names=(MODEL,))
    targets = [
        WatchTarget(SoakTarget(f"host-{i:03d}", url), cfg, tmp / f"h{i}", f"watch-{i}")
        for i in range(hosts)
    ]
    vs = run_watch(targets, WatchSettings(duration=seconds, interval=interval, parallel=parallel))
    outcomes = {v.outcome.value for v in vs}
    return sum(v.levels[0].requests // 2 for v in vs), ",".join(sorted(outcomes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--parallel", type=int, default=64)
    a = ap.parse_args()
    port = _free_port()
    srv = multiprocessing.Process(target=_server, args=(port,), daemon=True)
    srv.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.1)
    rows: list[dict[str, Any]] = []
    try:
        c0 = _cpu()
        n = _bare(url, a.hosts, a.seconds, a.interval, a.parallel)
        rows.append(
            {
                "client": "bare aiohttp",
                "host_intervals": n,
                "cpu_s": round(_cpu() - c0, 3),
                "outcomes": "-",
            }
        )
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with tempfile.TemporaryDirectory() as tmp:
            c0 = _cpu()
            n, outcomes = _watch(url, a.hosts, a.seconds, a.interval, a.parallel, Path(tmp))
            rows.append(
                {
                    "client": "fleetctl watch",
                    "host_intervals": n,
                    "cpu_s": round(_cpu() - c0, 3),
                    "outcomes": outcomes,
                }
            )
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finally:
        srv.terminate()
    for r in rows:
        r["cpu_ms_per_host_interval"] = round(1000 * r["cpu_s"] / max(1, r["host_intervals"]), 2)
    ratio = rows[1]["cpu_ms_per_host_interval"] / max(rows[0]["cpu_ms_per_host_interval"], 1e-9)
    print(f"{a.hosts} hosts, every {a.interval:g}s for {a.seconds:g}s, {a.parallel} at a time")
    print(
        f"{'client':<16} {'host-intervals':>14} {'CPU s':>8} {'CPU ms/host-interval':>21}  outcomes"
    )
    for r in rows:
        print(
            f"{r['client']:<16} {r['host_intervals']:>14} {r['cpu_s']:>8.2f} "
            f"{r['cpu_ms_per_host_interval']:>21.2f}  "
            f"{r['outcomes']}"
        )
    print(
        f"fleetctl / bare CPU per host-interval: {ratio:.2f}x; peak RSS grew "
        f"{(rss1 - rss0) / 1024:.1f} MiB "
        f"during the watch ({(rss1 - rss0) / max(1, a.hosts):.0f} KiB per host)"
    )
    out = Path(__file__).parent / "results" / "watch.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(a),
                "rows": rows,
                "ratio": round(ratio, 3),
                "rss_growth_kib": rss1 - rss0,
                "python": sys.version.split()[0],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
