"""fleetctl.stage.fold: the weights role's per-host reports become a StageResult (pure data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetctl.ansible import HostResult, PlaybookResult, TaskFailure
from fleetctl.inventory import Host
from fleetctl.recipes import parse_recipes
from fleetctl.stage import fold, human_bytes

RECIPE = parse_recipes(
    {
        "r": {
            "image": "ghcr.io/aeon-7/aeon-vllm-ultimate",
            "served_model_names": ["m"],
            "weights": [
                {
                    "role": "body",
                    "repo": "a/body",
                    "revision": "r1",
                    "path": "/opt/m/body",
                    "mount": "/model",
                    "format": "compressed-tensors",
                },
                {
                    "role": "drafter",
                    "repo": "a/drafter",
                    "revision": "r1",
                    "path": "/opt/m/drafter",
                    "mount": "/drafter",
                    "format": "bf16",
                },
            ],
            "vllm_args": [
                "--max-num-seqs",
                "8",
                "--max-num-batched-tokens",
                "8192",
                "--speculative-config",
                '{"method":"dflash","model":"/drafter"}',
            ],
        }
    }
)["r"]
HOSTS = [
    Host("s1", "10.0.0.1"),
    Host("s2", "10.0.0.2"),
    Host("s3", "10.0.0.3"),
    Host("s4", "10.0.0.4"),
]


def pre(state: str, nbytes: int = 1000) -> dict[str, Any]:
    return {
        "preflight": {
            "sets": [
                {"role": r, "state": state, "bytes": nbytes, "reason": "x"}
                for r in ("body", "drafter")
            ],
            "free_bytes": 10**9,
        }
    }


def test_seed_receivers_current_and_refused_hosts() -> None:
    swap = {"swap": [{"role": "body", "bytes": 1000}, {"role": "drafter", "bytes": 1000}]}
    hosts = {
        "s1": HostResult(
            "s1",
            ok=9,
            changed=3,
            reports={
                **pre("stage"),
                **swap,
                "fetch": [
                    {"role": "body", "bytes": 3_000_000, "seconds": 0.5},
                    {"role": "drafter", "bytes": 1_000_000, "seconds": 0.5},
                ],
            },
        ),
        "s2": HostResult(
            "s2",
            ok=9,
            changed=2,
            reports={
                **pre("stage"),
                **swap,
                "receive": [
                    {"role": "body", "bytes": 1000, "seconds": 2.0},
                    {"role": "drafter", "bytes": 1000, "seconds": 2.0},
                ],
            },
        ),
        "s3": HostResult("s3", ok=5, reports=pre("current")),
        "s4": HostResult(
            "s4",
            ok=5,
            failed=1,
            failures=(TaskFailure("Verify", "body weights refused: ..."),),
            reports={
                **pre("stage"),
                "verify_body": {
                    "ok": False,
                    "bytes": 5,
                    "problems": [
                        {
                            "path": "x.safetensors",
                            "problem": "is a Git LFS pointer file",
                            "fix": "git lfs pull",
                        }
                    ],
                    "files": [{"path": "x.safetensors", "size": 5, "status": "bad"}],
                },
            },
        ),
    }
    pr = PlaybookResult("stage-1", "stage.yml", Path("/tmp/a"), hosts, 3.0, "failed", 2)
    r = fold(pr, RECIPE, "mirror", HOSTS)
    assert r.seed == "s1" and r.fetched_bytes == 4_000_000 and r.fetch_seconds == 1.0
    assert not r.ok and r.failed_hosts == ["s4"]
    s1, s2, s3, s4 = (r.hosts[n] for n in ("s1", "s2", "s3", "s4"))
    assert s1.seed and s1.changed and s1.bytes_copied == 4_000_000 and s1.mb_per_s == 4.0
    assert (
        [s.state for s in s2.sets] == ["staged", "staged"]
        and s2.bytes_copied == 2000
        and s2.seconds == 4.0
    )
    assert (
        s3.ok
        and not s3.changed
        and s3.bytes_copied == 0
        and [s.state for s in s3.sets] == ["current", "current"]
    )
    assert s4.status == "failed" and s4.message.startswith("Verify: body weights refused")
    assert [s.state for s in s4.sets] == ["refused", "not staged"]
    assert s4.sets[0].problems == ("x.safetensors: is a Git LFS pointer file (fix: git lfs pull)",)
    assert s4.sets[0].files[0].status == "bad"
    assert r.copied_bytes == 4_002_000
    assert s3.mb_per_s is None


def test_a_host_the_playbook_never_reached_is_failed() -> None:
    pr = PlaybookResult("stage-2", "stage.yml", Path("/tmp/a"), {}, 1.0, "failed", 1)
    r = fold(pr, RECIPE, "hub", HOSTS[:1])
    assert r.hosts["s1"].status == "failed" and "never reached" in r.hosts["s1"].message


def test_human_bytes() -> None:
    assert human_bytes(999) == "999 B"
    assert human_bytes(22_000_000_000) == "22.0 GB"
    assert human_bytes(905_000_000) == "905.0 MB"
