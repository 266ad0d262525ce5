"""A stand-in for a vLLM OpenAI-compatible server, for the lab's image tags and for loopback tests.

Standard library only and self-contained (relative imports, no ``fleetctl`` imports), so
the package directory can be copied into an image that has nothing but ``python3``.

Run it as ``vllm serve MODEL_DIR --served-model-name A B --host H --port P
[--speculative-config JSON] [--max-num-seqs N] [--max-num-batched-tokens N]
[--kv-cache-dtype X] [--quantization Q] [--reasoning-parser P] ...`` (the ``vllm`` file
beside this one is the image's ``vllm`` command) or ``python3 -m fleetctl.lab.emulator
serve MODEL_DIR ...``. Unknown vLLM flags are accepted. It behaves as docs/domain.md says a real
vLLM does: boot refusals with vLLM's messages (missing model dir/config.json, DFlash
without --max-num-seqs/--max-num-batched-tokens, DFlash with nvfp4 KV, quantization
mismatch, unreadable safetensors headers), port closed until ready, then
``Application startup complete.``; /health, /version, /v1/models, /v1/chat/completions
and /v1/completions (streaming and not), /metrics with vLLM's metric names.

Behaviour knobs (environment variables, baked into image tags by ``fleetctl.lab.scenarios``):

==============================  =====================================================
``EMU_LOAD_SECONDS``            seconds from start to ready (port closed until then); 1
``EMU_COMPILE_SECONDS``         seconds of compiling after the load without a matching compile
cache; 0 ``EMU_WARM_COMPILE_SECONDS``    the same with one (compile_cache.py: only with a cache dir
mounted); 0 ``EMU_CRASH_AT_CONCURRENCY``    K: when K requests run at once the engine dies
(in-flight
                                streams get an error event inside their 200 stream,
                                /health 503, then the process exits 1); 0 = never
``EMU_CRASH_EXIT_SECONDS``      how long /health answers 503 before the exit; 2
``EMU_ACCEPT_DECAY_PER_MIN``    draft acceptance falls linearly by this fraction per
                                emulated minute, to 0 (decode slows, no error); 0
``EMU_GARBAGE``                 1: every completion is ``!!!!...`` (/health stays 200)
``EMU_GARBAGE_AFTER_TOKENS``    N: once the server has generated N tokens in its lifetime,
                                every later token is ``!`` (the operators' "corrupt after
                                ~12k decoded tokens"); 0 = never
``EMU_GARBAGE_AFTER_SECONDS``   S: from S seconds of emulated uptime after ready (real
                                seconds x EMU_SPEED), every token is ``!`` while /health
                                stays 200 (the issue's "!!!! after 30 s"); 0 = never
``EMU_GARBAGE_AT_CONCURRENCY``  K: tokens decoded while K or more requests run are ``!``
                                (corruption only in big batches); 0 = never
``EMU_DEGENERATE_AFTER_TOKENS`` N: past N generated tokens an answer turns into one short
                                phrase repeated to max_tokens (any concurrency, greedy or
                                not; shorter answers end as usual); 0 = never
``EMU_BOOT_FAIL``               a message: the engine fails to start with it (exit 1)
``EMU_SPEED``                   emulated time runs this many times faster (TTFT, decode,
                                decay; not the load time); 1
``EMU_THROUGHPUT_SCALE``        multiplies decode throughput (0.7 = 30 % slower); 1
``EMU_ERROR_RATE``              fraction of requests that fail mid-generation; 0
``EMU_FORWARDED_ERROR_RATE``    the same for requests that came through a proxy only (an
                                ``X-Forwarded-For`` header: users' traffic through the front
                                door), so a soak out of rotation passes and a bake fails; 0
``EMU_LONGCTX_COLLAPSE``        1: acceptance collapses past 2K tokens of context
``EMU_HANG``                    ``boot``: never becomes ready; ``requests``: requests are
                                accepted and never produce a token; empty = off
``EMU_PREFIX_BLOCK_TOKENS``     prefix-cache hits count whole blocks of this many tokens (a
                                hybrid Qwen3.5/3.6's ~2k page); 2048
``EMU_DECAY_PER_CACHE_HIT``     acceptance of requests that hit the prefix cache falls by this
                                fraction per earlier such request, to 0 (the decay that needs
                                prefix caching); 0
``EMU_FOREIGN_RPS``             requests per second of another client on the same server,
                                seen only in /metrics (a soak must notice them); 0
``EMU_VERSION``                 what /version reports; 0.24.0
``EMU_SEED``                    seed of the acceptance sampler; 0
``EMU_KV_CAPACITY_TOKENS``      KV cache size: requests wait for room, decoding past it
                                preempts (vllm:num_preemptions_total); 300000 (the published
                                265-300K tokens)
``EMU_IMAGE_GARBAGE``           1: a request with an image is answered ``!!!!`` (text stays
                                right); images are otherwise looked at (:mod:`.vision`)
``EMU_TOOL_CALL_LEAK``          1: the tool parser fails: ``<tool_call>`` markup in
                                ``content``, ``finish_reason`` stop (:mod:`.tool_calls`)
``EMU_REASONING_LEAK``          1: the reasoning parser fails: the thinking in ``content``
                                inside ``<think>`` tags, no ``reasoning``
==============================  =====================================================

Multi-node (:mod:`.multinode`): ``--nnodes N --node-rank R --master-addr A --master-port P``,
ranks above 0 with ``--headless``; or Ray's launch: ``ray start --head`` (the image's ``ray``
command, :mod:`.ray`) then ``vllm serve ... --distributed-executor-backend ray`` with tp x pp > 1 on
the head, ``ray start --block --address=HEAD:PORT`` on each worker. The head serves only once every
rank joined over ``A:P``; a worker lost afterwards wedges it (/health 200, no token). Its knobs,
read by the head and workers: ``EMU_JOIN_TIMEOUT_SECONDS`` (600), ``EMU_WORKER_TIMEOUT_SECONDS``
(heartbeat silence that loses a worker; 10), ``EMU_LINK_PROBE_BYTES`` (sent by each worker when it
joins; 8 MiB) and ``EMU_LINK_REFERENCE_MBPS`` (the link's full speed: a slower measured link scales
decode throughput down; 0 = off), ``EMU_NCCL_HANG_AFTER_SECONDS`` (that long after its first request
the head logs NCCL's RDMA completion error and the watchdog's timeout, then wedges with its workers
still up; 0 = never).

The performance model and where its defaults come from: :mod:`.perf`. A request may name
its prompt class with the extra body field ``emu_prompt_class`` (coding, math, reasoning,
prose, natural, extraction); otherwise it is classified by keywords. ``ignore_eos: true``
makes the answer run to ``max_tokens`` (fixed-length benchmark outputs). Known prompts
(``What is 17 × 23?`` ...) get their answer at any temperature; other prompts get
deterministic filler. Qwen3.x models think first (1,300-1,600 tokens) unless the request
sends ``chat_template_kwargs: {"enable_thinking": false}``.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the emulator's ``vllm`` command line (see :func:`.main.main`)."""
    from .main import main as _main

    return _main(argv)
