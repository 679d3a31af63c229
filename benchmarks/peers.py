"""The DuckDB peers of ``benchmarks/run_all.py`` and ``benchmarks/consume_queue.py``: each job's
output tables computed from scratch by DuckDB SQL over the Parquet files of the inputs' active
Delta versions (file lists and partition values from the Delta log), timed, then compared with the
job's tables on every column (:mod:`compare`: multisets of rows, maps sorted, lists in order).

What each peer computes, and what it cannot compute faithfully (left out of the comparison, and
printed as such with every outcome):

- ``rebuild_consume_queue``: ``consume_queue`` (the dispatch rule, the Java hash of the tags, the
  delivery times of the schedule topic), ``consume_queue_integrity`` (every check and its detail
  text, but no CRC: DuckDB has no CRC-32, so CRC_MISMATCH findings are not compared) and
  ``consume_queue_tails``;
- ``consumer_offsets``: ``consumer_offsets``, every column;
- ``resolve_transactions``: ``transaction_state``, every column with the broker's default check
  settings; not ``transaction_records``, the job's extract of the log (an intermediate the peer
  reads the log for directly);
- ``route_dlq``: ``retry_chains`` and ``dlq``, every column; not ``retry_records`` (the extract);
- ``report``: ``queue_hours`` and ``commit_hours``, every column; not the HTML page and its plots.

``PERTURBED`` names the one value each peer changes when asked to (``--perturb-peer``), to show
that a peer that computed something else is caught.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import duckdb
import pyarrow as pa
from compare import PeerOutcome, TableCheck, compare, delta_relation
from deltalake import DeltaTable

from broker_model.broker import FILE_RESERVED_MS, REMOVE_TAG, TRANSACTION_CHECK_MAX, TRANSACTION_TIMEOUT_MS
from broker_model.common import constants as c
from broker_model.store import FIXED_RECORD_LENGTH, IPV6_HOST_EXTRA
from jobs.dlq.fold import host_prefixes
from jobs.hours import HOUR_MS
from schemas.catalog import (
    BROKERS,
    COMMIT_HOURS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUME_QUEUE_INTEGRITY,
    CONSUME_QUEUE_TAILS,
    CONSUMER_OFFSET_COMMITS,
    CONSUMER_OFFSETS,
    DLQ,
    DLQ_REDRIVES,
    QUEUE_HOURS,
    RETRY_CHAINS,
    RETRY_RECORDS,
    SUBSCRIPTION_GROUP,
    TOPIC_CONFIG,
    TRANSACTION_RECORDS,
    TRANSACTION_STATE,
    TableSpec,
)

PERTURBED = {
    "rebuild_consume_queue": (CONSUME_QUEUE, "store_size"),
    "consumer_offsets": (CONSUMER_OFFSETS, "broker_offset"),
    "resolve_transactions": (TRANSACTION_STATE, "as_of"),
    "route_dlq": (RETRY_CHAINS, "keys"),
    "report": (COMMIT_HOURS, "offset"),
}
"""Per job, the table and column of which ``--perturb-peer`` changes one value of the peer's
result (each one the former digests did not cover)."""

NO_CRC = "DuckDB has no CRC-32: the peer cannot check bodies against body_crc"


@dataclass(frozen=True)
class Output:
    """One table a peer computes: the job's table, where the peer wrote its rows, the key that
    pairs rows when they differ, and what the comparison leaves out (-> why)."""

    spec: TableSpec
    path: Path
    key: tuple[str, ...]
    skip_rows: Mapping[str, str] | None = None


def active_files(table_dir: Path, partition_by: Sequence[str]) -> pa.Table:
    """The active files of a Delta table: absolute ``location`` and its partition values (strings
    in the log's typed form, from the Delta log, not from directory names)."""
    actions = pa.table(DeltaTable(str(table_dir)).get_add_actions(flatten=True))
    columns = {"location": pa.array([f"{table_dir}/{unquote(p)}" for p in actions.column("path").to_pylist()])}
    columns |= {name: actions.column(f"partition.{name}") for name in partition_by}
    return pa.table(columns)


def listing(files: pa.Table) -> str:
    """A DuckDB list literal of the files' locations."""
    return "[" + ", ".join("'" + loc.replace("'", "''") + "'" for loc in files.column("location").to_pylist()) + "]"


def checked(
    lake: Path, seconds: float, outputs: Sequence[Output], perturb: tuple[TableSpec, str] | None
) -> PeerOutcome:
    """The peer's ``outputs`` compared with the job's tables of the same names in ``lake``."""
    con = _connect()
    checks: list[TableCheck] = []
    for output in outputs:
        job = delta_relation(con, f"job_{output.spec.name}", lake / output.spec.path)
        peer = f"read_parquet('{output.path}', hive_partitioning = false)"
        column = perturb[1] if perturb is not None and perturb[0] is output.spec else None
        checks.append(compare(con, output.spec, job, peer, output.key, skip_rows=output.skip_rows, perturb=column))
    return PeerOutcome(seconds, checks)


# ---------------------------------------------------------------------------------------------
# rebuild_consume_queue
# ---------------------------------------------------------------------------------------------

# Java String.hashCode over UTF-16 of the tags from code points: a code point above the BMP is the
# surrogate pair (hi, lo), i.e. two steps h*31+hi, h*31+lo, folded into h*961 + hi*31 + lo.
_JAVA_HASH = """
  (list_reduce(
     list_transform(string_split(tags, ''), lambda ch: unicode(ch)::BIGINT),
     lambda h, cp: CASE WHEN cp < 65536 THEN (h * 31 + cp) % 4294967296
                   ELSE (h * 961 + (55296 + ((cp - 65536) >> 10)) * 31 + (56320 + ((cp - 65536) & 1023)))
                        % 4294967296 END,
     0::BIGINT) + 2147483648) % 4294967296 - 2147483648
"""

_LOG = """
  SELECT f.broker_name, f.segment, p.* EXCLUDE (filename)
  FROM read_parquet($files, filename = true) p JOIN files f ON p.filename = f.location
"""

# the consume queue: one row per dispatched record; the tags code is the delivery time on the
# schedule topic (DELAY parsed as the broker parses a stored record), else the tags' Java hash
UNITS_SQL = f"""
COPY (
  WITH log AS ({_LOG}),
  codes AS (SELECT tags, {_JAVA_HASH} AS tags_hash FROM (SELECT DISTINCT tags FROM log WHERE length(tags) > 0)),
  delayed AS (
    SELECT *, CASE WHEN topic = '$schedule' THEN
             regexp_extract_all(decode(raw_properties), '(?:^|\x02)$delay\x01([^\x02]+)', 1)[-1] END AS delay_text
    FROM log WHERE (sys_flag & $type_mask) IN (0, $commit_type)),
  parsed AS (
    SELECT *, CASE WHEN regexp_full_match(delay_text, '[+-]?[0-9]+') THEN TRY_CAST(delay_text AS INTEGER) END AS delay
    FROM delayed),
  leveled AS (SELECT *, CASE WHEN delay > $max_level THEN $max_level ELSE delay END AS level FROM parsed)
  SELECT l.broker_name, l.topic, l.queue_id, l.queue_offset, l.commit_log_offset, l.store_size,
         CASE WHEN l.level > 0 THEN l.store_timestamp + $delay_millis[l.level] ELSE coalesce(k.tags_hash, 0) END
           AS tags_code,
         l.store_timestamp
  FROM leveled l LEFT JOIN codes k ON l.tags = k.tags
) TO '$out' (FORMAT parquet, PARTITION_BY (topic), WRITE_PARTITION_COLUMNS true, OVERWRITE_OR_IGNORE)
"""

# the integrity findings, each check of rebuild_consume_queue a branch with its detail text
# (the CRC check excepted), and the tails of every queue and broker log
CHECKS_SQL = """
CREATE OR REPLACE TEMP TABLE sized AS
WITH log AS (
  SELECT f.broker_name, f.segment, p.commit_log_offset, p.store_size, p.magic_code, p.sys_flag, p.topic,
         p.queue_id, p.queue_offset, octet_length(p.body) AS body_bytes,
         octet_length(p.raw_properties) AS property_bytes
  FROM read_parquet($files, filename = true) p JOIN files f ON p.filename = f.location)
SELECT l.*, coalesce(s.segment_size, $default_segment)::BIGINT AS segment_size,
       $fixed::BIGINT + body_bytes + strlen(topic) + property_bytes
         + CASE WHEN sys_flag & $born_v6 <> 0 THEN $v6_extra ELSE 0 END
         + CASE WHEN sys_flag & $store_v6 <> 0 THEN $v6_extra ELSE 0 END
         + CASE magic_code WHEN $magic_v1 THEN 0 WHEN $magic_v2 THEN 1 END AS computed_size
FROM log l LEFT JOIN segment_sizes s USING (broker_name);
COPY (
  WITH queued AS (
    SELECT broker_name, topic, queue_id, queue_offset, commit_log_offset,
           lag(queue_offset) OVER q AS prior_offset, lag(commit_log_offset) OVER q AS prior_log_offset
    FROM sized WHERE (sys_flag & $type_mask) IN (0, $commit_type)
    WINDOW q AS (PARTITION BY topic, broker_name, queue_id ORDER BY queue_offset, commit_log_offset)),
  chained AS (
    SELECT *, lead(commit_log_offset) OVER b AS next_offset, lead(store_size) OVER b AS next_size,
           commit_log_offset - commit_log_offset % segment_size + segment_size AS segment_end,
           commit_log_offset + store_size AS record_end
    FROM sized WINDOW b AS (PARTITION BY broker_name ORDER BY commit_log_offset, store_size)),
  record AS (SELECT *, NULL::VARCHAR AS no_topic, NULL::INTEGER AS no_queue, NULL::BIGINT AS no_offset,
                    commit_log_offset - commit_log_offset % segment_size AS base,
                    commit_log_offset + store_size AS record_end FROM sized),
  findings AS (
    SELECT broker_name, no_topic AS topic, no_queue AS queue_id, no_offset AS queue_offset, commit_log_offset,
           'SIZE_MISMATCH' AS problem,
           printf('magic_code %d is neither v1 ($magic_v1) nor v2 ($magic_v2): the record length cannot be checked',
                  magic_code) AS detail
    FROM record WHERE computed_size IS NULL
    UNION ALL
    SELECT broker_name, no_topic, no_queue, no_offset, commit_log_offset, 'SIZE_MISMATCH',
           printf('store_size %d, but RocketMQ''s length of this body, topic and properties is %d',
                  store_size, computed_size)
    FROM record WHERE computed_size <> store_size
    UNION ALL
    SELECT broker_name, no_topic, no_queue, no_offset, commit_log_offset, 'BEYOND_SEGMENT',
           printf('segment %d, but offset %d lies in the segment at %d (segments of %d bytes)',
                  segment, commit_log_offset, base, segment_size)
    FROM record WHERE segment <> base
    UNION ALL
    SELECT broker_name, no_topic, no_queue, no_offset, commit_log_offset, 'BEYOND_SEGMENT',
           printf('the record ends at %d, leaving less than the 8-byte blank before the end of segment %d at %d',
                  record_end, segment, segment + segment_size)
    FROM record WHERE record_end + $blank > segment + segment_size
    UNION ALL
    SELECT broker_name, NULL, NULL, NULL, commit_log_offset, 'SIZE_MISMATCH',
           CASE WHEN next_offset = segment_end THEN
                  printf('the next record starts the next segment at %d though %d bytes fitted after the end of '
                         || 'this one at %d', segment_end, next_size, record_end)
                ELSE printf('the next record starts at %d, not at %d (offset %d + store_size %d)',
                            next_offset, record_end, commit_log_offset, store_size) END
    FROM chained
    WHERE next_offset IS NOT NULL
      AND NOT (next_offset = record_end
               OR (next_offset = segment_end AND record_end + next_size + $blank > segment_end))
    UNION ALL
    SELECT broker_name, topic, queue_id, queue_offset, commit_log_offset, 'GAP',
           printf('the queue starts at queue offset %d: offsets 0..%d are missing', queue_offset, queue_offset - 1)
    FROM queued WHERE prior_offset IS NULL AND queue_offset <> 0
    UNION ALL
    SELECT broker_name, topic, queue_id, queue_offset, commit_log_offset, 'GAP',
           printf('queue offsets %d..%d are missing', prior_offset + 1, queue_offset - 1)
    FROM queued WHERE queue_offset > prior_offset + 1
    UNION ALL
    SELECT broker_name, topic, queue_id, queue_offset, commit_log_offset, 'DUPLICATE_QUEUE_OFFSET',
           printf('queue offset %d is also held by commit log offset %d', queue_offset, prior_log_offset)
    FROM queued WHERE queue_offset = prior_offset
    UNION ALL
    SELECT broker_name, topic, queue_id, queue_offset, commit_log_offset, 'NON_MONOTONIC_OFFSET',
           printf('commit log offset %d is not above %d, the one of queue offset %d',
                  commit_log_offset, prior_log_offset, prior_offset)
    FROM queued WHERE queue_offset > prior_offset AND commit_log_offset <= prior_log_offset)
  SELECT *, $version::BIGINT AS commitlog_version FROM findings
) TO '$findings' (FORMAT parquet);
COPY (
  SELECT 'QUEUE' AS kind, broker_name, topic, queue_id, last.o AS queue_offset, NULL::BIGINT AS segment,
         last.c AS commit_log_offset, NULL::INTEGER AS store_size, $version::BIGINT AS commitlog_version
  FROM (SELECT broker_name, topic, queue_id, max({'o': queue_offset, 'c': commit_log_offset}) AS last
        FROM sized WHERE (sys_flag & $type_mask) IN (0, $commit_type) GROUP BY ALL)
  UNION ALL
  SELECT 'LOG', broker_name, NULL, NULL, NULL, last.s, last.c, last.z, $version::BIGINT
  FROM (SELECT broker_name, max({'c': commit_log_offset, 'z': store_size, 's': segment}) AS last
        FROM sized GROUP BY broker_name)
) TO '$tails' (FORMAT parquet)
"""


@dataclass(frozen=True)
class ConsumeQueuePeer:
    """The consume queue peer's outcome, and the seconds of its two parts: the consume queue, then
    the integrity checks with the tails."""

    outcome: PeerOutcome
    units_seconds: float
    checks_seconds: float


def time_consume_queue_peer(lake: Path, out: Path, perturb: bool = False) -> ConsumeQueuePeer:
    """``rebuild_consume_queue`` as two DuckDB statements (the consume queue; the findings and the
    tails), timed apart, then compared with the job's three tables."""
    out.mkdir(parents=True, exist_ok=True)
    con = _connect()
    table = DeltaTable(str(lake / COMMITLOG.path))
    files = active_files(lake / COMMITLOG.path, COMMITLOG.partition_by)
    con.register("files", files)
    con.register("segment_sizes", segment_sizes(lake))
    substitutions = {
        "$files": listing(files),
        "$schedule": c.SCHEDULE_TOPIC,
        "$delay_millis": "[" + ", ".join(str(ms) for ms in c.DELAY_LEVEL_MILLIS) + "]",
        "$delay": c.PROPERTY_DELAY_TIME_LEVEL,
        "$max_level": str(c.MAX_DELAY_LEVEL),
        "$type_mask": str(c.TRANSACTION_ROLLBACK_TYPE),
        "$commit_type": str(c.TRANSACTION_COMMIT_TYPE),
        "$default_segment": str(c.DEFAULT_SEGMENT_SIZE),
        "$fixed": str(FIXED_RECORD_LENGTH),
        "$born_v6": str(c.BORNHOST_V6_FLAG),
        "$store_v6": str(c.STOREHOSTADDRESS_V6_FLAG),
        "$v6_extra": str(IPV6_HOST_EXTRA),
        "$magic_v1": str(c.MAGIC_CODE_V1),
        "$magic_v2": str(c.MAGIC_CODE_V2),
        "$blank": str(c.END_FILE_MIN_BLANK_LENGTH),
        "$version": str(table.version()),
        "$out": str(out / "consume_queue"),
        "$findings": str(out / "findings.parquet"),
        "$tails": str(out / "tails.parquet"),
    }
    started = time.perf_counter()
    con.execute(_substituted(UNITS_SQL, substitutions))
    units_seconds = time.perf_counter() - started
    started = time.perf_counter()
    con.execute(_substituted(CHECKS_SQL, substitutions))
    checks_seconds = time.perf_counter() - started
    outputs = [
        Output(
            CONSUME_QUEUE,
            out / "consume_queue" / "**" / "*.parquet",
            ("broker_name", "topic", "queue_id", "queue_offset", "commit_log_offset"),
        ),
        Output(
            CONSUME_QUEUE_INTEGRITY,
            out / "findings.parquet",
            ("broker_name", "commit_log_offset", "problem", "detail"),
            {"problem = 'CRC_MISMATCH'": NO_CRC},
        ),
        Output(CONSUME_QUEUE_TAILS, out / "tails.parquet", ("kind", "broker_name", "topic", "queue_id")),
    ]
    perturbed = PERTURBED["rebuild_consume_queue"] if perturb else None
    outcome = checked(lake, units_seconds + checks_seconds, outputs, perturbed)
    return ConsumeQueuePeer(outcome, units_seconds, checks_seconds)


def segment_sizes(lake: Path) -> pa.Table:
    """``(broker_name, segment_size)`` of each broker's latest ``brokers`` row (by start time, then
    size), as the job takes them."""
    rows = DeltaTable(str(lake / BROKERS.path)).to_pyarrow_table(
        columns=["broker_name", "started_timestamp", "segment_size"]
    )
    latest: dict[str, tuple[int, int]] = {}
    for r in rows.to_pylist():
        row = (r["started_timestamp"], r["segment_size"])
        latest[r["broker_name"]] = max(latest.get(r["broker_name"], row), row)
    return pa.table(
        {
            "broker_name": pa.array(list(latest), pa.string()),
            "segment_size": pa.array([size for _, size in latest.values()], pa.int64()),
        }
    )


# ---------------------------------------------------------------------------------------------
# consumer_offsets
# ---------------------------------------------------------------------------------------------


OFFSETS_SQL = """
COPY (
  WITH cq AS (
    SELECT f.topic, p.broker_name, p.queue_id, p.queue_offset, p.store_timestamp
    FROM read_parquet($cq_files, filename = true) p JOIN cq_files f ON p.filename = f.location
    WHERE p.store_timestamp <= $as_of),
  cur AS (
    SELECT "group", broker_name, topic, queue_id, "offset" AS consumer_offset
    FROM read_parquet($commit_files) WHERE commit_timestamp <= $as_of
    QUALIFY row_number() OVER (PARTITION BY "group", broker_name, topic, queue_id
      ORDER BY commit_timestamp DESC, (source = 'reset') DESC, "offset" DESC, source DESC) = 1),
  held AS (
    SELECT broker_name, topic, queue_id, min(queue_offset) AS broker_min_offset,
           max(queue_offset) + 1 AS broker_offset
    FROM cq GROUP BY broker_name, topic, queue_id),
  configured AS (
    SELECT broker_name, topic, unnest(range(arg_max(queue_nums, (updated_timestamp, queue_nums)))) AS queue_id
    FROM read_parquet($config_files) WHERE updated_timestamp <= $as_of GROUP BY broker_name, topic),
  bounds AS (
    SELECT * FROM held UNION ALL
    SELECT broker_name, topic, queue_id, 0, 0 FROM configured
    WHERE (broker_name, topic, queue_id) NOT IN (SELECT (broker_name, topic, queue_id) FROM held)),
  listed AS (
    SELECT DISTINCT c."group", b.broker_name, b.topic, b.queue_id FROM cur c JOIN bounds b ON c.topic = b.topic
    UNION SELECT DISTINCT c."group", h.broker_name, h.topic, h.queue_id FROM cur c JOIN held h
      ON h.topic = '%RETRY%' || c."group"),
  keyed AS (
    SELECT coalesce(c."group", l."group") AS "group", coalesce(c.broker_name, l.broker_name) AS broker_name,
           coalesce(c.topic, l.topic) AS topic, coalesce(c.queue_id, l.queue_id) AS queue_id, c.consumer_offset
    FROM cur c FULL JOIN listed l
      ON c."group" = l."group" AND c.broker_name = l.broker_name AND c.topic = l.topic AND c.queue_id = l.queue_id),
  queued AS (
    SELECT k.*, b.broker_min_offset, b.broker_offset, coalesce(k.consumer_offset, 0) AS counted
    FROM keyed k LEFT JOIN bounds b ON k.broker_name = b.broker_name AND k.topic = b.topic AND k.queue_id = b.queue_id),
  last AS (
    SELECT q."group", q.broker_name, q.topic, q.queue_id, min(e.store_timestamp) AS last_timestamp
    FROM queued q JOIN cq e ON e.broker_name = q.broker_name AND e.topic = q.topic AND e.queue_id = q.queue_id
      AND e.queue_offset = q.consumer_offset - 1
    GROUP BY q."group", q.broker_name, q.topic, q.queue_id),
  oldest AS (
    SELECT q."group", q.broker_name, q.topic, q.queue_id, min(e.store_timestamp) AS oldest_unconsumed_timestamp
    FROM queued q JOIN cq e ON e.broker_name = q.broker_name AND e.topic = q.topic AND e.queue_id = q.queue_id
      AND e.queue_offset = greatest(q.counted, q.broker_min_offset)
    WHERE q.counted < q.broker_offset
    GROUP BY q."group", q.broker_name, q.topic, q.queue_id)
  SELECT q."group", q.broker_name, q.topic, q.queue_id, q.consumer_offset, q.broker_min_offset, q.broker_offset,
         q.broker_offset - q.counted AS diff, l.last_timestamp, o.oldest_unconsumed_timestamp,
         $as_of::BIGINT AS as_of, CASE WHEN q.broker_offset IS NULL THEN 'QUEUE_NOT_FOUND' END AS anomaly
  FROM queued q
  LEFT JOIN last l USING ("group", broker_name, topic, queue_id)
  LEFT JOIN oldest o USING ("group", broker_name, topic, queue_id)
) TO '$out' (FORMAT parquet)
"""


def time_offsets_peer(lake: Path, out: Path, as_of: int, perturb: bool = False) -> PeerOutcome:
    """``consumer_offsets`` as one DuckDB query, timed, then compared with the job's table."""
    out.parent.mkdir(parents=True, exist_ok=True)
    con = _connect()
    cq_files = active_files(lake / CONSUME_QUEUE.path, CONSUME_QUEUE.partition_by)
    commit_files = active_files(lake / CONSUMER_OFFSET_COMMITS.path, ())
    config_files = active_files(lake / TOPIC_CONFIG.path, ())
    con.register("cq_files", cq_files)
    sql = (
        OFFSETS_SQL.replace("$cq_files", listing(cq_files))
        .replace("$commit_files", listing(commit_files))
        .replace("$config_files", listing(config_files))
        .replace("$as_of", str(as_of))
        .replace("$out", str(out))
    )
    started = time.perf_counter()
    con.execute(sql)
    seconds = time.perf_counter() - started
    outputs = [Output(CONSUMER_OFFSETS, out, ("group", "broker_name", "topic", "queue_id"))]
    return checked(lake, seconds, outputs, PERTURBED["consumer_offsets"] if perturb else None)


# ``route_dlq``: the send-back records of the log, one chain per (group, origin), each with its
# original record (the origin id's host prefix and offset), its group's retry limit and the consumer
# offset of its latest record's retry queue as of T; then the dead letters. $-names are substituted.
ROUTE_RECORDS_SQL = """
CREATE OR REPLACE TEMP TABLE chained AS
WITH rec AS (
  SELECT CASE WHEN p.topic = '$schedule' AND starts_with(p.properties['REAL_TOPIC'], '%RETRY%') THEN 'SCHEDULED'
              WHEN starts_with(p.topic, '%RETRY%') THEN 'RETRY'
              WHEN starts_with(p.topic, '%DLQ%') THEN 'DLQ' END AS kind,
         regexp_replace(CASE WHEN p.topic = '$schedule' THEN p.properties['REAL_TOPIC'] ELSE p.topic END,
                        '^%(RETRY|DLQ)%', '') AS "group",
         f.broker_name, p.topic, p.queue_id, p.queue_offset, p.commit_log_offset, p.msg_id, p.uniq_key, p.keys,
         nullif(trim(p.properties['ORIGIN_MESSAGE_ID']), '') AS origin_msg_id,
         nullif(trim(p.properties['RETRY_TOPIC']), '') AS origin_topic,
         p.reconsume_times, p.store_timestamp,
         CASE WHEN starts_with(p.topic, '%DLQ%') THEN p.properties['DLQ_ROUTED_BY'] END AS routed_by,
         p.body, p.properties
  FROM read_parquet($log_files, filename = true) p JOIN log_files f ON p.filename = f.location
  WHERE p.topic = '$schedule' OR starts_with(p.topic, '%RETRY%') OR starts_with(p.topic, '%DLQ%'))
SELECT *, coalesce(origin_msg_id, uniq_key, msg_id) AS origin FROM rec
WHERE kind IS NOT NULL AND store_timestamp <= $as_of
"""
ROUTE_CHAINS_SQL = """
CREATE OR REPLACE TEMP TABLE chains AS
WITH agg AS (
  SELECT "group", origin AS origin_msg_id,
         arg_max({'kind': kind, 'broker_name': broker_name, 'topic': topic, 'queue_id': queue_id,
                  'queue_offset': queue_offset, 'reconsume_times': reconsume_times,
                  'store_timestamp': store_timestamp},
                 {'r': reconsume_times, 'k': CASE kind WHEN 'SCHEDULED' THEN 0 WHEN 'RETRY' THEN 1 ELSE 2 END,
                  's': store_timestamp, 'o': commit_log_offset}) AS latest,
         min(uniq_key) AS uniq_key, min(keys) AS keys, min(origin_topic) AS origin_topic,
         arg_min(broker_name, commit_log_offset) AS broker_name,
         list({'broker_name': broker_name, 'topic': topic, 'commit_log_offset': commit_log_offset,
               'reconsume_times': reconsume_times, 'store_timestamp': store_timestamp}
              ORDER BY reconsume_times, store_timestamp, commit_log_offset) FILTER (WHERE kind = 'RETRY') AS retries,
         min(store_timestamp) AS first_failure_timestamp
  FROM chained GROUP BY "group", origin),
decoded AS (
  SELECT a."group", a.origin_msg_id, h.broker_name AS origin_broker,
         TRY_CAST('0x' || right(a.origin_msg_id, 16) AS BIGINT) AS origin_offset
  FROM agg a JOIN hosts h
    ON length(a.origin_msg_id) > 16 AND left(a.origin_msg_id, length(a.origin_msg_id) - 16) = h.host_prefix),
origins AS (
  SELECT d."group", d.origin_msg_id,
         {'broker_name': f.broker_name, 'topic': p.topic, 'commit_log_offset': p.commit_log_offset,
          'reconsume_times': 0, 'store_timestamp': p.store_timestamp} AS origin
  FROM decoded d
  JOIN read_parquet($log_files, filename = true) p ON p.commit_log_offset = d.origin_offset
  JOIN log_files f ON p.filename = f.location AND f.broker_name = d.origin_broker),
pol AS (
  SELECT broker_name, "group", arg_max(retry_max_times, updated_timestamp) AS retry_max_times
  FROM read_parquet($subscription_files) WHERE updated_timestamp <= $as_of GROUP BY broker_name, "group"),
cur AS (
  SELECT "group", broker_name, topic, queue_id, "offset" AS consumer_offset
  FROM read_parquet($commit_files) WHERE commit_timestamp <= $as_of AND starts_with(topic, '%RETRY%')
  QUALIFY row_number() OVER (PARTITION BY "group", broker_name, topic, queue_id
    ORDER BY commit_timestamp DESC, (source = 'reset') DESC, "offset" DESC, source DESC) = 1),
stated AS (
  SELECT a."group", a.origin_msg_id, a.uniq_key, a.keys, a.origin_topic, a.broker_name,
         CASE WHEN o.origin IS NULL THEN coalesce(a.retries, [])
              ELSE list_prepend(o.origin, coalesce(a.retries, [])) END AS attempts,
         a.latest.reconsume_times AS last_reconsume_times, a.first_failure_timestamp,
         a.latest.store_timestamp AS last_timestamp,
         CASE a.latest.kind WHEN 'DLQ' THEN 'DEAD' WHEN 'SCHEDULED' THEN 'SCHEDULED'
              ELSE CASE WHEN coalesce(cur.consumer_offset > a.latest.queue_offset, false) THEN 'CONSUMED'
                        ELSE 'DELIVERED' END END AS state,
         coalesce(pol.retry_max_times, $max_times) AS max_reconsume_times
  FROM agg a
  LEFT JOIN origins o ON o."group" = a."group" AND o.origin_msg_id = a.origin_msg_id
  LEFT JOIN pol ON pol.broker_name = a.broker_name AND pol."group" = a."group"
  LEFT JOIN cur ON cur."group" = a."group" AND cur.broker_name = a.broker_name
    AND cur.topic = a.latest.topic AND cur.queue_id = a.latest.queue_id)
SELECT *, state IN ('SCHEDULED', 'DELIVERED') AND last_reconsume_times >= max_reconsume_times AS exhausted,
       $as_of::BIGINT AS as_of
FROM stated
"""
ROUTE_DLQ_SQL = """
COPY (
  WITH dead AS (
    SELECT c."group", c.broker_name, c.msg_id, c.uniq_key, c.origin AS origin_msg_id, c.origin_topic,
           c.reconsume_times, ch.first_failure_timestamp, c.store_timestamp AS dlq_timestamp, c.body, c.properties,
           ch.attempts,
           CASE WHEN c.routed_by IS NOT NULL THEN 'POLICY'
                WHEN c.reconsume_times - 1 >= coalesce(ch.max_reconsume_times, $max_times) THEN 'MAX_RECONSUME_TIMES'
                ELSE 'CONSUMER_REQUESTED' END AS reason
    FROM chained c LEFT JOIN chains ch ON ch."group" = c."group" AND ch.origin_msg_id = c.origin
    WHERE c.kind = 'DLQ'),
  pending AS (
    SELECT c."group", c.broker_name, c.msg_id, c.uniq_key, c.origin AS origin_msg_id, c.origin_topic,
           c.reconsume_times, ch.first_failure_timestamp, NULL::BIGINT AS dlq_timestamp, c.body, c.properties,
           ch.attempts, 'POLICY_NOT_WRITTEN' AS reason
    FROM chained c JOIN chains ch ON ch."group" = c."group" AND ch.origin_msg_id = c.origin
    WHERE c.kind = 'RETRY' AND ch.exhausted AND ch.state = 'DELIVERED'
    QUALIFY row_number() OVER (PARTITION BY c."group", c.origin
      ORDER BY c.reconsume_times DESC, c.store_timestamp DESC, c.commit_log_offset DESC) = 1),
  redrives AS (
    SELECT broker_name, msg_id,
           arg_max(concat_ws(' ', state, request_id), {'u': updated_timestamp, 's': state, 'r': request_id})
             AS redrive_state
    FROM $redrives GROUP BY broker_name, msg_id)
  SELECT r.*, d.redrive_state
  FROM (SELECT * FROM dead UNION ALL SELECT * FROM pending) r
  LEFT JOIN redrives d ON d.broker_name = r.broker_name AND d.msg_id = r.msg_id
) TO '$dlq_out' (FORMAT parquet)
"""


def time_route_peer(lake: Path, out: Path, as_of: int, perturb: bool = False) -> PeerOutcome:
    """``route_dlq`` (``retry_chains`` and ``dlq``) as DuckDB SQL, timed, then compared with the
    job's tables."""
    out.mkdir(parents=True, exist_ok=True)
    con = _connect()
    log_files = active_files(lake / COMMITLOG.path, COMMITLOG.partition_by)
    con.register("log_files", log_files)
    brokers = DeltaTable(str(lake / BROKERS.path)).to_pyarrow_table().to_pylist()
    latest = {r["broker_name"]: r for r in sorted(brokers, key=lambda r: r["started_timestamp"])}
    prefixes = host_prefixes((name, row["store_host"]) for name, row in latest.items())
    rows = [(prefix, broker) for prefix, names in prefixes.items() for broker in names]
    con.register("hosts", pa.table({"host_prefix": [p for p, _ in rows], "broker_name": [b for _, b in rows]}))
    redrives = lake / DLQ_REDRIVES.path
    substitutions = {
        "$log_files": listing(log_files),
        "$subscription_files": listing(active_files(lake / SUBSCRIPTION_GROUP.path, ())),
        "$commit_files": listing(active_files(lake / CONSUMER_OFFSET_COMMITS.path, ())),
        "$redrives": f"read_parquet({listing(active_files(redrives, ()))})"
        if DeltaTable.is_deltatable(str(redrives))
        else "(SELECT NULL::VARCHAR AS broker_name, NULL::VARCHAR AS msg_id, NULL::VARCHAR AS state, "
        "NULL::VARCHAR AS request_id, NULL::BIGINT AS updated_timestamp WHERE false)",
        "$schedule": c.SCHEDULE_TOPIC,
        "$max_times": str(c.RETRY_MAX_TIMES),
        "$as_of": str(as_of),
        "$dlq_out": str(out / "dlq.parquet"),
    }
    statements = [ROUTE_RECORDS_SQL, ROUTE_CHAINS_SQL, f"COPY chains TO '{out / 'chains.parquet'}' (FORMAT parquet)"]
    statements.append(ROUTE_DLQ_SQL)
    started = time.perf_counter()
    for statement in statements:
        con.execute(_substituted(statement, substitutions))
    seconds = time.perf_counter() - started
    outputs = [
        Output(RETRY_CHAINS, out / "chains.parquet", ("group", "origin_msg_id")),
        Output(DLQ, out / "dlq.parquet", ("group", "broker_name", "msg_id")),
    ]
    outcome = checked(lake, seconds, outputs, PERTURBED["route_dlq"] if perturb else None)
    outcome.not_computed[RETRY_RECORDS.name] = "the job's extract of the log; the peer reads the log for it directly"
    return outcome


# ``resolve_transactions``: the half, op, final and discard records of the log, each original half
# record's transaction with its copies, first op, finals and discard, its state as of T by the
# broker's check settings, and the ops that name no half record. $-names are substituted.
RESOLVE_RECORDS_SQL = """
CREATE OR REPLACE TEMP TABLE rec AS
WITH kinded AS (
  SELECT CASE WHEN p.topic = '$half_topic' AND (p.sys_flag & 12) = 0 THEN 'HALF'
              WHEN p.topic = '$op_topic' THEN 'OP'
              WHEN p.topic = '$discard_topic' THEN 'DISCARD'
              WHEN (p.sys_flag & 12) = 8 AND NOT (starts_with(p.topic, '%RETRY%') OR starts_with(p.topic, '%DLQ%')
                   OR p.topic = '$schedule') THEN 'FINAL' END AS kind,
         f.broker_name, p.queue_id, p.queue_offset, p.commit_log_offset, p.born_timestamp, p.store_timestamp,
         p.tags, p.body, p.uniq_key, p.prepared_transaction_offset, p.properties
  FROM read_parquet($log_files, filename = true) p JOIN log_files f ON p.filename = f.location
  WHERE (p.topic IN ('$half_topic', '$op_topic', '$discard_topic') OR (p.sys_flag & 12) = 8)
    AND p.store_timestamp <= $as_of)
SELECT kind, broker_name, queue_id, queue_offset, commit_log_offset, born_timestamp, store_timestamp, tags, body,
       uniq_key, prepared_transaction_offset,
       properties['$p_group'] AS producer_group,
       properties['$p_real_topic'] AS real_topic,
       TRY_CAST(properties['$p_real_qid'] AS INTEGER) AS real_queue_id,
       TRY_CAST(properties['$p_check_times'] AS INTEGER) AS check_times,
       TRY_CAST(properties['$p_prepared'] AS BIGINT) AS prepared_queue_offset,
       properties['$p_immunity'] IS NOT NULL AS has_check_immunity,
       TRY_CAST(properties['$p_immunity'] AS BIGINT) AS immunity_s
FROM kinded WHERE kind IS NOT NULL
"""
RESOLVE_STATE_SQL = """
COPY (
  WITH halves AS (
    SELECT *, min(commit_log_offset) OVER (PARTITION BY broker_name, producer_group, uniq_key,
                CASE WHEN uniq_key IS NULL THEN commit_log_offset END) AS half_commit_log_offset
    FROM rec WHERE kind = 'HALF'),
  members AS (
    SELECT broker_name, queue_id, queue_offset AS half_queue_offset, half_commit_log_offset,
           commit_log_offset <> half_commit_log_offset AS is_copy
    FROM halves),
  removing AS (
    SELECT broker_name, queue_id, queue_offset AS op_queue_offset,
           coalesce(TRY_CAST(entry AS BIGINT), -1) AS half_queue_offset
    FROM (SELECT *, unnest(list_filter(string_split(decode(body), ','), lambda e: e <> '')) AS entry
          FROM rec WHERE kind = 'OP' AND coalesce(tags = '$remove_tag', false))),
  copies AS (
    SELECT broker_name, half_commit_log_offset, coalesce(max(check_times), 0) AS check_times,
           bool_or(commit_log_offset <> half_commit_log_offset AND check_times IS NULL
                   AND prepared_queue_offset IS NULL) AS has_duplicate
    FROM halves GROUP BY ALL),
  first_ops AS (
    SELECT m.broker_name, m.half_commit_log_offset,
           min({'o': r.op_queue_offset, 'c': m.is_copy}) AS op
    FROM removing r JOIN members m USING (broker_name, queue_id, half_queue_offset)
    GROUP BY m.broker_name, m.half_commit_log_offset),
  finals AS (
    SELECT h.broker_name, h.half_commit_log_offset, min(r.commit_log_offset) AS final_commit_log_offset,
           count(*) AS final_count
    FROM rec r JOIN halves h ON r.kind = 'FINAL' AND h.broker_name = r.broker_name
      AND h.commit_log_offset = r.prepared_transaction_offset
    GROUP BY h.broker_name, h.half_commit_log_offset),
  originals AS (SELECT * FROM halves WHERE commit_log_offset = half_commit_log_offset),
  discarded AS (
    SELECT DISTINCT o.broker_name, o.half_commit_log_offset
    FROM rec r JOIN originals o ON r.kind = 'DISCARD' AND o.broker_name = r.broker_name
      AND o.producer_group = r.producer_group AND o.uniq_key = r.uniq_key),
  resolved AS (
    SELECT o.broker_name, o.producer_group, o.uniq_key, o.queue_offset AS half_queue_offset,
           o.half_commit_log_offset, o.real_topic, o.real_queue_id, cp.check_times, fo.op.o AS op_queue_offset,
           fo.op.c AS op_on_copy, fi.final_commit_log_offset, fi.final_count, o.born_timestamp,
           cp.has_duplicate, d.half_commit_log_offset IS NOT NULL AS has_discard, o.has_check_immunity,
           CASE WHEN o.immunity_s <> -1 THEN TRY_CAST(o.immunity_s::HUGEINT * 1000 AS BIGINT) END AS immunity_ms,
           $as_of::BIGINT - o.born_timestamp AS age
    FROM originals o
    LEFT JOIN copies cp USING (broker_name, half_commit_log_offset)
    LEFT JOIN first_ops fo USING (broker_name, half_commit_log_offset)
    LEFT JOIN finals fi USING (broker_name, half_commit_log_offset)
    LEFT JOIN discarded d USING (broker_name, half_commit_log_offset)),
  orphans AS (
    SELECT r.broker_name, r.half_queue_offset, min(r.op_queue_offset) AS op_queue_offset
    FROM removing r ANTI JOIN members m USING (broker_name, queue_id, half_queue_offset)
    GROUP BY r.broker_name, r.half_queue_offset)
  SELECT broker_name, producer_group, uniq_key, half_queue_offset, half_commit_log_offset, real_topic,
         real_queue_id,
         CASE WHEN op_queue_offset IS NOT NULL AND final_count IS NOT NULL THEN 'COMMITTED'
              WHEN op_queue_offset IS NOT NULL THEN 'ROLLED_BACK'
              WHEN has_discard OR check_times >= $check_max THEN 'DISCARDED'
              WHEN age > $reserve_ms THEN 'EXPIRED'
              WHEN (has_check_immunity AND age < coalesce(immunity_ms, $timeout_ms))
                OR (NOT has_check_immunity AND age >= 0 AND age < $timeout_ms) THEN 'PENDING'
              ELSE 'CHECK_DUE' END AS state,
         check_times, op_queue_offset, final_commit_log_offset, born_timestamp, $as_of::BIGINT AS as_of,
         nullif(concat_ws(',',
           CASE WHEN final_count IS NOT NULL AND op_queue_offset IS NULL THEN 'FINAL_WITHOUT_OP' END,
           CASE WHEN final_count >= 2 THEN 'DOUBLE_COMMIT' END,
           CASE WHEN op_on_copy THEN 'OP_ON_REPUT_COPY' END,
           CASE WHEN has_duplicate THEN 'DUPLICATE_HALF' END), '') AS anomaly
  FROM resolved
  UNION ALL
  SELECT broker_name, NULL, NULL, half_queue_offset, -1, NULL, NULL, 'ROLLED_BACK', NULL, op_queue_offset, NULL,
         NULL, $as_of::BIGINT, 'OP_WITHOUT_HALF'
  FROM orphans
) TO '$out' (FORMAT parquet)
"""


def time_resolve_peer(lake: Path, out: Path, as_of: int, perturb: bool = False) -> PeerOutcome:
    """``resolve_transactions`` (``transaction_state``, the broker's default check settings) as
    DuckDB SQL, timed, then compared with the job's table."""
    out.parent.mkdir(parents=True, exist_ok=True)
    con = _connect()
    log_files = active_files(lake / COMMITLOG.path, COMMITLOG.partition_by)
    con.register("log_files", log_files)
    substitutions = {
        "$log_files": listing(log_files),
        "$half_topic": c.RMQ_SYS_TRANS_HALF_TOPIC,
        "$op_topic": c.RMQ_SYS_TRANS_OP_HALF_TOPIC,
        "$discard_topic": c.TRANS_CHECK_MAX_TIME_TOPIC,
        "$schedule": c.SCHEDULE_TOPIC,
        "$p_group": c.PROPERTY_PRODUCER_GROUP,
        "$p_real_topic": c.PROPERTY_REAL_TOPIC,
        "$p_real_qid": c.PROPERTY_REAL_QUEUE_ID,
        "$p_check_times": c.PROPERTY_TRANSACTION_CHECK_TIMES,
        "$p_prepared": c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
        "$p_immunity": c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
        "$remove_tag": REMOVE_TAG,
        "$check_max": str(TRANSACTION_CHECK_MAX),
        "$reserve_ms": str(FILE_RESERVED_MS),
        "$timeout_ms": str(TRANSACTION_TIMEOUT_MS),
        "$as_of": str(as_of),
        "$out": str(out),
    }
    started = time.perf_counter()
    for statement in (RESOLVE_RECORDS_SQL, RESOLVE_STATE_SQL):
        con.execute(_substituted(statement, substitutions))
    seconds = time.perf_counter() - started
    outputs = [Output(TRANSACTION_STATE, out, ("broker_name", "half_commit_log_offset", "half_queue_offset"))]
    outcome = checked(lake, seconds, outputs, PERTURBED["resolve_transactions"] if perturb else None)
    outcome.not_computed[TRANSACTION_RECORDS.name] = (
        "the job's extract of the log; the peer reads the log for it directly"
    )
    return outcome


def _connect() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that prints no progress bar."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    return con


def _substituted(statement: str, substitutions: Mapping[str, str]) -> str:
    """``statement`` with every $-name replaced, longest names first."""
    for name in sorted(substitutions, key=len, reverse=True):
        statement = statement.replace(name, substitutions[name])
    return statement


# ``report``: the data behind its page, the hourly summaries of the log and of the offset commits
# (the plots and the HTML are drawn from those and from small tables, not part of the peer).
REPORT_HOURS_SQL = """
COPY (
  SELECT f.broker_name, p.topic, p.queue_id, p.store_timestamp - ((p.store_timestamp % $hour) + $hour) % $hour AS hour,
         count(*) AS messages, sum(p.store_size)::BIGINT AS bytes,
         max(CASE WHEN (p.sys_flag & $type_mask) IN (0, $commit_type) THEN p.queue_offset + 1 END) AS end_offset,
         min(p.store_timestamp) AS first_store_timestamp, max(p.store_timestamp) AS last_store_timestamp
  FROM read_parquet($log_files, filename = true) p JOIN log_files f ON p.filename = f.location
  GROUP BY ALL
) TO '$queue_out' (FORMAT parquet);
COPY (
  SELECT "group", broker_name, topic, queue_id, hour, latest.t AS commit_timestamp, latest.r AS is_reset,
         latest.o AS "offset"
  FROM (SELECT "group", broker_name, topic, queue_id,
               commit_timestamp - ((commit_timestamp % $hour) + $hour) % $hour AS hour,
               max({'t': commit_timestamp, 'r': source = 'reset', 'o': "offset"}) AS latest
        FROM read_parquet($commit_files) GROUP BY ALL)
) TO '$commit_out' (FORMAT parquet)
"""


def time_report_peer(lake: Path, out: Path, perturb: bool = False) -> PeerOutcome:
    """The report's data (``queue_hours`` and ``commit_hours``) as DuckDB SQL, timed, then compared
    with the job's tables."""
    out.mkdir(parents=True, exist_ok=True)
    con = _connect()
    log_files = active_files(lake / COMMITLOG.path, COMMITLOG.partition_by)
    con.register("log_files", log_files)
    substitutions = {
        "$log_files": listing(log_files),
        "$commit_files": listing(active_files(lake / CONSUMER_OFFSET_COMMITS.path, ())),
        "$hour": str(HOUR_MS),
        "$type_mask": str(c.TRANSACTION_ROLLBACK_TYPE),
        "$commit_type": str(c.TRANSACTION_COMMIT_TYPE),
        "$queue_out": str(out / "queue_hours.parquet"),
        "$commit_out": str(out / "commit_hours.parquet"),
    }
    started = time.perf_counter()
    con.execute(_substituted(REPORT_HOURS_SQL, substitutions))
    seconds = time.perf_counter() - started
    outputs = [
        Output(QUEUE_HOURS, out / "queue_hours.parquet", ("broker_name", "topic", "queue_id", "hour")),
        Output(COMMIT_HOURS, out / "commit_hours.parquet", ("group", "broker_name", "topic", "queue_id", "hour")),
    ]
    outcome = checked(lake, seconds, outputs, PERTURBED["report"] if perturb else None)
    outcome.not_computed["report.html"] = "the page and its plots are drawn from these tables and small ones"
    return outcome
