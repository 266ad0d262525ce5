"""vLLM's Prometheus metrics, with the real names, labels, help texts and histogram buckets.

The text format is what ``prometheus_client`` writes in a real vLLM 0.32 (checked against
one on this machine): ``# HELP``/``# TYPE`` per family, label names sorted, counters as
``<name>_total`` with a separate ``<name>_created`` gauge family, histograms as cumulative
``_bucket{le=...}`` + ``_count`` + ``_sum`` then a ``_created`` gauge family. Every series
carries ``model_name`` (the first served name) and ``engine`` (``"0"``).
Spec-decode families exist only when the server has a speculative config, as in vLLM.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from dataclasses import dataclass, field

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
#: Placeholder for "1-2-5 buckets up to max_model_len" (vLLM's build_1_2_5_buckets), set per server.
TOKEN_BUCKETS: tuple[float, ...] = ()
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)


def buckets_1_2_5(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's request-token buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(out)
            out.append(value)
        exponent += 1


HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "vllm:time_to_first_token_seconds": (
        "Histogram of time to first token in seconds.",
        TTFT_BUCKETS,
    ),
    "vllm:inter_token_latency_seconds": (
        "Histogram of inter-token latency in seconds.",
        ITL_BUCKETS,
    ),
    "vllm:request_time_per_output_token_seconds": (
        "Histogram of time_per_output_token_seconds per request.",
        ITL_BUCKETS,
    ),
    "vllm:e2e_request_latency_seconds": (
        "Histogram of e2e request latency in seconds.",
        LATENCY_BUCKETS,
    ),
    "vllm:request_queue_time_seconds": (
        "Histogram of time spent in WAITING phase for request.",
        LATENCY_BUCKETS,
    ),
    "vllm:request_inference_time_seconds": (
        "Histogram of time spent in RUNNING phase for request.",
        LATENCY_BUCKETS,
    ),
    "vllm:request_prefill_time_seconds": (
        "Histogram of time spent in PREFILL phase for request.",
        LATENCY_BUCKETS,
    ),
    "vllm:request_decode_time_seconds": (
        "Histogram of time spent in DECODE phase for request.",
        LATENCY_BUCKETS,
    ),
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", TOKEN_BUCKETS),
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", TOKEN_BUCKETS),
    "vllm:iteration_tokens_total": (
        "Histogram of number of tokens per engine_step.",
        ITERATION_BUCKETS,
    ),
    "vllm:request_max_num_generation_tokens": (
        "Histogram of maximum number of requested generation tokens.",
        TOKEN_BUCKETS,
    ),
    "vllm:request_params_n": ("Histogram of the n request parameter.", N_BUCKETS),
    "vllm:request_params_max_tokens": (
        "Histogram of the max_tokens request parameter.",
        TOKEN_BUCKETS,
    ),
}

COUNTERS: dict[str, str] = {
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
}
SPEC_COUNTERS: dict[str, str] = {
    "vllm:spec_decode_num_drafts": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens": "Number of accepted tokens.",
}
GAUGES: dict[str, str] = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
}


def _fmt(value: float) -> str:
    """A sample value as prometheus_client writes it (Go float formatting)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    # Go (and so prometheus_client) switches to an exponent sooner than Python's repr.
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        idx = bisect.bisect_left(self.buckets, value)
        if idx < len(self.counts):
            self.counts[idx] += 1
        self.total += value
        self.n += 1


