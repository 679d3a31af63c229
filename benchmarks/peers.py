"""The DuckDB peers of ``benchmarks/run_all.py``: each job's output computed from scratch by DuckDB
SQL over the Parquet files of the inputs' active Delta versions (file lists and partition values
from the Delta log), timed, and checked equal to the job's table by a digest of every row.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from broker_model.broker import FILE_RESERVED_MS, REMOVE_TAG, TRANSACTION_CHECK_MAX, TRANSACTION_TIMEOUT_MS
from broker_model.common import constants as c
from jobs.dlq.fold import host_prefixes
from jobs.hours import HOUR_MS
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUMER_OFFSET_COMMITS,
    CONSUMER_OFFSETS,
    DLQ,
    DLQ_REDRIVES,
    QUEUE_HOURS,
    RETRY_CHAINS,
    SUBSCRIPTION_GROUP,
    TRANSACTION_STATE,
)


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
  bounds AS (
    SELECT broker_name, topic, queue_id, min(queue_offset) AS broker_min_offset,
           max(queue_offset) + 1 AS broker_offset
    FROM cq GROUP BY broker_name, topic, queue_id),
  subscribed AS (SELECT "group", topic FROM cur UNION SELECT "group", '%RETRY%' || "group" FROM cur),
  listed AS (SELECT s."group", b.broker_name, b.topic, b.queue_id FROM subscribed s JOIN bounds b ON s.topic = b.topic),
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
OFFSETS_DIGEST = (
    "SELECT count(*), sum(coalesce(diff, 0)), sum(coalesce(last_timestamp, 0)), "
    "sum(coalesce(oldest_unconsumed_timestamp, 0)), sum(coalesce(consumer_offset, -1)) FROM read_parquet($files)"
)


def time_offsets_peer(lake: Path, out: Path, as_of: int) -> tuple[float, bool]:
    """Seconds of ``consumer_offsets`` as one DuckDB query, and whether its rows' digest equals
    the job's table."""
    out.parent.mkdir(parents=True, exist_ok=True)
    con = _connect()
    cq_files = active_files(lake / CONSUME_QUEUE.path, CONSUME_QUEUE.partition_by)
    commit_files = active_files(lake / CONSUMER_OFFSET_COMMITS.path, ())
    con.register("cq_files", cq_files)
    sql = (
        OFFSETS_SQL.replace("$cq_files", listing(cq_files))
        .replace("$commit_files", listing(commit_files))
        .replace("$as_of", str(as_of))
        .replace("$out", str(out))
    )
    started = time.perf_counter()
    con.execute(sql)
    seconds = time.perf_counter() - started
    peer = con.execute(OFFSETS_DIGEST.replace("$files", f"['{out}']")).fetchone()
    job_files = listing(active_files(lake / CONSUMER_OFFSETS.path, ()))
    job = con.execute(OFFSETS_DIGEST.replace("$files", job_files)).fetchone()
    return seconds, peer == job


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
CHAINS_DIGEST = (
    "SELECT count(*), sum(len(attempts)), sum(last_reconsume_times), sum(max_reconsume_times), "
    'count(*) FILTER (WHERE exhausted), sum(hash("group" || origin_msg_id || state || broker_name)::HUGEINT), '
    "sum(first_failure_timestamp + last_timestamp) FROM read_parquet($files)"
)
DLQ_DIGEST = (
    "SELECT count(*), sum(hash(msg_id || reason || origin_msg_id)::HUGEINT), sum(len(attempts)), "
    "sum(octet_length(body)), sum(coalesce(dlq_timestamp, 0)), count(redrive_state) FROM read_parquet($files)"
)


