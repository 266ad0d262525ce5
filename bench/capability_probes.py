"""What the gate's capability probes add to a soak on the lab emulator: requests and seconds.

Starts the emulator on loopback (one process, EMU_SPEED=1 as in the lab) with the heretic recipe's
served names and its tool and reasoning parsers, derives the plan from the lab inventory's recipe
(``fleetctl.soak.capabilities.derive``) and runs the probes as the soak does
(``probe_capabilities``), then judges them. Reports each capability's requests, seconds and
outcome.

    .venv/bin/python bench/capability_probes.py [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console

from _emulator import loopback_emulator  # bench/ is on sys.path when a bench runs
from _figures import write_figures
from fleetctl import paths
from fleetctl.recipes import parse_recipes
from fleetctl.soak import from_recipe
from fleetctl.soak.capabilities.exchange import CapabilityRun
from fleetctl.soak.capabilities.probes import probe_capabilities
from fleetctl.soak.checks.check import CheckContext
from fleetctl.soak.checks.evidence import Evidence
from fleetctl.soak.checks.registry import REGISTRY
from fleetctl.soak.client import Client
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.verdict import Outcome, Readiness

RECIPE = "qwen36-35b-heretic"
FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
         "--reasoning-parser", "qwen3"]


def main() -> int:
    """Run the probes once; print the figures and write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" /
                                          "capability_probes.json"))
    opts = ap.parse_args()
    con = Console()
    raw = yaml.safe_load((paths.project_root() / "inventory" / "lab" / "group_vars" / "all" /
                          "recipes.yml").read_text())["fleetctl_recipes"]
    recipe = parse_recipes({RECIPE: raw[RECIPE]}, "bench")[RECIPE]
    cfg = from_recipe(recipe, profile="lab")
    flags = ["--served-model-name", *recipe.served_model_names, *FLAGS]
    with loopback_emulator(flags, {"EMU_LOAD_SECONDS": "0.2", "EMU_SPEED": "1"}) as url:
        t0 = time.monotonic()
        runs = asyncio.run(_probe(url, cfg))
        wall = time.monotonic() - t0
    ev = Evidence(readiness=Readiness(Outcome.PASS, "ready", 0.0), capabilities=runs)
    ctx = CheckContext(ev, cfg)
    figures: dict[str, object] = {"recipe": RECIPE, "profile": "lab", "emu_speed": 1,
                                  "wall_s": round(wall, 2)}
    for run in runs:
        result = REGISTRY.get(run.name).evaluate(cfg.check(run.name), ctx)
        figures[run.name] = {"requests": run.requests, "seconds": round(run.seconds, 2),
                             "outcome": str(result.outcome)}
        con.print(f"{run.name:13} {run.requests:2} request(s) {run.seconds:6.2f} s  "
                  f"{result.outcome}")
    total = sum(r.requests for r in runs)
    con.print(f"capability probes: {total} requests in {wall:.1f} s on the emulator at "
              f"EMU_SPEED=1")
    figures["requests"] = total
    write_figures(con, opts.json, figures)
    return 0


async def _probe(url: str, cfg: SoakConfig) -> tuple[CapabilityRun, ...]:
    async with Client(url, request_timeout=120.0) as c:
        return await probe_capabilities(c, cfg.plan, cfg.served_model_names[0], 120.0,
                                        lambda _p, _m: None)


if __name__ == "__main__":
    sys.exit(main())
