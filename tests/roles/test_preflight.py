"""The preflight role's facts probe (files/spark_facts.py) and its asserts, on real GPUs' output.

``nvidia-smi`` here is a stand-in that prints, per command, a section of a fixture: real output of
a host of two H200s (driver 580.159.04), and a GB10's as the lab's stand-in answers
(tests/fixtures/gpu/README.md says where each came from). The role's asserts are evaluated by
Ansible's own templating on the facts JSON the probe printed on the real two-GPU host.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from fleetctl import paths
from tests.role_modules import load_role_file

facts_probe = load_role_file("preflight", "files/spark_facts.py")

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpu"
#: Section of each fixture: 0 the table, 1 -L, 2 the long query, 3 GPU_QUERY's, 4 --version.
TABLE, QUERY, VERSION = 0, 3, 4
H200 = {"name": "NVIDIA H200", "driver": "580.159.04", "cuda": "13.0", "compute_cap": "9.0",
        "count": 2}
GB10 = {"name": "NVIDIA GB10", "driver": "580.95.05", "cuda": "13.0", "compute_cap": "12.1",
        "count": 1}


def sections(path: Path) -> list[str]:
    return path.read_text().split("===\n")


def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Path,
             version: bool = True) -> None:
    """An ``nvidia-smi`` on PATH answering from ``path``'s sections (``version=False``: an older
    driver whose ``--version`` names no CUDA version)."""
    for i, text in enumerate(sections(path)):
        (tmp_path / f"s{i}").write_text(text)
    answer = f"cat {tmp_path}/s{VERSION}" if version else "echo NVIDIA-SMI 1"
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in\n'
        f'  --query-gpu=name,driver_version,compute_cap*) cat {tmp_path}/s{QUERY};;\n'
        f'  --version) {answer};;\n'
        f'  "") cat {tmp_path}/s{TABLE};;\n'
        '  *) exit 2;;\n'
        "esac\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(facts_probe, "ERRORS", {})


@pytest.mark.parametrize(("fixture", "want"), [
    (FIXTURES / "nvidia-smi-2xh200.txt", H200),
    (FIXTURES / "nvidia-smi-gb10.txt", GB10),
])
@pytest.mark.parametrize("version", [True, False])
def test_the_gpu_fact_reads_name_driver_cuda_and_compute_capability(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture: Path, want: dict[str, object],
        version: bool) -> None:
    stand_in(tmp_path, monkeypatch, fixture, version=version)
    assert facts_probe.gpu() == want
    assert facts_probe.ERRORS == {}


def test_the_real_two_gpu_hosts_facts_are_what_its_nvidia_smi_printed() -> None:
    facts = json.loads((FIXTURES / "spark_facts-2xh200.json").read_text())
    s = sections(FIXTURES / "nvidia-smi-2xh200.txt")
    assert facts["gpu"] == H200 == facts_probe.parse_gpu(s[QUERY], s[VERSION])[0]
    # the keys the controller and the role read stay as they were
    assert set(facts) == {"gpu", "dgx_release", "kernel", "docker", "toolkit_version", "disk",
                          "uptime_s", "service_mgr", "errors"}


def test_a_gb10_reads_its_unified_memory_as_not_available() -> None:
    # the shapes the GB10 prints where memory is unified with the CPU: nothing the facts use
    s = sections(FIXTURES / "nvidia-smi-gb10.txt")
    assert "NVIDIA GB10, 580.95.05, [N/A], [N/A], 12.1," in s[2]
    assert "Not Supported" in s[TABLE]
    assert facts_probe.parse_gpu(s[QUERY], "", s[TABLE])[0] == GB10


def test_unexpected_nvidia_smi_output_is_an_error_not_a_fact() -> None:
    fact, why = facts_probe.parse_gpu("No devices were found\n")
    assert fact is None and why == "unexpected nvidia-smi output: 'No devices were found'"


def verdicts(facts: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """Each assert of the role's tasks/preflight.yml on ``facts``: (name, passed, fail_msg)."""
    role = paths.roles_dir() / "preflight"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    tasks = yaml.safe_load((role / "tasks" / "preflight.yml").read_text())
    t = Templar(loader=DataLoader(),
                variables={**defaults, "preflight_facts": facts, "preflight_kernel_problem": ""})
    out = []
    for task in tasks:
        a = task["ansible.builtin.assert"]
        that = a["that"] if isinstance(a["that"], list) else [a["that"]]
        ok = all(t.evaluate_conditional(trust_as_template(c)) for c in that)
        msg = "" if ok else str(t.template(trust_as_template(a["fail_msg"])))
        out.append((task["name"], ok, msg))
    return out


def test_preflight_refuses_the_real_h200_host_as_not_a_gb10() -> None:
    facts = json.loads((FIXTURES / "spark_facts-2xh200.json").read_text())
    got = {name: (ok, msg) for name, ok, msg in verdicts(facts)}
    assert got["Check that nvidia-smi answers (the NVIDIA driver is loaded)."] == (True, "")
    assert got["Check that the driver is on a supported branch."] == (True, "")
    ok, msg = got["Check that the GPU is one the images are built for."]
    assert not ok and msg.startswith("the GPU is NVIDIA H200 (compute capability 9.0), not "
                                     "NVIDIA GB10: the images are built for sm_121a (GB10) only")
    # the GPU's refusal comes before any other the host would get (no Docker in that VM)
    first = next(name for name, ok, _ in verdicts(facts) if not ok)
    assert first == "Check that the GPU is one the images are built for."


def test_preflight_passes_a_gb10_on_the_580_branch() -> None:
    facts = json.loads((FIXTURES / "spark_facts-2xh200.json").read_text())
    s = sections(FIXTURES / "nvidia-smi-gb10.txt")
    facts["gpu"] = facts_probe.parse_gpu(s[QUERY], s[VERSION])[0]
    facts["docker"] = {"version": "28.3.3", "running": True}
    assert [(name, ok) for name, ok, _ in verdicts(facts) if not ok] == []
