"""The lake catalog: every table of the product, declared once.

Each table has a name, a path relative to the lake root, its partition columns, and its columns
with Arrow types and a one-line meaning (with unit). The Spark schema is derived from the Arrow
schema, so the broker (Arrow, delta-rs) and the jobs (Spark) can never disagree on a type.

Importing this module never imports pyspark; :func:`spark_schema` does, lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from schemas.errors import ValidationError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class Column:
    """One column: name, Arrow type, nullability and its meaning (with unit)."""

    name: str
    type: pa.DataType
    meaning: str
    nullable: bool = True


@dataclass(frozen=True)
class TableSpec:
    """One lake table: where it lives, how it is partitioned, and its columns."""

    name: str
    path: str
    partition_by: tuple[str, ...]
    columns: tuple[Column, ...]
    meaning: str

    @property
    def arrow_schema(self) -> pa.Schema:
        """The table's Arrow schema, columns in declaration order."""
        return pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns])

    @property
    def column_names(self) -> list[str]:
        """Column names in declaration order."""
        return [c.name for c in self.columns]

    @property
    def data_columns(self) -> list[str]:
        """Columns stored inside data files (all but the partition columns)."""
        return [c.name for c in self.columns if c.name not in self.partition_by]

    def location(self, lake_root: str | Path) -> Path:
        """The table's directory under ``lake_root``."""
        return Path(lake_root) / self.path


def _cols(*specs: tuple[str, pa.DataType, str] | tuple[str, pa.DataType, str, bool]) -> tuple[Column, ...]:
    return tuple(Column(*spec) for spec in specs)


# Parquet column paths (any table) whose values rarely repeat within a data file: message bodies,
# ids, keys and property values. Writers do not dictionary-encode them: an encoder that tries
# builds a dictionary of up to 1 MB per column chunk and then falls back to plain encoding, and a
# writer of many small files (one per queue and batch, say) pays that attempt in every file.
# The names mean the same in every table; map keys (property names) stay dictionary-encoded.
PLAIN_ENCODED_COLUMNS = ("body", "raw_properties", "properties.key_value.value", "keys", "uniq_key", "msg_id")

_STRING_MAP = pa.map_(pa.string(), pa.string())
_VERSION_MAP = pa.map_(pa.string(), pa.int64())
_SIZE_MAP = pa.map_(pa.string(), pa.int64())  # name -> bytes

COMMITLOG = TableSpec(
    name="commitlog",
    path="commitlog",
    partition_by=("broker_name", "segment"),
    meaning="one row per stored commit log record, exactly as RocketMQ lays it out",
    columns=_cols(
        ("broker_name", pa.string(), "name of the broker whose commit log holds the record", False),
        ("segment", pa.int64(), "base physical offset (bytes) of the segment file holding the record", False),
        ("commit_log_offset", pa.int64(), "physical byte offset of the record's first byte", False),
        ("store_size", pa.int32(), "exact record length in bytes (RocketMQ TOTALSIZE)", False),
        ("magic_code", pa.int32(), "record format magic: v1 -626843481 or v2 -626843477", False),
        ("body_crc", pa.int32(), "CRC-32 of the stored body masked to 31 bits", False),
        ("queue_id", pa.int32(), "queue id within the topic on this broker", False),
        ("flag", pa.int32(), "user flag of the message", False),
        ("queue_offset", pa.int64(), "index of the record in its consume queue (0 for prepared/rollback)", False),
        ("sys_flag", pa.int32(), "MessageSysFlag bits (compression, transaction type, IPv6 hosts)", False),
        ("born_timestamp", pa.int64(), "producer's send time, epoch milliseconds", False),
        ("born_host", pa.string(), "producer address as ip:port ([ip]:port for IPv6)", False),
        ("store_timestamp", pa.int64(), "broker's append time, epoch milliseconds", False),
        ("store_host", pa.string(), "broker address as ip:port ([ip]:port for IPv6)", False),
        ("reconsume_times", pa.int32(), "deliveries that failed before this record was stored", False),
        ("prepared_transaction_offset", pa.int64(), "commit log offset of the half message (commit records)", False),
        ("body", pa.binary(), "stored body bytes, compressed when sys_flag has the compressed bit", False),
        ("topic", pa.string(), "topic the record is stored under", False),
        ("properties", _STRING_MAP, "decoded message properties", False),
        ("raw_properties", pa.binary(), "the record's exact PROPERTIES bytes (UTF-8 property string)", False),
        ("tags", pa.string(), "TAGS property, null when absent"),
        ("keys", pa.string(), "KEYS property (space separated), null when absent"),
        ("uniq_key", pa.string(), "UNIQ_KEY property (client message id), null when absent"),
        ("msg_id", pa.string(), "offset message id: store host and commit log offset in hex", False),
    ),
)

