"""The registry client against a real loopback HTTP server speaking the OCI distribution API."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from fleetctl import registry
from fleetctl.errors import FleetError

TAGS = ["2026-06-11-pr41703", "2026-06-18-v0.23.0-dflashfix", "2026-07-01-v0.24.0", "latest",
        *[f"old-{i:03d}" for i in range(7)]]
INDEX = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": []}).encode()
DIGEST = "sha256:" + hashlib.sha256(INDEX).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def _auth_ok(self) -> bool:
        if not self.server.bearer:
            return True
        if self.headers.get("Authorization") == "Bearer tok-123":
            return True
        self.send_response(401)
        realm = f"http://127.0.0.1:{self.server.server_port}/token"
        self.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="test-reg",scope="repository:aeon-7/vllm:pull"')
        self.end_headers()
        return False

    def do_HEAD(self) -> None:
        self._manifest(body=False)

    def do_GET(self) -> None:
        u = urlsplit(self.path)
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        if u.path == "/token":
            q = parse_qs(u.query)
            assert q["service"] == ["test-reg"] and q["scope"] == ["repository:aeon-7/vllm:pull"]
            self._send(200, json.dumps({"token": "tok-123"}).encode(), "application/json")
            return
        if u.path.endswith("/tags/list"):
            if not self._auth_ok():
                return
            if not u.path.startswith("/v2/aeon-7/vllm/"):
                self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}', "application/json")
                return
            q = parse_qs(u.query)
            n = int(q.get("n", ["100"])[0])
            n = min(n, 4)  # a registry may return fewer than asked: the client must follow Link
            last = q.get("last", [""])[0]
            rest = sorted(t for t in self.server.tags if t > last)
            page = rest[:n]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if len(rest) > n:
                self.send_header("Link", f'</v2/aeon-7/vllm/tags/list?n={n}&last={page[-1]}>; rel="next"')
            body = json.dumps({"name": "aeon-7/vllm", "tags": page}).encode()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._manifest(body=True)

    def _manifest(self, body: bool) -> None:
        if not self._auth_ok():
            return
        accept = self.headers.get("Accept", "")
        self.server.accepts.append(accept)
        if "application/vnd.oci.image.index.v1+json" not in accept:
            self._send(404, b"{}", "application/json", body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
        if self.server.digest_header:
            self.send_header("Docker-Content-Digest", DIGEST)
        self.send_header("Content-Length", str(len(INDEX)))
        self.end_headers()
        if body:
            self.wfile.write(INDEX)

    def _send(self, code: int, data: bytes, ctype: str, body: bool = True) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    bearer = False
    digest_header = True
    tags: list[str]
    seen: list[tuple[str, str, dict[str, str]]]
    accepts: list[str]


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server(("127.0.0.1", 0), _Handler)
    s.tags, s.seen, s.accepts = list(TAGS), [], []
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


def mirrors(s: _Server) -> dict[str, str]:
    return {"ghcr.io": f"127.0.0.1:{s.server_port}"}


def test_resolve_through_insecure_mirror_with_pagination(server: _Server) -> None:
    got = registry.resolve("ghcr.io/aeon-7/vllm", "v0.24.0", mirrors(server))
    assert (got.tag, got.digest, got.image) == ("2026-07-01-v0.24.0", DIGEST, "ghcr.io/aeon-7/vllm")
    assert got.media_type == "application/vnd.oci.image.index.v1+json"
    pages = [p for m, p, _ in server.seen if "tags/list" in p]
    assert len(pages) == 3  # 11 tags, 4 per page
    assert all("application/vnd.docker.distribution.manifest.v2+json" in a for a in server.accepts)


def test_bearer_challenge_gets_anonymous_token(server: _Server) -> None:
    server.bearer = True
    reg = registry.Registry("ghcr.io", mirrors(server), env={})
    assert "2026-06-18-v0.23.0-dflashfix" in reg.tags("aeon-7/vllm")
    token_calls = [h for m, p, h in server.seen if p.startswith("/token")]
    assert len(token_calls) == 1 and "Authorization" not in token_calls[0]  # anonymous, then cached


def test_bearer_token_request_carries_env_credentials(server: _Server) -> None:
    server.bearer = True
    reg = registry.Registry("ghcr.io", mirrors(server), env={"FLEETCTL_REGISTRY_USER": "ops",
                                                             "FLEETCTL_REGISTRY_PASSWORD": "s3cret"})
    reg.digest("aeon-7/vllm", "latest")
    token_calls = [h for m, p, h in server.seen if p.startswith("/token")]
    assert token_calls[0]["Authorization"].startswith("Basic ")


def test_digest_from_body_when_head_lacks_header(server: _Server) -> None:
    server.digest_header = False
    digest, _ = registry.Registry("ghcr.io", mirrors(server)).digest("aeon-7/vllm", "latest")
    assert digest == DIGEST


def test_missing_repository_and_unreachable_registry(server: _Server) -> None:
    with pytest.raises(FleetError, match="does not exist"):
        registry.resolve("ghcr.io/aeon-7/nope", "latest", mirrors(server))
    port = server.server_port
    server.shutdown()
    server.server_close()
    with pytest.raises(FleetError, match="cannot reach registry"):
        registry.resolve("ghcr.io/aeon-7/vllm", "latest", {"ghcr.io": f"127.0.0.1:{port}"}, timeout=2)


@pytest.mark.parametrize(("wanted", "tag"), [
    ("v0.24.0", "2026-07-01-v0.24.0"),
    ("v0.23.0", "2026-06-18-v0.23.0-dflashfix"),
    ("pr41703", "2026-06-11-pr41703"),
    ("latest", "latest"),
    ("2026-07-01-v0.24.0", "2026-07-01-v0.24.0"),
])
def test_resolve_tag(wanted: str, tag: str) -> None:
    assert registry.resolve_tag(wanted, TAGS) == tag


def test_suffix_beats_inner_part_and_exact_beats_both() -> None:
    tags = ["2026-07-01-v0.24.0", "2026-07-09-v0.24.0-decay"]
    assert registry.resolve_tag("v0.24.0", tags) == "2026-07-01-v0.24.0"
    assert registry.resolve_tag("decay", tags) == "2026-07-09-v0.24.0-decay"


def test_ambiguous_and_missing_tags_list_candidates() -> None:
    with pytest.raises(FleetError, match=r"ambiguous.*2026-07-01-v0.24.0, 2026-07-05-v0.24.0"):
        registry.resolve_tag("v0.24.0", ["2026-07-01-v0.24.0", "2026-07-05-v0.24.0"])
    with pytest.raises(FleetError) as e:
        registry.resolve_tag("v9.9.9", TAGS, "ghcr.io/x")
    assert "no tag 'v9.9.9' in ghcr.io/x" in e.value.message() and "2026-07-01-v0.24.0" in e.value.message()


@pytest.mark.parametrize(("image", "reg", "repo", "ref"), [
    ("ghcr.io/aeon-7/aeon-vllm-ultimate", "ghcr.io", "aeon-7/aeon-vllm-ultimate", "ghcr.io/aeon-7/aeon-vllm-ultimate"),
    ("vllm/vllm-openai", "docker.io", "vllm/vllm-openai", "vllm/vllm-openai"),
    ("ubuntu:24.04", "docker.io", "library/ubuntu", "ubuntu"),
    ("10.78.6.1:5000/aeon-7/x:tag", "10.78.6.1:5000", "aeon-7/x", "10.78.6.1:5000/aeon-7/x"),
    ("localhost/x@sha256:ab", "localhost", "x", "localhost/x"),
])
def test_image_name_parse(image: str, reg: str, repo: str, ref: str) -> None:
    n = registry.ImageName.parse(image)
    assert (n.registry, n.repository, n.ref) == (reg, repo, ref)


def test_endpoints_and_pull_refs() -> None:
    m = {"ghcr.io": "10.78.6.1:5000", "docker.io": "https://mirror.example"}
    assert registry.endpoint("ghcr.io", m).base == "http://10.78.6.1:5000"
    assert registry.endpoint("docker.io", m).base == "https://mirror.example"
    assert registry.endpoint("docker.io").base == "https://registry-1.docker.io"
    assert registry.endpoint("quay.io", m).base == "https://quay.io"
    d = "sha256:" + "a" * 64
    assert registry.pull_ref("ghcr.io/aeon-7/x", d, m) == f"10.78.6.1:5000/aeon-7/x@{d}"
    assert registry.pull_ref("ghcr.io/aeon-7/x", d) == f"ghcr.io/aeon-7/x@{d}"
