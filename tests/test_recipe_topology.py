"""A recipe's topology: validated, and rendered per member of a unit (command line and fabric
environment)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleetctl.inventory import Fabric, Unit
from fleetctl.recipes import RecipeValidationError, Topology, parse_recipes

BODY: dict[str, Any] = {
    "image": "vllm/vllm-openai",
    "served_model_names": ["glm-pair"],
    "weights": [
        {
            "role": "body",
            "repo": "zai-org/GLM-4.6-FP8",
            "revision": "main",
            "path": "/opt/glm/fp8",
            "mount": "/model",
            "format": "bf16",
        }
    ],
    "vllm_args": ["--max-model-len", "65536", "--gpu-memory-utilization", "0.80"],
    "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    "topology": {"nodes": 2},
}

UNIT = Unit("pair-a", ("spark-07", "spark-08"), {
    "spark-07": Fabric(addresses=("192.168.177.17",)),
    "spark-08": Fabric(addresses=("192.168.177.18",), interfaces=("enp1s0f0np0", "enP2p1s0f0np0"),
                       hcas=("rocep1s0f0", "roceP2p1s0f0")),
})


def recipe(**topology: Any) -> Any:
    body = copy.deepcopy(BODY)
    body["topology"].update(topology)
    return parse_recipes({"glm-pair": body})["glm-pair"]


def problems(body: dict[str, Any]) -> list[str]:
    with pytest.raises(RecipeValidationError) as e:
        parse_recipes({"r": body})
    return [p.line() for p in e.value.problems]


def test_a_recipe_without_topology_is_one_node() -> None:
    body = {k: v for k, v in BODY.items() if k != "topology"}
    r = parse_recipes({"one": body})["one"]
    assert r.topology == Topology()
    launch = r.launch(UNIT, "spark-07")  # a one-node recipe ignores any unit
    assert (launch.role, launch.entrypoint, list(launch.argv)) == ("single", "vllm", r.serve_argv())
    assert "NCCL_SOCKET_IFNAME" not in launch.env


def test_native_launch_per_member() -> None:
    r = recipe()
    assert (
        r.topology.tensor_parallel_size,
        r.topology.pipeline_parallel_size,
        r.topology.launch,
    ) == (2, 1, "native")
    head, worker = r.launch(UNIT, "spark-07"), r.launch(UNIT, "spark-08")
    assert (
        head.role == "head"
        and worker.role == "worker"
        and head.entrypoint == worker.entrypoint == "vllm"
    )
    assert list(head.argv[-12:]) == [
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "1",
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "192.168.177.17",
        "--master-port",
        "29501",
    ]
    assert (
        worker.argv[worker.argv.index("--node-rank") + 1] == "1" and worker.argv[-1] == "--headless"
    )
    assert "--headless" not in head.argv
    assert worker.env["NCCL_SOCKET_IFNAME"] == worker.env["GLOO_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert (
        worker.env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
        and worker.env["VLLM_HOST_IP"] == "192.168.177.18"
    )
    assert (
        head.env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        and head.env["MASTER_ADDR"] == "192.168.177.17"
    )
    assert head.env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1" and head.env["NCCL_IB_DISABLE"] == "0"
    assert r.topology.start_order(UNIT) == (
        "spark-08",
        "spark-07",
    )  # headless workers first, the head last


def test_ray_launch_per_member() -> None:
    r = recipe(launch="ray", ray_port=6380)
    head, worker = r.launch(UNIT, "spark-07"), r.launch(UNIT, "spark-08")
    assert head.entrypoint == worker.entrypoint == "/bin/sh" and head.argv[0] == "-c"
    assert head.argv[1].startswith(
        "ray start --head --node-ip-address=192.168.177.17 --port=6380 && exec vllm serve "
    )
    assert (
        "--distributed-executor-backend ray" in head.argv[1]
        and "--tensor-parallel-size 2" in head.argv[1]
    )
    assert (
        worker.argv[1]
        == "exec ray start --block --address=192.168.177.17:6380 --node-ip-address=192.168.177.18"
    )
    assert r.topology.start_order(UNIT) == ("spark-07", "spark-08")


def test_parallel_flags_already_in_vllm_args_are_not_repeated() -> None:
    body = copy.deepcopy(BODY)
    body["vllm_args"] += ["--tensor-parallel-size", "2"]
    r = parse_recipes({"r": body})["r"]
    argv = r.launch(UNIT, "spark-07").argv
    assert argv.count("--tensor-parallel-size") == 1 and argv.count("--pipeline-parallel-size") == 1


def test_pipeline_parallel_pair() -> None:
    r = recipe(tensor_parallel_size=1, pipeline_parallel_size=2)
    argv = r.launch(UNIT, "spark-08").argv
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    # tensor parallel 1 given in vllm_args: the pair splits by pipeline stages
    body = copy.deepcopy(BODY)
    body["vllm_args"] += ["--tensor-parallel-size", "1"]
    t = parse_recipes({"r": body})["r"].topology
    assert (t.tensor_parallel_size, t.pipeline_parallel_size) == (1, 2)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"topology": {"nodes": 2, "tensor_parallel_size": 4}},
            "needs 4 GPUs, but 2 node(s) have 2",
        ),
        ({"topology": {"nodes": 2, "launch": "mpi"}}, "'mpi' is not a launch mode"),
        ({"topology": {"nodes": 0}}, "topology.nodes: 0 is not a number"),
        ({"topology": {"nodes": 2, "gpus": 2}}, "topology.gpus: unknown field"),
        ({"topology": [2]}, "topology: must be a mapping"),
        (
            {
                "vllm_args": ["--tensor-parallel-size", "1"],
                "topology": {"nodes": 2, "tensor_parallel_size": 2},
            },
            "2 disagrees with vllm_args' 1",
        ),
        ({"vllm_args": ["--nnodes", "2"]}, "vllm_args --nnodes: differs per member"),
        ({"vllm_args": ["--headless"]}, "vllm_args --headless: differs per member"),
        (
            {"env": {"NCCL_SOCKET_IFNAME": "eth0"}},
            "env.NCCL_SOCKET_IFNAME: is rendered from each member's fabric",
        ),
    ],
)
def test_topology_problems_name_the_field(change: dict[str, Any], words: str) -> None:
    body = copy.deepcopy(BODY)
    body.update(change)
    found = problems(body)
    assert any(words in p for p in found), found
    assert all("fix:" in p for p in found)


def test_a_host_outside_the_unit_is_refused() -> None:
    with pytest.raises(Exception, match="not a member of unit 'pair-a'"):
        recipe().launch(UNIT, "spark-01")
