"""``fleetctl stage`` on the lab: from the mirror to several nodes, reruns, refusals, full disks,
kills.

Broken weight sets live on the lab's mirror under test-only repositories
(``fleetctl-test/...``), written with fleetctl.lab.models; the tests stage them
through a copy of the lab's inventory whose recipes name those repositories.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl import inventory, paths, ssh
from fleetctl import lab as fleetlab
from fleetctl.inventory import Inventory
from fleetctl.lab import models
from fleetctl.progress import Event
from fleetctl.recipes import STAGED_MARKER as MARKER
from fleetctl.recipes import load_recipes
from fleetctl.stage import KEY_DIR, StageResult, stage
from tests.role_modules import load_role_file

pytestmark = pytest.mark.lab

BODY_KIND = "qwen36-35b-a3b-nvfp4"
DRAFTER_KIND = "qwen36-35b-a3b-dflash"
BODY_PATH = "/opt/fleetctl-test/body"
DRAFTER_PATH = "/opt/fleetctl-test/drafter"
BROKEN = {
    "lfs-pointer": ("body", "Git LFS pointer"),
    "escaping-symlink": ("body", "symlink leaving the directory"),
    "missing-shard": ("body", "named in model.safetensors.index.json but missing"),
    "corrupt-header": ("body", "no valid safetensors header"),
    "misnested-vision": ("body", "mis-nested as model.language_model.visual"),
    "v1-keys": ("body", "v1 key layout"),
    "stale-drafter": ("drafter", "older than 2026-04-19"),
}
#: The variants staged on a lab node, end to end: one file of the body (through a controller
#: directory that keeps links, with the per-file report) and the drafter's set. What is
#: variant-specific (the verifier's message for each of BROKEN) is checked without a lab, in
#: tests/roles/test_weights_verify.py; what the lab adds (a refused set leaves the previous weights
#: and no staging behind) is the same for every variant.
ON_LAB = ("escaping-symlink", "stale-drafter")


def _recipe(body_rev: str, drafter_rev: str = "good") -> dict[str, Any]:
    return {
        "image": "ghcr.io/aeon-7/aeon-vllm-ultimate",
        "served_model_names": ["fleetctl-test"],
        "weights": [
            {
                "role": "body",
                "repo": "fleetctl-test/body",
                "revision": body_rev,
                "path": BODY_PATH,
                "mount": "/model",
                "format": "compressed-tensors",
            },
            {
                "role": "drafter",
                "repo": "fleetctl-test/drafter",
                "revision": drafter_rev,
                "path": DRAFTER_PATH,
                "mount": "/drafter",
                "format": "bf16",
                "min_date": "2026-04-19",
            },
        ],
        "vllm_args": [
            "--quantization",
            "compressed-tensors",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "8192",
            "--speculative-config",
            '{"method":"dflash","model":"/drafter","num_speculative_tokens":4}',
        ],
    }


@pytest.fixture(scope="module")
def test_inventory(
    lab: fleetlab.LabStatus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Inventory]:
    """A copy of the lab's inventory whose recipes stage test-only sets, and those sets on the
    mirror."""
    mirror = Path(lab.directory) / "www" / "weights"
    specs = [models.MirrorSpec("fleetctl-test/body", "good", BODY_KIND),
             models.MirrorSpec("fleetctl-test/drafter", "good", DRAFTER_KIND)]
    # The revision the kill test interrupts weighs 32 MB, so that the kill lands while bytes still
    # move.
    good2 = mirror / "fleetctl-test" / "body" / "good2"
    if not (good2 / "manifest.json").exists():
        tmp = tmp_path_factory.mktemp("good2") / "m"
        models.write_model(tmp, BODY_KIND, size_bytes=32_000_000, date="2026-07-01")
        manifest = models.manifest_for(
            tmp, repo="fleetctl-test/body", revision="good2", revision_date="2026-07-01"
        )
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        shutil.copytree(tmp, good2)
    for variant, (role, _) in BROKEN.items():
        specs.append(
            models.MirrorSpec(
                f"fleetctl-test/{role}",
                variant,
                BODY_KIND if role == "body" else DRAFTER_KIND,
                variant=variant,
            )
        )
    models.populate_mirror(mirror, specs)
    d = tmp_path_factory.mktemp("stage-inventory")
    shutil.copytree(Path(lab.inventory).parent, d, dirs_exist_ok=True)
    recipes = {"t-good": _recipe("good"), "t-good2": _recipe("good2")}
    for variant, (role, _) in BROKEN.items():
        recipes[f"t-{variant}"] = _recipe(variant) if role == "body" else _recipe("good", variant)
    (d / "group_vars" / "all" / "recipes.yml").write_text(
        yaml.safe_dump({"fleetctl_recipe": "t-good", "fleetctl_recipes": recipes}))
    inv = inventory.load(d / "hosts.yml")
    load_recipes(inv)  # the test recipes are valid recipes
    yield inv
    for node in fleetlab.status().nodes:
        if node.state == "running":
            fleetlab.node_exec(node.name, ["rm", "-rf", "/opt/fleetctl-test"])
    ssh.close_all()


def checksums(inv: Inventory, host: str, path: str) -> dict[str, str]:
    """sha256 of every file under path on a host, over SSH (the marker included)."""
    r = ssh.run(
        inv.host(host),
        f"cd {path} && find . -type f -print0 | sort -z | xargs -0 sha256sum",
        timeout=30,
    )
    assert r.ok, r.stderr
    return {line.split()[1]: line.split()[0] for line in r.stdout.splitlines()}


def marker(inv: Inventory, host: str, path: str) -> dict[str, Any]:
    r = ssh.run(inv.host(host), ["cat", f"{path}/{MARKER}"], timeout=10)
    assert r.ok, f"{host}: no marker in {path}: {r.stderr}"
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def leftovers(inv: Inventory, host: str) -> list[str]:
    r = ssh.run(
        inv.host(host),
        "ls -d /opt/fleetctl-test/*.staging-* /opt/fleetctl-test/*.old-* 2>/dev/null || true",
        timeout=10,
    )
    return r.stdout.split()


def test_default_recipe_staged_on_every_node_from_the_mirror(
    staged: StageResult, lab: fleetlab.LabStatus
) -> None:
    inv = inventory.load(lab.inventory)
    assert staged.source == "mirror" and staged.ok
    assert len(staged.hosts) >= 3
    seeds = [h for h in staged.hosts.values() if h.seed]
    assert (
        len(seeds) <= 1
    )  # fetched from the mirror once at most (none when an earlier run staged it all)
    mirror = Path(lab.directory) / "www" / "weights"
    recipe = load_recipes(inv)[staged.recipe]
    for name in staged.hosts:
        for w in recipe.weights:
            manifest = json.loads((mirror / w.repo / w.revision / "manifest.json").read_text())
            on_host = checksums(inv, name, w.path)
            for f in manifest["files"]:
                assert on_host[f"./{f['path']}"] == f["sha256"], f"{name}: {w.path}/{f['path']}"
            assert marker(inv, name, w.path)["revision"] == w.revision


def _node_logins(name: str, nodes: dict[str, str]) -> list[str]:
    """The lab nodes' logins sshd accepted on ``name``, from its own log (not fleetctl's
    bookkeeping)."""
    r = fleetlab.node_exec(name, ["cat", "/var/log/sshd.log"])
    assert r.returncode == 0, r.stderr
    by_address = {a: n for n, a in nodes.items()}
    out = []
    for line in r.stdout.splitlines():
        words = line.split()
        if line.startswith("Accepted publickey") and len(words) > 5 and words[5] in by_address:
            out.append(by_address[words[5]])  # the controller comes through the bastion: not a node
    return out


def test_tree_stage_uploads_log_n_times_from_the_seed_and_each_copy_is_verified(
    test_inventory: Inventory, lab: fleetlab.LabStatus
) -> None:
    """Every host that verified the weights serves the next ones: the seed's uploads, counted in
    each
    host's sshd log, are ceil(log2 N) at fanout 1 (N - 1 with one seed serving all)."""
    nodes = {n.name: n.address for n in fleetlab.status().nodes if n.state == "running"}
    assert len(nodes) >= 4
    for n in nodes:
        fleetlab.node_exec(n, ["rm", "-rf", "/opt/fleetctl-test"])
    try:
        before = {n: len(_node_logins(n, nodes)) for n in nodes}
        r = stage(
            test_inventory, "t-good", limit=",".join(nodes), extravars={"weights_tree_fanout": 1}
        )
        assert r.ok, [(h.name, h.message) for h in r.hosts.values() if not h.ok]
        sets = 2  # body and drafter: one rsync (one SSH login) each
        uploads = {n: (len(_node_logins(n, nodes)) - before[n]) / sets for n in nodes}
        tree = load_role_file("weights", "filter_plugins/weights_tree.py")
        assert r.seed is not None
        assert (
            uploads[r.seed] == tree.rounds_for(len(nodes), 1) == math.ceil(math.log2(len(nodes)))
        ), uploads
        assert uploads[r.seed] < len(nodes) - 1
        assert sum(uploads.values()) == len(nodes) - 1, uploads  # each receiver copied once
        assert len([n for n, u in uploads.items() if u and n != r.seed]) >= 1, (
            "no receiver served another"
        )
        assert {n: u for n, u in uploads.items() if u} == r.uploads(), (
            "the hosts' logs and the result disagree"
        )
        mirror = Path(lab.directory) / "www" / "weights"
        for n in nodes:
            for path, repo in (
                (BODY_PATH, "fleetctl-test/body"),
                (DRAFTER_PATH, "fleetctl-test/drafter"),
            ):
                manifest = json.loads((mirror / repo / "good" / "manifest.json").read_text())
                on_host = checksums(test_inventory, n, path)
                assert {
                    f"./{f['path']}": f["sha256"] for f in manifest["files"]
                }.items() <= on_host.items(), (n, path)
                assert marker(test_inventory, n, path)["revision"] == "good"
            assert leftovers(test_inventory, n) == []
    # The later tests start from hosts without the test sets (a disk check sees nothing staged).
    finally:
        for n in nodes:
            fleetlab.node_exec(n, ["rm", "-rf", "/opt/fleetctl-test"])


