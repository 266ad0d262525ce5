"""URLs built from host addresses bracket an IPv6 literal (issue 32, a problem noticed after the
third round): ``http://fd00::2:8000`` is no URL (its port reads as ``:2:8000``), so an IPv6 fleet's
soak, relay upstreams, LiteLLM deployments, Prometheus instances and Ray addresses were wrong.

Before: ``soak.fleet.host_target`` of a host at ``::1`` gave ``http://::1:PORT``, which the soak's
client cannot reach (a real server on [::1] below). Now: one helper, ``fleetctl.urls``, builds
every such URL and ``host:port``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import http.server
import socket
import threading
import urllib.parse
from collections.abc import Iterator

import pytest
import yaml

from fleetctl import paths
from fleetctl.frontdoor.litellm import LiteLLM
from fleetctl.inventory import Host
from fleetctl.recipes import parse_recipes
from fleetctl.soak.client import Client
from fleetctl.soak.fleet import host_target
from fleetctl.urls import host_port, http_url, url_host

SEED_FILE = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"


@pytest.mark.parametrize("address, shown", [
    ("fd00::2", "[fd00::2]"),
    ("[fd00::2]", "[fd00::2]"),
    ("::1", "[::1]"),
    ("fe80::1%eth0", "[fe80::1%25eth0]"),
    ("10.0.0.2", "10.0.0.2"),
    ("spark-01.lan", "spark-01.lan"),
])
def test_an_ipv6_literal_is_bracketed_and_nothing_else(address: str, shown: str) -> None:
    assert url_host(address) == shown
    assert host_port(address, 8000) == f"{shown}:8000"
    u = urllib.parse.urlsplit(http_url(address, 8000, "/v1"))
    assert u.port == 8000 and u.path == "/v1"


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


class _V6Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


@pytest.fixture
def v6_server() -> Iterator[int]:
    try:
        srv = _V6Server(("::1", 0), _Health)
    except OSError as e:  # a machine without IPv6 loopback
        pytest.skip(f"no IPv6 loopback here: {e}")
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _recipe(port: int) -> object:
    raw = copy.deepcopy(yaml.safe_load(SEED_FILE.read_text())["fleetctl_recipes"])
    r = parse_recipes(raw)["qwen36-35b-heretic"]
    return dataclasses.replace(r, port=port)


def test_the_soak_reaches_a_host_at_an_ipv6_address(v6_server: int) -> None:
    host = Host("spark-v6", "::1")
    target = host_target(host, _recipe(v6_server), "v1")  # type: ignore[arg-type]
    assert target.base_url == f"http://[::1]:{v6_server}"

    async def health() -> int:
        async with Client(target.base_url) as c:
            return (await c.get("/health")).status

    assert asyncio.run(health()) == 200


def test_litellm_deployments_get_bracketed_addresses() -> None:
    door = LiteLLM("http://litellm:4000", "m")
    assert door.host_api_base(Host("a", "fd00::2")) == "http://[fd00::2]:8000/v1"
    assert door.host_api_base(Host("b", "10.0.0.2")) == "http://10.0.0.2:8000/v1"
