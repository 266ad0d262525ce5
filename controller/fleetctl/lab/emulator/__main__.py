"""``python3 -m <package> serve MODEL_DIR ...``."""

from __future__ import annotations

import sys

from .main import main

sys.exit(main())