CONSUME_QUEUE = TableSpec(
    name="consume_queue",
    path="consume_queue",
    partition_by=("topic",),
    meaning="one consume-queue row per dispatched record (broker_name, topic, queue_id, queue_offset)",
    columns=_cols(
        ("broker_name", pa.string(), "broker holding the queue", False),
        ("topic", pa.string(), "topic of the queue", False),
        ("queue_id", pa.int32(), "queue id within the topic on that broker", False),
        ("queue_offset", pa.int64(), "index of the row in the queue", False),
        ("commit_log_offset", pa.int64(), "physical byte offset of the record", False),
        ("store_size", pa.int32(), "record length in bytes", False),
        ("tags_code", pa.int64(), "Java String.hashCode of TAGS, or delivery time (ms) on the schedule topic", False),
        ("store_timestamp", pa.int64(), "broker's append time, epoch milliseconds", False),
    ),
)

CONSUMER_OFFSET_COMMITS = TableSpec(
    name="consumer_offset_commits",
    path="consumer_offset_commits",
    partition_by=(),
    meaning="append-only history of consumer offset commits",
    columns=_cols(
        ("group", pa.string(), "consumer group", False),
        ("broker_name", pa.string(), "broker holding the queue", False),
        ("topic", pa.string(), "topic of the queue", False),
        ("queue_id", pa.int32(), "queue id", False),
        ("offset", pa.int64(), "next queue offset to consume", False),
        ("commit_timestamp", pa.int64(), "time of the commit, epoch milliseconds", False),
        ("source", pa.string(), "who committed: consumer, reset, replay, ...", False),
        ("client_id", pa.string(), "client id of the committer (ip@instance)"),
        ("reset_id", pa.string(), "id of the offset reset that wrote this row, null for other sources"),
        ("previous_offset", pa.int64(), "offset the reset replaced (-1 when there was none), null otherwise"),
        ("reason", pa.string(), "why the reset was made (--reason), null otherwise"),
        ("operator", pa.string(), "who ran the reset (user@host), null otherwise"),
    ),
)

OFFSET_COMMIT_COLUMNS = ("group", "broker_name", "topic", "queue_id", "offset", "commit_timestamp", "source")
"""The columns of ``consumer_offset_commits`` that say what a commit set; the rest describe resets."""

CONSUME_QUEUE_INTEGRITY = TableSpec(
    name="consume_queue_integrity",
    path="consume_queue_integrity",
    partition_by=(),
    meaning="one row per integrity finding of a consume queue rebuild",
    columns=_cols(
        ("broker_name", pa.string(), "broker whose log has the finding", False),
        ("topic", pa.string(), "topic of the queue, null for findings about a record alone"),
        ("queue_id", pa.int32(), "queue id, null for findings about a record alone"),
        ("queue_offset", pa.int64(), "queue offset concerned, null when none"),
        ("commit_log_offset", pa.int64(), "commit log offset of the record concerned, null when none"),
        (
            "problem",
            pa.string(),
            "GAP, DUPLICATE_QUEUE_OFFSET, NON_MONOTONIC_OFFSET, CRC_MISMATCH, SIZE_MISMATCH, BEYOND_SEGMENT, "
            "or BROKER_CQ_* (a broker's own consume queue differs: MISSING, EXTRA, OFFSET, SIZE, TAGS, BEYOND_LOG)",
            False,
        ),
        ("detail", pa.string(), "the values that disagree, in words", False),
        ("commitlog_version", pa.int64(), "commitlog version the check covered up to", False),
    ),
)

