"""URLs and ``host:port`` strings built from host addresses (an IPv6 literal bracketed), and URLs
shown without their ``user:password@``: the one place for both."""

from __future__ import annotations

import ipaddress
import re

#: What a credential is replaced with.
REDACTED = "<redacted>"

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@]+@")


def url_host(address: str) -> str:
    """``address`` as the host part of a URL or ``host:port``: an IPv6 literal in brackets (its
    zone, ``%eth0``, written ``%25eth0`` as RFC 6874 has it), anything else as it is."""
    bare = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return address
    if ip.version != 6:
        return address
    addr, _, zone = bare.partition("%")
    return f"[{addr}%25{zone}]" if zone else f"[{addr}]"


def host_port(address: str, port: int | str) -> str:
    """``address:port`` (``[fd00::2]:8000`` for an IPv6 literal)."""
    return f"{url_host(address)}:{port}"


def http_url(address: str, port: int | str, path: str = "") -> str:
    """``http://address:port`` + ``path``, the address bracketed when it is an IPv6 literal."""
    return f"http://{host_port(address, port)}{path}"


def redact_url(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced (for messages and progress
    about a URL that has one)."""
    return _USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text) if "@" in text else text
