"""The all_reduce bandwidth probe fleetctl runs inside a recipe's image on every member of a unit at once.

Standalone (python3's standard library, torch when the image has it): fleetctl passes this file's text
to ``python3 -c`` in ``docker run --network host --gpus all`` with the member's fabric environment
(``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ...) and ``--rank R --addrs A0,A1,... --port P``. Rank 0
prints the NCCL tests' ``all_reduce_perf`` table, which ``fleetctl.fabric.parse_all_reduce`` reads:

- with torch and a CUDA device (every vLLM image on a Spark): torch.distributed's NCCL all_reduce over
  the members, the collective vLLM's tensor parallelism runs, timed per message size; bus bandwidth
  is nccl-tests' ``algbw * 2(n-1)/n``; each size is checked (every rank contributes rank+1, every
  element must read n(n+1)/2: NCCL's ``#wrong``);
- without (an image with no torch or no GPU, and the lab's emulator): the same ring all-reduce's
  traffic over TCP between the members' fabric addresses (each rank sends 2(n-1) chunks of size/n to
  the next rank while receiving as many from the previous, every chunk's bytes checked), the same
  formula: a real figure of the link, named ``TCP`` in the table's first line.

Exit status 0 with the table, else 1 with one line on stderr saying why (a peer that never connected,
NCCL's own error).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

#: Seconds every rank waits for the others to appear (they are started at once, over SSH).
JOIN_TIMEOUT = 60.0
_HEADER = (
    "#\n"
    "#                                                              out-of-place                       in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)")


def bus_factor(n: int) -> float:
    """nccl-tests' all_reduce bus bandwidth factor: busbw = algbw * 2(n-1)/n."""
    return 2.0 * (n - 1) / n


def row(size: int, n: int, first: tuple[float, int], second: tuple[float, int]) -> str:
    """One line of the table: a size, then (seconds, wrong) of two timed runs (nccl-tests' out-of-place and
    in-place columns; both runs of this probe are in place)."""
    cols = [f"{size:12d}", f"{size // 4:14d}", f"{'float':>9}", f"{'sum':>7}", f"{-1:7d}"]
    for seconds, wrong in (first, second):
        algbw = size / seconds / 1e9 if seconds > 0 else 0.0
        cols += [f"{seconds * 1e6:8.1f}", f"{algbw:7.2f}", f"{algbw * bus_factor(n):7.2f}", f"{wrong:6d}"]
    return " ".join(cols)


def _sizes(low: int, high: int, factor: int) -> list[int]:
    out, s = [], low
    while s <= high:
        out.append(s)
        s *= factor
    return out


# ---- NCCL through torch.distributed ----------------------------------------------------------------------------


