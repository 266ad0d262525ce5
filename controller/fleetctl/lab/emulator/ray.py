"""The ``ray`` command of the lab's vLLM stand-in image: what a unit's Ray launch runs, and no more.

- ``ray start --head --node-ip-address=A --port=P``: records the cluster's address (``A:P``) in
  ``ray_current_cluster`` under ``EMU_RAY_DIR`` (default /tmp/ray, Ray's own place) and returns, as
  Ray's daemonising start does; the head's ``vllm serve ... --distributed-executor-backend ray``
  then listens there for tp x pp nodes (:mod:`.multinode`);
- ``ray start --block --address=H:P --node-ip-address=A``: a worker node, joining the head at
``H:P``
  (retrying until the head's vLLM listens) and staying until the head is gone (exit 1) or it is
  stopped.

Standard library only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence

from . import multinode


def _log(line: str) -> None:
    level, _, rest = line.partition(" ")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {level} {rest}", flush=True)


def _options(argv: Sequence[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for a in argv:
        if a.startswith("--"):
            key, eq, value = a[2:].partition("=")
            out[key] = value if eq else True
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``ray start ...``: see the module's text."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "start":
        print("Usage: ray start [--head --port=P | --block --address=H:P] --node-ip-address=A "
              "(the lab's stand-in knows only `ray start`)", file=sys.stderr)
        return 2
    opts = _options(args[1:])
    if opts.get("head"):
        ip, port = str(opts.get("node-ip-address") or "127.0.0.1"), str(opts.get("port") or "6379")
        os.makedirs(multinode.ray_dir(), exist_ok=True)
        with open(os.path.join(multinode.ray_dir(), "ray_current_cluster"), "w") as f:
            f.write(f"{ip}:{port}\n")
        _log(
            f"INFO Ray runtime started. Local node IP: {ip}; to add another node: ray start "
            f"--address='{ip}:{port}'"
        )
        return 0
    address = str(opts.get("address") or "")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        print(f"ray start: --address {address!r} is not HOST:PORT", file=sys.stderr)
        return 2
    if opts.get("node-ip-address"):
        os.environ.setdefault("VLLM_HOST_IP", str(opts["node-ip-address"]))
    cluster = multinode.Cluster(
        0,
        0,
        host,
        int(port),
        True,
        join_timeout=multinode._env_float("EMU_JOIN_TIMEOUT_SECONDS", 600.0),
        worker_timeout=multinode._env_float("EMU_WORKER_TIMEOUT_SECONDS", 10.0),
        probe_bytes=int(
            multinode._env_float("EMU_LINK_PROBE_BYTES", multinode.DEFAULT_PROBE_BYTES)
        ),
    )
    _log(f"INFO Ray runtime started. Joining the cluster at {address}")

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await multinode.run_worker(cluster, _log, stop)

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
