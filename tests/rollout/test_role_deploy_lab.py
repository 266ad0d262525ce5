"""The rollout's deploy step through the vllm_serve role (the default) and over SSH
(``fleetctl_deploy_via: ssh``).

Both on the lab's spark-01, each checked against the node's real container
(``docker inspect`` over SSH): the same container the controller's own
``docker run`` renders (labels, command, entrypoint, mounts, env names), the
previous one kept as ``vllm.prev``; and where the role ran, ansible-runner's
job event of the ``vllm_container`` task for that host under the rollout's
run directory.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl import inventory, registry, ssh, warmcache
from fleetctl.rollout import host as remote
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options
from fleetctl.state import records as fleet_records
from tests.plugins.serving import BASE_TAG, LAB_SOAK, serve

pytestmark = pytest.mark.lab

NEW = "v0.24.0"
NODE = "spark-01"


def _inspect(h: inventory.Host, name: str) -> dict[str, Any] | None:
    r = ssh.docker(h, f"docker inspect {name} --format '{{{{json .}}}}'", timeout=30)
    return json.loads(r.stdout) if r.rc == 0 else None


def _digest(inv: inventory.Inventory, tag: str) -> str:
    eng = Engine(inv)
    try:
        return registry.resolve(eng.recipe().image, tag, eng.mirrors).digest
    finally:
        eng.close()


def _rollout_on_node(
    inv: inventory.Inventory, state: Path
) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    """Roll NEW out to NODE; the rollout id, the node's container and its .prev as docker shows
    them."""
    eng = Engine(inv, state_dir=state)
    try:
        r = eng.rollout(Options(tag=NEW, limit=NODE, soak=LAB_SOAK))
        recipe = eng.recipe()
    finally:
        eng.close()
        ssh.close_all()
    assert r.status == fleet_records.COMPLETED, r.error
    h = inv.host(NODE)
    c = _inspect(h, remote.container_name(h))
    assert c is not None and c["State"]["Running"]
    # What the controller's own `docker run` sets: the role must render the very same container.
    ref = registry.pull_ref(recipe.image, r.digest or "", inv.vars.get("fleetctl_registry_mirrors"))
    # The lab's nodes report a GB10, so the rollout mounted the caches under that key.
    key = (
        warmcache.cache_key(r.digest or "", remote.fingerprint(recipe), remote.GB10)
        if recipe.compile_cache
        else None
    )
    argv = remote.run_argv(
        h,
        remote.StartRequest(recipe, ref, r.tag or "", r.digest or "", r.id or "", cache_key=key),
        remote.container_name(h),
    )
    labels = dict(v.split("=", 1) for k, v in itertools.pairwise(argv) if k == "--label")
    assert {k: v for k, v in c["Config"]["Labels"].items() if k.startswith("fleetctl.")} == labels
    assert c["Config"]["Image"] == ref and c["Config"]["Entrypoint"] == ["vllm"]
    assert c["Config"]["Cmd"] == argv[argv.index(ref) + 1:]
    assert sorted(c["HostConfig"]["Binds"]) == sorted(
        v for k, v in itertools.pairwise(argv) if k == "-v"
    )
    prev = _inspect(h, remote.container_name(h) + remote.PREV_SUFFIX)
    return r.id or "", c, prev


def test_the_rollout_deploys_through_the_role_by_default(serving: Any, tmp_path: Path) -> None:
    del serving
    inv = inventory.load(None)
    assert "fleetctl_deploy_via" not in inv.host(NODE).vars
    try:
        rid, _c, prev = _rollout_on_node(inv, tmp_path / "state")
        assert prev is not None and prev["Config"]["Labels"]["fleetctl.digest"] == _digest(
            inv, BASE_TAG
        )
        events = [json.loads(f.read_text()) for f in (tmp_path / "state" / "runs" / rid).glob(
            "ansible/deploy-*/job_events/*.json")]
        ran = [e["event_data"] for e in events if e.get("event") == "runner_on_ok"
               and e["event_data"].get("host") == NODE
               and str(e["event_data"].get("resolved_action", "")).endswith("vllm_container")]
        assert len(ran) == 1, (
            "no vllm_container task ran for the node in the rollout's ansible-runner events"
        )
        res = ran[0]["res"]
        assert res["changed"] and res["container"]["rollout"] == rid
        assert "stop vllm and keep it as vllm.prev" in res["actions"]
    finally:
        serve(BASE_TAG)
        ssh.close_all()


def test_deploy_via_ssh_keeps_the_controllers_own_commands(serving: Any, tmp_path: Path) -> None:
    del serving
    src = inventory.load(None).path.parent
    d = tmp_path / "inventory"
    shutil.copytree(src, d, symlinks=True)
    (d / "host_vars").mkdir(exist_ok=True)
    (d / "host_vars" / f"{NODE}.yml").write_text(yaml.safe_dump({"fleetctl_deploy_via": "ssh"}))
    inv = inventory.load(d / "hosts.yml")
    assert inv.host(NODE).vars["fleetctl_deploy_via"] == "ssh"
    try:
        rid, _c, prev = _rollout_on_node(inv, tmp_path / "state")
        assert prev is not None and prev["Config"]["Labels"]["fleetctl.digest"] == _digest(
            inv, BASE_TAG
        )
        assert not list((tmp_path / "state" / "runs" / rid).glob("ansible")), (
            "the ssh path ran a playbook"
        )
    finally:
        serve(BASE_TAG)
        ssh.close_all()
