"""Dead letters: the ``route_dlq`` job (:mod:`jobs.dlq.job`) and the helper made for the ``pyspark``
shell (``from jobs import dlq``): load, filter, summarize and show dead letters, and redrive them.
See docs/jobs.md (route_dlq, the dlq helper).

Besides the job package's roles (docs/jobs.md, "How a job package is laid out"), the shell helper's
``inspect`` (load, filter, summarize, show) and ``redrive`` (send dead letters again).
"""

from __future__ import annotations

from jobs.dlq.inspect import (
    AGE_BUCKETS,
    MAX_BODY_BYTES,
    build_summary,
    filter_dead_letters,
    format_body,
    format_dead_letter,
    format_history,
    hex_dump,
    load,
    show,
    summary,
)
from jobs.dlq.redrive import (
    CHECK,
    PROPERTY_DLQ_MSG_ID,
    PROPERTY_REDRIVE_REQUEST_ID,
    RECOVERED,
    REDRIVE_PRODUCER_GROUP,
    SEND,
    SENT_NOW,
    SKIP,
    SKIPPED,
    STRIPPED_PROPERTIES,
    Redriven,
    format_plan,
    redrive,
)
from jobs.dlq.transforms import PENDING, SENT

__all__ = [
    "AGE_BUCKETS",
    "CHECK",
    "MAX_BODY_BYTES",
    "PENDING",
    "PROPERTY_DLQ_MSG_ID",
    "PROPERTY_REDRIVE_REQUEST_ID",
    "RECOVERED",
    "REDRIVE_PRODUCER_GROUP",
    "SEND",
    "SENT",
    "SENT_NOW",
    "SKIP",
    "SKIPPED",
    "STRIPPED_PROPERTIES",
    "Redriven",
    "build_summary",
    "filter_dead_letters",
    "format_body",
    "format_dead_letter",
    "format_history",
    "format_plan",
    "hex_dump",
    "load",
    "redrive",
    "show",
    "summary",
]
