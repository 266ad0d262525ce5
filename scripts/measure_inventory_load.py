"""Inventory load time: ansible-core in-process (what inventory.load does) vs `ansible-inventory --list`.

Run::  .venv/bin/python scripts/measure_inventory_load.py [--repeat 5] [--lab PATH]

Sources: the lab's inventory (if up) and a generated 256-host YAML inventory (16 racks as
nested groups, group_vars/ and host_vars/ beside it). Medians over --repeat loads, each in a
fresh state (the subprocess path pays the interpreter start-up every time, which is the point:
it is what a controller calling the CLI pays). The subprocess figure does not yet include
building Host objects, so it flatters the subprocess path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleetctl import inventory, paths


def generate(root: Path, n: int = 256, racks: int = 16) -> Path:
    lines = ["all:", "  vars: {ansible_user: root}", "  children:", "    sparks:", "      children:"]
    for r in range(racks):
        lines += [f"        rack{r:02d}:", "          hosts:"]
        for i in range(r * n // racks, (r + 1) * n // racks):
            lines.append(f"            spark-{i:03d}: {{ansible_host: 10.{i // 250}.{i % 250}.1}}")
    (root / "group_vars").mkdir()
    (root / "group_vars" / "rack03.yml").write_text("fleetctl_recipe: small\n")
    (root / "host_vars").mkdir()
    (root / "host_vars" / "spark-007.yml").write_text("ansible_port: 2222\n")
    src = root / "hosts.yml"
    src.write_text("\n".join(lines) + "\n")
    return src


def median_s(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--lab", default=str(paths.lab_inventory()))
    a = ap.parse_args()
    exe = str(Path(sys.executable).with_name("ansible-inventory"))
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"256 hosts": generate(Path(tmp))}
        if Path(a.lab).exists():
            sources = {"lab": Path(a.lab), **sources}
        inventory.load(next(iter(sources.values())))  # imports ansible once, as a running controller has
        rows = {}
        for name, src in sources.items():
            inproc = median_s(lambda src=src: inventory.load(src), a.repeat)
            sub = median_s(lambda src=src: json.loads(subprocess.run([exe, "-i", str(src), "--list"],
                                                                    capture_output=True, check=True).stdout), a.repeat)
            rows[name] = {"hosts": len(inventory.load(src).hosts), "in_process_s": round(inproc, 3),
                          "subprocess_s": round(sub, 3), "ratio": round(sub / inproc, 1)}
    print(f"{'source':<10} {'hosts':>5} {'in-process':>11} {'subprocess':>11} {'ratio':>6}")
    for name, r in rows.items():
        print(f"{name:<10} {r['hosts']:>5} {r['in_process_s']:>10.3f}s {r['subprocess_s']:>10.3f}s {r['ratio']:>5}x")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
