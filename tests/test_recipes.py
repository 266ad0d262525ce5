"""Recipes: every seed recipe loads and validates; each broken rule gives its own message."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl import inventory, paths, recipes
from fleetctl.errors import RecipeError
from fleetctl.recipes import RecipeValidationError, parse_recipes

SEED_FILE = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"


def seed_raw() -> dict[str, Any]:
    data = yaml.safe_load(SEED_FILE.read_text())
    assert isinstance(data, dict)
    return data


def heretic() -> dict[str, Any]:
    return copy.deepcopy(seed_raw()["fleetctl_recipes"]["qwen36-35b-heretic"])


def problems_of(body: dict[str, Any], name: str = "r") -> list[recipes.RecipeProblem]:
    with pytest.raises(RecipeValidationError) as e:
        parse_recipes({name: body})
    return list(e.value.problems)


def set_flag(args: list[str], flag: str, value: str | None) -> list[str]:
    """Replace (or with None, drop) a flag and its value in an argv list."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == flag:
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(a)
    if value is not None:
        out += [flag, value]
    return out


def test_every_seed_recipe_loads_and_validates() -> None:
    rs = parse_recipes(seed_raw()["fleetctl_recipes"])
    assert set(rs) == {"qwen36-35b-heretic", "qwen36-27b-mm", "gemma4-26b-a4b", "qwen35-35b-bf16",
                       "qwen35-35b-bf16-pair"}
    assert seed_raw()["fleetctl_recipe"] in rs
    for r in rs.values():
        assert r.body.path.startswith("/opt/")
        assert ":" not in r.image.rsplit("/", 1)[-1]
        assert r.serve_argv()[:2] == ["serve", r.body.mount]


def test_seed_flags_are_verbatim_from_the_compose() -> None:
    r = parse_recipes(seed_raw()["fleetctl_recipes"])["qwen36-35b-heretic"]
    argv = r.serve_argv()
    assert argv[:6] == [
        "serve",
        "/models/qwen36",
        "--served-model-name",
        "qwen36-35b-heretic",
        "qwen36-fast",
        "qwen36-deep",
    ]
    assert r.flag("--gpu-memory-utilization") == "0.70"
    assert r.flag("--max-num-seqs") == "64"
    assert r.flag("--quantization") == "compressed-tensors"
    assert r.speculative_config() == {
        "method": "dflash",
        "model": "/models/qwen36-dflash",
        "num_speculative_tokens": 11,
    }
    assert argv.count("--port") == 1  # the compose sets it; fleetctl does not add a second one
    assert r.drafter is not None and str(r.drafter.min_date) == "2026-04-19"
    assert r.mounts() == [
        ("/opt/qwen36/qwen36-nvfp4", "/models/qwen36"),
        ("/opt/qwen36/qwen36-dflash", "/models/qwen36-dflash"),
    ]


def test_serve_argv_adds_the_port_when_the_flags_do_not() -> None:
    r = parse_recipes(seed_raw()["fleetctl_recipes"])["qwen35-35b-bf16"]
    assert r.serve_argv()[-2:] == ["--port", "8000"]
    assert r.drafter is None and r.speculative_config() is None


def test_gpu_memory_utilization_above_088_is_refused() -> None:
    body = heretic()
    body["vllm_args"] = set_flag(body["vllm_args"], "--gpu-memory-utilization", "0.95")
    (p,) = problems_of(body)
    assert p.field == "vllm_args --gpu-memory-utilization"
    assert "0.95 is above 0.88" in p.problem and "at most 0.88" in p.fix


@pytest.mark.parametrize("value", ["-0.5", "0"])
def test_gpu_memory_utilization_of_zero_or_less_is_called_so(value: str) -> None:
    body = heretic()
    body["vllm_args"] = set_flag(body["vllm_args"], "--gpu-memory-utilization", value)
    (p,) = problems_of(body)
    assert p.problem == f"{value} is not a fraction above 0" and "above" not in p.fix


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--max-num-batched-tokens"])
def test_dflash_needs_both_scheduler_limits(flag: str) -> None:
    body = heretic()
    body["vllm_args"] = set_flag(body["vllm_args"], flag, None)
    (p,) = problems_of(body)
    assert p.field == f"vllm_args {flag}" and "-512" in p.problem and f"set {flag}" in p.fix


def test_dflash_with_nvfp4_kv_is_refused() -> None:
    body = heretic()
    body["vllm_args"] = [*body["vllm_args"], "--kv-cache-dtype", "nvfp4"]
    (p,) = problems_of(body)
    assert p.field == "vllm_args --kv-cache-dtype" and "No valid attention backend" in p.problem


