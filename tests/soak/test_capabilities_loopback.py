"""``fleetctl soak --endpoint URL --recipe qwen36-35b-heretic`` against the emulator serving the
recipe's own tool parser, reasoning parser and images: healthy it passes every capability; each
regression's knob fails the gate for its own cause, the others passing."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetctl import paths
from fleetctl.cli.main import main

from .conftest import Served

RECIPE = "qwen36-35b-heretic"
NAMES = ("qwen36-35b-heretic", "qwen36-fast", "qwen36-deep")
#: The recipe's serving flags the emulator models (verbatim from inventory/lab).
FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
         "--reasoning-parser", "qwen3", "--enable-prefix-caching")
CAPABILITIES = ("served_names", "tool_calls", "reasoning", "images")


@pytest.fixture
def inventory_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "inventory"
    shutil.copytree(paths.project_root() / "inventory" / "lab", inv)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    spark-01: {ansible_host: 10.0.0.1}\n")
    return inv


def soak(served: Served, inv: Path, out: Path) -> tuple[int, dict[str, Any]]:
    code = main(["-i", str(inv / "hosts.yml"), "soak", "--endpoint", served.target.base_url,
                 "--recipe", RECIPE, "--profile", "lab", "--concurrency", "1", "--duration",
                 "4s", "--json-report", str(out / "soak.json"), "--junit", str(out / "soak.xml"),
                 "--html", str(out / "soak.html")])
    (v,) = json.loads((out / "soak.json").read_text())["verdicts"]
    return code, v


def checks(v: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in v["checks"]}


def test_a_healthy_server_passes_every_capability(emulator: Callable[..., Served],
                                                  inventory_dir: Path, tmp_path: Path) -> None:
    served = emulator(EMU_SPEED="8", names=NAMES, flags=FLAGS)
    code, v = soak(served, inventory_dir, tmp_path)
    got = checks(v)
    assert {n: got[n]["outcome"] for n in CAPABILITIES} == dict.fromkeys(CAPABILITIES, "pass"), \
        {n: got[n]["message"] for n in CAPABILITIES}
    assert code == 0, v["summary"]
    assert "qwen3_coder" in got["tool_calls"]["message"]
    # Each report has a row per capability.
    suite = ET.parse(tmp_path / "soak.xml").getroot()
    cases = {c.get("name") for c in suite.iter("testcase")}
    assert set(CAPABILITIES) <= cases
    html = (tmp_path / "soak.html").read_text()
    assert all(n in html for n in CAPABILITIES)


@pytest.mark.parametrize("knob, failed, words", [
    ("EMU_IMAGE_GARBAGE", "images", "garbage"),
    ("EMU_TOOL_CALL_LEAK", "tool_calls", "<tool_call> markup in content"),
    ("EMU_REASONING_LEAK", "reasoning", "<think> in content"),
])
def test_each_regression_fails_for_its_own_cause(emulator: Callable[..., Served],
                                                 inventory_dir: Path, tmp_path: Path,
                                                 knob: str, failed: str, words: str) -> None:
    served = emulator(EMU_SPEED="8", names=NAMES, flags=FLAGS, **{knob: "1"})
    code, v = soak(served, inventory_dir, tmp_path)
    got = checks(v)
    assert code == 1 and v["outcome"] == "fail"
    assert got[failed]["outcome"] == "fail" and words in got[failed]["message"], got[failed]
    others = [n for n in CAPABILITIES if n != failed]
    assert {n: got[n]["outcome"] for n in others} == dict.fromkeys(others, "pass"), \
        {n: got[n]["message"] for n in others}


def test_a_capability_off_by_recipe_is_shown_so_in_every_report(
        emulator: Callable[..., Served], inventory_dir: Path, tmp_path: Path) -> None:
    import yaml

    path = inventory_dir / "group_vars" / "all" / "recipes.yml"
    data = yaml.safe_load(path.read_text())
    data["fleetctl_recipes"][RECIPE]["soak"] = {"capabilities": {"images": False}}
    path.write_text(yaml.safe_dump(data))
    # The server's images are broken, and the recipe said not to probe them.
    served = emulator(EMU_SPEED="8", names=NAMES, flags=FLAGS, EMU_IMAGE_GARBAGE="1")
    code, v = soak(served, inventory_dir, tmp_path)
    images = checks(v)["images"]
    assert images["outcome"] == "skipped" and images["message"].startswith(
        "off by recipe: soak.capabilities.images: false"), images
    assert code == 0, v["summary"]
    assert "off by recipe" in (tmp_path / "soak.html").read_text()
    assert "off by recipe" in (tmp_path / "soak.xml").read_text()
