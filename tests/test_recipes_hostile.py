"""Issue 32, findings 5 and 6: a recipe cannot slip a template or a refused flag past the checks
in a spelling Ansible or vLLM reads differently from fleetctl.

5. Before: a ``#jinja2:`` header redefining the delimiters (``[[ lookup('pipe','id') ]]`` on the
   next line) passed ``fleetctl recipes`` and Ansible ran it when the role rendered the recipe.
   Now: the guard is ansible-core's own "possibly a template" test, and the header is named.
6. Before: ``--api_key=abc`` and ``--trust_remote_code`` were accepted (the dashed forms refused);
   vLLM reads ``_`` as ``-``. Now: every check reads flags as vLLM's parser does, and an
   abbreviation or dotted key of a checked flag (which vLLM also accepts) is refused.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from fleetctl import paths
from fleetctl.recipes import RecipeProblem, RecipeValidationError, parse_recipes
from fleetctl.recipes.argv import flag_value, has_flag

SEED_FILE = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"
HEADER = "#jinja2:variable_start_string:'[[', variable_end_string:']]'\n"


def heretic() -> dict[str, Any]:
    raw = yaml.safe_load(SEED_FILE.read_text())["fleetctl_recipes"]["qwen36-35b-heretic"]
    return copy.deepcopy(raw)


def problems_of(body: dict[str, Any]) -> list[RecipeProblem]:
    with pytest.raises(RecipeValidationError) as e:
        parse_recipes({"r": body})
    return list(e.value.problems)


def test_ansible_renders_a_header_template_that_has_no_braces() -> None:
    # The premise of finding 5, on the installed ansible-core: what the guard must refuse (values
    # from inventory files are trusted as templates, as a role gets the recipe).
    from ansible.template import Templar, trust_as_template

    assert Templar().template(trust_as_template(HEADER + "[[ 6 * 7 ]]")) == 42


@pytest.mark.parametrize("field, value, path", [
    ("served_model_names", [HEADER + "[[ lookup('pipe', 'id') ]]"], "served_model_names[0]"),
    ("description", HEADER + "[% if true %]x[% endif %]", "description"),
    ("env", {"X": "#jinja2:trim_blocks:False\nplain"}, "env.X"),
])
def test_a_jinja2_header_is_refused_by_name(field: str, value: object, path: str) -> None:
    body = heretic()
    body[field] = value
    found = [p for p in problems_of(body) if p.field == path]
    assert found, problems_of(body)
    assert "#jinja2: header" in found[0].problem and "not templates" in found[0].problem
    assert "put a space before it" in found[0].fix


def test_a_header_not_at_the_start_is_data_as_for_ansible() -> None:
    from ansible.template import Templar, trust_as_template

    body = heretic()
    body["description"] = " " + HEADER + "[[ 6 * 7 ]]"
    assert Templar().template(trust_as_template(body["description"])) == body["description"]
    assert parse_recipes({"r": body})["r"].description == body["description"]


@pytest.mark.parametrize("args, field", [
    (["--api_key=abc"], "vllm_args --api-key"),
    (["--api_key", "abc"], "vllm_args --api-key"),
    (["--trust_remote_code"], "vllm_args --trust-remote-code"),
    (["--trust-remote_code"], "vllm_args --trust-remote-code"),
    (["--gpu_memory_utilization", "0.95"], "vllm_args --gpu-memory-utilization"),
    (["--served_model_name=x"], "vllm_args"),
    (["--quantization=fp8"], "vllm_args --quantization"),
    (["--port=9000"], "vllm_args --port"),
])
def test_underscore_spellings_meet_the_same_checks(args: list[str], field: str) -> None:
    body = heretic()
    del body["trust_remote_code"]
    body["vllm_args"] = [a for a in body["vllm_args"] if a != "--trust-remote-code"] + args
    # --served-model-name is refused on the field "vllm_args" (the schema's check), the others
    # on "vllm_args <flag>" (the rules').
    found = [p for p in problems_of(body)
             if p.field == field and (" " in field or "--served-model-name" in p.problem)]
    assert found, [p.field for p in problems_of(body)]
    assert "abc" not in found[0].problem + found[0].fix


@pytest.mark.parametrize("arg, field, said", [
    ("--trust-remote", "vllm_args --trust-remote-code", "abbreviates --trust-remote-code"),
    ("--api-k=abc", "vllm_args --api-key", "abbreviates --api-key"),
    ("--gpu_memory_util=0.99", "vllm_args --gpu-memory-utilization", "abbreviates"),
    ("--speculative_config.model=/x", "vllm_args --speculative-config", "sets one key of"),
])
def test_abbreviations_and_dotted_keys_of_checked_flags_are_refused(
        arg: str, field: str, said: str) -> None:
    body = heretic()
    body["vllm_args"] = [*body["vllm_args"], arg]
    found = [p for p in problems_of(body) if p.field == field and said in p.problem]
    assert found, [(p.field, p.problem) for p in problems_of(body)]
    assert "abc" not in found[0].problem and "write --" in found[0].fix


def test_argv_reads_flags_as_vllms_parser_does() -> None:
    from fleetctl.recipes.argv import flag_name

    assert flag_name("--api_key=a_b") == "--api-key"
    assert flag_name("--speculative_config.num_spec") == "--speculative-config.num_spec"
    assert flag_name("-tp=2") == "-tp"
    args = ["--max_num_seqs", "64", "--kv_cache_dtype=fp8_e4m3", "--host", "0.0.0.0"]
    assert flag_value(args, "--max-num-seqs") == "64"
    assert flag_value(args, "--kv-cache-dtype") == "fp8_e4m3"
    assert has_flag(args, "--host") and not has_flag(args, "--port")
    assert flag_value(["--model-path", "x"], "--model") is None  # a longer flag is not this one


def test_the_seed_recipes_still_load() -> None:
    raw = yaml.safe_load(SEED_FILE.read_text())["fleetctl_recipes"]
    assert set(parse_recipes(raw)) == set(raw)


# Issue 39, medium 5: served_model_names and docker_args smuggled what vllm_args refuses.


@pytest.mark.parametrize("names", [
    ["probe-model", "--trust-remote-code", "--api-key=sk-INLINE-SECRET"],
    ["probe-model", "--trust_remote", "-tp=4"],
    ["-probe-model"],
])
def test_a_served_name_that_vllm_would_read_as_a_flag_is_refused(names: list[str]) -> None:
    body = heretic()
    body["served_model_names"] = names
    body["trust_remote_code"] = False
    body["vllm_args"] = [a for a in body["vllm_args"] if "trust" not in a]
    assert parse_recipes({"r": {**body, "served_model_names": ["probe-model"]}})
    found = problems_of(body)
    text = "\n".join(f"{p.field}: {p.problem} ({p.fix})" for p in found)
    assert "served_model_names[" in text and "sk-INLINE-SECRET" not in text, text
    if "--trust-remote-code" in names:
        # and the whole serve argv meets the flag checks: both refusals name the smuggled flag
        assert "vllm_args --trust-remote-code" in text and "vllm_args --api-key" in text, text


@pytest.mark.parametrize("args, flag", [
    (["-e", "HF_TOKEN=hf_SECRETSECRET"], "--env"),
    (["--env=HF_TOKEN=hf_SECRETSECRET"], "--env"),
    (["--env-file", "/etc/fleetctl/hf.env"], "--env-file"),
    (["--privileged"], "--privileged"),
    (["--privileged=true"], "--privileged"),
    (["-v", "/:/host"], "--volume"),
    (["-itv/:/host"], "--volume"),
    (["--mount", "type=bind,src=/,dst=/host"], "--mount"),
    (["--cap-add", "SYS_ADMIN"], "--cap-add"),
    (["--security-opt", "seccomp=unconfined"], "--security-opt"),
    (["--pid=host"], "--pid"),
    (["--device", "/dev/mem"], "--device"),
    (["--entrypoint", "sh"], "--entrypoint"),
    (["--network", "bridge"], "--network"),
])
def test_docker_args_cannot_give_the_container_the_host_or_a_secret(
    args: list[str], flag: str
) -> None:
    body = heretic()
    body["docker_args"] = ["--shm-size=16g", *args]
    found = [p for p in problems_of(body) if p.field == f"docker_args {flag}"]
    assert found, problems_of(body)
    assert "SECRETSECRET" not in found[0].problem and "env:" in found[0].fix


def test_resource_docker_args_still_pass() -> None:
    body = heretic()
    body["docker_args"] = ["--shm-size=16g", "--ulimit", "memlock=-1", "--restart", "no",
                           "--ipc=host"]
    assert parse_recipes({"r": body})["r"].docker_args[0] == "--shm-size=16g"