def test_rerun_copies_nothing(staged: StageResult, lab: fleetlab.LabStatus) -> None:
    inv = inventory.load(lab.inventory)
    again = stage(inv, limit=",".join(staged.hosts))
    assert again.ok
    assert again.seed is None and again.copied_bytes == 0
    for h in again.hosts.values():
        assert not h.changed and all(s.state == "current" for s in h.sets), h


def test_each_broken_variant_is_refused_and_the_previous_weights_stay(
    test_inventory: Inventory, lab: fleetlab.LabStatus
) -> None:
    host = "spark-01"
    first = stage(test_inventory, "t-good", limit=host)
    assert first.ok, first.hosts[host].message
    before = {p: checksums(test_inventory, host, p) for p in (BODY_PATH, DRAFTER_PATH)}
    local = Path(lab.directory) / "www" / "weights"
    for variant in ON_LAB:
        role, words = BROKEN[variant]
        # The mirror serves a symlink's target like a file, so only a copy that keeps links (a
        # controller directory, as an operator's own download would be) can carry an escaping one.
        kw: dict[str, Any] = (
            {"source": "local", "local_dir": local} if variant == "escaping-symlink" else {}
        )
        r = stage(test_inventory, f"t-{variant}", limit=host, **kw)
        h = r.hosts[host]
        assert not r.ok and h.status == "failed", variant
        assert words in h.message, f"{variant}: {h.message}"
        refused = [s for s in h.sets if s.state == "refused"]
        assert [s.role for s in refused] == [role], (variant, h.sets)
        # The per-file report names the bad file when the problem is one file's.
        if variant in ("lfs-pointer", "escaping-symlink", "corrupt-header"):
            assert [f.path for f in refused[0].files if f.status == "bad"] == [
                "model-00003-of-00003.safetensors"
            ]
        after = {p: checksums(test_inventory, host, p) for p in (BODY_PATH, DRAFTER_PATH)}
        assert after == before, f"{variant} changed the staged weights"
        assert leftovers(test_inventory, host) == [], variant


