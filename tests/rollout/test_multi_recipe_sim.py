"""A fleet serving several models, on the simulated fleet (tests/rollout/sim.py): a rollout by tag
rolls each host forward on its own recipe, one canary and one floor per recipe; a recipe whose image
lacks the tag is left out only when the operator says so; a model switch is refused unless named,
and recorded as one; rollback and abort put each host back on its own recipe."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.errors import FleetError
from fleetctl.progress import Progress
from fleetctl.registry import ResolvedImage
from fleetctl.rollout.api import Engine
from fleetctl.rollout.gate import Baseline, Judged
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.soak import Verdict
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

from .sim import OK, SOAKFAIL, SimFleet, SimGates, digest_of
from .sim_run import example_inventory

HERETIC, MM, BF16 = "qwen36-35b-heretic", "qwen36-27b-mm", "qwen35-35b-bf16"
#: Two hosts on the fleet's recipe, one on another recipe of the same image, one on another image's.
RECIPES = {"spark-01": HERETIC, "spark-02": HERETIC, "spark-03": MM, "spark-04": BF16}
INV = example_inventory({"spark-03": MM, "spark-04": BF16})
HOSTS = list(RECIPES)
A, B, C = "v1", "v2", "v3"
TAGS = {A: OK, B: OK, C: OK}


def _fleet() -> SimFleet:
    return SimFleet(dict.fromkeys(HOSTS, A), TAGS, recipes=RECIPES)


class KeyedGates(SimGates):
    """The simulated gates, keeping the baseline key each host's soak was judged under."""

    def __init__(self, fleet: SimFleet) -> None:
        super().__init__(fleet)
        self.keys: dict[str, str | None] = {}

    def soak(self, judged: Judged, baseline: Baseline, artifacts: Path, run_id: str,
             progress: Progress) -> Verdict:
        self.keys[judged.host.name] = baseline.key
        return super().soak(judged, baseline, artifacts, run_id, progress)


def _engine(fleet: SimFleet, state: Path, missing: str | None = None,
            gates: SimGates | None = None) -> Engine:
    """``missing``: an image (repository) the registry has no tag ``B`` in."""
    def resolve(image: str, tag: str, mirrors: Mapping[str, str]) -> ResolvedImage:
        if missing is not None and image.endswith(missing) and tag == B:
            raise FleetError(f"no tag {tag} in {image}", fix="push it")
        return fleet.resolve(image, tag, mirrors)

    eng = Engine(inventory.load(INV), state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=gates or SimGates(fleet), resolve=resolve))
    fleet.watch(eng.ledger)
    return eng


def _rollout(fleet: SimFleet, state: Path, tag: str = B, missing: str | None = None,
             **kw: object) -> RolloutResult:
    eng = _engine(fleet, state, missing)
    try:
        return eng.rollout(Options(tag=tag, soak=1.0, **kw))  # type: ignore[arg-type]
    finally:
        eng.close()