def test_quantization_must_match_the_checkpoint_format() -> None:
    body = heretic()
    body["vllm_args"] = set_flag(body["vllm_args"], "--quantization", "modelopt")
    (p,) = problems_of(body)
    assert p.field == "vllm_args --quantization"
    assert (
        "compressed-tensors checkpoint" in p.problem
        and "--quantization compressed-tensors" in p.fix
    )


def test_bf16_body_takes_no_quantization() -> None:
    body = copy.deepcopy(seed_raw()["fleetctl_recipes"]["qwen35-35b-bf16"])
    body["vllm_args"] += ["--quantization=modelopt"]
    (p,) = problems_of(body)
    assert "bf16" in p.problem and "remove --quantization" in p.fix


def test_speculative_model_must_be_the_drafter_mount() -> None:
    body = heretic()
    spec = json.dumps({"method": "dflash", "model": "/elsewhere", "num_speculative_tokens": 11})
    body["vllm_args"] = set_flag(body["vllm_args"], "--speculative-config", spec)
    (p,) = problems_of(body)
    assert "/models/qwen36-dflash" in p.fix


def test_all_problems_are_collected_not_only_the_first() -> None:
    body = heretic()
    body["vllm_args"] = set_flag(body["vllm_args"], "--gpu-memory-utilization", "0.9")
    body["vllm_args"] = set_flag(body["vllm_args"], "--max-num-seqs", None)
    body["image"] = "ghcr.io/aeon-7/aeon-vllm-ultimate:latest"
    body["env"]["HF_TOKEN"] = "hf_secret_value"
    body["colour"] = "blue"
    with pytest.raises(RecipeValidationError) as e:
        parse_recipes({"bad": body, "good": heretic()})
    fields = sorted(p.field for p in e.value.problems)
    assert fields == [
        "colour",
        "env.HF_TOKEN",
        "image",
        "vllm_args --gpu-memory-utilization",
        "vllm_args --max-num-seqs",
    ]
    assert all(p.recipe == "bad" for p in e.value.problems)
    msg = e.value.message()
    assert msg.startswith("5 problems") and msg.count("\n  - recipe 'bad'") == 5
    assert "hf_secret_value" not in msg  # a secret put in the wrong place is never echoed


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda b: b.pop("weights"), "weights", "is missing"),
        (lambda b: b.update(port="8000x"), "port", "not a TCP port"),
        (lambda b: b.update(served_model_names=[]), "served_model_names", "non-empty"),
        (lambda b: b["weights"][0].update(path="/srv/model"), "weights[0].path", "under /opt/"),
        (
            lambda b: b["weights"][0].update(format="gguf"),
            "weights[0].format",
            "not a known checkpoint format",
        ),
        (lambda b: b["weights"][1].update(min_date="April"), "weights[1].min_date", "not a date"),
        (lambda b: b["weights"][1].update(role="helper"), "weights[1].role", "not a weight role"),
        (
            lambda b: b["weights"][0].update(repo="no-owner"),
            "weights[0].repo",
            "not a hub repository",
        ),
        (lambda b: b.update(vllm_args=["serve", "/model"]), "vllm_args", "starts with 'serve'"),
        (lambda b: b.update(source="ftp"), "source", "not a weights source"),
    ],
)
def test_schema_errors_name_the_field(mutate: Any, field: str, words: str) -> None:
    body = heretic()
    mutate(body)
    ps = problems_of(body)
    assert any(p.field == field and words in p.problem for p in ps), [p.line() for p in ps]


def test_drafter_without_speculative_config_is_refused() -> None:
    body = heretic()
    body["vllm_args"] = set_flag(body["vllm_args"], "--speculative-config", None)
    (p,) = problems_of(body)
    assert p.field == "weights" and "drafter is staged" in p.problem


def test_lookup_and_default_from_an_inventory(tmp_path: Path) -> None:
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "recipes.yml").write_text(SEED_FILE.read_text())
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    spark-01: {ansible_host: 10.0.0.1}\n"
        "    spark-02: {ansible_host: 10.0.0.2, fleetctl_recipe: gemma4-26b-a4b}\n"
    )
    inv = inventory.load(tmp_path / "hosts.yml")
    rs = recipes.load_recipes(inv)
    assert recipes.default_recipe_name(inv) == "qwen36-35b-heretic"
    assert recipes.recipe_for(inv, host=inv.host("spark-02")).name == "gemma4-26b-a4b"
    with pytest.raises(RecipeError) as e:
        recipes.get_recipe(rs, "llama")
    assert (
        "no recipe 'llama'" in e.value.message()
        and "gemma4-26b-a4b, qwen35-35b-bf16" in e.value.message()
    )


