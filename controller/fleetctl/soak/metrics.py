"""vLLM's /metrics: scrapes parsed, and what happened between two of them.

The text is Prometheus' exposition format, parsed here rather than with prometheus_client's parser:
a soak scrapes about ten times, each scrape of a vLLM holds hundreds of samples, and that
parser (a character at a time, every label validated) was the largest part of the controller's
CPU per host in a rollout (bench/fleet_scale.py: ~140 of ~210 ms per host at 256 hosts). This one
keeps only ``vllm:`` samples, reads each label with one regular expression, and parses each series'
text once per process (every scrape repeats the same series); a unit test holds it equal to
prometheus_client's on the emulator's, a real vLLM's and hostile texts.

Every series carries ``model_name`` and ``engine`` labels; a scrape sums over
them (one figure per server, whatever its data-parallel layout). Counters are
only ever used as deltas over a window: lifetime totals hide an acceptance
decay behind hours of good history (docs/domain.md#what-vllms-api-and-metrics-say).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetctl.soak.verdict import Window

PREFIX = "vllm:"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SUCCESS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"

#: Series a vLLM 0.2x server always exports (the conformance test compares them).
CORE_SERIES = (
    SUCCESS, PROMPT_TOKENS, GENERATION_TOKENS, PREEMPTIONS, KV_USAGE, RUNNING, WAITING,
    "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
    "vllm:request_time_per_output_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_count", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)
#: Series only a server with a speculative config exports.
SPEC_SERIES = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)

_AGGREGATED = ("model_name", "engine")


class MetricsError(ValueError):
    """The /metrics text is not Prometheus exposition format."""


@dataclass(frozen=True)
class Scrape:
    """One /metrics read: sample name -> {remaining labels -> value}, at ``t`` (soak-relative s)."""

    t: float
    series: Mapping[str, Mapping[tuple[tuple[str, str], ...], float]] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float | None:
        """The summed value of ``name`` over series matching ``labels`` (None when absent)."""
        by_labels = self.series.get(name)
        if not by_labels:
            return None
        want = set(labels.items())
        hits = [v for k, v in by_labels.items() if want <= set(k)]
        total = sum(hits) if hits else None
        return total if total is None or math.isfinite(total) else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``name`` summed per value of ``label`` (e.g. finished_reason -> count)."""
        out: dict[str, float] = {}
        for k, v in self.series.get(name, {}).items():
            d = dict(k)
            if label in d and math.isfinite(v):
                out[d[label]] = out.get(d[label], 0.0) + v
        return out

    def names(self) -> set[str]:
        """Every sample name present (with _total/_count/_bucket suffixes)."""
        return set(self.series)

    @property
    def has_spec_decode(self) -> bool:
        """True when the server exports speculative-decoding counters."""
        return DRAFTS in self.series and DRAFT_TOKENS in self.series


CACHE_CONFIG = "vllm:cache_config_info"
#: The cache_config_info labels that bound which prompt prefix can be reused: prefix caching keeps
#: and hits whole blocks, and on hybrid models vLLM aligns them to the Mamba state's page (~2k).
_BLOCK_LABELS = (
    "block_size",
    "effective_attention_block_size",
    "cache_hit_alignment_tokens",
    "mamba_block_size",
)


def cache_block_tokens(s: Scrape) -> int | None:
    """The server's prefix-cache granularity in tokens (``vllm:cache_config_info``), or None.

    The largest of the block and alignment sizes it states: a shared prompt prefix shorter than
    this can never be a prefix-cache hit.
    """
    sizes = [int(v) for key in s.series.get(CACHE_CONFIG, {}) for k, v in key
             if k in _BLOCK_LABELS and v.isdigit() and 0 < int(v) < 1 << 20]
    return max(sizes) if sizes else None


