"""Where the lake is: ``--lake``, else the ``RMQ_LAKE`` environment variable, else ``data/lake``; and
where in it a broker keeps the files that are not tables."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_LAKE = Path("data") / "lake"


def default_lake() -> Path:
    """The lake root used when no ``--lake`` is given."""
    return Path(os.environ.get("RMQ_LAKE") or DEFAULT_LAKE)


def delay_progress_path(lake: str | Path, broker_name: str) -> Path:
    """Where a broker's schedule progress (RocketMQ's ``delayOffset.json``) lives in the lake."""
    return Path(lake) / "_config" / broker_name / "delayOffset.json"
