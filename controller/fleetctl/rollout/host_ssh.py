"""The host's operations over SSH besides its serving container's: the rest of ``SshHostOps``.

What the rollout runs on a host beyond looking at, pulling, stopping and starting its container
(:mod:`.host`): whether it holds an image, the image tree's relay, the warm start's compile caches,
a unit member's bandwidth probe, the host's state file and the login's rights. Each operation is one
SSH round trip running a script built where its concept lives (:mod:`.imagetree`,
:mod:`fleetctl.warmcache`, :mod:`fleetctl.bandwidth`, :mod:`fleetctl.state.hoststate`,
:mod:`fleetctl.stage`), and raises a :class:`FleetError` naming the host when it fails.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from fleetctl import bandwidth, ssh, stage, warmcache
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Unit
from fleetctl.recipes import Recipe
from fleetctl.rollout import imagetree
from fleetctl.state import hoststate


def _tail(r: ssh.CommandResult) -> str:
    return (r.stderr or r.stdout).strip()[-300:]


@dataclass(frozen=True)
class SshHostCommands:
    """The operations above on one host over SSH (``SshHostOps`` adds its serving container's)."""

    host: Host

    def check_access(self) -> None:
        """The login's rights (sudo, docker), probed once per host and process (root has all)."""
        if self.host.user != "root":
            ssh.check_access(self.host)

    def has_image(self, ref: str) -> bool:
        """``docker image inspect ref`` succeeds."""
        cmd = f"docker image inspect -f '{{{{.Id}}}}' {shlex.quote(ref)} >/dev/null 2>&1"
        return ssh.docker(self.host, cmd, timeout=60).rc == 0

    # -- the image tree's relay (decision 0018) ----------------------------------------------

    def start_relay(self, relay_image_ref: str, upstream: str, port: int) -> None:
        script = imagetree.start_script(port, relay_image_ref, upstream, self.host.address)
        r = ssh.docker(self.host, script, timeout=180)
        if r.rc != 0:
            raise FleetError(f"its image relay did not start: {_tail(r)}", host=self.host.name)

    def fill_relay(self, pull_ref: str, port: int) -> None:
        r = ssh.docker(self.host, imagetree.fill_script(port, pull_ref),
                       timeout=imagetree.PULL_TIMEOUT + 60)
        if r.rc != 0:
            raise FleetError(f"its image relay could not fetch the image: {_tail(r)}",
                             host=self.host.name)

    def remove_relay(self) -> None:
        r = ssh.docker(self.host, ["docker", "rm", "-f", "-v", imagetree.RELAY_NAME], timeout=60)
        if r.rc != 0 and "No such container" not in r.stderr:
            raise FleetError(f"docker rm -f {imagetree.RELAY_NAME}: {r.stderr.strip()[-200:]}",
                             host=self.host.name)

    # -- the warm start's compile caches -------------------------------------------------------

    def _cache(self, recipe: Recipe, ref: str, op: str, key: str, *args: str,
               stdin: str | None = None) -> str:
        r = ssh.docker(self.host, warmcache.helper_command(recipe, ref, op, key, *args),
                       timeout=warmcache.HELPER_TIMEOUT, stdin=stdin)
        r.check("compile cache helper", fix="the host starts cold; see the error above")
        return r.stdout

    def export_cache(self, recipe: Recipe, ref: str, key: str, max_bytes: int) -> str:
        return self._cache(recipe, ref, "export", key, str(max_bytes))

    def verify_cache(self, recipe: Recipe, ref: str, key: str) -> str:
        return self._cache(recipe, ref, "verify", key)

    def import_cache(self, recipe: Recipe, ref: str, key: str, exported: str) -> str:
        return self._cache(recipe, ref, "import", key, stdin=exported)

    # -- a unit member's all_reduce probe -----------------------------------------------------

    def bandwidth_probe(self, unit: Unit, recipe: Recipe, ref: str, timeout: float) -> str:
        r = ssh.docker(self.host, bandwidth.probe_command(unit, recipe, ref, self.host.name),
                       timeout=timeout)
        if not r.ok:
            raise FleetError(bandwidth.probe_failure(r.rc, r.stdout, r.stderr), host=self.host.name)
        return r.stdout

    # -- the host's state file (the fleet's lock and intent) -----------------------------------

    def read_state(self) -> str:
        path = hoststate.state_file(self.host)
        r = ssh.run(self.host, hoststate.read_command(path), timeout=15, become=True)
        r.check(f"reading {path}", fix="check that the SSH user may read it")
        return r.stdout

    def swap_state(self, expect: str, text: str) -> bool:
        path = hoststate.state_file(self.host)
        script = hoststate.swap_script(path, expect, os.getpid())
        r = ssh.run(self.host, script, timeout=20, stdin=text, become=True)
        if r.rc == hoststate.CHANGED:
            return False
        r.check(f"writing {path}", fix="check that the SSH user may write /var/lib/fleetctl "
                                       "(fleetctl provision runs as root) and that flock(1) is "
                                       "installed")
        return True

    # -- a stage's progress ------------------------------------------------------------------

    def staged_bytes(self, paths: Sequence[str]) -> int:
        return stage.SshStaging(self.host).staged_bytes(paths)
