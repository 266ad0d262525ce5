"""Load an Ansible role's Python files (custom modules, probe scripts) as modules, for unit
tests."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from fleetctl import paths


def load_role_file(role: str, relpath: str) -> ModuleType:
    """Import ``roles/<role>/<relpath>`` under a test-only name (registered, so dataclasses
    work)."""
    path = paths.roles_dir() / role / relpath
    name = f"fleetctl_test_{role}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
