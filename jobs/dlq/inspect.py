"""Dead letters in the ``pyspark`` shell: load and filter the ``dlq`` table, summarize it per group,
topic and reason, and show one dead letter decoded with its retry history. See docs/jobs.md (the dlq
helper).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.common import constants as c
from broker_model.common import decode_msg_id, decompress_body, default_lake, parse_instant
from jobs.cli import format_age, iso_in_zone, text_table
from jobs.dlq.transforms import REASONS, SENT
from jobs.lake import Lake
from schemas.catalog import BROKERS, COMMITLOG, DLQ, DLQ_REDRIVES
from schemas.errors import LakeError, ValidationError

AGE_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("age_under_1h", 0, 3_600_000),
    ("age_1h_to_1d", 3_600_000, 86_400_000),
    ("age_1d_to_7d", 86_400_000, 7 * 86_400_000),
    ("age_over_7d", 7 * 86_400_000, None),
)  # [from, to) milliseconds
MAX_BODY_BYTES = 4096  # what show() renders of a body by default: a screenful of text or hex
_HEX_ID = re.compile(r"^(?:[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56})$")  # offset message id (IPv4, IPv6) or UNIQ_KEY

Instant = int | str | datetime


# ---------------------------------------------------------------------------------------------
# Loading and filtering
# ---------------------------------------------------------------------------------------------


def load(
    spark: SparkSession,
    lake: str | Path | None = None,
    group: str | None = None,
    topic: str | None = None,
    since: Instant | None = None,
    until: Instant | None = None,
    key: str | None = None,
    reason: str | None = None,
) -> DataFrame:
    """The dead letters of the lake's ``dlq`` table, filtered (every filter is optional).

    Args:
        spark: the shell's session.
        lake: lake root; None: ``$RMQ_LAKE``, else ``data/lake``.
        group: consumer group that gave up.
        topic: the message's original topic (``origin_topic``).
        since, until: ``dlq_timestamp`` in [since, until): epoch ms, ISO-8601 with a zone, or an
            aware datetime. Rows without a ``dlq_timestamp`` (``POLICY_NOT_WRITTEN``) never match.
        key: a KEYS entry (KEYS holds space-separated keys) or the UNIQ_KEY.
        reason: one of ``route_dlq.REASONS``.

    Returns:
        The ``dlq`` columns, lazily (nothing is read until an action).

    Raises:
        ValidationError: a bad filter, named; nothing is read.
        LakeError: the lake has no ``dlq`` table (run ``route_dlq`` first).
    """
    start = None if since is None else _instant(since, "since")
    end = None if until is None else _instant(until, "until")
    if start is not None and end is not None and start >= end:
        raise ValidationError("until", until, f"is not after since={since!r}", "pass a later until or an earlier since")
    for name, value in (("group", group), ("topic", topic), ("key", key)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValidationError(name, value, "must be a non-blank string", f"leave {name} out to match all")
    if reason is not None and reason not in REASONS:
        raise ValidationError("reason", reason, "is not a dead letter reason", f"use one of {list(REASONS)}")
    return filter_dead_letters(read_dlq(open_lake(spark, lake)), group, topic, start, end, key, reason)


def filter_dead_letters(
    dlq_df: DataFrame,
    group: str | None = None,
    topic: str | None = None,
    since: int | None = None,
    until: int | None = None,
    key: str | None = None,
    reason: str | None = None,
) -> DataFrame:
    """``dlq`` rows matching every given filter (see :func:`load`; times in epoch ms)."""
    conditions: list[Column] = []
    if group is not None:
        conditions.append(F.col("group") == F.lit(group))
    if topic is not None:
        conditions.append(F.col("origin_topic") == F.lit(topic))
    if since is not None:
        conditions.append(F.col("dlq_timestamp") >= F.lit(since))
    if until is not None:
        conditions.append(F.col("dlq_timestamp") < F.lit(until))
    if key is not None:
        keys = F.split(F.coalesce(F.try_element_at("properties", F.lit(c.PROPERTY_KEYS)), F.lit("")), c.KEY_SEPARATOR)
        conditions.append(F.array_contains(keys, key) | (F.col("uniq_key") == F.lit(key)))
    if reason is not None:
        conditions.append(F.col("reason") == F.lit(reason))
    matched_df = dlq_df
    for condition in conditions:
        matched_df = matched_df.where(F.coalesce(condition, F.lit(False)))
    return matched_df.select(*DLQ.column_names)


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def summary(df: DataFrame, as_of: Instant | None = None) -> DataFrame:
    """Dead letters of ``df`` (``dlq`` rows) per (group, origin_topic, reason) as of a time; see
    :func:`build_summary`. ``as_of``: epoch ms, ISO-8601 with a zone or an aware datetime;
    None: now (read once, here).

    Raises:
        ValidationError: a bad ``as_of``, or ``df`` lacks a ``dlq`` column.
    """
    moment = time.time_ns() // 1_000_000 if as_of is None else _instant(as_of, "as_of")
    missing = [
        name
        for name in (
            "group",
            "origin_topic",
            "reason",
            "dlq_timestamp",
            "attempts",
            "first_failure_timestamp",
            "redrive_state",
        )
        if name not in df.columns
    ]
    if missing:
        raise ValidationError("df", missing, "these dlq columns are missing", "pass rows of dlq.load(spark)")
    return build_summary(df, moment)


def build_summary(dlq_df: DataFrame, as_of: int) -> DataFrame:
    """Per (``group``, ``origin_topic``, ``reason``), ordered by them: ``dead_letters``, ``redriven``
    (``redrive_state`` SENT), ``oldest_timestamp`` and ``newest_timestamp``, one count per
    :data:`AGE_BUCKETS` bucket of ``as_of`` minus the time the message died, and ``as_of``; the
    three times are Spark timestamps (shown in the session's time zone). The time it died is
    ``dlq_timestamp``, or for a ``POLICY_NOT_WRITTEN`` row the store time of its latest attempt.
    Rows that died after ``as_of`` are left out."""
    died = F.coalesce("dlq_timestamp", F.element_at("attempts", -1)["store_timestamp"], "first_failure_timestamp")
    age = F.lit(as_of) - F.col("_died")
    buckets = [
        F.count_if((age >= F.lit(low)) & (age < F.lit(high)) if high is not None else age >= F.lit(low)).alias(name)
        for name, low, high in AGE_BUCKETS
    ]
    return (
        dlq_df.select("group", "origin_topic", "reason", "redrive_state", died.alias("_died"))
        .where(F.col("_died") <= F.lit(as_of))
        .groupBy("group", "origin_topic", "reason")
        .agg(
            F.count(F.lit(1)).alias("dead_letters"),
            F.count_if(F.coalesce(F.col("redrive_state").startswith(SENT + " "), F.lit(False))).alias("redriven"),
            F.timestamp_millis(F.min("_died")).alias("oldest_timestamp"),
            F.timestamp_millis(F.max("_died")).alias("newest_timestamp"),
            *buckets,
        )
        .select(
            "group",
            "origin_topic",
            "reason",
            "dead_letters",
            "redriven",
            "oldest_timestamp",
            "newest_timestamp",
            *[name for name, _, _ in AGE_BUCKETS],
            F.timestamp_millis(F.lit(as_of).cast("long")).alias("as_of"),
        )
        .orderBy("group", "origin_topic", "reason")
    )


# ---------------------------------------------------------------------------------------------
# One dead letter, decoded
# ---------------------------------------------------------------------------------------------


def show(
    spark: SparkSession, msg_id: str, lake: str | Path | None = None, max_body_bytes: int = MAX_BODY_BYTES
) -> None:
    """Print the dead letter(s) with offset message id (or UNIQ_KEY) ``msg_id``: ids, group,
    topic, reason, flag and sys flag (from its commit log record), properties, the body decoded
    (:func:`format_body`), the whole retry history with ISO UTC times and the delay since the
    previous attempt, and the redrives of it in the ledger.

    Raises:
        ValidationError: ``msg_id`` is not 32 or 56 hex characters, or no dead letter has it;
            ``max_body_bytes`` below 1.
        LakeError: the lake has no ``dlq`` table.
    """
    wanted = check_hex_id(msg_id, "msg_id")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ValidationError("max_body_bytes", max_body_bytes, "must be an int >= 1")
    lake_ = open_lake(spark, lake)
    rows = [
        r.asDict(recursive=True)
        for r in read_dlq(lake_)
        .where((F.col("msg_id") == F.lit(wanted)) | (F.col("uniq_key") == F.lit(wanted)))
        .orderBy("broker_name", "msg_id", "group")
        .collect()
    ]
    if not rows:
        raise ValidationError(
            "msg_id",
            msg_id,
            f"is no dead letter's msg_id or uniq_key in lake {str(lake_.root)!r}",
            "list them with dlq.load(spark)",
        )
    redrives = _redrive_rows(lake_, [(r["broker_name"], r["msg_id"]) for r in rows])
    zone = session_zone(spark)
    for index, row in enumerate(rows):
        stored = _stored_flags(lake_, row["broker_name"], row["msg_id"])
        mine = [r for r in redrives if (r["broker_name"], r["msg_id"]) == (row["broker_name"], row["msg_id"])]
        if index:
            print()
        print("\n".join(format_dead_letter(row, stored, mine, max_body_bytes, zone)))


def format_dead_letter(
    row: Mapping[str, Any],
    stored: tuple[int, int] | None,
    redrives: Sequence[Mapping[str, Any]],
    max_body_bytes: int = MAX_BODY_BYTES,
    zone: str = "UTC",
) -> list[str]:
    """The lines :func:`show` prints for one ``dlq`` row (a dict), its commit log record's
    (flag, sys_flag) when known, and its ``dlq_redrives`` rows; times in the time zone ``zone``."""
    properties = dict(row["properties"] or {})
    flag, sys_flag = stored if stored is not None else (None, 0)
    fields = [
        ("msg_id", row["msg_id"]),
        ("broker_name", row["broker_name"]),
        ("group", row["group"]),
        ("origin_topic", row["origin_topic"]),
        ("origin_msg_id", row["origin_msg_id"]),
        ("uniq_key", row["uniq_key"]),
        ("keys", properties.get(c.PROPERTY_KEYS)),
        ("tags", properties.get(c.PROPERTY_TAGS)),
        ("reason", row["reason"]),
        ("reconsume_times", row["reconsume_times"]),
        ("first_failure", _time(row["first_failure_timestamp"], zone)),
        ("dlq_time", _time(row["dlq_timestamp"], zone)),
        ("flag", flag),
        ("sys_flag", sys_flag if stored is not None else None),
        ("redrive_state", row["redrive_state"]),
    ]
    lines = [f"dead letter {row['msg_id']}"]
    lines += text_table([(f"  {name}", "-" if value is None else str(value)) for name, value in fields])
    lines.append(f"properties ({len(properties)})")
    lines += [f"  {name}={value}" for name, value in sorted(properties.items())]
    lines += format_body(row["body"] or b"", sys_flag, max_body_bytes)
    lines += format_history(row, zone)
    if redrives:
        lines.append(f"redrives ({len(redrives)})")
        lines += text_table(
            [("  #Time", "#Request", "#State", "#New Msg Id")]
            + [
                (f"  {_time(r['updated_timestamp'], zone)}", r["request_id"], r["state"], r["new_msg_id"] or "-")
                for r in sorted(redrives, key=lambda r: (r["updated_timestamp"], r["state"], r["request_id"]))
            ]
        )
    return lines


def format_body(body: bytes, sys_flag: int = 0, max_body_bytes: int = MAX_BODY_BYTES) -> list[str]:
    """A body for people: a header line (size, compression, kind) and the body, indented.

    Decompressed first when ``sys_flag`` says so (zlib). Then: JSON pretty-printed when the whole
    body parses as JSON; UTF-8 text when it decodes and holds no control characters but tab, CR
    and LF; else a hex dump (16 bytes a line, offset, hex, printable ASCII). At most
    ``max_body_bytes`` of it are rendered (JSON: characters of the pretty form); the header says
    what was left out. A body that cannot be decompressed is dumped as stored.
    """
    note = ""
    try:
        data = decompress_body(body, sys_flag)
        if data is not body:
            note = f", {len(body)} compressed"
    except (ValidationError, ValueError) as err:  # zlib.error is a ValueError
        data, note = body, f", not decompressed: {err}"
    text = _utf8_text(data)
    if text is not None:
        try:
            pretty: str | None = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = None
        kind, shown = ("JSON", pretty) if pretty is not None else ("text", text)
        cut = shown[:max_body_bytes]
        more = f", {len(shown) - len(cut)} more characters not shown" if len(cut) < len(shown) else ""
        return [f"body ({len(data)} bytes{note}, {kind}{more})", *("  " + line for line in cut.splitlines())]
    cut_bytes = data[:max_body_bytes]
    more = f", {len(data) - len(cut_bytes)} more bytes not shown" if len(cut_bytes) < len(data) else ""
    return [f"body ({len(data)} bytes{note}, binary{more})", *hex_dump(cut_bytes)]


def hex_dump(data: bytes) -> list[str]:
    """``  00000000  7b 22 69 64 ...  |{"id...|`` lines, 16 bytes each."""
    lines = []
    for start in range(0, len(data), 16):
        chunk = data[start : start + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        printable = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"  {start:08x}  {hexes:<47}  |{printable}|")
    return lines


def format_history(row: Mapping[str, Any], zone: str = "UTC") -> list[str]:
    """The retry history of a ``dlq`` row: its ``attempts`` (the original and every delivered
    retry) then the dead letter record itself, with ISO store times in the time zone ``zone`` and
    the delay since the previous line."""
    steps = [
        (a["store_timestamp"], a["broker_name"], a["topic"], a["commit_log_offset"], a["reconsume_times"])
        for a in row["attempts"] or []
    ]
    if row["dlq_timestamp"] is not None:
        _, offset = decode_msg_id(row["msg_id"])
        dead_topic = c.DLQ_GROUP_TOPIC_PREFIX + row["group"]
        steps.append((row["dlq_timestamp"], row["broker_name"], dead_topic, offset, row["reconsume_times"]))
    lines = [f"retry history ({len(steps)} records)"]
    if not steps:
        return lines
    table = [("  #", "#Store Time", "#Delay", "#Broker", "#Topic", "#Commit Log Offset", "#Reconsume Times")]
    previous: int | None = None
    for number, (stored, broker, topic, offset, times) in enumerate(steps):
        delay = "-" if previous is None or stored is None else "+" + format_age(stored - previous)
        table.append((f"  {number}", _time(stored, zone), delay, broker, topic, str(offset), str(times)))
        previous = stored
    return lines + text_table(table)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def open_lake(spark: SparkSession, lake: str | Path | None) -> Lake:
    return Lake(spark, default_lake() if lake is None else Path(lake))


def read_dlq(lake: Lake) -> DataFrame:
    if not lake.exists(DLQ):
        raise LakeError(
            f"lake {str(lake.root)!r} has no dlq table; build it with: python -m jobs route_dlq --lake {lake.root}"
        )
    return lake.read(DLQ)


def _instant(value: Instant, field: str) -> int:
    """Epoch ms of an instant argument.

    Raises:
        ValidationError: naming ``field``: not epoch ms, ISO-8601 with a zone or an aware datetime.
    """
    if isinstance(value, bool):
        raise ValidationError(field, value, "is not a time", "pass epoch ms or ISO-8601 with a zone")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValidationError(field, value, "has no time zone", "pass an aware datetime, e.g. tzinfo=UTC")
        return int(value.timestamp() * 1000)
    if isinstance(value, str):
        return parse_instant(value, field)
    raise ValidationError(field, value, "is not a time", "pass epoch ms or ISO-8601 with a zone")


def check_hex_id(value: object, field: str) -> str:
    if not isinstance(value, str) or not _HEX_ID.match(value.strip()):
        raise ValidationError(
            field,
            value,
            "is not a message id (32 or 56 hex characters)",
            "copy msg_id or uniq_key from dlq.load(spark)",
        )
    return value.strip().upper()


def _utf8_text(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any((ord(ch) < 0x20 and ch not in "\t\n\r") or ord(ch) == 0x7F for ch in text):
        return None
    return text


def _time(epoch_ms: int | None, zone: str) -> str:
    return "-" if epoch_ms is None else iso_in_zone(epoch_ms, zone)


def session_zone(spark: SparkSession) -> str:
    """The session's time zone (``spark.sql.session.timeZone``), the one the helpers print in."""
    return str(spark.conf.get("spark.sql.session.timeZone", "UTC"))


def _redrive_rows(lake: Lake, keys: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    if not lake.exists(DLQ_REDRIVES):
        return []
    ids = sorted({msg_id for _, msg_id in keys})
    return [r.asDict() for r in lake.read(DLQ_REDRIVES).where(F.col("msg_id").isin(ids)).collect()]


def _stored_flags(lake: Lake, broker_name: str, msg_id: str) -> tuple[int, int] | None:
    """(flag, sys_flag) of the commit log record ``msg_id`` names, None when it is not there.

    One record, read on the driver with delta-rs as the broker's store reads the log: the
    partition values and the files' offset statistics leave a file or two to open, where a
    Spark scan would list every file of the segment.
    """
    brokers = lake.read_rows(
        BROKERS, ["broker_name", "segment_size", "started_timestamp"], [("broker_name", "=", broker_name)]
    ).to_pylist()
    offset = decode_msg_id(msg_id)[1]
    filters: list[tuple[str, str, Any]] = [("broker_name", "=", broker_name), ("commit_log_offset", "=", offset)]
    if brokers:
        size = max(brokers, key=lambda r: r["started_timestamp"])["segment_size"]
        filters.append(("segment", "=", offset - offset % size))
    rows = lake.read_rows(COMMITLOG, ["flag", "sys_flag"], filters).to_pylist()
    return (rows[0]["flag"], rows[0]["sys_flag"]) if rows else None