#: One ``name="value"`` of a label set and what follows it (``,`` or ``}``); a value may hold any
#: character, with ``\\``, ``\"`` and ``\n`` escaped.
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|\})')
#: ``}`` closing a label set that ends with a comma (``{a="1",}``), or an empty one.
_CLOSE = re.compile(r"[ \t]*\}")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    """A label value's ``\\\\``, ``\\"`` and ``\\n`` undone (any other backslash kept, as
    Prometheus does)."""
    if "\\" not in value:
        return value
    return _UNESCAPE.sub(
        lambda m: {"n": "\n", "\\": "\\", '"': '"'}.get(m.group(1), m.group(0)), value
    )


def _sample(line: str) -> tuple[str, dict[str, str], float, bool]:
    """``name{labels} value [timestamp]`` -> (name, labels, value, has a timestamp); ValueError
    when malformed."""
    m = _NAME.match(line)
    if m is None:
        raise ValueError(f"no metric name in {line[:80]!r}")
    name, pos = m.group(0), m.end()
    labels: dict[str, str] = {}
    braced = pos < len(line) and line[pos] == "{"
    if braced:
        pos += 1
        while True:
            c = _CLOSE.match(line, pos)
            if c is not None:
                pos = c.end()
                break
            lm = _LABEL.match(line, pos)
            if lm is None:
                raise ValueError(f"bad label set in {line[:80]!r}")
            labels[lm.group(1)] = _unescape(lm.group(2))
            pos = lm.end()
            if lm.group(3) == "}":
                break
    rest = line[pos:].split()
    if not rest or len(rest) > 2 or (not braced and pos < len(line) and line[pos] not in " \t"):
        raise ValueError(f"no value (or more than a value and a timestamp) in {line[:80]!r}")
    if len(rest) == 2:
        float(rest[1])  # the timestamp must be a number; it is not used
    return name, labels, float(rest[0]), len(rest) == 2


#: A series' text (``name{labels}``, as it stands before its value) -> its name and summed-over key.
#: Every scrape of every host repeats the same few hundred series (the labels name the model, not
#: the host), so each is parsed once per process; bounded all the same (a server could invent
#: labels).
_SERIES: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
_SERIES_MAX = 20000


def parse(text: str, t: float = 0.0) -> Scrape:
    """Parse Prometheus text into a :class:`Scrape` (``vllm:`` samples), summing over model_name
    and engine."""
    series: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line.startswith(PREFIX):
            if line and not line.startswith("#") and _NAME.match(line) is None:
                raise MetricsError(f"/metrics is not Prometheus text: line {n}: {line[:80]!r}")
            continue
        head, _, tail = line.rpartition(" ")
        known = _SERIES.get(head)
        try:
            if known is not None:
                name, key = known
                value = float(tail)
            else:
                name, labels, value, stamped = _sample(line)
                key = tuple(sorted((k, v) for k, v in labels.items() if k not in _AGGREGATED))
                if not stamped:
                    if len(_SERIES) >= _SERIES_MAX:
                        _SERIES.clear()
                    _SERIES[head] = (name, key)
        except ValueError as e:
            raise MetricsError(f"/metrics is not Prometheus text: line {n}: {e}") from None
        bucket = series.setdefault(name, {})
        if not math.isfinite(value) or not math.isfinite(bucket.get(key, 0.0)):
            # NaN/Inf is missing data: the whole series reads as absent (inconclusive),
            # never as a number a bound could pass (NaN < x and NaN > x are both False).
            bucket[key] = math.nan
            continue
        bucket[key] = bucket.get(key, 0.0) + value
    return Scrape(t=t, series=series)


def _delta(a: Scrape, b: Scrape, name: str, **labels: str) -> tuple[float | None, bool]:
    va, vb = a.value(name, **labels), b.value(name, **labels)
    if vb is None:
        return None, False
    if va is None:
        va = 0.0  # the series appears with its first event (labelled counters do)
    if vb < va:
        return vb, True  # reset: the server restarted; what it counted since is all we know
    return vb - va, False


