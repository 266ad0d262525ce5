"""The registry client against a real loopback HTTP server speaking the OCI distribution API."""

from __future__ import annotations

import hashlib
import json
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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
        if self.server.basic:
            if self.headers.get("Authorization", "").startswith("Basic "):
                self.server.seen.append(("BASIC", self.path, dict(self.headers)))
            self.send_header("WWW-Authenticate", 'Basic realm="test-reg"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        realm = self.server.realm or f"http://127.0.0.1:{self.server.server_port}/token"
        self.send_header(
            "WWW-Authenticate",
            f'Bearer realm="{realm}",service="test-reg",scope="repository:aeon-7/vllm:pull"',
        )
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
        if u.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(200):
                try:
                    self.wfile.write(b"[")
                    self.wfile.flush()
                except OSError:
                    return  # the client gave up, as it should
                time.sleep(0.05)
            return
        if u.path.endswith("/tags/list") and self.server.huge:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            chunk = b" " * 65536
            for _ in range(80):  # 5 MiB of whitespace, then nothing: only a cap stops the read
                self.wfile.write(chunk)
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
                self.send_header(
                    "Link", f'</v2/aeon-7/vllm/tags/list?n={n}&last={page[-1]}>; rel="next"'
                )
            body = json.dumps({"name": "aeon-7/vllm", "tags": page}).encode()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._manifest(body=True)

    def _manifest(self, body: bool) -> None:
        if not self._auth_ok():
            return
        by_digest = self.server.manifests.get(self.path.rsplit("/", 1)[-1])
        if by_digest is not None:
            media, data = by_digest
            self._send(200, data, media, body)
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
    basic = False
    huge = False
    realm = ""
    digest_header = True
    tags: list[str]
    seen: list[tuple[str, str, dict[str, str]]]
    accepts: list[str]
    #: digest -> (media type, body): manifests served by digest.
    manifests: dict[str, tuple[str, bytes]]


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server(("127.0.0.1", 0), _Handler)
    s.tags, s.seen, s.accepts, s.manifests = list(TAGS), [], [], {}
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


CREDS = {"FLEETCTL_REGISTRY_USER": "ops", "FLEETCTL_REGISTRY_PASSWORD": "s3cret"}


def test_credentials_never_go_over_plain_http(server: _Server) -> None:
    server.bearer = True
    reg = registry.Registry("ghcr.io", mirrors(server), env=CREDS)
    reg.digest("aeon-7/vllm", "latest")  # the token service issues anonymous tokens: it still works
    token_calls = [h for m, p, h in server.seen if p.startswith("/token")]
    assert token_calls and all("Authorization" not in h for h in token_calls)


def test_a_basic_challenge_over_plain_http_is_refused_not_answered(server: _Server) -> None:
    server.bearer = server.basic = True
    with pytest.raises(FleetError) as e:
        registry.Registry("ghcr.io", mirrors(server), env=CREDS).tags("aeon-7/vllm")
    assert "is not https" in e.value.cause and "https://" in (e.value.fix or "")
    assert not [p for m, p, h in server.seen if m == "BASIC"] and "s3cret" not in e.value.message()


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (one server, two host names)."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=lo",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_server(
    server: _Server, tls_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> _Server:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*tls_cert)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    # The client verifies the certificate like any other: this CA is the only one it trusts here.
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))
    return server


def _token_auth(s: _Server) -> list[str | None]:
    return [h.get("Authorization") for m, p, h in s.seen if p.startswith("/token")]


def test_credentials_go_over_https_to_the_registrys_own_realm_only(tls_server: _Server) -> None:
    port = tls_server.server_port
    tls_server.bearer = True
    mirror = {"ghcr.io": f"https://127.0.0.1:{port}"}
    tls_server.realm = f"https://127.0.0.1:{port}/token"
    registry.Registry("ghcr.io", mirror, env=CREDS).digest("aeon-7/vllm", "latest")
    assert (_token_auth(tls_server)[-1] or "").startswith("Basic ")
    # Another host named as realm (the same server under a second name): asked anonymously.
    tls_server.realm = f"https://localhost:{port}/token"
    registry.Registry("ghcr.io", mirror, env=CREDS).digest("aeon-7/vllm", "latest")
    assert _token_auth(tls_server)[-1] is None
    # ... unless the inventory lists it as this registry's token service.
    registry.Registry("ghcr.io", mirror, env=CREDS, auth_hosts=[f"localhost:{port}"]).digest(
        "aeon-7/vllm", "latest"
    )
    assert (_token_auth(tls_server)[-1] or "").startswith("Basic ")
    plain = _Server(("127.0.0.1", 0), _Handler)
    plain.tags, plain.seen, plain.accepts = [], [], []
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    try:
        # An https registry naming a plain-http realm: refused, nothing sent there (issue 39).
        tls_server.realm = f"http://127.0.0.1:{plain.server_port}/token"
        with pytest.raises(FleetError, match="must be https"):
            registry.Registry("ghcr.io", mirror, env=CREDS).digest("aeon-7/vllm", "latest")
        assert _token_auth(plain) == []
    finally:
        plain.shutdown()
        plain.server_close()


