"""The ``resolve_transactions`` job: one state per transaction as of T, the check-backs due and the
anomalies (see docs/jobs.md).
"""

from __future__ import annotations

from jobs.resolve_transactions.job import (
    ResolveTransactionsConfig,
    TransactionSummary,
    build_config,
    format_summary,
    main,
    run,
)
from jobs.resolve_transactions.transforms import (
    TRANSACTION_SOURCE_COLUMNS,
    build_discards,
    build_finals,
    build_half_records,
    build_ops,
    build_transaction_state,
)

__all__ = [
    "TRANSACTION_SOURCE_COLUMNS",
    "ResolveTransactionsConfig",
    "TransactionSummary",
    "build_config",
    "build_discards",
    "build_finals",
    "build_half_records",
    "build_ops",
    "build_transaction_state",
    "format_summary",
    "main",
    "run",
]