def test_disk_too_small_is_refused_before_copying(
    test_inventory: Inventory, lab_fault: Callable[..., AbstractContextManager[fleetlab.LabNode]]
) -> None:
    host = "spark-02"
    with lab_fault(host, disk_gb=1):
        r = stage(test_inventory, "t-good", limit=host)
        h = r.hosts[host]
        assert not r.ok and "not enough disk" in h.message and "headroom" in h.message, h.message
        assert h.bytes_copied == 0 and all(s.state == "not staged" for s in h.sets)
        probe = ssh.run(
            test_inventory.host(host), "ls -A /opt/fleetctl-test 2>/dev/null | wc -l", timeout=10
        )
        assert probe.stdout.strip() == "0", "bytes moved before the disk check"
    ssh.close_all()


def _ansible_pids(run_id: str) -> list[int]:
    """ansible-playbook processes of one run (their ANSIBLE_CONFIG lies in the run's artifacts)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if b"ansible-playbook" in cmd and run_id.encode() in env:
            out.append(int(d.name))
    return out


def test_staging_killed_halfway_leaves_the_old_weights_and_the_next_run_completes(
    test_inventory: Inventory,
) -> None:
    hosts = "spark-02,spark-03"
    first = stage(test_inventory, "t-good", limit=hosts)
    assert first.ok, [h.message for h in first.hosts.values()]
    before = {h: checksums(test_inventory, h, BODY_PATH) for h in hosts.split(",")}
    killed = threading.Event()
    run_id = "stage-killtest-" + os.urandom(3).hex()

    def killer(ev: Event) -> None:
        # Kill ansible-playbook (its whole process group) as the seed starts downloading the new
        # set.
        if (
            killed.is_set()
            or ev.phase != "task"
            or not ev.message.startswith("Download the weight sets")
        ):
            return
        for pid in _ansible_pids(run_id):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.set()

    r = stage(test_inventory, "t-good2", limit=hosts, progress=killer, run_id=run_id)
    assert killed.is_set(), "the fetch task never started"
    assert not r.ok
    for h in hosts.split(","):
        assert checksums(test_inventory, h, BODY_PATH) == before[h], (
            f"{h}: old weights changed by a killed run"
        )
        assert marker(test_inventory, h, BODY_PATH)["revision"] == "good"
    again = stage(test_inventory, "t-good2", limit=hosts)
    assert again.ok, [h.message for h in again.hosts.values()]
    for h in hosts.split(","):
        assert marker(test_inventory, h, BODY_PATH)["revision"] == "good2"
        assert leftovers(test_inventory, h) == [], (
            f"{h}: a killed run's staging directory was left behind"
        )


def test_the_copy_key_reads_the_weights_only_and_a_killed_runs_key_is_removed(
    test_inventory: Inventory,
) -> None:
    """The seed-to-host key can run nothing but a read-only rsync under the weights' directory."""
    hosts = "spark-02,spark-03"
    assert stage(test_inventory, "t-good2", limit=hosts).ok
    run_id = "stage-keytest-" + os.urandom(3).hex()
    state = paths.state_dir(test_inventory.path)
    key: list[str] = []

    def killer(ev: Event) -> None:
        # Killed as the receiver starts copying: the seed accepts the run's key now.
        if key or ev.phase != "task" or not ev.message.startswith("Copy each weight set from"):
            return
        key.extend(p.read_text() for p in state.glob(f"runs/{run_id}/{KEY_DIR}/*/id_ed25519"))
        for pid in _ansible_pids(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)

    r = stage(test_inventory, "t-good", limit=hosts, progress=killer, run_id=run_id)
    assert key and not r.ok and r.seed is not None
    seed = test_inventory.host(r.seed)
    receiver = test_inventory.host(next(h for h in hosts.split(",") if h != r.seed))
    assert not list(state.glob(f"runs/{run_id}/{KEY_DIR}")), (
        "the controller's copy of the key is gone"
    )
    line = ssh.run(
        seed, f"grep ' fleetctl-stage-{run_id}$' ~/.ssh/authorized_keys", timeout=10
    ).stdout
    assert (
        line.startswith('command="')
        and f' -ro /opt/fleetctl-test",restrict,from="{receiver.address}" ' in line
    )

    # As the receiver's login (not root), from its home: the key's restrictions are what is tested.
    ssh.put_text(receiver, "copykey", key[0], mode=0o600)
    opts = "-i copykey -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
    to = f"{seed.user}@{seed.address}"
    staging = f"body.staging-{run_id}"
    try:
        shell = ssh.run(receiver, f"ssh {opts} {to} id", timeout=30)
        assert shell.rc != 0 and "uid=" not in shell.stdout and "rrsync" in shell.stderr, shell
        read = ssh.run(
            receiver, f"rsync -a -e 'ssh {opts}' {to}:{staging}/ copykey-read/", timeout=60
        )
        assert read.ok, read.stderr
        write = ssh.run(
            receiver, f"rsync -a -e 'ssh {opts}' /etc/hostname {to}:{staging}/", timeout=60
        )
        assert not write.ok and "read-only" in write.stderr, write
        escape = ssh.run(
            receiver, f"rsync -a -e 'ssh {opts}' {to}:../../etc/ copykey-esc/", timeout=60
        )
        assert not escape.ok, escape
    finally:
        ssh.run(receiver, "rm -rf copykey copykey-read copykey-esc", timeout=10)
    # The next run removes the killed run's line (and its own when it ends).
    assert stage(test_inventory, "t-good", limit=hosts).ok
    left = ssh.run(
        seed, "grep -c fleetctl-stage- ~/.ssh/authorized_keys || true", timeout=10
    ).stdout.strip()
    assert left == "0"

