"""A pull's progress in bytes: the registry's layer sizes, and the layers ``docker pull`` reports
done.

``docker pull`` without a terminal prints no byte counts, only one line per layer and state
(``64641e29547f: Pulling fs layer``, ``...: Download complete``, ``...: Already exists``,
``...: Pull complete``). The image's manifest (:func:`fleetctl.registry.layer_sizes`) gives each
layer's size; :class:`PullMeter` adds the sizes of the layers downloaded (or already there), so the
bytes grow a layer at a time: on a real image of tens of layers that is a fair bar, and it needs
nothing on the host but the docker CLI it already runs. Extracting follows downloading (``Pull
complete``): the layers count the extracted ones, so that a pull whose bytes are all in but still
unpacks says so.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from fleetctl.stage import human_bytes

#: ``<12 hex>: <state>``: docker's line for one layer.
_LAYER_LINE = re.compile(r"^([0-9a-f]{12}): (.+)$")
#: States after which a layer's bytes are on the host.
_DOWNLOADED = ("Download complete", "Already exists", "Pull complete")
#: States after which a layer is extracted too.
_EXTRACTED = ("Already exists", "Pull complete")
_UP_TO_DATE = "Status: Image is up to date"


class PullMeter:
    """Folds ``docker pull``'s lines into bytes done of the total; thread-safe.

    ``platforms``: layer digest -> size for each platform of the image (an index has several; the
    one this host pulls is the one whose layers its lines name). Empty when the registry could not
    say: then only layers are counted.
    """

    def __init__(self, platforms: Sequence[dict[str, int]] = ()) -> None:
        self.platforms = [
            {d.split(":", 1)[-1][:12]: size for d, size in p.items()} for p in platforms if p
        ]
        self.seen: set[str] = set()
        self.downloaded: set[str] = set()
        self.extracted: set[str] = set()
        self.up_to_date = False
        self._lock = threading.Lock()

    def feed(self, line: str) -> bool:
        """Take one line of docker's output; True when the figures changed."""
        line = line.strip()
        with self._lock:
            if line.startswith(_UP_TO_DATE):
                self.up_to_date = True
                return True
            m = _LAYER_LINE.match(line)
            if m is None:
                return False
            layer, state = m.groups()
            before = (len(self.seen), len(self.downloaded), len(self.extracted))
            self.seen.add(layer)
            if state.startswith(_DOWNLOADED):
                self.downloaded.add(layer)
            if state.startswith(_EXTRACTED):
                self.extracted.add(layer)
            return (len(self.seen), len(self.downloaded), len(self.extracted)) != before

    def _sizes(self) -> dict[str, int] | None:
        """The platform this pull's layers belong to (the most of them named), or None."""
        if not self.platforms:
            return None
        best = max(self.platforms, key=lambda p: len(self.seen & p.keys()))
        return best if self.seen & best.keys() or len(self.platforms) == 1 else None

    def figures(self) -> dict[str, Any]:
        """``bytes`` downloaded of ``bytes_total`` (None when unknown), ``layers`` extracted of
        ``layers_total``."""
        with self._lock:
            sizes = self._sizes()
            if sizes is None:
                n = len(self.seen)
                return {
                    "bytes": None,
                    "bytes_total": None,
                    "layers": n if self.up_to_date else len(self.extracted),
                    "layers_total": n,
                }
            total = sum(sizes.values())
            done = (
                total if self.up_to_date else sum(sizes.get(layer, 0) for layer in self.downloaded)
            )
            layers = len(sizes) if self.up_to_date else len(self.extracted & sizes.keys())
            return {
                "bytes": done,
                "bytes_total": total,
                "layers": layers,
                "layers_total": len(sizes),
            }

    def message(self) -> str:
        """The pull's own words for the host's row: ``8.1 GB of 18.4 GB, 3/7 layers extracted``."""
        f = self.figures()
        layers = f"{f['layers']}/{f['layers_total']} layers extracted"
        if f["bytes_total"] is None:
            return layers
        return f"{human_bytes(f['bytes'])} of {human_bytes(f['bytes_total'])}, {layers}"
