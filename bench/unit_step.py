"""A unit's rollout step against a single host's, with the same soak (issue 16: goal <= 1.2x).

Run on a lab with a unit (``fleetctl lab up --nodes 4 --units 1``), every node provisioned, the
pair's weights staged on the unit (``fleetctl stage --recipe qwen35-35b-bf16-pair --limit
<members>``) and the single-node recipe's on the single host (``fleetctl stage --recipe
qwen35-35b-bf16 --limit spark-01``); FLEETCTL_LAB_DIR etc. set and ``eval "$(fleetctl lab env)"``::

    .venv/bin/python bench/unit_step.py [--rounds 3] [--soak 3] [--json
    bench/results/unit_step.json]

Both serve the same image (vllm/vllm-openai) from the same weights: the single host the one-node
recipe qwen35-35b-bf16, the unit its two-node qwen35-35b-bf16-pair. Each round rolls the single host
and then the unit from one tag to the other (cu130-nightly <-> unit-v2, pushed here if missing; the
tags are already on every node after the first round, so no pull is timed). The step's time is the
rollout's one wave (stop, start, readiness, soak, known-good), read from
``RolloutResult.wave_seconds``; the whole
command's time is reported beside it. Ratio = unit / single, medians of the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.lab.scenarios import STOCK_REPOSITORY
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options

SINGLE_RECIPE, UNIT_RECIPE = "qwen35-35b-bf16", "qwen35-35b-bf16-pair"
TAGS = ("cu130-nightly", "unit-v2")


def roll(tag: str, recipe: str, limit: str, soak: float) -> tuple[float, float]:
    """(wave seconds, whole command seconds) of one rollout; raises when it did not complete."""
    eng = Engine(inventory.load(None))
    try:
        # The single host serves the one-node recipe here, not the fleet's: a named switch (the
        # first round; then it serves that recipe already).
        r = eng.rollout(Options(tag=tag, recipe=recipe, limit=limit, soak=soak,
                                max_unavailable="100%", switch_model=True))
    finally:
        eng.close()
        ssh.close_all()
    if r.status not in ("completed",):
        raise SystemExit(f"rollout of {tag} ({recipe}) to {limit} ended {r.status}: {r.error}")
    return sum(r.wave_seconds), r.seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--soak", type=float, default=3.0, help="sustained soak seconds (both)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    con = Console(width=80)
    st = fleetlab.status()
    if not st.units:
        raise SystemExit("the lab has no unit: `fleetctl lab up --nodes 4 --units 1`")
    members = next(iter(st.units.values()))
    inv = inventory.load(None)
    single = next(n for n in inv.hosts if inv.unit_of(n) is None)
    if "unit-v2" not in " ".join(st.images):
        fleetlab.add_image(
            "unit-v2",
            {"EMU_VERSION": "0.25.1", "EMU_LOAD_SECONDS": "3"},
            repository=STOCK_REPOSITORY,
            cmd=["vllm", "serve"],
        )
    # both on the first tag (not measured), so that every measured round is a change of version
    roll(TAGS[0], SINGLE_RECIPE, single, a.soak)
    roll(TAGS[0], UNIT_RECIPE, ",".join(members), a.soak)
    rows: list[dict[str, Any]] = []
    for i in range(a.rounds):
        tag = TAGS[(i + 1) % 2]
        s_wave, s_total = roll(tag, SINGLE_RECIPE, single, a.soak)
        u_wave, u_total = roll(tag, UNIT_RECIPE, ",".join(members), a.soak)
        rows.append(
            {
                "round": i + 1,
                "tag": tag,
                "single_step_s": round(s_wave, 2),
                "unit_step_s": round(u_wave, 2),
                "single_total_s": round(s_total, 2),
                "unit_total_s": round(u_total, 2),
                "ratio": round(u_wave / s_wave, 3),
            }
        )
        con.print(
            f"round {i + 1}: single {s_wave:.1f}s, unit {u_wave:.1f}s, ratio {u_wave / s_wave:.2f}"
        )
    med = {k: statistics.median(r[k] for r in rows) for k in
           ("single_step_s", "unit_step_s", "single_total_s", "unit_total_s", "ratio")}
    t = Table(
        "",
        "single host",
        "unit of 2",
        title=f"rollout step, soak {a.soak:.0f}s, median of {a.rounds}",
    )
    t.add_row("step (wave)", f"{med['single_step_s']:.1f}s", f"{med['unit_step_s']:.1f}s")
    t.add_row("whole command", f"{med['single_total_s']:.1f}s", f"{med['unit_total_s']:.1f}s")
    t.add_row("ratio unit/single", "", f"{med['ratio']:.2f} (goal <= 1.2)")
    con.print(t)
    if a.json:
        write_figures(
            con,
            a.json,
            {
                "soak_s": a.soak,
                "single": single,
                "unit": list(members),
                "rounds": rows,
                "median": med,
                "goal_ratio": 1.2,
            },
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
