"""The stand-in nvidia-smi answers exactly like real output captured on a 580-driver H100 host.

The stand-in is run as a program here (config path in $FLEETCTL_LAB_GPU_JSON),
with the GPU description the lab gives a wrong-GPU node, and compared with the
fixtures section by section; the first line of the table (a clock) is masked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from fleetctl.lab import gpus

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
SCRIPT = Path(str(resources.files("fleetctl.lab") / "assets" / "node" / "nvidia-smi"))
H100 = "NVIDIA H100 80GB HBM3"


def _sections() -> list[str]:
    text = (FIXTURES / "h100-driver-580.159.04.txt").read_text()
    return text.split("===\n")


def run(cfg: dict[str, object], tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "FLEETCTL_LAB_GPU_JSON": str(path)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def h100() -> dict[str, object]:
    return gpus.config(H100, "580.159.04")


def _mask_clock(text: str) -> str:
    return re.sub(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", "CLOCK", text, flags=re.M)


def test_table_matches_fixture(h100: dict[str, object], tmp_path: Path) -> None:
    out = run(h100, tmp_path)
    assert out.returncode == 0
    assert _mask_clock(out.stdout) == _mask_clock(_sections()[0])


@pytest.mark.parametrize(
    ("section", "args"),
    [
        (1, ["-L"]),
        (
            2,
            [
                "--query-gpu=name,driver_version,memory.total,memory.used,compute_cap,pci.bus_id,uuid",
                "--format=csv",
            ],
        ),
        (
            3,
            [
                "--query-gpu=name,driver_version,memory.total,compute_cap",
                "--format=csv,noheader,nounits",
            ],
        ),
        (4, ["--query-gpu=name,driver_version", "--format=csv,noheader"]),
        (6, ["--version"]),
    ],
)
def test_queries_match_fixture(
    h100: dict[str, object], tmp_path: Path, section: int, args: list[str]
) -> None:
    out = run(h100, tmp_path, *args)
    assert out.returncode == 0, out.stderr
    assert out.stdout == _sections()[section]


def test_bad_field_is_refused_with_exit_code_2(h100: dict[str, object], tmp_path: Path) -> None:
    out = run(h100, tmp_path, "--query-gpu=bogus_field", "--format=csv")
    expected = _sections()[8].split("rc=")
    assert out.stdout == expected[0]
    assert out.returncode == int(expected[1]) == 2


def test_full_query_matches_fixture(h100: dict[str, object], tmp_path: Path) -> None:
    out = run(h100, tmp_path, "-q")
    fixture = (FIXTURES / "h100-driver-580.159.04-q.txt").read_text()
    mask = re.compile(r"^(Timestamp\s+: ).*$", re.M)
    assert mask.sub(r"\1T", out.stdout) == mask.sub(r"\1T", fixture)


def test_proc_version_has_the_real_layout() -> None:
    real = _sections()[5].splitlines()
    ours = gpus.proc_version("580.159.04").splitlines()
    assert len(ours) == len(real) == 2
    assert (
        ours[0].startswith("NVRM version: NVIDIA UNIX Open Kernel Module for ")
        and "  580.159.04  Release Build  (" in ours[0]
    )
    assert ours[1].startswith("GCC version:  gcc version ")


def test_gb10_defaults_read_like_a_spark(tmp_path: Path) -> None:
    out = run(
        gpus.DEFAULT,
        tmp_path,
        "--query-gpu=name,driver_version,memory.total,memory.used,compute_cap",
        "--format=csv,noheader",
    )
    assert out.stdout == "NVIDIA GB10, 580.95.05, [N/A], [N/A], 12.1\n"
    table = run(gpus.DEFAULT, tmp_path).stdout.splitlines()
    assert (
        table[2]
        == "| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0  "
           "   |"
    )
    assert "| Not Supported          |" in table[9]
    # Every line of the table keeps the real width.
    assert {len(line) for line in table[1:] if line} == {91}
    nounits = run(gpus.DEFAULT, tmp_path, "--query-gpu=memory.total", "--format=csv,nounits").stdout
    assert nounits == "memory.total [MiB]\n[N/A]\n"


def test_old_driver_reports_its_cuda(tmp_path: Path) -> None:
    out = run(gpus.config(gpus.DEFAULT_GPU, "535.183.01"), tmp_path, "--version")
    assert out.stdout.splitlines() == [
        "NVIDIA-SMI version  : 535.183.01", "NVML version        : 535.183",
        "DRIVER version      : 535.183.01", "CUDA Version        : 12.2",
    ]


def test_usage_errors(h100: dict[str, object], tmp_path: Path) -> None:
    assert run(h100, tmp_path, "--query-gpu=name").returncode == 2  # no --format
    assert run(h100, tmp_path, "--query-gpu=name", "--format=json").returncode == 2
    assert run(h100, tmp_path, "--frobnicate").returncode == 2
    no_driver = {**h100, "driver": ""}
    out = run(no_driver, tmp_path, "-L")
    assert out.returncode == 9 and "couldn't communicate with the NVIDIA driver" in out.stdout
