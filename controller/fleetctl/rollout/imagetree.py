"""A rollout's image reaches the fleet through a tree of pull-through relays (decision 0018).

Without it every host pulls the whole image from the fleet's registry: N hosts, N copies through
the registry's uplink. With it (``min_hosts`` or more hosts lacking an image of ``min_mb`` or more)
the registry is read once:

- The seed runs a relay: a registry in pull-through mode (``distribution``'s ``proxy.remoteurl``)
  whose upstream is the fleet's registry (or its mirror), in a container named
  :data:`RELAY_NAME` on the host network. The seed pulls the image *through its own relay*
  (``127.0.0.1:PORT/<repository>@<digest>``: Docker talks plain http to a loopback registry
  without any daemon setting), which fetches every layer from the registry once and keeps it.
- Each round, every host that holds the image serves at most ``fanout`` new hosts: a receiver
  starts its own relay with the source's relay as upstream (``http://<source>:PORT``), pulls
  through it, and becomes a source. N hosts take about ``log_(fanout+1) N`` rounds.
- Before Docker pulls through it, a relay is filled with the layers its host lacks, one request
  each that the host hangs up on (:func:`fill_script`): a pull-through registry streaming a blob
  it lacks to a client reads it twice from upstream, once for the client and once for its store.
- Then every host pulls the deploy reference itself (``<registry>/<repository>@<digest>``):
  the layers are there, so only the manifest and config are read from the registry, and the
  image carries the repo digest the deploy runs by. Docker checks every layer and the manifest
  against the digest on each pull, so a relay cannot hand over other bytes.
- Nothing here fails a host on its own: a host whose relay or relayed pull fails pulls directly
  from the registry (as without the tree) and serves no one; only a failed direct pull fails it.
  Every relay is removed at the end (``docker rm -f``, its cached layers with it).

Where it runs: a relay listens on ``PORT`` (default 5555) on two addresses only: 127.0.0.1,
which its own host pulls through (Docker talks plain http to a loopback registry only), and
the host's fleet address (``Host.address``: its ``ansible_host``, a name resolved on the host),
which the hosts it serves read; never on the host's other networks. Its life is bounded on the
host itself: it stops serving :data:`RELAY_LIFETIME` after it started, even when the controller
was SIGKILLed, and the next prefetch, ``rollback`` and ``rollout abort`` remove what is left
(:func:`sweep_relays`, :func:`holds_image`). What it serves is the image the hosts are about to
run, pulled anonymously. A registry that wants credentials is read by the seed's relay
anonymously: it answers 401, the seed pulls directly, and the tree stands down (give such a
fleet a local mirror, ``fleetctl_registry_mirrors``, and the relays read the mirror).
"""

from __future__ import annotations

import functools
import ipaddress
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from fleetctl import registry, ssh
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.urls import http_url

#: The relay container's name on every host (one relay per host at a time).
RELAY_NAME = "fleetctl-image-relay"
#: The inventory's settings (group ``all``): ``fleetctl_image_tree: {min_hosts, min_mb, fanout,
#: port, relay_image}`` or ``false`` to pull every host from the registry.
VAR = "fleetctl_image_tree"
DEFAULTS: Mapping[str, object] = {"min_hosts": 4, "min_mb": 512, "fanout": 2, "port": 5555,
                                   "relay_image": "docker.io/library/registry:2"}
#: Seconds a relay has to answer ``/v2/`` once started.
RELAY_READY_TIMEOUT = 30.0
#: Seconds of one pull through a relay (a Spark image is ~20 GB; the slow link is the limit).
PULL_TIMEOUT = 3600.0
#: Seconds a relay serves at most: its container stops itself then, controller or not (a relay
#: fills in at most PULL_TIMEOUT, then serves the rounds after it).
RELAY_LIFETIME = 2 * PULL_TIMEOUT


