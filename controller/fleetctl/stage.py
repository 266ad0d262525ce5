"""Stage a recipe's model weights into /opt on the fleet: verified, atomic, fetched once.

The work is ``playbooks/stage.yml`` (role ``weights``), so that it also runs with
plain ``ansible-playbook``; this module chooses the recipe and source, passes
the hub token as a secret, shows per-host progress in bytes (by measuring the
staging directories over SSH while the playbook runs: Ansible reports a task
only when it ends) and folds the role's reports into a :class:`StageResult`.

How the bytes move: one seed host (the first that needs the weights) fetches
each set once from the mirror or the hub; the other hosts copy it in a tree
(roles/weights/filter_plugins/weights_tree.py): every host that verified the set
serves the next ones, a bounded number each round, so N hosts take O(log N)
rounds. Copies are rsync over the LAN, or over the fabric between members of a
unit, authenticated by a key made for this run only and accepted by each source
only from the run's hosts' addresses. The controller carries no weights, so a
laptop on Wi-Fi can stage 22 GB to a rack of Sparks.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fleetctl import ansible, httpbound, paths, ssh
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import NULL, Event, Progress
from fleetctl.recipes import Recipe, default_recipe_name, hosts_by_recipe, recipe_for
from fleetctl.runids import new_run_id
from fleetctl.state.ledger import open_for
from fleetctl.urls import redact_url

PLAYBOOK = "stage"
#: Seconds between two measurements of the staging directories (progress in bytes).
POLL_SECONDS = 2.0
GB = 1000**3


@dataclass(frozen=True)
class FileReport:
    """One file of a verified set: its path in the set, size and whether it passed."""

    path: str
    size: int
    status: str
    tensors: int | None = None


@dataclass(frozen=True)
class SetOutcome:
    """What happened to one weight set on one host."""

    role: str
    repo: str
    revision: str
    path: str
    #: current (already staged, nothing copied), staged, refused (verification failed) or not
    #: staged.
    state: str
    bytes: int = 0
    reason: str = ""
    problems: tuple[str, ...] = ()
    files: tuple[FileReport, ...] = ()


@dataclass(frozen=True)
class HostStage:
    """One host's staging: its sets, what was copied, and why it failed if it did."""

    name: str
    #: ok, failed or unreachable.
    status: str
    changed: bool
    sets: tuple[SetOutcome, ...]
    #: Bytes the host received (fetched as the seed, or copied from the seed).
    bytes_copied: int = 0
    #: Seconds the transfer took (the seed's fetch, or the rsync from the seed).
    seconds: float = 0.0
    seed: bool = False
    free_bytes: int | None = None
    message: str = ""
    #: The host this one copied from (the seed, or any host that verified the set in an earlier
    #: round).
    copied_from: str | None = None
    #: ``lan`` (management network) or ``fabric`` (the QSFP link between members of a unit).
    via: str | None = None
    #: The round of the tree in which this host copied (1 = from the seed).
    round: int | None = None

    @property
    def ok(self) -> bool:
        """True when every set is in place and verified."""
        return self.status == "ok"

    @property
    def mb_per_s(self) -> float | None:
        """Transfer rate of this host's copy in MB/s, when it copied anything."""
        return (
            round(self.bytes_copied / 1e6 / self.seconds, 1)
            if self.seconds > 0 and self.bytes_copied
            else None
        )


