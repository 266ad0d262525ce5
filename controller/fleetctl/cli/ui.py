"""``fleetctl ui``: a small read-only web page of the fleet, on 127.0.0.1 by default.

It shows the inventory's hosts (with what the ledger last did to each), the rollout, rollback or
abort in progress from its event log (``<state dir>/events``: the same events and the same model as
the terminal's live view, :mod:`fleetctl.cli.livemodel`), the history (``fleetctl history``) and
each host's soak report with its charts (drawn from the gate's ``verdict.json`` by the soak's own
HTML report). A second process, so it keeps working whatever the CLI was started from (a terminal,
CI, nohup). The long commands' ``--ui PORT`` serves the same page from inside the command, pinned to
its own event log (:func:`fleetctl.cli.live.streams`), on 127.0.0.1 only, for as long as the command
runs.

The standard library's HTTP server, its handlers bounded (:data:`MAX_HANDLERS` at once, each
connection :data:`IDLE_TIMEOUT` idle and :data:`CONNECTION_DEADLINE` in all; a connection finding
every handler busy for :data:`SLOT_WAIT` gets 503, so idle sockets can neither freeze the page nor
hold a finished command); only a Host header that is an address, ``localhost`` or an
``--allow-host`` name is answered (a DNS-rebinding page names its own domain). The page, its
script and its style ship in the package (``cli/ui_assets``): no build step, no CDN. Only GET and
HEAD.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import click

from fleetctl import inventory, paths
from fleetctl.cli import livemodel, metrics, metrics_fleet
from fleetctl.cli.history import history_json
from fleetctl.cli.output import Ctx, json_option, metrics_options, pass_ctx
from fleetctl.errors import FleetError
from fleetctl.inventory import Inventory
from fleetctl.soak import report
from fleetctl.soak.verdict import Verdict, from_dict
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records
from fleetctl.urls import http_url

#: Requests handled at once (a browser opens a few; more wait for a free handler).
MAX_HANDLERS = 8
#: Seconds a connection may stay silent (a browser sends its request at once; a preconnect waits).
IDLE_TIMEOUT = 5.0
#: Seconds a connection may last in all, however slowly its request comes: then it is shut.
CONNECTION_DEADLINE = 15.0
#: Seconds a new connection waits for a free handler (an idle one times out first) before a 503.
SLOT_WAIT = IDLE_TIMEOUT + 1.0
#: Host header names answered besides addresses (an address cannot be rebound by DNS).
LOCAL_NAMES = frozenset({"localhost"})
#: Rollouts and rollbacks listed in the history.
HISTORY = 20
DEFAULT_PORT = 8765
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


class BoundedServer(ThreadingHTTPServer):
    """A thread per request, at most ``MAX_HANDLERS`` at once, each connection bounded in time."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 allow_hosts: frozenset[str] = frozenset()) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self.allow_hosts = LOCAL_NAMES | {h.lower() for h in allow_hosts}

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(timeout=SLOT_WAIT):
            # Every handler busy: answer at once rather than stall the accept loop (and shutdown()).
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # However slowly a request drips in, the connection ends at the deadline.
        cut = threading.Timer(CONNECTION_DEADLINE, _shut, (request,))
        cut.daemon = True
        cut.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            cut.cancel()
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (reset, broken pipe, timed out) is worth no traceback."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def _shut(request: socket.socket) -> None:
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