@dataclass(frozen=True)
class TreeConfig:
    """The tree's settings from the inventory (:data:`VAR`)."""

    enabled: bool = True
    #: Fewer hosts needing the image than this: every host pulls from the registry (a tree buys
    #: nothing).
    min_hosts: int = 4
    #: A smaller image (MB as pulled, its largest platform) goes straight from the registry: each
    #: round of the tree costs a couple of seconds (relays, SSH) whatever it moves.
    min_mb: int = 512
    #: Hosts each source serves per round.
    fanout: int = 2
    port: int = 5555
    #: The relay's image (a ``distribution`` registry), pulled through the fleet's mirrors like any
    #: image.
    relay_image: str = "docker.io/library/registry:2"


def config(value: object, where: str) -> TreeConfig:
    """:class:`TreeConfig` from the inventory's ``fleetctl_image_tree`` (None: the defaults)."""
    if value is None or value is True:
        return TreeConfig()
    if value is False:
        return TreeConfig(enabled=False)
    if not isinstance(value, Mapping):
        raise FleetError(
            f"{VAR} in {where} must be false or a mapping of {', '.join(DEFAULTS)}, not {value!r}",
            fix=f"write e.g. `{VAR}: {{min_hosts: 8, fanout: 2}}`, or `{VAR}: false`",
        )
    unknown = sorted(set(map(str, value)) - set(DEFAULTS))
    if unknown:
        raise FleetError(f"{VAR} in {where} has unknown key(s) {', '.join(unknown)}",
                         fix=f"use only {', '.join(DEFAULTS)}")
    merged = {**DEFAULTS, **{str(k): v for k, v in value.items()}}
    ints = {
        "min_hosts": (1, 100_000),
        "min_mb": (0, 10_000_000),
        "fanout": (1, 16),
        "port": (1024, 65535),
    }
    for key, (lo, hi) in ints.items():
        v = merged[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise FleetError(
                f"{VAR}.{key} in {where} must be a whole number from {lo} to {hi}, not {v!r}",
                fix=f"set {VAR}.{key} to a number in that range",
            )
    img = merged["relay_image"]
    if not isinstance(img, str) or not img or any(c.isspace() for c in img) or "@" in img:
        raise FleetError(
            f"{VAR}.relay_image in {where} must be an image name with an optional tag, not {img!r}",
            fix="e.g. docker.io/library/registry:2 (a distribution registry the hosts can pull)",
        )
    return TreeConfig(True, int(merged["min_hosts"]), int(merged["min_mb"]),
                      int(merged["fanout"]), int(merged["port"]), img)


def assign(sources: Sequence[str], receivers: Sequence[str], fanout: int) -> dict[str, str]:
    """This round's receiver -> source: each source serves at most ``fanout`` receivers, spread
    evenly, the newest sources first (the seed, which also faced the registry, serves least).
    Receivers beyond
    ``len(sources) * fanout`` wait for the next round."""
    out: dict[str, str] = {}
    newest = list(reversed(sources))
    for i, r in enumerate(receivers[: len(sources) * fanout]):
        out[r] = newest[i % len(newest)]
    return out


def rounds_for(n: int, fanout: int) -> int:
    """Rounds a tree of ``n`` hosts takes with nothing failing (the seed's own pull is round 0)."""
    have, rounds = 1, 0
    while have < n:
        have += have * fanout
        rounds += 1
    return rounds


@dataclass(frozen=True)
class Pulled:
    """How one host got the image: ``via`` is the host whose relay served it, ``registry`` for the
    seed's
    relay, None for a direct pull (the reason in ``fallback``)."""

    seconds: float
    via: str | None
    fallback: str | None = None


def relay_ref(port: int, pull_ref: str) -> str:
    """``127.0.0.1:PORT/<repository>@<digest>``: the image as a host pulls it through its own
    relay."""
    name = registry.ImageName.parse(pull_ref)
    return f"127.0.0.1:{port}/{name.repository}@{pull_ref.rsplit('@', 1)[-1]}"


class RelayOps(Protocol):
    """What the tree does on one host: a slice of :class:`~fleetctl.rollout.host.HostOps` (over
    SSH: the scripts below; on the simulated fleet: relays that record who read from whom)."""

    @property
    def host(self) -> Host:
        """The host these operations act on."""
        ...

    def has_image(self, ref: str) -> bool:
        """Whether the host holds the image ``ref`` (``docker image inspect``)."""
        ...

    def start_relay(self, relay_image_ref: str, upstream: str, port: int) -> None:
        """A fresh relay (:data:`RELAY_NAME`) on ``port`` of 127.0.0.1 and the host's address,
        reading ``upstream``, answering as a registry for :data:`RELAY_LIFETIME` at most
        (:func:`start_script`); raises naming why it did not start."""
        ...

    def fill_relay(self, pull_ref: str, port: int) -> None:
        """The relay on ``port`` fetches, once each, the layers of ``pull_ref`` its host lacks, and
        holds them (:func:`fill_script`); raises naming why it could not."""
        ...

    def remove_relay(self) -> None:
        """The relay and what it cached removed (none: nothing to do); raises if docker refuses."""
        ...


#: The relay container's command (``sh -c``; the image's own entrypoint and command in "$@"): the
#: registry on 127.0.0.1 and a second one, on the same store, on the fleet address (one registry
#: listens on one address); when either exits or FLEETCTL_RELAY_LIFETIME seconds have passed, the
#: shell (the container's first process) ends, and the container with it.
SERVE = """end=$(( $(date +%s) + FLEETCTL_RELAY_LIFETIME ))
REGISTRY_HTTP_ADDR=127.0.0.1:$FLEETCTL_RELAY_PORT "$@" & a=$!
b=$a
if [ "$FLEETCTL_RELAY_ADDR" != 127.0.0.1 ]; then
  REGISTRY_HTTP_ADDR=$FLEETCTL_RELAY_ADDR:$FLEETCTL_RELAY_PORT "$@" & b=$!
fi
while kill -0 $a 2>/dev/null && kill -0 $b 2>/dev/null && [ "$(date +%s)" -lt $end ]; do
  sleep 1
done
kill $a $b 2>/dev/null
"""


def _bind(address: str) -> str:
    """Shell setting ``addr`` to the address the relay serves its peers on: ``address`` when it is
    an IP address ([v6] bracketed), else the first IPv4 address, not loopback, it resolves to
    there."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        name = shlex.quote(address)
        return (f"addr=$(getent ahostsv4 {name} | awk '$1 !~ /^127[.]/ {{print $1; exit}}')\n"
                f"[ -n \"$addr\" ] || {{ echo 'its fleet address '{name}' resolves to no IPv4 "
                "address here but loopback' >&2; exit 1; }\n")
    return "addr=" + shlex.quote(f"[{address}]" if ip.version == 6 else address) + "\n"


def start_script(port: int, relay_image_ref: str, upstream: str, address: str) -> str:
    """Start a fresh relay on the host network, listening on 127.0.0.1 and ``address`` (the host's
    fleet address) only, for :data:`RELAY_LIFETIME` at most, and wait until it answers ``/v2/`` as
    a registry on both (python3: Sparks and the lab have it); a relay that exits (its port taken, an
    address not of this host, a bad image) fails at once, with its log."""
    expires = f"$(( $(date +%s) + {RELAY_LIFETIME:.0f} ))"
    run = ["docker", "run", "-d", "--name", RELAY_NAME, "--network", "host",
           "--label", "fleetctl.role=image-relay",
           "-e", f"REGISTRY_PROXY_REMOTEURL={upstream}",
           "-e", f"FLEETCTL_RELAY_PORT={port}",
           "-e", f"FLEETCTL_RELAY_LIFETIME={RELAY_LIFETIME:.0f}",
           "--entrypoint", "/bin/sh", relay_image_ref, "-c", SERVE, "relay"]
    probe = ("import sys,urllib.request\n"
             "try:\n"
             "  for a in sys.argv[1:]:\n"
             f"    r=urllib.request.urlopen('http://%s:{port}/v2/' % a,timeout=2)\n"
             "    if not r.headers.get('Docker-Distribution-Api-Version'): sys.exit(1)\n"
             "except Exception:\n"
             "  sys.exit(1)\n")
    tries = int(RELAY_READY_TIMEOUT / 0.3)
    img = shlex.quote(relay_image_ref)
    # the image's own entrypoint and command (registry:2's /entrypoint.sh, its config): SERVE's "$@"
    own = "{{join .Config.Entrypoint \" \"}} {{join .Config.Cmd \" \"}}"
    return (
        f"docker rm -f -v {RELAY_NAME} >/dev/null 2>&1\n"
        f"docker image inspect {img} >/dev/null 2>&1 || docker pull -q {img} >/dev/null || exit 1\n"
        + _bind(address)
        + f"own=$(docker image inspect -f {shlex.quote(own)} {img}) || exit 1\n"
        f"{shlex.join(run[:5])} --label fleetctl.relay-expires={expires} "
        f"-e FLEETCTL_RELAY_ADDR=$addr {shlex.join(run[5:])} $own >/dev/null || exit 1\n"
        f"for i in $(seq {tries}); do\n"
        f"  if [ \"$(docker inspect -f '{{{{.State.Running}}}}' {RELAY_NAME})\" != true ]; then\n"
        f"    echo 'the relay exited:' >&2; docker logs --tail 3 {RELAY_NAME} >&2; exit 1\n"
        f"  fi\n"
        f'  python3 -c {shlex.quote(probe)} 127.0.0.1 "$addr" && exit 0\n'
        f"  sleep 0.3\n"
        f"done\n"
        f'echo "the relay did not answer on 127.0.0.1 and $addr port {port} within '
        f'{RELAY_READY_TIMEOUT:.0f}s" >&2; exit 1\n'
    )


#: Run on the host with the RootFS layers of its images on stdin (one JSON list per image): which
#: blobs of the image the host lacks, asked of its relay so that the relay fetches each once
#: (fill_script).
_FILL = r"""
import json, platform, sys, urllib.request
port, repo, digest = sys.argv[1], sys.argv[2], sys.argv[3]
base = "http://127.0.0.1:%s/v2/%s" % (port, repo)
kinds = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
         "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")
