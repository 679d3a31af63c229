"""Small files replaced atomically and durably (progress files, configuration snapshots)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_durably(path: Path, data: Any) -> None:
    """Replace the JSON file ``path`` with ``data`` atomically and durably (temp file, fsync,
    rename, fsync of the directory): after a crash it holds the old content or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".json.tmp")
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