def host_allowed(host_header: str | None, allow: frozenset[str]) -> bool:
    """Whether a request's Host header names this server: an IP address (v4, or v6 in brackets),
    or a name in ``allow``. A DNS-rebinding page's requests carry its own domain: refused."""
    if not host_header:
        return False
    h = host_header.strip().lower()
    if h.startswith("["):
        name = h[1:h.find("]")] if "]" in h else ""
    else:
        name = h.rsplit(":", 1)[0] if h.count(":") == 1 else h
    if name in allow:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Fleet:
    """What the page reads, all of it on each request (read-only: nothing here changes a file or a
    host)."""

    def __init__(self, inv: Inventory | None, state_dir: Path, log: Path | None = None) -> None:
        """``log``: the event log to show (a command's own, with ``--ui``; default: the newest
        run's).
        Without ``inv`` (a soak of bare endpoints) there are no hosts and no history to show."""
        self.inv = inv
        self.state_dir = state_dir
        self.log = log

    def hosts(self) -> list[dict[str, Any]]:
        """Every inventory host: address, groups, recipe, and what the newest run that had it did
        to it."""
        if self.inv is None:
            return []
        last: dict[str, dict[str, Any]] = {}
        for rec in self._history():
            for h in rec.hosts:
                last.setdefault(
                    h.host,
                    {
                        "run": rec.id,
                        "kind": rec.kind,
                        "status": h.status,
                        "phase": h.phase,
                        "tag": h.after_tag or h.before_tag,
                        "digest": h.after_digest or h.before_digest,
                        "finished_at": h.finished_at,
                    },
                )
        return [{"host": h.name, "address": h.address, "groups": list(h.groups),
                 "recipe": h.vars.get("fleetctl_recipe") or self.inv.vars.get("fleetctl_recipe"),
                 "last": last.get(h.name)} for h in self.inv.hosts.values()]

    def _history(self) -> list[fleet_records.RolloutRecord]:
        if self.inv is None:
            return []
        with fleet_ledger.open_for(self.inv, self.state_dir) as led:
            return led.history(HISTORY)

    def history(self) -> list[dict[str, Any]]:
        return [history_json(r) for r in self._history()]

    def newest_log(self) -> tuple[Path, str, list[str]] | None:
        """The newest run's event log (or this command's own): its path, title and lines."""
        logs = (
            [self.log]
            if self.log is not None
            else sorted(
                livemodel.events_dir(self.state_dir).glob("*.jsonl"),
                key=lambda p: p.stat().st_mtime,
            )
        )
        if not logs:
            return None
        path = logs[-1]
        return path, path.name.split("-", 1)[0], path.read_text(errors="replace").splitlines()

    def live(self) -> dict[str, Any]:
        """The newest run's view, from its event log; ``{"log": None}`` before any run."""
        got = self.newest_log()
        if got is None:
            return {"log": None}
        path, title, text = got
        first = json.loads(text[0]) if text and text[0].startswith("{") else {}
        started = float(first.get("started") or 0) if isinstance(first, dict) else 0.0
        now = time.time() - started if started else None
        return {"log": path.name, **livemodel.replay(text, title, now=now).snapshot()}

    def newest_run(self) -> tuple[str, list[str]] | None:
        """The newest run's title and event log lines (``--metrics-port``'s run metrics)."""
        got = self.newest_log()
        return None if got is None else got[1:]

    def report(self, rid: str, host: str) -> str | None:
        """The soak report (HTML, with charts) of ``host``'s gate in run ``rid``; None when there
        is none."""
        if self.inv is None:
            return None
        with fleet_ledger.open_for(self.inv, self.state_dir) as led:
            try:
                rec = led.get(rid)
            except FleetError:
                return None
        hr = rec.host(host)
        if hr is None:
            return None
        runs = (self.state_dir / "runs").resolve()
        candidates = [Path(hr.artifacts) / "verdict.json"] if hr.artifacts else []
        candidates.append(runs / rec.id / f"soak-{paths.host_component(hr.host)}" / "verdict.json")
        for c in candidates:
            c = c.resolve()
            # Only the state dir's run artifacts, whatever a record says.
            if c.is_relative_to(runs) and c.is_file():
                v = from_dict(Verdict, json.loads(c.read_text()))
                return report.to_html([v])
        return None


def asset(name: str) -> bytes:
    return resources.files("fleetctl.cli").joinpath("ui_assets", name).read_bytes()


def handler_for(fleet: Fleet) -> type[BaseHTTPRequestHandler]:
    routes: dict[str, Callable[[], Any]] = {"/api/live": fleet.live, "/api/hosts": fleet.hosts,
                                            "/api/history": fleet.history}

    class Handler(BaseHTTPRequestHandler):
        server_version = "fleetctl-ui"
        #: Socket timeout of every read and write: an idle or stalled connection ends.
        timeout = IDLE_TIMEOUT

        def log_message(self, format: str, *args: Any) -> None:
            del format, args  # quiet: the terminal is the operator's

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header(
                "Content-Security-Policy",
                "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:",
            )
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            allow = getattr(self.server, "allow_hosts", LOCAL_NAMES)
            if not host_allowed(self.headers.get("Host"), allow):
                self._send(HTTPStatus.MISDIRECTED_REQUEST,
                           b"this Host is not the fleetctl ui's: open it by its address or "
                           b"localhost (or start it with --allow-host NAME)",
                           "text/plain; charset=utf-8")
                return
            try:
                if path in ASSETS:
                    name, ctype = ASSETS[path]
                    self._send(HTTPStatus.OK, asset(name), ctype)
                elif path in routes:
                    body = json.dumps(routes[path](), default=str).encode()
                    self._send(HTTPStatus.OK, body, "application/json")
                elif path.startswith("/report/") and path.count("/") == 3:
                    _, _, rid, host = (unquote(p) for p in path.split("/"))
                    page = fleet.report(rid, host)
                    if page is None:
                        self._send(
                            HTTPStatus.NOT_FOUND,
                            f"no soak report for {host} in {rid}".encode(),
                            "text/plain; charset=utf-8",
                        )
                    else:
                        self._send(HTTPStatus.OK, page.encode(), "text/html; charset=utf-8")
                else:
                    self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain; charset=utf-8")
            except (FleetError, OSError, ValueError) as e:
                cause = e.message() if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, json.dumps({"error": cause}).encode(),
                           "application/json")

    return Handler