def get(path):
    req = urllib.request.Request(base + path, headers={"Accept": ",".join(kinds)})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read(8 << 20))
m = get("/manifests/" + digest)
if "manifests" in m:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    mine = [x for x in m["manifests"] if (x.get("platform") or {}).get("architecture") == arch
            and (x.get("platform") or {}).get("os") == "linux"]
    if not mine:
        sys.exit("the image has no linux/%s manifest" % arch)
    m = get("/manifests/" + mine[0]["digest"])
layers = [x["digest"] for x in m["layers"]]
diff_ids = get("/blobs/" + m["config"]["digest"])["rootfs"]["diff_ids"]
# Docker reuses a layer when the whole chain below it is the same: the longest prefix of diff_ids
# that an image here starts with is present; every layer after it is fetched.
have = 0
for line in sys.stdin:
    try:
        local = json.loads(line)
    except ValueError:
        continue
    n = 0
    while n < min(len(local or []), len(diff_ids)) and local[n] == diff_ids[n]:
        n += 1
    have = max(have, n)
for b in layers[have:]:
    # Ask for the blob and hang up: the relay goes on fetching it into its store (once), instead of
    # reading it twice from upstream (once streamed to a client, once for its store).
    with urllib.request.urlopen(base + "/blobs/" + b, timeout=120) as r:
        r.read(1)
    print(b)
