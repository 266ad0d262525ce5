"""What a lab node's stand-in GPU looks like: the JSON its ``nvidia-smi`` reads, per model and
driver.

The presets hold the figures a real device reports (the H100 ones are those of
the captured fixture), so that a wrong-GPU node answers like a real wrong GPU.
"""

from __future__ import annotations

import json
import platform
from typing import Any

GPU_JSON = "/etc/fleetctl-lab/gpu.json"
PROC_VERSION = "/etc/fleetctl-lab/proc/driver/nvidia/version"
DEFAULT_GPU = "NVIDIA GB10"
DEFAULT_DRIVER = "580.95.05"

#: Model name -> what its nvidia-smi reports (besides name/driver/cuda).
PRESETS: dict[str, dict[str, Any]] = {
    "NVIDIA GB10": {
        # Unified memory: a real Spark reads [N/A] for every memory field.
        "memory_total_mib": None,
        "memory_reserved_mib": 0,
        "memory_used_mib": 0,
        "compute_cap": "12.1",
        "architecture": "Blackwell",
        "bus_id": "0000000F:01:00.0",
        "uuid": "GPU-a5c1e0b2-6d3e-4c7e-9f4b-2e51c0d3b7a1",
        "serial": "1652924019823",
        "temperature": 42,
        "power_draw_w": 11.05,
        "power_limit_w": None,
        "display_active": "On",
        "ecc": None,
    },
    "NVIDIA H100 80GB HBM3": {
        "memory_total_mib": 81559,
        "memory_reserved_mib": 480,
        "memory_used_mib": 0,
        "compute_cap": "9.0",
        "architecture": "Hopper",
        "bus_id": "00000000:00:06.0",
        "uuid": "GPU-8e4070fd-0516-b568-1a07-e5d1c1857110",
        "serial": "1752524018036",
        "temperature": 31,
        "power_draw_w": 93,
        "power_limit_w": 700,
        "display_active": "Off",
        "ecc": "0",
    },
    "NVIDIA A100-SXM4-80GB": {
        "memory_total_mib": 81920,
        "memory_reserved_mib": 527,
        "memory_used_mib": 0,
        "compute_cap": "8.0",
        "architecture": "Ampere",
        "bus_id": "00000000:07:00.0",
        "uuid": "GPU-3b1f9c52-8a0d-4e1c-b6a7-0d2c9e4f5a61",
        "serial": "1321020012345",
        "temperature": 33,
        "power_draw_w": 62,
        "power_limit_w": 400,
        "display_active": "Off",
        "ecc": "0",
    },
}


def cuda_for(driver: str) -> str:
    """The CUDA version a driver branch reports (``CUDA Version`` in nvidia-smi)."""
    try:
        major = int(driver.split(".")[0])
    except ValueError:
        return "13.0"
    for floor, cuda in ((580, "13.0"), (575, "12.9"), (570, "12.8"), (560, "12.6"), (555, "12.5"),
                        (550, "12.4"), (545, "12.3"), (535, "12.2"), (530, "12.1"), (525, "12.0")):
        if major >= floor:
            return cuda
    return "11.8"


def config(gpu: str = DEFAULT_GPU, driver: str = DEFAULT_DRIVER) -> dict[str, Any]:
    """The gpu.json of a node with ``gpu`` and ``driver`` (an unknown model gets GB10 figures)."""
    out: dict[str, Any] = {"name": gpu, "driver": driver, "cuda": cuda_for(driver)}
    out.update(PRESETS.get(gpu, PRESETS[DEFAULT_GPU]))
    out["proc_version_path"] = PROC_VERSION
    return out


DEFAULT = config()


def proc_version(driver: str) -> str:
    """The text of ``/proc/driver/nvidia/version`` for ``driver`` (format of the real file)."""
    return (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for {platform.machine()}  {driver}  "
        "Release Build  (dvs-builder@U22-I3-AE18-23-3)  \nGCC version:  gcc version 13.3.0 (Ubuntu "
        "13.3.0-6ubuntu2~24.04) \n"
    )


def files(cfg: dict[str, Any]) -> dict[str, str]:
    """Absolute path -> content of every file on a node that describes its GPU."""
    return {
        GPU_JSON: json.dumps(cfg, indent=2) + "\n",
        PROC_VERSION: proc_version(str(cfg["driver"])),
    }
