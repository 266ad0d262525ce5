"""The all_reduce bandwidth probe fleetctl runs inside a recipe's image on every member of a unit
at once.

Standalone (python3's standard library, torch when the image has it): fleetctl passes this file's
text to ``python3 -c`` in ``docker run --network host --gpus all`` with the member's fabric
environment (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ...) and ``--rank R --addrs A0,A1,... --port
P``. Rank 0 prints the NCCL tests' ``all_reduce_perf`` table, which
``fleetctl.fabric.parse_all_reduce`` reads:

- with torch and a CUDA device (every vLLM image on a Spark): torch.distributed's NCCL all_reduce
over
  the members, the collective vLLM's tensor parallelism runs, timed per message size (1 MiB to 1
  GiB); bus bandwidth is nccl-tests' ``algbw * 2(n-1)/n``; each rank on its own GPU (its local rank:
  ``LOCAL_RANK``, else its place among the ranks of its address; or the one GPU it sees); both timed
  runs of each size are checked on every rank (each starts from rank+1, every element must read the
  sum: NCCL's ``#wrong``, every rank's counted);
- without (an image with no torch or no GPU, and the lab's emulator): the same ring all-reduce's
  traffic over TCP between the members' fabric addresses (each rank sends 2(n-1) chunks of size/n to
  the next rank while receiving as many from the previous, every chunk's bytes checked), the same
  formula: a real figure of the link, named ``TCP`` in the table's first line.

Every rank waits ``--join-timeout`` (``JOIN_TIMEOUT``) for the others and then names the missing
ones; after each size rank 0's decision to stop (a slow link ends early, ``--budget``) reaches every
rank, so that all end on the same size. Exit status 0 with the table, else 1 with one line on stderr
saying why (a peer that never joined, NCCL's own error), the last line of stderr.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: Seconds every rank waits for the others to appear (they are started at once, over SSH).
JOIN_TIMEOUT = 60.0
#: The largest size by default: NCCL's bus bandwidth over a 200 Gb/s link (25 GB/s) levels off
#: from a few hundred MiB (over NVLink it still climbs past 64 MiB); 1 GiB is ~45 ms at 24 GB/s.
NCCL_MAX_BYTES = 1 << 30
#: The TCP path's (pure Python: it holds copies of a chunk, and stays far below saturation).
TCP_MAX_BYTES = 64 << 20
_HEADER = (
    "#\n"
    "#                                                              out-of-place                   "
    "    in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time "
    "  algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us) "
    " (GB/s)  (GB/s)"
)


def bus_factor(n: int) -> float:
    """nccl-tests' all_reduce bus bandwidth factor: busbw = algbw * 2(n-1)/n."""
    return 2.0 * (n - 1) / n


def row(size: int, n: int, first: tuple[float, int], second: tuple[float, int]) -> str:
    """One line of the table: a size, then (seconds, wrong) of two timed runs (nccl-tests'
    out-of-place and
    in-place columns; both runs of this probe are in place)."""
    cols = [f"{size:12d}", f"{size // 4:14d}", f"{'float':>9}", f"{'sum':>7}", f"{-1:7d}"]
    for seconds, wrong in (first, second):
        algbw = size / seconds / 1e9 if seconds > 0 else 0.0
        cols += [
            f"{seconds * 1e6:8.1f}",
            f"{algbw:7.2f}",
            f"{algbw * bus_factor(n):7.2f}",
            f"{wrong:6d}",
        ]
    return " ".join(cols)


def _sizes(low: int, high: int, factor: int) -> list[int]:
    out, s = [], low
    while s <= high:
        out.append(s)
        s *= factor
    return out


# ---- NCCL through torch.distributed
# ----------------------------------------------------------------------------


