"""Multi-node mode: one model served by N emulator processes, as vLLM's native multi-node launch
does.

``vllm serve MODEL --nnodes N --node-rank R --master-addr A --master-port P [--headless]``:

- rank 0 (the head) listens on ``A:P`` (the fabric address) and waits, port of the API closed,
  until every other rank has joined; then it measures the link (each worker sends
  ``EMU_LINK_PROBE_BYTES`` through it), scales its decode throughput by the measured bandwidth
  against ``EMU_LINK_REFERENCE_MBPS`` (0: no scaling), and serves;
- ranks 1..N-1 (headless workers, no API) connect to ``A:P`` (retrying while the head is not up,
  for ``EMU_JOIN_TIMEOUT_SECONDS``), join, then exchange a heartbeat with the head every second;
- a worker that dies (its connection closes) or goes silent for ``EMU_WORKER_TIMEOUT_SECONDS``
  wedges the head as vLLM #41725 reports: ``/health`` keeps answering 200, every request (and
  every stream in flight) stops producing tokens, and the log carries NCCL's watchdog lines;
- a head that goes away makes each worker log NCCL's error and exit 1;
- Ray launch (``--distributed-executor-backend ray``, tp x pp > 1, no ``--nnodes``): the head
listens where
  ``ray start --head`` put the cluster (:mod:`.ray`), for tp x pp nodes; ``ray start --block``
  workers join it as ranks the head assigns, and behave as headless workers from then on;
- ``EMU_NCCL_HANG_AFTER_SECONDS`` (0: never): that long after its first request, the head logs the
error
  NCCL prints when an RDMA send to a peer fails (``NET/IB : Got completion from peer ... with
  status= IBV_WC_RETRY_EXC_ERR(12)``) and the watchdog's timeout, then wedges as above, its workers
  still up: the hang vLLM #41725 reports under load, with the cause only in the log.

Standard library only (the package is copied into images with nothing but python3).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Bytes a worker sends through the link when it joins (the head times them).
DEFAULT_PROBE_BYTES = 8 << 20
#: Seconds between heartbeats, both ways.
HEARTBEAT_SECONDS = 1.0


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


@dataclass(frozen=True)
class Cluster:
    """The multi-node part of a ``vllm serve`` command line."""

    nnodes: int
    rank: int
    master_addr: str
    master_port: int
    headless: bool
    join_timeout: float = 600.0
    worker_timeout: float = 10.0
    probe_bytes: int = DEFAULT_PROBE_BYTES
    reference_mbps: float = 0.0
    nccl_hang_after: float = 0.0

    @property
    def is_head(self) -> bool:
        """Rank 0 serves the API."""
        return self.rank == 0


def from_args(extra: dict[str, str | bool]) -> Cluster | None:
    """The cluster of a command line (its ``--nnodes`` ... flags, from ServeArgs.extra); None for
    one node.

    Raises ValueError with vLLM-like argument errors.
    """
    raw = extra.get("nnodes")
    if extra.get("distributed-executor-backend") == "ray" and raw is None:
        return _ray_head(extra)
    if raw is None or raw is True:
        if extra.get("headless"):
            raise ValueError("argument --headless: requires --nnodes > 1")
        return None
    try:
        nnodes = int(str(raw))
        rank = int(str(extra.get("node-rank", 0)))
        port = int(str(extra.get("master-port", 29501)))
    except ValueError:
        raise ValueError(
            "arguments --nnodes/--node-rank/--master-port: invalid int value"
        ) from None
    if nnodes < 1 or not 0 <= rank < nnodes:
        raise ValueError(f"argument --node-rank: {rank} is not in 0..{nnodes - 1}")
    if nnodes == 1:
        return None
    addr = extra.get("master-addr")
    if not isinstance(addr, str) or not addr:
        raise ValueError("argument --master-addr: required with --nnodes > 1")
    headless = bool(extra.get("headless"))
    if rank > 0 and not headless:
        raise ValueError(f"--node-rank {rank} needs --headless: only rank 0 serves the API")
    return Cluster(nnodes, rank, addr, port, headless,
                   join_timeout=_env_float("EMU_JOIN_TIMEOUT_SECONDS", 600.0),
                   worker_timeout=_env_float("EMU_WORKER_TIMEOUT_SECONDS", 10.0),
                   probe_bytes=int(_env_float("EMU_LINK_PROBE_BYTES", DEFAULT_PROBE_BYTES)),
                   reference_mbps=_env_float("EMU_LINK_REFERENCE_MBPS", 0.0),
                   nccl_hang_after=_env_float("EMU_NCCL_HANG_AFTER_SECONDS", 0.0))


def ray_dir() -> str:
    """Where ``ray start --head`` leaves the cluster's address (``EMU_RAY_DIR``, else Ray's
    /tmp/ray)."""
    return os.environ.get("EMU_RAY_DIR") or "/tmp/ray"


def _ray_head(extra: dict[str, str | bool]) -> Cluster | None:
    """``--distributed-executor-backend ray``: one node per GPU of tp x pp (a Spark has one), the
    head listening where ``ray start --head`` said the cluster is (its ``ray_current_cluster`` file,
    or
    ``RAY_ADDRESS``)."""
    try:
        tp = int(str(extra.get("tensor-parallel-size", 1)))
        pp = int(str(extra.get("pipeline-parallel-size", 1)))
    except ValueError:
        raise ValueError(
            "arguments --tensor-parallel-size/--pipeline-parallel-size: invalid int value"
        ) from None
    if tp * pp <= 1:
        return None
    address = os.environ.get("RAY_ADDRESS", "")
    if not address:
        try:
            with open(os.path.join(ray_dir(), "ray_current_cluster")) as f:
                address = f.read().strip()
        except OSError:
            address = ""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            "ConnectionError: Could not find any running Ray instance. Please specify the one to "
            "connect to by setting `--address` flag or `RAY_ADDRESS` environment variable."
        )
    return Cluster(tp * pp, 0, host, int(port), False,
                   join_timeout=_env_float("EMU_JOIN_TIMEOUT_SECONDS", 600.0),
                   worker_timeout=_env_float("EMU_WORKER_TIMEOUT_SECONDS", 10.0),
                   probe_bytes=int(_env_float("EMU_LINK_PROBE_BYTES", DEFAULT_PROBE_BYTES)),
                   reference_mbps=_env_float("EMU_LINK_REFERENCE_MBPS", 0.0),
                   nccl_hang_after=_env_float("EMU_NCCL_HANG_AFTER_SECONDS", 0.0))


@dataclass
class _Member:
    rank: int
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    mbps: float
    last_seen: float = field(default_factory=time.monotonic)


class Head:
    """Rank 0's side: the join listener, the members, and what happens when one is lost."""

    def __init__(self, cluster: Cluster, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.log = log
        self.members: dict[int, _Member] = {}
        self.lost: str | None = None
        self.on_lost: Callable[[str], None] | None = None
        self._joined = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def link_mbps(self) -> float:
        """The slowest worker's measured link (MB/s)."""
        return min((m.mbps for m in self.members.values()), default=0.0)

    def throughput_factor(self) -> float:
        """Decode throughput relative to a full-speed link (1.0 without a reference)."""
        ref = self.cluster.reference_mbps
        if ref <= 0 or not self.members:
            return 1.0
        return max(0.05, min(1.0, self.link_mbps / ref))

    async def wait_for_workers(self, stop: asyncio.Event) -> bool:
        """Listen on the master address until every rank joined; False when stopped or timed out."""
        c = self.cluster
        self._server = await asyncio.start_server(self._join, c.master_addr, c.master_port)
        self.log(
            f"INFO [multiproc_executor.py:90] Waiting for {c.nnodes - 1} worker node(s) to join "
            f"at {c.master_addr}:{c.master_port} (--nnodes {c.nnodes})"
        )
        waiters = [asyncio.ensure_future(self._joined.wait()), asyncio.ensure_future(stop.wait())]
        _done, pending = await asyncio.wait(
            waiters, timeout=c.join_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        for w in pending:
            w.cancel()
        if stop.is_set():
            return False
        if not self._joined.is_set():
            missing = sorted(set(range(1, c.nnodes)) - set(self.members))
            self.log(
                "ERROR [multiproc_executor.py:120] torch.distributed.DistStoreError: Timed out "
                "after "
                f"{c.join_timeout:.0f} seconds waiting for clients. "
                f"{len(self.members) + 1}/{c.nnodes} "
                f"clients joined (missing node ranks: {missing})"
            )
            return False
        self.log(f"INFO [multiproc_executor.py:98] All {c.nnodes} nodes joined; link measured at "
                 f"{self.link_mbps:.0f} MB/s (slowest worker)")
        self.spawn(self._watch())
        return True

    async def hang_under_load(self, served: Callable[[], bool]) -> None:
        """``EMU_NCCL_HANG_AFTER_SECONDS``: once ``served()`` (the first request came in), that
        long, then an
        RDMA completion error from the first worker and the wedge."""
        while not served():
            await asyncio.sleep(0.2)
        await asyncio.sleep(self.cluster.nccl_hang_after)
        m = min(self.members.values(), key=lambda x: x.rank)
        self._wedge(
            f"node rank {m.rank} ({m.address}): NCCL RDMA completion error",
            [
                "WARN NCCL [rank0] NET/IB : Got completion from peer "
                f"{m.address}<{self.cluster.master_port}> with "
                "status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 vendor err 129 (Send) hca "
                "rocep1s0f1",
                "WARN NCCL [rank0] NET/IB : Got completion from peer "
                f"{m.address}<{self.cluster.master_port}> with "
                "status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 vendor err 129 (Send) hca "
                "roceP2p1s0f1",
                *self._watchdog(),
            ],
        )

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` as one of the head's tasks (cancelled by :meth:`close`)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        c = self.cluster
        peer = writer.get_extra_info("peername")
        try:
            line = (await asyncio.wait_for(reader.readline(), 10)).decode(errors="replace").split()
            if len(line) != 4 or line[0] != "JOIN":
                raise ValueError(f"bad handshake {' '.join(line)[:60]!r}")
            rank, nnodes, probe = int(line[1]), int(line[2]), int(line[3])
            if (
                rank == 0 and nnodes == 0
            ):  # a Ray worker node (`ray start --block`): the head gives its rank
                rank = min(set(range(1, c.nnodes)) - set(self.members), default=c.nnodes)
                nnodes = c.nnodes
            if nnodes != c.nnodes:
                raise ValueError(f"worker says --nnodes {nnodes}, the head has {c.nnodes}")
            if not 0 < rank < c.nnodes or rank in self.members or self._joined.is_set():
                raise ValueError(f"node rank {rank} is taken or out of range")
            writer.write(b"GO\n")
            await writer.drain()
            started = time.monotonic()
            await asyncio.wait_for(reader.readexactly(probe), 60)
            seconds = max(time.monotonic() - started, 1e-6)
        except (TimeoutError, ValueError, OSError, asyncio.IncompleteReadError) as e:
            self.log(f"WARNING [multiproc_executor.py:105] refused a node from {peer}: {e}")
            with contextlib.suppress(OSError):
                writer.write(f"ERR {e}\n".encode())
                await writer.drain()
                writer.close()
            return
        member = _Member(rank, str(peer[0]) if peer else "?", reader, writer, probe / seconds / 1e6)
        self.members[rank] = member
        writer.write(b"OK\n")
        await writer.drain()
        self.log(f"INFO [multiproc_executor.py:95] Node rank {rank} joined from {member.address} "
                 f"({len(self.members) + 1}/{c.nnodes})")
        if len(self.members) == c.nnodes - 1:
            self._joined.set()

    async def _watch(self) -> None:
        """Heartbeats with every member; the first one lost wedges the head."""
        async def one(m: _Member) -> None:
            while self.lost is None:
                try:
                    m.writer.write(b"HB\n")
                    await m.writer.drain()
                    line = await asyncio.wait_for(m.reader.readline(), self.cluster.worker_timeout)
                except TimeoutError:
                    self._lose(m, f"no heartbeat for {self.cluster.worker_timeout:.0f} s")
                    return
                except OSError as e:
                    self._lose(m, f"connection lost ({e.__class__.__name__})")
                    return
                if not line:
                    self._lose(m, "connection closed by peer")
                    return
                m.last_seen = time.monotonic()
                await asyncio.sleep(HEARTBEAT_SECONDS)

        await asyncio.gather(*(one(m) for m in list(self.members.values())))

    def _lose(self, m: _Member, why: str) -> None:
        # What a real head prints when a peer of its NCCL communicator vanishes: the watchdog's
        # collective timeout; the API server itself keeps answering /health.
        self._wedge(
            f"node rank {m.rank} ({m.address}): {why}",
            [
                f"WARN NCCL [rank0] NET/Socket : peer {m.address} (node rank {m.rank}) {why}",
                *self._watchdog(),
            ],
        )

    @staticmethod
    def _watchdog() -> list[str]:
        return [
            "ERROR [ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
            "timeout: "
            "WorkNCCL(SeqNum=1204, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, "
            "Timeout(ms)=600000) "
            "ran for 600010 milliseconds before timing out."
        ]

    def _wedge(self, lost: str, lines: list[str]) -> None:
        """Log ``lines`` and wedge the head (once): /health 200, no token from now on."""
        if self.lost is not None:
            return
        self.lost = lost
        for line in lines:
            self.log(line)
        if self.on_lost is not None:
            self.on_lost(self.lost)

    async def close(self) -> None:
        """Stop listening and drop every member's connection."""
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            self._server.close()
        for m in self.members.values():
            with contextlib.suppress(Exception):
                m.writer.close()


async def run_worker(cluster: Cluster, log: Callable[[str], None], stop: asyncio.Event) -> int:
    """A headless worker: join the head, then heartbeat until stopped (0) or the head is gone
    (1)."""
    c = cluster
    log(f"INFO [api_server.py:1460] Launching headless worker node rank {c.rank} of {c.nnodes}, "
        f"master {c.master_addr}:{c.master_port}")
    deadline = time.monotonic() + c.join_timeout
    writer: asyncio.StreamWriter | None = None
    # a worker speaks from its own address on the fabric, as vLLM's workers do from VLLM_HOST_IP
    own = os.environ.get("VLLM_HOST_IP") or None
    while writer is None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                c.master_addr, c.master_port, local_addr=(own, 0) if own else None), 5)
        except OSError as e:  # TimeoutError included
            if own and e.errno == errno.EADDRNOTAVAIL:
                log(
                    f"ERROR [multiproc_executor.py:138] VLLM_HOST_IP={own} is not an address of "
                    f"this node: {e.strerror}"
                )
                return 1
            if time.monotonic() >= deadline:
                log(
                    "ERROR [multiproc_executor.py:140] torch.distributed.DistNetworkError: The "
                    "client socket has "
                    f"timed out after {c.join_timeout:.0f}s while trying to connect to "
                    f"({c.master_addr}, {c.master_port})."
                )
                return 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if stop.is_set():
                return 0
    try:
        writer.write(f"JOIN {c.rank} {c.nnodes} {c.probe_bytes}\n".encode())
        await writer.drain()
        answer = (await asyncio.wait_for(reader.readline(), 60)).decode(errors="replace").strip()
        if answer != "GO":
            log(
                f"ERROR [multiproc_executor.py:146] the head refused node rank {c.rank}: "
                f"{answer[4:] or 'no answer'}"
            )
            return 1
        chunk = b"\0" * (1 << 20)
        left = c.probe_bytes
        while left > 0:
            writer.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
            await writer.drain()
        answer = (await asyncio.wait_for(reader.readline(), 60)).decode(errors="replace").strip()
    except (TimeoutError, OSError) as e:
        log(f"ERROR [multiproc_executor.py:145] joining the head failed: {e.__class__.__name__}")
        return 1
    if answer != "OK":
        log(
            f"ERROR [multiproc_executor.py:146] the head refused node rank {c.rank}: "
            f"{answer[4:] or 'no answer'}"
        )
        return 1
    log(
        f"INFO [multiproc_executor.py:150] Node rank {c.rank} joined the head at "
        f"{c.master_addr}:{c.master_port}"
    )
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while True:
            line_task = asyncio.ensure_future(reader.readline())
            done, _ = await asyncio.wait(
                [line_task, stopped],
                timeout=max(c.worker_timeout, 3 * HEARTBEAT_SECONDS),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if stopped in done:
                line_task.cancel()
                return 0
            if line_task not in done:
                line_task.cancel()
                why = "no heartbeat from the head"
            else:
                try:
                    line = line_task.result()
                except OSError:
                    line = b""
                if line:
                    writer.write(b"HB\n")
                    with contextlib.suppress(OSError):
                        await writer.drain()
                    continue
                why = "connection closed by the head"
            log(f"WARN NCCL [rank{c.rank}] NET/Socket : {why} ({c.master_addr}:{c.master_port})")
            log(
                f"ERROR [multiproc_executor.py:160] [Rank {c.rank}] NCCL communicator was aborted: "
                f"{why}. "
                "Worker node exiting."
            )
            return 1
    finally:
        stopped.cancel()
        with contextlib.suppress(Exception):
            writer.close()