def serve(fleet: Fleet, bind: str = "127.0.0.1", port: int = DEFAULT_PORT,
          allow_hosts: frozenset[str] = frozenset()) -> BoundedServer:
    """A server for ``fleet`` bound to ``bind:port`` (0: any free port), not yet serving."""
    if not bind.strip():
        raise FleetError("--bind '' would listen on every interface without saying so",
                         fix="give an address: 127.0.0.1 (the default), this machine's LAN "
                             "address, or 0.0.0.0 / :: for every interface")
    try:
        return BoundedServer((bind, port), handler_for(fleet), allow_hosts)
    except OSError as e:
        if isinstance(e, socket.gaierror) or e.errno == 99:  # EADDRNOTAVAIL: no interface has it
            raise FleetError(f"cannot listen on {bind} (port {port}): {e.strerror or e}",
                             fix="give --bind an address of this machine (127.0.0.1, ::1, a LAN "
                                 "address, 0.0.0.0 or :: for every interface)") from e
        raise FleetError(f"cannot listen on {bind}:{port}: {e.strerror or e}",
                         fix="pick another port with --port N (or stop what listens there)") from e


def exposure(server: BoundedServer) -> str | None:
    """A warning when ``server`` is reachable from other machines (every interface, or a
    non-loopback one)."""
    addr = ipaddress.ip_address(str(server.server_address[0]).split("%", 1)[0])
    port = server.server_address[1]
    if addr.is_unspecified:
        return (f"listening on every interface ({addr}, port {port}): anyone who reaches this "
                "machine can read the fleet's hosts, history and soak reports; use --bind "
                "127.0.0.1 unless that is meant")
    if not addr.is_loopback:
        return f"listening on {addr} (port {port}): reachable from other machines on that network"
    return None


def url_of(server: BoundedServer) -> str:
    """``http://host:port/`` of a server (its real port when it was asked for port 0)."""
    addr = server.server_address
    host = addr[0].decode() if isinstance(addr[0], bytes) else str(addr[0])
    return http_url(host, addr[1], "/")


@click.command("ui")
@click.option(
    "--port",
    "-p",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="TCP port (0: any free one).",
)
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on (IPv4 or IPv6; 0.0.0.0 or :: is every interface, with a "
                   "warning); the page is read-only but shows the fleet's names and history.")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="A host name the page may be opened by (addresses and localhost always may; "
                   "repeatable).")
@metrics_options
@json_option
@pass_ctx
def ui(ctx: Ctx, port: int, bind: str, allow_hosts: tuple[str, ...]) -> None:
    """Serve a read-only web page: hosts, the rollout in progress, history and soak reports."""
    inv = inventory.load(ctx.inventory)
    fleet = Fleet(inv, paths.state_dir(inv.path))
    server = serve(fleet, bind, port, frozenset(allow_hosts))
    exporter = None
    if ctx.metrics_port is not None:
        try:
            recipe_of = metrics_fleet.recipes_of(inv)
            exporter = metrics.metrics_server(metrics.registry_of(
                metrics_fleet.FleetMetrics(inv, fleet.state_dir, None, fleet.hosts),
                metrics.ReplayMetrics(fleet.newest_run, recipe_of)),
                ctx.metrics_bind, ctx.metrics_port)
        except BaseException:
            server.server_close()
            raise
        ctx.err.print(f"metrics on {metrics.url_of(exporter)} (Prometheus)", highlight=False,
                      markup=False)
    url = url_of(server)
    warning = exposure(server)
    if warning:
        ctx.err.print(f"warning: {warning}", highlight=False, markup=False)
    ctx.emit(
        {"url": url, "state_dir": str(paths.state_dir(inv.path))},
        lambda con: con.print(
            f"fleetctl ui on {url} (read-only; Ctrl-C stops it)", highlight=False, markup=False
        ),
    )
    sys.stdout.flush()  # the URL reaches a script reading a pipe before the server blocks
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if exporter is not None:
            exporter.shutdown()
            exporter.server_close()


commands: list[click.Command] = [ui]
