"""The serving API key end to end on loopback: the emulator enforces it like vLLM, the soak sends
it.

vLLM with ``$VLLM_API_KEY`` answers 401 on every ``/v1`` path without ``Authorization:
Bearer <key>`` and leaves /health and /metrics open; the gate must pass only with the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import httpx

from fleetctl.soak.readiness import wait_ready
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import smoke_check
from fleetctl.soak.verdict import Outcome

from .conftest import SERVED, Served

KEY = "sk-loopback-5b1f0c2e9a7d4e8f"


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_emulator_enforces_the_key_like_vllm(emulator: Callable[..., Served]) -> None:
    served = emulator(spec=False, VLLM_API_KEY=KEY)
    url = served.target.base_url
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.get(url + "/metrics", timeout=10).status_code == 200
    bare = httpx.get(url + "/v1/models", timeout=10)
    assert bare.status_code == 401 and bare.json() == {"error": "Unauthorized"}
    wrong = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401
    post = httpx.post(
        url + "/v1/chat/completions", json={"model": SERVED[0], "messages": []}, timeout=10
    )
    assert post.status_code == 401
    good = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert good.status_code == 200 and {m["id"] for m in good.json()["data"]} >= set(SERVED)


def test_the_gate_passes_only_with_the_key_and_stores_it_nowhere(emulator: Callable[..., Served],
                                                                  tmp_path: Path) -> None:
    served = emulator(spec=False, VLLM_API_KEY=KEY)
    cfg = load_config(
        {"readiness_timeout": 20, "max_tokens": 16}, profile="lab", served_model_names=SERVED
    )
    # Readiness is /health, which vLLM leaves open: a missing key shows up at identity, not as a
    # hang.
    assert wait_ready(served.target, 20, 0.2).ready
    without = smoke_check(served.target, cfg, artifacts_dir=tmp_path / "without")
    assert without.outcome is not Outcome.PASS
    assert "401" in without.check("identity").message
    keyed = dataclasses.replace(served.target, api_key=KEY)
    assert KEY not in repr(keyed)
    with_key = smoke_check(keyed, cfg, artifacts_dir=tmp_path / "with")
    assert with_key.outcome is Outcome.PASS, with_key.summary
    assert _files_containing(tmp_path, KEY) == []
