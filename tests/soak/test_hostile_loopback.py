"""The soak against hostile or broken servers on loopback (tests/soak/fakevllm.py): each case asserts
the verdict and its message; the hostile ones also a wall-time and memory ceiling in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetctl.soak.config import SoakConfig, load_config
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import Outcome, SoakTarget, Verdict

from .fakevllm import MODEL, FakeVLLM, serve


def quick(**over: Any) -> SoakConfig:
    """A soak of seconds against the fake server: one class, two levels, a short sustained phase."""
    raw: dict[str, Any] = {
        "concurrency": [1, 2], "classes": ["coding"], "max_tokens": 24, "readiness_timeout": 10,
        "request_timeout": 10, "level_timeout": 10, "class_requests": 2,
        "sustained": {"duration": 3, "concurrency": 2, "window": 1, "shared_prefix_tokens": 0},
        "checks": {"correctness": {"long_decode_tokens": 0}},
    }
    raw.update(over)
    return load_config(raw, profile="lab", served_model_names=(MODEL,), speculative=True)


def soak(fake: FakeVLLM, cfg: SoakConfig, tmp_path: Path) -> Verdict:
    return run_soak(SoakTarget("fake", fake.url), cfg, artifacts_dir=tmp_path / "run")


def _lying_spec_metrics(f: FakeVLLM) -> str:
    # 4 draft tokens per draft, and 4.636 "accepted" per draft: 115.9 %.
    g = f.generated
    return (f'vllm:request_success_total{{finished_reason="length"}} {f.finished}\n'
            f"vllm:generation_tokens_total {g}\nvllm:num_preemptions_total 0\n"
            f"vllm:spec_decode_num_drafts_total {g}\nvllm:spec_decode_num_draft_tokens_total {4 * g}\n"
            f"vllm:spec_decode_num_accepted_tokens_total {4.636 * g}\n"
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {0.9 * g}\n')


def test_impossible_acceptance_counters_make_the_acceptance_checks_inconclusive(tmp_path: Path) -> None:
    with serve(FakeVLLM(metrics=_lying_spec_metrics)) as fake:
        v = soak(fake, quick(), tmp_path)
    acc = v.check("acceptance")
    assert acc.outcome is Outcome.INCONCLUSIVE, acc.message
    assert "metrics inconsistent" in acc.message and "vllm:spec_decode_num_accepted_tokens_total" in acc.message
    assert "115.9%" in acc.message  # what it would have read, named as impossible
    assert v.check("acceptance_decay").outcome is Outcome.INCONCLUSIVE
    assert v.outcome is Outcome.INCONCLUSIVE, v.summary
    assert "acceptance 115.9" not in v.summary
    assert all(w.acceptance_rate is None or w.acceptance_rate <= 1 for w in v.windows)
