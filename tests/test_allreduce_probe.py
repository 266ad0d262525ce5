"""fleetctl's all_reduce probe (fleetctl/allreduce_probe.py).

The TCP path (no torch here): each rank a process, the ring's traffic between 127.0.0.1 and
127.0.0.2 (or two ranks on one address), the head's table read by the same parser and check a
rollout's preflight uses. The NCCL path: its ranks as threads over a stand-in of torch
(tests/fake_torch.py), and the tables it printed on a real host of two NVIDIA GPUs
(tests/fixtures/gpu/).
"""

from __future__ import annotations

import contextlib
import io
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetctl import allreduce_probe, bandwidth, fabric
from fleetctl.inventory import Fabric, Unit
from tests.fake_torch import FakeTorch

GPU = Path(__file__).parent / "fixtures" / "gpu"
ONE_HOST = "127.0.0.1,127.0.0.1"
TWO_HOSTS = "127.0.0.1,127.0.0.2"

UNIT = Unit("pair-l", ("head", "worker"), {
    "head": Fabric(addresses=("127.0.0.1",)),
    "worker": Fabric(addresses=("127.0.0.2",)),
}, busbw_floor_gbs=1000.0)


def free_port(span: int = 1) -> int:
    """A port P free on 127.0.0.1 with the ``span - 1`` after it free too (ranks sharing one
    address listen on P + their position: a neighbour taken by another test was a flaky
    ``Address already in use``)."""
    for _ in range(50):
        with contextlib.ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            try:
                for k in range(1, span):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port + k))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no {span} free consecutive ports on 127.0.0.1")


