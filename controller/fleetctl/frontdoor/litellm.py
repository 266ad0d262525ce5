"""A LiteLLM proxy as the front door, through its management API.

The proxy routes one public model name to many deployments (one per vLLM server). A host is taken
out of rotation by deleting its deployments and put back by adding them again:

- ``GET /model/info``: every deployment, ``{"data": [{"model_name", "litellm_params": {"model",
  "api_base", ...}, "model_info": {"id", ...}}]}``; a host's deployments are those whose
  ``api_base`` is the host's (``api_base`` template, default ``http://{address}:{port}/v1``);
- ``POST /model/delete`` ``{"id": ID}``; ``POST /model/new`` ``{"model_name", "litellm_params",
  "model_info": {"id"}}`` (the proxy must keep models in its database: ``store_model_in_db``);
- ``GET /health?model=NAME``: ``healthy_endpoints`` / ``unhealthy_endpoints``, each with
``api_base``.

Requests carry ``Authorization: Bearer <master key>``, the key read from the environment variable
named by ``master_key_env`` (default ``LITELLM_MASTER_KEY``), never from the inventory in clear.
What ``drain`` deleted is kept (without any ``api_key``) so ``readmit`` adds back the same
deployment; with nothing kept (a drain by someone else) it adds one built from the settings.
LiteLLM does not count a deployment's open requests: ``in_flight`` is None, and the rollout
relies on vLLM's own ``num_requests_running``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from fleetctl.frontdoor import MAINT, READY, DoorState, Drained, FrontDoorError, Settings
from fleetctl.inventory import Host
from fleetctl.urls import url_host

#: litellm_params keys never kept in a drain's memo (it goes to the ledger).
SECRET_PARAMS = ("api_key", "aws_secret_access_key", "vertex_credentials")


class LiteLLM:
    """One public model name of a LiteLLM proxy, served by the fleet's hosts."""

    kind = "litellm"

    def __init__(self, url: str, model_name: str, *, model: str = "hosted_vllm/{model_name}",
                 api_base: str = "http://{address}:{port}/v1", port: int = 8000,
                 master_key_env: str = "LITELLM_MASTER_KEY", api_key_env: str | None = None,
                 timeout: float = 30.0) -> None:
        self.url, self.model_name, self.model, self.api_base = (
            url.rstrip("/"),
            model_name,
            model,
            api_base,
        )
        self.port, self.master_key_env, self.api_key_env, self.timeout = (
            port,
            master_key_env,
            api_key_env,
            timeout,
        )

    def host_api_base(self, host: Host) -> str:
        api = self.api_base.format(address=url_host(host.address), port=self.port, host=host.name)
        return api.rstrip("/")

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, host: Host | None = None
    ) -> Any:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.master_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode(errors="replace")
            fix = (
                f"export {self.master_key_env} with the proxy's master key"
                if e.code in (401, 403)
                else "check the proxy keeps models in its database "
                     "(general_settings.store_model_in_db: true)"
            )
            raise FrontDoorError(
                f"LiteLLM at {self.url} refused {method} {path}: HTTP {e.code} {detail}",
                host=host.name if host else None,
                fix=fix,
            ) from None
        except (OSError, ValueError) as e:
            raise FrontDoorError(
                f"LiteLLM at {self.url} did not answer {method} {path}: {e}",
                host=host.name if host else None,
                fix="check fleetctl_front_door.url and that the proxy runs",
            ) from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise FrontDoorError(
                f"LiteLLM at {self.url} answered {method} {path} with non-JSON {raw[:80]!r}",
                fix="check that fleetctl_front_door.url is the proxy's base URL",
            ) from None

    def deployments(self, host: Host) -> list[dict[str, Any]]:
        """The proxy's deployments of ``model_name`` that send to ``host``."""
        info = self._call("GET", "/model/info", host=host)
        rows = info.get("data", []) if isinstance(info, dict) else []
        base = self.host_api_base(host)
        return [r for r in rows if isinstance(r, dict) and r.get("model_name") == self.model_name
                and str((r.get("litellm_params") or {}).get("api_base", "")).rstrip("/") == base]

    def drain(self, host: Host) -> Drained:
        kept = []
        for d in self.deployments(host):
            mid = (d.get("model_info") or {}).get("id")
            if not mid:
                raise FrontDoorError(
                    f"LiteLLM's deployment of {self.model_name} at {self.host_api_base(host)} has "
                    "no "
                    "model_info.id",
                    host=host.name,
                    fix="add it through /model/new (or give it model_info: {id: ...} in "
                        "config.yaml)",
                )
            self._call("POST", "/model/delete", {"id": mid}, host=host)
            params = {
                k: v for k, v in (d.get("litellm_params") or {}).items() if k not in SECRET_PARAMS
            }
            kept.append({"id": mid, "model_name": d.get("model_name"), "litellm_params": params})
        return Drained(host.name, {"deployments": kept})

    def readmit(self, host: Host, drained: Drained | None = None) -> None:
        if self.deployments(host):
            return
        kept = list((drained.memo if drained else {}).get("deployments") or [])
        if not kept:
            kept = [{"id": f"fleetctl-{host.name}", "model_name": self.model_name,
                     "litellm_params": {"model": self.model.format(model_name=self.model_name),
                                        "api_base": self.host_api_base(host)}}]
        for d in kept:
            params = dict(d["litellm_params"])
            if self.api_key_env and os.environ.get(self.api_key_env):
                params["api_key"] = os.environ[self.api_key_env]
            self._call(
                "POST",
                "/model/new",
                {
                    "model_name": d["model_name"],
                    "litellm_params": params,
                    "model_info": {"id": d["id"]},
                },
                host=host,
            )

    def in_flight(self, host: Host) -> int | None:
        return None

    def state(self, host: Host) -> DoorState:
        present = bool(self.deployments(host))
        health = (
            self._call("GET", f"/health?model={urllib.parse.quote(self.model_name)}", host=host)
            or {}
        )
        base = self.host_api_base(host)

        def has(key: str) -> bool:
            return any(str(e.get("api_base", "")).rstrip("/") == base for e in health.get(key) or []
                       if isinstance(e, dict))

        healthy = (
            True if has("healthy_endpoints") else False if has("unhealthy_endpoints") else None
        )
        return DoorState(host.name, READY if present else MAINT, healthy, None,
                         f"{'deployed' if present else 'no deployment'} of {self.model_name}")


def from_settings(s: Settings) -> LiteLLM:
    url = s.text("url", "http://10.0.0.2:4000")
    name = s.text("model_name", "qwen3")
    assert url is not None and name is not None
    if not url.startswith(("http://", "https://")):
        raise FrontDoorError(f"{s.where}: url is {url!r}, not an http(s) URL",
                             fix="set fleetctl_front_door.url, e.g. url: http://10.0.0.2:4000")
    port = s.number("port", 8000, "8000")
    return LiteLLM(
        url,
        name,
        model=s.text("model", "hosted_vllm/{model_name}", "hosted_vllm/{model_name}") or "",
        api_base=s.text("api_base", "http://{address}:{port}/v1", "http://{address}:{port}/v1")
        or "",
        port=int(port),
        master_key_env=s.text("master_key_env", "LITELLM_MASTER_KEY", "LITELLM_MASTER_KEY") or "",
        api_key_env=s.text("api_key_env", "VLLM_API_KEY", required=False),
        timeout=s.number("timeout", 30.0, "30"),
    )