def window(a: Scrape, b: Scrape, label: str, phase: str, during: Sequence[Scrape] = ()) -> Window:
    """What happened between scrapes ``a`` and ``b`` (``during``: scrapes in between, for
    gauges)."""
    seconds = max(b.t - a.t, 1e-9)
    reset = False
    bad: list[str] = []

    def d(name: str, **labels: str) -> float | None:
        nonlocal reset
        v, r = _delta(a, b, name, **labels)
        if r:
            reset = True
            where = "".join(f'{{{k}="{x}"}}' for k, x in labels.items())
            bad.append(
                f"{name}{where} went backwards ({a.value(name, **labels):g} -> "
                f"{b.value(name, **labels):g})"
            )
        return v

    gen = d(GENERATION_TOKENS)
    drafts = d(DRAFTS)
    draft_tokens = d(DRAFT_TOKENS)
    accepted = d(ACCEPTED)
    rate = accepted / draft_tokens if accepted is not None and draft_tokens else None
    mal = 1.0 + accepted / drafts if accepted is not None and drafts else None
    per_pos: list[float] = []
    if drafts:
        # A label that is not a small integer is another server's idea of a position: skip it.
        positions = sorted({int(p) for p in b.by_label(ACCEPTED_PER_POS, "position")
                            if p.isascii() and p.isdigit() and len(p) < 4})
        for p in positions:
            v = d(ACCEPTED_PER_POS, position=str(p))
            per_pos.append((v or 0.0) / drafts)
    bad += inconsistencies(drafts, draft_tokens, accepted, per_pos)
    if any(x.startswith(SPEC_SERIES) for x in bad):
        # Impossible spec-decode counts are not a rate: no acceptance figure is derived from them
        # (a verdict once said "acceptance 115.9 %"); the checks reading them say why instead.
        accepted, rate, mal, per_pos = None, None, None, []
    reasons: dict[str, float] = {}
    for reason in sorted(
        set(b.by_label(SUCCESS, "finished_reason")) | set(a.by_label(SUCCESS, "finished_reason"))
    ):
        v = d(SUCCESS, finished_reason=reason)
        if v is not None:
            reasons[reason] = v
    kv = [v for s in (a, *during, b) if (v := s.value(KV_USAGE)) is not None]
    return Window(
        label=label,
        phase=phase,
        start=a.t,
        end=b.t,
        generation_tok_s=gen / seconds if gen is not None else None,
        prompt_tokens=d(PROMPT_TOKENS),
        generation_tokens=gen,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        acceptance_rate=rate,
        mean_acceptance_length=mal,
        per_position=tuple(per_pos),
        success_by_reason=reasons,
        preemptions=d(PREEMPTIONS),
        kv_cache_usage_max=max(kv) if kv else None,
        counter_reset=reset,
        prefix_cache_queries=d(PREFIX_QUERIES),
        prefix_cache_hits=d(PREFIX_HITS),
        inconsistent=tuple(bad),
    )


#: Slack for counters scraped a moment apart (a draft step counted in one series before the other).
_SLACK = 1.0


def inconsistencies(drafts: float | None, draft_tokens: float | None, accepted: float | None,
                    per_pos: Sequence[float]) -> list[str]:
    """What no real server can report in one window: more accepted tokens than drafted, a position
    accepted more often than drafts were made, positions summing past the accepted total."""
    out: list[str] = []
    if accepted is not None and draft_tokens is not None and accepted > draft_tokens + _SLACK:
        out.append(f"{ACCEPTED} grew by {accepted:g}, more than {DRAFT_TOKENS} ({draft_tokens:g}): "
                   f"acceptance would be {accepted / max(draft_tokens, 1e-9):.1%}")
    if drafts and draft_tokens is not None and drafts > draft_tokens + _SLACK:
        out.append(f"{DRAFTS} grew by {drafts:g}, more than {DRAFT_TOKENS} ({draft_tokens:g})")
    for i, r in enumerate(per_pos):
        if drafts and r * drafts > drafts + _SLACK:
            out.append(
                f'{ACCEPTED_PER_POS}{{position="{i}"}} grew by {r * drafts:g}, more than {DRAFTS} '
                f"({drafts:g}): position {i} acceptance would be {r:.1%}"
            )
    if (
        drafts
        and accepted is not None
        and sum(per_pos) * drafts > accepted + _SLACK * max(len(per_pos), 1)
    ):
        out.append(
            f"{ACCEPTED_PER_POS} sums to {sum(per_pos) * drafts:g}, more than {ACCEPTED} "
            f"({accepted:g})"
        )
    for i in range(1, len(per_pos)):
        if drafts and (per_pos[i] - per_pos[i - 1]) * drafts > _SLACK:
            # A draft token is accepted only when every one before it was: position i never beats
            # i-1.
            out.append(
                f'{ACCEPTED_PER_POS}{{position="{i}"}} ({per_pos[i] * drafts:g}) exceeds position '
                f"{i - 1} ({per_pos[i - 1] * drafts:g})"
            )
    return out