CONSUME_QUEUE_TAILS = TableSpec(
    name="consume_queue_tails",
    path="consume_queue_tails",
    partition_by=(),
    meaning="the last consume-queue row of every queue and the last record of every broker's log, as of the commit log "
    "version the consume queue was built from",
    columns=_cols(
        (
            "kind",
            pa.string(),
            "QUEUE: the last consume-queue row of a queue; LOG: the last record of a broker's commit log",
            False,
        ),
        ("broker_name", pa.string(), "broker of the queue or the log", False),
        ("topic", pa.string(), "topic of the queue, null for LOG"),
        ("queue_id", pa.int32(), "queue id, null for LOG"),
        ("queue_offset", pa.int64(), "queue offset of the queue's last consume-queue row, null for LOG"),
        ("segment", pa.int64(), "segment column of the log's last record, null for QUEUE"),
        ("commit_log_offset", pa.int64(), "commit log offset of the last consume-queue row or record", False),
        ("store_size", pa.int32(), "record length in bytes of the log's last record, null for QUEUE"),
        ("commitlog_version", pa.int64(), "commitlog version the tails are of", False),
    ),
)

CONSUMER_OFFSETS = TableSpec(
    name="consumer_offsets",
    path="consumer_offsets",
    partition_by=(),
    meaning="current committed offset and lag per (group, broker_name, topic, queue_id)",
    columns=_cols(
        ("group", pa.string(), "consumer group", False),
        ("broker_name", pa.string(), "broker holding the queue", False),
        ("topic", pa.string(), "topic of the queue", False),
        ("queue_id", pa.int32(), "queue id", False),
        ("consumer_offset", pa.int64(), "next queue offset the group will consume"),
        ("broker_min_offset", pa.int64(), "smallest queue offset still in the queue"),
        ("broker_offset", pa.int64(), "the queue's next offset to be written"),
        ("diff", pa.int64(), "broker_offset - consumer_offset, in messages"),
        ("last_timestamp", pa.int64(), "store time (ms) of the last consumed message"),
        ("oldest_unconsumed_timestamp", pa.int64(), "store time (ms) of the first unconsumed message"),
        ("as_of", pa.int64(), "time the figures are computed for, epoch milliseconds", False),
        ("anomaly", pa.string(), "QUEUE_NOT_FOUND when the group commits on a queue the log does not have"),
    ),
)

TRANSACTION_STATE = TableSpec(
    name="transaction_state",
    path="transaction_state",
    partition_by=(),
    meaning="one row per transaction (half message) and its resolved state",
    columns=_cols(
        ("broker_name", pa.string(), "broker holding the half message", False),
        ("producer_group", pa.string(), "producer group of the transaction"),
        ("uniq_key", pa.string(), "client message id of the transaction"),
        ("half_queue_offset", pa.int64(), "queue offset of the original half message", False),
        ("half_commit_log_offset", pa.int64(), "commit log offset of the original half message", False),
        ("real_topic", pa.string(), "topic the message is meant for"),
        ("real_queue_id", pa.int32(), "queue the message is meant for"),
        ("state", pa.string(), "COMMITTED, ROLLED_BACK, PENDING, CHECK_DUE, DISCARDED or EXPIRED", False),
        ("check_times", pa.int32(), "check-backs made so far"),
        ("op_queue_offset", pa.int64(), "queue offset of the op message that ended it"),
        ("final_commit_log_offset", pa.int64(), "commit log offset of the committed message"),
        ("born_timestamp", pa.int64(), "producer's send time, epoch milliseconds"),
        ("as_of", pa.int64(), "time the state is computed for, epoch milliseconds", False),
        ("anomaly", pa.string(), "what is inconsistent about this transaction, null when nothing"),
    ),
)

