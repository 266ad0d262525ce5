"""A stand-in for the parts of torch that the all-reduce probe's NCCL path calls, for CI (no GPU).

Ranks are threads of one process; a "world" per port sums each collective's tensors once every
rank has called it. It behaves as torch and NCCL did on a real two-GPU host where it matters:
ranks on one CUDA device fail at the first collective (NCCL's ``Duplicate GPU detected``), a
collective whose peer has left never completes (here: fails at once, naming the rank), and a
rendezvous waits for its timeout, torch's default being minutes (here: refused past 30 s, so that a
test fails instead of hanging). ``corrupt`` flips one element of a rank's result of one collective.
With ``one_host=False`` the ranks stand for hosts of one GPU each (device 0 everywhere is right).
"""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

#: torch.distributed's default timeout for a process group (and its rendezvous), in seconds.
DEFAULT_TIMEOUT = 600.0
#: Longest the stand-in really waits; a longer wait is reported instead of made.
MAX_WAIT = 30.0


class Tensor:
    """A 1-D float tensor as a list: just the operations the probe uses."""

    def __init__(self, data: Iterable[float]) -> None:
        self.data = [float(v) for v in data]

    def fill_(self, v: float) -> Tensor:
        self.data = [float(v)] * len(self.data)
        return self

    def __sub__(self, v: float) -> Tensor:
        return Tensor(d - v for d in self.data)

    def abs(self) -> Tensor:
        return Tensor(abs(d) for d in self.data)

    def __gt__(self, v: object) -> Tensor:
        return Tensor(float(d > v) for d in self.data)  # type: ignore[operator]

    def __ne__(self, v: object) -> Tensor:  # type: ignore[override]
        return Tensor(float(d != v) for d in self.data)

    __hash__ = None  # type: ignore[assignment]

    def sum(self) -> Tensor:
        return Tensor([sum(self.data)])

    def item(self) -> float:
        return self.data[0]

    def tolist(self) -> list[float]:
        return list(self.data)


class World:
    """The ranks of one process group (one port)."""

    def __init__(self, n: int, one_host: bool = True) -> None:
        self.n = n
        self.one_host = one_host
        self.cv = threading.Condition()
        self.devices: dict[int, int] = {}
        self.joined: set[int] = set()
        self.left: set[int] = set()
        self.calls: dict[int, int] = {}
        self.slots: dict[int, dict[int, list[float]]] = {}
        #: (rank, collective number of that rank) whose result gets one wrong element.
        self.corrupt: set[tuple[int, int]] = set()

    def rendezvous(self, rank: int, device: int, timeout: float) -> None:
        with self.cv:
            self.joined.add(rank)
            self.devices[rank] = device
            self.cv.notify_all()
            end = time.monotonic() + min(timeout, MAX_WAIT)
            while len(self.joined) < self.n:
                if time.monotonic() >= end:
                    missing = sorted(set(range(self.n)) - self.joined)
                    raise RuntimeError(f"rendezvous: ranks {missing} missing after {timeout:.0f} s")
                self.cv.wait(0.05)

    def all_reduce(self, rank: int, data: list[float]) -> list[float]:
        with self.cv:
            seq = self.calls.get(rank, 0)
            self.calls[rank] = seq + 1
            slot = self.slots.setdefault(seq, {})
            slot[rank] = data
            self.cv.notify_all()
            while len(slot) < self.n:
                gone = sorted(self.left - set(slot))
                if gone:
                    raise RuntimeError(f"NCCL: rank {gone[0]} left the group: this all_reduce "
                                       f"(call {seq} of rank {rank}) never completes")
                if not self.cv.wait(MAX_WAIT):
                    raise RuntimeError(f"all_reduce call {seq} of rank {rank} got no peer")
            if self.one_host and len(set(self.devices.values())) < self.n:
                a, b = sorted(self.devices)[:2]
                raise RuntimeError(f"ncclInvalidUsage: Duplicate GPU detected : rank {a} and "
                                   f"rank {b} both on CUDA device {self.devices[a]}")
            out = [sum(vals) for vals in zip(*slot.values(), strict=True)]
            if (rank, seq) in self.corrupt:
                out[0] += 1.0
            return out

    def leave(self, rank: int) -> None:
        with self.cv:
            self.left.add(rank)
            self.cv.notify_all()


