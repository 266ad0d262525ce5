"""The emulator's multi-node mode, as real processes on loopback: a head and its headless workers.

The head waits (API port closed) until every rank joined over the master address, then serves; a
worker killed afterwards wedges the head (/health 200, no token); a head killed makes its worker
exit.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetctl import fabric
from tests.lab.emulator.test_server import READY_TIMEOUT, Emu, Launcher, _free_port, _refused

NAMES = ["--served-model-name", "glm-pair"]


def wait_log(emu: Emu, text: str, timeout: float = READY_TIMEOUT, alive: bool = True) -> None:
    import time

    deadline = time.monotonic() + timeout
    while text not in emu.text():
        assert not alive or emu.proc.poll() is None, f"exited early:\n{emu.text()}"
        assert time.monotonic() < deadline, f"never logged {text!r}:\n{emu.text()}"
        time.sleep(0.05)


def pair(launcher: Launcher, model: Path, master_port: int, env: dict[str, str] | None = None,
         nnodes: int = 2) -> tuple[Emu, list[Emu]]:
    common = [str(model), *NAMES, "--tensor-parallel-size", str(nnodes), "--nnodes", str(nnodes),
              "--master-addr", "127.0.0.1", "--master-port", str(master_port)]
    head = launcher.start([*common, "--node-rank", "0"], env=env, wait=False)
    wait_log(head, "worker node(s) to join at 127.0.0.1")
    assert _refused(head.port), "the API must stay closed until every worker joined"
    workers = [launcher.start([*common, "--node-rank", str(r), "--headless"], env=env, wait=False)
               for r in range(1, nnodes)]
    wait_log(head, "Application startup complete.")
    return head, workers


def chat(url: str) -> str:
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=30,
        json={
            "model": "glm-pair",
            "messages": [{"role": "user", "content": "What is 17 × 23?"}],
            "temperature": 0,
            "max_tokens": 64,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def test_head_serves_once_every_worker_joined(launcher: Launcher, model: Path) -> None:
    head, workers = pair(launcher, model, _free_port(), nnodes=3)
    assert "All 3 nodes joined" in head.text()
    for w in workers:
        wait_log(w, "joined the head at 127.0.0.1")
    assert "391" in chat(head.url)
    assert httpx.get(head.url + "/health", timeout=10).status_code == 200


def test_a_worker_death_wedges_the_head(launcher: Launcher, model: Path) -> None:
    head, (worker,) = pair(launcher, model, _free_port())
    assert "391" in chat(head.url)
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait(timeout=10)
    wait_log(head, "Watchdog caught collective operation timeout")
    assert "node rank 1 (127.0.0.1): connection closed by peer" in head.text()
    # the API still says healthy, and nothing comes out of it
    assert httpx.get(head.url + "/health", timeout=10).status_code == 200
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream(
            "POST",
            head.url + "/v1/chat/completions",
            timeout=httpx.Timeout(10, read=3),
            json={
                "model": "glm-pair",
                "messages": [{"role": "user", "content": "hello"}],
                "stream": True,
            },
        ) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            assert '"content"' not in line, f"a token came out of a wedged head: {line}"
    assert (
        head.proc.poll() is None and httpx.get(head.url + "/health", timeout=10).status_code == 200
    )


def test_an_nccl_error_wedges_the_head_with_its_worker_up(launcher: Launcher, model: Path) -> None:
    """EMU_NCCL_HANG_AFTER_SECONDS: NCCL's RDMA completion error in the head's log, then no token;
    the worker
    keeps running (the hang the issue's users report, found only in the log)."""
    head, (worker,) = pair(launcher, model, _free_port(), env={"EMU_NCCL_HANG_AFTER_SECONDS": "1"})
    assert "391" in chat(head.url)  # served: the hang is timed from the first request
    wait_log(head, "Watchdog caught collective operation timeout")
    errors = fabric.collective_errors(head.text())
    assert any(
        "NET/IB : Got completion from peer 127.0.0.1" in e and "IBV_WC_RETRY_EXC_ERR(12)" in e
        for e in errors
    ), errors
    assert worker.proc.poll() is None
    assert httpx.get(head.url + "/health", timeout=10).status_code == 200
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream(
            "POST",
            head.url + "/v1/chat/completions",
            timeout=httpx.Timeout(10, read=3),
            json={
                "model": "glm-pair",
                "messages": [{"role": "user", "content": "hello"}],
                "stream": True,
            },
        ) as r,
    ):
        for line in r.iter_lines():
            assert '"content"' not in line, f"a token came out of a wedged head: {line}"