@dataclass(frozen=True)
class StageResult:
    """The outcome of ``fleetctl stage``: one :class:`HostStage` per selected host."""

    run_id: str
    recipe: str
    source: str
    hosts: Mapping[str, HostStage]
    elapsed: float
    artifacts_dir: Path
    seed: str | None = None
    #: Bytes fetched from the source once, by the seed (the rest went over the LAN).
    fetched_bytes: int = 0
    fetch_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every host has the recipe's weights in place."""
        return all(h.ok for h in self.hosts.values())

    @property
    def failed_hosts(self) -> list[str]:
        """The hosts whose weights are not (all) in place."""
        return [h.name for h in self.hosts.values() if not h.ok]

    @property
    def rounds(self) -> int:
        """Rounds of the tree fan-out this run took (0 when nothing was copied between hosts)."""
        return max((h.round or 0 for h in self.hosts.values()), default=0)

    def uploads(self) -> dict[str, int]:
        """How many hosts copied from each source host (the seed's count grows as log N, not N)."""
        out: dict[str, int] = {}
        for h in self.hosts.values():
            if h.copied_from:
                out[h.copied_from] = out.get(h.copied_from, 0) + 1
        return out

    @property
    def copied_bytes(self) -> int:
        """Bytes moved in total (fetch + LAN copies)."""
        return sum(h.bytes_copied for h in self.hosts.values())


def source_for(recipe: Recipe, inventory: Inventory) -> str:
    """``mirror`` or ``hub``: the recipe's own choice, else the mirror when the inventory has
    one."""
    if recipe.source:
        return recipe.source
    return "mirror" if inventory.vars.get("fleetctl_weights_mirror") else "hub"


def expected_bytes(recipe: Recipe, inventory: Inventory, source: str) -> dict[str, int]:
    """Bytes of each set (role -> bytes): from the mirror's manifests, else the recipe's size_gb.

    Only used for the progress display's totals; a mirror that does not answer
    here just leaves the totals as estimates (the role checks for real). A mirror
    that answers with more than :data:`MANIFEST_MAX_BYTES`, or too slowly to finish
    within :data:`MANIFEST_DEADLINE`, is an error: it would be the role's too.
    """
    out = {w.role: int(w.size_gb * GB) for w in recipe.weights}
    mirror = str(inventory.vars.get("fleetctl_weights_mirror") or "")
    if source != "mirror" or not mirror:
        return out
    for w in recipe.weights:
        url = f"{mirror.rstrip('/')}/{w.repo}/{w.revision}/manifest.json"
        try:
            files = json.loads(_read_manifest(url, mirror)).get("files", [])
            out[w.role] = sum(int(f.get("size", 0)) for f in files)
        except RecursionError:
            raise FleetError(f"the weights mirror {redact_url(mirror)} answered "
                             f"{redact_url(url)} with JSON nested too deep to be a manifest",
                             fix="check fleetctl_weights_mirror and the server behind it"
                             ) from None
        except (urllib.error.URLError, OSError, ValueError, AttributeError, TypeError):
            continue
    return out


def du_command(paths: Sequence[str]) -> str:
    """The shell that prints the bytes under ``paths`` together (0 when none exists)."""
    return ("du -sb " + " ".join(shlex.quote(p) for p in paths)
            + " 2>/dev/null | awk '{s+=$1} END {print s+0}'")


class StagingOps(Protocol):
    """What a stage's progress reads on a host: a slice of the rollout's ``HostOps``."""

    @property
    def host(self) -> Host:
        """The host these operations act on."""
        ...

    def staged_bytes(self, paths: Sequence[str]) -> int:
        """The bytes under ``paths`` on the host (0 when none exists or it cannot say)."""
        ...


@dataclass(frozen=True)
class SshStaging:
    """:class:`StagingOps` over SSH (``du``): what ``SshHostOps.staged_bytes`` runs."""

    host: Host

    def staged_bytes(self, paths: Sequence[str]) -> int:
        r = ssh.run(self.host, du_command(paths), timeout=10)
        return int(r.stdout.strip() or 0) if r.ok else 0


#: Largest manifest.json read from a mirror: a set's list of files with their sha256 (a real one is
#: tens of KB, even for a model of hundreds of shards).
MANIFEST_MAX_BYTES = 16 << 20
#: Seconds one manifest may take in all, however slowly its bytes come (the socket's own idle
#: timeout, 5 s, only bounds one wait).
MANIFEST_DEADLINE = 30.0


