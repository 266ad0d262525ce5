"""Real loopback servers for the front-door tests: tiny HTTP backends and a real haproxy process."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fleetctl.frontdoor.haproxy import HAProxy


class Backend:
    """An HTTP server on 127.0.0.1: /health answers 200, /hold waits until released, /metrics
    counts them as vLLM's ``vllm:num_requests_running`` does. ``served`` counts the requests
    the door sent, not its health checks (which a drained server keeps getting)."""

    def __init__(self, port: int = 0) -> None:
        """``port``: 0 for a free one; a closed backend's port to bring that server back."""
        self.release = threading.Event()
        self.running = 0
        self.served = 0
        self.lock = threading.Lock()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                body = b"ok\n"
                if self.path.startswith("/hold"):
                    with backend.lock:
                        backend.running += 1
                    try:
                        backend.release.wait(60)
                    finally:
                        with backend.lock:
                            backend.running -= 1
                elif self.path.startswith("/metrics"):
                    body = f"vllm:num_requests_running{{model_name=\"m\"}} {backend.running}.0\n" \
                           f"vllm:num_requests_waiting{{model_name=\"m\"}} 0.0\n".encode()
                if not self.path.startswith("/health"):
                    with backend.lock:
                        backend.served += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Quiet(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # haproxy's health checks close without reading the answer

        Quiet.allow_reuse_address = True
        self.server = Quiet(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def haproxy(
    tmp: Path, servers: dict[str, int], backend: str = "vllm"
) -> Iterator[tuple[Path, int]]:
    """A real haproxy in the foreground (-db) with an admin stats socket; yields (socket path,
    frontend port)."""
    exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
    sock = tmp / "admin.sock"
    port = free_port()
    lines = "\n".join(f"  server {name} 127.0.0.1:{p} check inter 100ms fall 1 rise 1"
                      for name, p in servers.items())
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(f"""global
  stats socket {sock} mode 600 level admin
  stats timeout 30s
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:{port}
  default_backend {backend}
backend {backend}
  balance roundrobin
  option httpchk GET /health
{lines}
""")
    proc = subprocess.Popen(
        [exe, "-f", str(cfg), "-db"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise RuntimeError(f"haproxy did not start: {out}")
            time.sleep(0.05)
        yield sock, port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Pool:
    """A real haproxy on loopback whose backend ``vllm`` has one server per host name, each a
    :class:`Backend`."""

    door: HAProxy
    backends: dict[str, Backend]
    #: The frontend's port and the admin socket.
    port: int
    socket: Path

    def revive(self, name: str) -> Backend:
        """Bring a closed backend back on its port (its health check passes again)."""
        self.backends[name] = Backend(self.backends[name].port)
        return self.backends[name]


@contextmanager
def loopback_pool(tmp: Path, names: Sequence[str]) -> Iterator[Pool]:
    """:func:`haproxy` before one :class:`Backend` per name, every server in rotation; all closed
    after."""
    from fleetctl.frontdoor.drain import wait_in_rotation
    from fleetctl.inventory import Host

    backends = {n: Backend() for n in names}
    pool: Pool | None = None
    try:
        with haproxy(tmp, {n: b.port for n, b in backends.items()}) as (sock, port):
            pool = Pool(HAProxy("vllm", str(sock)), backends, port, sock)
            for n in names:
                wait_in_rotation(pool.door, Host(n, "127.0.0.1"), 30)
            yield pool
    finally:
        for b in (pool.backends if pool is not None else backends).values():
            b.close()