def test_a_head_death_stops_its_worker(launcher: Launcher, model: Path) -> None:
    head, (worker,) = pair(launcher, model, _free_port())
    head.proc.send_signal(signal.SIGKILL)
    assert worker.wait_exit() == 1
    assert "NCCL communicator was aborted: connection closed by the head" in worker.text()


def test_a_worker_started_first_waits_for_its_head(launcher: Launcher, model: Path) -> None:
    port = _free_port()
    common = [
        str(model),
        *NAMES,
        "--nnodes",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]
    worker = launcher.start([*common, "--node-rank", "1", "--headless"], wait=False)
    wait_log(worker, "Launching headless worker node rank 1 of 2")
    head = launcher.start([*common, "--node-rank", "0"])
    wait_log(worker, "joined the head")
    assert "391" in chat(head.url)


def test_a_slow_link_slows_the_head(launcher: Launcher, model: Path) -> None:
    head, _ = pair(launcher, model, _free_port(), env={"EMU_LINK_REFERENCE_MBPS": "1e12"})
    assert "decode throughput x0.05" in head.text()


def test_refusals(launcher: Launcher, model: Path) -> None:
    port = _free_port()
    common = [str(model), *NAMES, "--master-addr", "127.0.0.1", "--master-port", str(port)]
    rank1 = launcher.start([*common, "--nnodes", "2", "--node-rank", "1"], wait=False)
    assert rank1.wait_exit() == 2 and "needs --headless" in rank1.text()
    head, _ = pair(launcher, model, port)
    late = launcher.start([*common, "--nnodes", "2", "--node-rank", "1", "--headless"], wait=False)
    assert late.wait_exit() == 1 and "the head refused node rank 1" in late.text()
    wrong = launcher.start([*common, "--nnodes", "4", "--node-rank", "3", "--headless"], wait=False)
    assert wrong.wait_exit() == 1 and "worker says --nnodes 4, the head has 2" in wrong.text()
    timeout = launcher.start([str(model), *NAMES, "--nnodes", "2", "--node-rank", "1", "--headless",
                              "--master-addr", "127.0.0.1", "--master-port", str(_free_port())],
                             env={"EMU_JOIN_TIMEOUT_SECONDS": "1"}, wait=False)
    assert timeout.wait_exit() == 1 and "DistNetworkError" in timeout.text()
    elsewhere = launcher.start(
        [*common, "--nnodes", "2", "--node-rank", "1", "--headless"],
        env={"VLLM_HOST_IP": "192.0.2.7"},
        wait=False,
    )  # TEST-NET-1: on no interface here
    assert (
        elsewhere.wait_exit() == 1
        and "VLLM_HOST_IP=192.0.2.7 is not an address of this node" in elsewhere.text()
    )
    assert head.proc.poll() is None


