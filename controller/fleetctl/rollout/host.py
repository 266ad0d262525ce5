"""What the rollout does on one host, over SSH: look, pull, stop, start, restore, read logs (the
rest of what it runs on a host, :class:`HostOps` beyond the serving container: :mod:`.host_ssh`).

Every step is idempotent and starts by looking at the host's real state, so
that a step interrupted by a dead controller can simply be run again. The
previous serving container is never deleted by a deploy: it is stopped and
renamed ``<name>.prev`` so that a rollback is a rename and a start, with the
exact settings (and secrets) it ran with, without a pull.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from fleetctl import bandwidth, secretenv, serving, ssh, stage, warmcache
from fleetctl import facts as probe
from fleetctl.container import (
    LABEL_DIGEST,
    LABEL_FINGERPRINT,
    LABEL_IMAGE,
    LABEL_RECIPE,
    LABEL_ROLLOUT,
    LABEL_TAG,
    Container,
)
from fleetctl.facts import Facts
from fleetctl.inventory import Host
from fleetctl.recipes import STAGED_MARKER, MemberLaunch, Recipe
from fleetctl.rollout import imagetree
from fleetctl.rollout.host_ssh import SshHostCommands
from fleetctl.serving import container_name, inspect
from fleetctl.state import hoststate

PREV_SUFFIX = ".prev"
_PULL_TIMEOUT = 1800.0
#: What a GB10 calls itself in ``nvidia-smi``; the images are built for sm_121a only.
GB10 = "NVIDIA GB10"
#: The serving container's restart policy, as the published recipes' own ``docker run``: a Spark
#: that reboots (or whose dockerd restarts) serves its version again, while a container fleetctl
#: stopped or killed (``.prev``, a version judged bad) stays down. A recipe's ``docker_args`` may
#: override it.
RESTART_POLICY = "unless-stopped"


def fingerprint(recipe: Recipe) -> str:
    """The fingerprint of the container settings ``recipe`` renders, whatever the image.

    A host needs a rollout step when its container's ``fleetctl.fingerprint``
    label differs from this (or its image digest from the target's), so that a
    recipe-only change (flags, drafter revision, env, mounts) rolls out through
    the same canary and gates. Pure; the ``vllm_serve`` Ansible role computes
    the same: the sha256 hex digest of ``json.dumps(doc, sort_keys=True,
    separators=(",", ":"))`` where ``doc`` is ``{"docker_args": [...],
    "entrypoint": "vllm", "env": {NAME: value}, "mounts": [[src, dst], ...],
    "restart": RESTART_POLICY, "secret_env": [NAME, ...], "serve": [serve
    argv...]}`` (secret values never enter it: only their names).
    """
    doc = {"docker_args": list(recipe.docker_args), "entrypoint": "vllm", "env": dict(recipe.env),
           "mounts": [[src, dst] for src, dst in recipe.mounts()], "restart": RESTART_POLICY,
           "secret_env": sorted(recipe.secret_env), "serve": list(recipe.serve_argv())}
    return hashlib.sha256(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def unstaged_weights(recipe: Recipe, markers: Mapping[str, object]) -> tuple[str, ...]:
    """Each weight set of ``recipe`` not staged and verified for it, with why.

    ``markers``: weight path -> the stage's verification marker read on the host
    (None when absent, a string when unreadable). A set counts as staged only when
    its marker names the recipe's repo and revision: ``config.json`` alone may be
    a partial or older download that was never verified.
    """
    out: list[str] = []
    for w in recipe.weights:
        m = markers.get(w.path)
        where = f"weight set {w.role} ({w.repo}@{w.revision}) at {w.path}"
        if m is None:
            out.append(f"{where}: not staged and verified (no {STAGED_MARKER})")
        elif not isinstance(m, dict):
            out.append(f"{where}: {STAGED_MARKER} {m}")
        elif m.get("repo") != w.repo or m.get("revision") != w.revision:
            out.append(f"{where}: staged for {m.get('repo')}@{m.get('revision')} instead")
    return tuple(out)


def facts(host: Host, recipe: Recipe, ref: str, timeout: float = 60.0) -> Facts:
    """The host's facts for a rollout to ``ref``, in one round trip: the facts probe
    (fleetctl.facts) with ``--image`` (present, Docker's runtimes, free disk), the recipe's
    weights' stage markers and the serving container and its ``.prev``; ``serving``,
    ``previous`` and ``missing_weights`` set."""
    name = container_name(host)
    argv = probe.argv(image=ref, weights=[w.path for w in recipe.weights], marker=STAGED_MARKER,
                      inspect=[name, name + PREV_SUFFIX])
    r = ssh.run(host, argv, timeout=timeout, stdin=probe.probe_script(), become=True)
    r.check("preflight probe", fix="check that python3 runs on the host")
    f = probe.parse(host.name, r.stdout)
    return replace(f, serving=f.containers.get(name), previous=f.containers.get(name + PREV_SUFFIX),
                   missing_weights=unstaged_weights(recipe, f.weights))


def pull(
    host: Host,
    ref: str,
    timeout: float = _PULL_TIMEOUT,
    on_line: Callable[[str], None] | None = None,
) -> float:
    """``docker pull ref`` (a no-op when present); returns the seconds it took. With ``on_line``,
    docker's own lines (``<layer>: Download complete``, ``<layer>: Already exists``, ...) are handed
    to it as they come:
    what :class:`fleetctl.rollout.pulls.PullMeter` turns into bytes."""
    argv = ["docker", "pull", ref] if on_line is not None else ["docker", "pull", "-q", ref]
    r = ssh.docker(host, argv, timeout=timeout, on_line=on_line)
    r.check(f"docker pull {ref}", fix="check the registry mirror and the host's disk")
    return r.seconds


def retire(host: Host, name: str, rollout_id: str, target_digest: str,
           grace: int = 30) -> Container | None:
    """Make way for the new container; return the version to go back to (None if nothing).

    A running serving container is stopped and kept as ``<name>.prev`` (an
    older ``.prev`` is removed first: the running one is the newer known
    version). A serving container that is NOT running while a ``.prev``
    exists is removed instead, and the ``.prev`` kept: it is the last version
    that served (a failed start or a controller killed mid-step left the
    dead one), so a repeated deploy never deletes the last good container.
    ``grace``: seconds of ``docker stop`` (0 kills at once: for a version being abandoned).
    """
    cur = inspect(host, name)
    prev_c = inspect(host, name + PREV_SUFFIX)
    if cur is None:
        return prev_c
    if prev_c is not None and (
        not cur.running or (cur.rollout == rollout_id and cur.digest == target_digest)
    ):
        ssh.docker(host, ["docker", "rm", "-f", name], timeout=60).check(
            f"removing the half-started {name}"
        )
        return prev_c
    ssh.docker(host, retire_script(name, grace), timeout=90).check(f"stopping {name}")
    return cur


def retire_script(name: str, grace: int) -> str:
    """The shell that stops ``name`` and keeps it as ``.prev`` in place of an older ``.prev``.

    The older ``.prev`` must be gone before the stop: were it still there, the rename would fail
    and leave the running version stopped under the serving name, which the next retire removes
    as a failed start. So a ``.prev`` docker refuses to remove ends the retire with nothing changed.
    """
    prev, q = shlex.quote(name + PREV_SUFFIX), shlex.quote(name)
    refused = shlex.quote(
        f"docker could not remove the older {name}{PREV_SUFFIX}; {name} was left serving"
    )
    return (
        f"docker rm -f {prev} >/dev/null 2>&1; "
        f"if docker inspect --type container {prev} >/dev/null 2>&1; then echo {refused} >&2; exit "
        "1; fi; "
        f"docker stop -t {int(grace)} {q} >/dev/null && docker rename {q} {prev}"
    )


def kill(host: Host, name: str) -> None:
    """``docker rm -f name``: a container judged bad is killed, not drained (no-op when absent)."""
    ssh.docker(host, f"docker rm -f {shlex.quote(name)} >/dev/null 2>&1 || true", timeout=60).check(
        f"removing {name}"
    )


def stop(host: Host, name: str) -> None:
    """``docker kill name``, the container kept under its name (a unit's members stopped together
    before any
    starts again); a no-op when it is absent or stopped."""
    ssh.docker(host, f"docker kill {shlex.quote(name)} >/dev/null 2>&1 || true", timeout=60).check(
        f"stopping {name}"
    )


def start_again(host: Host, name: str) -> None:
    """``docker start name``: the stopped container started as it was."""
    ssh.docker(host, ["docker", "start", name], timeout=60).check(f"starting {name}")


def logs(host: Host, name: str, tail: int = 300) -> str:
    """The last ``tail`` lines of the container's log (stdout and stderr)."""
    return ssh.docker(host, serving.logs_command(name, tail), timeout=30.0).stdout


@dataclass(frozen=True)
class StartRequest:
    """A serving container to start: the recipe from ``ref``, labelled with its ``tag``, ``digest``
    and the run that starts it; the recipe's container secrets (their values travel on stdin,
    never in argv, and never in this object's repr); with ``cache_key``, the recipe's compile
    caches for that key mounted read-write (fleetctl.warmcache); with ``launch``, as that member
    of a unit (its entrypoint, argv and fabric environment: ``Recipe.launch``)."""

    recipe: Recipe
    ref: str
    tag: str
    digest: str
    rollout_id: str
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    cache_key: str | None = None
    launch: MemberLaunch | None = None


def run_argv(host: Host, req: StartRequest, name: str) -> list[str]:
    """The ``docker run`` argv that starts ``req`` under ``name`` (secret env named, never
    valued)."""
    recipe, ref, tag, digest = req.recipe, req.ref, req.tag, req.digest
    rollout_id, launch, cache_key = req.rollout_id, req.launch, req.cache_key
    argv = [
        "docker",
        "run",
        "-d",
        "--name",
        name,
        "--gpus",
        "all",
        "--ipc",
        "host",
        "--network",
        "host",
        "--restart",
        RESTART_POLICY,
        "--label",
        f"{LABEL_RECIPE}={recipe.name}",
        "--label",
        f"{LABEL_TAG}={tag}",
        "--label",
        f"{LABEL_DIGEST}={digest}",
        "--label",
        f"{LABEL_ROLLOUT}={rollout_id}",
        "--label",
        f"{LABEL_IMAGE}={recipe.image}",
        "--label",
        f"{LABEL_FINGERPRINT}={fingerprint(recipe)}",
        *recipe.docker_args,
    ]
    for src, dst in recipe.mounts():
        argv += ["-v", f"{src}:{dst}:ro"]
    for src, dst in warmcache.binds(recipe, cache_key):
        argv += ["-v", f"{src}:{dst}"]
    for k, v in {
        **(launch.env if launch is not None else recipe.env),
        **warmcache.env(recipe, cache_key),
    }.items():
        argv += ["-e", f"{k}={v}"]
    for k in secretenv.container_secrets(recipe.secret_env):
        argv += ["-e", k]  # docker reads the value from its own environment: set from stdin below
    if launch is not None:
        return [
            *argv,
            "--label",
            f"fleetctl.unit.rank={launch.rank}",
            "--entrypoint",
            launch.entrypoint,
            ref,
            *launch.argv,
        ]
    return [*argv, "--entrypoint", "vllm", ref, *recipe.serve_argv()]


def start(host: Host, req: StartRequest) -> None:
    """Start ``req``'s container under the serving name; secret values travel on stdin, never in
    argv."""
    name = container_name(host)
    recipe, secrets = req.recipe, req.secrets
    argv = run_argv(host, req, name)
    present = [k for k in secretenv.container_secrets(recipe.secret_env) if k in secrets]
    script = "".join(f"{k}={shlex.quote(secrets[k])}\nexport {k}\n" for k in present)
    # `eval "$(cat)"` reads the assignments from stdin, so values never show in `ps` or logs.
    cmd = f'eval "$(cat)"; exec {shlex.join(argv)}'
    r = ssh.docker(host, cmd, timeout=120, stdin=script)
    r.check(
        f"docker run {name}",
        fix="see the error above; the previous container is kept as " + name + PREV_SUFFIX,
    )


def restore(host: Host, name: str) -> Container | None:
    """Put the ``.prev`` container back as the serving one; None when there is no ``.prev``.

    The container in ``name``'s place (judged bad, or half-started) is killed,
    not drained: it is being replaced because it failed.
    """
    prev = inspect(host, name + PREV_SUFFIX)
    if prev is None:
        return None
    q, p = shlex.quote(name), shlex.quote(name + PREV_SUFFIX)
    ssh.docker(
        host,
        f"docker rm -f {q} >/dev/null 2>&1; docker rename {p} {q} && docker start {q} >/dev/null",
        timeout=90,
    ).check(f"restoring {name} from {name}{PREV_SUFFIX}")
    return prev


def swap(host: Host, name: str) -> Container | None:
    """Kill the serving container and exchange it with ``.prev``, which is started; None without a
    ``.prev``.

    Nothing is removed: the abandoned container becomes ``.prev``, so that the
    swap is undone by :func:`restore` if the started one fails its check.
    """
    prev = inspect(host, name + PREV_SUFFIX)
    if prev is None:
        return None
    q, p, s = shlex.quote(name), shlex.quote(name + PREV_SUFFIX), shlex.quote(name + ".swap")
    ssh.docker(
        host,
        f"if docker inspect --type container {q} >/dev/null 2>&1; then docker kill {q} >/dev/null "
        "2>&1;"
        f" docker rm -f {s} >/dev/null 2>&1; docker rename {q} {s} && docker rename {p} {q} &&"
        f" docker rename {s} {p}; else docker rename {p} {q}; fi && docker start {q} >/dev/null",
        timeout=90,
    ).check(f"swapping {name} and {name}{PREV_SUFFIX}")
    return prev


class ServingOps(Protocol):
    """The serving container's operations on one host (the slice of :class:`HostOps` that a
    host's step, its rollback and the deploy's reconcile use): look, pull, retire, swap, start,
    stop, start again, restore, kill, read its logs, and the host's facts for a rollout."""

    @property
    def host(self) -> Host:
        """The host these operations act on."""
        ...

    def facts(self, recipe: Recipe, ref: str) -> Facts:
        """Preflight facts: GPU, runtime, disk, staged weights, current and previous container."""
        ...

    def inspect(self, name: str) -> Container | None:
        """The container ``name`` (running or not), or None."""
        ...

    def pull(self, ref: str, on_line: Callable[[str], None] | None = None) -> float:
        """Pull ``ref``; seconds taken. ``on_line`` gets docker's progress lines (see
        :func:`pull`)."""
        ...

    def retire(self, name: str, rollout_id: str, target_digest: str,
               grace: int = 30) -> Container | None:
        """Stop the serving container and keep it as ``.prev`` (see :func:`retire`)."""
        ...

    def swap(self, name: str) -> Container | None:
        """Exchange the serving container with ``.prev`` (see :func:`swap`)."""
        ...

    def start(self, req: StartRequest) -> None:
        """Start ``req``'s container under the serving name (see :class:`StartRequest`)."""
        ...

    def stop(self, name: str) -> None:
        """``docker kill name``, kept under its name (see :func:`stop`)."""
        ...

    def start_again(self, name: str) -> None:
        """``docker start name`` (see :func:`start_again`)."""
        ...

    def restore(self, name: str) -> Container | None:
        """Kill what is in ``name``'s place and start ``.prev`` there again (see
        :func:`restore`)."""
        ...

    def kill(self, name: str) -> None:
        """``docker rm -f name``."""
        ...

    def logs(self, name: str, tail: int = 300) -> str:
        """The container's last log lines."""
        ...


class HostOps(ServingOps, imagetree.RelayOps, warmcache.CacheOps, bandwidth.ProbeOps,
              hoststate.StateFileOps, stage.StagingOps, Protocol):
    """The remote operations the rollout engine does on one host.

    The engine talks to a host only through this seam: :class:`SshHostOps`
    does it over SSH with the docker CLI; the unit tests' simulated host does
    it in process with the same docker semantics (unique names, stop, rename,
    start, ``rm -f``), so that every failure and every kill point of the state
    machine can be tested without a lab. Each call either happens entirely on
    the host or raises (a :class:`FleetError` for a refusal or a lost session).

    It is its slices together, each declared where its concept lives: the serving container's
    (:class:`ServingOps`), the image tree's relay and ``has_image`` (:class:`.imagetree.RelayOps`),
    the warm start's caches (``warmcache.CacheOps``), a unit's bandwidth probe
    (``bandwidth.ProbeOps``), the state file and the login's rights (``hoststate.StateFileOps``)
    and a stage's bytes (``stage.StagingOps``). A collaborator is typed on the slice it calls.
    """


@dataclass(frozen=True)
class SshHostOps(SshHostCommands):
    """:class:`HostOps` over SSH: the docker CLI on the host (its operations besides the serving
    container's: :class:`~.host_ssh.SshHostCommands`)."""

    def facts(self, recipe: Recipe, ref: str) -> Facts:
        return facts(self.host, recipe, ref)

    def inspect(self, name: str) -> Container | None:
        return inspect(self.host, name)

    def pull(self, ref: str, on_line: Callable[[str], None] | None = None) -> float:
        return pull(self.host, ref, on_line=on_line)

    def retire(self, name: str, rollout_id: str, target_digest: str,
               grace: int = 30) -> Container | None:
        return retire(self.host, name, rollout_id, target_digest, grace)

    def swap(self, name: str) -> Container | None:
        return swap(self.host, name)

    def start(self, req: StartRequest) -> None:
        start(self.host, req)

    def stop(self, name: str) -> None:
        stop(self.host, name)

    def start_again(self, name: str) -> None:
        start_again(self.host, name)

    def restore(self, name: str) -> Container | None:
        return restore(self.host, name)

    def kill(self, name: str) -> None:
        kill(self.host, name)

    def logs(self, name: str, tail: int = 300) -> str:
        return logs(self.host, name, tail)