class FakeTorch:
    """``torch`` and ``torch.distributed`` as modules, with their shared state."""

    def __init__(self, gpus: int = 2, one_host: bool = True) -> None:
        self.gpus = gpus
        self.one_host = one_host
        self.worlds: dict[int, World] = {}
        self.stores: dict[int, dict[str, str]] = {}
        self.lock = threading.Lock()
        self.local = threading.local()
        #: Every set_device call: (thread name, device).
        self.devices_set: list[tuple[str, int]] = []
        self.torch = self._torch()
        self.dist = self._dist()
        self.torch.distributed = self.dist  # type: ignore[attr-defined]

    def install(self, monkeypatch: Any) -> None:
        """Make ``import torch`` and ``import torch.distributed`` find this one."""
        monkeypatch.setitem(sys.modules, "torch", self.torch)
        monkeypatch.setitem(sys.modules, "torch.distributed", self.dist)

    def world(self, port: int, n: int) -> World:
        with self.lock:
            return self.worlds.setdefault(port, World(n, self.one_host))

    def _torch(self) -> types.ModuleType:
        t = types.ModuleType("torch")
        cuda = types.SimpleNamespace()
        local = self.local

        def set_device(d: int) -> None:
            local.device = d
            self.devices_set.append((threading.current_thread().name, d))

        cuda.is_available = lambda: True
        cuda.device_count = lambda: self.gpus
        cuda.set_device = set_device
        cuda.synchronize = lambda: None
        cuda.nccl = types.SimpleNamespace(version=lambda: (2, 28, 9))
        t.cuda = cuda  # type: ignore[attr-defined]
        t.float32, t.float64 = "float32", "float64"  # type: ignore[attr-defined]
        t.full = lambda shape, v, dtype=None, device=None: Tensor([v] * shape[0])  # type: ignore
        t.tensor = lambda data, dtype=None, device=None: Tensor(data)  # type: ignore
        return t

    def _dist(self) -> types.ModuleType:
        d = types.ModuleType("torch.distributed")
        fake = self

        class TCPStore:
            def __init__(self, host: str, port: int, world_size: int | None = None,
                         is_master: bool = False,
                         timeout: timedelta = timedelta(seconds=DEFAULT_TIMEOUT),
                         wait_for_workers: bool = True) -> None:
                self.port = port
                if is_master:
                    with fake.lock:
                        fake.stores.setdefault(port, {})
                    return
                end = time.monotonic() + min(timeout.total_seconds(), MAX_WAIT)
                while port not in fake.stores:
                    if time.monotonic() >= end:
                        ms = timeout.total_seconds() * 1000
                        raise RuntimeError(f"The client socket has timed out after {ms:.0f}ms "
                                           f"while trying to connect to ({host}, {port}).")
                    time.sleep(0.02)

            def set(self, key: str, value: str) -> None:
                with fake.lock:
                    fake.stores[self.port][key] = value

            def check(self, keys: list[str]) -> bool:
                with fake.lock:
                    return all(k in fake.stores[self.port] for k in keys)

        def init_process_group(backend: str, init_method: str | None = None, store: Any = None,
                               rank: int = 0, world_size: int = 1,
                               timeout: timedelta | None = None) -> None:
            port = store.port if store is not None else int(str(init_method).rsplit(":", 1)[1])
            w = fake.world(port, world_size)
            fake.local.group = (w, rank)
            limit = timeout.total_seconds() if timeout is not None else DEFAULT_TIMEOUT
            if store is not None:
                with w.cv:  # the caller's store already saw every rank
                    w.joined.add(rank)
                    w.devices[rank] = getattr(fake.local, "device", 0)
                return
            if limit > MAX_WAIT:
                # torch would wait its default without a word: say so rather than block
                with w.cv:
                    w.joined.add(rank)
                    w.devices[rank] = getattr(fake.local, "device", 0)
                    w.cv.notify_all()
                    w.cv.wait_for(lambda: len(w.joined) >= w.n, timeout=2.0)
                    if len(w.joined) < w.n:
                        raise RuntimeError(f"init_process_group would wait torch's default "
                                           f"{limit:.0f} s for the missing ranks")
                return
            w.rendezvous(rank, getattr(fake.local, "device", 0), limit)

        def all_reduce(x: Tensor, op: Any = None) -> None:
            w, rank = fake.local.group
            x.data = w.all_reduce(rank, x.data)

        def destroy_process_group() -> None:
            w, rank = fake.local.group
            w.leave(rank)

        d.TCPStore = TCPStore  # type: ignore[attr-defined]
        d.init_process_group = init_process_group  # type: ignore[attr-defined]
        d.all_reduce = all_reduce  # type: ignore[attr-defined]
        d.destroy_process_group = destroy_process_group  # type: ignore[attr-defined]
        return d
