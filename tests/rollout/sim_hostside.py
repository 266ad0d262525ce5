"""The simulated fleet's operations besides the serving container's: the rest of ``SimOps``.

What :class:`~tests.rollout.sim.SimOps` does for the operations ``SshHostOps`` takes from
``fleetctl.rollout.host_ssh``: the image probe and the image tree's relays (pull-through registries
that read another host's relay or the registry, recorded in ``SimFleet.relay_reads``), the warm
start's compile caches (per host, checked against their manifests as the cache script checks
them), a unit member's bandwidth probe, the host's state file and the login's rights.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Unit
from fleetctl.recipes import Recipe

if TYPE_CHECKING:
    from tests.rollout.sim import SimFleet, SimHost


@dataclass
class Relay:
    """An image relay (a pull-through registry) on a simulated host: its upstream, and the image
    digests its store holds."""

    upstream: str
    port: int
    holds: set[str] = field(default_factory=set)


class SimHostSide:
    """The operations above on a simulated host (each an atomic round trip, as one SSH command)."""

    host: Host
    fleet: SimFleet

    @property
    def _h(self) -> SimHost:
        raise NotImplementedError

    def _done(self, op: str) -> None:
        raise NotImplementedError

    def check_access(self) -> None:
        with self.fleet.mu:
            self.fleet.alive()
            self._h  # noqa: B018 - reaching the host is the check: the login has every right

    def has_image(self, ref: str) -> bool:
        with self.fleet.mu:
            self.fleet.alive()
            return ref.rsplit("@", 1)[-1] in self._h.images

    # the image tree's relay: a pull-through registry reading another host's relay or the registry
    def start_relay(self, relay_image_ref: str, upstream: str, port: int) -> None:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            self._drop_relay(h)
            if h.name in self.fleet.relay_fails:
                raise FleetError(f"its image relay did not start: port {port} is taken",
                                 host=h.name)
            h.relay = Relay(upstream, port)
            self.fleet.relays[(self.host.address, port)] = h.name
            self._done("relay-start")

    def fill_relay(self, pull_ref: str, port: int) -> None:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            digest = pull_ref.rsplit("@", 1)[-1]
            if h.relay is None or h.relay.port != port:
                raise FleetError("its image relay could not fetch the image: nothing on port "
                                 f"{port}", host=h.name)
            up = h.relay.upstream.removeprefix("http://").removeprefix("https://")
            addr, _, p = up.rpartition(":")
            source = self.fleet.relays.get((addr, int(p))) if p.isdigit() else None
            if source is not None:
                src = self.fleet.hosts[source]
                if src.ssh_down or src.relay is None or digest not in src.relay.holds:
                    raise FleetError("its image relay could not fetch the image: "
                                     f"{source}'s relay does not serve it", host=h.name)
            elif digest not in self.fleet.behaviour:  # the registry's images: the tags' digests
                raise FleetError("its image relay could not fetch the image: not in the registry",
                                 host=h.name)
            h.relay.holds.add(digest)
            self.fleet.relay_reads.append((h.name, source or "registry"))
            self._done("relay-fill")

    def remove_relay(self) -> None:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            if h.relay is not None:
                self._drop_relay(h)
                self._done("relay-remove")

    def _drop_relay(self, h: SimHost) -> None:
        if h.relay is not None:
            self.fleet.relays.pop((self.host.address, h.relay.port), None)
            h.relay = None

    # the warm start's compile caches, kept per host as the cache script keeps them on disk
    def _cache_image(self, h: SimHost, ref: str) -> None:
        if ref.rsplit("@", 1)[-1] not in h.images and "@" in ref:
            raise FleetError(f"docker run: no image {ref}", host=h.name)

    def export_cache(self, recipe: Recipe, ref: str, key: str, max_bytes: int) -> str:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            self._cache_image(h, ref)
            files = h.caches.get(f"{recipe.name}/{key}")
            if files is None:
                return json.dumps({"files": {}, "why": "no cache directory"}) + "\n"
            total = sum(len(b) for b in files.values())
            if total > max_bytes:
                why = f"{total} bytes, over the {max_bytes} bytes"
                return json.dumps({"files": {}, "why": why}) + "\n"
            sums = {r: [len(b), hashlib.sha256(b).hexdigest()] for r, b in sorted(files.items())}
            man = {"key": key, "bytes": total, "files": sums}
            payload = base64.b64encode(json.dumps({r: b.hex() for r, b in files.items()}).encode())
            return json.dumps(man) + "\n" + payload.decode() + "\n"

    @staticmethod
    def _differs(files: Mapping[str, bytes], man: Mapping[str, Any], key: str) -> str | None:
        if man.get("key") != key:
            return f"the cache was made for key {man.get('key')}, not {key}"
        seen = {r: [len(b), hashlib.sha256(b).hexdigest()] for r, b in files.items()}
        if seen != {r: list(v) for r, v in man["files"].items()}:
            return "files differ from the checksums"
        return None

    def verify_cache(self, recipe: Recipe, ref: str, key: str) -> str:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            self._cache_image(h, ref)
            d = f"{recipe.name}/{key}"
            if d not in h.manifests:
                return json.dumps({"ok": False, "why": "no manifest: FileNotFoundError"}) + "\n"
            why = self._differs(h.caches.get(d, {}), h.manifests[d], key)
            return json.dumps({"ok": why is None, "why": why}) + "\n"

    def import_cache(self, recipe: Recipe, ref: str, key: str, exported: str) -> str:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            self._cache_image(h, ref)
            man_line, _, payload = exported.partition("\n")
            man = json.loads(man_line)
            files = {r: bytes.fromhex(x) for r, x in json.loads(base64.b64decode(payload)).items()}
            why = self._differs(files, man, key)
            if why is not None:
                return json.dumps({"ok": False, "why": f"ValueError: {why}"}) + "\n"
            h.caches[f"{recipe.name}/{key}"] = files
            h.manifests[f"{recipe.name}/{key}"] = man
            self._done("cache-import")
            return json.dumps({"ok": True, "files": len(files), "bytes": man["bytes"]}) + "\n"

    def bandwidth_probe(self, unit: Unit, recipe: Recipe, ref: str, timeout: float) -> str:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            if ref.rsplit("@", 1)[-1] not in h.images:
                raise FleetError(f"Unable to find image '{ref}' locally", host=h.name)
            self.fleet.probes.append((h.name, unit.name, ref))
            if h.name != unit.head:
                return ""
            bw = self.fleet.busbw_gbs
            return ("# probe: TCP ring (simulated)\n"
                    f"   1048576    262144  float  sum  -1  1000.0  {bw:.2f}  {bw:.2f}  0"
                    f"  1000.0  {bw:.2f}  {bw:.2f}  0\n# Avg bus bandwidth    : {bw:.2f}\n")

    # the host's state file: no kill point (the harness's points are the containers' and ledger's)
    def read_state(self) -> str:
        with self.fleet.mu:
            self.fleet.alive()
            return self._h.state

    def swap_state(self, expect: str, text: str) -> bool:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            if h.state != expect:
                return False
            h.state = text
            return True

    def staged_bytes(self, paths: Sequence[str]) -> int:
        with self.fleet.mu:
            self.fleet.alive()
            self._h  # noqa: B018 - nothing is staged on a simulated host
            return 0
