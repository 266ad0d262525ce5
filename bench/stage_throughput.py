"""Staging throughput on the lab: the seed fan-out against the controller relaying to each host.

In one run, with the same weight set (one body of ``--mb`` MB, written with fleetctl.lab.models):

- ``mirror fan-out``: ``fleetctl stage`` to every node from the lab's weights mirror: the seed
  fetches over HTTP (sha256 as it streams), the others rsync from the seed over the LAN;
- ``controller relay``: source ``local``, the controller rsyncs the set to one node (what a
  controller-as-hub fan-out would do once per host).

Reported per phase: MB/s of the seed's fetch, of each receiver's rsync (from the run's Ansible job
events), of the controller's push, and the fan-out's wall time. The ratio that matters is the
fan-out wall time against (controller push time x number of hosts).

    FLEETCTL_LAB_DIR=... .venv/bin/python bench/stage_throughput.py [--mb 256]

Needs a lab that is up (`fleetctl lab up`). Prints a table and writes
bench/results/stage_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controller"))
from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.lab import models
from fleetctl.stage import stage

REPO = "fleetctl-bench/body"
PATH = "/opt/fleetctl-bench/body"


def _recipe(revision: str) -> dict[str, Any]:
    return {
        "image": "vllm/vllm-openai",
        "served_model_names": ["bench"],
        "weights": [
            {
                "role": "body",
                "repo": REPO,
                "revision": revision,
                "path": PATH,
                "mount": "/model",
                "format": "bf16",
            }
        ],
        "vllm_args": ["--max-model-len", "4096"],
    }


def _task_durations(artifacts: Path, task: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for f in (artifacts / "job_events").glob("*.json"):
        ev = json.loads(f.read_text())
        data = ev.get("event_data") or {}
        if ev.get("event") == "runner_on_ok" and data.get("task") == task and data.get("duration"):
            out[str(data["host"])] = float(data["duration"])
    return out


def bench_set(st: fleetlab.LabStatus, mb: int) -> tuple[inventory.Inventory, int, Path]:
    """A body of ``mb`` MB on the lab's mirror, and a copy of the lab's inventory whose recipe
    stages it.

    Returns (the inventory, the set's bytes, a temporary directory for the caller to remove)."""
    mirror = Path(st.directory) / "www" / "weights"
    rev = f"mb{mb}"
    target = mirror / REPO / rev
    tmp = Path(tempfile.mkdtemp(prefix="stage-bench-"))
    if (target / "manifest.json").exists():
        manifest = json.loads((target / "manifest.json").read_text())
    else:
        models.write_model(tmp / "m", "qwen35-35b-a3b-bf16", size_bytes=mb * 1_000_000)
        manifest = models.manifest_for(
            tmp / "m", repo=REPO, revision=rev, revision_date="2026-07-01"
        )
        (tmp / "m" / "manifest.json").write_text(json.dumps(manifest))
        shutil.copytree(tmp / "m", target)
    size = sum(int(f["size"]) for f in manifest["files"])
    inv_dir = tmp / "inv"
    shutil.copytree(Path(st.inventory).parent, inv_dir)
    (inv_dir / "group_vars" / "all" / "recipes.yml").write_text(
        yaml.safe_dump({"fleetctl_recipe": "bench", "fleetctl_recipes": {"bench": _recipe(rev)}}))
    return inventory.load(inv_dir / "hosts.yml"), size, tmp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="size of the body in MB")
    ap.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "stage_throughput.json")
    )
    args = ap.parse_args()
    st = fleetlab.status()
    if not st.up:
        print("the lab is not up: run `fleetctl lab up` first", file=sys.stderr)
        return 2
    nodes = [n.name for n in st.nodes if n.state == "running"]
    mirror = Path(st.directory) / "www" / "weights"
    target = mirror / REPO / f"mb{args.mb}"
    inv, size, tmp = bench_set(st, args.mb)
    clean = "rm -rf /opt/fleetctl-bench"
    rows: list[dict[str, Any]] = []
    try:
        ssh.fan_out([inv.host(n) for n in nodes], lambda h: ssh.run(h, clean, timeout=60))
        t0 = time.monotonic()
        fan = stage(inv, "bench", limit=",".join(nodes))
        fan_wall = time.monotonic() - t0
        assert fan.ok, [h.message for h in fan.hosts.values()]
        rsyncs = {h.name: h.seconds for h in fan.hosts.values() if not h.seed and h.seconds}
        rows.append(
            {
                "phase": "seed fetch (HTTP from mirror)",
                "host": fan.seed,
                "seconds": fan.fetch_seconds,
                "mb_per_s": size / 1e6 / fan.fetch_seconds,
            }
        )
        for host, secs in sorted(rsyncs.items()):
            rows.append(
                {
                    "phase": "rsync from its source (LAN)",
                    "host": host,
                    "seconds": secs,
                    "mb_per_s": size / 1e6 / secs,
                }
            )
        rows.append(
            {
                "phase": f"fan-out wall ({len(nodes)} hosts, fleetctl stage)",
                "host": "-",
                "seconds": fan_wall,
                "mb_per_s": size * len(nodes) / 1e6 / fan_wall,
            }
        )

        one = nodes[-1]
        ssh.run(inv.host(one), clean, timeout=60)
        t0 = time.monotonic()
        relay = stage(inv, "bench", limit=one, source="local", local_dir=mirror)
        relay_wall = time.monotonic() - t0
        assert relay.ok, relay.hosts[one].message
        push = _task_durations(
            relay.artifacts_dir,
            "Push each weight set from the controller to the seed host with rsync",
        )
        secs = push.get(one, relay_wall)
        rows.append(
            {
                "phase": "controller push (rsync)",
                "host": one,
                "seconds": secs,
                "mb_per_s": size / 1e6 / secs,
            }
        )
        rows.append({"phase": "controller relay wall, 1 host", "host": one, "seconds": relay_wall,
                     "mb_per_s": size / 1e6 / relay_wall})
    finally:
        ssh.fan_out([inv.host(n) for n in nodes], lambda h: ssh.run(h, clean, timeout=60))
        ssh.close_all()
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"weight set: {size / 1e6:.0f} MB, {len(nodes)} nodes")
    print(f"{'phase':48} {'host':10} {'seconds':>8} {'MB/s':>8}")
    for r in rows:
        print(f"{r['phase']:48} {r['host'] or '-':10} {r['seconds']:8.2f} {r['mb_per_s']:8.1f}")
    ratio = fan_wall / (relay_wall * len(nodes))
    print(f"fan-out wall / (controller relay wall x {len(nodes)} hosts) = {ratio:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"size_bytes": size, "nodes": nodes, "rows": rows, "fanout_vs_relay": ratio}, indent=2
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
