"""The image tree on the lab (fleetctl.rollout.imagetree): a fresh image reaches every node while
the lab registry serves its new layer to one node only, the others being served by relays on nodes
that already pulled; each node then holds the image under the deploy reference (its digest checked
by Docker), and no relay is left behind. A node whose relay cannot start pulls from the registry
itself and serves no one.

Real components: SSH through the bastion as the admin user, each node's Docker engine, the relay
image the lab pushes (distribution), and the lab registry's own access log as the count of who read
what.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl import inventory, lab, registry, ssh
from fleetctl.inventory import Host
from fleetctl.lab import layout
from fleetctl.progress import Event
from fleetctl.rollout import host as remote
from fleetctl.rollout import imagetree

pytestmark = pytest.mark.lab

PORT = 5555


@pytest.fixture
def fresh_image(tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    """A tag no node has, with a layer of its own (16 MiB of random bytes): (pull reference, that
    layer's digest,
    its size as pulled)."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "blob.bin").write_bytes(os.urandom(16 << 20))
    tag = f"tree-{os.urandom(4).hex()}"
    lab.add_image(tag, from_dir=app, cmd=["/bin/true"])
    inv = inventory.load(None)
    mirrors = {str(k): str(v) for k, v in (inv.vars.get("fleetctl_registry_mirrors") or {}).items()}
    image = f"ghcr.io/{lab.images.VLLM_REPOSITORY}"
    digest = registry.resolve(image, tag, mirrors).digest
    layers = registry.layer_sizes(image, digest, mirrors)[0]
    ref = registry.pull_ref(image, digest, mirrors)
    # Its own layer: the random bytes (incompressible, so ~16 MiB as pulled); every other layer is
    # shared.
    own = [d for d, size in layers.items() if 16 << 20 <= size < 18 << 20]
    assert len(own) == 1, layers
    yield ref, own[0], layers[own[0]]
    outs = ssh.fan_out(
        list(inv.hosts.values()),
        lambda h: ssh.docker(
            h,
            f"docker image rm -f {ref} "
            f"$(docker images -q --filter reference='*/{lab.images.VLLM_REPOSITORY}:{tag}') "
            ">/dev/null 2>&1; true",
            timeout=60,
        ),
        timeout=90,
    )
    del outs
    ssh.close_all()


def _tree(
    hosts: list[Host], ref: str, events: list[Event]
) -> dict[str, ssh.Outcome[imagetree.Pulled]]:
    inv = inventory.load(None)
    mirrors = {str(k): str(v) for k, v in (inv.vars.get("fleetctl_registry_mirrors") or {}).items()}
    relay = registry.pull_ref(
        "docker.io/library/registry",
        registry.resolve("docker.io/library/registry", "2", mirrors).digest,
        mirrors,
    )
    origin = registry.endpoint(
        registry.ImageName.parse(ref).registry,
        {registry.ImageName.parse(ref).registry: registry.ImageName.parse(ref).registry},
    ).base
    cfg = imagetree.TreeConfig(min_hosts=2, fanout=2, port=PORT)

    def emit(kind: str, msg: str, host: str) -> None:
        events.append(Event(kind, msg, host))

    tree = imagetree.Tree(cfg, imagetree.Source(ref, origin, relay),
                          imagetree.Hands(ops=remote.SshHostOps,
                                          pull=lambda h, r: remote.pull(h, r),
                                          direct=lambda h, r: remote.pull(h, r), emit=emit))
    return tree.run(hosts)


def _registry_reads(blob: str) -> tuple[set[str], int]:
    """Who the lab registry's log shows fetching ``blob`` (GET .../blobs/<digest>), and the bytes
    it sent them."""
    log = layout.current().log_dir / "registry.log"
    pat = re.compile(
        r"^(\S+) .*\"GET /v2/\S+/blobs/" + re.escape(blob) + r" HTTP/1\.1\" 200 (\d+) "
    )
    hits = [m for line in log.read_text(errors="replace").splitlines() if (m := pat.match(line))]
    return {m.group(1) for m in hits}, sum(int(m.group(2)) for m in hits)


def _relays_left(hosts: list[Host]) -> dict[str, str]:
    outs = ssh.fan_out(
        hosts,
        lambda h: ssh.docker(
            h, f"docker ps -aq --filter name=^{imagetree.RELAY_NAME}$", timeout=30
        ).stdout.strip(),
        timeout=60,
    )
    return {n: str(o.value or o.error) for n, o in outs.items() if o.value or o.error}


def _has(h: Host, ref: str) -> list[str]:
    r = ssh.docker(
        h, ["docker", "image", "inspect", "-f", "{{json .RepoDigests}}", ref], timeout=30
    )
    return [] if r.rc != 0 else list(json.loads(r.stdout))


def test_a_fresh_image_is_read_from_the_registry_once_and_relayed_to_the_other_nodes(
        fresh_image: tuple[str, str, int]) -> None:
    ref, blob, size = fresh_image
    inv = inventory.load(None)
    hosts = list(inv.hosts.values())
    assert len(hosts) >= 4, "the lab has 4 nodes"
    events: list[Event] = []
    got = _tree(hosts, ref, events)
    assert all(o.ok for o in got.values()), got
    via = {n: o.value.via for n, o in got.items() if o.value is not None}
    seed = hosts[0].name
    # The seed's relay read the registry; two nodes came from the seed, the fourth from one of
    # those two.
    assert via[seed] == "registry", via
    second = [n for n in via if via[n] == seed]
    assert len(second) == 2, via
    assert all(via[n] in second for n in via if n != seed and n not in second), via
    # The new layer left the registry for the seed only (its relay's address, not the other
    # nodes'), and once: the relay reads what it stores once (a pull-through registry streaming to
    # a client reads twice).
    who, sent = _registry_reads(blob)
    assert who == {hosts[0].address} and size <= sent < 1.5 * size, (who, sent, size)
    # Every node holds the image under the deploy reference, the digest Docker checked.
    for h in hosts:
        assert ref in _has(h, ref), (h.name, _has(h, ref))
    assert not _relays_left(hosts)
    assert any(e.phase == "pulled" and "relay" in e.message for e in events), events


def test_a_node_whose_relay_cannot_start_pulls_from_the_registry_and_serves_no_one(
        fresh_image: tuple[str, str, int]) -> None:
    ref, blob, _size = fresh_image
    inv = inventory.load(None)
    hosts = list(inv.hosts.values())
    busy = hosts[1]
    # Something else holds the relay's port on one of the seed's first receivers: its relay cannot
    # bind.
    hold = ssh.docker(busy, "nohup python3 -c 'import socket,time; s=socket.socket(); "
                            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                            f"s.bind((\"0.0.0.0\", {PORT})); s.listen(); time.sleep(300)' "
                            ">/dev/null 2>&1 & echo $!", timeout=30)
    pid = hold.stdout.strip()
    try:
        events: list[Event] = []
        got = _tree(hosts, ref, events)
    finally:
        ssh.docker(busy, f"kill {pid} 2>/dev/null; true", timeout=30)
    assert all(o.ok for o in got.values()), got
    pulled = {n: o.value for n, o in got.items() if o.value is not None}
    assert pulled[busy.name].via is None and "relay" in (pulled[busy.name].fallback or ""), pulled[
        busy.name
    ]
    assert all(p.via != busy.name for p in pulled.values()), pulled
    assert _registry_reads(blob)[0] == {hosts[0].address, busy.address}, _registry_reads(blob)
    for h in hosts:
        assert ref in _has(h, ref), h.name
    assert not _relays_left(hosts)
