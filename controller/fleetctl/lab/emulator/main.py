"""``vllm serve``: boot checks in vLLM's order, the load wait, then the server until SIGTERM or a
crash."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from . import compile_cache, multinode, perf
from .args import ServeArgs, UsageError, parse
from .chat_request import ModelInfo
from .engine_core import Engine, Request
from .http_server import HttpServer
from .knobs import Knobs, from_env
from .metrics import Metrics
from .openai_api import OpenAIApi
from .wedge import Switch
from .weights import BootError, LoadedWeights, invalid_model_message, load_weights, read_config

DEFAULT_MAX_MODEL_LEN = 32768


def make_logger(stream: Any = None) -> Any:
    """A log function writing vLLM-formatted lines (uvicorn's ``INFO:`` lines verbatim), flushed."""
    out = stream or sys.stdout
    pid = os.getpid()

    def log(line: str) -> None:
        if not line.startswith("INFO:"):
            level, _, rest = line.partition(" ")
            stamp = time.strftime("%m-%d %H:%M:%S")
            line = f"(APIServer pid={pid}) {level} {stamp} {rest}"
        out.write(line + "\n")
        out.flush()

    return log


def _model_type(config: dict[str, Any]) -> str:
    text = config.get("text_config")
    inner = text.get("model_type") if isinstance(text, dict) else None
    return str(config.get("model_type") or inner or "")


def derived_max_len(config: dict[str, Any]) -> int:
    """max_position_embeddings of the (text) config, as vLLM derives max_model_len."""
    for source in (config, config.get("text_config")):
        if isinstance(source, dict) and source.get("max_position_embeddings"):
            return int(source["max_position_embeddings"])
    return DEFAULT_MAX_MODEL_LEN


def check_config(args: ServeArgs, config: dict[str, Any]) -> int:
    """Argument/config checks vLLM makes before loading anything; returns max_model_len."""
    derived = derived_max_len(config)
    if args.max_model_len is not None and args.max_model_len > derived:
        raise BootError(
            f"ValueError: User-specified max_model_len ({args.max_model_len}) is greater than the "
            "derived "
            f"max_model_len (max_position_embeddings={derived} or model_max_length=None in model's "
            "config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    quant = config.get("quantization_config")
    quant_method = str(quant.get("quant_method", "")) if isinstance(quant, dict) else ""
    if args.quantization and quant_method:
        wanted = args.quantization.replace("_", "-")
        have = quant_method.replace("_", "-")
        if not (have == wanted or (wanted == "modelopt" and have.startswith("modelopt"))):
            raise BootError(
                f"ValueError: Quantization method specified in the model config ({quant_method}) "
                "does not "
                "match the quantization method specified in the `quantization` argument "
                f"({args.quantization})."
            )
    return args.max_model_len or derived


def check_engine(args: ServeArgs) -> None:
    """Engine-core checks that fail after the weights load (scheduler budget, attention backend)."""
    if args.spec_method != "dflash":
        return
    if args.max_num_seqs is None or args.max_num_batched_tokens is None:
        raise BootError(
            # vLLM's own text (vllm/config/vllm.py, _set_max_num_scheduled_tokens).
            "ValueError: max_num_scheduled_tokens is set to -512 based on the speculative decoding "
            "settings, which does not allow any tokens to be scheduled. Increase "
            "max_num_batched_tokens "
            "to accommodate the additional draft token slots, or decrease num_speculative_tokens."
        )
    if args.kv_cache_dtype.lower() == "nvfp4":
        raise BootError(
            "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
            "head_size=256, dtype=torch.bfloat16, kv_cache_dtype=nvfp4, block_size=None, "
            "use_mla=False, "
            "has_sink=False, use_sparse=False, use_mm_prefix=False, use_non_causal=True). Reasons: "
            "{FLASH_ATTN: [kv_cache_dtype not supported], FLASHINFER: [non-causal attention not "
            "supported, "
            "nvfp4 KV cache in FlashInfer requires SM100], TRITON_ATTN: [non-causal attention not "
            "supported], "
            "FLEX_ATTENTION: [kv_cache_dtype not supported], TURBOQUANT: [kv_cache_dtype not "
            "supported, "
            "non-causal attention not supported]}."
        )


async def _interrupted(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` unless ``stop`` is set first; True when stopped."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    return stop.is_set()


def _engine_failed(log: Any, exc: BootError) -> int:
    log("ERROR [core.py:708] EngineCore failed to start.")
    for line in str(exc).splitlines():
        log(f"ERROR [core.py:708] {line}")
    log(
        "ERROR [api_server.py:1920] RuntimeError: Engine core initialization failed. "
        "See root cause above. Failed core proc(s): {}"
    )
    return 1


async def run(args: ServeArgs, knobs: Knobs, log: Any) -> int:
    """Boot, serve and return the process exit code."""
    stop = asyncio.Event()
    install_signals(stop)
    switch = Switch(log)
    switch.install()
    log(f"INFO [api_server.py:1885] vLLM API server version {knobs.version}")
    log(
        f"INFO [utils.py:233] non-default args: {{'model': {args.model!r}, 'served_model_name': "
        f"{list(args.served_model_names)!r}}}"
    )
    model_dir = Path(args.model)
    drafter_dir: Path | None = None
    try:
        cluster = multinode.from_args(args.extra)
    except ValueError as exc:
        log(f"ERROR [api_server.py:1920] ValueError: {exc}")
        return 2
    try:
        config = read_config(model_dir)
        max_model_len = check_config(args, config)
        drafter = (args.speculative_config or {}).get("model")
        if args.spec_method in ("dflash", "eagle", "eagle3", "draft_model") and drafter:
            drafter_dir = Path(str(drafter))
            if not (drafter_dir / "config.json").is_file():
                raise BootError(invalid_model_message(str(drafter)))
    except BootError as exc:
        for line in str(exc).splitlines():
            log(f"ERROR [api_server.py:1920] {line}")
        return 1
    if cluster is not None and not cluster.is_head:
        # a headless worker (its model directory checked as the head's is) joins the head; it
        # serves no API
        return await multinode.run_worker(cluster, log, stop)
    archs = config.get("architectures") or ["?"]
    log(f"INFO [model.py:547] Resolved architecture: {archs[0]}")
    log(f"INFO [model.py:1510] Using max model len {max_model_len}")
    if args.speculative_config:
        log(f"INFO [speculative.py:300] Speculative decoding: {args.speculative_config}")
    if knobs.hang == "boot":
        # Stuck in weight loading forever: the port never opens, the process never exits on its own.
        log("INFO [gpu_model_runner.py:2602] Loading model from scratch...")
        await stop.wait()
        return 0
    log("INFO [gpu_model_runner.py:2602] Starting to load model...")
    started = time.monotonic()
    if await _interrupted(stop, knobs.load_seconds / 2):
        return 0
    drafter_weights: LoadedWeights | None = None
    try:
        weights = load_weights(model_dir)
        if drafter_dir is not None:
            drafter_weights = load_weights(drafter_dir)
        for warning in weights.warnings:
            log(warning)
        check_engine(args)
        if knobs.boot_fail:
            raise BootError(knobs.boot_fail)
    except BootError as exc:
        return _engine_failed(log, exc)
    log(
        f"INFO [default_loader.py:267] Loading weights took {time.monotonic() - started:.2f} "
        "seconds"
    )
    if await _interrupted(stop, knobs.load_seconds / 2):
        return 0
    ckey = (
        os.environ.get(compile_cache.KEY_ENV)
        or hashlib.sha256(" ".join(sys.argv).encode()).hexdigest()[:32]
    )
    comp = compile_cache.plan(
        compile_cache.cache_root(), ckey, knobs.compile_seconds, knobs.warm_compile_seconds
    )
    if comp.directory is not None:
        log(
            f"INFO [backends.py:{'163' if comp.warm else '215'}] compile cache "
            f"{'hit' if comp.warm else 'miss'} (key {ckey}): {comp.reason}; compiling takes "
            f"{comp.seconds:.1f} s"
        )
        if await _interrupted(stop, comp.seconds):
            return 0
        try:
            compile_cache.write(comp)
        except OSError as exc:
            log(f"WARNING [backends.py:220] could not save the compile cache: {exc}")
    head: multinode.Head | None = None
    if cluster is not None:
        head = multinode.Head(cluster, log)
        try:
            joined = await head.wait_for_workers(stop)
        except OSError as exc:
            log(
                "ERROR [multiproc_executor.py:85] cannot listen on "
                f"{cluster.master_addr}:{cluster.master_port}: {exc}"
            )
            return 1
        if not joined:
            await head.close()
            return 0 if stop.is_set() else 1
        factor = head.throughput_factor()
        if factor < 1.0:
            knobs = dataclasses.replace(knobs, throughput_scale=knobs.throughput_scale * factor)
            log(
                "WARNING [multiproc_executor.py:99] the inter-node link runs at "
                f"{head.link_mbps:.0f} MB/s: "
                f"decode throughput x{factor:.2f}"
            )
    metrics = Metrics(
        args.served_model_names[0],
        num_spec_tokens=args.num_spec_tokens if args.speculative_config else None,
        max_model_len=max_model_len,
        cache_block_tokens=knobs.prefix_block_tokens,
    )
    died = asyncio.Event()
    engine = Engine(
        knobs,
        metrics,
        max_num_seqs=args.max_num_seqs,
        num_spec_tokens=args.num_spec_tokens,
        vision_loaded=weights.vision_loaded
        or not any(".visual." in n for n in weights.tensor_names),
        drafter_date=drafter_weights.revision_date if drafter_weights else None,
        on_death=lambda _msg: died.set(),
        log=log,
        profiles=perf.FAMILY_PROFILES[perf.family_of(_model_type(config))],
    )
    engine.mark_ready()
    switch.attach(engine)
    if head is not None:
        def wedge(why: str) -> None:
            engine.wedged = True
            log(
                f"ERROR [core.py:720] EngineCore is stuck in a collective: {why}; the API server "
                "keeps running"
            )

        head.on_lost = wedge
        if head.cluster.nccl_hang_after > 0:  # under load: timed from the first request's prompt
            head.spawn(head.hang_under_load(lambda: metrics.counters["vllm:prompt_tokens"] > 0))
    info = ModelInfo(
        root=args.model,
        served_names=args.served_model_names,
        max_model_len=max_model_len,
        thinking=_model_type(config).startswith("qwen3"),
        reasoning_parser=args.reasoning_parser,
        tool_parser=str(args.extra["tool-call-parser"]) if "tool-call-parser" in args.extra
        else None,
        auto_tool_choice="enable-auto-tool-choice" in args.extra,
    )
    log(f"INFO [api_server.py:1647] Starting vLLM API server 0 on http://{args.host}:{args.port}")
    key = args.extra.get("api-key")
    server = HttpServer(
        OpenAIApi(info, engine, knobs, log).routes(),
        log,
        api_key=(key if isinstance(key, str) else None) or os.environ.get("VLLM_API_KEY") or None,
        access_log="disable-uvicorn-access-log" not in args.extra,
    )
    try:
        return await serve(server, engine, knobs, args.host, args.port, stop=stop, died=died)
    finally:
        if head is not None:
            await head.close()


async def serve(
    server: HttpServer,
    engine: Engine,
    knobs: Knobs,
    host: str,
    port: int,
    *,
    stop: asyncio.Event,
    died: asyncio.Event,
) -> int:
    """Listen and serve until SIGTERM (exit 0) or until the engine dies (exit 1 a moment later)."""
    try:
        listener = await server.listen(host, port)
    except OSError as exc:
        server.log(f"ERROR [api_server.py:1890] {exc}")
        return 1
    server.log(f"INFO:     Started server process [{os.getpid()}]")
    server.log("INFO:     Waiting for application startup.")
    server.log("INFO:     Application startup complete.")
    foreign = (asyncio.ensure_future(_foreign_traffic(engine, knobs.foreign_rps, stop))
               if knobs.foreign_rps > 0 else None)
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(died.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for w in waiters:
        w.cancel()
    if foreign is not None:
        foreign.cancel()
    code = 0
    if died.is_set() and not stop.is_set():
        # /health answers 503 for a moment, then the API server follows its engine down.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), knobs.crash_exit_seconds)
        server.log("ERROR [api_server.py:1610] Engine core died; shutting down the API server.")
        code = 1
    server.log("INFO:     Shutting down")
    server.log("INFO:     Waiting for application shutdown.")
    server.log("INFO:     Application shutdown complete.")
    listener.close()
    await server.close_all()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(listener.wait_closed(), 2.0)
    server.log(f"INFO:     Finished server process [{os.getpid()}]")
    return code


async def _foreign_traffic(engine: Engine, rps: float, stop: asyncio.Event) -> None:
    """EMU_FOREIGN_RPS: another client's short requests through the same engine (metrics only)."""
    running: set[asyncio.Task[None]] = set()
    prompt = "Summarise the status of the nightly batch job in one sentence."

    async def one(i: int) -> None:
        req = Request(request_id=f"foreign-{i}", prompt=prompt, prompt_tokens=24, max_tokens=16,
                      temperature=0.7, thinking=False, prompt_class=perf.classify(prompt, None))
        with contextlib.suppress(Exception):
            async for _ in engine.run(req):
                pass

    i = 0
    while not stop.is_set():
        await asyncio.sleep(1.0 / rps)
        task = asyncio.ensure_future(one(i))
        running.add(task)
        task.add_done_callback(running.discard)
        i += 1


def install_signals(stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set ``stop`` (docker stop, Ctrl-C)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``vllm`` and ``python -m ...emulator``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    log = make_logger()
    if argv and argv[0] in ("--version", "-v"):
        try:
            print(from_env().version)
        except ValueError:
            print(Knobs().version)
        return 0
    if argv and argv[0] not in ("serve",) and not argv[0].startswith("-"):
        sys.stderr.write(f"vllm: error: the emulator only implements 'serve' (got {argv[0]!r})\n")
        return 2
    try:
        args = parse(argv)
    except UsageError as exc:
        sys.stderr.write(f"usage: vllm serve [model_tag] [options]\nvllm serve: error: {exc}\n")
        return 2
    try:
        knobs = from_env()
    except ValueError as exc:
        log(f"ERROR [envs.py:1] {exc}")
        return 2
    return asyncio.run(run(args, knobs, log))