def merge_windows(windows: Iterable[Window], label: str, phase: str) -> Window | None:
    """Several consecutive windows as one (sums of deltas); None when there are none."""
    ws = list(windows)
    if not ws:
        return None

    def total(attr: str) -> float | None:
        vals = [getattr(w, attr) for w in ws if getattr(w, attr) is not None]
        return sum(vals) if vals else None

    drafts, draft_tokens, accepted = (
        total("drafts"),
        total("draft_tokens"),
        total("accepted_tokens"),
    )
    gen = total("generation_tokens")
    seconds = sum(w.end - w.start for w in ws) or 1e-9
    reasons: dict[str, float] = {}
    for w in ws:
        for k, v in w.success_by_reason.items():
            reasons[k] = reasons.get(k, 0.0) + v
    npos = max((len(w.per_position) for w in ws), default=0)
    per_pos: tuple[float, ...] = ()
    if drafts:
        per_pos = tuple(
            sum((w.per_position[i] * (w.drafts or 0.0)) for w in ws if i < len(w.per_position))
            / drafts
            for i in range(npos)
        )
    kv = [w.kv_cache_usage_max for w in ws if w.kv_cache_usage_max is not None]
    return Window(
        label=label,
        phase=phase,
        start=ws[0].start,
        end=ws[-1].end,
        generation_tok_s=gen / seconds if gen is not None else None,
        prompt_tokens=total("prompt_tokens"),
        generation_tokens=gen,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        acceptance_rate=accepted / draft_tokens if accepted is not None and draft_tokens else None,
        mean_acceptance_length=1.0 + accepted / drafts if accepted is not None and drafts else None,
        per_position=per_pos,
        success_by_reason=reasons,
        preemptions=total("preemptions"),
        kv_cache_usage_max=max(kv) if kv else None,
        counter_reset=any(w.counter_reset for w in ws),
        prefix_cache_queries=total("prefix_cache_queries"),
        prefix_cache_hits=total("prefix_cache_hits"),
        inconsistent=tuple(x for w in ws for x in w.inconsistent),
    )


TTFT = "vllm:time_to_first_token_seconds"
#: Time per output token per request: vLLM 0.2x's name, then the older one.
TPOT = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds")


def histogram_quantile(a: Scrape, b: Scrape, name: str, q: float) -> float | None:
    """The ``q`` quantile of histogram ``name`` over the observations made between ``a`` and ``b``.

    Prometheus' ``histogram_quantile`` over the bucket deltas (linear within a bucket; the +Inf
    bucket answers the highest finite bound). None when nothing was observed, a bucket went
    backwards (a restart: the deltas are not the window's) or the buckets are not cumulative.
    """
    bucket = name + "_bucket"
    hb, ha = b.by_label(bucket, "le"), a.by_label(bucket, "le")
    try:
        pts = sorted((float(le), hb[le] - ha.get(le, 0.0)) for le in hb)
    except ValueError:
        return None
    if not pts or not math.isinf(pts[-1][0]) or any(c < 0 for _, c in pts) \
            or any(pts[i][1] < pts[i - 1][1] for i in range(1, len(pts))):
        return None
    total = pts[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in pts:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le
