"""A recipe's topology: how many Sparks it spans, its tensor and pipeline parallel sizes, how it
is launched (vLLM's native multi-node launch or Ray), and that part of a recipe checked."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetctl.inventory import Unit
from fleetctl.recipes.argv import flag_value, has_flag

#: How a recipe that spans several Sparks is launched: a Ray head and workers (vLLM's
#: ``--distributed-executor-backend ray``), or vLLM's own multi-node launch (``--nnodes/--node-rank/
#: --master-addr``, the workers ``--headless``).
LAUNCH_MODES = ("native", "ray")


_TOPOLOGY_KEYS = {
    "nodes",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "launch",
    "master_port",
    "ray_port",
}


#: vLLM's flags fleetctl renders per member from the topology and the fabric (never in vllm_args of
#: a multi-node recipe: one value for every member would be wrong on all but one).
MEMBER_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
                 "--distributed-executor-backend", "--data-parallel-address")


TP_FLAGS = ("--tensor-parallel-size", "-tp")


PP_FLAGS = ("--pipeline-parallel-size", "-pp")


#: The environment rendered from a member's fabric (a recipe's env may not set them for a unit).
FABRIC_ENV = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "TP_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_DISABLE",
    "VLLM_HOST_IP",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True)
class Topology:
    """How many Sparks a recipe spans and how the model is split across them (one GB10 GPU each)."""

    nodes: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    launch: str = "native"
    #: The head's torch.distributed port (native launch).
    master_port: int = 29501
    #: The Ray head's GCS port (ray launch).
    ray_port: int = 6379

    def start_order(self, unit: Unit) -> tuple[str, ...]:
        """Members in the order to start them: Ray's head first (workers join it; vLLM on the head
        waits for their GPUs), natively the headless workers first (the head serves once every rank
        has
        joined)."""
        return unit.members if self.launch == "ray" else (*unit.workers, unit.head)


@dataclass(frozen=True)
class MemberLaunch:
    """What one member runs: ``docker run --entrypoint ENTRYPOINT IMAGE ARGV...`` with ``env``."""

    host: str | None
    rank: int
    #: "head" (serves the API), "worker", or "single" (a recipe of one node).
    role: str
    entrypoint: str
    argv: tuple[str, ...]
    env: Mapping[str, str]


def _int_flag(args: Sequence[str], names: Sequence[str]) -> int | None:
    for n in names:
        v = flag_value(args, n)
        if v is not None:
            try:
                return int(v)
            except ValueError:
                return None
    return None


def build_topology(raw: Any, args: Sequence[str], env: Mapping[str, str],
                    bad: Callable[[str, str, str], None]) -> Topology:
    """The recipe's topology (one node when absent); the parallel sizes default to vllm_args'
    flags."""
    if raw is None:
        return Topology()
    if not isinstance(raw, Mapping):
        bad(
            "topology",
            "must be a mapping",
            "e.g. topology: {nodes: 2, tensor_parallel_size: 2, launch: native}",
        )
        return Topology()
    for key in sorted(set(raw) - _TOPOLOGY_KEYS):
        bad(f"topology.{key}", "unknown field", f"use one of: {', '.join(sorted(_TOPOLOGY_KEYS))}")

    def number(key: str, default: int, high: int) -> int:
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= high:
            bad(
                f"topology.{key}",
                f"{v!r} is not a number from 1 to {high}",
                f"e.g. {key}: {default}",
            )
            return default
        return v

    nodes = number("nodes", 1, 64)
    tp_flag, pp_flag = _int_flag(args, TP_FLAGS), _int_flag(args, PP_FLAGS)
    tp = number("tensor_parallel_size", tp_flag or (nodes if not pp_flag else 1), 512)
    pp = number("pipeline_parallel_size", pp_flag or max(1, nodes // tp), 512)
    for key, flag, value in (
        ("tensor_parallel_size", tp_flag, tp),
        ("pipeline_parallel_size", pp_flag, pp),
    ):
        if flag is not None and flag != value:
            bad(
                f"topology.{key}",
                f"{value} disagrees with vllm_args' {flag}",
                "drop the flag from vllm_args (fleetctl renders it from the topology), or make "
                "them equal",
            )
    launch = _launch(raw.get("launch", "native"), bad)
    master_port, ray_port = number("master_port", 29501, 65535), number("ray_port", 6379, 65535)
    if tp * pp != nodes:
        bad(
            "topology",
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} needs {tp * pp} GPUs, but "
            f"{nodes} node(s) have {nodes} (one GB10 each)",
            f"make tensor_parallel_size x pipeline_parallel_size equal nodes (e.g. {nodes} x 1)",
        )
    if nodes > 1:
        _no_member_settings(args, env, bad)
    return Topology(nodes, tp, pp, str(launch), master_port, ray_port)


def _launch(launch: Any, bad: Callable[[str, str, str], None]) -> str:
    """The launch mode, native when it names none."""
    if launch not in LAUNCH_MODES:
        bad(
            "topology.launch",
            f"{launch!r} is not a launch mode",
            "use native (vLLM's --nnodes/--node-rank/--master-addr, headless workers) or ray (a "
            "Ray head and workers)",
        )
        return "native"
    return str(launch)


def _no_member_settings(args: Sequence[str], env: Mapping[str, str],
                        bad: Callable[[str, str, str], None]) -> None:
    """Refuse, in a multi-node recipe, the flags and environment fleetctl renders per member."""
    for own in MEMBER_FLAGS:
        if has_flag(args, own):
            bad(
                f"vllm_args {own}",
                "differs per member of a unit: fleetctl renders it from the topology "
                "and the fabric",
                f"remove {own} from vllm_args",
            )
    for name in FABRIC_ENV:
        if name in env:
            bad(
                f"env.{name}",
                "is rendered from each member's fabric (fleetctl_fabric in the inventory)",
                f"remove {name} from env; set the member's interfaces/hcas/addresses in "
                "fleetctl_fabric instead",
            )
