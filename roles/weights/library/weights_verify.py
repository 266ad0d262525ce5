#!/usr/bin/python3
"""Ansible module: verify a directory of model weights before it is put in service.

Runs on the host with Python's standard library only. It reads file heads,
``config.json``, ``model.safetensors.index.json`` and the safetensors headers
(an 8-byte little-endian length, then a JSON header): it never loads a weight.
Each check below stands for a way a Spark has failed to serve (docs/domain.md#weights in the
repository):

- Git LFS pointer files instead of weights (a clone without ``git lfs pull``);
- symlinks leaving the directory (into the HF cache ``blobs/``): the container's
  bind mount cannot follow them;
- a shard named in the index missing, or a header that is not valid
  (truncated download, offsets past the end of the file);
- known-bad layouts visible from tensor names: v1 keys ``model.layers.*`` where a
  multimodal checkpoint has ``model.language_model.layers.*``, and vision
  tensors mis-nested as ``model.language_model.visual.*``;
- a drafter revision older than the recipe's minimum date;
- optionally, a sha256 manifest ``{"files": [{"path", "size", "sha256"}]}``.

It returns a per-file report in ``fleetctl_report`` (``verify_<role>``) that
fleetctl shows, and fails with one message per problem.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from datetime import date

DOCUMENTATION = r"""
module: weights_verify
short_description: Verify a model weights directory by its headers, never loading weights
description: See the module docstring; returns fleetctl_report.verify_<role>.
options:
  path: {description: Directory to verify (or give sets)., type: path}
  role: {description: body or drafter (names the report)., type: str, default: body}
  sets: {description: "Several sets at once: [{role, path, min_date}] (the report has verify_<role> for each)", type: list}
  suffix: {description: Appended to each set's path (e.g. .staging-RUN)., type: str, default: ""}
  only: {description: Roles of sets to verify (default all)., type: list}
  min_date: {description: Oldest acceptable revision date (YYYY-MM-DD)., type: str}
  revision_date: {description: Date of the staged revision; default read from .fleetctl-source.json., type: str}
  manifest: {description: A manifest file to check sizes and sha256 against., type: path}
  checksums: {description: Hash every file against the manifest (slow on 20 GB)., type: bool, default: false}
"""  # noqa: E501 (data: lines as the program reads them)

LFS_MAGIC = b"version https://git-lfs.github.com/spec/v1"
#: Bytes per element of the safetensors dtypes.
DTYPE_SIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F4": 0.5,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}
#: Safetensors headers are small; anything larger is a corrupt length, not a header.
MAX_HEADER = 100 * 1024 * 1024
#: Files fleetctl itself writes into a staged directory.
OWN_FILES = (".fleetctl-staged.json", ".fleetctl-source.json", ".fleetctl-manifest.json")
INDEX = "model.safetensors.index.json"
#: Model types whose checkpoints are multimodal (text tower under model.language_model.*).
MULTIMODAL_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe", "gemma4")


def _problem(path, problem, fix):
    return {"path": path, "problem": problem, "fix": fix}


def read_header(fp, size):
    """The parsed JSON header of a safetensors file, or raise ValueError saying what is wrong."""
    if size < 8:
        raise ValueError(f"only {size} bytes: shorter than the 8-byte header length")
    with open(fp, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n == 0 or n > MAX_HEADER or n > size - 8:
            raise ValueError(f"header length {n} does not fit a {size}-byte file")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    data_len = size - 8 - n
    end_max = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if (
            not isinstance(t, dict)
            or not isinstance(t.get("data_offsets"), list)
            or len(t["data_offsets"]) != 2
        ):
            raise ValueError(f"tensor {name!r} has no data_offsets")
        b, end = t["data_offsets"]
        if not (isinstance(b, int) and isinstance(end, int)) or not 0 <= b <= end <= data_len:
            raise ValueError(
                f"tensor {name!r} offsets [{b}, {end}] fall outside the {data_len} data bytes"
            )
        shape = t.get("shape")
        elem = DTYPE_SIZE.get(str(t.get("dtype")))
        if isinstance(shape, list) and elem is not None:
            count = 1
            for d in shape:
                count *= int(d)
            if int(count * elem + 0.999) != end - b:
                raise ValueError(
                    f"tensor {name!r} of shape {shape} {t.get('dtype')} needs {int(count * elem)} "
                    "bytes, "
                    f"its offsets give {end - b}"
                )
        end_max = max(end_max, end)
    if end_max != data_len:
        raise ValueError(
            f"tensors cover {end_max} of the {data_len} data bytes (truncated or padded)"
        )
    return header


def _is_lfs_pointer(fp, size):
    if size > 1024:
        return False
    with open(fp, "rb") as f:
        return f.read(len(LFS_MAGIC)) == LFS_MAGIC


def _sha256(fp):
    h = hashlib.sha256()
    with open(fp, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_dir(path, role="body", min_date=None, revision_date=None, manifest=None, checksums=False,
               allow_code=False):
    """Check a weights directory; return ``{"ok", "files": [...], "problems": [...], "bytes"}``.

    Pure logic (no Ansible): the tests call it on directories written by
    ``fleetctl.lab.models``.
    """
    root = os.path.realpath(path)
    problems = []
    files = {}
    if not os.path.isdir(root):
        problems.append(_problem(path, "is not a directory", "stage the weights first"))
        return {
            "path": path,
            "role": role,
            "ok": False,
            "files": [],
            "problems": problems,
            "bytes": 0,
        }

    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".cache")]
        for name in [
            *filenames,
            *[d for d in dirnames if os.path.islink(os.path.join(dirpath, d))],
        ]:
            fp = os.path.join(dirpath, name)
            rel = os.path.relpath(fp, root)
            if rel in OWN_FILES:
                continue
            entry = {"path": rel, "size": 0, "status": "ok"}
            files[rel] = entry
            if os.path.islink(fp):
                target = os.path.realpath(fp)
                if os.path.commonpath([root, target]) != root:
                    entry["status"] = "bad"
                    problems.append(
                        _problem(
                            rel,
                            f"is a symlink leaving the directory (to {os.readlink(fp)}): "
                            "the container's bind mount cannot follow it",
                            "materialise it: download with --local-dir (real files) or cp -L the "
                            "target",
                        )
                    )
                    continue
                if not os.path.exists(fp):
                    entry["status"] = "bad"
                    problems.append(_problem(rel, "is a dangling symlink", "re-download the file"))
                    continue
            try:
                size = os.path.getsize(fp)
            except OSError as e:
                entry["status"] = "bad"
                problems.append(_problem(rel, f"cannot be read ({e.strerror})", "re-download it"))
                continue
            entry["size"] = size
            if _is_lfs_pointer(fp, size):
                entry["status"] = "bad"
                problems.append(
                    _problem(
                        rel,
                        "is a Git LFS pointer file, not the weights",
                        "run `git lfs pull` in the clone, or download with `hf download`",
                    )
                )

    config = None
    if "config.json" not in files:
        problems.append(
            _problem(
                "config.json", "is missing", "download the whole repository, not only the shards"
            )
        )
    elif files["config.json"]["status"] == "ok":
        try:
            with open(os.path.join(root, "config.json")) as f:
                config = json.load(f)
        except ValueError as e:
            files["config.json"]["status"] = "bad"
            problems.append(_problem("config.json", f"is not valid JSON ({e})", "re-download it"))

    shards = sorted(f for f in files if f.endswith(".safetensors"))
    index_map = None
    if INDEX in files and files[INDEX]["status"] == "ok":
        try:
            with open(os.path.join(root, INDEX)) as f:
                index_map = json.load(f).get("weight_map")
            if not isinstance(index_map, dict):
                raise ValueError("no weight_map")
        except (ValueError, AttributeError) as e:
            files[INDEX]["status"] = "bad"
            problems.append(_problem(INDEX, f"is not a valid shard index ({e})", "re-download it"))
            index_map = None
    if index_map is not None:
        for shard in sorted(set(index_map.values())):
            if shard not in files:
                problems.append(_problem(shard, f"is named in {INDEX} but missing",
                                         "the download stopped early: stage the weights again"))
        shards = sorted(set(shards) | {s for s in index_map.values() if s in files})
    if not shards:
        problems.append(
            _problem(".", "holds no *.safetensors weights", "check the repository and revision")
        )

    keys = set()
    for shard in shards:
        entry = files[shard]
        if entry["status"] != "ok":
            continue
        try:
            header = read_header(os.path.join(root, shard), entry["size"])
        except (ValueError, OSError) as e:
            entry["status"] = "bad"
            problems.append(
                _problem(
                    shard,
                    f"has no valid safetensors header: {e}",
                    "the file is corrupt: stage it again",
                )
            )
            continue
        entry["tensors"] = len([k for k in header if k != "__metadata__"])
        names = {k for k in header if k != "__metadata__"}
        keys |= names
        if index_map is not None:
            missing = sorted(k for k, s in index_map.items() if s == shard and k not in names)
            if missing:
                entry["status"] = "bad"
                problems.append(
                    _problem(
                        shard,
                        f"lacks {len(missing)} tensor(s) the index assigns to it "
                        f"(first: {missing[0]})",
                        "stage the weights again",
                    )
                )

    if not allow_code:
        problems += _code_problems(config, files)
    problems += _layout_problems(config, keys, role)
    problems += _date_problems(role, min_date, revision_date, root)
    if manifest:
        problems += _manifest_problems(root, manifest, files, checksums)
    ok = not problems
    return {
        "path": path, "role": role, "ok": ok, "problems": problems,
        "files": [files[k] for k in sorted(files)], "bytes": sum(f["size"] for f in files.values()),
        "tensors": len(keys),
    }


def _code_problems(config, files):
    """Model code in the weights: vLLM runs it with --trust-remote-code, so only a recipe that
    opted in gets it."""
    fix = (
        "stage a revision without code, or review the code and set trust_remote_code: true in the "
        "recipe "
        "(the operator's opt-in)"
    )
    out = [_problem(rel, "is Python code from the model's repository", fix)
           for rel in sorted(files) if rel.endswith(".py")]
    if isinstance(config, dict) and config.get("auto_map"):
        out.append(
            _problem(
                "config.json",
                "has an auto_map (classes loaded from the repository's own code)",
                fix,
            )
        )
    return out


def _layout_problems(config, keys, role):
    """Known-bad layouts, recognised by tensor names (docs/domain.md#weights)."""
    out = []
    nested = sorted(k for k in keys if k.startswith("model.language_model.visual."))
    if nested:
        out.append(
            _problem(
                ".",
                f"{len(nested)} vision tensors are mis-nested as model.language_model.visual.* "
                "(vLLM silently skips them and images produce '!!!!')",
                "stage a revision from 2026-06-18 or later, where they are model.visual.*",
            )
        )
    arch = ""
    model_type = ""
    if isinstance(config, dict):
        if isinstance(config.get("architectures"), list) and config["architectures"]:
            arch = str(config["architectures"][0])
        model_type = str(config.get("model_type", ""))
    # A multimodal family is loaded by vLLM's ForConditionalGeneration class, whose text tower
    # lives at model.language_model.layers.*; v1 of the 35B body stripped that prefix (and declared
    # the text-only ForCausalLM class) and crashes in production.
    multimodal = arch.endswith("ForConditionalGeneration") or model_type in MULTIMODAL_MODEL_TYPES
    if role == "body" and multimodal:
        v1 = sorted(k for k in keys if k.startswith("model.layers."))
        if v1:
            out.append(
                _problem(
                    ".",
                    f"{len(v1)} tensors use the v1 key layout model.layers.* "
                    f"({arch or model_type}) where "
                    "model.language_model.layers.* is expected (v1 crashes in production)",
                    "delete the directory and stage the v2 revision (same repository, re-pulled)",
                )
            )
    return out


def _date_problems(role, min_date, revision_date, root):
    if not min_date:
        return []
    if not revision_date:
        src = os.path.join(root, ".fleetctl-source.json")
        try:
            with open(src) as f:
                revision_date = json.load(f).get("revision_date")
        except (OSError, ValueError):
            revision_date = None
    if not revision_date:
        # The models' own convention: config.json carries the date of the revision it stands for.
        cfg = os.path.join(root, "config.json")
        data = None
        try:
            with open(cfg) as f:
                data = json.load(f)
        except (OSError, ValueError):
            pass
        if isinstance(data, dict):
            revision_date = data.get("revision_date")
    if not revision_date:
        return [
            _problem(
                ".",
                f"the {role}'s revision date is unknown, so it cannot be checked against "
                f"{min_date}",
                "stage from a mirror whose manifest has revision_date, or from the hub",
            )
        ]
    try:
        staged = date.fromisoformat(str(revision_date)[:10])
        oldest = date.fromisoformat(str(min_date)[:10])
    except ValueError as e:
        return [_problem(".", f"bad date ({e})", "write dates as YYYY-MM-DD")]
    if staged < oldest:
        return [
            _problem(
                ".",
                f"the {role} revision is from {staged}, older than {oldest} "
                "(an older DFlash drafter crashes with cudaErrorIllegalAddress after ~16K tokens)",
                f"pin a revision from {oldest} or later and stage again",
            )
        ]
    return []


def _manifest_problems(root, manifest, files, checksums):
    out = []
    try:
        with open(manifest) as f:
            listed = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [_problem(manifest, f"manifest cannot be read ({e})", "fetch the manifest again")]
    for item in listed:
        rel = item.get("path", "")
        entry = files.get(rel)
        if entry is None:
            out.append(_problem(rel, "is in the manifest but missing", "stage the weights again"))
            continue
        if entry["size"] != item.get("size"):
            entry["status"] = "bad"
            out.append(
                _problem(
                    rel,
                    f"has {entry['size']} bytes, the manifest says {item.get('size')}",
                    "stage the weights again",
                )
            )
        elif (
            checksums
            and entry["status"] == "ok"
            and _sha256(os.path.join(root, rel)) != item.get("sha256")
        ):
            entry["status"] = "bad"
            out.append(_problem(rel, "sha256 differs from the manifest", "stage the weights again"))
    return out


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path"},
            "role": {"type": "str", "default": "body"},
            "sets": {"type": "list", "elements": "dict"},
            "suffix": {"type": "str", "default": ""},
            "only": {"type": "list", "elements": "str"},
            "min_date": {"type": "str"},
            "revision_date": {"type": "str"},
            "manifest": {"type": "path"},
            "checksums": {"type": "bool", "default": False},
            "allow_code": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["sets"] is not None:
        todo = [
            {
                "role": s.get("role", "body"),
                "path": s["path"] + p["suffix"],
                "min_date": s.get("min_date"),
            }
            for s in p["sets"]
            if p["only"] is None or s.get("role") in p["only"]
        ]
    elif p["path"]:
        todo = [{"role": p["role"], "path": p["path"], "min_date": p["min_date"]}]
    else:
        module.fail_json(msg="give path or sets")
    reports = {}
    refused = []
    for s in todo:
        manifest = p["manifest"]
        if manifest is None and os.path.exists(os.path.join(s["path"], ".fleetctl-manifest.json")):
            manifest = os.path.join(s["path"], ".fleetctl-manifest.json")
        min_date = str(s["min_date"]) if s.get("min_date") else None
        r = verify_dir(s["path"], s["role"], min_date, p["revision_date"], manifest, p["checksums"],
                       p["allow_code"])
        reports[f"verify_{s['role']}"] = r
        if not r["ok"]:
            lines = [f"{x['path']}: {x['problem']} (fix: {x['fix']})" for x in r["problems"]]
            refused.append(f"{s['role']} weights refused: " + "; ".join(lines))
    result = {"changed": False, "fleetctl_report": reports}
    if refused:
        module.fail_json(msg=" | ".join(refused), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
