"""The emulator on loopback for a benchmark: a tiny model written, a free port, started, waited for
(/health 200), stopped at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from fleetctl.lab import models


@contextmanager
def loopback_emulator(flags: Sequence[str], env: Mapping[str, str],
                      kind: str = "qwen36-35b-a3b-nvfp4") -> Iterator[str]:
    """The base URL of an emulator serving a ``kind`` body with ``flags`` and ``env`` (EMU_*)."""
    with tempfile.TemporaryDirectory() as tmp:
        body = models.write_model(Path(tmp) / "body", kind)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetctl.lab.emulator", "serve", str(body), "--port",
             str(port), "--host", "127.0.0.1", *flags],
            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(400):
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            proc.wait(10)
