"""The command-hook front door (a real shell script keeping a pool file) and the LiteLLM front door
against a loopback server speaking LiteLLM's documented management API (LiteLLM's proxy keeps added
models only in
its Prisma database, whose engine cannot be installed here: see docs/frontdoor.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetctl.frontdoor import DRAIN, MAINT, READY, FrontDoorError, build
from fleetctl.frontdoor.litellm import LiteLLM
from fleetctl.inventory import Host
from tests.plugins.webhook import reply_json

A, B = Host("spark-01", "10.1.0.11"), Host("spark-02", "10.1.0.12")

HOOK = r"""#!/bin/sh
pool="$POOL"
case "$FLEETCTL_FD_ACTION" in
  drain)   echo "$FLEETCTL_FD_HOST $FLEETCTL_FD_ADDRESS drain" >> "$pool.log"; echo "$FLEETCTL_FD_HOST" >> "$pool.out" ;;
  readmit) echo "$FLEETCTL_FD_HOST $FLEETCTL_FD_ADDRESS readmit" >> "$pool.log"
           grep -vx "$FLEETCTL_FD_HOST" "$pool.out" > "$pool.tmp" || true; mv "$pool.tmp" "$pool.out" ;;
  in-flight) echo 0 ;;
  state)   if grep -qx "$FLEETCTL_FD_HOST" "$pool.out"; then echo "drain healthy"; else echo "ready healthy"; fi ;;
  *) echo "unknown action $FLEETCTL_FD_ACTION" >&2; exit 3 ;;
