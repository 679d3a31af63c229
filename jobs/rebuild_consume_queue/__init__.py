"""The ``rebuild_consume_queue`` job: consume queues rebuilt from the commit log, with their integrity
report (see docs/jobs.md).

Besides the job package's roles (docs/jobs.md, "How a job package is laid out"): ``tails`` (the
last row of every queue and log, ``consume_queue_tails``) and ``verify`` (a broker's own consume
queue files against the rebuilt ones, ``--verify-broker``).
"""

from __future__ import annotations

from jobs.extract import DRIVER_INCREMENT_BYTES
from jobs.rebuild_consume_queue.job import APP_ID, RebuildConfig, main, plan_run, run
from jobs.rebuild_consume_queue.tails import queue_starts
from jobs.rebuild_consume_queue.transforms import (
    build_checked_records,
    build_consume_queue,
    build_integrity_report,
    build_log_context,
    build_queue_context,
    build_segment_sizes,
)

__all__ = [
    "APP_ID",
    "DRIVER_INCREMENT_BYTES",
    "RebuildConfig",
    "build_checked_records",
    "build_consume_queue",
    "build_integrity_report",
    "build_log_context",
    "build_queue_context",
    "build_segment_sizes",
    "main",
    "plan_run",
    "queue_starts",
    "run",
]
