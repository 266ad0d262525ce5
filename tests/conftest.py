"""Test configuration: the shared lab fixtures are plugins, one module per state they build."""

from __future__ import annotations

pytest_plugins = ["tests.plugins.lab", "tests.plugins.provision", "tests.plugins.stage", "tests.plugins.serving",
                  "tests.plugins.postgres", "tests.plugins.emulator", "tests.plugins.webhook"]