esac
"""  # noqa: E501 (data: lines as the program reads them)


def test_command_hook_gets_host_address_and_action(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "pool.sh"
    script.write_text(HOOK)
    script.chmod(0o755)
    monkeypatch.setenv("POOL", str(tmp_path / "pool"))
    (tmp_path / "pool.out").write_text("")
    door = build({"type": "command", "command": str(script), "timeout": 10})
    door.drain(A)
    assert door.state(A).admin == DRAIN and door.state(B).admin == READY
    assert door.in_flight(A) == 0
    door.readmit(A)
    assert door.state(A).admin == READY and door.state(A).healthy is True
    assert (tmp_path / "pool.log").read_text().splitlines() == ["spark-01 10.1.0.11 drain",
                                                               "spark-01 10.1.0.11 readmit"]


def test_command_hook_failure_names_host_action_and_stderr(tmp_path: Path) -> None:
    door = build({"type": "command", "command": "echo 'lb: pool web not found' >&2; exit 4"})
    with pytest.raises(FrontDoorError) as e:
        door.drain(A)
    msg = e.value.message()
    assert (
        msg.startswith("spark-01:")
        and "drain" in msg
        and "exit 4" in msg
        and "pool web not found" in msg
    )
    bad = build({"type": "command", "command": "echo lots"})
    with pytest.raises(FrontDoorError, match="not a whole number"):
        bad.in_flight(A)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"type": "nginx"}, ["type is 'nginx'", "haproxy, litellm or command"]),
        ({"type": "haproxy", "backend": "vllm"}, ["exactly one of socket and address"]),
        (
            {"type": "haproxy", "backend": "vllm", "address": "lb:port"},
            ["address is 'lb:port'", "HOST:PORT"],
        ),
        ({"type": "haproxy", "socket": "/s"}, ["backend is missing"]),
        ({"type": "haproxy", "socket": "/s", "backend": "b", "timeout": 0}, ["timeout is 0"]),
        (
            {"type": "haproxy", "socket": "/s", "backend": "b", "sever": {}},
            ["unknown field(s) sever"],
        ),
        ({"type": "litellm", "url": "proxy:4000", "model_name": "q"}, ["url is 'proxy:4000'"]),
        ({"type": "command"}, ["command is missing"]),
    ],
)
def test_settings_mistakes_are_one_message_naming_the_field(
    raw: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(FrontDoorError) as e:
        build(raw)
    msg = e.value.message()
    assert "fleetctl_front_door" in msg and "fix:" in msg
    for w in words:
        assert w in msg


class FakeLiteLLM:
    """LiteLLM proxy's management endpoints as its API reference documents them, in memory, on
    loopback."""

    def __init__(self, key: str) -> None:
        self.models: list[dict[str, Any]] = []
        self.healthy: set[str] = set()
        self.calls: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _reply(self, code: int, body: Any) -> None:
                reply_json(self, code, body)

            def _authorised(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {key}":
                    self._reply(401, {"error": {"message": "Authentication Error, invalid key"}})
                    return False
                return True

            def do_GET(self) -> None:
                proxy.calls.append(f"GET {self.path}")
                if not self._authorised():
                    return
                if self.path == "/model/info":
                    self._reply(200, {"data": proxy.models})
                elif self.path.startswith("/health"):
                    eps = [
                        {
                            "model": m["litellm_params"]["model"],
                            "api_base": m["litellm_params"]["api_base"],
                        }
                        for m in proxy.models
                    ]
                    self._reply(
                        200,
                        {
                            "healthy_endpoints": [e for e in eps if e["api_base"] in proxy.healthy],
                            "unhealthy_endpoints": [
                                e for e in eps if e["api_base"] not in proxy.healthy
                            ],
                        },
                    )
                else:
                    self._reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(
                    self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"
                )
                proxy.calls.append(f"POST {self.path}")
                if not self._authorised():
                    return
                if self.path == "/model/delete":
                    before = len(proxy.models)
                    proxy.models = [m for m in proxy.models if m["model_info"]["id"] != body["id"]]
                    if len(proxy.models) == before:
                        self._reply(400, {"error": {"message": f"model {body['id']} not found"}})
                        return
                    self._reply(200, {"message": f"Model: {body['id']} deleted successfully"})
                elif self.path == "/model/new":
                    proxy.models.append(
                        {
                            "model_name": body["model_name"],
                            "litellm_params": body["litellm_params"],
                            "model_info": body.get("model_info") or {"id": "generated"},
                        }
                    )
                    self._reply(200, {"model_id": body.get("model_info", {}).get("id")})
                else:
                    self._reply(404, {"detail": "Not Found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLiteLLM]:
    monkeypatch.setenv("LITELLM_MASTER_KEY", "sk-test-master")
    monkeypatch.setenv("VLLM_KEY", "sk-vllm-secret")
    p = FakeLiteLLM("sk-test-master")
    for h in (A, B):
        base = f"http://{h.address}:8000/v1"
        p.models.append(
            {
                "model_name": "qwen3",
                "litellm_params": {
                    "model": "hosted_vllm/qwen3",
                    "api_base": base,
                    "api_key": "sk-vllm-secret",
                },
                "model_info": {"id": f"dep-{h.name}"},
            }
        )
        p.healthy.add(base)
    yield p
    p.server.shutdown()
    p.server.server_close()


def test_litellm_drain_deletes_the_hosts_deployment_and_readmit_adds_it_back(
    proxy: FakeLiteLLM,
) -> None:
    door = build(
        {"type": "litellm", "url": proxy.url, "model_name": "qwen3", "api_key_env": "VLLM_KEY"}
    )
    assert isinstance(door, LiteLLM)
    st = door.state(A)
    assert (st.admin, st.healthy, st.in_flight) == (READY, True, None)
    drained = door.drain(A)
    assert [m["model_info"]["id"] for m in proxy.models] == ["dep-spark-02"]
    assert door.state(A).admin == MAINT and door.state(B).admin == READY
    assert "sk-vllm-secret" not in json.dumps(drained.memo)  # the memo goes to the ledger
    door.readmit(A, drained)
    again = [m for m in proxy.models if m["model_info"]["id"] == "dep-spark-01"]
    assert again and again[0]["litellm_params"] == {"model": "hosted_vllm/qwen3",
                                                     "api_base": "http://10.1.0.11:8000/v1",
                                                     "api_key": "sk-vllm-secret"}
    door.readmit(A, drained)  # already there: nothing added twice
    assert len(proxy.models) == 2
    # Drained by someone else (no memo): re-admitted from the settings.
    door.drain(B)
    door.readmit(B, None)
    assert any(m["model_info"]["id"] == "fleetctl-spark-02" for m in proxy.models)
    proxy.healthy.discard("http://10.1.0.12:8000/v1")
    assert door.state(B).healthy is False


def test_litellm_without_the_master_key_says_which_variable(
    proxy: FakeLiteLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LITELLM_MASTER_KEY")
    door = build({"type": "litellm", "url": proxy.url, "model_name": "qwen3"})
    with pytest.raises(FrontDoorError) as e:
        door.drain(A)
    assert "HTTP 401" in e.value.message() and "LITELLM_MASTER_KEY" in e.value.message()


def test_the_inventory_configures_the_door(tmp_path: Path) -> None:
    from fleetctl import inventory
    from fleetctl.frontdoor import from_inventory

    def fleet(name: str, text: str | None) -> inventory.Inventory:
        # A new directory each time: ansible-core caches a directory's vars files within one
        # process.
        d = tmp_path / name
        (d / "group_vars" / "all").mkdir(parents=True)
        (d / "hosts.yml").write_text("all:\n  hosts:\n    spark-01: {ansible_host: 10.1.0.11}\n")
        if text is not None:
            (d / "group_vars" / "all" / "frontdoor.yml").write_text(text)
        return inventory.load(d / "hosts.yml")

    assert from_inventory(fleet("none", None)) is None
    with pytest.raises(FrontDoorError) as e:
        from_inventory(fleet("bad", "fleetctl_front_door: haproxy\n"))
    assert "not a mapping" in e.value.message() and "type: haproxy" in e.value.message()
    door = from_inventory(fleet("good", "fleetctl_front_door: {type: command, command: 'true'}\n"))
    assert door is not None and door.kind == "command"
