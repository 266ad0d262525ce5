"""Secrets never echoed: a server that echoes the API key back (401 bodies, SSE error events, the
text it streams) gets it quoted nowhere: not on stdout/stderr, not in the run directory, not in
the JSON/JUnit/HTML reports. An endpoint URL with user:password is refused, the password unshown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fleetctl.cli.main import main
from fleetctl.soak.secrets import Scrubber, known_secrets

from .fakevllm import MODEL, FakeVLLM, event, serve, sse_start

KEY = "sk-echo-7f3a9c1e5b2d4a6f"
HF = "hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa"


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv("HF_TOKEN", HF)


async def _echo_stream(f: FakeVLLM, r: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Text quoting the key and the hub token, then an error event echoing the request's headers."""
    resp = await sse_start(r)
    await resp.write(event(f"I was called with {r.headers.get('Authorization')} and {HF} "))
    await resp.write(
        b"data: "
        + json.dumps(
            {"error": {"message": f"denied: headers {dict(r.headers)}", "code": 401}}
        ).encode()
        + b"\n\n"
    )
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _echo_401(f: FakeVLLM, r: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.Response(
        status=401, text=json.dumps({"error": f"bad key {r.headers.get('Authorization')}"})
    )


def _leaks(root: Path, *needles: str) -> list[str]:
    return [
        f"{p}: {n}"
        for p in root.rglob("*")
        if p.is_file()
        for n in needles
        if n.encode() in p.read_bytes()
    ]


@pytest.mark.parametrize(
    "chat", [_echo_stream, _echo_401], ids=["sse-error-event", "http-401-body"]
)
def test_a_server_echoing_the_key_gets_it_quoted_nowhere(
    chat: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with serve(FakeVLLM(chat=chat)) as fake:
        out = tmp_path / "out"
        code = main(
            [
                "soak",
                "--endpoint",
                fake.url,
                "--profile",
                "lab",
                "--model",
                MODEL,
                "--smoke-only",
                "--json",
                "--json-report",
                str(out / "soak.json"),
                "--junit",
                str(out / "soak.xml"),
                "--html",
                str(out / "soak.html"),
            ]
        )
        # The key was sent: the server saw it (so the echo really contained it).
        assert any(h.get("Authorization") == f"Bearer {KEY}" for h in fake.seen_headers)
    captured = capfd.readouterr()
    assert code == 1  # the smoke failed: the server's answer was an error
    assert KEY not in captured.out and KEY not in captured.err and HF not in captured.err
    assert _leaks(tmp_path, KEY, HF) == []
    data = json.loads((out / "soak.json").read_text())
    smoke = next(c for c in data["verdicts"][0]["checks"] if c["name"] == "smoke")
    # The finding is still there and readable, with the credential replaced.
    assert "<redacted>" in smoke["message"], smoke["message"]
    assert ("401" in smoke["message"]) or ("denied" in smoke["message"])


def test_an_endpoint_with_user_and_password_is_refused_without_showing_the_password(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "soak",
            "--endpoint",
            "http://ops:hunter2secret@127.0.0.1:9/",
            "--profile",
            "lab",
            "--smoke-only",
        ]
    )
    err = capfd.readouterr().err
    assert code == 2
    assert "hunter2secret" not in err and "user name or password" in err and "VLLM_API_KEY" in err
    assert (
        not (tmp_path / "state" / "runs").exists()
        or _leaks(tmp_path / "state", "hunter2secret") == []
    )


def test_the_scrubber_replaces_known_values_and_credential_shapes() -> None:
    scrub = Scrubber(
        known_secrets("sk-target-key-123", "http://u:p4ssw0rd@h:1", environ={"HF_TOKEN": HF})
    )
    s = scrub(f"Authorization: Bearer sk-target-key-123 {HF} p4ssw0rd https://a:b@x/y "
              "authorization=opaque-value bearer abcdef123456")
    for secret in ("sk-target-key-123", HF, "p4ssw0rd", "a:b@", "opaque-value", "abcdef123456"):
        assert secret not in s, (secret, s)
    # Ordinary text is left alone.
    assert scrub("basic arithmetic: 17 x 23 = 391; the token 'foo' repeated") == \
        "basic arithmetic: 17 x 23 = 391; the token 'foo' repeated"


def _inventory(tmp_path: Path, soak_yaml: str) -> Path:
    """A one-host inventory whose recipes are the lab's, the first recipe's soak: replaced."""
    src = (
        Path(__file__).resolve().parents[2]
        / "inventory"
        / "lab"
        / "group_vars"
        / "all"
        / "recipes.yml"
    )
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    text = src.read_text().replace("    soak: {}\n", f"    soak: {soak_yaml}\n", 1)
    (inv / "group_vars" / "all" / "recipes.yml").write_text(text)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    spark-01:\n      ansible_host: 127.0.0.1\n")
    return inv


def test_endpoint_with_recipe_applies_the_recipes_gate(tmp_path: Path) -> None:
    # The recipe's served names are checked (the fake serves another name: identity fails) and its
    # soak settings apply (identity observe_only: the verdict is then decided by the rest).
    inv = _inventory(tmp_path, "{checks: {identity: {observe_only: true}}}")
    with serve(FakeVLLM()) as fake:
        out = tmp_path / "soak.json"
        code = main(
            [
                "-i",
                str(inv),
                "soak",
                "--endpoint",
                fake.url,
                "--recipe",
                "qwen36-35b-heretic",
                "--profile",
                "lab",
                "--smoke-only",
                "--json-report",
                str(out),
            ]
        )
    (v,) = json.loads(out.read_text())["verdicts"]
    ident = next(c for c in v["checks"] if c["name"] == "identity")
    assert (
        ident["outcome"] == "fail"
        and ident["observe_only"]
        and "qwen36-35b-heretic" in ident["message"]
    )
    # Observe-only: reported, not counted; without the recipe this soak would have had no names to
    # check.
    assert code == 0 and v["outcome"] == "pass"


def test_endpoint_with_an_unknown_recipe_is_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    inv = _inventory(tmp_path, "{}")
    code = main(
        [
            "-i",
            str(inv),
            "soak",
            "--endpoint",
            "http://127.0.0.1:9",
            "--recipe",
            "nope",
            "--smoke-only",
        ]
    )
    assert code == 2 and "--recipe 'nope' is not a recipe" in capfd.readouterr().err