TRANSACTION_RECORDS = TableSpec(
    name="transaction_records",
    path="transaction_records",
    partition_by=("kind",),
    meaning=(
        "the commit log records of transactions, decoded once and appended as the log grows: one row "
        "per half, final and discard record and per half queue offset an op record lists"
    ),
    columns=_cols(
        ("kind", pa.string(), "HALF, OP, FINAL or DISCARD", False),
        ("broker_name", pa.string(), "broker holding the record", False),
        ("queue_id", pa.int32(), "queue of the record", False),
        ("queue_offset", pa.int64(), "queue offset of the record", False),
        ("commit_log_offset", pa.int64(), "commit log offset of the record", False),
        ("born_timestamp", pa.int64(), "producer's send time, epoch milliseconds", False),
        ("store_timestamp", pa.int64(), "store time of the record, epoch milliseconds", False),
        ("topic", pa.string(), "topic of the record", False),
        ("producer_group", pa.string(), "PGROUP property"),
        ("uniq_key", pa.string(), "client message id (UNIQ_KEY)"),
        ("real_topic", pa.string(), "HALF: REAL_TOPIC property"),
        ("real_queue_id", pa.int32(), "HALF: REAL_QID property"),
        ("check_times", pa.int32(), "HALF, DISCARD: TRANSACTION_CHECK_TIMES property"),
        ("prepared_queue_offset", pa.int64(), "HALF: TRAN_PREPARED_QUEUE_OFFSET property"),
        ("has_check_immunity", pa.bool_(), "HALF: CHECK_IMMUNITY_TIME_IN_SECONDS is present"),
        ("check_immunity_ms", pa.int64(), "HALF: check immunity in milliseconds, null when not a number"),
        ("removes", pa.bool_(), "OP: the op's tag is d, so it ends halves"),
        ("half_queue_offset", pa.int64(), "OP: one half queue offset of the op's body, -1 when not a number"),
        ("prepared_transaction_offset", pa.int64(), "FINAL: commit log offset of the half it ended"),
    ),
)

