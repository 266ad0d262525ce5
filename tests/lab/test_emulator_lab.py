"""The vLLM emulator in a real container on a lab node, as a rollout would start it.

The node pulls a tag from the lab registry and runs it with ``--gpus all --network host``
(the ``provisioned`` fixture installed the stand-in container toolkit), the seed recipe's
own command line and the tiny models from the lab's weights mirror; the controller then
talks HTTP to ``<node address>:<port>``. Each test removes its container and files.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.recipes import Recipe, load_recipes

pytestmark = pytest.mark.lab

NODE = "spark-03"
RECIPE = "qwen36-35b-heretic"
CONTAINER = "emu-lab-test"
WORK = "/opt/emu-lab-test"
READY_TIMEOUT = 120.0


def _fetch_script(mirror: str, repo: str, revision: str, dest: str) -> str:
    """Shell that copies one revision from the weights mirror, file by file from its manifest."""
    base = f"{mirror}/{repo}/{revision}"
    listing = ('python3 -c \'import json,sys; print(" ".join(f["path"] for f in '
               'json.load(sys.stdin)["files"]))\'')
    return (
        f"set -e; rm -rf {dest}; mkdir -p {dest}; "
        f"for f in $(curl -fsS {base}/manifest.json | {listing}); do "
        f"mkdir -p {dest}/$(dirname $f); curl -fsS -o {dest}/$f {base}/$f; done"
    )


@pytest.fixture
def node(provisioned: Any, lab: fleetlab.LabStatus) -> Iterator[tuple[inventory.Host, Recipe, int]]:
    """The test node with the recipe's weights fetched from the mirror; cleaned up afterwards."""
    inv = inventory.load(lab.inventory)
    host = inv.host(NODE)
    recipe = load_recipes(inv)[RECIPE]
    mirror = str(inv.vars["fleetctl_weights_mirror"])
    script = "; ".join(
        _fetch_script(mirror, w.repo, w.revision, f"{WORK}{w.mount}") for w in recipe.weights
    )
    ssh.run(host, script, timeout=180, become=True).check(
        "fetching the tiny models from the weights mirror"
    )
    # The rollout tests may serve on :8000 at the same time; then this test uses another port.
    busy = ssh.run(host, "ss -ltnH 'sport = :8000' | wc -l", timeout=20).stdout.strip()
    port = 8000 if busy == "0" else 8100
    try:
        yield host, recipe, port
    finally:
        ssh.run(
            host,
            f"docker rm -f {CONTAINER} >/dev/null 2>&1; rm -rf {WORK}",
            timeout=60,
            become=True,
        )


def _start(host: inventory.Host, recipe: Recipe, image: str, port: int, env: dict[str, str]) -> str:
    """``docker run`` the recipe on the node (as the rollout does); returns the base URL."""
    mounts = " ".join(f"-v {WORK}{w.mount}:{w.mount}:ro" for w in recipe.weights)
    envs = " ".join(f"-e {k}={v}" for k, v in env.items())
    argv = [a if a != "8000" else str(port) for a in recipe.serve_argv()]
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    ssh.run(
        host,
        f"docker pull -q {image} >/dev/null && docker rm -f {CONTAINER} >/dev/null 2>&1; "
        f"docker run -d --name {CONTAINER} --gpus all --ipc host --network host {mounts} {envs} "
        f"--entrypoint vllm {image} {quoted}",
        timeout=180, become=True,
    ).check(f"starting {image}")
    base = f"http://{host.address}:{port}"
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            if httpx.get(base + "/health", timeout=3).status_code == 200:
                return base
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            logs = ssh.docker(host, f"docker logs --tail 20 {CONTAINER} 2>&1", timeout=20).stdout
            pytest.fail(f"{image} never became healthy on {host.name}:\n{logs}")
        time.sleep(0.5)


def _logs(host: inventory.Host) -> str:
    return ssh.docker(host, f"docker logs {CONTAINER} 2>&1", timeout=20).stdout


