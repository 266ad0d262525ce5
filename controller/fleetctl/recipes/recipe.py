"""One serving recipe as fleetctl runs it: image, weights, served names, vLLM flags, soak settings,
and each member's command line and environment rendered from its unit's fabric."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetctl import secretenv
from fleetctl.errors import RecipeError
from fleetctl.inventory import Unit
from fleetctl.recipes.argv import flag_value, has_flag
from fleetctl.recipes.topology import PP_FLAGS, TP_FLAGS, MemberLaunch, Topology
from fleetctl.recipes.weights import CacheDir, WeightSet
from fleetctl.urls import host_port


@dataclass(frozen=True)
class Recipe:
    """A model profile: what to run, with which weights and flags, and how to soak it."""

    name: str
    #: Image repository without a tag (the rollout picks the tag).
    image: str
    served_model_names: tuple[str, ...]
    port: int
    weights: tuple[WeightSet, ...]
    #: vLLM flags after ``serve MODEL``, verbatim from the recipe.
    vllm_args: tuple[str, ...]
    #: Non-secret container environment.
    env: Mapping[str, str] = field(default_factory=dict)
    #: Names of secret variables whose values come from the controller's environment, never stored.
    secret_env: tuple[str, ...] = ()
    #: Extra ``docker run`` arguments (``--shm-size=16g`` ...).
    docker_args: tuple[str, ...] = ()
    #: Raw soak settings, parsed by ``fleetctl.soak.config``.
    soak: Mapping[str, Any] = field(default_factory=dict)
    #: Raw ``fleetctl watch`` policy (remediation, breaker, floor), parsed by
    #: ``fleetctl.remediate.policy``.
    watch: Mapping[str, Any] = field(default_factory=dict)
    #: Free disk the host needs for image + weights + headroom (GB).
    min_free_gb: float = 0.0
    #: Where weights come from: "hub", "mirror", or None (the mirror if the inventory has one).
    source: str | None = None
    description: str = ""
    #: The operator's opt-in to model code from the hub: ``--trust-remote-code`` is refused without
    #: it, and staging refuses weights carrying code (``*.py``, an ``auto_map`` in config.json).
    trust_remote_code: bool = False
    #: How many Sparks the recipe spans and how it is launched across them.
    topology: Topology = field(default_factory=Topology)
    #: The server's compile caches, shared from the canary to the waves (empty: every host
    #: compiles).
    compile_cache: tuple[CacheDir, ...] = ()
    #: What the body takes besides text (``image`` ...), as the recipe declares it (empty: only
    #: what its flags show); the gate probes images when it is there.
    modalities: tuple[str, ...] = ()

    def parallel_args(self) -> list[str]:
        """The tensor/pipeline parallel flags of a multi-node recipe, unless vllm_args gives
        them."""
        t = self.topology
        out: list[str] = []
        if not any(has_flag(self.vllm_args, f) for f in TP_FLAGS):
            out += ["--tensor-parallel-size", str(t.tensor_parallel_size)]
        if not any(has_flag(self.vllm_args, f) for f in PP_FLAGS):
            out += ["--pipeline-parallel-size", str(t.pipeline_parallel_size)]
        return out

    def launch(self, unit: Unit | None = None, host: str | None = None) -> MemberLaunch:
        """The command and environment of ``host`` as a member of ``unit`` (or of a single host).

        The environment pins every collective to the fabric: NCCL's, Gloo's, UCX's and torch's
        sockets to the member's QSFP netdev, NCCL's RDMA to both of the port's HCAs, and vLLM's own
        address (``VLLM_HOST_IP``) to its fabric address, so that nothing falls back to the
        management network.
        """
        t = self.topology
        if t.nodes == 1 or unit is None:
            return MemberLaunch(host, 0, "single", "vllm", tuple(self.serve_argv()), dict(self.env))
        if host not in unit.members:
            raise RecipeError(
                f"{host} is not a member of unit {unit.name!r} ({', '.join(unit.members)})",
                host=host,
                fix="launch the unit's own members",
            )
        rank = unit.rank(host)
        f = unit.fabric[host]
        head = unit.fabric[unit.head].address
        env = {
            **self.env,
            "NCCL_SOCKET_IFNAME": f.interface,
            "GLOO_SOCKET_IFNAME": f.interface,
            "UCX_NET_DEVICES": f.interface,
            "TP_SOCKET_IFNAME": f.interface,
            "NCCL_IB_HCA": ",".join(f.hcas),
            "NCCL_IB_DISABLE": "0",
            "VLLM_HOST_IP": f.address,
            "MASTER_ADDR": head,
            "MASTER_PORT": str(t.master_port),
        }
        role = "head" if rank == 0 else "worker"
        serve = [*self.serve_argv(), *self.parallel_args()]
        if t.launch == "native":
            argv = [
                *serve,
                "--nnodes",
                str(t.nodes),
                "--node-rank",
                str(rank),
                "--master-addr",
                head,
                "--master-port",
                str(t.master_port),
            ]
            if rank:
                argv.append("--headless")
            return MemberLaunch(host, rank, role, "vllm", tuple(argv), env)
        if rank == 0:
            script = (f"ray start --head --node-ip-address={f.address} --port={t.ray_port} && "
                      f"exec vllm {shlex.join([*serve, '--distributed-executor-backend', 'ray'])}")
        else:
            script = (f"exec ray start --block --address={host_port(head, t.ray_port)} "
                      f"--node-ip-address={f.address}")
        return MemberLaunch(host, rank, role, "/bin/sh", ("-c", script), env)

    @property
    def body(self) -> WeightSet:
        """The body (target model) weight set."""
        return next(w for w in self.weights if w.role == "body")

    @property
    def drafter(self) -> WeightSet | None:
        """The drafter weight set, if the recipe uses one."""
        return next((w for w in self.weights if w.role == "drafter"), None)

    def flag(self, name: str) -> str | None:
        """The value of vLLM flag ``name`` (``--x v`` or ``--x=v``), or None when absent."""
        return flag_value(self.vllm_args, name)

    def speculative_config(self) -> dict[str, Any] | None:
        """The parsed ``--speculative-config`` JSON, or None."""
        raw = self.flag("--speculative-config")
        if raw is None:
            return None
        parsed = json.loads(raw)
        return parsed if isinstance(parsed, dict) else None

    def serve_argv(self) -> list[str]:
        """Everything after the image in ``docker run ... --entrypoint vllm IMAGE``."""
        argv = [
            "serve",
            self.body.mount,
            "--served-model-name",
            *self.served_model_names,
            *self.vllm_args,
        ]
        if not has_flag(self.vllm_args, "--port"):
            argv += ["--port", str(self.port)]
        return argv

    @property
    def warnings(self) -> tuple[str, ...]:
        """Settings that work but weaken the fleet's security, each with its fix (shown, not
        refused)."""
        out: list[str] = []
        if secretenv.HUB_TOKEN_ENV in self.secret_env:
            out.append(
                f"recipe {self.name!r} lists {secretenv.HUB_TOKEN_ENV} in secret_env: serving "
                "containers do "
                "not get it (anyone in the docker group could read it with `docker inspect`, and "
                "weights "
                f"are staged before by `fleetctl stage`, which reads ${secretenv.HUB_TOKEN_ENV} "
                "itself); "
                f"remove it from secret_env"
            )
        host = self.flag("--host")
        if secretenv.API_KEY_ENV not in self.secret_env and host in (None, "0.0.0.0", "::", ""):
            out.append(
                f"recipe {self.name!r} serves an API without a key on every interface of the host "
                f"(--network host, --host {host or '0.0.0.0 (vLLM default)'}); list "
                f"{secretenv.API_KEY_ENV} in "
                f"secret_env and set it on the controller (docs/security.md)"
            )
        return tuple(out)

    def mounts(self) -> list[tuple[str, str]]:
        """``(host path, container path)`` pairs to bind-mount read-only."""
        return [(w.path, w.mount) for w in self.weights]