"""  # noqa: E501 (data: lines as the program reads them)


def fill_script(port: int, pull_ref: str) -> str:
    """Have the host's relay fetch, once each, the image's layers the host lacks, and wait until it
    holds them.

    A pull-through registry (distribution 2.8) reads a blob it does not hold twice from upstream
    when a client asks for it: one stream to the client, one copy into its store. A request it is
    left to finish alone costs one read; Docker's pull after this is served from the relay's store.
    """
    name = registry.ImageName.parse(pull_ref)
    digest = pull_ref.rsplit("@", 1)[-1]
    store = "/var/lib/registry/docker/registry/v2/blobs/sha256"
    wait = int(PULL_TIMEOUT / 0.5)
    waiter = (
        'for b in "$@"; do h=${b#sha256:}; f=' + store + "/$(echo $h | cut -c1-2)/$h/data; n=0; "
        "while [ ! -f $f ]; do n=$((n+1)); "
        f'if [ $n -gt {wait} ]; then echo "the relay never stored $b" >&2; exit 1; fi; '
        "sleep 0.5; done; done"
    )
    return (
        "blobs=$(docker image inspect -f '{{json .RootFS.Layers}}' $(docker images -q) "
        "2>/dev/null | "
        f"python3 -c {shlex.quote(_FILL)} {port} {shlex.quote(name.repository)} "
        f"{shlex.quote(digest)}) "
        "|| exit 1\n"
        f"docker exec {RELAY_NAME} sh -c {shlex.quote(waiter)} fill $blobs\n"
    )


def remove_relays(hosts: Sequence[Host], ops: Callable[[Host], RelayOps]) -> dict[str, str]:
    """Remove the relay (and what it cached) from every host; host -> why it could not be
    removed."""
    outs = ssh.fan_out(hosts, lambda h: ops(h).remove_relay(), timeout=90)
    return {n: o.error.cause for n, o in outs.items() if o.error is not None}


def sweep_relays(hosts: Sequence[Host], ops: Callable[[Host], RelayOps]) -> dict[str, str]:
    """Remove any relay a killed or failed prefetch left on ``hosts`` (``rollback``, ``rollout
    abort``, a prefetch without the tree: the fleet's lock is held, so no prefetch is running);
    host -> why it could not be (an unreachable host: its relay stops by itself
    :data:`RELAY_LIFETIME` after it started)."""
    return remove_relays(hosts, ops) if hosts else {}


def holds_image(ops: RelayOps, ref: str) -> bool:
    """Whether the host holds ``ref``, once a relay a killed controller left there is removed (the
    fleet's lock: no other prefetch runs)."""
    ops.remove_relay()
    return ops.has_image(ref)


Emit = Callable[[str, str, str], None]
Pull = Callable[[Host, str], float]


@dataclass(frozen=True)
class Source:
    """What a tree spreads: ``pull_ref``, from ``origin`` (the registry's API base the hosts pull
    it from, ``registry.endpoint``: ``http://10.0.0.1:5000``, ``https://nvcr.io``, read by the
    seed's relay), through relays run from ``relay_image_ref``."""

    pull_ref: str
    origin: str
    relay_image_ref: str


@dataclass(frozen=True)
class Hands:
    """How a tree acts on a host: ``ops(host)``, its relay operations (the engine's HostOps);
    ``pull(host, ref)``, a pull reporting progress (the relayed one: the bytes move there);
    ``direct(host, ref)``, a quiet pull (the deploy reference once the layers are there);
    ``emit(kind, message, host)``, progress."""

    ops: Callable[[Host], RelayOps]
    pull: Pull
    direct: Pull
    emit: Emit


class Tree:
    """One prefetch's tree: :meth:`run` pulls the source's ``pull_ref`` on every host and says
    how each got it."""

    def __init__(self, cfg: TreeConfig, source: Source, hands: Hands,
                 max_workers: int = ssh.FAN_OUT_WORKERS) -> None:
        self.cfg = cfg
        self.pull_ref = source.pull_ref
        self.origin = source.origin
        self.relay_image_ref = source.relay_image_ref
        self._ops = hands.ops
        self._pull = hands.pull
        self._direct = hands.direct
        self._emit = hands.emit
        self.max_workers = max_workers
        self._started: set[str] = set()
        self._lock = threading.Lock()

    def run(self, hosts: Sequence[Host]) -> dict[str, ssh.Outcome[Pulled]]:
        """Every host's outcome (an error only when even the direct pull failed); the relays are
        gone after."""
        by_name = {h.name: h for h in hosts}
        out: dict[str, ssh.Outcome[Pulled]] = {}
        try:
            self._grow(list(hosts), by_name, out)
        finally:
            started = [by_name[n] for n in sorted(self._started)]
            left = remove_relays(started, self._ops) if started else {}
            for n, why in left.items():
                self._emit(
                    "pull", f"image relay not removed ({why}): run `docker rm -f {RELAY_NAME}`", n
                )
        return out

    def _grow(
        self, hosts: list[Host], by_name: Mapping[str, Host], out: dict[str, ssh.Outcome[Pulled]]
    ) -> None:
        seed, pending = hosts[0], hosts[1:]
        try:
            first = ssh.Outcome(seed.name, self._one(seed, self.origin, "registry"))
        except FleetError as e:
            first = ssh.Outcome(seed.name, error=e)
        out[seed.name] = first
        sources = [seed.name] if first.value is not None and first.value.via else []
        rnd = 0
        while pending:
            if not sources:
                # The seed's relay failed: no tree this time; the rest pull from the registry as
                # without one.
                why = (
                    first.value.fallback if first.value is not None else None
                ) or "the seed's pull failed"
                self._emit(
                    "pull",
                    f"image tree off ({why}): {len(pending)} host(s) pull from the registry",
                    seed.name,
                )
                out.update(ssh.fan_out(pending, functools.partial(self._fallback, why=why),
                                       timeout=None, max_workers=self.max_workers))
                return
            rnd += 1
            plan = assign(sources, [h.name for h in pending], self.cfg.fanout)
            batch = [h for h in pending if h.name in plan]
            pending = [h for h in pending if h.name not in plan]
            upstream = {n: http_url(by_name[s].address, self.cfg.port) for n, s in plan.items()}
            got = ssh.fan_out(batch, functools.partial(self._relayed, upstream=upstream, plan=plan),
                              timeout=None, max_workers=self.max_workers)
            for n, o in got.items():
                out[n] = o
                if o.ok and o.value is not None and o.value.via is not None:
                    sources.append(n)
            self._emit(
                "pull",
                f"image tree round {rnd}: {len(batch)} host(s), {len(sources)} source(s) now",
                seed.name,
            )

    def _relayed(self, h: Host, upstream: Mapping[str, str], plan: Mapping[str, str]) -> Pulled:
        return self._one(h, upstream[h.name], plan[h.name])

    def _one(self, h: Host, upstream: str, via: str) -> Pulled:
        """Pull through a relay of ``h``'s own reading ``upstream``; on any failure of the relay,
        directly
        (a FleetError only when that fails too)."""
        t0 = time.monotonic()
        try:
            with self._lock:
                self._started.add(h.name)
            ops = self._ops(h)
            ops.start_relay(self.relay_image_ref, upstream, self.cfg.port)
            ops.fill_relay(self.pull_ref, self.cfg.port)
            self._pull(h, relay_ref(self.cfg.port, self.pull_ref))
            # The layers are here now: this reads only the manifest and config from the registry.
            self._direct(h, self.pull_ref)
            took = time.monotonic() - t0
            self._emit(
                "pulled",
                f"pulled in {took:.1f}s "
                + (
                    f"through {via}'s relay"
                    if via != "registry"
                    else "from the registry (tree seed)"
                ),
                h.name,
            )
            return Pulled(took, via)
        except FleetError as e:
            why = e.cause
        return self._fallback(h, why, t0)

    def _fallback(self, h: Host, why: str, t0: float | None = None) -> Pulled:
        t0 = time.monotonic() if t0 is None else t0
        self._emit("pull", f"pulling from the registry ({why})", h.name)
        self._pull(h, self.pull_ref)
        took = time.monotonic() - t0
        self._emit("pulled", f"pulled in {took:.1f}s from the registry", h.name)
        return Pulled(took, None, why)
