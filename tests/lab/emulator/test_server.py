"""The emulator as a real process on loopback: every endpoint, crashes, refusals, knobs.

No mocks: each test starts ``python -m fleetctl.lab.emulator serve`` on a free port and
talks HTTP to it. Waits are bounded; nothing asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetctl.lab import models
from fleetctl.soak.capabilities.images import DRAWINGS, data_url

READY_TIMEOUT = 30.0
#: Emulated time runs this much faster in these tests, so a 600-token answer takes ~0.1 s.
FAST = "50"


@dataclass
class Emu:
    """A running emulator process."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text()

    def wait_exit(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "body": models.write_model(root / "body", "qwen36-35b-a3b-nvfp4"),
        "drafter": models.write_model(root / "drafter", "qwen36-35b-a3b-dflash"),
        "stale": models.write_model(root / "stale", "qwen36-35b-a3b-dflash", "stale-drafter"),
        "lfs": models.write_model(root / "lfs", "qwen36-35b-a3b-nvfp4", "lfs-pointer"),
        "misnested": models.write_model(
            root / "misnested", "qwen36-35b-a3b-nvfp4", "misnested-vision"
        ),
        "bf16": models.write_model(root / "bf16", "qwen35-35b-a3b-bf16"),
    }


def _dflash(drafter: Path, k: int = 11) -> list[str]:
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k}
    return [
        "--speculative-config",
        json.dumps(spec),
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        "32768",
    ]


