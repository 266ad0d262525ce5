"""The emulator's fixtures shared by its own tests and the soak's: a model directory and a process
launcher."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.lab import models
from tests.lab.emulator.test_server import Launcher


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model of the lab's two-node recipe, written once per module."""
    return models.write_model(tmp_path_factory.mktemp("models") / "body", "qwen35-35b-a3b-bf16")


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    """Starts emulator processes; every one it started is stopped afterwards."""
    ln = Launcher(tmp_path)
    yield ln
    ln.stop_all()
