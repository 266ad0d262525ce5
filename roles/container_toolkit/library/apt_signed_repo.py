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
import hashlib
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
  fingerprints:
    description: >-
      OpenPGP v4 fingerprints (40 hex digits, spaces ignored) of the primary keys the downloaded key
      file may hold. Every primary key in the file must be one of them, or nothing is written: a key
      fetched over the network is trusted only if it is the one pinned here.
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds allowed for the key's download.
    type: int
    default: 30
"""

_BLOCK = re.compile(
    r"-----BEGIN PGP PUBLIC KEY BLOCK-----\r?\n(?P<body>.*?)-----END PGP PUBLIC KEY BLOCK-----",
    re.S,
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
    """A binary keyring from a downloaded key: dearmored when armored, as it is when already
    binary."""
    if b"-----BEGIN PGP PUBLIC KEY BLOCK-----" in raw:
        return dearmor(raw.decode("ascii"))
    # A binary OpenPGP packet starts with a byte whose high bit is set (RFC 4880 section 4.2).
    if raw and raw[0] & 0x80:
        return raw
    raise ValueError("neither an ASCII-armored nor a binary OpenPGP public key")


def _packets(data: bytes) -> list[tuple[int, bytes]]:
    """``(tag, body)`` of each OpenPGP packet (RFC 4880 section 4.2: old and new formats)."""
    out = []
    i = 0
    while i < len(data):
        b0 = data[i]
        if not b0 & 0x80:
            raise ValueError(f"byte {i} does not start an OpenPGP packet")
        if b0 & 0x40:  # new format
            tag, i = b0 & 0x3F, i + 1
            l1 = data[i]
            if l1 < 192:
                n, i = l1, i + 1
            elif l1 < 224:
                n, i = ((l1 - 192) << 8) + data[i + 1] + 192, i + 2
            elif l1 == 255:
                n, i = int.from_bytes(data[i + 1:i + 5], "big"), i + 5
            else:
                raise ValueError("a partial-length packet in a key file")
        else:
            tag, kind, i = (b0 >> 2) & 0x0F, b0 & 0x03, i + 1
            if kind == 3:
                raise ValueError("an indeterminate-length packet in a key file")
            size = (1, 2, 4)[kind]
            n, i = int.from_bytes(data[i:i + size], "big"), i + size
        if i + n > len(data):
            raise ValueError("a packet runs past the end of the key file")
        out.append((tag, data[i:i + n]))
        i += n
    return out


def primary_fingerprints(keyring: bytes) -> list[str]:
    """The v4 fingerprints (uppercase hex) of the primary public keys (tag 6) in a binary
    keyring."""
    fps = []
    for tag, body in _packets(keyring):
        if tag != 6:
            continue
        if not body or body[0] != 4:
            raise ValueError(
                f"a version {body[0] if body else '?'} primary key (only v4 keys can be pinned)"
            )
        fps.append(hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper())
    if not fps:
        raise ValueError("no primary public key in it")
    return fps


def check_pinned(keyring: bytes, pins: list[str]) -> str | None:
    """None when every primary key of ``keyring`` is pinned; else why not (for the failure
    message)."""
    want = {p.replace(" ", "").upper() for p in pins}
    if not want:
        return "no fingerprint is pinned (container_toolkit_repo_key_fingerprints is empty)"
    got = primary_fingerprints(keyring)
    extra = [f for f in got if f not in want]
    if extra:
        return f"it holds key(s) {', '.join(extra)}, not the pinned {', '.join(sorted(want))}"
    return None


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
            "fingerprints": {"type": "list", "elements": "str", "required": True},
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
    try:
        why = check_pinned(keyring, p["fingerprints"])
    except (ValueError, IndexError) as e:
        why = f"it cannot be read as OpenPGP keys ({e})"
    if why:
        module.fail_json(
            msg=f"the signing key from {p['key_url']} is refused: {why} (fix: check the new key's "
            "fingerprint out of band, e.g. on the vendor's site, then update "
            "container_toolkit_repo_key_fingerprints)"
        )
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