def run_pair(*extra: str, addrs: str = "127.0.0.1,127.0.0.2",
             ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    port = str(free_port(span=2))
    common = ["--addrs", addrs, "--port", port, "--max-bytes", str(4 << 20), "--tcp", *extra]
    worker = subprocess.Popen(
        [sys.executable, "-c", bandwidth.probe_script(), "--rank", "1", *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    head = subprocess.run([sys.executable, "-c", bandwidth.probe_script(), "--rank", "0", *common],
                          capture_output=True, text=True, timeout=120)
    out, err = worker.communicate(timeout=120)
    return head, subprocess.CompletedProcess(worker.args, worker.returncode, out, err)


def test_two_ranks_measure_the_link_in_the_nccl_tests_table() -> None:
    head, worker = run_pair()
    assert head.returncode == 0 and worker.returncode == 0, (head.stderr, worker.stderr)
    assert head.stdout.startswith(
        "# fleetctl all_reduce probe: TCP (no CUDA/NCCL in the image), 2 ranks"
    )
    result = fabric.parse_all_reduce(head.stdout)
    assert [r[0] for r in result.rows] == [1 << 20, 4 << 20]
    assert result.wrong == 0 and result.peak_busbw_gbs > 0 and result.avg_busbw_gbs is not None
    assert {(a, b) for a, b, _ in result.links} == {
        ("127.0.0.1", "127.0.0.2"),
        ("127.0.0.2", "127.0.0.1"),
    }
    # below an impossible floor: the finding names the slowest link's sender, the figure and the
    # floor
    found = fabric.check_bandwidth(UNIT, result)
    slowest = {"127.0.0.1": "head", "127.0.0.2": "worker"}[result.links[0][0]]
    assert [f.host for f in found] == [slowest]
    assert "expected at least 1000.0 (unit pair-l; the slowest link" in found[0].what


def test_a_rank_whose_peer_never_comes_says_so() -> None:
    port = str(free_port())
    # the join timeout is a minute: one second here
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from fleetctl import allreduce_probe as p; p.JOIN_TIMEOUT = 1.0; "
            "sys.exit(p.main(sys.argv[1:]))",
            "--rank",
            "0",
            "--addrs",
            "127.0.0.1,127.0.0.2",
            "--port",
            port,
            "--tcp",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("rank 0 (127.0.0.1): "), r.stderr


def test_bus_bandwidth_is_nccl_tests_formula() -> None:
    assert allreduce_probe.bus_factor(2) == 1.0 and allreduce_probe.bus_factor(4) == 1.5
    line = allreduce_probe.row(1 << 30, 2, (0.05, 0), (0.04, 0))
    cols = line.split()
    assert len(cols) == 13 and cols[6] == "21.47" and cols[11] == "26.84"


def test_two_tcp_ranks_on_one_address_each_listen_on_their_own_port() -> None:
    head, worker = run_pair(addrs=ONE_HOST)
    assert head.returncode == 0 and worker.returncode == 0, (head.stderr, worker.stderr)
    assert [r[0] for r in fabric.parse_all_reduce(head.stdout).rows] == [1 << 20, 4 << 20]


def test_tcp_ranks_on_opposite_sides_of_the_budget_end_on_rank_0s_size() -> None:
    port = str(free_port())
    common = [
        "--addrs",
        "127.0.0.1,127.0.0.2",
        "--port",
        port,
        "--max-bytes",
        str(4 << 20),
        "--tcp",
    ]
    probe = [sys.executable, "-c", bandwidth.probe_script()]
    worker = subprocess.Popen([*probe, "--rank", "1", *common, "--budget", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    head = subprocess.run([*probe, "--rank", "0", *common, "--budget", "1000"], capture_output=True,
                          text=True, timeout=120)
    _, err = worker.communicate(timeout=120)
    assert head.returncode == 0 and worker.returncode == 0, (head.stderr, err)
    assert [r[0] for r in fabric.parse_all_reduce(head.stdout).rows] == [1 << 20, 4 << 20]


# ---- the NCCL path, its ranks as threads over a stand-in of torch --------------------------------


class PerThread(io.TextIOBase):
    """sys.stdout / sys.stderr that keep each thread's writes apart."""

    def __init__(self) -> None:
        self.parts: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        with self.lock:
            self.parts.setdefault(threading.current_thread().name, []).append(s)
        return len(s)

    def text(self, name: str) -> str:
        return "".join(self.parts.get(name, []))


def run_ranks(monkeypatch: pytest.MonkeyPatch, fake: FakeTorch, argvs: Sequence[Sequence[str]],
              ) -> list[tuple[int, str, str]]:
    """main(argv) of each rank in a thread of its own: (exit status, stdout, stderr) per rank."""
    fake.install(monkeypatch)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    out, err = PerThread(), PerThread()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    rcs: dict[str, int] = {}

    def one(argv: Sequence[str]) -> Callable[[], None]:
        def go() -> None:
            try:
                rcs[threading.current_thread().name] = allreduce_probe.main(list(argv))
            except BaseException as e:  # the rank's result, as its exit status would be
                err.write(f"raised {type(e).__name__}: {e}\n")
                rcs[threading.current_thread().name] = -1
        return go

    threads = [threading.Thread(target=one(a), name=f"rank{i}") for i, a in enumerate(argvs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank never returned"
    return [(rcs[t.name], out.text(t.name), err.text(t.name)) for t in threads]


def nccl_args(rank: int, port: int, *extra: str, addrs: str = ONE_HOST) -> list[str]:
    return ["--rank", str(rank), "--addrs", addrs, "--port", str(port), "--min-bytes", "1024",
            "--max-bytes", "16384", *extra]


def test_two_nccl_ranks_on_one_host_each_take_their_own_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTorch(gpus=2)
    argvs = [nccl_args(0, 1), nccl_args(1, 1)]
    (rc0, out, err0), (rc1, _, err1) = run_ranks(monkeypatch, fake, argvs)
    assert rc0 == 0 and rc1 == 0, (err0, err1)
    assert sorted(fake.devices_set) == [("rank0", 0), ("rank1", 1)]
    result = fabric.parse_all_reduce(out)
    assert [r[0] for r in result.rows] == [1024, 4096, 16384] and result.wrong == 0


def test_a_gpu_follows_the_local_rank_or_the_one_visible_device() -> None:
    assert allreduce_probe.local_rank(1, ["10.0.0.1", "10.0.0.2"], {}) == 0
    assert allreduce_probe.local_rank(1, ["10.0.0.1", "10.0.0.1"], {}) == 1
    assert allreduce_probe.local_rank(0, ["10.0.0.1", "10.0.0.1"], {"LOCAL_RANK": "3"}) == 3
    assert allreduce_probe.pick_gpu(1, 2) == 1
    assert allreduce_probe.pick_gpu(1, 1) == 0  # CUDA_VISIBLE_DEVICES names this rank's GPU alone
    with pytest.raises(SystemExit, match="local rank 2 but only 2 CUDA devices are visible"):
        allreduce_probe.pick_gpu(2, 2)


def test_a_missing_nccl_rank_is_named_within_the_join_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allreduce_probe, "JOIN_TIMEOUT", 1.0)
    [(rc, out, err)] = run_ranks(monkeypatch, FakeTorch(), [nccl_args(0, 2)])
    assert rc == 1 and out == ""
    assert err == "rank 0 (127.0.0.1): rank 1 (127.0.0.1) never joined at 127.0.0.1:2 within 1 s\n"
    [(rc, out, err)] = run_ranks(monkeypatch, FakeTorch(), [nccl_args(1, 3)])
    assert rc == 1 and out == ""
    assert err.startswith("rank 1 (127.0.0.1): rank 0 (127.0.0.1:3) never answered within 1 s ("), \
        err


@pytest.mark.parametrize(("budgets", "sizes"),
                         [((1000, 0), [1024, 4096, 16384]), ((0, 1000), [1024])])
def test_nccl_ranks_on_opposite_sides_of_the_budget_end_on_rank_0s_size(
        monkeypatch: pytest.MonkeyPatch, budgets: tuple[int, int], sizes: list[int]) -> None:
    # two hosts of one GPU each
    argvs = [nccl_args(r, 4, "--budget", str(b), addrs=TWO_HOSTS) for r, b in enumerate(budgets)]
    (rc0, out, err0), (rc1, _, err1) = run_ranks(monkeypatch, FakeTorch(one_host=False), argvs)
    assert rc0 == 0 and rc1 == 0, (err0, err1)
    assert [r[0] for r in fabric.parse_all_reduce(out).rows] == sizes


def test_every_timed_run_is_checked_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTorch(one_host=False)
    # per size: a warm-up (call 0), two timed runs of --iters 2 (calls 1-2 and 3-4): the last sum of
    # rank 1's first run and of rank 0's second run come back with one wrong element each
    fake.world(5, 2).corrupt = {(1, 2), (0, 4)}
    argvs = [nccl_args(0, 5, addrs=TWO_HOSTS), nccl_args(1, 5, addrs=TWO_HOSTS)]
    (rc0, out, err0), (rc1, _, err1) = run_ranks(monkeypatch, fake, argvs)
    assert rc0 == 0 and rc1 == 0, (err0, err1)
    first = out.splitlines()[5].split()
    assert first[0] == "1024" and (first[8], first[12]) == ("1", "1")
    assert "# Out of bounds values : 2 FAILED" in out
    assert fabric.parse_all_reduce(out).wrong > 0


def test_the_default_sizes_reach_where_a_200_gbs_link_levels_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # nccl-tests over a Spark pair: the smallest size within 0.5% of the best bus bandwidth
    pair = fabric.parse_all_reduce((Path(__file__).parent / "fixtures" / "fabric" /
                                    "all_reduce_perf-pair.txt").read_text())
    peak = max(r[2] for r in pair.rows)
    flat = min(r[0] for r in pair.rows if r[2] >= peak * 0.995)
    seen: dict[str, Sequence[int]] = {}

    def record(name: str) -> Callable[..., tuple[float, int]]:
        def run(rank: int, addrs: Sequence[str], port: int, sizes: Sequence[int],
                *a: Any) -> tuple[float, int]:
            seen[name] = sizes
            return 1.0, 0
        return run

    monkeypatch.setattr(allreduce_probe, "nccl_available", lambda: True)
    monkeypatch.setattr(allreduce_probe, "run_nccl", record("nccl"))
    monkeypatch.setattr(allreduce_probe, "run_tcp", record("tcp"))
    base = ["--rank", "0", "--addrs", ONE_HOST, "--port", "1"]
    assert allreduce_probe.main(base) == 0 and allreduce_probe.main([*base, "--tcp"]) == 0
    assert seen["nccl"][-1] >= flat > 64 << 20
    assert seen["tcp"][-1] == 64 << 20  # the pure-Python path keeps its smaller ceiling


# ---- what the probe printed on a real host of two NVIDIA GPUs ------------------------------------

PAIR_FLOOR = Unit("pair-g", ("gpu0", "gpu1"), {
    "gpu0": Fabric(addresses=("127.0.0.1",)), "gpu1": Fabric(addresses=("127.0.0.2",)),
}, busbw_floor_gbs=20.0)


@pytest.mark.parametrize(("name", "top", "peak"), [
    ("all_reduce-nvlink.txt", 1 << 30, 326.69),
    ("all_reduce-nvlink-4g.txt", 4 << 30, 342.71),
    ("all_reduce-sockets.txt", 1 << 30, 2.9),
    ("all_reduce-sockets-full.txt", 1 << 30, 2.92),
    ("all_reduce-budget-split.txt", 1 << 30, 320.62),
    ("all_reduce-cuda-visible-devices.txt", 16 << 20, 146.56),
])
def test_the_real_two_gpu_tables_parse(name: str, top: int, peak: float) -> None:
    text = (GPU / name).read_text()
    assert text.startswith(
        "# fleetctl all_reduce probe: NCCL 2.28.9 through torch.distributed, 2 ranks")
    result = fabric.parse_all_reduce(text)
    assert result.rows[0][0] == 1 << 20 and result.rows[-1][0] == top
    assert result.wrong == 0 and result.peak_busbw_gbs == peak and result.avg_busbw_gbs is not None


def test_nvlink_clears_a_spark_pairs_floor_and_sockets_do_not() -> None:
    nvlink = fabric.parse_all_reduce((GPU / "all_reduce-nvlink.txt").read_text())
    assert fabric.check_bandwidth(PAIR_FLOOR, nvlink) == []
    sockets = fabric.parse_all_reduce((GPU / "all_reduce-sockets.txt").read_text())
    [found] = fabric.check_bandwidth(PAIR_FLOOR, sockets)
    assert "all_reduce bus bandwidth 2.9 GB/s, expected at least 20.0" in found.what


def test_the_real_join_timeouts_end_in_one_line_naming_the_missing_rank() -> None:
    last = {r: (GPU / f"join-timeout-rank{r}.txt").read_text().splitlines()[-2] for r in (0, 1)}
    assert last[0] == ("rank 0 (127.0.0.1): rank 1 (127.0.0.1) never joined at 127.0.0.1:29590 "
                       "within 5 s")
    assert re.fullmatch(r"rank 1 \(127\.0\.0\.1\): rank 0 \(127\.0\.0\.1:29590\) never answered "
                        r"within 5 s \(DistNetworkError: .*\)", last[1]), last[1]