@pytest.mark.parametrize("mode", ["native", "ray"])
def test_the_lab_pair_recipe_as_fleetctl_renders_it_boots_a_unit(
    launcher: Launcher, model: Path, mode: str, tmp_path: Path
) -> None:
    """Each member's command line from Recipe.launch (the lab's 2-node recipe, in each launch mode)
    run as it is, on loopback: natively the headless worker then the head; with Ray each member's
    ``/bin/sh -c`` line (``ray start --head ... && exec vllm serve ...
    --distributed-executor-backend ray``, ``exec ray
    start
    --block ...``), with the emulator's ``vllm`` and ``ray`` commands on PATH."""
    import dataclasses

    from fleetctl import paths
    from fleetctl.inventory import Fabric, Unit
    from fleetctl.recipes import parse_recipes

    raw = (
        paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"
    ).read_text()
    import yaml

    recipe = parse_recipes(yaml.safe_load(raw)["fleetctl_recipes"])["qwen35-35b-bf16-pair"]
    recipe = dataclasses.replace(recipe, topology=dataclasses.replace(
        recipe.topology, master_port=_free_port(), ray_port=_free_port(), launch=mode))
    unit = Unit("pair-a", ("spark-03", "spark-04"), {"spark-03": Fabric(addresses=("127.0.0.1",)),
                                                     "spark-04": Fabric(addresses=("127.0.0.2",))})
    if mode == "ray":
        head = _boot_ray_unit(recipe, unit, model, tmp_path)
        assert (
            "All 2 nodes joined" in head.text()
            and "Node rank 1 joined from 127.0.0.2" in head.text()
        )
        assert "391" in chat_as(head.url, "qwen3.5-35b-pair")
        return
    procs = {}
    for host in recipe.topology.start_order(unit):  # the headless worker first, then the head
        launch = recipe.launch(unit, host)
        assert launch.entrypoint == "vllm" and launch.argv[0] == "serve"
        argv = [str(model) if a == recipe.body.mount else a for a in launch.argv[1:]]
        procs[host] = launcher.start(argv, env=dict(launch.env), wait=launch.role == "head")
    head = procs["spark-03"]
    assert (
        "All 2 nodes joined" in head.text() and "Node rank 1 joined from 127.0.0.2" in head.text()
    )
    r = httpx.post(head.url + "/v1/chat/completions", timeout=30, json={
        "model": "qwen3.5-35b-pair", "messages": [{"role": "user", "content": "What is 17 × 23?"}],
        "temperature": 0, "max_tokens": 64, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200 and "391" in r.json()["choices"][0]["message"]["content"]


def chat_as(url: str, model: str) -> str:
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=30,
        json={
            "model": model,
            "messages": [{"role": "user", "content": "What is 17 × 23?"}],
            "temperature": 0,
            "max_tokens": 64,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def _boot_ray_unit(recipe: Any, unit: Any, model: Path, tmp: Path) -> Emu:
    """Run each member's rendered Ray line under /bin/sh, each member with its own Ray directory
    (its own
    host), in the launch's order; the head's once it serves."""
    import os
    import subprocess
    import sys
    import time

    from tests.lab.emulator.test_server import FAST

    bindir = tmp / "bin"
    bindir.mkdir()
    for name, module in (("vllm", "fleetctl.lab.emulator"), ("ray", "fleetctl.lab.emulator.ray")):
        (bindir / name).write_text(f"#!/bin/sh\nexec {sys.executable} -m {module} \"$@\"\n")
        (bindir / name).chmod(0o755)
    port = _free_port()
    head: Emu | None = None
    for host in recipe.topology.start_order(unit):  # Ray: the head first, then its workers
        launch = recipe.launch(unit, host)
        assert launch.entrypoint == "/bin/sh" and launch.argv[0] == "-c"
        script = launch.argv[1].replace(recipe.body.mount, str(model))
        if launch.role == "head":
            assert "--distributed-executor-backend ray" in script and script.startswith(
                "ray start --head"
            )
            script += f" --host 127.0.0.1 --port {port}"
        (tmp / host).mkdir()
        env = {
            **os.environ,
            **launch.env,
            "PATH": f"{bindir}:{os.environ['PATH']}",
            "EMU_RAY_DIR": str(tmp / host),
            "EMU_LOAD_SECONDS": "0.3",
            "EMU_SPEED": FAST,
        }
        log = tmp / f"{host}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", script], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        emu = Emu(proc, port, log)
        _RAY_PROCS.append(proc)
        if launch.role == "head":
            head = emu
    assert head is not None
    deadline = time.monotonic() + READY_TIMEOUT
    while "Application startup complete." not in head.text():
        assert head.proc.poll() is None, f"the head exited early:\n{head.text()}"
        assert time.monotonic() < deadline, f"the head never served:\n{head.text()}"
        time.sleep(0.05)
    return head


_RAY_PROCS: list[Any] = []


@pytest.fixture(autouse=True)
def _stop_ray_procs() -> Any:
    yield
    while _RAY_PROCS:
        p = _RAY_PROCS.pop()
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except Exception:
                p.kill()
