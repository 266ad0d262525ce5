"""False alarms of the known_good check: how often a healthy build fails against the known-good.

Starts the emulator on loopback, soaks it once (a first deploy: its reference set becomes the
known-good, in a SQLite ledger of a temp dir), then soaks ``--runs`` healthy builds that differ
from it as a new version does (another EMU_VERSION and EMU_SEED, so another acceptance sampling
and timing) against that set, and counts the runs whose known_good check is not a pass.
Each soak is the lab profile cut to seconds (levels 1 and 4, one class, no sustained phase).

    .venv/bin/python bench/known_good_false_alarms.py [--runs 5] [--scenario healthy] [--json F]

With ``--scenario degenerate`` the same count is the detection rate of the degenerate build.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleetctl.lab import models
from fleetctl.lab.scenarios import SCENARIOS
from fleetctl.soak import references
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import Against, run_soak
from fleetctl.soak.verdict import SoakTarget
from fleetctl.state import ledger as fleet_ledger

SERVED = ("qwen3.6-35b-a3b", "qwen3.6")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(root: Path, knobs: dict[str, str]) -> tuple[subprocess.Popen[bytes], SoakTarget]:
    port = _port()
    env = {**os.environ, "EMU_LOAD_SECONDS": "0.5", "EMU_SPEED": "8", **knobs}
    argv = [sys.executable, "-m", "fleetctl.lab.emulator", "serve", str(root / "body"), "--host",
            "127.0.0.1", "--port", str(port), "--served-model-name", *SERVED, "--max-num-seqs",
            "64", "--max-num-batched-tokens", "8192", "--speculative-config",
            json.dumps({"method": "dflash", "model": str(root / "drafter"),
                        "num_speculative_tokens": 4})]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return proc, SoakTarget("emulator", f"http://127.0.0.1:{port}", None, "")


def _cfg() -> Any:
    return load_config({"concurrency": [1, 4], "classes": ["coding"], "max_tokens": 32,
                        "readiness_timeout": 30, "checks": {"long_prompts": {"tokens": []}},
                        "sustained": {"duration": 0, "concurrency": 1, "window": 1}},
                       profile="lab", served_model_names=SERVED, speculative=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scenario", default="healthy", choices=sorted(SCENARIOS))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="known-good-"))
    models.write_model(root / "body", "qwen36-35b-a3b-nvfp4")
    models.write_model(root / "drafter", "qwen36-35b-a3b-dflash")
    led = fleet_ledger.open_ledger(root)
    key = references.key("bench")
    proc, t = _start(root, {})
    try:
        first = run_soak(dataclasses.replace(t, tag="known-good"), _cfg(), None, run_id="first")
    finally:
        proc.terminate()
    references.save(led, key, first, "bench")
    known = references.load(led, key)
    if known is None:
        print(f"the first soak recorded no set: {first.summary}")
        return 2
    rows = []
    for i in range(a.runs):
        knobs = {**SCENARIOS[a.scenario], "EMU_SEED": str(i + 1), "EMU_VERSION": f"0.24.{i + 1}"}
        proc, t = _start(root, knobs)
        t0 = time.monotonic()
        try:
            v = run_soak(
                dataclasses.replace(t, tag=f"run-{i + 1}"),
                _cfg(),
                Against(reference=known),
            )
        finally:
            proc.terminate()
        kg = v.check("known_good")
        rows.append({"run": i + 1, "soak": v.outcome.value, "known_good": kg.outcome.value,
                     "seconds": round(time.monotonic() - t0, 1), "message": kg.message[:200]})
        print(f"{i + 1}  soak {v.outcome.value:<12} known_good {kg.outcome.value:<12} "
              f"{rows[-1]['seconds']:>5}s  {kg.message[:60]}")
    alarms = sum(r["known_good"] != "pass" for r in rows)
    print(f"{a.scenario}: known_good not passed in {alarms} of {a.runs} runs")
    if a.json:
        a.json.write_text(json.dumps({"scenario": a.scenario, "runs": rows, "not_passed": alarms},
                                     indent=2))
    led.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
