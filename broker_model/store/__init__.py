"""The store: the commit log record layout, the Delta tables a broker appends to (commit log, offset ledger) and the
reading of their Delta logs (``delta_commits``),
the message store that indexes a commit log into consume queues, the broker name lock, and RocketMQ segment
file import, export and incremental ingest of a RocketMQ store (see docs/architecture.md).
"""

from __future__ import annotations

from broker_model.store.append_log import AddFile, AppendLog
from broker_model.store.commitlog import rows_to_table
from broker_model.store.delta_commits import (
    CommitChange,
    FileAction,
    commit_path,
    latest_version,
    load_table,
    read_change,
    read_changes,
    retry_listing_gap,
)
from broker_model.store.delta_tables import append_rows, ensure_table, pack_small_files, read_table
from broker_model.store.message_store import MessageExt, MessageStore, PullResult, PullStatus, Subscription
from broker_model.store.name_lock import BrokerNameLock, LakeLock
from broker_model.store.offset_ledger import OffsetCommit, OffsetLedger
from broker_model.store.record import (
    FIXED_RECORD_LENGTH,
    IPV6_HOST_EXTRA,
    RECORD_COLUMNS,
    decode_record,
    encode_blank,
    encode_record,
    magic_for_topic,
    peek_header,
    record_length,
)
from broker_model.store.segment_files import export_commitlog, import_commitlog
from broker_model.store.store_ingest import ingest_store, ingested_end

__all__ = [
    "FIXED_RECORD_LENGTH",
    "IPV6_HOST_EXTRA",
    "RECORD_COLUMNS",
    "AddFile",
    "AppendLog",
    "BrokerNameLock",
    "CommitChange",
    "FileAction",
    "LakeLock",
    "MessageExt",
    "MessageStore",
    "OffsetCommit",
    "OffsetLedger",
    "PullResult",
    "PullStatus",
    "Subscription",
    "append_rows",
    "commit_path",
    "decode_record",
    "encode_blank",
    "encode_record",
    "ensure_table",
    "export_commitlog",
    "import_commitlog",
    "ingest_store",
    "ingested_end",
    "latest_version",
    "load_table",
    "magic_for_topic",
    "pack_small_files",
    "peek_header",
    "read_change",
    "read_changes",
    "read_table",
    "record_length",
    "retry_listing_gap",
    "rows_to_table",
]