def _read_manifest(url: str, mirror: str) -> bytes:
    """The body of ``url``: at most MANIFEST_MAX_BYTES, the whole exchange (headers too) by
    MANIFEST_DEADLINE; else a FleetError naming the mirror (both without a ``user:password@``).
    An answer other than 200 is an ``OSError`` (no totals, as an unreachable mirror)."""
    shown, mirror = redact_url(url), redact_url(mirror)
    fix = ("check fleetctl_weights_mirror in the inventory and the server behind it: a "
           "manifest.json is a list of files and their sha256, a few KB")
    try:
        a = httpbound.exchange(urllib.request.Request(url), timeout=5, deadline=MANIFEST_DEADLINE,
                               max_bytes=MANIFEST_MAX_BYTES,
                               handlers=(urllib.request.HTTPRedirectHandler(),))
    except httpbound.Expired:
        raise FleetError(f"the weights mirror {mirror} did not finish sending {shown} within "
                         f"{MANIFEST_DEADLINE:.0f}s", fix=fix) from None
    except httpbound.TooLarge:
        raise FleetError(f"the weights mirror {mirror} answered {shown} with more than "
                         f"{MANIFEST_MAX_BYTES >> 20} MiB, not a manifest", fix=fix) from None
    if a.status != 200:
        raise OSError(f"HTTP {a.status}")
    return a.body


class _ByteMeter:
    """Measures each host's staging directories (``ops(host).staged_bytes``) while the play runs."""

    def __init__(self, hosts: list[Host], recipe: Recipe, run_id: str, totals: Mapping[str, int],
                 progress: Progress, ops: Callable[[Host], StagingOps] = SshStaging) -> None:
        self.hosts = hosts
        self.ops = ops
        self.paths = [f"{w.path}.staging-{run_id}" for w in recipe.weights]
        self.total = sum(totals.values())
        self.progress = progress
        self.stop = threading.Event()
        self.seen: dict[str, int] = {}
        self.thread = threading.Thread(target=self._loop, name="fleetctl-stage-meter", daemon=True)

    def _measure(self, host: Host) -> int:
        return self.ops(host).staged_bytes(self.paths)

    def _loop(self) -> None:
        while not self.stop.wait(POLL_SECONDS):
            outcomes = ssh.fan_out(self.hosts, self._measure, timeout=15)
            for name, o in outcomes.items():
                # Zero = nothing staged yet, or the set was already swapped into place (its staging
                # dir is gone).
                if not o.ok or not o.value or o.value == self.seen.get(name, 0):
                    continue
                self.seen[name] = o.value
                self.progress(
                    Event(
                        "transfer",
                        f"{human_bytes(o.value)} of {human_bytes(self.total)}",
                        host=name,
                        data={"bytes": o.value, "total": self.total},
                    )
                )

    def __enter__(self) -> _ByteMeter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=POLL_SECONDS + 20)


@dataclass(frozen=True)
class StageJob:
    """One recipe's staging, checked before any host is touched: the recipe and the source."""

    recipe: Recipe
    source: str
    local_dir: Path | None = None


@dataclass(frozen=True)
class StageOptions:
    """How a stage runs, the same for every recipe of one command."""

    headroom_gb: float | None = None
    checksums: bool = False
    progress: Progress = NULL
    extravars: Mapping[str, Any] | None = None
    timeout: int | None = None
    ops: Callable[[Host], StagingOps] = SshStaging


def prepare(inventory: Inventory, recipe_name: str, source: str | None = None,
            local_dir: str | Path | None = None) -> StageJob:
    """``recipe_name``'s staging checked: the recipe exists, the source can serve it, its
    revisions are pinned and the mirror's channel is trusted (raises a FleetError otherwise)."""
    recipe = recipe_for(inventory, recipe_name)
    source = source or source_for(recipe, inventory)
    if source == "local" and not (local_dir and Path(local_dir).is_dir()):
        raise FleetError(f"source local needs a directory on the controller, got {local_dir!r}",
                         fix="pass --local-dir DIR holding <repo>/<revision>/ for each weight set")
    _check_pinned(recipe, inventory)
    if source == "mirror":
        _check_mirror_channel(recipe, inventory)
    return StageJob(recipe, source, Path(local_dir).resolve() if local_dir is not None else None)