def _serving(fleet: SimFleet) -> dict[str, tuple[str | None, str | None]]:
    """Each host's (tag, recipe label) of what it serves."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for n, h in fleet.hosts.items():
        c = h.serving()
        out[n] = (c.tag, c.labels.get("fleetctl.recipe")) if c is not None else (None, None)
    return out


def _record(state: Path) -> fleet_records.RolloutRecord:
    with fleet_ledger.open_ledger(state) as led:
        return led.history(1)[0]


def test_a_rollout_by_tag_keeps_each_hosts_recipe_with_a_canary_and_a_floor_per_recipe(
        tmp_path: Path) -> None:
    fleet = _fleet()
    eng = _engine(fleet, tmp_path)
    try:
        fp, moved, _facts = eng.plan(Options(tag=B))
    finally:
        eng.close()
    assert [p.recipe for p in fp.plans] == [HERETIC, MM, BF16]
    assert [g.recipe.name for g in moved] == [HERETIC, MM, BF16]
    assert not fp.switches and not fp.left
    # each recipe's own floor: 75 % of its own hosts kept serving (two hosts: one at a time)
    caps = {p.recipe: (p.capacity.total, p.capacity.per_step) for p in fp.plans if p.capacity}
    assert caps == {HERETIC: (2, 1), MM: (1, 1), BF16: (1, 1)}
    # the canaries of every recipe first, then the next waves
    assert fp.waves == [["spark-01", "spark-03", "spark-04"], ["spark-02"]]

    gates = KeyedGates(fleet)
    eng = _engine(fleet, tmp_path, gates=gates)
    try:
        r = eng.rollout(Options(tag=B, soak=1.0))
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED, r.error
    assert _serving(fleet) == {n: (B, RECIPES[n]) for n in HOSTS}
    # each recipe's own baselines: the fleet's recipe under the host's name as ever, another
    # recipe's apart
    assert gates.keys == {"spark-01": "spark-01", "spark-02": "spark-02",
                          "spark-03": f"spark-03/{MM}", "spark-04": f"spark-04/{BF16}"}
    rec = _record(tmp_path)
    assert [w.hosts for w in rec.waves] == [("spark-01", "spark-03", "spark-04"), ("spark-02",)]
    assert {h.host: (h.recipe, h.before_recipe, h.switch) for h in rec.hosts} == {
        n: (RECIPES[n], RECIPES[n], False) for n in HOSTS}
    # the small groups' hosts went one at a time as well: never both heretic hosts at once
    assert {h.host: h.step for h in rec.hosts if h.recipe == HERETIC} == {"spark-01": 0,
                                                                          "spark-02": 0}


def test_a_canary_failing_in_one_recipe_stops_the_run_before_any_next_wave(tmp_path: Path) -> None:
    fleet = _fleet()
    fleet.hosts["spark-03"].behaviour[digest_of(B)] = SOAKFAIL
    r = _rollout(fleet, tmp_path)
    assert r.status == fleet_records.FAILED
    by = {h.host: h for h in r.hosts}
    assert by["spark-03"].status == fleet_records.ROLLED_BACK
    # the other recipes' canaries went in the same wave; the next wave never began
    assert by["spark-02"].status == fleet_records.PENDING
    assert _serving(fleet)["spark-02"] == (A, HERETIC)
    assert _serving(fleet)["spark-03"] == (A, MM)


def test_a_recipe_whose_image_lacks_the_tag_is_refused_unless_skipped(tmp_path: Path) -> None:
    fleet = _fleet()
    with pytest.raises(FleetError) as e:
        _rollout(fleet, tmp_path, missing="vllm-openai")
    assert f"recipe {BF16} (spark-04)" in e.value.cause and "--skip-missing" in (e.value.fix or "")
    assert _serving(fleet) == {n: (A, RECIPES[n]) for n in HOSTS}
    with fleet_ledger.open_ledger(tmp_path) as led:
        assert led.history(5) == [], "a refused rollout records nothing"

    r = _rollout(fleet, tmp_path, missing="vllm-openai", skip_missing=True)
    assert r.status == fleet_records.COMPLETED, r.error
    assert _serving(fleet)["spark-04"] == (A, BF16)
    assert {n: _serving(fleet)[n] for n in ("spark-01", "spark-02", "spark-03")} == {
        n: (B, RECIPES[n]) for n in ("spark-01", "spark-02", "spark-03")}
    row = _record(tmp_path).host("spark-04")
    assert row is not None and row.status == fleet_records.SKIPPED
    assert "no tag v2" in (row.verdict or {}).get("summary", "")


def test_every_image_lacking_the_tag_is_the_registrys_refusal(tmp_path: Path) -> None:
    fleet = _fleet()
    with pytest.raises(FleetError, match="no tag v9"):
        _rollout(fleet, tmp_path, tag="v9", skip_missing=True)


def test_a_model_switch_is_refused_unless_named_then_recorded_as_one(tmp_path: Path) -> None:
    fleet = _fleet()
    with pytest.raises(FleetError) as e:
        _rollout(fleet, tmp_path, recipe=MM, limit="spark-01")
    assert e.value.host == "spark-01"
    assert f"switch: {HERETIC} → {MM}" in e.value.cause and "--switch-model" in (e.value.fix or "")
    assert _serving(fleet)["spark-01"] == (A, HERETIC), "the host untouched"

    r = _rollout(fleet, tmp_path, recipe=MM, limit="spark-01", switch_model=True)
    assert r.status == fleet_records.COMPLETED, r.error
    assert _serving(fleet)["spark-01"] == (B, MM)
    row = _record(tmp_path).host("spark-01")
    assert row is not None and row.switch and (row.before_recipe, row.recipe) == (HERETIC, MM)
    assert _record(tmp_path).options["switches"] == {"spark-01": f"switch: {HERETIC} → {MM}"}
    # a plain rollout never switches it back by accident: the host serves MM, is configured HERETIC
    with pytest.raises(FleetError, match=f"spark-01: switch: {MM} → {HERETIC}"):
        _rollout(fleet, tmp_path, tag=C)
    # --recipe R alone selects R's hosts: the one configured to serve it
    r = _rollout(fleet, tmp_path, tag=C, recipe=MM)
    assert [h.host for h in r.hosts] == ["spark-03"]


def test_rollback_and_abort_put_each_host_back_on_its_own_recipe(tmp_path: Path) -> None:
    fleet = _fleet()
    assert _rollout(fleet, tmp_path, recipe=MM, limit="spark-01",
                    switch_model=True).status == fleet_records.COMPLETED
    eng = _engine(fleet, tmp_path)
    try:
        r = eng.rollback(RollbackOptions(limit="spark-01"))
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED, r.error
    assert _serving(fleet)["spark-01"] == (A, HERETIC)
    assert r.hosts[0].recipe == HERETIC and r.hosts[0].before_recipe == MM

    # the whole fleet forward, then back: each host to its own last known-good, in its own recipe
    assert _rollout(fleet, tmp_path).status == fleet_records.COMPLETED
    eng = _engine(fleet, tmp_path)
    try:
        r = eng.rollback()
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED, r.error
    assert _serving(fleet) == {n: (A, RECIPES[n]) for n in HOSTS}
    assert {h.host: h.recipe for h in r.hosts} == RECIPES
    # each recipe's own floor: one of the two heretic hosts at a time, the others beside them
    rec = _record(tmp_path)
    assert rec.options["per_step"] == {HERETIC: 1, MM: 1, BF16: 1}
    assert {h.host: h.step for h in rec.hosts} == {"spark-01": 0, "spark-02": 1, "spark-03": 0,
                                                   "spark-04": 0}


def test_an_interrupted_switch_is_aborted_back_to_the_model_it_served(tmp_path: Path) -> None:
    fleet = _fleet()
    fleet.hosts["spark-01"].behaviour[digest_of(B)] = SOAKFAIL
    r = _rollout(fleet, tmp_path, recipe=MM, limit="spark-01,spark-02", switch_model=True)
    # the canary's gate failed: it is back on its own model, the other never moved
    assert r.status == fleet_records.FAILED
    assert _serving(fleet)["spark-01"] == (A, HERETIC)
    assert _serving(fleet)["spark-02"] == (A, HERETIC)


def test_a_count_floor_is_each_recipes_and_refused_naming_the_recipe(tmp_path: Path) -> None:
    fleet = _fleet()
    with pytest.raises(FleetError) as e:
        _rollout(fleet, tmp_path, min_available="1")
    assert e.value.cause.startswith(f"recipe {MM} (1 host(s)): --min-available 1 keeps 1"), e.value
    assert _serving(fleet) == {n: (A, RECIPES[n]) for n in HOSTS}
