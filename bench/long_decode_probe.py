"""What the soak's deep long-decode probe costs on the lab emulator, and what judging it costs the
controller.

Starts the emulator on loopback (one process, EMU_SPEED=1, as in the lab) and runs the probe as
the soak does (``fleetctl.soak.client.Client.chat`` with the probe's prompt, ``ignore_eos``, its
text and delta boundaries kept), then cuts and checks its windows (``answers.long_decode_windows``,
U+FFFD, garbage, loops). Reports the decode's wall seconds and tok/s, and the controller CPU
milliseconds of the window checks.

    .venv/bin/python bench/long_decode_probe.py [--tokens 256] [--window 64] [--json out.json]

The lab profile's probe is 256 tokens in windows of 64; the spark profile's, 16384 in windows of
2048 (on a Spark at 41-124 tok/s single stream: 2.2-6.7 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from rich.console import Console

from _emulator import loopback_emulator  # bench/ is on sys.path when a bench runs
from _figures import write_figures
from fleetctl.soak import prompts
from fleetctl.soak.checks.answers import long_decode_windows
from fleetctl.soak.checks.judge import garbage
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.loops import find_loop


async def _probe(url: str, tokens: int) -> tuple[float, int, str, tuple[int, ...]]:
    async with Client(url, request_timeout=max(600.0, tokens / 5)) as c:
        t0 = time.monotonic()
        s = await c.chat(
            ChatRequest(
                    "qwen36-fast",
                    prompts.LONG_DECODE_PROMPT,
                    tokens,
                    0.0,
                    thinking=False,
                    ignore_eos=True,
                ),
            SampleTag("long_decode", "prose", 1, t0),
            keep_text=True,
            delta_ends=True,
        )
        if not s.ok:
            raise SystemExit(f"the probe failed: {s.error}")
        return time.monotonic() - t0, s.output_tokens or 0, s.text or "", s.delta_ends


def main() -> int:
    """Run the probe once; print the figures and write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument(
        "--json", default=str(Path(__file__).parent / "results" / "long_decode_probe.json")
    )
    opts = ap.parse_args()
    con = Console()
    flags = ["--served-model-name", "qwen36-fast", "--max-model-len", "262144"]
    with loopback_emulator(flags, {"EMU_LOAD_SECONDS": "0.2", "EMU_SPEED": "1"}) as url:
        wall, got, text, ends = asyncio.run(_probe(url, opts.tokens))
    cpu0 = time.process_time()
    windows = long_decode_windows(text, got, opts.window, ends)
    for _a, _b, win in windows:
        win.count("\ufffd")
        garbage(win)
        find_loop(win)
    judge_ms = (time.process_time() - cpu0) * 1000
    figures = {
        "tokens": got,
        "window_tokens": opts.window,
        "windows": len(windows),
        "decode_s": round(wall, 2),
        "tok_s": round(got / wall, 1) if wall else None,
        "judge_cpu_ms": round(judge_ms, 2),
        "emu_speed": 1,
    }
    con.print(
        f"long-decode probe: {got} tokens in {wall:.1f} s ({got / wall:.0f} tok/s) on the emulator "
        f"at EMU_SPEED=1; {len(windows)} windows judged in {judge_ms:.1f} ms of controller CPU"
    )
    write_figures(con, opts.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