@contextmanager
def fleet_lock(inventory: Inventory, run_id: str) -> Iterator[Path]:
    """The fleet's lock held for ``run_id`` (the rollout's: a second stage would delete this
    run's staging directories as a killed run's leftovers, and a rollout must not find weights
    half-swapped; exit 4 when held), and the run's private directory for its copy keys."""
    state = paths.state_dir(inventory.path)
    with open_for(inventory, state) as ledger:
        ledger.acquire(run_id)
        # The run's copy key is made in the private state dir, not /tmp, and removed whatever
        # happens; a killed controller's key is removed by the next stage (it holds the fleet lock
        # now).
        for stale in state.glob(f"runs/*/{KEY_DIR}"):
            shutil.rmtree(stale, ignore_errors=True)
        keys = paths.private_dir(state / "runs" / run_id / KEY_DIR)
        try:
            yield keys
        finally:
            shutil.rmtree(keys, ignore_errors=True)
            ledger.release(run_id)


def run_job(inventory: Inventory, job: StageJob, hosts: list[Host], *, limit: str | None,
            run_id: str, keys: Path, opts: StageOptions,
            artifacts_dir: Path | None = None) -> StageResult:
    """Run ``job`` on ``hosts`` (``limit`` selects them) under :func:`fleet_lock`: one play, one
    seed, one tree of copies; its per-host reports folded."""
    token = os.environ.get("HF_TOKEN", "")
    progress = opts.progress
    if job.source == "hub":
        progress(Event("source", f"hub ({'token from $HF_TOKEN' if token else 'anonymous'})"))
    elif job.source == "local":
        progress(Event("source", f"controller directory {job.local_dir}"))
    else:
        # A user:password@ in the mirror's URL never reaches progress (or --json's events).
        mirror = str(inventory.vars.get("fleetctl_weights_mirror"))
        progress(Event("source", f"mirror {redact_url(mirror)}"))
    totals = expected_bytes(job.recipe, inventory, job.source)
    evars: dict[str, Any] = {
        "weights_recipe": job.recipe.name,
        "weights_run": run_id,
        "weights_checksums": opts.checksums,
        "weights_source": job.source,
        "weights_source_forced": True,
        "weights_keydir_parent": str(keys),
    }
    if job.local_dir is not None:
        evars["weights_local_dir"] = str(job.local_dir)
    if opts.headroom_gb is not None:
        evars["weights_headroom_gb"] = opts.headroom_gb
    evars.update(opts.extravars or {})
    secrets = {"weights_hf_token": token} if token else {}
    with _ByteMeter(hosts, job.recipe, run_id, totals, progress, opts.ops):
        result = ansible.run_playbook(PLAYBOOK, inventory, limit=limit, extravars=evars,
                                      secrets=secrets, progress=progress, run_id=run_id,
                                      timeout=opts.timeout, artifacts_dir=artifacts_dir)
    return fold(result, job.recipe, job.source, hosts)


def stage(
    inventory: Inventory,
    recipe_name: str | None = None,
    *,
    limit: str | None = None,
    source: str | None = None,
    local_dir: str | Path | None = None,
    headroom_gb: float | None = None,
    checksums: bool = False,
    progress: Progress = NULL,
    run_id: str | None = None,
    extravars: Mapping[str, Any] | None = None,
    timeout: int | None = None,
    ops: Callable[[Host], StagingOps] = SshStaging,
) -> StageResult:
    """Stage ``recipe_name`` on the hosts matching ``limit`` (default: the ``fleetctl_recipe`` they
    share; hosts of several recipes: :func:`fleetctl.stage_fleet.stage_each`).

    ``source`` overrides where the bytes come from: ``mirror``, ``hub``, or
    ``local`` (``local_dir`` on the controller, laid out like the mirror:
    ``<dir>/<repo>/<revision>/``). A host failing is data in the result; raises
    only when the run cannot start (unknown recipe, bad inventory, no host matched).
    ``ops(host)``: how its progress reads a host (the rollout's ``HostOps`` fit; default over SSH).
    """
    hosts = inventory.select(limit)
    if recipe_name is None:
        recipe_name = _common_recipe(inventory, hosts)
    job = prepare(inventory, recipe_name, source, local_dir)
    run_id = run_id or new_run_id("stage")
    opts = StageOptions(headroom_gb, checksums, progress, extravars, timeout, ops)
    with fleet_lock(inventory, run_id) as keys:
        return run_job(inventory, job, hosts, limit=limit, run_id=run_id, keys=keys, opts=opts)


