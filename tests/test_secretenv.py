"""Secret values of recipes (environment or 0600 file), the --api-key refusal and the security
warnings."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl import paths, secretenv
from fleetctl.errors import FleetError
from fleetctl.recipes import RecipeValidationError, parse_recipes

SEED_FILE = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"


def heretic() -> dict[str, Any]:
    data = yaml.safe_load(SEED_FILE.read_text())
    return copy.deepcopy(data["fleetctl_recipes"]["qwen36-35b-heretic"])


def test_value_from_the_environment_first_then_from_a_private_file(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("from-file-key\n")
    f.chmod(0o600)
    assert (
        secretenv.lookup("VLLM_API_KEY", {"VLLM_API_KEY": "env-key", "VLLM_API_KEY_FILE": str(f)})
        == "env-key"
    )
    assert secretenv.lookup("VLLM_API_KEY", {"VLLM_API_KEY_FILE": str(f)}) == "from-file-key"
    assert secretenv.lookup("VLLM_API_KEY", {}) is None
    assert secretenv.resolve(["A", "B"], {"A": "x"}) == {"A": "x"}


@pytest.mark.parametrize("content, mode, why", [
    ("k\n", 0o644, "readable by other users"),
    ("", 0o600, "exactly one line"),
    ("a\nb\n", 0o600, "exactly one line"),
])
def test_a_secret_file_others_can_read_or_that_is_not_one_line_is_refused(
    tmp_path: Path, content: str, mode: int, why: str
) -> None:
    f = tmp_path / "key"
    f.write_text(content)
    f.chmod(mode)
    with pytest.raises(FleetError) as e:
        secretenv.lookup("VLLM_API_KEY", {"VLLM_API_KEY_FILE": str(f)})
    assert why in e.value.cause and e.value.fix


def test_a_missing_secret_file_names_the_variable_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FleetError) as e:
        secretenv.lookup("VLLM_API_KEY", {"VLLM_API_KEY_FILE": str(tmp_path / "absent")})
    assert "$VLLM_API_KEY_FILE" in e.value.cause and "VLLM_API_KEY" in (e.value.fix or "")


def test_a_recipe_that_requires_the_api_key_is_refused_without_one() -> None:
    assert secretenv.api_key(["HF_TOKEN"], {}) is None
    assert secretenv.api_key(["VLLM_API_KEY"], {"VLLM_API_KEY": "k1234"}) == "k1234"
    with pytest.raises(FleetError) as e:
        secretenv.api_key(["VLLM_API_KEY"], {}, recipe="r")
    assert "recipe 'r' requires VLLM_API_KEY" in e.value.cause and "VLLM_API_KEY_FILE" in (
        e.value.fix or ""
    )


def test_the_hub_token_is_never_a_container_secret() -> None:
    assert secretenv.container_secrets(["HF_TOKEN", "VLLM_API_KEY", "X"]) == ("VLLM_API_KEY", "X")


@pytest.mark.parametrize("flag", [["--api-key", "sk-in-argv"], ["--api-key=sk-in-argv"]])
def test_api_key_in_flags_is_refused_with_the_secret_env_fix(flag: list[str]) -> None:
    body = heretic()
    body["vllm_args"] = [*body["vllm_args"], *flag]
    with pytest.raises(RecipeValidationError) as e:
        parse_recipes({"r": body})
    (p,) = [p for p in e.value.problems if "--api-key" in p.field]
    assert "ps" in p.problem and "docker inspect" in p.problem
    assert "secret_env" in p.fix and "VLLM_API_KEY" in p.fix
    # the refusal never repeats the key itself
    assert "sk-in-argv" not in str(e.value)


def test_warnings_for_the_hub_token_in_a_container_and_an_open_api() -> None:
    body = heretic()
    body["secret_env"] = ["HF_TOKEN"]
    (r,) = parse_recipes({"r": body}).values()
    assert any("HF_TOKEN" in w and "remove it from secret_env" in w for w in r.warnings)
    assert any("without a key" in w for w in r.warnings)
    body["secret_env"] = ["VLLM_API_KEY"]
    (r,) = parse_recipes({"r": body}).values()
    assert r.warnings == ()
    # bound to one interface's address instead of all of them: no open-API warning either
    body["secret_env"] = []
    args = body["vllm_args"]
    args[args.index("--host") + 1] = "10.0.0.11"
    (r,) = parse_recipes({"r": body}).values()
    assert r.warnings == ()