def nccl_available() -> bool:
    """torch is importable and sees a CUDA device."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except Exception:
        return False
    return bool(torch.cuda.is_available())


def local_rank(rank: int, addrs: Sequence[str], env: Mapping[str, str]) -> int:
    """This rank's place among the ranks of its host: ``LOCAL_RANK`` when a launcher set it, else
    how many earlier ranks share its address (0 on a fleet of one GPU per host; 0 and 1 for two
    ranks on one host)."""
    given = env.get("LOCAL_RANK", "").strip()
    if given:
        try:
            return int(given)
        except ValueError:
            raise SystemExit(f"LOCAL_RANK={given!r} is not a number") from None
    return list(addrs[:rank]).count(addrs[rank])


def pick_gpu(local: int, visible: int) -> int:
    """The CUDA device a rank runs on: its local rank among the devices it sees, or the only one
    it sees (a Spark's one GPU, or ``CUDA_VISIBLE_DEVICES`` naming this rank's GPU alone). Two
    ranks on one GPU fail in NCCL (``Duplicate GPU detected``): a local rank past the visible
    devices is refused."""
    if visible < 1:
        raise SystemExit("torch sees no CUDA device")
    if visible == 1:
        return 0
    if local >= visible:
        raise SystemExit(f"local rank {local} but only {visible} CUDA devices are visible: one "
                         "rank per GPU (start fewer ranks on this host, or give each its own "
                         "CUDA_VISIBLE_DEVICES)")
    return local


def expected_sum(n: int, iters: int) -> float:
    """What every element reads after ``iters`` in-place sums starting from rank+1 on every rank:
    the first gives n(n+1)/2, each further one multiplies by n."""
    return n * (n + 1) / 2 * float(n) ** (iters - 1)


def _join(dist: Any, rank: int, addrs: Sequence[str], port: int, timeout: float) -> Any:
    """The ranks' rendezvous, bounded by ``timeout`` on every rank: rank 0 serves a TCPStore at
    ``addrs[0]:port``, every rank writes its key, and waits until all keys are there. A rank that
    never comes is named (torch's own init waits its default of minutes, and names nobody)."""
    from datetime import timedelta

    n = len(addrs)
    try:
        store = dist.TCPStore(addrs[0], port, n, rank == 0, timeout=timedelta(seconds=timeout),
                              wait_for_workers=False)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise SystemExit(f"rank 0 ({addrs[0]}:{port}) never answered within {timeout:.0f} s "
                         f"({type(e).__name__}: {first})") from None
    key = "fleetctl/joined/{}".format
    store.set(key(rank), os.uname().nodename)
    deadline = time.monotonic() + timeout
    while True:
        try:
            missing = [r for r in range(n) if not store.check([key(r)])]
        except Exception as e:  # rank 0, the store's server, went away
            raise SystemExit(f"rank 0 ({addrs[0]}:{port}) went away during the join "
                             f"({type(e).__name__})") from None
        if not missing:
            return store
        if time.monotonic() >= deadline:
            who = ", ".join(f"rank {r} ({addrs[r]})" for r in missing)
            raise SystemExit(f"{who} never joined at {addrs[0]}:{port} within {timeout:.0f} s")
        time.sleep(0.05)


def run_nccl(
    rank: int,
    addrs: Sequence[str],
    port: int,
    sizes: Sequence[int],
    iters: int,
    budget: float,
    emit: Callable[[str], None],
    join_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[float, int]:
    """Time torch.distributed's NCCL all_reduce per size; returns the average bus bandwidth and
    the wrong results.

    Each rank runs on its own GPU (:func:`local_rank`, :func:`pick_gpu`); the join is bounded by
    ``join_timeout``; after each size one small all_reduce sums every rank's wrong elements of
    both timed runs and carries rank 0's decision to stop, so that every rank ends on one size."""
    import torch  # type: ignore[import-not-found,unused-ignore]
    import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]

    n = len(addrs)
    timeout = JOIN_TIMEOUT if join_timeout is None else join_timeout
    local = local_rank(rank, addrs, os.environ if env is None else env)
    gpu = pick_gpu(local, torch.cuda.device_count())
    torch.cuda.set_device(gpu)
    store = _join(dist, rank, addrs, port, timeout)
    from datetime import timedelta

    dist.init_process_group("nccl", store=store, rank=rank, world_size=n,
                            timeout=timedelta(seconds=timeout))
    emit(
        f"# fleetctl all_reduce probe: NCCL {'.'.join(map(str, torch.cuda.nccl.version()))} "
        "through "
        f"torch.distributed, {n} ranks, 1 GPU each"
    )
    emit(_HEADER)
    expect = expected_sum(n, iters)
    total, bad, done = 0.0, 0, 0
    try:
        for size in sizes:
            count = size // 4
            x = torch.full((count,), float(rank + 1), dtype=torch.float32, device="cuda")
            dist.all_reduce(x)  # warm-up: NCCL's connections and buffers for this size
            runs = []
            for _ in range(2):
                x.fill_(float(rank + 1))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(x)
                torch.cuda.synchronize()
                seconds = (time.perf_counter() - t0) / iters
                # every timed run checked, with a float tolerance as nccl-tests has: the sums are
                # exact until n**iters outgrows float32's mantissa, then every element rounds alike
                runs.append((seconds, int(((x - expect).abs() > expect * 1e-5).sum().item())))
            del x
            over = (runs[0][0] + runs[1][0]) * iters > budget
            # [wrong in run 1, wrong in run 2, stop]: every rank's counts, rank 0's decision alone
            tally = torch.tensor([runs[0][1], runs[1][1], 1 if rank == 0 and over else 0],
                                 dtype=torch.float64, device="cuda")
            dist.all_reduce(tally)
            w1, w2, stop = (int(v) for v in tally.tolist())
            emit(row(size, n, (runs[0][0], w1), (runs[1][0], w2)))
            bad += w1 + w2
            total += size / min(runs[0][0], runs[1][0]) / 1e9 * bus_factor(n)
            done += 1
            if stop:
                break
    finally:
        dist.destroy_process_group()
    return total / max(1, done), bad


# ---- the same ring's traffic over TCP
# ---------------------------------------------------------------------------


def _connect(addr: str, port: int, deadline: float, who: str, timeout: float) -> socket.socket:
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            s.settimeout(timeout)
            return s
        except OSError as e:
            last = e
            time.sleep(0.2)
    raise SystemExit(f"{who} never answered at {addr}:{port} within {timeout:.0f} s ({last})")


def tcp_port(rank: int, addrs: Sequence[str], port: int) -> int:
    """The port ``rank`` listens on: ``port``, plus its place among earlier ranks of the same
    address (two ranks on one host do not collide; with one rank a host, every rank uses
    ``port``)."""
    return port + list(addrs[:rank]).count(addrs[rank])


def _recv_exact(s: socket.socket, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < len(buf):
        k = s.recv_into(view[got:])
        if k == 0:
            raise SystemExit("a peer closed the connection in the middle of a transfer")
        got += k


def _read_line(s: socket.socket) -> str:
    line, one = bytearray(), bytearray(1)
    while True:
        _recv_exact(s, one)
        if one == b"\n":
            return line.decode()
        line.extend(one)


def _tune(s: socket.socket) -> None:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)


def run_tcp(
    rank: int,
    addrs: Sequence[str],
    port: int,
    sizes: Sequence[int],
    iters: int,
    budget: float,
    emit: Callable[[str], None],
    join_timeout: float | None = None,
) -> tuple[float, int]:
    """The ring all-reduce's traffic between the members' fabric addresses, timed per size; returns
    the average bus bandwidth and the chunks that arrived wrong (every rank's, summed around the
    ring)."""
    n = len(addrs)
    timeout = JOIN_TIMEOUT if join_timeout is None else join_timeout
    deadline = time.monotonic() + timeout
    nr, pr = (rank + 1) % n, (rank - 1) % n
    mine = tcp_port(rank, addrs, port)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((addrs[rank], mine))
    listener.listen(1)
    listener.settimeout(timeout)
    out_box: list[socket.socket] = []
    failed: list[str] = []

    def connect() -> None:
        try:
            to = tcp_port(nr, addrs, port)
            out_box.append(_connect(addrs[nr], to, deadline, f"rank {nr}", timeout))
        except SystemExit as e:
            failed.append(str(e.code))

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    try:
        prev, _ = listener.accept()
    except TimeoutError:
        raise SystemExit(f"rank {pr} ({addrs[pr]}) never connected to {addrs[rank]}:{mine} within "
                         f"{timeout:.0f} s") from None
    t.join()
    if not out_box:
        raise SystemExit(failed[0] if failed else f"could not connect to rank {nr} at {addrs[nr]}")
    nxt = out_box[0]
    prev.settimeout(timeout)
    _tune(nxt)
    _tune(prev)
    token = bytearray(1)

    def barrier() -> None:
        """A token once around the ring: every rank has reached it when rank 0 gets it back."""
        if rank == 0:
            nxt.sendall(b"B")
            _recv_exact(prev, token)
        else:
            _recv_exact(prev, token)
            nxt.sendall(b"B")

    if rank == 0:
        emit(
            f"# fleetctl all_reduce probe: TCP (no CUDA/NCCL in the image), {n} ranks, the ring "
            "all-reduce's "
            f"traffic over {', '.join(addrs)}"
        )
        emit(_HEADER)
    total, bad, done, last = 0.0, 0, 0, sizes[0]
    for size in sizes:
        chunk = max(1, size // n)
        last = size
        pattern = bytes((rank + i) % 251 for i in range(251))
        data = (pattern * (chunk // 251 + 1))[:chunk]
        expect = bytes(((rank - 1) % n + i) % 251 for i in range(251))
        expect = (expect * (chunk // 251 + 1))[:chunk]
        inbox = bytearray(chunk)
        runs = []
        for _ in range(2):
            barrier()
            wrong = 0
            t0 = time.perf_counter()
            for _ in range(iters):
                for _ in range(2 * (n - 1)):
                    sender = threading.Thread(target=nxt.sendall, args=(data,))
                    sender.start()
                    _recv_exact(prev, inbox)
                    sender.join()
                    if inbox != expect:
                        wrong += 1
            runs.append(((time.perf_counter() - t0) / iters, wrong))
        total += size / min(runs[0][0], runs[1][0]) / 1e9 * bus_factor(n)
        done += 1
        # every rank ends on the same size, rank 0's timing deciding, and every rank's wrong chunks
        # are summed: "STOP W1 W2" goes once around the ring, each rank adding its own counts
        if rank == 0:
            over = (runs[0][0] + runs[1][0]) * iters > budget
            nxt.sendall(f"{int(over)} {runs[0][1]} {runs[1][1]}\n".encode())
            stop, w1, w2 = (int(v) for v in _read_line(prev).split())
        else:
            stop, w1, w2 = (int(v) for v in _read_line(prev).split())
            nxt.sendall(f"{stop} {w1 + runs[0][1]} {w2 + runs[1][1]}\n".encode())
        if rank == 0:
            emit(row(size, n, (runs[0][0], w1), (runs[1][0], w2)))
            bad += w1 + w2
        total += size / min(runs[0][0], runs[1][0]) / 1e9 * bus_factor(n)
        done += 1
        if stop:
            break
    links = _links(rank, addrs, nxt, prev, barrier, max(1 << 20, min(last // n, 16 << 20)))
    if rank == 0:
        for src, dst, gbs in links:
            emit(f"# link {src} -> {dst} : {gbs:.3f} GB/s")
    barrier()
    for s in (nxt, prev, listener):
        s.close()
    return total / max(1, done), bad


def _links(
    rank: int,
    addrs: Sequence[str],
    nxt: socket.socket,
    prev: socket.socket,
    barrier: Callable[[], None],
    size: int,
) -> list[tuple[str, str, float]]:
    """Every link of the ring on its own: each rank sends ``size`` bytes to the next at once, the
    receiver times its inbound link; the figures go around the ring to rank 0 as (sender, receiver,
    GB/s), so a
    slow member (its traffic leaving through the management network) is named, not just the unit."""
    n = len(addrs)
    data, inbox = bytes(size), bytearray(size)
    barrier()
    t0 = time.perf_counter()
    sender = threading.Thread(target=nxt.sendall, args=(data,))
    sender.start()
    _recv_exact(prev, inbox)
    mine = size / max(time.perf_counter() - t0, 1e-9) / 1e9
    sender.join()
    barrier()
    line = bytearray()

    def read_line() -> str:
        one = bytearray(1)
        while True:
            _recv_exact(prev, one)
            if one == b"\n":
                return line.decode()
            line.extend(one)

    entry = f"{rank}:{mine:.6f}"
    if rank == 0:
        nxt.sendall(entry.encode() + b"\n")
        got = read_line()
    else:
        got = read_line() + ";" + entry
        nxt.sendall(got.encode() + b"\n")
    out = []
    for item in got.split(";"):
        r, gbs = item.split(":")
        out.append((addrs[(int(r) - 1) % n], addrs[int(r)], float(gbs)))
    return sorted(out, key=lambda x: x[2])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run the NCCL or the TCP probe, print the table on rank 0."""
    ap = argparse.ArgumentParser(prog="fleetctl-allreduce-probe")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument(
        "--addrs", required=True, help="every rank's fabric address, comma-separated, rank order"
    )
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=None,
                    help=f"the largest size (default {NCCL_MAX_BYTES >> 20} MiB with NCCL, where "
                         f"a 200 Gb/s link saturates; {TCP_MAX_BYTES >> 20} MiB over TCP)")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument(
        "--budget",
        type=float,
        default=2.0,
        help="no larger size once one size's runs took this many seconds (a slow link ends early)",
    )
    ap.add_argument("--join-timeout", type=float, default=JOIN_TIMEOUT,
                    help="seconds every rank waits for the others to appear")
    ap.add_argument("--tcp", action="store_true", help="the TCP probe even when NCCL is there")
    a = ap.parse_args(argv)
    addrs = a.addrs.split(",")
    if not 0 <= a.rank < len(addrs) or len(addrs) < 2:
        print(f"rank {a.rank} of {len(addrs)} address(es): need 2 or more ranks", file=sys.stderr)
        return 2
    iters = max(1, a.iters)
    if expected_sum(len(addrs), iters) > 1e30:
        print(f"--iters {iters}: the sums of {len(addrs)} ranks would leave float32's range",
              file=sys.stderr)
        return 2
    use_nccl = not a.tcp and nccl_available()
    high = a.max_bytes if a.max_bytes is not None else NCCL_MAX_BYTES if use_nccl else TCP_MAX_BYTES
    sizes = _sizes(a.min_bytes, high, max(2, a.factor))

    def emit(line: str) -> None:
        if a.rank == 0:
            print(line, flush=True)

    try:
        run = run_nccl if use_nccl else run_tcp
        avg, wrong = run(a.rank, addrs, a.port, sizes, iters, a.budget, emit, a.join_timeout)
    except SystemExit as e:
        print(f"rank {a.rank} ({addrs[a.rank]}): {e.code}", file=sys.stderr)
        return 1
    except Exception as e:  # NCCL's and the socket layer's own errors, quoted
        print(f"rank {a.rank} ({addrs[a.rank]}): {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    emit(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
    emit(f"# Avg bus bandwidth    : {avg:.3f}")
    emit("#")
    if a.rank:
        print(f"# rank {a.rank} done (host {os.uname().nodename})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
