"""The registry client against hostile registries and token servers on 127.0.0.1 (issue 39).

Each server here answers as an attacker would: pagination links to another origin, tag pages that
never end, a header drip, a realm of another scheme or port, JSON nested past the parser's limit,
a ``Docker-Content-Digest`` naming other bytes. Every call runs in a thread joined with a bound, so
that a client that hangs fails the test instead of holding it.
"""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetctl import httpbound, registry
from fleetctl.errors import FleetError
from tests.test_registry import tls_cert  # noqa: F401 (a fixture)

CREDS = {"FLEETCTL_REGISTRY_USER": "probeuser", "FLEETCTL_REGISTRY_PASSWORD": "S3cretRegPass"}
Route = Callable[["_Handler"], None]


class _Handler(BaseHTTPRequestHandler):
    server: _Hostile

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        self.server.route(self)

    do_HEAD = do_GET

    def send(self, code: int, body: bytes, **headers: str) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _Hostile(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, route: Route) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.route = route
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    @property
    def base(self) -> str:
        return f"127.0.0.1:{self.server_port}"


@pytest.fixture
def serve() -> Iterator[Callable[[Route], _Hostile]]:
    made: list[_Hostile] = []

    def start(route: Route) -> _Hostile:
        s = _Hostile(route)
        threading.Thread(target=s.serve_forever, daemon=True).start()
        made.append(s)
        return s

    yield start
    for s in made:
        s.shutdown()
        s.server_close()


def bounded(fn: Callable[[], object], limit: float) -> tuple[BaseException | None, float]:
    """``fn()``'s exception (None if it returned) and its seconds; fails if it runs past
    ``limit``."""
    out: list[BaseException | None] = [None]

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            out[0] = e

    t0 = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"still running after {limit}s"
    return out[0], time.monotonic() - t0


def _bearer(route: Route) -> Route:
    """``route`` behind a bearer challenge whose realm is the server's own /token."""

    def auth(h: _Handler) -> None:
        if h.path.startswith("/token"):
            h.send(200, b'{"token": "tok-secret-123"}')
        elif h.headers.get("Authorization") != "Bearer tok-secret-123":
            realm = f"http://127.0.0.1:{h.server.server_port}/token"
            h.send(401, b"", WWW_Authenticate=f'Bearer realm="{realm}",service="r"')
        else:
            route(h)

    return auth


def test_a_next_page_on_another_origin_is_refused_and_gets_no_authorization(serve: Any) -> None:
    """Medium 1: a Link to another port (or host, or scheme) carried the cached token there."""
    thief = serve(lambda h: h.send(200, b'{"tags": ["stolen"]}'))
    for target in (f"http://{thief.base}/v2/x/tags/list", f"//{thief.base}/v2/x/tags/list"):
        reg_srv = serve(_bearer(lambda h, t=target: h.send(
            200, b'{"tags": ["v1"]}', Link=f'<{t}>; rel="next"')))
        reg = registry.Registry("ghcr.io", {"ghcr.io": reg_srv.base}, env=CREDS)
        with pytest.raises(FleetError, match="another origin") as e:
            reg.tags("aeon-7/vllm")
        assert thief.base in e.value.message() and "tok-secret" not in e.value.message()
    assert thief.seen == []
    # The same origin is followed (a page of the registry itself), with its token.
    pages: list[str] = []

    def paged(h: _Handler) -> None:
        pages.append(h.headers.get("Authorization", ""))
        link = {} if "last=" in h.path else {"Link": '</v2/aeon-7/vllm/tags/list?last=a>; rel=next'}
        h.send(200, json.dumps({"tags": [f"t{len(pages)}"]}).encode(), **link)

    own = serve(_bearer(paged))
    assert registry.Registry("ghcr.io", {"ghcr.io": own.base}).tags("aeon-7/vllm") == ["t1", "t2"]
    assert pages == ["Bearer tok-secret-123"] * 2


def test_tag_pages_are_capped_in_all_and_the_suggestion_work_is_bounded(serve: Any) -> None:
    """Medium 3: 100 pages just under 4 MiB each were accumulated (25 pages: 1.2 GB, 76 s)."""
    page = json.dumps({"tags": [f"t{i:06d}-{'x' * 100}" for i in range(10000)]}).encode()
    assert len(page) > 1 << 20

    def endless(h: _Handler) -> None:
        h.send(200, page, Link=f'</v2/aeon-7/vllm/tags/list?last={len(h.server.seen)}>; rel=next')

    s = serve(endless)
    err, took = bounded(lambda: registry.Registry("ghcr.io", {"ghcr.io": s.base}).tags(
        "aeon-7/vllm"), 60)
    assert isinstance(err, FleetError) and "tag pages" in err.message(), err
    assert len(s.seen) <= 9  # 8 MiB of pages, not 100
    # An unknown tag among the most tags a list may hold: the closest-match work is bounded.
    tags = [f"2026-01-{i:06d}-v0.{i}.0-{'y' * 90}" for i in range(registry.MAX_TAGS)]
    err, took = bounded(lambda: registry.resolve_tag("v0.24.1-yyyy", tags), 30)
    assert isinstance(err, FleetError) and took < 5, took


