"""A rollout's prefetch on the lab: every node pulling a new image from the registry, against the
image tree.

In one run, with one fresh image (the lab's python base plus a layer of ``--mb`` MB of random
bytes, a new tag each repeat so no node has it) and the registry's uplink shaped to
``--registry-mbit`` (tc tbf on the lab bridge's egress on this machine: what the lab registry sends
to the nodes) and every node's uplink to ``--uplink-mbit`` (tc tbf on its eth0: a relay's upload),
two cases:

- ``registry``: every node pulls the image from the registry at once (the prefetch without the
tree);
- ``tree``: ``fleetctl.rollout.imagetree`` (the seed through its relay, then rounds of
``--fanout``).

Per case: wall seconds until every node holds the image under its deploy reference, and the bytes
of the new layer the registry sent (its access log: the bytes of each GET of that blob). Ratios of
the same run, medians of ``--repeats``: tree / registry wall, and registry bytes. On a real fleet
the registry's uplink is shared by every Spark and a Spark's own is 10 GbE; on the lab both are
shaped so that the network, not the shared CPU, is the bottleneck.

    FLEETCTL_LAB_DIR=... .venv/bin/python bench/image_tree.py [--mb 64] [--registry-mbit 200] \\
        [--uplink-mbit 200] [--repeats 3]

Needs a lab that is up (4 nodes or more). Prints a table and writes bench/results/image_tree.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controller"))
from _figures import write_figures
from fleetctl import inventory, registry, ssh
from fleetctl import lab as fleetlab
from fleetctl.lab import layout
from fleetctl.rollout import host as remote
from fleetctl.rollout import imagetree
from stage_tree import _shape, running_nodes


def _shape_registry(mbit: int | None) -> None:
    """The lab registry's egress toward the nodes (the bridge device on this machine) at ``mbit``,
    or unshaped."""
    dev = layout.current().bridge
    subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
    if mbit:
        r = subprocess.run(
            [
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{mbit}mbit",
                "burst",
                "256kb",
                "latency",
                "50ms",
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise SystemExit(f"tc on {dev} failed: {r.stderr.strip()}")


def _fresh(mb: int, mirrors: dict[str, str]) -> tuple[str, str, int]:
    """A new tag with ``mb`` MB of its own: (deploy reference, that layer's digest, its size as
    pulled)."""
    tmp = Path(tempfile.mkdtemp(prefix="image-tree-"))
    try:
        (tmp / "blob.bin").write_bytes(os.urandom(mb << 20))
        tag = f"bench-tree-{os.urandom(4).hex()}"
        fleetlab.add_image(tag, from_dir=tmp, cmd=["/bin/true"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    image = f"ghcr.io/{fleetlab.images.VLLM_REPOSITORY}"
    digest = registry.resolve(image, tag, mirrors).digest
    layers = registry.layer_sizes(image, digest, mirrors)[0]
    blob, size = max(layers.items(), key=lambda kv: kv[1])
    return registry.pull_ref(image, digest, mirrors), blob, size


def _blob_bytes(blob: str) -> int:
    """Bytes of ``blob`` the lab registry's log shows it sent (a fetch its client hung up on counts
    what went)."""
    log = layout.current().log_dir / "registry.log"
    pat = re.compile(r"\"GET /v2/\S+/blobs/" + re.escape(blob) + r" HTTP/1\.1\" 200 (\d+) ")
    return sum(
        int(m.group(1))
        for line in log.read_text(errors="replace").splitlines()
        if (m := pat.search(line))
    )


def _forget(hosts: list[inventory.Host], ref: str) -> None:
    ssh.fan_out(
        hosts,
        lambda h: ssh.docker(
            h,
            f"docker image rm -f {ref} >/dev/null 2>&1; "
            f"docker rm -f {imagetree.RELAY_NAME} >/dev/null 2>&1; true",
            timeout=120,
        ),
        timeout=180,
    )


def _direct(hosts: list[inventory.Host], ref: str) -> dict[str, str | None]:
    outs = ssh.fan_out(hosts, lambda h: remote.pull(h, ref), timeout=None)
    bad = {n: o.error for n, o in outs.items() if o.error is not None}
    if bad:
        raise SystemExit(f"direct pulls failed: {bad}")
    return {h.name: None for h in hosts}


def _tree(hosts: list[inventory.Host], ref: str, relay: str, fanout: int) -> dict[str, str | None]:
    origin = registry.endpoint(
        registry.ImageName.parse(ref).registry,
        {registry.ImageName.parse(ref).registry: registry.ImageName.parse(ref).registry},
    ).base
    cfg = imagetree.TreeConfig(min_hosts=1, fanout=fanout)
    tree = imagetree.Tree(cfg, imagetree.Source(ref, origin, relay),
                          imagetree.Hands(ops=remote.SshHostOps,
                                          pull=lambda h, r: remote.pull(h, r),
                                          direct=lambda h, r: remote.pull(h, r),
                                          emit=lambda kind, msg, host: None))
    got = tree.run(hosts)
    bad = {n: o.error for n, o in got.items() if o.error is not None}
    if bad:
        raise SystemExit(f"tree pulls failed: {bad}")
    return {n: o.value.via if o.value else None for n, o in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="size of the image's own layer in MB")
    ap.add_argument(
        "--registry-mbit",
        type=int,
        default=200,
        help="the registry's uplink in Mbit/s (0: unshaped)",
    )
    ap.add_argument(
        "--uplink-mbit", type=int, default=200, help="each node's uplink in Mbit/s (0: unshaped)"
    )
    ap.add_argument("--fanout", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "image_tree.json"))
    args = ap.parse_args()
    con = Console(width=80)
    nodes = running_nodes()
    inv = inventory.load(None)
    hosts = [inv.host(n) for n in nodes]
    mirrors = {str(k): str(v) for k, v in (inv.vars.get("fleetctl_registry_mirrors") or {}).items()}
    relay = registry.pull_ref(
        "docker.io/library/registry",
        registry.resolve("docker.io/library/registry", "2", mirrors).digest,
        mirrors,
    )
    runs: dict[str, list[dict[str, Any]]] = {"registry": [], "tree": []}
    size = 0
    try:
        _shape(nodes, args.uplink_mbit or None)
        _shape_registry(args.registry_mbit or None)
        for _ in range(args.repeats):
            for case in ("registry", "tree"):
                ref, blob, size = _fresh(args.mb, mirrors)
                before = _blob_bytes(blob)
                t0 = time.monotonic()
                via = (
                    _direct(hosts, ref)
                    if case == "registry"
                    else _tree(hosts, ref, relay, args.fanout)
                )
                wall = time.monotonic() - t0
                sent = _blob_bytes(blob) - before
                runs[case].append(
                    {"wall_s": round(wall, 1), "registry_mb": round(sent / 1e6, 1), "via": via}
                )
                _forget(hosts, ref)
    finally:
        _shape(nodes, None)
        _shape_registry(None)
        ssh.close_all()
    med = {c: statistics.median(x["wall_s"] for x in rs) for c, rs in runs.items()}
    mb = {c: statistics.median(x["registry_mb"] for x in rs) for c, rs in runs.items()}
    table = Table(
        title=f"{len(nodes)} nodes, layer {size / 1e6:.0f} MB, registry "
              f"{args.registry_mbit or '-'} "
        f"Mbit/s, uplinks {args.uplink_mbit or '-'}, median of {args.repeats}"
    )
    for col in ("case", "wall s", "registry MB", "rounds"):
        table.add_column(col, justify="left" if col == "case" else "right")
    table.add_row("registry", f"{med['registry']:.1f}", f"{mb['registry']:.0f}", "1")
    table.add_row(f"tree (fanout {args.fanout})", f"{med['tree']:.1f}", f"{mb['tree']:.0f}",
                  str(imagetree.rounds_for(len(nodes), args.fanout) + 1))
    con.print(table)
    figures = {
        "nodes": len(nodes),
        "layer_bytes": size,
        "registry_mbit": args.registry_mbit,
        "uplink_mbit": args.uplink_mbit,
        "fanout": args.fanout,
        "repeats": args.repeats,
        "runs": runs,
        "median_wall_s": med,
        "median_registry_mb": mb,
        "tree_over_registry_wall": round(med["tree"] / med["registry"], 2),
        "tree_over_registry_bytes": round(mb["tree"] / mb["registry"], 2)
        if mb["registry"]
        else None,
    }
    con.print(f"tree / registry: wall {figures['tree_over_registry_wall']}x, "
              f"bytes from the registry {figures['tree_over_registry_bytes']}x")
    write_figures(con, args.out, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
