#!/usr/bin/python
"""Ansible module: install a repository signing key as a binary keyring for apt's ``signed-by``.

Downloads the key (ASCII-armored, as NVIDIA publishes it, or already binary),
dearmors it the way ``gpg --dearmor`` does without needing gnupg on the host
(DGX OS and minimal Debian images verify apt signatures with gpgv or sqv and may
lack gpg), and rewrites the keyring only when its content changes. In check mode
it still downloads and compares, so it reports a change only when there is one.
Never ``apt-key``: a key in the keyring is trusted for the one repository that names it.
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
module: apt_keyring
short_description: Install an apt repository's signing key as a binary keyring (for signed-by).
options:
  url:
    description: Where the key is (http, https or file URL); armored or binary.
    type: str
    required: true
  dest:
    description: The binary keyring to write.
    type: path
    required: true
  mode:
    description: File mode of dest.
    type: str
    default: "0644"
  timeout:
    description: Seconds allowed for the download.
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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "mode": {"type": "str", "default": "0644"},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    url, dest = module.params["url"], module.params["dest"]
    mode = int(module.params["mode"], 8)
    resp, info = fetch_url(module, url, timeout=module.params["timeout"])
    if info.get("status") != 200 or resp is None:
        module.fail_json(msg=f"cannot download the signing key {url}: HTTP {info.get('status')} {info.get('msg', '')}".strip())
    try:
        data = to_keyring(resp.read())
    except (UnicodeDecodeError, ValueError, binascii.Error) as e:
        module.fail_json(msg=f"{url} is not an OpenPGP public key: {e}")
    current = None
    if os.path.exists(dest):
        with open(dest, "rb") as f:
            current = f.read()
    changed = current != data or (os.stat(dest).st_mode & 0o7777) != mode
    if changed and not module.check_mode:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest) or ".", prefix=".apt_keyring-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    diff = {"before": f"{len(current)} bytes" if current is not None else "(absent)\n",
            "after": f"{len(data)} bytes", "before_header": dest, "after_header": url} if changed else {}
    module.exit_json(changed=changed, dest=dest, size=len(data), diff=diff)


if __name__ == "__main__":
    main()
