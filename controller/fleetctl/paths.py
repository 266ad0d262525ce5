"""Where fleetctl keeps things: the repository's playbooks and roles, caches, state, the lab.

Every location can be moved with an environment variable so that tests, CI
and several labs on one machine never collide.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path


def project_root() -> Path:
    """The directory holding ``playbooks/``, ``roles/`` and ``inventory/``.

    ``$FLEETCTL_HOME`` overrides it; by default it is the checkout fleetctl was
    installed from (an editable install, as the README's commands make).
    """
    env = os.environ.get("FLEETCTL_HOME")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[2]


def playbooks_dir() -> Path:
    """The playbooks, one per verb."""
    return project_root() / "playbooks"


def roles_dir() -> Path:
    """The Ansible roles the playbooks apply."""
    return project_root() / "roles"


def cache_dir() -> Path:
    """Reusable downloads and builds (rootfs tarballs, wheels); safe to delete."""
    env = os.environ.get("FLEETCTL_CACHE_DIR")
    base = (
        Path(env)
        if env
        else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fleetctl"
    )
    base.mkdir(parents=True, exist_ok=True)
    return base


def lab_dir() -> Path:
    """The simulated fleet's directory: its engine, registry, keys and inventory.

    ``$FLEETCTL_LAB_DIR`` overrides it, so that several labs can live on one machine.
    """
    env = os.environ.get("FLEETCTL_LAB_DIR")
    if env:
        return Path(env).resolve()
    return (
        Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
        / "fleetctl"
        / "lab"
    )


def lab_inventory() -> Path:
    """The inventory file that ``fleetctl lab up`` writes."""
    return lab_dir() / "inventory" / "hosts.yml"


def state_dir(inventory: Path) -> Path:
    """The state directory of one fleet (ledger, run artifacts, baselines).

    ``$FLEETCTL_STATE_DIR`` overrides it; by default it is keyed by the
    inventory's resolved path so that two fleets never share a ledger.
    """
    env = os.environ.get("FLEETCTL_STATE_DIR")
    if env:
        path = Path(env)
    else:
        resolved = str(inventory.resolve())
        key = hashlib.sha256(resolved.encode()).hexdigest()[:12]
        base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
        private_dir(base / "fleetctl")
        path = base / "fleetctl" / "fleets" / f"{inventory.resolve().parent.name}-{key}"
    return private_dir(path)


def private_dir(path: Path) -> Path:
    """``path`` created if need be and made 0700: the ledger, verdicts and logs in it are the
    operator's.

    An existing directory is tightened, not refused: it is this user's own state
    (an older fleetctl made it 0755).
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically, mode 0600, through a temp file of an unpredictable
    name.

    The temp file is made by ``mkstemp`` (``O_EXCL``: a symlink planted at its
    name is never followed) in the same directory, then renamed over ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


#: Characters a host's name may keep in a path component (the inventory's host-name rule).
_PLAIN = re.compile(r"[A-Za-z0-9_.:-]+")


def host_component(name: str) -> str:
    """``name`` as one path component under the state directory: the name itself when it is plain
    (the inventory refuses any other), else its plain characters and a hash of the whole name, so
    no name can hold ``/``, lead with ``.`` or a control character, or meet another's."""
    if _PLAIN.fullmatch(name) and not name.startswith("."):
        return name
    plain = re.sub(r"[^A-Za-z0-9_.:-]", "_", name).lstrip(".")[:64]
    return f"{plain}-{hashlib.sha256(name.encode(errors='replace')).hexdigest()[:12]}"