def _state(host: inventory.Host) -> dict[str, Any]:
    out = ssh.docker(host, f"docker inspect -f '{{{{json .State}}}}' {CONTAINER}", timeout=20)
    state: dict[str, Any] = json.loads(out.check("inspecting the container").stdout)
    return state


def _chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "qwen36-fast",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
        **extra,
    }


def test_a_node_serves_every_endpoint_from_a_registry_tag(
    node: tuple[inventory.Host, Recipe, int], lab: fleetlab.LabStatus
) -> None:
    host, recipe, port = node
    image = f"{lab.registry}/aeon-7/aeon-vllm-ultimate:latest"
    base = _start(host, recipe, image, port, {"EMU_SPEED": "20"})
    assert "Application startup complete." in _logs(host)
    with httpx.Client(base_url=base, timeout=60) as http:
        assert http.get("/version").json() == {"version": "0.24.0"}
        names = [m["id"] for m in http.get("/v1/models").json()["data"]]
        assert names == list(recipe.served_model_names)
        smoke = http.post(
            "/v1/chat/completions", json=_chat("What is 17 × 23?", max_tokens=2048)
        ).json()
        assert "391" in smoke["choices"][0]["message"]["content"]
        stream = http.post(
            "/v1/chat/completions",
            json=_chat(
                "Write a Python function.",
                max_tokens=200,
                stream=True,
                stream_options={"include_usage": True},
            ),
        )
        events = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 200
        assert len(events) - 3 < 200  # DFlash: several tokens per event
        comp = http.post(
            "/v1/completions", json={"prompt": "What is 2 + 2?", "max_tokens": 8, "temperature": 0}
        )
        assert "4" in comp.json()["choices"][0]["text"]
        metrics = http.get("/metrics").text
    assert (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen36-35b-heretic",position="10"}'
        in metrics
    )
    assert (
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen36-35b-heretic"} 1.0'  # noqa: E501 (an exposition line as vLLM prints it)
        in metrics
    )
    # docker stop = SIGTERM: a clean exit.
    ssh.docker(host, f"docker stop -t 20 {CONTAINER}", timeout=60).check("stopping the emulator")
    state = _state(host)
    assert state["ExitCode"] == 0, _logs(host)
    assert "Shutting down" in _logs(host)


async def _streams(base: str, n: int, max_tokens: int) -> list[tuple[int, str]]:
    async with httpx.AsyncClient(
        base_url=base, timeout=120, limits=httpx.Limits(max_connections=n + 2)
    ) as http:

        async def one(i: int) -> tuple[int, str]:
            body = _chat(f"Explain item {i} step by step.", max_tokens=max_tokens, stream=True)
            async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                return resp.status_code, "".join([c async for c in resp.aiter_text()])

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_the_pr41703_tag_dies_at_32_concurrent_streams(
    node: tuple[inventory.Host, Recipe, int], lab: fleetlab.LabStatus
) -> None:
    host, recipe, port = node
    image = f"{lab.registry}/aeon-7/aeon-vllm-ultimate:2026-06-11-pr41703"
    base = _start(host, recipe, image, port, {"EMU_SPEED": "5"})
    # 31 at once is fine ...
    fine = asyncio.run(_streams(base, 31, 20))
    assert all(
        status == 200 and '"error"' not in text and text.rstrip().endswith("data: [DONE]")
        for status, text in fine
    )
    assert httpx.get(base + "/health", timeout=10).status_code == 200
    # ... 32 at once kills the engine: each stream is a 200 carrying an error event.
    dead = asyncio.run(_streams(base, 32, 4000))
    assert all(status == 200 and '"error"' in text for status, text in dead)
    deadline = time.monotonic() + 60
    while _state(host)["Running"]:
        assert time.monotonic() < deadline, "the crashed engine's container never exited"
        time.sleep(0.5)
    assert _state(host)["ExitCode"] == 1
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/health", timeout=5)
    assert "block_table" in _logs(host)
