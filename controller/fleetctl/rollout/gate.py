"""The rollout's gate: the soak engine configured by the recipe, baselines, and how verdicts are
shown.

The one place the rollout talks to ``fleetctl.soak``: readiness, a full
soak after a deploy (compared with the host's baseline on the tag it served
before, and kept as the new tag's baseline when it passes), a smoke-only
check after a rollback.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from fleetctl import secretenv
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import Progress
from fleetctl.recipes import Recipe
from fleetctl.rollout import side_by_side
from fleetctl.soak import (
    Against,
    Readiness,
    SoakConfig,
    SoakTarget,
    Verdict,
    baselines,
    burst,
    fleet,
    references,
    run_soak,
    smoke_check,
    wait_ready,
)
from fleetctl.soak.answerset import ReferenceSet
from fleetctl.soak.verdict import Outcome


def config(recipe: Recipe, soak_seconds: float | None, host: Host) -> SoakConfig:
    """The recipe's soak config, with ``--soak`` overriding the sustained phase's length.

    The profile is the host's ``fleetctl_soak_profile`` (as for ``fleetctl soak``), else the
    recipe's.
    """
    cfg = fleet.host_config(recipe, host)
    return cfg.with_duration(soak_seconds) if soak_seconds is not None else cfg


def target(host: Host, recipe: Recipe, tag: str, api_key: str | None = None) -> SoakTarget:
    """The soak target of ``host``'s serving container (its logs and state read over SSH).

    ``api_key`` is sent as ``Authorization: Bearer`` when the recipe's vLLM requires one.
    """
    return fleet.host_target(host, recipe, tag, api_key)


def wait(t: SoakTarget, cfg: SoakConfig, timeout: float | None, progress: Progress) -> Readiness:
    """Wait for /health 200 (live progress with the log tail); the outcome says why not."""
    return wait_ready(t, timeout or cfg.readiness_timeout, cfg.readiness_poll, progress)


def soak(
    t: SoakTarget,
    cfg: SoakConfig,
    store: baselines.Store,
    baseline_tag: str | None,
    artifacts: Path,
    run_id: str,
    progress: Progress,
    baseline_key: str | None = None,
    ref_key: str | None = None,
    recipe: str = "",
    side: Future[ReferenceSet | None] | None = None,
) -> Verdict:
    """The full gate, compared with the host's baseline on the tag it served before, and its
    greedy answers with the recipe's known-good reference set (``ref_key``,
    :mod:`fleetctl.soak.references`; a pass records this version's set as the next known-good)
    and, with ``side``, with a host still on the old version (rollout/side_by_side.py).

    The baseline is the soak engine's own (``fleetctl.soak.baselines``, the one
    ``fleetctl soak`` uses too), kept in the fleet's ledger (``store``): the last
    passing soaks of ``baseline_tag`` on this host (``baseline_key``, when given: a
    unit's own, :func:`fleetctl.soak.baselines.unit_key`, whichever member is its head). A pass
    joins the window of the new tag (a failure is not kept). Samples, scrapes and verdict.json
    are written under ``artifacts``.
    """
    key = baseline_key or t.name
    base = baselines.load(store, key, baseline_tag) if baseline_tag else None
    known = references.load(store, ref_key) if ref_key else None
    v = run_soak(t, cfg, Against(base, reference=known, side=side), progress,
                 artifacts_dir=artifacts, run_id=run_id)
    baselines.save(store, key, t.tag, v)
    if ref_key:
        references.save(store, ref_key, v, recipe)
    return v


def smoke(t: SoakTarget, cfg: SoakConfig, artifacts: Path) -> Verdict:
    """Readiness, identity and smoke only: the check after a rollback (no baseline read or
    written)."""
    return smoke_check(t, cfg, artifacts_dir=artifacts)


class Gates(Protocol):
    """How the engine judges a host's serving container: readiness, the full soak, the smoke check.

    :class:`SoakGates` is the real one (HTTP to the server, logs over SSH);
    the unit tests' simulated fleet answers from its simulated containers.
    """

    def wait(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, timeout: float | None,
             progress: Progress) -> Readiness:
        """Wait for /health 200 on ``host``'s serving container."""
        ...

    def soak(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, store: baselines.Store,
             baseline_tag: str | None, artifacts: Path, run_id: str, progress: Progress,
             baseline_key: str | None = None) -> Verdict:
        """The full gate (see :func:`soak`); ``store`` holds the baselines (the fleet's ledger)."""
        ...

    def smoke(
        self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, artifacts: Path
    ) -> Verdict:
        """Readiness, identity and smoke (see :func:`smoke`)."""
        ...

    def load(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, seconds: float,
             artifacts: Path) -> Verdict:
        """``seconds`` of concurrent greedy requests and the canaries, judged on their own
        (``fleetctl.soak.burst``: a remediation's re-gate after smoke)."""
        ...


class SoakGates:
    """:class:`Gates` through the soak engine, against the real server.

    ``secrets`` (default: the environment) holds the recipe's ``VLLM_API_KEY`` (or its
    ``_FILE``), sent as ``Authorization: Bearer`` when the recipe requires a key.
    """

    def __init__(self, secrets: Mapping[str, str] | None = None,
                 inventory: Inventory | None = None) -> None:
        self.secrets = secrets
        #: The fleet, to find a host still on the old version for the side-by-side answers.
        self.inventory = inventory

    def _target(self, host: Host, recipe: Recipe, tag: str) -> SoakTarget:
        key = secretenv.api_key(recipe.secret_env, self.secrets, recipe=recipe.name)
        return target(host, recipe, tag, key)

    def wait(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, timeout: float | None,
             progress: Progress) -> Readiness:
        return wait(self._target(host, recipe, tag), cfg, timeout, progress)

    def soak(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, store: baselines.Store,
             baseline_tag: str | None, artifacts: Path, run_id: str, progress: Progress,
             baseline_key: str | None = None) -> Verdict:
        with ThreadPoolExecutor(1, thread_name_prefix="side-by-side") as pool:
            side = side_by_side.start(pool, store, self.inventory, run_id, host, recipe, cfg,
                                      self.secrets)
            return soak(
                self._target(host, recipe, tag),
                cfg,
                store,
                baseline_tag,
                artifacts,
                run_id,
                progress,
                baseline_key,
                references.host_key(recipe.name, host.vars),
                recipe.name,
                side,
            )

    def smoke(
        self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, artifacts: Path
    ) -> Verdict:
        return smoke(self._target(host, recipe, tag), cfg, artifacts)

    def load(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, seconds: float,
             artifacts: Path) -> Verdict:
        return burst.short_load(self._target(host, recipe, tag), cfg, seconds,
                                artifacts_dir=artifacts)


def failed_checks(v: Verdict) -> list[str]:
    """``name: message`` of every check that did not pass (skipped ones are not failures)."""
    return [f"{c.name}: {c.message}" for c in v.checks
            if c.outcome not in (Outcome.PASS, Outcome.SKIPPED) and not c.observe_only]


def failed_checks_text(v: Verdict) -> str:
    """The failed checks in one line, or the verdict's summary when none is named."""
    return "; ".join(failed_checks(v)) or v.summary


def figures(v: Verdict) -> dict[str, str]:
    """tok/s of the sustained phase and the mean acceptance of its windows, for the live table."""
    out: dict[str, str] = {}
    tok = [lv.tok_s for lv in v.levels if lv.phase == "sustained" and lv.tok_s is not None]
    if not tok:
        tok = [lv.tok_s for lv in v.levels if lv.tok_s is not None]
    if tok:
        out["tok/s"] = f"{max(tok):.0f}"
    acc = [w.acceptance_rate for w in v.windows if w.acceptance_rate is not None]
    if acc:
        out["acceptance"] = f"{sum(acc) / len(acc):.0%}"
    return out


def table_figures(data: Mapping[str, Any]) -> dict[str, str]:
    """Pick tok/s and acceptance out of a soak progress event's data, whatever their keys."""
    out: dict[str, str] = {}
    for k, v in data.items():
        key = k.lower()
        if v is None:
            continue
        if "tok" in key and isinstance(v, int | float):
            out["tok/s"] = f"{v:.0f}"
        elif "accept" in key and isinstance(v, int | float):
            out["acceptance"] = f"{v:.0%}" if v <= 1 else f"{v:.0f}%"
    return out


def summarise(
    v: Verdict | None, timings: Mapping[str, float], sustained: float | None = None
) -> dict[str, Any]:
    """What the ledger keeps of a verdict: outcome, summary, failed checks with values, run id,
    timings, and the sustained seconds the soak was asked for (``sustained_s``: a plan's estimate
    separates the soak's fixed phases from its sustained one with it, see
    :func:`fleetctl.rollout.plan.learned`)."""
    if v is None:
        return {"timings": dict(timings)}
    checks = []
    for c in v.checks:
        meas = [
            {"label": m.label, "outcome": m.outcome.value, "measured": m.measured, "bound": m.bound}
            for m in c.measurements
            if m.outcome not in (Outcome.PASS, Outcome.SKIPPED)
        ][:5]
        checks.append(
            {"name": c.name, "outcome": c.outcome.value, "message": c.message, "failing": meas}
        )
    return {"outcome": v.outcome.value, "summary": v.summary, "run_id": v.run_id, "tag": v.tag,
            "failed_checks": failed_checks(v), "checks": checks, "figures": figures(v),
            "timings": dict(timings), "artifacts": v.artifacts_dir,
            **({"sustained_s": float(sustained)} if sustained is not None else {})}
