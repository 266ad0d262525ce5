"""Test configuration: the shared lab fixtures are plugins, one module per state they build.

Under pytest-xdist (scripts/test.sh runs two workers), every test that uses the lab goes to one worker, in
file order, so that the lab is brought up once and its tests see each other's state as in a serial run; the
real-vLLM conformance test goes to one worker of its own group; every other test is spread over the workers.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.plugins.lab", "tests.plugins.provision", "tests.plugins.stage", "tests.plugins.serving",
                  "tests.plugins.postgres", "tests.plugins.emulator", "tests.plugins.webhook"]

#: The xdist group of each marker whose tests share one machine-wide resource (the first match wins).
GROUPS = (("lab", "lab"), ("vllm", "vllm"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker, group in GROUPS:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
                break
