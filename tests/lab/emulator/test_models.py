"""Tiny model directories, their broken variants, the weights mirror and the scenario table."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.errors import FleetError
from fleetctl.lab import models, scenarios
from fleetctl.lab.emulator.weights import BootError, load_weights


def _headers(directory: Path) -> dict[str, dict[str, object]]:
    out = {}
    for shard in sorted(directory.glob("*.safetensors")):
        raw = shard.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        header.pop("__metadata__")
        ends = sorted(v["data_offsets"][1] for v in header.values())
        # The data offsets tile the data section exactly (what safetensors itself checks).
        assert ends[-1] == len(raw) - 8 - n
        out[shard.name] = header
    return out


@pytest.mark.parametrize("kind", list(models.KINDS))
def test_good_models_load_and_are_small(tmp_path: Path, kind: str) -> None:
    d = models.write_model(tmp_path / kind, kind)
    loaded = load_weights(d)
    assert not loaded.warnings
    config = json.loads((d / "config.json").read_text())
    assert config["architectures"] == [models.KINDS[kind].architecture]
    assert config["revision_date"] == models.KINDS[kind].date
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        json.loads((d / name).read_text())
    headers = _headers(d)
    if models.KINDS[kind].role == "body":
        index = json.loads((d / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == set(headers)
        assert sorted(index["weight_map"]) == sorted(loaded.tensor_names)
    size = sum(p.stat().st_size for p in d.iterdir())
    assert size < 1_000_000


def test_qwen36_35b_layout(tmp_path: Path) -> None:
    d = models.write_model(tmp_path / "m", "qwen36-35b-a3b-nvfp4")
    names = load_weights(d).tensor_names
    visual = [n for n in names if n.startswith("model.visual.")]
    assert len(visual) == 333
    assert any(n.startswith("model.language_model.layers.39.") for n in names)
    assert not any(n.startswith("model.layers.") for n in names)
    assert (
        json.loads((d / "config.json").read_text())["quantization_config"]["quant_method"]
        == "compressed-tensors"
    )
    d27 = models.write_model(tmp_path / "m27", "qwen36-27b-mm-nvfp4-mtp")
    assert (
        json.loads((d27 / "config.json").read_text())["quantization_config"]["quant_method"]
        == "modelopt"
    )


def test_size_parameter_pads_the_model(tmp_path: Path) -> None:
    d = models.write_model(tmp_path / "big", "qwen36-35b-a3b-nvfp4", size_bytes=5_000_000)
    total = sum(p.stat().st_size for p in d.glob("*.safetensors"))
    assert 5_000_000 <= total < 6_000_000
    load_weights(d)


def test_writes_are_deterministic(tmp_path: Path) -> None:
    a = models.write_model(tmp_path / "a", "qwen36-35b-a3b-dflash")
    b = models.write_model(tmp_path / "b", "qwen36-35b-a3b-dflash")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ("lfs-pointer", "HeaderTooLarge"),
        ("missing_shard", "No such file or directory"),
        ("corrupt-header", "InvalidHeaderDeserialization"),
    ],
)
def test_broken_variants_fail_like_vllm(tmp_path: Path, variant: str, message: str) -> None:
    d = models.write_model(tmp_path / "m", "qwen36-35b-a3b-nvfp4", variant)
    with pytest.raises(BootError, match=message):
        load_weights(d)


def test_lfs_pointer_is_a_pointer_file(tmp_path: Path) -> None:
    d = models.write_model(tmp_path / "m", "qwen36-35b-a3b-nvfp4", "lfs-pointer")
    pointers = [
        p for p in d.glob("*.safetensors") if p.read_bytes().startswith(b"version https://git-lfs")
    ]
    assert len(pointers) == 1


def test_escaping_symlink_resolves_outside_and_dangles_without_the_cache(tmp_path: Path) -> None:
    d = models.write_model(tmp_path / "m", "qwen36-35b-a3b-nvfp4", "escaping-symlink")
    links = [p for p in d.iterdir() if p.is_symlink()]
    assert len(links) == 1
    target = Path(os.path.realpath(links[0]))
    assert d.resolve() not in target.parents
    load_weights(d)  # on the host the link resolves, as it does for hf download
    target.unlink()  # inside the container only the model dir is mounted
    with pytest.raises(BootError, match="No such file"):
        load_weights(d)


def test_misnested_vision_warns_and_v1_keys(tmp_path: Path) -> None:
    mis = load_weights(
        models.write_model(tmp_path / "mis", "qwen36-35b-a3b-nvfp4", "misnested-vision")
    )
    assert not mis.vision_loaded
    assert sum(n.startswith("model.language_model.visual.") for n in mis.tensor_names) == 333
    assert any("skip loading" in w for w in mis.warnings)
    v1 = models.write_model(tmp_path / "v1", "qwen36-35b-a3b-nvfp4", "v1-keys")
    config = json.loads((v1 / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert config["revision_date"] < models.DRAFTER_FIX_DATE
    names = load_weights(v1).tensor_names
    assert any(n.startswith("model.layers.0.") for n in names)
    assert not any(n.startswith("model.language_model.layers.") for n in names)


def test_stale_drafter_is_dated_before_the_fix(tmp_path: Path) -> None:
    stale = load_weights(
        models.write_model(tmp_path / "s", "qwen36-35b-a3b-dflash", "stale-drafter")
    )
    good = load_weights(models.write_model(tmp_path / "g", "qwen36-35b-a3b-dflash"))
    assert stale.revision_date is not None and stale.revision_date < models.DRAFTER_FIX_DATE
    assert good.revision_date is not None and good.revision_date >= models.DRAFTER_FIX_DATE


def test_variant_and_kind_errors(tmp_path: Path) -> None:
    with pytest.raises(FleetError):
        models.write_model(tmp_path / "a", "qwen36-35b-a3b-nvfp4", "nonsense")
    with pytest.raises(FleetError):
        models.write_model(tmp_path / "b", "no-such-kind")
    with pytest.raises(FleetError):
        models.write_model(tmp_path / "c", "qwen36-35b-a3b-nvfp4", "stale-drafter")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("x")
    with pytest.raises(FleetError, match="not empty"):
        models.write_model(tmp_path / "d", "qwen36-35b-a3b-dflash")


def test_populate_mirror_from_the_lab_recipes(tmp_path: Path) -> None:
    recipes = models.repo_recipes()
    entries = models.populate_mirror(tmp_path, recipes)
    wanted = {
        (w["repo"], str(w.get("revision", "main"))) for r in recipes.values() for w in r["weights"]
    }
    assert {(e.repo, e.revision) for e in entries} == wanted
    for entry in entries:
        manifest = json.loads((entry.path / "manifest.json").read_text())
        assert manifest["repo"] == entry.repo and manifest["revision"] == entry.revision
        assert manifest["revision_date"]
        listed = {f["path"] for f in manifest["files"]}
        on_disk = {
            p.relative_to(entry.path).as_posix() for p in entry.path.rglob("*") if p.is_file()
        }
        assert listed == on_disk - {"manifest.json"}
        for f in manifest["files"]:
            data = (entry.path / f["path"]).read_bytes()
            assert len(data) == f["size"]
            assert hashlib.sha256(data).hexdigest() == f["sha256"]
        load_weights(entry.path)
    # A second run keeps what is there.
    stamp = {e.path: (e.path / "manifest.json").stat().st_mtime_ns for e in entries}
    again = models.populate_mirror(tmp_path, None)
    assert {e.path: (e.path / "manifest.json").stat().st_mtime_ns for e in again} == stamp


def test_populate_mirror_with_a_broken_revision(tmp_path: Path) -> None:
    spec = models.MirrorSpec("z-lab/Qwen3.6-35B-A3B-DFlash", "old", variant="stale-drafter")
    (entry,) = models.populate_mirror(tmp_path, [spec])
    assert entry.manifest["revision_date"] == models.STALE_DRAFTER_DATE
    assert entry.path == tmp_path / "z-lab/Qwen3.6-35B-A3B-DFlash/old"


def test_history_tags_and_scenarios() -> None:
    tags = {t.ref: t for t in scenarios.history_tags()}
    assert (
        tags["aeon-7/aeon-vllm-ultimate:2026-06-11-pr41703"].env["EMU_CRASH_AT_CONCURRENCY"] == "32"
    )
    for healthy in ("2026-06-18-v0.23.0-dflashfix", "2026-07-01-v0.24.0", "latest"):
        assert "EMU_CRASH_AT_CONCURRENCY" not in tags[f"aeon-7/aeon-vllm-ultimate:{healthy}"].env
    assert (
        tags["aeon-7/aeon-vllm-ultimate:latest"].env
        == tags["aeon-7/aeon-vllm-ultimate:2026-07-01-v0.24.0"].env
    )
    assert "vllm/vllm-openai:cu130-nightly" in tags
    env = scenarios.scenario_env("slow30", speed=4)
    assert (
        env["EMU_THROUGHPUT_SCALE"] == "0.7"
        and env["EMU_SPEED"] == "4"
        and env["EMU_VERSION"] == "0.24.0"
    )
    assert scenarios.knob_env({"EMU_GARBAGE": True, "crash-at-concurrency": 8}) == {
        "EMU_GARBAGE": "1",
        "EMU_CRASH_AT_CONCURRENCY": "8",
    }
    with pytest.raises(FleetError, match="unknown emulator knob"):
        scenarios.knob_env({"EMU_NOPE": 1})
    with pytest.raises(FleetError, match="invalid emulator knob"):
        scenarios.knob_env({"speed": "fast"})
    with pytest.raises(FleetError):
        scenarios.scenario_env("nope")
    for name in scenarios.SCENARIOS:
        scenarios.scenario_env(name)


def test_installed_emulator_runs_without_fleetctl(tmp_path: Path) -> None:
    pkg = scenarios.install_emulator(tmp_path)
    link = tmp_path / "usr/local/bin/vllm"
    assert os.readlink(link) == f"{scenarios.IMAGE_PREFIX}/{scenarios.IMAGE_PACKAGE}/vllm"
    # -I: isolated mode, no site-packages and no fleetctl on the path: only the copied files.
    out = subprocess.run(
        [sys.executable, "-I", str(pkg / "vllm"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"EMU_VERSION": "0.23.0", "PATH": os.environ["PATH"]},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.23.0"
    sources = "".join(p.read_text() for p in pkg.glob("*.py"))
    assert "import fleetctl" not in sources and "from fleetctl" not in sources
