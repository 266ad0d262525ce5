"""Values of a recipe's ``secret_env``: from the controller's environment or a private file.

A recipe names its secrets (``secret_env: [VLLM_API_KEY]``); the inventory, the ledger
and every artifact hold only the names. The value of ``NAME`` is ``$NAME`` on the
controller, else the content of the file ``$NAME_FILE`` (the convention of Docker
secrets and systemd credentials, so a key can live in a 0600 file instead of a
shell's environment). A file readable by group or others is refused: the point of
the file is that only the operator reads it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

from fleetctl.errors import FleetError

#: vLLM's own variable for the key its OpenAI API requires (``Authorization: Bearer``).
API_KEY_ENV = "VLLM_API_KEY"
#: Only the stage uses the hub token: serving containers read staged weights from /opt.
HUB_TOKEN_ENV = "HF_TOKEN"
#: A secret file larger than this is a mistake (a key is < 1 KiB).
_MAX_FILE_BYTES = 64 * 1024


def file_var(name: str) -> str:
    """The variable naming the file that holds secret ``name``."""
    return f"{name}_FILE"


def lookup(name: str, environ: Mapping[str, str]) -> str | None:
    """The value of secret ``name`` (``$NAME``, else the file ``$NAME_FILE``), or None if neither
    is set."""
    value = environ.get(name)
    if value:
        return value
    path = environ.get(file_var(name))
    if not path:
        return None
    p = Path(path).expanduser()
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise FleetError(
                f"${file_var(name)} ({p}) is not a regular file",
                fix=f"point {file_var(name)} at a file holding only the value of {name}",
            )
        if st.st_mode & 0o077:
            raise FleetError(
                f"${file_var(name)} ({p}) is readable by other users (mode {st.st_mode & 0o777:o})",
                fix=f"chmod 600 {p}",
            )
        if st.st_size > _MAX_FILE_BYTES:
            raise FleetError(
                f"${file_var(name)} ({p}) is {st.st_size} bytes, too large for a secret",
                fix=f"point {file_var(name)} at a file holding only the value of {name}",
            )
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetError(
            f"cannot read ${file_var(name)} ({p}): {exc.strerror or exc}",
            fix=f"set {file_var(name)} to a readable file, or set {name} itself",
        ) from None
    # One trailing newline is what `echo KEY > file` leaves; the key itself has none.
    value = text.rstrip("\r\n")
    if not value or "\n" in value:
        raise FleetError(f"${file_var(name)} ({p}) must hold exactly one line, the value of {name}",
                         fix=f"write only the value: printf %s VALUE > {p}")
    return value


def resolve(names: Collection[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every secret of ``names`` that is set (by value or file); unset ones are left out."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for n in names:
        v = lookup(n, env)
        if v is not None:
            out[n] = v
    return out


def container_secrets(names: Collection[str]) -> tuple[str, ...]:
    """The secrets that go into a serving container: all but the hub token (weights are staged
    before)."""
    return tuple(n for n in names if n != HUB_TOKEN_ENV)


def api_key(names: Collection[str], environ: Mapping[str, str] | None = None, *,
            recipe: str = "") -> str | None:
    """The serving API key when the recipe requires one (``VLLM_API_KEY`` in its secret_env), else
    None.

    A recipe that lists the key but whose value is nowhere is refused: vLLM would start
    with its API open, which is exactly what listing it meant to prevent.
    """
    if API_KEY_ENV not in names:
        return None
    env = os.environ if environ is None else environ
    value = lookup(API_KEY_ENV, env)
    if value is None:
        what = f"recipe {recipe!r}" if recipe else "the recipe"
        raise FleetError(
            f"{what} requires {API_KEY_ENV} (secret_env) but neither ${API_KEY_ENV} nor "
            f"${file_var(API_KEY_ENV)} is set on the controller",
            fix=f"export {file_var(API_KEY_ENV)}=/path/to/0600-file (or {API_KEY_ENV}=...) before "
                "running fleetctl",
        )
    return value
