"""The lab's vLLM image tags: which repository, which EMU_* knobs, and named scenario presets.

``lab up`` pushes :data:`HISTORY` (the images' release history replayed by the emulator);
tests add scenario tags with ``add_image(tag, settings=scenario_env("decay"))`` or any
knobs (``knob_env({"crash_at_concurrency": 8})``). :func:`install_emulator` puts the
emulator and its ``vllm`` command into an image root filesystem.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.errors import FleetError
from fleetctl.lab.emulator.knobs import ENV_NAMES, from_env

AEON_REPOSITORY = "aeon-7/aeon-vllm-ultimate"
STOCK_REPOSITORY = "vllm/vllm-openai"
#: Where the emulator package lives inside an image, and its import name there.
IMAGE_PREFIX = "/opt/fleetctl-emulator"
IMAGE_PACKAGE = "vllm_emulator"
#: Lab images load in seconds, not the real 3-5 minutes, so that tests stay short.
LAB_LOAD_SECONDS = "3"
#: A cold start compiles for 3 s more, a warm one (the canary's cache, same key) 0.3 s: on a Spark
#: the compile dominates the load after the weights (docs/warm-start.md). Only with a cache dir
#: mounted.
LAB_COMPILE_SECONDS, LAB_WARM_COMPILE_SECONDS = "3", "0.3"
_LOAD = {"EMU_LOAD_SECONDS": LAB_LOAD_SECONDS, "EMU_COMPILE_SECONDS": LAB_COMPILE_SECONDS,
         "EMU_WARM_COMPILE_SECONDS": LAB_WARM_COMPILE_SECONDS}


@dataclass(frozen=True)
class ImageTag:
    """One image tag of the lab registry and the knobs the emulator runs with under it."""

    repository: str
    tag: str
    env: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    #: ENTRYPOINT of the image: the AEON image is used with ``--entrypoint vllm``; the stock
    #: vllm-openai image's own entrypoint is ``vllm serve``.
    entrypoint: tuple[str, ...] = ("vllm",)

    @property
    def ref(self) -> str:
        """``repository:tag`` (without a registry host)."""
        return f"{self.repository}:{self.tag}"


_V024 = {"EMU_VERSION": "0.24.0", **_LOAD}

#: The images' history (docs/domain.md#image-tags), oldest first.
HISTORY: tuple[ImageTag, ...] = (
    ImageTag(
        AEON_REPOSITORY,
        "2026-06-11-pr41703",
        {
            "EMU_VERSION": "0.22.1",
            **_LOAD,
            "EMU_CRASH_AT_CONCURRENCY": "32",
        },
        "vLLM 0.22.1 era; the DFlash drafter crashes at >= 32 concurrent requests (block_table "
        "shape)",
    ),
    ImageTag(
        AEON_REPOSITORY,
        "2026-06-18-v0.23.0-dflashfix",
        {"EMU_VERSION": "0.23.0", **_LOAD},
        "vLLM 0.23.0 + the DFlash high-concurrency fix; clean to c=64",
    ),
    ImageTag(
        AEON_REPOSITORY,
        "2026-07-01-v0.24.0",
        dict(_V024),
        "vLLM 0.24.0; throughput parity with 0.23.0",
    ),
    ImageTag(AEON_REPOSITORY, "latest", dict(_V024), "= 2026-07-01-v0.24.0 (since 2026-07-02)"),
    # The stock image's releases: a recipe of vllm/vllm-openai rolls by tag as the AEON ones do.
    ImageTag(STOCK_REPOSITORY, "v0.23.0", {"EMU_VERSION": "0.23.0", **_LOAD},
             "stock vLLM 0.23.0 release; serves without speculative decoding", ("vllm", "serve")),
    ImageTag(STOCK_REPOSITORY, "v0.24.0", dict(_V024),
             "stock vLLM 0.24.0 release; serves without speculative decoding", ("vllm", "serve")),
    ImageTag(
        STOCK_REPOSITORY,
        "cu130-nightly",
        {"EMU_VERSION": "0.25.0.dev0+cu130", **_LOAD},
        "stock vLLM nightly for CUDA 13.0; serves without speculative decoding",
        ("vllm", "serve"),
    ),
)

#: Named scenario presets (knobs only; combine with a base tag's env through scenario_env).
SCENARIOS: dict[str, dict[str, str]] = {
    "healthy": {},
    # Acceptance gone within ~20 s of real time: a short soak sees the whole decay.
    "decay": {"EMU_ACCEPT_DECAY_PER_MIN": "3"},
    "garbage": {"EMU_GARBAGE": "1"},
    # Silent corruption that passes a smoke check: answers turn to "!!!!" after 30 s of
    # uptime, after 12k decoded tokens, or only in batches of 32+ while /health stays 200.
    "garbage-late": {"EMU_GARBAGE_AFTER_SECONDS": "30"},
    "garbage-tokens": {"EMU_GARBAGE_AFTER_TOKENS": "12000"},
    "garbage32": {"EMU_GARBAGE_AT_CONCURRENCY": "32"},
    "boot-failure": {
        "EMU_BOOT_FAIL": "RuntimeError: CUDA error: no kernel image is available for execution on "
                         "the device"
    },
    # A build whose long answers loop: past ~100 words each turns into one short phrase repeated
    # to max_tokens, at every concurrency, greedy or not; short answers, canaries and stops healthy.
    "degenerate": {"EMU_DEGENERATE_AFTER_TOKENS": "100"},
    "slow30": {"EMU_THROUGHPUT_SCALE": "0.7"},
    "error-rate": {"EMU_ERROR_RATE": "0.2"},
    "errors-under-traffic": {"EMU_FORWARDED_ERROR_RATE": "0.4"},
    "long-context-collapse": {"EMU_LONGCTX_COLLAPSE": "1"},
    # Never becomes healthy: the port stays closed, the process stays up.
    "hang": {"EMU_HANG": "boot"},
    # Healthy, but every request is accepted and never answered.
    "stall": {"EMU_HANG": "requests"},
    "crash32": {"EMU_CRASH_AT_CONCURRENCY": "32"},
    # What the recipe serves beyond greedy text, each broken while text stays perfect
    # (soak/capabilities): images answered "!!!!" (the heretic card's skip-loaded vision tower),
    # tool calls left as <tool_call> text in content (vLLM #22975, #47194), the thinking leaked
    # into content inside <think> (vLLM #39697, #51679).
    "image-garbage": {"EMU_IMAGE_GARBAGE": "1"},
    "tool-call-leak": {"EMU_TOOL_CALL_LEAK": "1"},
    "reasoning-leak": {"EMU_REASONING_LEAK": "1"},
}


def history_tags() -> tuple[ImageTag, ...]:
    """The tags ``lab up`` pushes."""
    return HISTORY


def history_tag(tag: str, repository: str = AEON_REPOSITORY) -> ImageTag:
    """One tag of :data:`HISTORY`."""
    for item in HISTORY:
        if item.tag == tag and item.repository == repository:
            return item
    raise FleetError(
        f"no lab image {repository}:{tag}",
        fix="use one of: " + ", ".join(t.ref for t in HISTORY),
    )


def knob_env(settings: Mapping[str, object]) -> dict[str, str]:
    """EMU_* environment from knob settings; keys are ``EMU_X``, ``x`` or ``x-y``
    (case-insensitive).

    Raises FleetError naming an unknown knob or a value the emulator would refuse.
    """
    by_name = {env.lower(): env for env in ENV_NAMES.values()}
    by_name.update({name: env for name, env in ENV_NAMES.items()})
    env: dict[str, str] = {}
    for key, value in settings.items():
        norm = key.strip().lower().replace("-", "_")
        target = by_name.get(norm) or by_name.get("emu_" + norm)
        if target is None:
            raise FleetError(
                f"unknown emulator knob {key!r}",
                fix="use one of: " + ", ".join(sorted(ENV_NAMES.values())),
            )
        if isinstance(value, bool):
            env[target] = "1" if value else "0"
        else:
            env[target] = str(value)
    try:
        from_env(env)
    except ValueError as exc:
        raise FleetError(
            f"invalid emulator knob: {exc}", fix="see fleetctl/lab/emulator/__init__.py"
        ) from None
    return env


def scenario_env(
    name: str, base: str = "2026-07-01-v0.24.0", **overrides: object
) -> dict[str, str]:
    """The env of a scenario tag: ``base``'s knobs, then the preset's, then ``overrides`` (knob
    names)."""
    if name not in SCENARIOS:
        raise FleetError(f"unknown scenario {name!r}", fix="use one of: " + ", ".join(SCENARIOS))
    env = dict(history_tag(base).env)
    env.update(SCENARIOS[name])
    env.update(knob_env(overrides))
    return env


def emulator_source() -> Path:
    """The emulator package directory in this checkout."""
    return Path(__file__).resolve().parent / "emulator"


#: The emulator's commands put on PATH in its image: vLLM's, and Ray's ``ray start`` (a unit's Ray
#: launch).
COMMANDS = ("vllm", "ray")


def install_emulator(root: Path | str) -> Path:
    """Copy the emulator into an image root filesystem and put its commands (:data:`COMMANDS`) on
    PATH.

    Writes ``<root>/opt/fleetctl-emulator/vllm_emulator/`` (the package, Python files and the
    ``vllm`` and ``ray`` scripts only) and the symlinks ``<root>/usr/local/bin/vllm`` and ``ray``.
    Returns the installed package directory.
    """
    base = Path(root)
    target = base / IMAGE_PREFIX.lstrip("/") / IMAGE_PACKAGE
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for src in sorted(emulator_source().iterdir()):
        if src.suffix == ".py" or src.name in COMMANDS:
            shutil.copy2(src, target / src.name)
    bin_dir = base / "usr/local/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        (target / command).chmod(0o755)
        link = bin_dir / command
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(f"{IMAGE_PREFIX}/{IMAGE_PACKAGE}/{command}", link)
    return target
