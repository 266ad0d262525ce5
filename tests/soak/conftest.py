"""Loopback fixtures: the vLLM emulator as a real local process, with container-like access to it.

``emulator(**EMU_knobs)`` starts ``python -m fleetctl.lab.emulator serve`` on a free
loopback port (real HTTP, real process exits) and returns a :class:`Served` whose
``target`` the soak engine can judge. Its container access reads the process's
log file and exit status, the way ``docker logs``/``docker inspect`` do on a host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetctl.container import Container
from fleetctl.lab import models
from fleetctl.soak.verdict import SoakTarget

SERVED = ("qwen36-35b-heretic", "qwen36-fast")


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalProcess:
    """ContainerAccess for a local process: its log file and its exit status."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def logs(self, tail: int = 50) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-tail:])

    def state(self) -> Container:
        rc = self.proc.poll()
        return Container("emulator", running=rc is None,
                         status="running" if rc is None else "exited", exit_code=rc,
                         restart_count=0, started_at=self.started, image="emulator:test")


@dataclass
class Served:
    """A running (or exited) emulator and the soak target pointing at it."""

    target: SoakTarget
    proc: subprocess.Popen[bytes]
    log: Path
    port: int


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny well-formed body model directory."""
    root = tmp_path_factory.mktemp("models")
    models.write_model(root / "body", "qwen36-35b-a3b-nvfp4")
    models.write_model(root / "drafter", "qwen36-35b-a3b-dflash")
    return root / "body"


@pytest.fixture
def emulator(model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Factory: ``emulator(EMU_GARBAGE="1", spec=True)`` -> a Served emulator (stopped after the
    test)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(spec: bool = True, wait: bool = True, names: tuple[str, ...] = SERVED,
              flags: tuple[str, ...] = (), **knobs: str) -> Served:
        port = free_port()
        log = tmp_path / f"emulator-{port}.log"
        env = {**os.environ, "EMU_LOAD_SECONDS": "0.5", **knobs}
        argv = [
            sys.executable,
            "-m",
            "fleetctl.lab.emulator",
            "serve",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            *names,
            *flags,
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "8192",
        ]
        if spec:
            drafter = model_dir.parent / "drafter"
            argv += [
                "--speculative-config",
                json.dumps(
                    {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 4}
                ),
            ]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        procs.append(proc)
        served = Served(
            SoakTarget("emulator", f"http://127.0.0.1:{port}", LocalProcess(proc, log), "test"),
            proc,
            log,
            port,
        )
        if wait:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                if "Application startup complete" in log.read_text(errors="replace"):
                    break
                time.sleep(0.1)
        return served

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