def _drip(h: _Handler) -> None:
    h.wfile.write(b"HTTP/1.1 200 OK\r\n")
    for i in range(400):  # a header a byte at a time, 20 bytes/s, never ending within the test
        try:
            h.wfile.write(b"X-Pad-%d: " % i if i % 50 == 0 else b"a")
            h.wfile.flush()
        except OSError:
            return
        time.sleep(0.05)


def test_a_header_drip_ends_at_the_requests_deadline(serve: Any) -> None:
    """Medium 4: the deadline was checked only while reading the body (95 s and waiting)."""
    s = serve(_drip)
    reg = registry.Registry("ghcr.io", {"ghcr.io": s.base}, timeout=5, deadline=1.5)
    err, took = bounded(lambda: reg.tags("aeon-7/vllm"), 15)
    assert isinstance(err, FleetError) and "within 2s" in err.message(), err
    assert took < 4, took


@pytest.mark.parametrize("realm", ["file:///dev/stdin#", "ftp://127.0.0.1/token",
                                   "data:,{\"token\":\"t\"}"])
def test_a_realm_of_another_scheme_is_refused(serve: Any, realm: str) -> None:
    """Low 7: ``file:///dev/stdin#`` as the realm read the controller's stdin (hung 75 s)."""
    s = serve(lambda h: h.send(401, b"", WWW_Authenticate=f'Bearer realm="{realm}"'))
    err, _ = bounded(lambda: registry.Registry("ghcr.io", {"ghcr.io": s.base}).tags("a/b"), 10)
    assert isinstance(err, FleetError) and "must be http or https" in err.message(), err


def test_the_opener_speaks_http_and_https_only(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_text("not for servers")
    with pytest.raises(urllib.error.URLError, match="unknown url type"):
        httpbound.exchange(urllib.request.Request(f"file://{f}"), timeout=1, deadline=2,
                           max_bytes=100)


def test_credentials_go_to_the_registrys_own_port_only(
    serve: Any, tls_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """Low 8: a token server on another port of the registry's host got the password."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*tls_cert)
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))
    token = serve(lambda h: h.send(401 if "Authorization" not in h.headers else 200,
                                   b'{"token": "t"}'))
    token.socket = ctx.wrap_socket(token.socket, server_side=True)
    realm = f"https://127.0.0.1:{token.server_port}/token"
    reg_srv = serve(lambda h: h.send(401, b"", WWW_Authenticate=f'Bearer realm="{realm}"'))
    reg_srv.socket = ctx.wrap_socket(reg_srv.socket, server_side=True)
    mirror = {"ghcr.io": f"https://{reg_srv.base}"}
    with pytest.raises(FleetError, match="were not sent") as e:
        registry.Registry("ghcr.io", mirror, env=CREDS).tags("aeon-7/vllm")
    assert "S3cret" not in e.value.message()
    assert [h.get("Authorization") for _, p, h in token.seen] == [None]
    # listed with its port, it is the registry's token service
    with pytest.raises(FleetError, match="refused access"):
        registry.Registry("ghcr.io", mirror, env=CREDS,
                          auth_hosts=[token.base]).tags("aeon-7/vllm")
    assert (token.seen[-1][2].get("Authorization") or "").startswith("Basic ")


@pytest.mark.parametrize("body", [b"[" * 200_000, b'{"tags": ' + b"[" * 200_000],
                         ids=["array", "in-an-object"])
def test_deeply_nested_json_is_one_clear_error(serve: Any, body: bytes) -> None:
    """Low 6: ``internal error: RecursionError`` (exit 70) before."""
    s = serve(lambda h: h.send(200, body))
    with pytest.raises(FleetError, match="nested too deep"):
        registry.Registry("ghcr.io", {"ghcr.io": s.base}).tags("aeon-7/vllm")


def test_a_content_digest_that_is_not_the_bodys_hash_is_refused(serve: Any) -> None:
    """Low 11: the header was pinned as given, whatever bytes came with it."""
    manifest = json.dumps({"schemaVersion": 2, "manifests": []}).encode()
    real = "sha256:" + hashlib.sha256(manifest).hexdigest()
    lie = "sha256:" + "e" * 64
    media = "application/vnd.oci.image.index.v1+json"

    def route(h: _Handler) -> None:
        digest = {} if h.command == "HEAD" else {"Docker_Content_Digest": h.server.digest}
        h.send(200, manifest, Content_Type=media, **digest)

    s = serve(route)
    s.digest = lie  # type: ignore[attr-defined]
    with pytest.raises(FleetError, match="is not the sha256 of the manifest") as e:
        registry.Registry("ghcr.io", {"ghcr.io": s.base}).digest("aeon-7/vllm", "v1")
    assert real in e.value.message()
    s.digest = real  # type: ignore[attr-defined]
    assert registry.Registry("ghcr.io", {"ghcr.io": s.base}).digest("aeon-7/vllm", "v1") == (
        real, media)