def test_inventory_without_recipes_says_where_to_add_them(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    a: {}\n")
    with pytest.raises(RecipeError) as e:
        recipes.load_recipes(inventory.load(tmp_path / "hosts.yml"))
    assert "recipes.yml" in (e.value.fix or "")


def test_the_example_inventory_loads_with_the_seed_recipes() -> None:
    inv = inventory.load(paths.project_root() / "inventory" / "example" / "hosts.yml")
    assert set(recipes.load_recipes(inv)) == set(seed_raw()["fleetctl_recipes"])
    assert inv.groups["canary"] == ("spark-01",)
    assert recipes.recipe_for(inv, host=inv.host("spark-04")).name == "gemma4-26b-a4b"
    assert recipes.recipe_for(inv, host=inv.host("spark-01")).name == "qwen36-35b-heretic"
    assert "fleetctl_weights_mirror" not in inv.vars  # production default: the hub


@pytest.mark.parametrize(("field", "value", "said"), [
    ("revision", "../../etc", "is not a git revision"),
    ("revision", "main; curl x|sh", "is not a git revision"),
    ("revision", "refs/..", "is not a git revision"),
    ("mount", "/model:rw", "docker mount options"),
    ("mount", "/model,readonly=false", "docker mount options"),
    ("mount", "/a/../etc", "is not an absolute container path"),
    ("path", "/opt/q w/$(id)", "has characters other than"),
])
def test_weight_fields_that_would_inject_are_refused(field: str, value: str, said: str) -> None:
    body = heretic()
    body["weights"][0][field] = value
    found = [p for p in problems_of(body) if p.field == f"weights[0].{field}"]
    assert found and said in found[0].problem, problems_of(body)


@pytest.mark.parametrize(
    "image", ["ghcr.io/Aeon-7/X", "ghcr.io/aeon-7/x y", "ghcr.io//x", "registry:5000/a/$(id)"]
)
def test_an_image_outside_the_oci_grammar_is_refused(image: str) -> None:
    body = heretic()
    body["image"] = image
    assert any(p.field == "image" for p in problems_of(body))


def test_a_commit_sha_and_a_pr_ref_are_revisions() -> None:
    body = heretic()
    body["weights"][0]["revision"] = "0123456789abcdef0123456789abcdef01234567"
    body["weights"][1]["revision"] = "refs/pr/12"
    assert parse_recipes({"r": body})["r"].body.revision.startswith("0123")


def test_trust_remote_code_needs_the_recipes_opt_in() -> None:
    body = heretic()
    assert "--trust-remote-code" in body["vllm_args"] and body["trust_remote_code"] is True
    assert parse_recipes({"r": body})["r"].trust_remote_code
    del body["trust_remote_code"]
    found = [p for p in problems_of(body) if p.field == "vllm_args --trust-remote-code"]
    assert found and "trust_remote_code: true" in found[0].fix
    body["trust_remote_code"] = "yes"
    assert any(p.field == "trust_remote_code" for p in problems_of(body))


@pytest.mark.parametrize("field, value, path", [
    ("served_model_names", ["{{ lookup('pipe', 'touch /tmp/x') }}"], "served_model_names[0]"),
    ("image", "ghcr.io/{% if true %}x{% endif %}", "image"),
])
def test_a_templated_value_is_refused_not_rendered(field: str, value: object, path: str) -> None:
    body = heretic()
    body[field] = value
    found = [p for p in problems_of(body) if p.field == path]
    assert found and "Jinja template" in found[0].problem and "not templates" in found[0].problem


@pytest.mark.parametrize("field", ["size_gb", "min_free_gb"])
@pytest.mark.parametrize("text", [".inf", ".nan", "-.inf", "1e400", "-1", "true", "2000000"])
def test_a_size_that_is_not_a_finite_number_of_gb_is_refused(field: str, text: str) -> None:
    """Issue 32, finding 13: YAML's ``.inf`` passed ``recipes`` and then overflowed in ``stage``
    (exit 70); ``.nan`` passed every comparison."""
    body = heretic()
    value = yaml.safe_load(f"v: {text}")["v"]
    where = "weights[0].size_gb" if field == "size_gb" else field
    (body["weights"][0] if field == "size_gb" else body)[field] = value
    found = [p for p in problems_of(body) if p.field == where]
    assert found and "is not a size in GB (0 to 1000000)" in found[0].problem, problems_of(body)
