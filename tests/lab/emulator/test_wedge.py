"""The emulator's wedge faults as a real process on loopback (``emulator/wedge.py``): a signal
wedges the engine while /health and /metrics answer, another heals it, and a wedge after start
comes back on every start of the same container (its file) until it is cleared."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from fleetctl.lab import models
from tests.lab.emulator.test_server import READY_TIMEOUT, Emu, Launcher

BODY = {"prompt": "hi", "max_tokens": 5}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.write_model(tmp_path_factory.mktemp("models") / "bf16", "qwen35-35b-a3b-bf16")


def _answers(emu: Emu, timeout: float = 2.0) -> bool:
    """Whether a short completion gets its tokens within ``timeout`` (a wedge holds it open)."""
    try:
        r = httpx.post(emu.url + "/v1/completions", json=BODY, timeout=timeout)
    except httpx.ReadTimeout:
        return False
    assert r.status_code == 200, r.text
    return True


def _until(what: str, cond: object, emu: Emu) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never {what}:\n{emu.text()}"
        time.sleep(0.2)


def test_a_signal_wedges_the_engine_while_health_and_metrics_answer_and_another_heals_it(
    launcher: Launcher, model_dir: Path, tmp_path: Path
) -> None:
    emu = launcher.start([str(model_dir)], env={"EMU_WEDGE_AFTER_START_FILE": str(tmp_path / "w")})
    assert _answers(emu)
    emu.proc.send_signal(signal.SIGUSR1)
    _until("wedged", lambda: not _answers(emu, 1.5), emu)
    assert httpx.get(emu.url + "/health", timeout=5).status_code == 200
    m = httpx.get(emu.url + "/metrics", timeout=5)
    assert m.status_code == 200 and "vllm:num_requests_running" in m.text
    assert "stopped producing tokens" in emu.text()
    emu.proc.send_signal(signal.SIGUSR2)
    _until("healed", lambda: _answers(emu), emu)
    assert emu.proc.poll() is None


def test_a_wedge_after_start_comes_back_on_every_start_until_cleared(
    launcher: Launcher, model_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "wedge-after-start"
    env = {"EMU_WEDGE_AFTER_START_FILE": str(path)}
    emu = launcher.start([str(model_dir)], env=env)
    assert _answers(emu)
    path.write_text("1\n")
    emu.proc.send_signal(signal.SIGHUP)
    _until("wedged after its delay", lambda: not _answers(emu, 1.5), emu)
    # A restart (the same container started again keeps its file): serves, then wedges again.
    emu.proc.send_signal(signal.SIGTERM)
    assert emu.wait_exit() == 0
    again = launcher.start([str(model_dir)], env=env)
    _until("wedged again after the restart", lambda: not _answers(again, 1.5), again)
    # Unwedged: the file is gone, so the next start stays healthy.
    again.proc.send_signal(signal.SIGUSR2)
    _until("healed", lambda: _answers(again), again)
    assert not path.exists()
    again.proc.send_signal(signal.SIGTERM)
    assert again.wait_exit() == 0
    third = launcher.start([str(model_dir)], env=env)
    for _ in range(3):
        assert _answers(third, 5.0)
        time.sleep(0.5)