# one delivery attempt of a retry chain: the original (reconsume times 0) or a retry
ATTEMPT = pa.struct(
    [
        pa.field("broker_name", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("commit_log_offset", pa.int64()),
        pa.field("reconsume_times", pa.int32()),
        pa.field("store_timestamp", pa.int64()),
    ]
)

RETRY_RECORDS = TableSpec(
    name="retry_records",
    path="retry_records",
    partition_by=("kind",),
    meaning=(
        "the send-back records of the commit log (retries waiting in the schedule topic, retries "
        "delivered to %RETRY%group, dead letters in %DLQ%group), decoded once and appended as the log grows"
    ),
    columns=_cols(
        ("kind", pa.string(), "SCHEDULED, RETRY or DLQ", False),
        ("group", pa.string(), "consumer group whose retry or dead letter topic the record is for", False),
        ("broker_name", pa.string(), "broker holding the record", False),
        ("topic", pa.string(), "topic of the record", False),
        ("queue_id", pa.int32(), "queue of the record", False),
        ("queue_offset", pa.int64(), "queue offset of the record", False),
        ("commit_log_offset", pa.int64(), "commit log offset of the record", False),
        ("msg_id", pa.string(), "offset message id of the record", False),
        ("uniq_key", pa.string(), "client message id (UNIQ_KEY)"),
        ("keys", pa.string(), "KEYS property"),
        ("origin_msg_id", pa.string(), "ORIGIN_MESSAGE_ID: offset message id of the first stored copy"),
        ("origin_topic", pa.string(), "RETRY_TOPIC: topic the message was first sent to"),
        ("reconsume_times", pa.int32(), "failed deliveries before this record", False),
        ("born_timestamp", pa.int64(), "producer's send time, epoch milliseconds", False),
        ("store_timestamp", pa.int64(), "store time of the record, epoch milliseconds", False),
        ("routed_by", pa.string(), "DLQ: the tool that dead-lettered it on the group's behalf, null for a consumer"),
        ("body", pa.binary(), "RETRY and DLQ: stored body bytes; null for SCHEDULED"),
        ("properties", _STRING_MAP, "RETRY and DLQ: properties of the record; null for SCHEDULED"),
    ),
)

RETRY_CHAINS = TableSpec(
    name="retry_chains",
    path="retry_chains",
    partition_by=(),
    meaning="one row per (group, original message) that failed at least once, with every attempt",
    columns=_cols(
        ("group", pa.string(), "consumer group that failed on the message", False),
        ("origin_msg_id", pa.string(), "offset message id of the first stored copy", False),
        ("uniq_key", pa.string(), "client message id"),
        ("keys", pa.string(), "KEYS property"),
        ("origin_topic", pa.string(), "topic the message was first sent to"),
        ("broker_name", pa.string(), "broker holding the retries", False),
        ("attempts", pa.list_(ATTEMPT), "the original and every delivered retry, oldest first"),
        ("last_reconsume_times", pa.int32(), "reconsume times of the latest send-back record", False),
        ("first_failure_timestamp", pa.int64(), "store time (ms) of the first send-back record", False),
        ("last_timestamp", pa.int64(), "store time (ms) of the latest send-back record", False),
        ("state", pa.string(), "SCHEDULED, DELIVERED, CONSUMED or DEAD: where the latest send-back record is", False),
        ("max_reconsume_times", pa.int32(), "the group's retry_max_times as of as_of", False),
        ("exhausted", pa.bool_(), "not dead although its reconsume times reached the group's limit", False),
        ("as_of", pa.int64(), "time the chain is computed for, epoch milliseconds", False),
    ),
)

DLQ = TableSpec(
    name="dlq",
    path="dlq",
    partition_by=(),
    meaning="one row per dead message with its retry history",
    columns=_cols(
        ("group", pa.string(), "consumer group that gave up on the message", False),
        ("broker_name", pa.string(), "broker holding the dead letter", False),
        ("msg_id", pa.string(), "offset message id of the dead letter record", False),
        ("uniq_key", pa.string(), "client message id"),
        ("origin_msg_id", pa.string(), "message id of the first stored copy"),
        ("origin_topic", pa.string(), "topic the message was first sent to"),
        ("reconsume_times", pa.int32(), "failed deliveries before dead-lettering"),
        ("first_failure_timestamp", pa.int64(), "store time (ms) of the first retry record"),
        ("dlq_timestamp", pa.int64(), "store time (ms) of the dead letter record"),
        ("body", pa.binary(), "stored body bytes"),
        ("properties", _STRING_MAP, "properties of the dead letter record"),
        ("attempts", pa.list_(ATTEMPT), "every stored delivery attempt, oldest first"),
        ("reason", pa.string(), "why it is dead: max reconsume times, negative delay level, policy"),
        ("redrive_state", pa.string(), "null, or the latest redrive of this dead letter"),
    ),
)

DLQ_REDRIVES = TableSpec(
    name="dlq_redrives",
    path="dlq_redrives",
    partition_by=(),
    meaning=(
        "ledger of dead letters re-sent to their original topic: one row per (request, dead letter) "
        "when it is planned (PENDING) and one when it is sent (SENT); the latest row wins"
    ),
    columns=_cols(
        ("request_id", pa.string(), "name of the redrive request; a request sends each dead letter once", False),
        ("broker_name", pa.string(), "broker holding the dead letter", False),
        ("msg_id", pa.string(), "offset message id of the dead letter record", False),
        ("group", pa.string(), "consumer group of the dead letter", False),
        ("target_topic", pa.string(), "topic the message is re-sent to", False),
        ("state", pa.string(), "PENDING (about to be sent) or SENT", False),
        ("new_msg_id", pa.string(), "offset message id of the re-sent message, null while PENDING"),
        ("new_broker_name", pa.string(), "broker that stored the re-sent message, null while PENDING"),
        ("updated_timestamp", pa.int64(), "time of the row, epoch milliseconds", False),
        ("operator", pa.string(), "who ran the redrive (user@host)"),
    ),
)

REPLAY_PROGRESS = TableSpec(
    name="replay_progress",
    path="replay_progress",
    partition_by=(),
    meaning="last replayed queue offset per (replay_id, broker_name, topic, queue_id)",
    columns=_cols(
        ("replay_id", pa.string(), "name of the replay", False),
        ("broker_name", pa.string(), "broker holding the source queue", False),
        ("topic", pa.string(), "source topic", False),
        ("queue_id", pa.int32(), "source queue id", False),
        ("last_offset", pa.int64(), "last source queue offset replayed", False),
        ("updated_timestamp", pa.int64(), "time of the update, epoch milliseconds", False),
    ),
)

JOB_RUNS = TableSpec(
    name="job_runs",
    path="job_runs",
    partition_by=(),
    meaning="one row per job run",
    columns=_cols(
        ("run_id", pa.string(), "unique id of the run", False),
        ("job", pa.string(), "job name", False),
        ("started_timestamp", pa.int64(), "start time, epoch milliseconds", False),
        ("duration_ms", pa.int64(), "wall time of the run, milliseconds", False),
        ("status", pa.string(), "SUCCEEDED, NOOP or FAILED", False),
        ("input_versions", _VERSION_MAP, "Delta version of every table read"),
        ("output_versions", _VERSION_MAP, "Delta version of every table written"),
        ("row_counts", _VERSION_MAP, "rows read or written, by name"),
        ("message", pa.string(), "error or summary text"),
        (
            "parameters",
            _STRING_MAP,
            "the run's settings and the bounds it computed up to (as_of, through, ...), each value as JSON",
        ),
    ),
)

TOPIC_CONFIG = TableSpec(
    name="topic_config",
    path="topic_config",
    partition_by=(),
    meaning="append-only history of topic configurations per broker; the latest row wins",
    columns=_cols(
        ("broker_name", pa.string(), "broker owning the topic's queues", False),
        ("topic", pa.string(), "topic name", False),
        ("queue_nums", pa.int32(), "read and write queue count", False),
        ("perm", pa.int32(), "permission bits: 4 read, 2 write, 1 inherit", False),
        ("updated_timestamp", pa.int64(), "time of the change, epoch milliseconds", False),
        (
            "message_type",
            pa.string(),
            "the message types the topic takes (RocketMQ 5's message.type attribute): NORMAL, FIFO, DELAY, "
            "TRANSACTION or MIXED (all four); null: not set, every type (docs/broker.md)",
        ),
    ),
)

SUBSCRIPTION_GROUP = TableSpec(
    name="subscription_group",
    path="subscription_group",
    partition_by=(),
    meaning=(
        "append-only history of consumer group settings per broker (SubscriptionGroupConfig); the row "
        "with the greatest updated_timestamp per (broker_name, group) wins, a group without a row has "
        "the defaults (retry_max_times 16, retry_queue_nums 1, every *_enable true, not orderly)"
    ),
    columns=_cols(
        ("broker_name", pa.string(), "broker the setting applies to (each broker keeps its own)", False),
        ("group", pa.string(), "consumer group", False),
        ("retry_max_times", pa.int32(), "failed deliveries before send-back goes to %DLQ%group (default 16)", False),
        ("retry_queue_nums", pa.int32(), "queues of %RETRY%group; 0 means failed messages are dropped", False),
        ("consume_enable", pa.bool_(), "the group may consume at all", False),
        ("consume_broadcast_enable", pa.bool_(), "the group may consume in broadcasting mode", False),
        ("consume_from_min_enable", pa.bool_(), "a new group may start from the queue's min offset", False),
        ("consume_message_orderly", pa.bool_(), "the group consumes orderly (informational)", False),
        ("updated_timestamp", pa.int64(), "time of the change, epoch ms, strictly increasing per group", False),
        (
            "retry_policy",
            pa.string(),
            "the retry backoff of RocketMQ 5 consumers (groupRetryPolicy): CUSTOMIZED or EXPONENTIAL; null: not "
            "set, RocketMQ's default (CUSTOMIZED with its default delays)",
        ),
        ("retry_next_ms", pa.list_(pa.int64()), "CUSTOMIZED: the delay before each retry, ms; null: the default"),
        ("retry_initial_ms", pa.int64(), "EXPONENTIAL: the first delay, ms; null: 5000"),
        ("retry_max_ms", pa.int64(), "EXPONENTIAL: the largest delay, ms; null: 7200000"),
        ("retry_multiplier", pa.int64(), "EXPONENTIAL: the factor from one delay to the next; null: 2"),
        ("deleted", pa.bool_(), "true: the group was deleted on the broker (deleteSubGroup); the row holds defaults"),
    ),
)

BROKERS = TableSpec(
    name="brokers",
    path="brokers",
    partition_by=(),
    meaning="one row per broker start: the broker's fixed store settings",
    columns=_cols(
        ("broker_name", pa.string(), "broker name, unique in the lake", False),
        ("store_host", pa.string(), "broker address as ip:port", False),
        ("segment_size", pa.int64(), "commit log segment size in bytes", False),
        ("flush_mode", pa.string(), "SYNC_FLUSH or ASYNC_FLUSH", False),
        ("started_timestamp", pa.int64(), "start time, epoch milliseconds", False),
        ("process", pa.string(), "pid@hostname of the broker process", False),
    ),
)

REPLAY_REPORT = TableSpec(
    name="replay_report",
    path="replay_report",
    partition_by=(),
    meaning="ordering report of a replay_ordered run: one row per (replay_id, run_id, source queue)",
    columns=_cols(
        ("replay_id", pa.string(), "name of the replay", False),
        ("run_id", pa.string(), "job_runs id of the run that wrote the report", False),
        ("broker_name", pa.string(), "broker holding the source queue", False),
        ("topic", pa.string(), "source topic", False),
        ("queue_id", pa.int32(), "source queue id", False),
        ("sink", pa.string(), "where the replay goes: table:<path>, topic:<topic> or handler:<module:function>", False),
        ("source_rows", pa.int64(), "source messages the report covers (the replay's range so far)", False),
        ("rows", pa.int64(), "messages the sink holds (or the handler accepted) for the queue", False),
        ("first_offset", pa.int64(), "smallest source queue offset replayed, null when none"),
        ("last_offset", pa.int64(), "largest source queue offset replayed, null when none"),
        ("gaps", pa.int64(), "source messages up to last_offset missing from the sink", False),
        ("duplicates", pa.int64(), "sink rows beyond the first of each source queue offset", False),
        ("order_preserved", pa.bool_(), "the replay order equals the source order (running hash)", False),
        ("complete", pa.bool_(), "every source message of the range is in the sink exactly once", False),
        ("report_timestamp", pa.int64(), "time of the report, epoch milliseconds", False),
    ),
)

QUEUE_HOURS = TableSpec(
    name="queue_hours",
    path="queue_hours",
    partition_by=(),
    meaning="records, bytes and the dispatched end offset of every queue per hour of store time, "
    "kept up to date from the commit log's new rows by the report",
    columns=_cols(
        ("broker_name", pa.string(), "broker holding the queue", False),
        ("topic", pa.string(), "topic of the queue", False),
        ("queue_id", pa.int32(), "queue id", False),
        ("hour", pa.int64(), "start of the UTC hour of store time, epoch milliseconds", False),
        ("messages", pa.int64(), "commit log records stored in the hour", False),
        ("bytes", pa.int64(), "sum of their store_size", False),
        ("end_offset", pa.int64(), "greatest queue offset dispatched in the hour plus one; null when none"),
        ("first_store_timestamp", pa.int64(), "earliest store time in the hour, epoch milliseconds", False),
        ("last_store_timestamp", pa.int64(), "latest store time in the hour, epoch milliseconds", False),
    ),
)

COMMIT_HOURS = TableSpec(
    name="commit_hours",
    path="commit_hours",
    partition_by=(),
    meaning="each group's latest offset commit of every queue per hour of commit time, kept up to date "
    "from consumer_offset_commits' new rows by the report",
    columns=_cols(
        ("group", pa.string(), "consumer group", False),
        ("broker_name", pa.string(), "broker holding the queue", False),
        ("topic", pa.string(), "topic of the queue", False),
        ("queue_id", pa.int32(), "queue id", False),
        ("hour", pa.int64(), "start of the UTC hour of commit time, epoch milliseconds", False),
        ("commit_timestamp", pa.int64(), "time of the hour's latest commit, epoch milliseconds", False),
        ("is_reset", pa.bool_(), "that commit is a reset (a reset wins a tie of commit times)", False),
        ("offset", pa.int64(), "its committed offset (the larger one wins a remaining tie)", False),
    ),
)

STORE_INGESTS = TableSpec(
    name="store_ingests",
    path="store_ingests",
    partition_by=(),
    meaning="one row per ingest-store run that moved a broker's ingested range of a RocketMQ store's "
    "commit log: where it read from, up to where, and the range lost before it was ingested",
    columns=_cols(
        ("broker_name", pa.string(), "the lake's name of the ingested broker", False),
        ("store_dir", pa.string(), "the store's root directory as given (storePathRootDir)", False),
        ("ingested_timestamp", pa.int64(), "time of the commit, epoch milliseconds", False),
        ("from_offset", pa.int64(), "physical offset the run read from (after a lost range)", False),
        ("end_offset", pa.int64(), "physical offset after the last record ingested: the next run's start", False),
        ("records", pa.int64(), "records ingested", False),
        ("bytes", pa.int64(), "their store sizes summed", False),
        ("lost_from", pa.int64(), "start of a range of the log no longer in the store when the run read it"),
        ("lost_to", pa.int64(), "end (exclusive) of that range"),
        ("stop", pa.string(), "END (no more data), TORN (an incomplete last record, read next run) or CORRUPT", False),
        ("commitlog_version", pa.int64(), "commitlog version of the run's commit", False),
        (
            "unread",
            _SIZE_MAP,
            "what the store held that no run reads: path under the store root (a directory ends with /) "
            "-> bytes; RocketMQ's own files the lake does not interpret, listed, not lost",
        ),
    ),
)

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        COMMITLOG,
        CONSUME_QUEUE,
        CONSUME_QUEUE_INTEGRITY,
        CONSUME_QUEUE_TAILS,
        CONSUMER_OFFSET_COMMITS,
        CONSUMER_OFFSETS,
        TRANSACTION_STATE,
        TRANSACTION_RECORDS,
        RETRY_RECORDS,
        RETRY_CHAINS,
        DLQ,
        DLQ_REDRIVES,
        REPLAY_PROGRESS,
        JOB_RUNS,
        TOPIC_CONFIG,
        SUBSCRIPTION_GROUP,
        BROKERS,
        REPLAY_REPORT,
        QUEUE_HOURS,
        COMMIT_HOURS,
        STORE_INGESTS,
    )
}


def table(name: str) -> TableSpec:
    """The spec of table ``name``.

    Raises:
        ValidationError: ``name`` is not a table of the catalog.
    """
    try:
        return TABLES[name]
    except KeyError:
        raise ValidationError("table", name, "no such table", f"use one of {sorted(TABLES)}") from None


def spark_schema(spec: TableSpec) -> StructType:
    """The Spark schema of ``spec``, derived from its Arrow schema (imports pyspark)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(spec.arrow_schema)