#: Where a run's seed-to-host copy key is made (under the run's private state directory).
KEY_DIR = "stage-keys"

#: A full git commit id: the only revision the hub cannot move.
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _check_pinned(recipe: Recipe, inventory: Inventory) -> None:
    """Refuse a weight set pinned to a branch or tag, unless the inventory allows it (a lab or a
    test).

    A branch moves: hosts staged on different days would serve different bytes, and
    what a gate passed is not what the next host gets.
    """
    if inventory.vars.get("fleetctl_allow_unpinned_revisions") is True:
        return
    for w in recipe.weights:
        if not _COMMIT.fullmatch(w.revision):
            raise FleetError(
                f"recipe {recipe.name} stages its {w.role} {w.repo} at revision {w.revision!r}, a "
                "name the hub can "
                "move: hosts staged at different times would serve different bytes",
                fix="pin the commit sha (40 hex digits, from the model page's history) in the "
                    "weight set's "
                "revision; a lab or test inventory may set fleetctl_allow_unpinned_revisions: true",
            )


def _check_mirror_channel(recipe: Recipe, inventory: Inventory) -> None:
    """A plain-http mirror serves the manifest (every file's sha256) over the same channel as the
    bytes: anyone on the path can swap both. It is trusted only with the manifest's sha256 pinned in
    the recipe, or with the inventory's explicit ``fleetctl_weights_mirror_insecure: true`` (the
    lab's own mirror).
    """
    mirror = str(inventory.vars.get("fleetctl_weights_mirror") or "")
    if (
        not mirror.startswith("http://")
        or inventory.vars.get("fleetctl_weights_mirror_insecure") is True
    ):
        return
    unpinned = [w for w in recipe.weights if not w.manifest_sha256]
    if unpinned:
        w = unpinned[0]
        raise FleetError(
            f"the weights mirror {redact_url(mirror)} is plain http and recipe {recipe.name}'s "
            f"{w.role} set "
            "pins no "
            "manifest_sha256: the manifest that checks every file would come over the same "
            "unauthenticated channel",
            fix="serve the mirror over https, or pin each set's manifest_sha256 (sha256sum of its "
                "verified "
            "manifest.json) in the recipe",
        )


def _common_recipe(inventory: Inventory, hosts: list[Host]) -> str:
    """The one default recipe (``fleetctl_recipe``) the hosts share; an error when they differ."""
    by = hosts_by_recipe(inventory, hosts)
    if len(by) > 1:
        which = "; ".join(f"{name}: {', '.join(h.name for h in hs)}" for name, hs in by.items())
        raise FleetError(f"the selected hosts serve different recipes ({which})",
                         fix="pass --recipe NAME, or --limit to the hosts of one recipe "
                             "(`fleetctl stage` without --recipe stages each host's own)")
    return next(iter(by)) if by else default_recipe_name(inventory)