def time_route_peer(lake: Path, out: Path, as_of: int) -> tuple[float, bool]:
    """Seconds of ``route_dlq`` (``retry_chains`` and ``dlq``) as DuckDB SQL, and whether both
    digests equal the job's tables."""
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
    same = True
    for digest, name, spec in ((CHAINS_DIGEST, "chains.parquet", RETRY_CHAINS), (DLQ_DIGEST, "dlq.parquet", DLQ)):
        peer = con.execute(digest.replace("$files", f"['{out / name}']")).fetchone()
        job = con.execute(digest.replace("$files", listing(active_files(lake / spec.path, ())))).fetchone()
        same = same and peer == job
    return seconds, same


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
STATE_DIGEST = (
    "SELECT count(*), sum(hash(concat_ws('|', broker_name, half_commit_log_offset, half_queue_offset, state, "
    "anomaly, check_times, op_queue_offset, final_commit_log_offset, producer_group, uniq_key, real_topic, "
    "real_queue_id, born_timestamp))::HUGEINT) FROM read_parquet($files)"
)


def time_resolve_peer(lake: Path, out: Path, as_of: int) -> tuple[float, bool]:
    """Seconds of ``resolve_transactions`` (``transaction_state``, the broker's default check
    settings) as DuckDB SQL, and whether its digest equals the job's table."""
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
    peer = con.execute(STATE_DIGEST.replace("$files", f"['{out}']")).fetchone()
    job = con.execute(
        STATE_DIGEST.replace("$files", listing(active_files(lake / TRANSACTION_STATE.path, ())))
    ).fetchone()
    return seconds, peer == job


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
  SELECT f.broker_name, p.topic, p.queue_id, p.store_timestamp - p.store_timestamp % $hour AS hour,
         count(*) AS messages, sum(p.store_size)::BIGINT AS bytes,
         max(CASE WHEN (p.sys_flag & 12) IN (0, 8) THEN p.queue_offset + 1 END) AS end_offset,
         min(p.store_timestamp) AS first_store_timestamp, max(p.store_timestamp) AS last_store_timestamp
  FROM read_parquet($log_files, filename = true) p JOIN log_files f ON p.filename = f.location
  GROUP BY ALL
) TO '$queue_out' (FORMAT parquet);
COPY (
  SELECT "group", broker_name, topic, queue_id, commit_timestamp - commit_timestamp % $hour AS hour,
         max({'t': commit_timestamp, 'r': source = 'reset', 'o': "offset"}) AS latest
  FROM read_parquet($commit_files) GROUP BY ALL
) TO '$commit_out' (FORMAT parquet)
"""
QUEUE_HOURS_DIGEST = (
    "SELECT count(*), sum(messages), sum(bytes), sum(coalesce(end_offset, -1)), "
    "sum(hash(concat_ws('|', broker_name, topic, queue_id, hour, first_store_timestamp, last_store_timestamp))"
    "::HUGEINT) FROM read_parquet($files)"
)


def time_report_peer(lake: Path, out: Path) -> tuple[float, bool]:
    """Seconds of the report's data (``queue_hours`` and ``commit_hours``) as DuckDB SQL, and
    whether the log's summary equals the job's table by digest."""
    out.mkdir(parents=True, exist_ok=True)
    con = _connect()
    log_files = active_files(lake / COMMITLOG.path, COMMITLOG.partition_by)
    con.register("log_files", log_files)
    substitutions = {
        "$log_files": listing(log_files),
        "$commit_files": listing(active_files(lake / CONSUMER_OFFSET_COMMITS.path, ())),
        "$hour": str(HOUR_MS),
        "$queue_out": str(out / "queue_hours.parquet"),
        "$commit_out": str(out / "commit_hours.parquet"),
    }
    started = time.perf_counter()
    con.execute(_substituted(REPORT_HOURS_SQL, substitutions))
    seconds = time.perf_counter() - started
    peer = con.execute(QUEUE_HOURS_DIGEST.replace("$files", f"['{out / 'queue_hours.parquet'}']")).fetchone()
    job_files = listing(active_files(lake / QUEUE_HOURS.path, ()))
    job = con.execute(QUEUE_HOURS_DIGEST.replace("$files", job_files)).fetchone()
    return seconds, peer == job
