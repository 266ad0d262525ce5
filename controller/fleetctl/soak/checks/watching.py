"""How a check judges ``fleetctl watch``'s intervals and the re-gate's burst of load: the evidence
of one interval of one host, what the judges keep of a host between intervals, :class:`WatchJudge`
(a check's watch side), :class:`Burst` and :data:`BurstJudge` (a check's burst side).

The watch (soak/watch.py) probes each host every interval (one greedy canary, one short streamed
request, a /metrics scrape) and hands what it saw to the ``watch`` judge of every registered check
that has one, in report order; each judge returns that interval's measurements, and the watch
applies the check's limits to all of them at the end (``judge.decide``). The burst
(soak/burst.py) hands its samples to the ``burst`` judge of every registered check that has one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fleetctl.soak.config import SoakConfig
from fleetctl.soak.prompts import SmokePrompt
from fleetctl.soak.traffic import Traffic
from fleetctl.soak.verdict import CheckResult, Measurement, Sample, Window


@dataclass(frozen=True)
class WatchSettings:
    """How long, how often, how many hosts at once, and the bounds the intervals are held to."""

    duration: float
    interval: float
    parallel: int = 64
    stream_max_tokens: int = 16
    #: Server-side error rate (reason ``error`` / finished) allowed per interval, and the errors a
    #: window needs before its rate is judged.
    max_server_error_rate: float = 0.01
    min_server_errors: int = 2
    #: Preemptions per minute (judged past 10 in a window, as the soak does).
    max_preemptions_per_minute: float | None = None
    #: TTFT p95 / TPOT p50 bounds in seconds (None: the soak profile's loosest latency bounds).
    ttft_p95: float | None = None
    tpot_p50: float | None = None
    #: Acceptance kept relative to the watch's first block: acceptance is judged over blocks of
    #: consecutive intervals holding at least ``min_draft_tokens`` drafted tokens (a few requests'
    #: drafts are noise: 5 % vs 9 % between two 1 s windows of the same healthy server), the first
    #: block the reference.
    acceptance_ratio: float = 0.8
    min_draft_tokens: int = 2000
    #: Failing intervals a check tolerates before it fails (a page).
    failure_limit: int = 0


@dataclass
class WatchState:
    """What the judges keep of one host between intervals (cleared when its server is restarted
    or replaced: new counters, new greedy answers)."""

    #: Each canary's first answer in this watch: its reference.
    refs: dict[str, str] = field(default_factory=dict)
    #: The first acceptance block's rate (the reference), and the block being filled: accepted
    #: and drafted tokens, and the interval it started in.
    first_acceptance: float | None = None
    block: list[float] = field(default_factory=lambda: [0.0, 0.0])
    block_from: str = ""
    #: The server exported spec-decode counters in some scrape (kept across restarts).
    spec_seen: bool = False

    def fresh_start(self) -> None:
        """The server was restarted or replaced: its answers and counters start afresh."""
        self.refs.clear()
        self.first_acceptance, self.block, self.block_from = None, [0.0, 0.0], ""


@dataclass(frozen=True)
class Interval:
    """What one interval of the watch saw of one host."""

    label: str
    host: str
    config: SoakConfig
    settings: WatchSettings
    state: WatchState
    canary: Sample
    canary_prompt: SmokePrompt
    stream: Sample
    #: /health answered 200 after a request stalled (False: it did not, or no request stalled).
    health_ok: bool = False
    #: The /metrics delta since the host's last scrape (None: no earlier scrape, or none now).
    traffic: Traffic | None = None
    window: Window | None = None
    #: Why this interval's /metrics could not be read or parsed (empty: it was).
    scrape_error: str = ""

    @property
    def stall(self) -> float | None:
        """The liveness bound the requests were held to (None: not watched)."""
        return self.config.token_timeout()


@dataclass(frozen=True)
class WatchTotals:
    """What a host's watch came to, for the judges' passing messages."""

    settings: WatchSettings
    requests: int
    intervals: int
    spec_seen: bool


@dataclass(frozen=True)
class WatchJudge:
    """A check's watch side: its name in a watch's verdict, its judgement of one interval, and
    the messages of its result."""

    #: The check's name in a watch's verdict (the soak check's, unless the watch calls it
    #: otherwise: the soak's ``errors`` are the watch's ``probes``).
    name: str
    interval: Callable[[Interval], Sequence[Measurement]]
    #: The message when every interval passed.
    passing: Callable[[WatchTotals], str]
    #: Why nothing was judged, when no interval gave a measurement.
    no_data: str = ""
    #: It reads only what the server reports: with no measurement at all it is skipped, not
    #: inconclusive.
    server_series: bool = False
    #: When set, a check with no measurement at all is skipped with this message instead.
    unjudged: Callable[[WatchTotals], str] | None = None


@dataclass(frozen=True)
class Burst:
    """A burst of load (soak/burst.py, the re-gate after a remediation's smoke): its samples, in
    the order they finished, judged on their own."""

    host: str
    config: SoakConfig
    samples: tuple[Sample, ...]
    #: The burst outlived its bound and was cut.
    cut: bool = False
    #: /health answered 200 after a request stalled (False: it did not, or none stalled).
    health_ok: bool = False


#: A check's burst side: the burst's results it gives (a check may give several).
BurstJudge = Callable[[Burst], Sequence[CheckResult]]
