#!/usr/bin/python
"""Ansible module: write the binary (dearmored) form of an ASCII-armored OpenPGP key.

What ``gpg --dearmor`` does, without needing gnupg on the host (DGX OS and Debian
minimal images verify apt signatures with gpgv or sqv and may lack gpg). The
keyring is rewritten only when its content would change, so the task is idempotent.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: pgp_dearmor
short_description: Convert an ASCII-armored OpenPGP key to a binary keyring for apt's signed-by.
options:
  src:
    description: The armored key on the host.
    type: path
    required: true
  dest:
    description: The binary keyring to write.
    type: path
    required: true
  mode:
    description: File mode of dest.
    type: str
    default: "0644"
"""

_BLOCK = re.compile(
    r"-----BEGIN PGP PUBLIC KEY BLOCK-----\r?\n(?P<body>.*?)-----END PGP PUBLIC KEY BLOCK-----", re.S
)


def dearmor(text: str) -> bytes:
    """The binary packets of every public key block in ``text`` (RFC 4880 section 6.2)."""
    out = b""
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        raise ValueError("no 'BEGIN PGP PUBLIC KEY BLOCK' in the file")
    for m in blocks:
        body = m.group("body").replace("\r\n", "\n")
        # Armor headers (Version:, Comment:) end at the first blank line.
        if "\n\n" in body:
            head, data = body.split("\n\n", 1)
            if not all(":" in ln for ln in head.splitlines() if ln.strip()):
                data = body
        else:
            data = body
        lines = [ln.strip() for ln in data.splitlines() if ln.strip()]
        b64 = "".join(ln for ln in lines if not ln.startswith("="))  # "=XXXX" is the CRC-24 line
        out += base64.b64decode(b64, validate=True)
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={"src": {"type": "path", "required": True}, "dest": {"type": "path", "required": True},
                       "mode": {"type": "str", "default": "0644"}},
        supports_check_mode=True,
    )
    src, dest = module.params["src"], module.params["dest"]
    mode = int(module.params["mode"], 8)
    if not os.path.exists(src):
        if module.check_mode:  # the key would have been downloaded by an earlier task
            module.exit_json(changed=True, msg=f"{src} does not exist yet (check mode)")
        module.fail_json(msg=f"{src} does not exist")
    try:
        with open(src, encoding="ascii", errors="strict") as f:
            data = dearmor(f.read())
    except (UnicodeDecodeError, ValueError, binascii.Error) as e:
        module.fail_json(msg=f"{src} is not an ASCII-armored OpenPGP public key: {e}")
    current = None
    if os.path.exists(dest):
        with open(dest, "rb") as f:
            current = f.read()
    changed = current != data or (os.path.exists(dest) and (os.stat(dest).st_mode & 0o7777) != mode)
    if changed and not module.check_mode:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest) or ".", prefix=".dearmor-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    module.exit_json(changed=changed, dest=dest, size=len(data))


if __name__ == "__main__":
    main()
