"""The weights role's staging module (preflight, fetch, swap) against a real loopback HTTP mirror.

The mirror is a directory written by fleetctl.lab.models.populate_mirror and served
by http.server on 127.0.0.1; a second handler answers the hub's revision API.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fleetctl.lab import models
from tests.role_modules import load_role_file

REPO = "fleetctl-test/body"


ws = load_role_file("weights", "library/weights_stage.py")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        del args


class _Hub(http.server.BaseHTTPRequestHandler):
    """The hub's revision API: /api/models/<owner>/<name>/revision/<rev> (token required)."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != "Bearer hf_test_token":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"sha": "abc123", "lastModified": "2026-06-20T10:00:00.000Z"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        del args


def _serve(handler: Any) -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "www"
    models.populate_mirror(
        root,
        [
            models.MirrorSpec(REPO, "r1", "qwen36-35b-a3b-nvfp4"),
            models.MirrorSpec(REPO, "r2", "qwen36-35b-a3b-nvfp4", date="2026-07-01"),
        ],
    )
    yield from _serve(partial(_Quiet, directory=str(root)))


def _set(tmp_path: Path, revision: str) -> dict[str, Any]:
    return {
        "role": "body",
        "repo": REPO,
        "revision": revision,
        "path": str(tmp_path / "opt" / "body"),
        "size_gb": 0,
    }


def _stage(s: dict[str, Any], run: str, mirror: str) -> dict[str, Any]:
    report, problem = ws.preflight([s], run, "mirror", mirror, "https://hub.invalid", None, 0)
    assert problem is None
    if report["sets"][0]["state"] == "stage":
        ws.fetch(s, run, "mirror", mirror, "https://hub.invalid", None)
        ws.swap(s, run)
    result: dict[str, Any] = report
    return result


def test_fetch_swap_then_current_then_a_new_revision_replaces_it(
    tmp_path: Path, mirror: str
) -> None:
    s1 = _set(tmp_path, "r1")
    first = _stage(s1, "run1", mirror)
    assert first["sets"][0]["state"] == "stage" and first["need_bytes"] > 0
    target = Path(s1["path"])
    marker = json.loads((target / ws.MARKER).read_text())
    assert marker["revision"] == "r1" and marker["manifest_sha256"]
    assert (target / ws.MANIFEST).exists() and not list(target.parent.glob("body.staging-*"))
    # Staged and unchanged: nothing to do.
    again = _stage(s1, "run2", mirror)
    assert again["sets"][0]["state"] == "current" and again["need_bytes"] == 0
    # A container holding the old directory keeps it through the swap (rename, not copy over).
    fd = os.open(target, os.O_RDONLY)
    try:
        third = _stage(_set(tmp_path, "r2"), "run3", mirror)
        assert third["sets"][0]["reason"].startswith("staged revision")
        assert json.loads((target / ws.MARKER).read_text())["revision"] == "r2"
        assert os.fstat(fd).st_ino != os.stat(target).st_ino
    finally:
        os.close(fd)
    assert sorted(p.name for p in target.parent.iterdir()) == ["body"]


def test_a_file_removed_after_staging_makes_the_set_stale(tmp_path: Path, mirror: str) -> None:
    s = _set(tmp_path, "r1")
    _stage(s, "run1", mirror)
    next(Path(s["path"]).glob("*.safetensors")).unlink()
    report, _ = ws.preflight([s], "run2", "mirror", mirror, "https://hub.invalid", None, 0)
    assert (
        report["sets"][0]["state"] == "stage"
        and "missing or changed" in report["sets"][0]["reason"]
    )


def test_preflight_removes_a_killed_runs_staging_and_checks_the_disk_first(
    tmp_path: Path, mirror: str
) -> None:
    s = _set(tmp_path, "r1")
    stale = Path(s["path"] + ".staging-killed")
    stale.mkdir(parents=True)
    (stale / "half.safetensors").write_bytes(b"x" * 100)
    report, problem = ws.preflight(
        [s], "run9", "mirror", mirror, "https://hub.invalid", None, 10**9
    )
    assert report["removed"] == [str(stale)] and not stale.exists()
    assert problem is not None and "not enough disk" in problem and "headroom" in problem
    assert not Path(s["path"]).exists()


def test_a_corrupted_download_is_refused_by_its_sha256(tmp_path: Path, mirror: str) -> None:
    url = f"{mirror}/{REPO}/r1/config.json"
    size = len(models_config_bytes(tmp_path, mirror))
    with pytest.raises(ws.StageError, match="the manifest says"):
        ws._download(url, str(tmp_path / "c.json"), size, "0" * 64)
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "c.json.part").exists()


def models_config_bytes(tmp_path: Path, mirror: str) -> bytes:
    with urllib.request.urlopen(f"{mirror}/{REPO}/r1/config.json", timeout=10) as r:
        data: bytes = r.read()
    return data


def test_a_download_stops_at_the_manifests_size(tmp_path: Path, mirror: str) -> None:
    url = f"{mirror}/{REPO}/r1/config.json"
    with pytest.raises(ws.StageError, match="sent more than the 10 bytes expected"):
        ws._download(url, str(tmp_path / "c.json"), 10, None)
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "c.json.part").exists()