def fold(
    result: ansible.PlaybookResult, recipe: Recipe, source: str, hosts: list[Host]
) -> StageResult:
    """Turn the playbook's per-host reports into a StageResult."""
    out: dict[str, HostStage] = {}
    seed: str | None = None
    fetched = 0
    fetch_secs = 0.0
    for h in hosts:
        hr = result.hosts.get(h.name)
        if hr is None:
            out[h.name] = HostStage(
                h.name, "failed", False, (), message="the playbook never reached this host"
            )
            continue
        rep = hr.reports
        pre = rep.get("preflight") or {}
        pre_sets = {s.get("role"): s for s in pre.get("sets", []) if isinstance(s, dict)}
        swapped = {s.get("role"): s for s in rep.get("swap", []) if isinstance(s, dict)}
        fetch = [f for f in rep.get("fetch", []) if isinstance(f, dict)]
        received = [f for f in rep.get("receive", []) if isinstance(f, dict)]
        is_seed = bool(fetch)
        if is_seed:
            seed = h.name
            fetched = sum(int(f.get("bytes", 0)) for f in fetch)
            fetch_secs = sum(float(f.get("seconds", 0.0)) for f in fetch)
        sets: list[SetOutcome] = []
        copied = 0
        for w in recipe.weights:
            p = pre_sets.get(w.role, {})
            v = rep.get(f"verify_{w.role}") or {}
            problems = tuple(f"{x.get('path')}: {x.get('problem')} (fix: {x.get('fix')})"
                             for x in v.get("problems", []) if isinstance(x, dict))
            files = tuple(
                FileReport(
                    str(f.get("path")),
                    int(f.get("size", 0)),
                    str(f.get("status")),
                    f.get("tensors"),
                )
                for f in v.get("files", [])
                if isinstance(f, dict)
            )
            if w.role in swapped:
                state, nbytes = "staged", int(swapped[w.role].get("bytes", 0))
                copied += nbytes
            elif p.get("state") == "current":
                state, nbytes = "current", int(p.get("bytes", 0))
            elif problems:
                state, nbytes = "refused", int(v.get("bytes", 0))
            else:
                state, nbytes = "not staged", int(p.get("bytes", 0))
            sets.append(
                SetOutcome(
                    w.role,
                    w.repo,
                    w.revision,
                    w.path,
                    state,
                    nbytes,
                    str(p.get("reason", "")),
                    problems,
                    files,
                )
            )
        moved = fetch or received
        if moved:
            copied = sum(
                int(f.get("bytes", 0)) for f in moved
            )  # the bytes that crossed the network
        seconds = sum(float(f.get("seconds", 0.0)) for f in moved)
        status = hr.status
        if status == "ok" and any(s.state not in ("staged", "current") for s in sets):
            status = "failed"
        message = str(rep.get("receive_failed") or hr.message)
        if status == "failed" and not message:
            message = ("the playbook stopped before this host's weights were in place (see the "
                       "run's artifacts)")
        out[h.name] = HostStage(
            h.name,
            status,
            any(s.state == "staged" for s in sets),
            tuple(sets),
            bytes_copied=copied,
            seconds=round(seconds, 3),
            seed=is_seed,
            free_bytes=pre.get("free_bytes"),
            message=message,
            copied_from=str(received[0]["from"]) if received and received[0].get("from") else None,
            via=str(received[0].get("via") or "lan") if received else None,
            round=int(received[0]["round"]) if received and received[0].get("round") else None,
        )
    return StageResult(
        run_id=result.run_id,
        recipe=recipe.name,
        source=source,
        hosts=out,
        elapsed=result.elapsed,
        artifacts_dir=result.artifacts_dir,
        seed=seed,
        fetched_bytes=fetched,
        fetch_seconds=fetch_secs,
    )


def human_bytes(n: float) -> str:
    """Bytes in B/kB/MB/GB (decimal, as disks count)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def require_ok(result: StageResult) -> StageResult:
    """Return the result, or raise a FleetError naming the first failed host (for callers that need
    all)."""
    for h in result.hosts.values():
        if not h.ok:
            raise FleetError(
                f"weights of {result.recipe} not staged: {h.message}",
                host=h.name,
                fix=f"fix the cause, then `fleetctl stage --recipe {result.recipe} --limit "
                    f"{h.name}`",
            )
    return result


__all__ = [
    "FileReport", "HostStage", "SetOutcome", "StageJob", "StageOptions", "StageResult",
    "fleet_lock", "fold", "human_bytes", "prepare", "require_ok", "run_job",
    "source_for", "stage",
]
