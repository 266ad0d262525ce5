"""Test configuration: the shared lab fixtures are plugins, one module per state they build."""

from __future__ import annotations

import importlib.util

_PLUGINS = ("tests.plugins.lab", "tests.plugins.provision", "tests.plugins.stage", "tests.plugins.serving",
            "tests.plugins.postgres")
pytest_plugins = [p for p in _PLUGINS if importlib.util.find_spec(p) is not None]
