"""fleetctl's all_reduce probe (fleetctl/allreduce_probe.py) run as two real processes on loopback.

The TCP path (no torch here): each rank a process, the ring's traffic between 127.0.0.1 and 127.0.0.2, the
head's table read by the same parser and check a rollout's preflight uses.
"""

from __future__ import annotations

import socket
import subprocess
import sys

from fleetctl import allreduce_probe, bandwidth, fabric
from fleetctl.inventory import Fabric, Unit

UNIT = Unit("pair-l", ("head", "worker"), {
    "head": Fabric(addresses=("127.0.0.1",)),
    "worker": Fabric(addresses=("127.0.0.2",)),
}, busbw_floor_gbs=1000.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_pair(*extra: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    port = str(free_port())
    common = ["--addrs", "127.0.0.1,127.0.0.2", "--port", port, "--max-bytes", str(4 << 20), "--tcp", *extra]
    worker = subprocess.Popen([sys.executable, "-c", bandwidth.probe_script(), "--rank", "1", *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    head = subprocess.run([sys.executable, "-c", bandwidth.probe_script(), "--rank", "0", *common],
                          capture_output=True, text=True, timeout=120)
    out, err = worker.communicate(timeout=120)
    return head, subprocess.CompletedProcess(worker.args, worker.returncode, out, err)


def test_two_ranks_measure_the_link_in_the_nccl_tests_table() -> None:
    head, worker = run_pair()
    assert head.returncode == 0 and worker.returncode == 0, (head.stderr, worker.stderr)
    assert head.stdout.startswith("# fleetctl all_reduce probe: TCP (no CUDA/NCCL in the image), 2 ranks")
    result = fabric.parse_all_reduce(head.stdout)
    assert [r[0] for r in result.rows] == [1 << 20, 4 << 20]
    assert result.wrong == 0 and result.peak_busbw_gbs > 0 and result.avg_busbw_gbs is not None
    assert {(a, b) for a, b, _ in result.links} == {("127.0.0.1", "127.0.0.2"), ("127.0.0.2", "127.0.0.1")}
    # below an impossible floor: the finding names the slowest link's sender, the figure and the floor
    found = fabric.check_bandwidth(UNIT, result)
    slowest = {"127.0.0.1": "head", "127.0.0.2": "worker"}[result.links[0][0]]
    assert [f.host for f in found] == [slowest]
    assert "expected at least 1000.0 (unit pair-l; the slowest link" in found[0].what


def test_a_rank_whose_peer_never_comes_says_so() -> None:
    port = str(free_port())
    # the join timeout is a minute: one second here
    r = subprocess.run([sys.executable, "-c",
                        "import sys; from fleetctl import allreduce_probe as p; p.JOIN_TIMEOUT = 1.0; "
                        "sys.exit(p.main(sys.argv[1:]))", "--rank", "0", "--addrs", "127.0.0.1,127.0.0.2",
                        "--port", port, "--tcp"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("rank 0 (127.0.0.1): "), r.stderr


def test_bus_bandwidth_is_nccl_tests_formula() -> None:
    assert allreduce_probe.bus_factor(2) == 1.0 and allreduce_probe.bus_factor(4) == 1.5
    line = allreduce_probe.row(1 << 30, 2, (0.05, 0), (0.04, 0))
    cols = line.split()
    assert len(cols) == 13 and cols[6] == "21.47" and cols[11] == "26.84"