class Metrics:
    """The engine's counters, gauges and histograms; thread-safe; rendered by :meth:`render`."""

    def __init__(
        self,
        model_name: str,
        *,
        num_spec_tokens: int | None,
        max_model_len: int = 32768,
        now: float | None = None,
        cache_block_tokens: int | None = None,
    ) -> None:
        """``num_spec_tokens`` None means no speculative config (no spec_decode families).

        ``cache_block_tokens``: the prefix-cache block, exported as vLLM does in
        ``vllm:cache_config_info`` (labels ``block_size`` and ``effective_attention_block_size``).
        """
        self.model_name = model_name
        self.cache_block_tokens = cache_block_tokens
        self.num_spec_tokens = num_spec_tokens
        self.created = time.time() if now is None else now
        self._lock = threading.Lock()
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self.success: dict[str, float] = dict.fromkeys(FINISHED_REASONS, 0.0)
        self.spec: dict[str, float] = dict.fromkeys(SPEC_COUNTERS, 0.0)
        self.per_pos: list[float] = [0.0] * (num_spec_tokens or 0)
        self.gauges: dict[str, float] = dict.fromkeys(GAUGES, 0.0)
        token_buckets = buckets_1_2_5(max_model_len)
        self.buckets = {name: (b or token_buckets) for name, (_, b) in HISTOGRAMS.items()}
        self.histograms = {name: _Histogram(b) for name, b in self.buckets.items()}

    # --- updates ------------------------------------------------------------------
    def inc(self, name: str, amount: float = 1.0) -> None:
        """Add to a counter of COUNTERS."""
        with self._lock:
            self.counters[name] += amount

    def finished(self, reason: str) -> None:
        """Count one finished request by its finish reason."""
        with self._lock:
            self.success[reason] = self.success.get(reason, 0.0) + 1.0

    def set_gauge(self, name: str, value: float) -> None:
        """Set a gauge of GAUGES."""
        with self._lock:
            self.gauges[name] = value

    def observe(self, name: str, value: float) -> None:
        """Observe a value in a histogram of HISTOGRAMS."""
        with self._lock:
            self.histograms[name].observe(value)

    def draft(self, proposed: int, accepted: int) -> None:
        """Record one speculative draft of ``proposed`` tokens of which the first ``accepted``
        held."""
        if self.num_spec_tokens is None:
            return
        with self._lock:
            self.spec["vllm:spec_decode_num_drafts"] += 1
            self.spec["vllm:spec_decode_num_draft_tokens"] += proposed
            self.spec["vllm:spec_decode_num_accepted_tokens"] += accepted
            for pos in range(min(accepted, len(self.per_pos))):
                self.per_pos[pos] += 1

    # --- exposition ---------------------------------------------------------------
    def _labels(self, **extra: str) -> str:
        # prometheus_client (as vLLM 0.32 ships it) writes label names sorted.
        labels = {"model_name": self.model_name, "engine": "0", **extra}
        return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))

    def _counter(
        self, out: list[str], name: str, help_text: str, rows: list[tuple[dict[str, str], float]]
    ) -> None:
        """A counter family ``<name>_total`` and its ``<name>_created`` gauge family, as vLLM
        writes them."""
        out += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter"]
        out += [f"{name}_total{{{self._labels(**labels)}}} {_fmt(value)}" for labels, value in rows]
        out += [f"# HELP {name}_created {help_text}", f"# TYPE {name}_created gauge"]
        out += [
            f"{name}_created{{{self._labels(**labels)}}} {_fmt(self.created)}" for labels, _ in rows
        ]

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of every family."""
        out: list[str] = []
        if self.cache_block_tokens:
            # An info gauge: vLLM writes the CacheConfig's fields as labels, engine only, no
            # model_name.
            block = str(self.cache_block_tokens)
            labels = {"block_size": block, "effective_attention_block_size": block,
                      "enable_prefix_caching": "True", "engine": "0"}
            out += [
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge",
                "vllm:cache_config_info{"
                + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                + "} 1.0",
            ]
        with self._lock:
            for name, help_text in GAUGES.items():
                out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
                out.append(f"{name}{{{self._labels()}}} {_fmt(self.gauges[name])}")
            self._counter(
                out,
                "vllm:request_success",
                "Count of successfully processed requests.",
                [({"finished_reason": r}, v) for r, v in self.success.items()],
            )
            families = dict(COUNTERS)
            values = dict(self.counters)
            if self.num_spec_tokens is not None:
                families.update(SPEC_COUNTERS)
                values.update(self.spec)
            for name, help_text in families.items():
                self._counter(out, name, help_text, [({}, values[name])])
            if self.num_spec_tokens is not None:
                self._counter(
                    out,
                    "vllm:spec_decode_num_accepted_tokens_per_pos",
                    "Accepted tokens per draft position.",
                    [({"position": str(pos)}, v) for pos, v in enumerate(self.per_pos)],
                )
            for name, (help_text, _) in HISTOGRAMS.items():
                hist, buckets = self.histograms[name], self.buckets[name]
                out += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
                running = 0
                for bound, count in zip(buckets, hist.counts, strict=True):
                    running += count
                    out.append(f"{name}_bucket{{{self._labels(le=_fmt(bound))}}} {_fmt(running)}")
                out.append(f"{name}_bucket{{{self._labels(le='+Inf')}}} {_fmt(hist.n)}")
                out.append(f"{name}_count{{{self._labels()}}} {_fmt(hist.n)}")
                out.append(f"{name}_sum{{{self._labels()}}} {_fmt(hist.total)}")
                out += [f"# HELP {name}_created {help_text}", f"# TYPE {name}_created gauge"]
                out.append(f"{name}_created{{{self._labels()}}} {_fmt(self.created)}")
        return "\n".join(out) + "\n"
