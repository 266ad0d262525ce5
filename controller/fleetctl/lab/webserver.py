"""The lab's HTTP server: serves ``<lab>/www`` (apt repository, weights mirror) on ``<gw>:8080``.

Run as ``python -m fleetctl.lab.webserver --bind ADDR --port N --root DIR``.
Python's file server plus single byte ranges (``Range: bytes=a-b``), because
resumable downloads of weights are what a real mirror or the hub offers.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class RangeHandler(SimpleHTTPRequestHandler):
    """A static file handler that honours one byte range per request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Access log on stderr (the lab redirects it into its log directory)."""
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def send_head(self) -> Any:
        """Like the parent, but answer 206 with the requested slice when a Range header is
        present."""
        header = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not header or os.path.isdir(path) or not os.path.isfile(path):
            return super().send_head()
        m = _RANGE.match(header.strip())
        size = os.path.getsize(path)
        if not m or (not m.group(1) and not m.group(2)):
            return super().send_head()
        if m.group(1):
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else size - 1
        else:  # suffix range: the last N bytes
            start, end = max(0, size - int(m.group(2))), size - 1
        end = min(end, size - 1)
        if start >= size or start > end:
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        f = open(path, "rb")  # noqa: SIM115 - closed by copyfile's caller below
        f.seek(start)
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._remaining: int | None = end - start + 1
        return f

    def end_headers(self) -> None:
        """Advertise range support on every answer."""
        if not any(
            h.lower().startswith(b"accept-ranges") for h in getattr(self, "_headers_buffer", [])
        ):
            self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def copyfile(self, source: Any, outputfile: Any) -> None:
        """Copy the whole file, or only the requested slice for a 206."""
        remaining = getattr(self, "_remaining", None)
        if remaining is None:
            shutil.copyfileobj(source, outputfile)
            return
        self._remaining = None
        while remaining > 0:
            chunk = source.read(min(1 << 20, remaining))
            if not chunk:
                break
            outputfile.write(chunk)
            remaining -= len(chunk)


def main(argv: list[str] | None = None) -> int:
    """Serve until killed."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args(argv)

    def handler(*a: Any, **kw: Any) -> RangeHandler:
        return RangeHandler(*a, directory=args.root, **kw)

    server = ThreadingHTTPServer((args.bind, args.port), handler)
    server.daemon_threads = True
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