class Launcher:
    """Starts emulators for one test and stops whatever is left at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.running: list[Emu] = []

    def start(self, argv: list[str], env: dict[str, str] | None = None, wait: bool = True) -> Emu:
        port = _free_port()
        log = self.tmp / f"emu-{port}.log"
        full_env = {**os.environ, "EMU_LOAD_SECONDS": "0.3", "EMU_SPEED": FAST, **(env or {})}
        cmd = [
            sys.executable,
            "-m",
            "fleetctl.lab.emulator",
            "serve",
            *argv,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
        emu = Emu(proc, port, log)
        self.running.append(emu)
        if wait:
            deadline = time.monotonic() + READY_TIMEOUT
            while "Application startup complete." not in emu.text():
                assert proc.poll() is None, f"emulator exited early:\n{emu.text()}"
                assert time.monotonic() < deadline, f"emulator not ready:\n{emu.text()}"
                time.sleep(0.05)
        return emu

    def stop_all(self) -> None:
        for emu in self.running:
            if emu.proc.poll() is None:
                emu.proc.send_signal(signal.SIGTERM)
                try:
                    emu.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    emu.proc.kill()
                    emu.proc.wait()


def _chat(prompt: str, **extra: object) -> dict[str, object]:
    return {
        "model": "qwen36-fast",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        **extra,
    }


def _events(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (
            s.name,
            tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))),
        ): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


NAMES = ["--served-model-name", "qwen36-35b-heretic", "qwen36-fast", "qwen36-deep"]


def test_port_refused_until_ready_then_every_endpoint(
    launcher: Launcher, model_dirs: dict[str, Path]
) -> None:
    emu = launcher.start(
        [
            str(model_dirs["body"]),
            *NAMES,
            "--quantization",
            "compressed-tensors",
            "--reasoning-parser",
            "qwen3",
            "--enable-prefix-caching",
            "--trust-remote-code",
            *_dflash(model_dirs["drafter"]),
        ],
        env={"EMU_LOAD_SECONDS": "2", "EMU_VERSION": "0.24.0"},
        wait=False,
    )
    deadline = time.monotonic() + READY_TIMEOUT
    while "Starting to load model" not in emu.text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _refused(emu.port), "the port must be closed while the model loads"
    assert "Application startup complete." not in emu.text()
    while "Application startup complete." not in emu.text():
        assert emu.proc.poll() is None and time.monotonic() < deadline, emu.text()
        time.sleep(0.05)

    with httpx.Client(base_url=emu.url, timeout=30) as http:
        health = http.get("/health")
        assert health.status_code == 200 and health.content == b""
        assert http.get("/version").json() == {"version": "0.24.0"}
        listing = http.get("/v1/models").json()
        assert [m["id"] for m in listing["data"]] == [
            "qwen36-35b-heretic",
            "qwen36-fast",
            "qwen36-deep",
        ]
        assert all(
            m["root"] == str(model_dirs["body"]) and m["max_model_len"] == 262144
            for m in listing["data"]
        )
        assert http.get("/nope").status_code == 404
        assert http.post("/health").status_code == 405
        before = _metrics(emu.url)

        # The operators' smoke test, thinking off.
        smoke = http.post(
            "/v1/chat/completions",
            json=_chat(
                "What is 17 × 23?", max_tokens=2048, chat_template_kwargs={"enable_thinking": False}
            ),
        ).json()
        assert "391" in smoke["choices"][0]["message"]["content"]
        assert smoke["choices"][0]["finish_reason"] == "stop"
        assert (
            smoke["usage"]["total_tokens"]
            == smoke["usage"]["prompt_tokens"] + smoke["usage"]["completion_tokens"]
        )

        # Thinking on with a small budget: content null, finish_reason length
        # (docs/domain.md#health, item 5).
        thinking = http.post(
            "/v1/chat/completions", json=_chat("What is 17 × 23?", max_tokens=200)
        ).json()
        choice = thinking["choices"][0]
        assert choice["message"]["content"] is None and choice["finish_reason"] == "length"
        assert choice["message"]["reasoning"]
        # Enough budget: the answer arrives after the thinking.
        full = http.post(
            "/v1/chat/completions", json=_chat("What is 17 × 23?", max_tokens=4096)
        ).json()
        assert "391" in full["choices"][0]["message"]["content"]

        # Streaming with usage: role chunk, several tokens per event, usage chunk, [DONE].
        streamed = http.post(
            "/v1/chat/completions",
            json=_chat(
                "Write a Python function that parses a date.",
                max_tokens=400,
                stream=True,
                stream_options={"include_usage": True},
                chat_template_kwargs={"enable_thinking": False},
            ),
        )
        assert streamed.status_code == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = _events(streamed.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        usage_chunk = chunks[-1]
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 400
        content_chunks = [c for c in chunks[1:-1] if c["choices"][0]["delta"].get("content")]
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        # Speculative decoding: fewer content events than tokens.
        assert len(content_chunks) < usage_chunk["usage"]["completion_tokens"]

        # Legacy completions, streaming and not.
        comp = http.post(
            "/v1/completions",
            json={
                "model": "qwen36-deep",
                "prompt": "What is 2 + 2?",
                "max_tokens": 16,
                "temperature": 0,
            },
        ).json()
        assert comp["object"] == "text_completion" and "4" in comp["choices"][0]["text"]
        comp_stream = http.post(
            "/v1/completions", json={"prompt": "Hello", "max_tokens": 8, "stream": True}
        )
        assert _events(comp_stream.text)[-1] == "[DONE]"

        # Errors as vLLM gives them.
        missing = http.post("/v1/chat/completions", json={**_chat("hi"), "model": "nope"})
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
        assert (
            "Valid aliases: qwen36-35b-heretic, qwen36-fast, qwen36-deep."
            in missing.json()["error"]["message"]
        )
        too_long = http.post("/v1/chat/completions", json=_chat("hi", max_tokens=10_000_000))
        assert (
            too_long.status_code == 400
            and "cannot be greater than max_model_len=262144" in too_long.json()["error"]["message"]
        )
        assert http.post("/v1/chat/completions", content=b"{not json").status_code == 400

        after = _metrics(emu.url)
    finished = sum(
        after[("vllm:request_success_total", (("finished_reason", r),))]
        - before[("vllm:request_success_total", (("finished_reason", r),))]
        for r in ("stop", "length")
    )
    assert finished == 6
    gen = after[("vllm:generation_tokens_total", ())] - before[("vllm:generation_tokens_total", ())]
    assert gen >= 400 + 200
    drafts = after[("vllm:spec_decode_num_drafts_total", ())]
    accepted = after[("vllm:spec_decode_num_accepted_tokens_total", ())]
    draft_tokens = after[("vllm:spec_decode_num_draft_tokens_total", ())]
    assert drafts > 0 and draft_tokens == 11 * drafts and 0 < accepted < draft_tokens
    per_pos = [
        after[("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),))]
        for i in range(11)
    ]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    assert after[("vllm:time_to_first_token_seconds_count", ())] >= 6
    assert after[("vllm:num_requests_running", ())] == 0
    assert after[("vllm:kv_cache_usage_perc", ())] == 0  # every finished request gave its KV back


def test_no_speculative_config_no_spec_metrics_one_token_per_event(
    launcher: Launcher, model_dirs: dict[str, Path]
) -> None:
    emu = launcher.start(
        [str(model_dirs["bf16"]), "--served-model-name", "qwen3.5-35b"], env={"EMU_SPEED": "1"}
    )
    body = httpx.post(
        emu.url + "/v1/chat/completions",
        timeout=30,
        json={
            "messages": [{"role": "user", "content": "Good morning"}],
            "max_tokens": 40,
            "stream": True,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ).text
    chunks = [json.loads(e) for e in _events(body)[:-1]]
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:]]
    assert len(contents) == 40 and all(contents)
    assert "spec_decode" not in httpx.get(emu.url + "/metrics").text


async def _stream_many(url: str, n: int, max_tokens: int) -> list[tuple[int, list[str]]]:
    async with httpx.AsyncClient(
        base_url=url, timeout=60, limits=httpx.Limits(max_connections=n + 4)
    ) as http:

        async def one(i: int) -> tuple[int, list[str]]:
            async with http.stream(
                "POST",
                "/v1/chat/completions",
                json=_chat(
                    f"Explain topic {i} step by step",
                    max_tokens=max_tokens,
                    stream=True,
                    chat_template_kwargs={"enable_thinking": False},
                ),
            ) as resp:
                text = "".join([chunk async for chunk in resp.aiter_text()])
                return resp.status_code, _events(text)

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_sixty_four_concurrent_streams(launcher: Launcher, model_dirs: dict[str, Path]) -> None:
    emu = launcher.start([str(model_dirs["body"]), *NAMES, *_dflash(model_dirs["drafter"])])
    results = asyncio.run(_stream_many(emu.url, 64, 100))
    assert all(status == 200 and events[-1] == "[DONE]" for status, events in results)
    assert all("error" not in json.loads(e) for _, events in results for e in events[:-1])
    got = _metrics(emu.url)
    assert got[("vllm:request_success_total", (("finished_reason", "length"),))] == 64


def test_crash_at_k_concurrent_streams(launcher: Launcher, model_dirs: dict[str, Path]) -> None:
    emu = launcher.start(
        [str(model_dirs["body"]), *NAMES, *_dflash(model_dirs["drafter"])],
        env={"EMU_CRASH_AT_CONCURRENCY": "8", "EMU_CRASH_EXIT_SECONDS": "3", "EMU_SPEED": "1"},
    )
    # Below K: fine.
    assert all(s == 200 and e[-1] == "[DONE]" for s, e in asyncio.run(_stream_many(emu.url, 7, 5)))
    assert emu.proc.poll() is None
    results = asyncio.run(_stream_many(emu.url, 8, 2000))
    # Every stream is an HTTP 200 whose body carries an error event, then [DONE].
    for status, events in results:
        assert status == 200
        errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
        assert errors and errors[0]["code"] == 500
    health = httpx.get(emu.url + "/health", timeout=5)
    assert health.status_code == 503
    assert emu.wait_exit() == 1
    assert _refused(emu.port)
    assert "block_table" in emu.text() and "EngineDeadError" in emu.text()
    # The root cause must be the last error in the log, not a shutdown traceback.
    assert "Traceback" not in emu.text()


def test_sigterm_exits_cleanly(launcher: Launcher, model_dirs: dict[str, Path]) -> None:
    emu = launcher.start([str(model_dirs["bf16"])])
    emu.proc.send_signal(signal.SIGTERM)
    assert emu.wait_exit() == 0
    assert "Shutting down" in emu.text() and "Traceback" not in emu.text()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing-dir", "Invalid repository ID or local directory specified"),
        ("no-budget", "max_num_scheduled_tokens is set to -512"),
        ("nvfp4-kv", "No valid attention backend found"),
        ("wrong-quant", "does not match the quantization method"),
        ("lfs", "HeaderTooLarge"),
        (
            "missing-drafter",
            "Invalid repository ID or local directory specified: '/nonexistent-drafter'",
        ),
        ("boot-fail", "CUDA error: no kernel image"),
    ],
)
def test_boot_refusals(
    launcher: Launcher, model_dirs: dict[str, Path], tmp_path: Path, case: str, message: str
) -> None:
    body, drafter = str(model_dirs["body"]), model_dirs["drafter"]
    spec = json.dumps({"method": "dflash", "model": str(drafter), "num_speculative_tokens": 11})
    argv, env = {
        "missing-dir": ([str(tmp_path / "absent")], {}),
        "no-budget": ([body, "--speculative-config", spec], {}),
        "nvfp4-kv": ([body, *_dflash(drafter), "--kv-cache-dtype", "nvfp4"], {}),
        "wrong-quant": ([body, "--quantization", "modelopt"], {}),
        "lfs": ([str(model_dirs["lfs"])], {}),
        "missing-drafter": (
            [
                body,
                "--speculative-config",
                json.dumps(
                    {
                        "method": "dflash",
                        "model": "/nonexistent-drafter",
                        "num_speculative_tokens": 11,
                    }
                ),
                "--max-num-seqs",
                "8",
                "--max-num-batched-tokens",
                "8192",
            ],
            {},
        ),
        "boot-fail": (
            [body],
            {"EMU_BOOT_FAIL": "RuntimeError: CUDA error: no kernel image is available"},
        ),
    }[case]
    emu = launcher.start(argv, env=env, wait=False)
    assert emu.wait_exit() == 1
    assert message in emu.text()
    assert "Application startup complete." not in emu.text()


def test_garbage_knob_and_misnested_vision(launcher: Launcher, model_dirs: dict[str, Path]) -> None:
    emu = launcher.start([str(model_dirs["body"]), *NAMES], env={"EMU_GARBAGE": "1"})
    out = httpx.post(
        emu.url + "/v1/chat/completions", timeout=30, json=_chat("What is 17 × 23?", max_tokens=20)
    ).json()
    assert out["choices"][0]["message"]["content"] == "!" * 20
    assert httpx.get(emu.url + "/health").status_code == 200

    mis = launcher.start([str(model_dirs["misnested"]), *NAMES])
    assert "skip loading" in mis.text()
    image = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What shape is this?"},
            {"type": "image_url", "image_url": {"url": data_url(DRAWINGS[0])}},
        ],
    }
    req = {
        "model": "qwen36-fast",
        "messages": [image],
        "max_tokens": 10,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert (
        httpx.post(mis.url + "/v1/chat/completions", json=req, timeout=30).json()["choices"][0][
            "message"
        ]["content"]
        == "!" * 10
    )
    # An image that does not decode is refused before the model, as vLLM's processor does.
    bad = {**req, "messages": [{**image, "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
    refused = httpx.post(mis.url + "/v1/chat/completions", json=bad, timeout=30)
    assert refused.status_code == 400 and "Failed to load image" in refused.text
    text_only = httpx.post(
        mis.url + "/v1/chat/completions",
        timeout=30,
        json=_chat(
            "What is 17 × 23?", max_tokens=50, chat_template_kwargs={"enable_thinking": False}
        ),
    ).json()
    assert "391" in text_only["choices"][0]["message"]["content"]


def test_error_rate_gives_error_events_inside_200_streams(
    launcher: Launcher, model_dirs: dict[str, Path]
) -> None:
    emu = launcher.start([str(model_dirs["body"]), *NAMES], env={"EMU_ERROR_RATE": "1"})
    resp = httpx.post(
        emu.url + "/v1/chat/completions",
        timeout=30,
        json=_chat(
            "hello there",
            max_tokens=200,
            stream=True,
            chat_template_kwargs={"enable_thinking": False},
        ),
    )
    assert resp.status_code == 200
    events = _events(resp.text)
    assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
    whole = httpx.post(
        emu.url + "/v1/chat/completions", timeout=30, json=_chat("hello there", max_tokens=200)
    )
    assert whole.status_code == 500
    assert emu.proc.poll() is None and httpx.get(emu.url + "/health").status_code == 200


def test_stale_drafter_crashes_past_16k_context(
    launcher: Launcher, model_dirs: dict[str, Path]
) -> None:
    emu = launcher.start(
        [str(model_dirs["body"]), *NAMES, *_dflash(model_dirs["stale"])],
        env={"EMU_CRASH_EXIT_SECONDS": "0.5"},
    )
    short = httpx.post(
        emu.url + "/v1/chat/completions",
        timeout=30,
        json=_chat("hello", max_tokens=20, chat_template_kwargs={"enable_thinking": False}),
    )
    assert short.status_code == 200
    long_prompt = "word " * 17_000
    crashed = httpx.post(
        emu.url + "/v1/chat/completions",
        timeout=60,
        json=_chat(long_prompt, max_tokens=20, chat_template_kwargs={"enable_thinking": False}),
    )
    assert crashed.status_code == 500
    assert emu.wait_exit() == 1
    assert "cudaErrorIllegalAddress" in emu.text()


def _acceptance(url: str, prompt: str, n: int = 4) -> float:
    before = _metrics(url)
    for _ in range(n):
        httpx.post(
            url + "/v1/chat/completions",
            timeout=60,
            json=_chat(prompt, max_tokens=300, chat_template_kwargs={"enable_thinking": False}),
        )
    after = _metrics(url)
    pos0 = ("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", "0"),))
    drafts = ("vllm:spec_decode_num_drafts_total", ())
    # Position-0 acceptance over the window (docs/domain.md: d(per_pos[0]) / d(drafts)).
    return (after[pos0] - before[pos0]) / (after[drafts] - before[drafts])


def test_long_context_collapse_and_decay(launcher: Launcher, model_dirs: dict[str, Path]) -> None:
    healthy = launcher.start([str(model_dirs["body"]), *NAMES, *_dflash(model_dirs["drafter"])])
    collapsing = launcher.start(
        [str(model_dirs["body"]), *NAMES, *_dflash(model_dirs["drafter"])],
        env={"EMU_LONGCTX_COLLAPSE": "1"},
    )
    long_prompt = "Write a Python function. " + "context " * 4000
    held = _acceptance(healthy.url, long_prompt)
    collapsed = _acceptance(collapsing.url, long_prompt)
    # Coding class: 32.5 % position-0 acceptance, held at long context unless the knob is set.
    assert held > 0.2 and collapsed < 0.1
    assert _acceptance(collapsing.url, "Write a Python function.") > 0.2

    # 120 emulated minutes per real second: acceptance is gone within a second or so.
    decaying = launcher.start(
        [str(model_dirs["body"]), *NAMES, *_dflash(model_dirs["drafter"])],
        env={"EMU_ACCEPT_DECAY_PER_MIN": "0.5", "EMU_SPEED": "120"},
    )
    deadline = time.monotonic() + 20
    while _acceptance(decaying.url, "Write a Python function.", n=1) > 0.0:
        assert time.monotonic() < deadline, "acceptance never decayed"
    assert httpx.get(decaying.url + "/health").status_code == 200


def test_max_num_seqs_queues_and_ignore_eos_gives_exact_lengths(
    launcher: Launcher, model_dirs: dict[str, Path]
) -> None:
    emu = launcher.start(
        [str(model_dirs["bf16"]), "--served-model-name", "qwen3.5-35b", "--max-num-seqs", "2"],
        env={"EMU_SPEED": "1"},
    )
    body = {
        "messages": [{"role": "user", "content": "Good morning"}],
        "max_tokens": 3000,
        "stream": True,
        "ignore_eos": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }

    async def run() -> tuple[
        list[dict[str, object]], dict[tuple[str, tuple[tuple[str, str], ...]], float]
    ]:
        async with httpx.AsyncClient(base_url=emu.url, timeout=60) as http:

            async def one() -> dict[str, object]:
                async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                    events = _events("".join([c async for c in resp.aiter_text()]))
                    return dict(json.loads(events[-2]))

            tasks = [asyncio.ensure_future(one()) for _ in range(4)]
            deadline = time.monotonic() + 20
            while True:
                seen = _metrics(emu.url)
                if (
                    seen[("vllm:num_requests_running", ())] == 2
                    and seen[("vllm:num_requests_waiting", ())] == 2
                ):
                    break
                assert time.monotonic() < deadline, (
                    "4 requests never showed as 2 running + 2 waiting"
                )
                await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # With ignore_eos the answer runs to max_tokens exactly.
            short = dict(body, stream=False, max_tokens=700)
            done = (await http.post("/v1/chat/completions", json=short)).json()
            return [done], seen

    (done,), seen = asyncio.run(run())
    assert seen[("vllm:num_requests_running", ())] == 2
    usage = done["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == 700
    # The four cancelled streams are counted as aborted once the server notices the hang-ups.
    abort = ("vllm:request_success_total", (("finished_reason", "abort"),))
    deadline = time.monotonic() + 20
    while _metrics(emu.url)[abort] < 4:
        assert time.monotonic() < deadline, "cancelled streams were never counted as aborted"
        time.sleep(0.1)
    assert _metrics(emu.url)[("vllm:request_queue_time_seconds_count", ())] == 5


def test_hang_knobs(launcher: Launcher, model_dirs: dict[str, Path]) -> None:
    # boot: the model never finishes loading; the port stays closed until docker stop.
    boot = launcher.start([str(model_dirs["bf16"])], env={"EMU_HANG": "boot"}, wait=False)
    deadline = time.monotonic() + READY_TIMEOUT
    while "Loading model from scratch" not in boot.text():
        assert boot.proc.poll() is None and time.monotonic() < deadline, boot.text()
        time.sleep(0.05)
    assert _refused(boot.port)
    boot.proc.send_signal(signal.SIGTERM)
    assert boot.wait_exit() == 0
    # requests: healthy, but a request never gets its first token.
    stall = launcher.start([str(model_dirs["bf16"])], env={"EMU_HANG": "requests"})
    assert httpx.get(stall.url + "/health").status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            stall.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 5}, timeout=1.5
        )
    assert _metrics(stall.url)[("vllm:num_requests_running", ())] == 1


def test_kv_cache_admission_and_preemption(launcher: Launcher, model_dirs: dict[str, Path]) -> None:
    emu = launcher.start(
        [str(model_dirs["bf16"])], env={"EMU_SPEED": "5", "EMU_KV_CAPACITY_TOKENS": "2500"}
    )
    body = {"prompt": "word " * 1000, "max_tokens": 5000, "stream": True, "ignore_eos": True}

    async def run() -> tuple[bool, float]:
        async with httpx.AsyncClient(base_url=emu.url, timeout=60) as http:

            async def one() -> None:
                async with http.stream("POST", "/v1/completions", json=body) as resp:
                    async for _ in resp.aiter_bytes():
                        pass

            tasks = [asyncio.ensure_future(one()) for _ in range(4)]
            queued, preemptions = False, 0.0
            deadline = time.monotonic() + 30
            while not (queued and preemptions >= 1):
                assert time.monotonic() < deadline, f"queued={queued} preemptions={preemptions}"
                seen = _metrics(emu.url)
                # Two 1,000-token prompts fit in 2,500 tokens of KV; the other two wait for room.
                if (
                    seen[("vllm:num_requests_running", ())] == 2
                    and seen[("vllm:num_requests_waiting", ())] == 2
                ):
                    queued = True
                preemptions = seen[("vllm:num_preemptions_total", ())]
                await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return queued, preemptions

    queued, preemptions = asyncio.run(run())
    assert queued and preemptions >= 1


def test_tokenize_counts_what_a_chat_completion_counts(
    launcher: Launcher, model_dirs: dict[str, Path]
) -> None:
    """/tokenize of messages says what the same chat completion reports as prompt_tokens (the soak
    sizes
    long-context prompts by it), whether content is a string or a list of parts."""
    emu = launcher.start([str(model_dirs["body"]), *NAMES])
    text = "Summarise this service log: " + " ".join(f"line {i}: ok, 12 ms;" for i in range(200))
    shapes = [
        [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": text}],
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": text}, {"type": "text", "text": "Thanks!"}],
            }
        ],
    ]
    for messages in shapes:
        tok = httpx.post(
            emu.url + "/tokenize", json={"model": "qwen36-fast", "messages": messages}, timeout=10
        )
        assert tok.status_code == 200, tok.text
        chat = httpx.post(
            emu.url + "/v1/chat/completions",
            timeout=30,
            json={"model": "qwen36-fast", "messages": messages, "max_tokens": 4, "temperature": 0},
        )
        assert chat.status_code == 200, chat.text
        assert tok.json()["count"] == chat.json()["usage"]["prompt_tokens"], messages[-1]["content"]
    plain = httpx.post(
        emu.url + "/tokenize", json={"model": "qwen36-fast", "prompt": text}, timeout=10
    ).json()
    comp = httpx.post(
        emu.url + "/v1/completions",
        timeout=30,
        json={"model": "qwen36-fast", "prompt": text, "max_tokens": 4, "temperature": 0},
    ).json()
    assert plain["count"] == comp["usage"]["prompt_tokens"] and plain["count"] == len(
        plain["tokens"]
    )
