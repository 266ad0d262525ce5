"""Keeping secrets out of a run's artifacts and out of ansible-playbook's environment.

Extra variables go to Ansible through a 0600 file in a private temporary
directory, deleted after the run (never on the command line, which
ansible-runner records); ``suppress_env_files`` keeps ansible-runner from
writing ``env/extravars``; ansible-playbook runs with a minimal environment
(:func:`minimal_env`: PATH, HOME, locale, ``ANSIBLE_*``, the ssh agent's
socket, what ansible-runner sets), cut before ansible-runner records it in
``command``, so that a SIGKILL of the controller leaves no secret of its
environment there; and every value passed in ``secrets`` is redacted by a
:class:`Redactor` from the job events (before they are written) and from
``stdout`` and ``command`` after the run. Tasks that handle a secret must still
say ``no_log: true``, so that Ansible itself never prints it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

#: Environment variables that ansible-runner may keep in its ``command`` artifact.
_ENV_KEPT_PREFIXES = ("ANSIBLE_", "LANG", "LC_")
_ENV_KEPT = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "AWX_ISOLATED_DATA_DIR",
        "TMPDIR",
        "SSH_AUTH_SOCK",
    }
)
#: What a secret value is replaced with in events, ``stdout`` and ``command``.
REDACTED = "<redacted by fleetctl>"


class Redactor:
    """Replaces secret values in strings, lists and mappings (in place for mutable containers)."""

    def __init__(self, values: Collection[str]) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self.values = sorted({v for v in values if v and len(v) >= 4}, key=len, reverse=True)

    def text(self, s: str) -> str:
        """``s`` with every secret value replaced by :data:`REDACTED`."""
        for v in self.values:
            if v in s:
                s = s.replace(v, REDACTED)
        return s

    def tree(self, obj: Any) -> Any:
        """Redact every string in ``obj`` (an ansible-runner event), in place where it is
        mutable."""
        if not self.values:
            return obj
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            for k in list(obj):
                obj[k] = self.tree(obj[k])
            return obj
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                obj[i] = self.tree(v)
            return obj
        return obj

    def file(self, path: Path) -> None:
        """Redact a file's text, replacing the file atomically only when a secret was in it."""
        if not self.values or not path.is_file():
            return
        text = path.read_text(errors="replace")
        clean = self.text(text)
        if clean != text:
            tmp = path.with_name(path.name + ".redact")
            tmp.write_text(clean)
            tmp.chmod(0o600)
            tmp.replace(path)


def minimal_env(env: Mapping[str, str], inherited: Mapping[str, str]) -> dict[str, str]:
    """``env`` without what it inherited from ``inherited`` (the controller's environment), except
    the variables Ansible and ssh need (PATH, HOME, locale, ``ANSIBLE_*``, the ssh agent's socket,
    TMPDIR).

    What ansible-runner and fleetctl set themselves (a value not inherited) is kept.
    """
    return {k: v for k, v in env.items()
            if inherited.get(k) != v or k in _ENV_KEPT or k.startswith(_ENV_KEPT_PREFIXES)}


def scrub_command_env(path: Path, redactor: Redactor) -> None:
    """Keep only Ansible's and the locale's variables in ansible-runner's ``command`` record."""
    if not path.is_file():
        return
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    env = data.get("env")
    if isinstance(env, dict):
        data["env"] = {
            k: v for k, v in env.items() if k in _ENV_KEPT or k.startswith(_ENV_KEPT_PREFIXES)
        }
    tmp = path.with_name(path.name + ".scrub")
    tmp.write_text(redactor.text(json.dumps(data)))
    tmp.chmod(0o600)
    tmp.replace(path)


@contextlib.contextmanager
def private_vars_file(extravars: Mapping[str, Any]) -> Iterator[Path]:
    """Extra variables in a 0600 file of a private temp dir, removed when the run ends."""
    with tempfile.TemporaryDirectory(prefix="fleetctl-vars-") as d:
        p = Path(d) / "extravars.json"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(extravars), f)
        yield p