class _Endless(http.server.BaseHTTPRequestHandler):
    """A broken mirror: no Content-Length and bytes forever, or one byte every 50 ms."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        drip = self.path.endswith("/drip")
        try:
            for _ in range(2000 if not drip else 400):
                self.wfile.write(b"x" if drip else b"x" * 65536)
                self.wfile.flush()
                if drip:
                    time.sleep(0.05)
        except OSError:
            return  # the client stopped reading, as it should

    def log_message(self, *args: Any) -> None:
        del args


def test_an_endless_or_dripping_mirror_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for base in _serve(_Endless):
        with pytest.raises(ws.StageError, match="more than the 1000000 bytes"):
            ws._download(f"{base}/big", str(tmp_path / "big"), 1_000_000, None)
        assert not (tmp_path / "big.part").exists()
        # The idle timeout never fires on a trickle: the download's overall deadline does.
        monkeypatch.setattr(ws, "HTTP_TIMEOUT", 1)
        with pytest.raises(ws.StageError, match="did not finish within its deadline"):
            ws._download(f"{base}/drip", str(tmp_path / "drip"), 1_000_000, None)
        assert not (tmp_path / "drip.part").exists()


def test_hub_revision_api_gives_the_commit_and_date_and_needs_the_token(tmp_path: Path) -> None:
    s = {**_set(tmp_path, "main"), "size_gb": 0.5}
    for hub in _serve(_Hub):
        info = ws.source_info(s, "hub", None, hub, "hf_test_token")
        assert (
            info["commit"] == "abc123"
            and info["revision_date"] == "2026-06-20"
            and info["bytes"] == 500_000_000
        )
        with pytest.raises(ws.StageError, match="HTTP 401") as e:
            ws.source_info(s, "hub", None, hub, None)
        assert "hf_test_token" not in str(e.value)


class _Redirector(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a redirect to ``target`` + the same path (set per server)."""

    target = ""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        del args


class _Recorder(_Hub):
    """The hub's API that records the Authorization header each request brought."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        body = json.dumps({"sha": "abc123", "lastModified": "2026-06-20T10:00:00.000Z"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_the_hub_token_does_not_follow_a_redirect_to_another_host(tmp_path: Path) -> None:
    s = {**_set(tmp_path, "main"), "size_gb": 0.5}
    _Recorder.seen = []
    for elsewhere in _serve(_Recorder):
        handler = type("R", (_Redirector,), {"target": elsewhere})
        for hub in _serve(handler):
            assert ws.source_info(s, "hub", None, hub, "hf_test_token")["commit"] == "abc123"
    assert _Recorder.seen == [None], "the other host got the request but not the token"


def test_the_hub_token_follows_a_redirect_on_the_hub_itself(tmp_path: Path) -> None:
    s = {**_set(tmp_path, "main"), "size_gb": 0.5}

    class SameHost(_Hub):
        def do_GET(self) -> None:
            if self.path.startswith("/old"):
                self.send_response(301)
                self.send_header("Location", self.path[len("/old"):])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_GET()  # 401 without the token

    for hub in _serve(SameHost):
        assert ws.source_info(s, "hub", None, hub + "/old", "hf_test_token")["commit"] == "abc123"


@pytest.mark.parametrize(("old", "new", "kept"), [
    ("https://hub.example/a", "https://hub.example/b", True),
    ("https://hub.example/a", "http://hub.example/b", False),
    ("https://hub.example/a", "https://hub.example:8443/b", False),
    ("https://hub.example/a", "https://cdn.example/b", False),
    ("http://127.0.0.1:80/a", "http://127.0.0.1/b", True),
])
def test_which_redirects_keep_the_token(old: str, new: str, kept: bool) -> None:
    req = urllib.request.Request(old, headers={"Authorization": "Bearer t"})
    out = ws._KeepTokenHome().redirect_request(req, None, 302, "Found", {}, new)
    assert out.has_header("Authorization") is kept


def test_a_redirect_to_another_scheme_is_refused() -> None:
    req = urllib.request.Request("https://hub.example/a", headers={"Authorization": "Bearer t"})
    with pytest.raises(ws.StageError, match="redirected to a ftp URL"):
        ws._KeepTokenHome().redirect_request(req, None, 302, "Found", {}, "ftp://files.example/x")


def test_a_manifest_pinned_in_the_recipe_must_match_the_mirrors(
    tmp_path: Path, mirror: str
) -> None:
    s = _set(tmp_path, "r1")
    raw = urllib.request.urlopen(f"{mirror}/{REPO}/r1/manifest.json").read()
    good = ws.hashlib.sha256(raw).hexdigest()
    assert (
        ws.source_info({**s, "manifest_sha256": good}, "mirror", mirror, "", None)[
            "manifest_sha256"
        ]
        == good
    )
    with pytest.raises(ws.StageError, match="not the recipe's manifest_sha256"):
        ws.source_info({**s, "manifest_sha256": "0" * 64}, "mirror", mirror, "", None)


def test_receive_removes_a_killed_runs_key_and_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a receive SIGKILLed with its controller left its key behind; the next receive removes it
    monkeypatch.setattr(ws, "KEY_BASE", str(tmp_path))
    stale = tmp_path / "fleetctl-stage-old"
    stale.mkdir()
    (stale / "id_ed25519").write_text("old key")
    other = tmp_path / "unrelated"
    other.mkdir()
    seed = {"user": "nobody", "address": "127.0.0.1", "port": 9, "root": ""}
    sets = [{"role": "target", "path": str(tmp_path / "w" / "m")}]
    with pytest.raises(ws.StageError):  # nothing listens on port 9: the rsync fails
        ws.receive(sets, "new", seed, "k", "", 20)
    assert not stale.exists() and not (tmp_path / "fleetctl-stage-new").exists() and other.exists()