def nccl_available() -> bool:
    """torch is importable and sees a CUDA device."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except Exception:
        return False
    return bool(torch.cuda.is_available())


def run_nccl(rank: int, addrs: Sequence[str], port: int, sizes: Sequence[int], iters: int, budget: float,
             emit: Callable[[str], None]) -> tuple[float, int]:
    """Time torch.distributed's NCCL all_reduce per size; returns the average bus bandwidth and wrong results."""
    import torch  # type: ignore[import-not-found,unused-ignore]
    import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]

    n = len(addrs)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://{addrs[0]}:{port}", rank=rank, world_size=n)
    emit(f"# fleetctl all_reduce probe: NCCL {'.'.join(map(str, torch.cuda.nccl.version()))} through "
         f"torch.distributed, {n} ranks, 1 GPU each")
    emit(_HEADER)
    total, bad, done = 0.0, 0, 0
    try:
        for size in sizes:
            count = size // 4
            x = torch.full((count,), float(rank + 1), dtype=torch.float32, device="cuda")
            dist.all_reduce(x)  # warm-up, and the correctness check
            torch.cuda.synchronize()
            wrong = int((x != float(n * (n + 1) // 2)).sum().item())
            bad += wrong
            runs = []
            for _ in range(2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(x)
                torch.cuda.synchronize()
                runs.append(((time.perf_counter() - t0) / iters, wrong))
            emit(row(size, n, runs[0], runs[1]))
            total += size / min(runs[0][0], runs[1][0]) / 1e9 * bus_factor(n)
            done += 1
            if (runs[0][0] + runs[1][0]) * iters > budget:
                break
    finally:
        dist.destroy_process_group()
    return total / max(1, done), bad


# ---- the same ring's traffic over TCP ---------------------------------------------------------------------------


def _connect(addr: str, port: int, deadline: float) -> socket.socket:
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            s.settimeout(JOIN_TIMEOUT)
            return s
        except OSError as e:
            last = e
            time.sleep(0.2)
    raise SystemExit(f"rank never reached {addr}:{port} within {JOIN_TIMEOUT:.0f} s ({last})")


def _recv_exact(s: socket.socket, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < len(buf):
        k = s.recv_into(view[got:])
        if k == 0:
            raise SystemExit("a peer closed the connection in the middle of a transfer")
        got += k


def _tune(s: socket.socket) -> None:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)


def run_tcp(rank: int, addrs: Sequence[str], port: int, sizes: Sequence[int], iters: int, budget: float,
            emit: Callable[[str], None]) -> tuple[float, int]:
    """The ring all-reduce's traffic between the members' fabric addresses, timed per size; returns the
    average bus bandwidth and the chunks that arrived wrong."""
    n = len(addrs)
    deadline = time.monotonic() + JOIN_TIMEOUT
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((addrs[rank], port))
    listener.listen(1)
    listener.settimeout(JOIN_TIMEOUT)
    out_box: list[socket.socket] = []
    t = threading.Thread(target=lambda: out_box.append(_connect(addrs[(rank + 1) % n], port, deadline)))
    t.start()
    try:
        prev, _ = listener.accept()
    except TimeoutError:
        raise SystemExit(f"rank {(rank - 1) % n} ({addrs[(rank - 1) % n]}) never connected to "
                         f"{addrs[rank]}:{port} within {JOIN_TIMEOUT:.0f} s") from None
    t.join()
    if not out_box:
        raise SystemExit(f"could not connect to rank {(rank + 1) % n} at {addrs[(rank + 1) % n]}:{port}")
    nxt = out_box[0]
    prev.settimeout(JOIN_TIMEOUT)
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
        emit(f"# fleetctl all_reduce probe: TCP (no CUDA/NCCL in the image), {n} ranks, the ring all-reduce's "
             f"traffic over {', '.join(addrs)}")
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
            bad += wrong
        if rank == 0:
            emit(row(size, n, runs[0], runs[1]))
        total += size / min(runs[0][0], runs[1][0]) / 1e9 * bus_factor(n)
        done += 1
        # every rank ends on the same size: rank 0's timing decides, passed around the ring
        stop = bytearray(1)
        if rank == 0:
            nxt.sendall(b"1" if (runs[0][0] + runs[1][0]) * iters > budget else b"0")
            _recv_exact(prev, stop)
        else:
            _recv_exact(prev, stop)
            nxt.sendall(bytes(stop))
        if stop == b"1":
            break
    links = _links(rank, addrs, nxt, prev, barrier, max(1 << 20, min(last // n, 16 << 20)))
    if rank == 0:
        for src, dst, gbs in links:
            emit(f"# link {src} -> {dst} : {gbs:.3f} GB/s")
    barrier()
    for s in (nxt, prev, listener):
        s.close()
    return total / max(1, done), bad


def _links(rank: int, addrs: Sequence[str], nxt: socket.socket, prev: socket.socket, barrier: Callable[[], None],
           size: int) -> list[tuple[str, str, float]]:
    """Every link of the ring on its own: each rank sends ``size`` bytes to the next at once, the receiver
    times its inbound link; the figures go around the ring to rank 0 as (sender, receiver, GB/s), so a
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
    ap.add_argument("--addrs", required=True, help="every rank's fabric address, comma-separated, rank order")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--budget", type=float, default=2.0,
                    help="no larger size once one size's runs took this many seconds (a slow link ends early)")
    ap.add_argument("--tcp", action="store_true", help="the TCP probe even when NCCL is there")
    a = ap.parse_args(argv)
    addrs = a.addrs.split(",")
    if not 0 <= a.rank < len(addrs) or len(addrs) < 2:
        print(f"rank {a.rank} of {len(addrs)} address(es): need 2 or more ranks", file=sys.stderr)
        return 2
    sizes = _sizes(a.min_bytes, a.max_bytes, max(2, a.factor))

    def emit(line: str) -> None:
        if a.rank == 0:
            print(line, flush=True)

    try:
        run = run_nccl if not a.tcp and nccl_available() else run_tcp
        avg, wrong = run(a.rank, addrs, a.port, sizes, max(1, a.iters), a.budget, emit)
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