def test_answers_are_capped_in_size_and_in_time(server: _Server) -> None:
    server.huge = True
    with pytest.raises(FleetError, match="more than 4 MiB"):
        registry.Registry("ghcr.io", mirrors(server)).tags("aeon-7/vllm")
    # 1 byte every 0.05 s for 10 s never trips a 5 s idle timeout: the overall deadline ends it.
    reg = registry.Registry("ghcr.io", mirrors(server), timeout=5, deadline=1)
    with pytest.raises(FleetError, match="did not finish its answer within 1s"):
        reg._raw("GET", f"http://127.0.0.1:{server.server_port}/drip", {})


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
        registry.resolve(
            "ghcr.io/aeon-7/vllm", "latest", {"ghcr.io": f"127.0.0.1:{port}"}, timeout=2
        )


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
    assert (
        "no tag 'v9.9.9' in ghcr.io/x" in e.value.message()
        and "2026-07-01-v0.24.0" in e.value.message()
    )


def test_an_unknown_tag_lists_the_versions_newest_first_and_the_closest_matches() -> None:
    # A real registry: hundreds of test builds and nightlies besides the versions.
    tags = [
        *TAGS,
        *(f"nightly-2026{i:04d}" for i in range(300)),
        "2026-05-01-v0.9.1",
        "zz-test-image",
    ]
    with pytest.raises(FleetError) as e:
        registry.resolve_tag("v0.24.1", tags)
    fix = e.value.fix or ""
    assert fix.startswith("versions, newest first: v0.24.0 (2026-07-01-v0.24.0), v0.23.0 "
                          "(2026-06-18-v0.23.0-dflashfix), v0.9.1 (2026-05-01-v0.9.1)"), fix
    assert "closest to 'v0.24.1': v0.24.0" in fix and "nightly" not in fix
    assert registry.versions(["latest", "nightly"]) == []
    with pytest.raises(FleetError, match="no tag here names a version"):
        registry.resolve_tag("v1", ["latest", "nightly"])


@pytest.mark.parametrize(
    ("image", "reg", "repo", "ref"),
    [
        (
            "ghcr.io/aeon-7/aeon-vllm-ultimate",
            "ghcr.io",
            "aeon-7/aeon-vllm-ultimate",
            "ghcr.io/aeon-7/aeon-vllm-ultimate",
        ),
        ("vllm/vllm-openai", "docker.io", "vllm/vllm-openai", "vllm/vllm-openai"),
        ("ubuntu:24.04", "docker.io", "library/ubuntu", "ubuntu"),
        ("10.78.6.1:5000/aeon-7/x:tag", "10.78.6.1:5000", "aeon-7/x", "10.78.6.1:5000/aeon-7/x"),
        ("localhost/x@sha256:ab", "localhost", "x", "localhost/x"),
    ],
)
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


@pytest.mark.parametrize(
    "wanted", ["v0.24.0; rm -rf /", "-v1", ".v1", "v1/../x", "a" * 129, "", "v1\n"]
)
def test_a_tag_outside_the_oci_grammar_is_refused_before_any_request(
    server: _Server, wanted: str
) -> None:
    with pytest.raises(FleetError, match="is not an image tag"):
        registry.resolve("ghcr.io/aeon-7/vllm", wanted, mirrors(server))
    assert server.seen == []


def test_tags_outside_the_grammar_listed_by_a_registry_are_never_candidates(
    server: _Server,
) -> None:
    server.tags = ["2026-07-01-v0.24.0", "$(reboot)-v0.25.0"]
    with pytest.raises(FleetError, match=r"no tag 'v0\.25\.0'"):
        registry.resolve("ghcr.io/aeon-7/vllm", "v0.25.0", mirrors(server))
    assert (
        registry.resolve("ghcr.io/aeon-7/vllm", "v0.24.0", mirrors(server)).tag
        == "2026-07-01-v0.24.0"
    )


def _put(s: _Server, media: str, doc: dict[str, Any]) -> str:
    data = json.dumps(doc).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    s.manifests[digest] = (media, data)
    return digest


def _image(s: _Server, sizes: list[int], salt: str) -> str:
    layers = [
        {
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "size": n,
            "digest": "sha256:" + hashlib.sha256(f"{salt}{i}".encode()).hexdigest(),
        }
        for i, n in enumerate(sizes)
    ]
    return _put(
        s,
        "application/vnd.oci.image.manifest.v1+json",
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "layers": layers,
        },
    )


def test_layer_sizes_of_each_platform_of_an_index(server: _Server) -> None:
    """An index's platforms each give their layers' sizes (what a pull's bytes are counted
    against); its
    attestation entry is not read; behind a bearer challenge, as ghcr.io answers."""
    server.bearer = True
    arm = _image(server, [40_000_000, 2_500_000_000, 1_000], "arm")
    amd = _image(server, [41_000_000, 2_400_000_000], "amd")
    att = _image(server, [900], "att")
    index = _put(
        server,
        "application/vnd.oci.image.index.v1+json",
        {
            "schemaVersion": 2,
            "manifests": [
                {"digest": arm, "platform": {"os": "linux", "architecture": "arm64"}},
                {"digest": amd, "platform": {"os": "linux", "architecture": "amd64"}},
                {"digest": att, "platform": {"os": "unknown", "architecture": "unknown"}},
            ],
        },
    )
    sets = registry.layer_sizes("ghcr.io/aeon-7/vllm", index, mirrors(server))
    assert [sorted(p.values()) for p in sets] == [
        [1_000, 40_000_000, 2_500_000_000],
        [41_000_000, 2_400_000_000],
    ]
    assert not any(path.endswith(att) for _, path, _ in server.seen)
    # A single-platform image is its own one set.
    assert [
        sum(p.values()) for p in registry.layer_sizes("ghcr.io/aeon-7/vllm", amd, mirrors(server))
    ] == [2_441_000_000]
    with pytest.raises(FleetError, match="not sha256"):
        registry.layer_sizes("ghcr.io/aeon-7/vllm", "sha256:../../x", mirrors(server))
