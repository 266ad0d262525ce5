#!/usr/bin/python
"""Ansible module: an apt repository trusted through its own keyring (``signed-by``), in one step.

Downloads the repository's signing key (ASCII-armored, as NVIDIA publishes it,
or already binary), dearmors it the way ``gpg --dearmor`` does without needing
gnupg on the host (DGX OS and minimal Debian images verify apt signatures with
gpgv or sqv and may lack gpg), and writes the keyring and the one-line source
file, each only when its content changes. Never ``apt-key``: a key in the
keyring is trusted for the one repository that names it. In check mode it still
downloads and compares, so it reports a change only when there is one. One
module run instead of get_url + dearmor + copy: a third of the round trips.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url

DOCUMENTATION = r"""
module: apt_signed_repo
short_description: Add an apt repository with its signing key in its own keyring (signed-by).
options:
  key_url:
    description: Where the signing key is (http, https or file URL); armored or binary.
    type: str
    required: true
  keyring:
    description: The binary keyring to write (the source line's signed-by).
    type: path
    required: true
  source_file:
    description: The file under /etc/apt/sources.list.d/ to write.
    type: path
    required: true
  source:
    description: The complete source line, e.g. "deb [signed-by=KEYRING] URL /".
    type: str
    required: true
  timeout:
    description: Seconds allowed for the key's download.
    type: int
    default: 30
"""

_BLOCK = re.compile(
    r"-----BEGIN PGP PUBLIC KEY BLOCK-----\r?\n(?P<body>.*?)-----END PGP PUBLIC KEY BLOCK-----", re.S
)


def dearmor(text: str) -> bytes:
    """The binary packets of every public key block in ``text`` (RFC 4880 section 6.2)."""
    out = b""
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        raise ValueError("no 'BEGIN PGP PUBLIC KEY BLOCK' in it")
    for m in blocks:
        body = m.group("body").replace("\r\n", "\n")
        data = body
        # Armor headers (Version:, Comment:) end at the first blank line.
        if "\n\n" in body:
            head, rest = body.split("\n\n", 1)
            if all(":" in ln for ln in head.splitlines() if ln.strip()):
                data = rest
        lines = [ln.strip() for ln in data.splitlines() if ln.strip()]
        b64 = "".join(ln for ln in lines if not ln.startswith("="))  # "=XXXX" is the CRC-24 line
        out += base64.b64decode(b64, validate=True)
    return out


def to_keyring(raw: bytes) -> bytes:
    """A binary keyring from a downloaded key: dearmored when armored, as it is when already binary."""
    if b"-----BEGIN PGP PUBLIC KEY BLOCK-----" in raw:
        return dearmor(raw.decode("ascii"))
    # A binary OpenPGP packet starts with a byte whose high bit is set (RFC 4880 section 4.2).
    if raw and raw[0] & 0x80:
        return raw
    raise ValueError("neither an ASCII-armored nor a binary OpenPGP public key")


def _read(path: str) -> bytes | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def _write(path: str, data: bytes) -> None:
    """Atomically, mode 0644 (apt reads keyrings and sources as the _apt user)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".apt_signed_repo-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _needs(path: str, data: bytes) -> bool:
    return _read(path) != data or (os.stat(path).st_mode & 0o7777) != 0o644


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "key_url": {"type": "str", "required": True},
            "keyring": {"type": "path", "required": True},
            "source_file": {"type": "path", "required": True},
            "source": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    p = module.params
    resp, info = fetch_url(module, p["key_url"], timeout=p["timeout"])
    if info.get("status") != 200 or resp is None:
        module.fail_json(msg=f"cannot download the signing key {p['key_url']}: "
                             f"HTTP {info.get('status')} {info.get('msg', '')}".strip())
    try:
        keyring = to_keyring(resp.read())
    except (UnicodeDecodeError, ValueError, binascii.Error) as e:
        module.fail_json(msg=f"{p['key_url']} is not an OpenPGP public key: {e}")
    source = (p["source"].strip() + "\n").encode()
    key_changed = _needs(p["keyring"], keyring)
    source_changed = _needs(p["source_file"], source)
    diff = []
    if key_changed:
        before = _read(p["keyring"])
        diff.append({"before_header": p["keyring"], "after_header": p["key_url"],
                     "before": f"{len(before)} bytes\n" if before is not None else "",
                     "after": f"{len(keyring)} bytes (dearmored key)\n"})
    if source_changed:
        before = _read(p["source_file"])
        diff.append({"before_header": p["source_file"], "after_header": p["source_file"],
                     "before": before.decode(errors="replace") if before is not None else "",
                     "after": source.decode()})
    if not module.check_mode:
        if key_changed:
            _write(p["keyring"], keyring)
        if source_changed:
            _write(p["source_file"], source)
    module.exit_json(changed=key_changed or source_changed, keyring_changed=key_changed,
                     source_changed=source_changed, diff=diff)


if __name__ == "__main__":
    main()
