"""A host serving another recipe than its configured one (drift): judged from its container's
recipe label and its /v1/models, read by the real probe from a real HTTP server, and shown."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from rich.console import Console

from fleetctl import paths
from fleetctl.cli.status import render_status, status_json
from fleetctl.container import Container
from fleetctl.inventory import Host
from fleetctl.status import HostStatus, parse_probe, recipe_drift, recipe_of_models
from tests.status.test_status import _probe

RECIPES: dict[str, Any] = yaml.safe_load(
    (paths.project_root() / "inventory/lab/group_vars/all/recipes.yml").read_text()
)["fleetctl_recipes"]
HERETIC, MM = "qwen36-35b-heretic", "qwen36-27b-mm"


def _container(recipe: str | None) -> Container:
    labels = {"fleetctl.recipe": recipe} if recipe else {}
    return Container(name=recipe or "vllm", image="r/aeon:v1", tag="v1", running=True,
                     labels=labels)


def test_a_container_of_the_configured_recipe_is_no_drift() -> None:
    names = RECIPES[HERETIC]["served_model_names"]
    assert recipe_drift(HERETIC, RECIPES, _container(HERETIC), names) == (HERETIC, None)
    # Nothing serving, or nothing configured: nothing to compare.
    assert recipe_drift(HERETIC, RECIPES, None, None) == (None, None)
    assert recipe_drift(None, RECIPES, _container(MM), None) == (MM, None)


def test_the_label_of_another_recipe_is_drift() -> None:
    served, why = recipe_drift(HERETIC, RECIPES, _container(MM), ["aeon", "aeon-fast"])
    assert served == MM
    assert why is not None and f"serves {MM}" in why and f"configured {HERETIC}" in why
    assert "/v1/models: aeon, aeon-fast" in why


def test_models_of_another_recipe_are_drift_without_a_label() -> None:
    """A container fleetctl did not start (no label): its /v1/models says what it serves."""
    served, why = recipe_drift(HERETIC, RECIPES, _container(None), ["gemma26b"])
    assert served == "gemma4-26b-a4b"
    assert why is not None and "serves gemma4-26b-a4b" in why and f"none of {HERETIC}'s" in why
    served, why = recipe_drift(HERETIC, RECIPES, _container(None), ["my-own-model"])
    assert served is None and why is not None and "serves another model" in why
    # A label of the configured recipe whose server lists other names is drift too.
    served, why = recipe_drift(HERETIC, RECIPES, _container(HERETIC), ["qwen3.5-35b"])
    assert why is not None and "qwen35-35b-bf16" in why


def test_models_map_to_the_recipe_sharing_most_names() -> None:
    assert recipe_of_models(RECIPES, ["qwen3.5-35b-pair"]) == "qwen35-35b-bf16-pair"
    assert recipe_of_models(RECIPES, ["aeon", "aeon-ultimate"]) == MM
    assert recipe_of_models(RECIPES, ["nobody"]) is None


class _Server(http.server.BaseHTTPRequestHandler):
    models: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [
                {"id": m, "object": "model"} for m in self.models]}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        del args


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_probe_reads_what_the_server_lists(tmp_path: Path, server: int) -> None:
    _Server.models = list(RECIPES[MM]["served_model_names"])
    out = _probe(tmp_path, None, "--serving", "--port", str(server))
    host = Host("spark-03", "127.0.0.1", vars={"fleetctl_recipe": HERETIC,
                                                "fleetctl_recipes": RECIPES})
    st = parse_probe(host, out, 0.1, server)
    assert st.health == 200 and st.served_models == tuple(_Server.models)
    assert st.recipe == HERETIC
    # The probe found no container here (no docker): nothing serves as far as a container says.
    assert st.container is None and st.drift is None


def _width(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_drift_is_shown_in_80_columns_and_in_json() -> None:
    ok = HostStatus("spark-01", "10.0.0.1", True, 0.2, recipe=HERETIC, served_recipe=HERETIC,
                    container=_container(HERETIC), health=200)
    served, why = recipe_drift(HERETIC, RECIPES, _container(MM), ["aeon"])
    bad = HostStatus("spark-04", "10.0.0.4", True, 0.2, recipe=HERETIC, served_recipe=served,
                     container=_container(MM), health=200, served_models=("aeon",), drift=why)
    sts = {"spark-01": ok, "spark-04": bad}
    console = Console(width=80, record=True, force_terminal=False)
    render_status(sts)(console)
    text = console.export_text()
    assert _width(text) <= 80
    row = next(line for line in text.splitlines() if "spark-04" in line and "│" in line)
    assert HERETIC in row and "DRIFT" in row
    assert f"drift spark-04: serves {MM}" in text.replace("\n", " ")
    good = next(line for line in text.splitlines() if "spark-01" in line and "│" in line)
    assert HERETIC in good and "DRIFT" not in good
    doc = status_json(sts)
    assert doc["spark-04"]["recipe"] == HERETIC and doc["spark-04"]["served_recipe"] == MM
    assert doc["spark-04"]["drift"] == why and doc["spark-01"]["drift"] is None
