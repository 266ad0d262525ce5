"""fleetctl: roll vLLM forward and back across a fleet of DGX Sparks, with soak gates."""

from __future__ import annotations

__version__ = "0.1.0"
