"""How well the vLLM emulator holds its performance model under concurrency, and what it costs in
CPU.

Starts the emulator on loopback (one process, EMU_SPEED=1) and, per concurrency level, runs that
many streaming chat requests of one prompt class at once; reports aggregate tok/s against what
:mod:`fleetctl.lab.emulator.perf` predicts (a ratio, so machines compare), TTFT p50 and the
emulator's CPU use. A ratio near 1.0 at c=64/128 means one core keeps up with the streams.

    .venv/bin/python bench/bench_emulator.py [--levels 1,8,32,64,128] [--tokens 256] [--json
    out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from fleetctl.lab import models
from fleetctl.lab.emulator import perf


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _level(url: str, n: int, tokens: int, cls: str) -> dict[str, float]:
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=n + 4)
    ) as http:

        async def one(i: int) -> tuple[float, int]:
            start = time.monotonic()
            ttft = float("nan")
            used = 0
            body = {
                "messages": [{"role": "user", "content": f"Request {i}"}],
                "max_tokens": tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "emu_prompt_class": cls,
                "chat_template_kwargs": {"enable_thinking": False},
                "temperature": 0,
            }
            async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    obj = json.loads(line[6:])
                    if obj.get("usage"):
                        used = obj["usage"]["completion_tokens"]
                    elif (
                        obj["choices"]
                        and obj["choices"][0]["delta"].get("content")
                        and ttft != ttft
                    ):
                        ttft = time.monotonic() - start
            return ttft, used

        start = time.monotonic()
        results = await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.monotonic() - start
    return {
        "wall_s": wall,
        "tokens": sum(r[1] for r in results),
        "ttft_p50_s": statistics.median(r[0] for r in results),
    }


def main() -> int:
    """Run the benchmark; print a table and write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,8,32,64,128")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--cls", default="coding")
    ap.add_argument("--json", default="bench-emulator.json")
    opts = ap.parse_args()
    levels = [int(x) for x in opts.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        body = models.write_model(Path(tmp) / "body", "qwen36-35b-a3b-nvfp4")
        drafter = models.write_model(Path(tmp) / "drafter", "qwen36-35b-a3b-dflash")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        spec = json.dumps({"method": "dflash", "model": str(drafter), "num_speculative_tokens": 11})
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetctl.lab.emulator",
                "serve",
                str(body),
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                "--speculative-config",
                spec,
                "--max-num-seqs",
                "256",
                "--max-num-batched-tokens",
                "32768",
            ],
            env={**os.environ, "EMU_LOAD_SECONDS": "0.2", "EMU_SPEED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            rows: list[dict[str, Any]] = []
            profile = perf.PROFILES[perf.PromptClass(opts.cls)]
            for n in levels:
                cpu0 = _cpu_seconds(proc.pid)
                got = asyncio.run(_level(url, n, opts.tokens, opts.cls))
                cpu = _cpu_seconds(proc.pid) - cpu0
                agg = got["tokens"] / got["wall_s"]
                rows.append(
                    {
                        "concurrency": n,
                        "agg_tok_s": agg,
                        "model_agg_tok_s": perf.aggregate_tok_s(profile, n),
                        "ratio": agg / perf.aggregate_tok_s(profile, n),
                        "ttft_p50_ms": got["ttft_p50_s"] * 1000,
                        "emulator_cpu_pct": 100 * cpu / got["wall_s"],
                    }
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    print(
        f"{'c':>5} {'agg tok/s':>10} {'model':>8} {'ratio':>6} {'TTFT p50 ms':>12} "
        f"{'emu CPU %':>10}"
    )
    for r in rows:
        print(
            f"{r['concurrency']:>5} {r['agg_tok_s']:>10.1f} {r['model_agg_tok_s']:>8.1f} "
            f"{r['ratio']:>6.2f} "
            f"{r['ttft_p50_ms']:>12.0f} {r['emulator_cpu_pct']:>10.1f}"
        )
    Path(opts.json).write_text(
        json.dumps({"class": opts.cls, "tokens": opts.tokens, "rows": rows}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
