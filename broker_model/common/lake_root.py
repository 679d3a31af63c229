"""Where the lake is: ``--lake``, else the ``RMQ_LAKE`` environment variable, else ``data/lake``."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_LAKE = Path("data") / "lake"


def default_lake() -> Path:
    """The lake root used when no ``--lake`` is given."""
    return Path(os.environ.get("RMQ_LAKE") or DEFAULT_LAKE)
