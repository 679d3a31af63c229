"""Where a replay is: its lock (one run per replay id), and the last offset replayed per queue in
``replay_progress``, for restarts that neither skip nor repeat.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa

from broker_model.common import (
    QUEUE_KEY,
    QueueKey,
    now_ms,
)
from broker_model.store import LakeLock
from jobs.lake import (
    Lake,
)
from jobs.replay.plan import Progress
from schemas.catalog import (
    REPLAY_PROGRESS,
)
from schemas.errors import ValidationError


class ReplayLock:
    """The lake lock making a replay id exclusive on a lake; released when the holder dies."""

    def __init__(self, lake: Path, replay_id: str) -> None:
        self._lock = LakeLock(lake, f"replay-{replay_id}")
        self.path = self._lock.path
        self.replay_id = replay_id

    def __enter__(self) -> ReplayLock:
        holder = self._lock.try_acquire()
        if holder is not None:
            raise ValidationError(
                "--replay-id",
                self.replay_id,
                f"is being replayed by another process ({holder})",
                "wait for it to end or kill it, then run again",
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def read_progress(lake: Lake, replay_id: str) -> dict[QueueKey, Progress]:
    """The progress of every queue of ``replay_id`` (empty when the table does not exist); a small
    table, read from the driver as it is written."""
    rows = (
        lake.read_rows(REPLAY_PROGRESS, filters=[("replay_id", "=", replay_id)])
        .group_by(list(QUEUE_KEY))
        .aggregate([("last_offset", "min"), ("last_offset", "max"), ("updated_timestamp", "max")])
    )
    return {
        (r["broker_name"], r["topic"], r["queue_id"]): Progress(
            r["last_offset_min"] + 1, r["last_offset_max"], r["updated_timestamp_max"]
        )
        for r in rows.to_pylist()
    }


def write_progress(lake: Lake, replay_id: str, last_offsets: Mapping[QueueKey, int]) -> None:
    """Append one ``replay_progress`` row per queue of ``last_offsets``."""
    if not last_offsets:
        return
    keys = sorted(last_offsets)
    columns = {
        "replay_id": [replay_id] * len(keys),
        "broker_name": [k[0] for k in keys],
        "topic": [k[1] for k in keys],
        "queue_id": [k[2] for k in keys],
        "last_offset": [last_offsets[k] for k in keys],
        "updated_timestamp": [now_ms()] * len(keys),
    }
    # a few rows per batch: appended from the driver, so that a batch's progress costs a commit, not a Spark job
    lake.append_rows(REPLAY_PROGRESS, pa.table(columns, schema=REPLAY_PROGRESS.arrow_schema))
