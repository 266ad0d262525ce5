"""The prefetch: a rollout's image pulled on every target before any host is stopped, straight from
the registry (or its mirror) in parallel, or through the image tree (:mod:`.imagetree`) when enough
hosts need a large image; and one host's pull with its bytes reported (:mod:`.pulls`), which a
rollback's pull uses too."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from fleetctl import registry, ssh
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.rollout import host as remote
from fleetctl.rollout import imagetree, pulls
from fleetctl.rollout.run import Run
from fleetctl.rollout.session import Session, StopRollout
from fleetctl.state import records as fleet_records

#: Seconds between two ``pull`` events of one host at least (docker prints a few lines per layer).
PULL_EVENT_INTERVAL = 1.0


class Prefetch:
    """Pulls of a rollout's image: every target's before the first stop, and one host's."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self._layers: dict[str, list[dict[str, int]]] = {}
        self._layers_lock = threading.Lock()

    def platform_layers(self, image: str, digest: str) -> list[dict[str, int]]:
        """``image@digest``'s layer sizes per platform, asked of the registry once per digest (a
        registry that cannot say: none, and a ``pull`` event saying so)."""
        with self._layers_lock:
            if digest not in self._layers:
                try:
                    self._layers[digest] = self.s.layer_sizes(image, digest, self.s.mirrors)
                except (FleetError, OSError, ValueError) as e:
                    self.s.emit("pull", f"layer sizes unknown ({e}): counting layers only")
                    self._layers[digest] = []
            return self._layers[digest]

    def pull(self, ops: remote.ServingOps, image: str, ref: str) -> float:
        """Pull ``ref`` on ``ops``'s host, reporting ``pull`` events with the bytes done of the
        image's (:mod:`.pulls`); seconds taken. The layer sizes are asked of the registry once per
        image; a registry that cannot say leaves the layers counted, never the pull failed."""
        meter = pulls.PullMeter(self.platform_layers(image, ref.rsplit("@", 1)[-1]))
        name = ops.host.name
        last = [0.0]

        def on_line(line: str) -> None:
            # A line per layer and state: at most one event a second per host, and the last layer's.
            if meter.feed(line):
                f = meter.figures()
                now = time.monotonic()
                if now - last[0] >= PULL_EVENT_INTERVAL or f["layers"] == f["layers_total"]:
                    last[0] = now
                    self.s.emit("pull", meter.message(), name, **f)

        return ops.pull(ref, on_line)

    def run(self, run: Run, hosts: Sequence[Host], ref: str, image: str) -> dict[str, float]:
        """Pull the image on every target before anything is stopped; seconds per host. Enough hosts
        needing it: through a tree of relays (:mod:`.imagetree`), else each from the registry in
        parallel."""
        if not hosts:
            return {}
        run.ledger.note(run.id, "prefetch", ref)
        for h in hosts:
            run.emit("pull", ref.rsplit("@", 1)[0].rsplit("/", 1)[-1], h.name)
        tree = self._image_tree(hosts, ref, image)
        if tree is None:
            imagetree.sweep_relays(hosts, self.s.ops)  # relays a killed prefetch left
            outs = self._direct_pulls(run, hosts, ref, image)
        else:
            tree_hosts, present = tree
            outs = {n: ssh.Outcome(n, value=0.0) for n in present}
            for n in present:
                run.pull_via[n] = "present"
                run.emit("pulled", "already here", n)
            if tree_hosts:
                outs.update(self._tree_pull(run, tree_hosts, ref, image))
        bad = {n: o.error for n, o in outs.items() if o.error is not None}
        if bad:
            why = "; ".join(f"{n}: {e.cause if e else '?'}" for n, e in bad.items())
            raise StopRollout(fleet_records.FAILED,
                              f"prefetch failed before any host was changed: {why}")
        return {n: float(o.value or 0.0) for n, o in outs.items()}

    def _direct_pulls(self, run: Run, hosts: Sequence[Host], ref: str,
                      image: str) -> dict[str, ssh.Outcome[float]]:
        """Every host pulls ``ref`` from the registry (or its mirror), in parallel; seconds per
        host."""
        outs = ssh.fan_out(hosts, lambda h: self.pull(self.s.ops(h), image, ref), timeout=None)
        for n, o in outs.items():
            if o.error is None:
                run.emit("pulled", f"pulled in {o.value:.1f}s", n)
                run.pull_via[n] = "registry"
        return outs

    def _image_tree(self, hosts: Sequence[Host], ref: str, image: str) -> tuple[list[Host],
                                                                                list[str]] | None:
        """The hosts the tree is to serve and those already holding the image, or None: every host
        pulls from the registry (the tree off, a simulated fleet, fewer hosts than its ``min_hosts``
        need it, or an image smaller than its ``min_mb``; an image whose size the registry does not
        say is taken as large)."""
        cfg = self.s.image_tree
        if not cfg.enabled or len(hosts) < cfg.min_hosts:
            return None
        sizes = self.platform_layers(image, ref.rsplit("@", 1)[-1])
        if sizes and max(sum(p.values()) for p in sizes) < cfg.min_mb * 1_000_000:
            return None
        # A relay a killed controller left behind goes first (the fleet's lock: no other prefetch
        # runs).
        has = ssh.fan_out(hosts, lambda h: imagetree.holds_image(self.s.ops(h), ref), timeout=90)
        present = [n for n, o in has.items() if o.value]
        need = [h for h in hosts if not has[h.name].value]
        if len(need) < cfg.min_hosts:
            return None
        return need, present

    def _tree_pull(self, run: Run, hosts: Sequence[Host], ref: str,
                   image: str) -> dict[str, ssh.Outcome[float]]:
        """Pull ``ref`` on ``hosts`` through the image tree; the ledger notes how many hosts the
        registry served."""
        cfg = self.s.image_tree
        relay = registry.ImageName.parse(cfg.relay_image)
        tag = cfg.relay_image.rsplit("/", 1)[-1].partition(":")[2] or "latest"
        mirrors = self.s.mirrors
        origin = registry.endpoint(registry.ImageName.parse(image).registry, mirrors).base
        try:
            relay_ref = registry.pull_ref(relay.ref,
                                          self.s.resolve_image(relay.ref, tag, mirrors).digest,
                                          mirrors)
        except FleetError as e:
            run.emit("pull",
                     f"image tree off: its relay image {cfg.relay_image} is not found ({e.cause})")
            return self._direct_pulls(run, hosts, ref, image)
        tree = imagetree.Tree(cfg, imagetree.Source(ref, origin, relay_ref), imagetree.Hands(
            ops=self.s.ops, pull=lambda h, r: self.pull(self.s.ops(h), image, r),
            direct=lambda h, r: self.s.ops(h).pull(r),
            emit=lambda kind, msg, host: run.emit(kind, msg, host)))
        got = tree.run(hosts)
        out: dict[str, ssh.Outcome[float]] = {}
        direct: list[str] = []
        via: dict[str, str] = {}
        for n, o in got.items():
            if o.value is not None:
                via[n] = "registry" if o.value.via in (None, "registry") else f"relay:{o.value.via}"
                if o.value.via is None:
                    direct.append(n)
            out[n] = ssh.Outcome(n, value=o.value.seconds if o.value else None, error=o.error)
        run.pull_via.update(via)
        run.ledger.note(run.id, "prefetch", f"image tree: {len(hosts)} host(s), "
                         f"{sum(v.startswith('relay:') for v in via.values())} through relays, "
                         f"layers read from the registry by {list(via.values()).count('registry')}"
                         + (f" (direct: {', '.join(sorted(direct))})" if direct else ""))
        return out
