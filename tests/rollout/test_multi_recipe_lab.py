"""A lab fleet serving three models, rolled forward by tag: each host stays on its own model.

The lab's inventory gives spark-02 another recipe of the fleet's image and spark-03 a recipe of the
stock vLLM image, in Ansible's usual way (``host_vars/<host>/recipe.yml: fleetctl_recipe: ...``);
spark-01 and spark-04 keep the fleet's. Each outcome is checked on the hosts themselves: the model
names the server answers on ``/v1/models`` and the image its container runs. The module puts the
inventory and the hosts back as they were (the fleet's recipe, at the base version) at its end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, registry, ssh
from fleetctl import lab as fleetlab
from fleetctl.container import Container
from fleetctl.lab import layout
from fleetctl.lab.scenarios import STOCK_REPOSITORY
from fleetctl.recipes import load_recipes
from fleetctl.rollout import host as remote
from tests.plugins.serving import BASE_TAG

pytestmark = pytest.mark.lab

FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
HERETIC, MM, BF16 = "qwen36-35b-heretic", "qwen36-27b-mm", "qwen35-35b-bf16"
OWN = {"spark-01": HERETIC, "spark-02": MM, "spark-03": BF16, "spark-04": HERETIC}
NEW = "v0.24.0"
SOAK = "3s"


def fleetctl(*argv: str) -> tuple[int, Any]:
    r = subprocess.run([FLEETCTL, *argv, "--json"], capture_output=True, text=True, timeout=900,
                       env=os.environ, check=False)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, {"stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]}


def _recipe_files() -> dict[str, Path]:
    root = layout.current().inventory.parent / "host_vars"
    return {n: root / n / "recipe.yml" for n, r in OWN.items() if r != HERETIC}


@pytest.fixture(scope="module")
def three_recipes(serving: Any) -> Iterator[None]:
    """spark-02 and spark-03 configured for their own recipes, their weights staged, the stock
    image's versions pushed, and every host serving its own recipe at the base version."""
    del serving
    files = _recipe_files()
    made = [f.parent for f in files.values() if not f.parent.exists()]
    try:
        for tag, version in ((BASE_TAG, "0.23.0"), (NEW, "0.24.0")):
            fleetlab.add_image(tag, {"EMU_VERSION": version, "EMU_LOAD_SECONDS": "3"},
                               repository=STOCK_REPOSITORY, cmd=["vllm", "serve"])
        for name, f in files.items():
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(f"fleetctl_recipe: {OWN[name]}\n")
            code, doc = fleetctl("stage", "--recipe", OWN[name], "--limit", name)
            assert code == 0, doc
        # Serving the fleet's recipe until now, the two hosts switch to their own: named.
        code, doc = fleetctl("rollout", "--tag", BASE_TAG, "--switch-model", "--soak", SOAK,
                             "--yes")
        assert code == 0, doc
        yield
    finally:
        for f in files.values():
            f.unlink(missing_ok=True)
        for d in made:
            d.rmdir()
        # every host back on the fleet's recipe at the base version, whatever a test left
        code, doc = fleetctl("rollback", "--to", BASE_TAG, "--max-unavailable", "100%", "--yes")
        ssh.close_all()
        assert code == 0, doc


def _models(h: Any, port: int) -> list[str]:
    with urllib.request.urlopen(f"http://{h.address}:{port}/v1/models", timeout=30) as r:
        return [m["id"] for m in json.load(r)["data"]]


def _assert_serves(name: str, recipe_name: str, tag: str) -> Container:
    """``name`` serves ``recipe_name``'s models from its image's ``tag``, as the host answers."""
    inv = inventory.load(None)
    h = inv.host(name)
    recipe = load_recipes(inv)[recipe_name]
    mirrors = inv.vars.get("fleetctl_registry_mirrors")
    img = registry.resolve(recipe.image, tag, mirrors)
    c = remote.inspect(h, remote.container_name(h))
    assert c is not None and c.running, (name, c)
    assert (c.digest, c.recipe) == (img.digest, recipe_name), (name, c.digest, c.recipe, img)
    assert _models(h, recipe.port)[0] == recipe.served_model_names[0], name
    return c


def test_a_rollout_by_tag_keeps_every_host_on_its_own_model(three_recipes: None) -> None:
    del three_recipes
    code, doc = fleetctl("rollout", "--tag", NEW, "--soak", SOAK, "--yes")
    assert code == 0, doc
    rows = {h["host"]: h for h in doc["hosts"]}
    assert {n: (r["status"], r["recipe"], r["before_recipe"]) for n, r in rows.items()} == {
        n: ("done", OWN[n], OWN[n]) for n in OWN}, rows
    for name, recipe_name in OWN.items():
        _assert_serves(name, recipe_name, NEW)
    # one canary per recipe, in the first wave; the fleet's second host after them
    code, hist = fleetctl("history", doc["id"])
    assert code == 0, hist
    waves = {h["host"]: h["wave"] for h in hist[0]["hosts"]}
    assert sorted(n for n, w in waves.items() if w == 1) == ["spark-01", "spark-02", "spark-03"]
    assert waves["spark-04"] == 2


def test_a_model_switch_is_refused_under_yes_and_recorded_when_named(three_recipes: None) -> None:
    del three_recipes
    before = _assert_serves("spark-02", MM, NEW)
    code, doc = fleetctl("rollout", "--tag", NEW, "--recipe", HERETIC, "--limit", "spark-02",
                         "--soak", SOAK, "--yes")
    assert code == 2, doc
    assert f"spark-02: switch: {MM} → {HERETIC}" in doc["error"]["cause"], doc
    assert "--switch-model" in doc["error"]["fix"], doc
    assert _assert_serves("spark-02", MM, NEW).id == before.id, "the host untouched"

    code, doc = fleetctl("rollout", "--tag", NEW, "--recipe", HERETIC, "--limit", "spark-02",
                         "--soak", SOAK, "--switch-model", "--yes")
    assert code == 0, doc
    _assert_serves("spark-02", HERETIC, NEW)
    code, hist = fleetctl("history", doc["id"])
    assert code == 0, hist
    row = hist[0]["hosts"][0]
    assert (row["host"], row["recipe"], row["before_recipe"], row["switch"]) == (
        "spark-02", HERETIC, MM, True), row
