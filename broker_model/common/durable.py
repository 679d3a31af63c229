"""Small files replaced atomically and durably (progress files, configuration snapshots)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from schemas.errors import BrokerError

_T = TypeVar("_T")


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


def read_progress(path: Path, what: str, when_deleted: str, parse: Callable[[dict[str, Any]], _T]) -> _T | None:
    """A service's progress file, read by ``parse``; None when there is none.

    Raises:
        BrokerError: the file is not JSON, or ``parse`` finds it malformed (a ValueError,
            TypeError, AttributeError or KeyError); the message says what deleting it does
            (``when_deleted``).
    """
    try:
        return parse(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise BrokerError(
            f"{what} progress file {path} is unreadable ({exc}); restore it from a backup, or delete it {when_deleted}"
        ) from exc
