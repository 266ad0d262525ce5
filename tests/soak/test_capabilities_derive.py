"""What the gate tests, derived from the seed recipes' own flags (inventory/lab), and the recipe's
``modalities``, ``soak.capabilities`` and ``soak.sampling`` refused with their field and fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from fleetctl import paths
from fleetctl.recipes import parse_recipes
from fleetctl.recipes.recipe import Recipe
from fleetctl.soak import SoakConfigError, from_recipe
from fleetctl.soak.capabilities import NOT_SERVED, OFF_BY_RECIPE, TESTED, derive, rows

SEED_FILE = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"


def seed(name: str, **soak: Any) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(
        yaml.safe_load(SEED_FILE.read_text())["fleetctl_recipes"][name])
    if soak:
        body["soak"] = soak
    return body


def build(body: dict[str, Any], name: str = "r") -> Recipe:
    return parse_recipes({name: body}, "test")[name]


def problems(body: dict[str, Any]) -> list[str]:
    from fleetctl.recipes import RecipeValidationError

    with pytest.raises(RecipeValidationError) as e:
        parse_recipes({"r": body}, "test")
    return [p.line() for p in e.value.problems]


def test_the_heretic_recipe_serves_every_capability() -> None:
    plan = derive(build(seed("qwen36-35b-heretic",
                             sampling={"qwen36-deep": {"temperature": 0.7}})))
    status = {c.name: c.status for c in plan.capabilities}
    assert status == dict.fromkeys(status, TESTED)
    assert plan.get("tool_calls").params == {"parser": "qwen3_coder"}
    assert "--enable-auto-tool-choice" in plan.get("tool_calls").source
    assert plan.get("reasoning").params == {"parser": "qwen3"}
    assert plan.get("images").source == "modalities: image"
    assert plan.get("served_names").params["names"] == [
        "qwen36-35b-heretic", "qwen36-fast", "qwen36-deep"]
    assert plan.get("sampling").params["aliases"] == {"qwen36-deep": {"temperature": 0.7}}
    assert plan.get("spec_tiers").params["method"] == "dflash"
    assert plan.get("prefix_cache").source == "--enable-prefix-caching"


def test_the_27b_body_is_multimodal_by_its_mm_flag() -> None:
    plan = derive(build(seed("qwen36-27b-mm")))
    assert plan.get("images").tested
    assert "--mm-encoder-tp-mode" in plan.get("images").source


def test_a_text_only_recipe_is_not_probed_for_what_it_does_not_serve() -> None:
    plan = derive(build(seed("qwen35-35b-bf16")))
    assert plan.get("sampling").status == NOT_SERVED
    assert {c.name for c in plan.tested()} == {"served_names", "prefix_cache"}
    assert plan.get("prefix_cache").source == "vLLM's default (prefix caching on)"
    for c in plan.capabilities:
        if not c.tested:
            assert c.source, c


def test_a_parser_without_auto_tool_choice_is_not_a_tool_call_probe() -> None:
    body = seed("qwen36-35b-heretic")
    body["vllm_args"] = [a for a in body["vllm_args"] if a != "--enable-auto-tool-choice"]
    tool = derive(build(body)).get("tool_calls")
    assert tool.status == NOT_SERVED and "without --enable-auto-tool-choice" in tool.source


@pytest.mark.parametrize("flags, served", [
    (["--language-model-only"], False),
    (["--limit-mm-per-prompt", '{"image": 0}'], False),
    (["--limit-mm-per-prompt", '{"image": 2, "video": 0}'], True),
])
def test_image_flags(flags: list[str], served: bool) -> None:
    body = seed("qwen35-35b-bf16")
    body["vllm_args"] = [*body["vllm_args"], *flags]
    assert derive(build(body)).get("images").tested is served


def test_a_vision_config_makes_a_body_multimodal() -> None:
    recipe = build(seed("qwen35-35b-bf16"))
    assert not derive(recipe).get("images").tested
    plan = derive(recipe, body_config={"vision_config": {"depth": 27}})
    assert plan.get("images").tested and "vision_config" in plan.get("images").source


def test_a_recipe_turns_a_probe_off_and_reports_say_so() -> None:
    recipe = build(seed("qwen36-35b-heretic", capabilities={"images": False}))
    plan = derive(recipe)
    images = plan.get("images")
    assert images.status == OFF_BY_RECIPE and not images.tested
    assert images.source.startswith("soak.capabilities.images: false; modalities: image")
    row = next(r for r in rows(plan) if r["capability"] == "images")
    assert row["status"] == "off by recipe"
    assert from_recipe(recipe).capabilities == {"images": False}


def test_a_recipe_turns_on_what_its_flags_cannot_show() -> None:
    body = seed("qwen35-35b-bf16", capabilities={"images": True})
    assert derive(build(body)).get("images").status == TESTED


@pytest.mark.parametrize("soak, field, words", [
    ({"capabilities": {"imagez": False}}, "soak.capabilities.imagez", "not a capability"),
    ({"capabilities": {"images": "no"}}, "soak.capabilities.images", "not true or false"),
    ({"capabilities": ["images"]}, "soak.capabilities", "not a mapping"),
    ({"sampling": {"qwen36-slow": {"temperature": 0.7}}}, "soak.sampling.qwen36-slow",
     "not one of the recipe's served_model_names"),
    ({"sampling": {"qwen36-deep": {"temperature": 7}}}, "soak.sampling.qwen36-deep.temperature",
     "not a number from 0 to 2"),
    ({"sampling": {"qwen36-deep": {"temp": 0.7}}}, "soak.sampling.qwen36-deep.temp",
     "not a sampling parameter"),
    ({"sampling": {"qwen36-deep": 0.7}}, "soak.sampling.qwen36-deep", "not a mapping"),
])
def test_bad_settings_are_refused_naming_the_field(soak: dict[str, Any], field: str,
                                                   words: str) -> None:
    lines = problems(seed("qwen36-35b-heretic", **soak))
    assert any(f"{field}:" in ln and words in ln and "(fix: " in ln for ln in lines), lines


def test_bad_modalities_are_refused() -> None:
    body = seed("qwen36-35b-heretic")
    body["modalities"] = ["text", "pictures"]
    (line,) = problems(body)
    assert "modalities" in line and "image" in line


def test_the_soak_config_refuses_the_same_settings() -> None:
    recipe = build(seed("qwen36-35b-heretic"))
    bad = Recipe(**{**recipe.__dict__, "soak": {"sampling": {"nobody": {"temperature": 1}}}})
    with pytest.raises(SoakConfigError) as e:
        from_recipe(bad)
    assert "recipe r: soak.sampling.nobody" in e.value.message() and e.value.fix
    good = Recipe(**{**recipe.__dict__,
                     "soak": {"sampling": {"qwen36-deep": {"temperature": 0.7, "top_p": 0.95}}}})
    assert from_recipe(good).sampling == {"qwen36-deep": {"temperature": 0.7, "top_p": 0.95}}


def test_the_probes_requests_are_counted_in_the_hard_deadline() -> None:
    from fleetctl.soak.capabilities import images, tools

    recipe = build(seed("qwen36-35b-heretic"))
    plan = derive(recipe)
    assert plan.get("tool_calls").requests == len(tools.SCENARIOS) + 1
    assert plan.get("images").requests == len(images.DRAWINGS)
    assert plan.get("served_names").requests == 3
    cfg = from_recipe(recipe, profile="lab")
    total, how = cfg.hard_deadline()
    assert f"capabilities {(3 + 4 + 2 + 3) * cfg.request_timeout:.0f}s" in how
    off = from_recipe(build(seed("qwen36-35b-heretic", capabilities={"images": False})),
                      profile="lab")
    assert off.hard_deadline()[0] == total - 3 * cfg.request_timeout
