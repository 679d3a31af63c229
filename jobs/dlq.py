"""Dead letters in the ``pyspark`` shell: load, summarise, show one, redrive.

Start ``pyspark`` with the project on the path (``PYTHONPATH=. .venv/bin/pyspark``), then::

    from jobs import dlq
    df = dlq.load(spark, group="cg-audit-retry", since="2026-11-22T00:00:00Z")
    dlq.summary(df).show()
    dlq.show(spark, "7F00000100002A9F0000000000012A3C")
    dlq.redrive(spark, df.limit(5), "fix-1234")                 # dry run: prints the plan
    dlq.redrive(spark, df.limit(5), "fix-1234", execute=True)   # sends, once per dead letter

Every function takes ``lake`` (default: ``$RMQ_LAKE``, else ``data/lake``) and reads the ``dlq``
table that ``python -m jobs route_dlq`` builds; run it first, and again after a redrive to see
``redrive_state`` in the table.

Redrive: each chosen dead letter is sent again to its ``origin_topic`` as a new message through
the broker that holds it, started in this process (its name lock keeps a running broker out:
stop that broker first). The new message has the dead letter's body, flag, UNIQ_KEY and
properties without the send-back internals (:data:`STRIPPED_PROPERTIES`), reconsume times 0,
and the properties ``DLQ_MSG_ID`` (the dead letter's offset message id) and
``REDRIVE_REQUEST_ID``. A request sends each dead letter at most once, through the
``dlq_redrives`` ledger:

1. with the brokers started (so no other redrive can use them), read the request's ledger rows:
   a dead letter whose latest row is SENT is skipped; one whose latest row is PENDING (a run
   stopped between sending and recording) is looked for in its broker's queues of the target
   topic, among messages stored since that row's time carrying both properties: found, it is
   recorded SENT with that message's id, else it is sent;
2. append one PENDING row per dead letter to send (one commit), before sending anything;
3. send them; append one SENT row per sent or found message (one commit).

A run killed at any point therefore never sends a dead letter twice for one request: before 2
nothing was sent, between 2 and 3 the next run finds what was sent. Another request id sends
again, on purpose.
"""

from __future__ import annotations

import getpass
import json
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.broker import Broker, BrokerConfig
from broker_model.client import Producer
from broker_model.common import Message, decode_msg_id, decompress_body, default_lake, parse_instant
from broker_model.common import constants as c
from broker_model.store import MessageExt, MessageStore, read_table
from jobs.cli import format_age, iso_utc
from jobs.lake import Lake
from jobs.route_dlq import POLICY_NOT_WRITTEN, PROPERTY_ROUTED_BY, REASONS
from schemas.catalog import BROKERS, COMMITLOG, DLQ, DLQ_REDRIVES, spark_schema
from schemas.errors import BrokerError, LakeError, ValidationError

PROPERTY_DLQ_MSG_ID = "DLQ_MSG_ID"  # on a redriven message: offset message id of its dead letter
PROPERTY_REDRIVE_REQUEST_ID = "REDRIVE_REQUEST_ID"  # on a redriven message: the request that sent it
# Properties of a dead letter that describe its send-back, delay or transaction path, not the
# message; a redriven message is a fresh send, so they are left out (the broker sets CLUSTER).
STRIPPED_PROPERTIES = frozenset(
    {
        c.PROPERTY_RETRY_TOPIC,
        c.PROPERTY_ORIGIN_MESSAGE_ID,
        c.PROPERTY_DELAY_TIME_LEVEL,
        c.PROPERTY_REAL_TOPIC,
        c.PROPERTY_REAL_QUEUE_ID,
        c.PROPERTY_RECONSUME_TIME,
        c.PROPERTY_MAX_RECONSUME_TIMES,
        c.PROPERTY_WAIT_STORE_MSG_OK,
        c.PROPERTY_CLUSTER,
        c.PROPERTY_CONSUME_START_TIMESTAMP,
        c.PROPERTY_MIN_OFFSET,
        c.PROPERTY_MAX_OFFSET,
        c.PROPERTY_TRANSACTION_PREPARED,
        c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
        c.PROPERTY_TRANSACTION_CHECK_TIMES,
        c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
        c.PROPERTY_TRANSACTION_ID,
        c.PROPERTY_TIMER_DELIVER_MS,
        c.PROPERTY_TIMER_DELAY_SEC,
        PROPERTY_ROUTED_BY,
    }
)
PENDING, SENT = "PENDING", "SENT"  # dlq_redrives states
SEND, SKIP, CHECK = "SEND", "SKIP", "CHECK"  # dry-run actions: new, already SENT, PENDING to look for
SENT_NOW, SKIPPED, RECOVERED = "SENT", "SKIPPED", "RECOVERED"  # outcomes of an executed redrive
REDRIVE_PRODUCER_GROUP = "DLQ_REDRIVE_PRODUCER"
# Ledger rows and store times come from two clocks of this process; a little slack makes the
# search for an interrupted run's messages immune to a clock step, at the cost of a few reads.
PENDING_SEARCH_MARGIN_MS = 1000
AGE_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("age_under_1h", 0, 3_600_000),
    ("age_1h_to_1d", 3_600_000, 86_400_000),
    ("age_1d_to_7d", 86_400_000, 7 * 86_400_000),
    ("age_over_7d", 7 * 86_400_000, None),
)  # [from, to) milliseconds
MAX_BODY_BYTES = 4096  # what show() renders of a body by default: a screenful of text or hex
PLAN_LINES = 20  # rows of a redrive plan printed
_HEX_ID = re.compile(r"^(?:[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56})$")  # offset message id (IPv4, IPv6) or UNIQ_KEY
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$")
_RESULT_DDL = (
    "request_id string, broker_name string, msg_id string, group string, target_topic string, action string, "
    "new_broker_name string, new_msg_id string"
)

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
    return filter_dead_letters(_read_dlq(_lake(spark, lake)), group, topic, start, end, key, reason)


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
    """Per (``group``, ``origin_topic``, ``reason``), ordered by them: ``dead_letters``,
    ``redriven`` (``redrive_state`` SENT), ``oldest_timestamp`` and ``newest_timestamp`` (epoch
    ms), one count per :data:`AGE_BUCKETS` bucket of ``as_of`` minus the time the message died,
    and ``as_of``. The time it died is ``dlq_timestamp``, or for a ``POLICY_NOT_WRITTEN`` row the
    store time of its latest attempt. Rows that died after ``as_of`` are left out."""
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
            F.min("_died").alias("oldest_timestamp"),
            F.max("_died").alias("newest_timestamp"),
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
            F.lit(as_of).cast("long").alias("as_of"),
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
    wanted = _hex_id(msg_id, "msg_id")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ValidationError("max_body_bytes", max_body_bytes, "must be an int >= 1")
    lake_ = _lake(spark, lake)
    rows = [
        r.asDict(recursive=True)
        for r in _read_dlq(lake_)
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
    for index, row in enumerate(rows):
        stored = _stored_flags(lake_, row["broker_name"], row["msg_id"])
        mine = [r for r in redrives if (r["broker_name"], r["msg_id"]) == (row["broker_name"], row["msg_id"])]
        if index:
            print()
        print("\n".join(format_dead_letter(row, stored, mine, max_body_bytes)))


def format_dead_letter(
    row: Mapping[str, Any],
    stored: tuple[int, int] | None,
    redrives: Sequence[Mapping[str, Any]],
    max_body_bytes: int = MAX_BODY_BYTES,
) -> list[str]:
    """The lines :func:`show` prints for one ``dlq`` row (a dict), its commit log record's
    (flag, sys_flag) when known, and its ``dlq_redrives`` rows."""
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
        ("first_failure", _time(row["first_failure_timestamp"])),
        ("dlq_time", _time(row["dlq_timestamp"])),
        ("flag", flag),
        ("sys_flag", sys_flag if stored is not None else None),
        ("redrive_state", row["redrive_state"]),
    ]
    lines = [f"dead letter {row['msg_id']}"]
    lines += _table([(f"  {name}", "-" if value is None else str(value)) for name, value in fields])
    lines.append(f"properties ({len(properties)})")
    lines += [f"  {name}={value}" for name, value in sorted(properties.items())]
    lines += format_body(row["body"] or b"", sys_flag, max_body_bytes)
    lines += format_history(row)
    if redrives:
        lines.append(f"redrives ({len(redrives)})")
        lines += _table(
            [("  #Time", "#Request", "#State", "#New Msg Id")]
            + [
                (f"  {_time(r['updated_timestamp'])}", r["request_id"], r["state"], r["new_msg_id"] or "-")
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


def format_history(row: Mapping[str, Any]) -> list[str]:
    """The retry history of a ``dlq`` row: its ``attempts`` (the original and every delivered
    retry) then the dead letter record itself, with ISO UTC store times and the delay since the
    previous line."""
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
        table.append((f"  {number}", _time(stored), delay, broker, topic, str(offset), str(times)))
        previous = stored
    return lines + _table(table)


# ---------------------------------------------------------------------------------------------
# Redrive
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Redriven:
    """A dead letter stored again by :func:`redrive` (what ``on_sent`` receives)."""

    request_id: str
    broker_name: str
    msg_id: str
    new_broker_name: str
    new_msg_id: str


@dataclass(frozen=True)
class _Item:
    """One chosen dead letter and where the request's ledger has it."""

    broker_name: str
    msg_id: str
    group: str
    target_topic: str
    state: str | None = None  # latest ledger state for the request
    updated_timestamp: int | None = None
    new_broker_name: str | None = None
    new_msg_id: str | None = None


def redrive(
    spark: SparkSession,
    selection: DataFrame | Sequence[str] | str,
    request_id: str,
    lake: str | Path | None = None,
    execute: bool = False,
    on_sent: Callable[[Redriven], None] | None = None,
) -> DataFrame:
    """Send the chosen dead letters again to their original topics, once per request (module
    docstring); a dry run unless ``execute``.

    Args:
        selection: ``dlq`` rows (a DataFrame with ``msg_id``, and ``broker_name`` when several
            brokers share a store host), or offset message ids.
        request_id: names the request: 1-128 characters of letters, digits and ``._:@/-``; the
            same id sends nothing a run of it already sent.
        execute: False: print and return the plan, write nothing. True: send.
        on_sent: called after each message is stored and before the SENT rows are committed
            (progress; tests stop the process there).

    Returns:
        One row per chosen dead letter (``request_id``, ``broker_name``, ``msg_id``, ``group``,
        ``target_topic``, ``action``, ``new_broker_name``, ``new_msg_id``). ``action``: dry run
        SEND, SKIP (already SENT) or CHECK (PENDING: looked for, sent when missing); executed
        SENT, SKIPPED or RECOVERED (found in the topic, sent by an interrupted run).

    Raises:
        ValidationError: a bad ``request_id`` or ``selection`` (empty, malformed ids, ids that
            are no dead letter of the lake, ``POLICY_NOT_WRITTEN`` rows, no origin topic);
            nothing is written.
        LakeError: the lake has no ``dlq`` table, or a broker cannot start (it runs elsewhere);
            nothing is written. A dead letter missing from its broker's log (the lake changed
            since ``route_dlq``) also stops the run before anything is written.
    """
    if not isinstance(request_id, str) or not _REQUEST_ID.match(request_id):
        raise ValidationError(
            "request_id",
            request_id,
            "must be 1-128 letters, digits or ._:@/- (not first)",
            "name the request, e.g. 'fix-1234'",
        )
    keys = _selected_keys(selection)
    lake_ = _lake(spark, lake)
    chosen = _resolve(lake_, keys)
    if not execute:
        ledger = _ledger(lake_, request_id, chosen)
        items = [_with_ledger(item, ledger) for item in chosen]
        rows = [_result_row(request_id, item, _dry_run_action(item)) for item in items]
        print("\n".join(format_plan(request_id, rows, executed=False)))
        return spark.createDataFrame(rows, _RESULT_DDL)
    rows = _execute(lake_, request_id, chosen, on_sent)
    print("\n".join(format_plan(request_id, rows, executed=True)))
    return spark.createDataFrame(rows, _RESULT_DDL)


def format_plan(request_id: str, rows: Sequence[Mapping[str, Any]], executed: bool) -> list[str]:
    """The lines :func:`redrive` prints: counts per action and the first :data:`PLAN_LINES` rows."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["action"]] = counts.get(row["action"], 0) + 1
    order = (SENT_NOW, RECOVERED, SKIPPED) if executed else (SEND, CHECK, SKIP)
    figures = ", ".join(f"{action} {counts.get(action, 0)}" for action in order)
    head = f"redrive {request_id!r} {'executed' if executed else 'dry run'}: {len(rows)} dead letter(s): {figures}"
    header = ("#Action", "#Broker", "#Msg Id", "#Group", "#Target Topic", "#New Msg Id")
    shown = [
        (r["action"], r["broker_name"], r["msg_id"], r["group"], r["target_topic"], r["new_msg_id"] or "-")
        for r in rows[:PLAN_LINES]
    ]
    lines = [head, *_table([header, *shown])]
    if len(rows) > PLAN_LINES:
        lines.append(f"... {len(rows) - PLAN_LINES} more (the returned DataFrame has them all)")
    if executed and (counts.get(SENT_NOW) or counts.get(RECOVERED)):
        lines.append("recorded in dlq_redrives; run route_dlq to see redrive_state in the dlq table")
    elif executed:
        lines.append("nothing left to send for this request: nothing written")
    else:
        lines.append("dry run: nothing written (pass execute=True to send)")
    return lines


def _selected_keys(selection: DataFrame | Sequence[str] | str) -> list[tuple[str | None, str]]:
    """(broker_name or None, upper-case msg_id) of a selection, distinct, in first-seen order.

    Raises:
        ValidationError: not a DataFrame nor ids, no ``msg_id`` column, a malformed id, empty.
    """
    if isinstance(selection, DataFrame):
        if "msg_id" not in selection.columns:
            raise ValidationError(
                "selection", selection.columns, "has no msg_id column", "pass rows of dlq.load(spark)"
            )
        columns = ["broker_name", "msg_id"] if "broker_name" in selection.columns else ["msg_id"]
        pairs = [
            (r["broker_name"] if len(columns) == 2 else None, r["msg_id"])
            for r in selection.select(*columns).distinct().collect()
        ]
    elif isinstance(selection, str):
        pairs = [(None, selection)]
    elif isinstance(selection, Iterable):
        pairs = [(None, value) for value in selection]
    else:
        raise ValidationError("selection", selection, "is neither a DataFrame nor msg ids", "pass dlq.load(...) rows")
    keys = list(dict.fromkeys((broker, _hex_id(value, "selection")) for broker, value in pairs))
    if not keys:
        raise ValidationError("selection", [], "selects no dead letter", "check the filters of dlq.load")
    return keys


def _resolve(lake: Lake, keys: Sequence[tuple[str | None, str]]) -> list[_Item]:
    """The ``dlq`` rows the keys name, as items.

    Raises:
        ValidationError: unknown or ambiguous ids, rows that cannot be redriven.
    """
    ids = sorted({msg_id for _, msg_id in keys})
    found: dict[str, list[dict[str, Any]]] = {}
    for row in (
        _read_dlq(lake)
        .where(F.col("msg_id").isin(ids))
        .select("broker_name", "msg_id", "group", "origin_topic", "reason")
        .collect()
    ):
        found.setdefault(row["msg_id"], []).append(row.asDict())
    unknown = [msg_id for broker, msg_id in keys if not _matching(found.get(msg_id, []), broker)]
    if unknown:
        raise ValidationError(
            "selection",
            unknown[:10],
            f"{len(unknown)} id(s) are no dead letter of lake {str(lake.root)!r}",
            "choose rows of dlq.load(spark)",
        )
    ambiguous = [msg_id for broker, msg_id in keys if len(_matching(found[msg_id], broker)) > 1]
    if ambiguous:
        raise ValidationError(
            "selection",
            ambiguous[:10],
            "each names dead letters on several brokers",
            "pass dlq rows (with broker_name) instead of bare ids",
        )
    rows = [_matching(found[msg_id], broker)[0] for broker, msg_id in keys]
    waiting = [r["msg_id"] for r in rows if r["reason"] == POLICY_NOT_WRITTEN]
    if waiting:
        raise ValidationError(
            "selection",
            waiting[:10],
            f"{len(waiting)} are {POLICY_NOT_WRITTEN}: retry records, not dead letters yet",
            "run route_dlq --execute first, or leave them out",
        )
    orphans = [r["msg_id"] for r in rows if not r["origin_topic"]]
    if orphans:
        raise ValidationError("selection", orphans[:10], "have no origin_topic to send to", "leave them out")
    return [_Item(r["broker_name"], r["msg_id"], r["group"], r["origin_topic"]) for r in rows]


def _matching(rows: Sequence[dict[str, Any]], broker: str | None) -> list[dict[str, Any]]:
    return [r for r in rows if broker is None or r["broker_name"] == broker]


def _ledger(lake: Lake, request_id: str, items: Sequence[_Item]) -> dict[tuple[str, str], dict[str, Any]]:
    """Latest ``dlq_redrives`` row of ``request_id`` per (broker_name, msg_id) of ``items``."""
    if not lake.exists(DLQ_REDRIVES):
        return {}
    latest = F.max_by(
        F.struct("state", "updated_timestamp", "new_broker_name", "new_msg_id"), F.struct("updated_timestamp", "state")
    ).alias("latest")
    rows = (
        lake.read(DLQ_REDRIVES)
        .where((F.col("request_id") == F.lit(request_id)) & F.col("msg_id").isin(sorted({i.msg_id for i in items})))
        .groupBy("broker_name", "msg_id")
        .agg(latest)
        .collect()
    )
    return {(r["broker_name"], r["msg_id"]): r["latest"].asDict() for r in rows}


def _with_ledger(item: _Item, ledger: Mapping[tuple[str, str], Mapping[str, Any]]) -> _Item:
    row = ledger.get((item.broker_name, item.msg_id))
    if row is None:
        return item
    return _Item(
        item.broker_name,
        item.msg_id,
        item.group,
        item.target_topic,
        row["state"],
        row["updated_timestamp"],
        row["new_broker_name"],
        row["new_msg_id"],
    )


def _dry_run_action(item: _Item) -> str:
    return {SENT: SKIP, PENDING: CHECK}.get(item.state or "", SEND)


def _result_row(request_id: str, item: _Item, action: str) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "broker_name": item.broker_name,
        "msg_id": item.msg_id,
        "group": item.group,
        "target_topic": item.target_topic,
        "action": action,
        "new_broker_name": item.new_broker_name,
        "new_msg_id": item.new_msg_id,
    }


def _execute(
    lake: Lake, request_id: str, chosen: Sequence[_Item], on_sent: Callable[[Redriven], None] | None
) -> list[dict[str, Any]]:
    """Steps 1-3 of the module docstring; the result rows, in ``chosen`` order."""
    brokers = _start_brokers(lake, sorted({item.broker_name for item in chosen}))
    try:
        ledger = _ledger(lake, request_id, chosen)  # read again now that no other redrive can send
        items = [_with_ledger(item, ledger) for item in chosen]
        recovered = _find_redriven(brokers, request_id, [i for i in items if i.state == PENDING])
        to_send = [i for i in items if i.state != SENT and (i.broker_name, i.msg_id) not in recovered]
        messages = [_redrive_message(brokers[i.broker_name].store, i, request_id) for i in to_send]
        outcome: dict[tuple[str, str], _Item] = dict(recovered)
        if to_send:
            _append_ledger(lake, request_id, [(i, PENDING) for i in to_send])
        try:
            producers = {name: _producer(broker) for name, broker in brokers.items()}
            for item, message in zip(to_send, messages, strict=True):
                result = producers[item.broker_name].send(message)
                new_broker = result.message_queue.broker_name
                outcome[(item.broker_name, item.msg_id)] = _Item(
                    item.broker_name,
                    item.msg_id,
                    item.group,
                    item.target_topic,
                    SENT,
                    None,
                    new_broker,
                    result.offset_msg_id,
                )
                if on_sent is not None:
                    on_sent(Redriven(request_id, item.broker_name, item.msg_id, new_broker, result.offset_msg_id))
        finally:
            if outcome:
                _append_ledger(lake, request_id, [(item, SENT) for item in outcome.values()])
    finally:
        for broker in brokers.values():
            broker.shutdown()
    rows = []
    for item in items:
        key = (item.broker_name, item.msg_id)
        done = outcome.get(key, item)
        action = SKIPPED if item.state == SENT else RECOVERED if key in recovered else SENT_NOW
        rows.append(_result_row(request_id, done, action))
    return rows


def _start_brokers(lake: Lake, names: Sequence[str]) -> dict[str, Broker]:
    """The named brokers, started here with SYNC_FLUSH; all or none.

    Raises:
        LakeError: a broker is unknown to the lake or cannot start (another process runs it).
    """
    hosts = _store_hosts(lake)
    unknown = [name for name in names if name not in hosts]
    if unknown:
        raise LakeError(f"brokers {unknown} hold dead letters but are not in the lake's brokers table")
    started: dict[str, Broker] = {}
    try:
        for name in names:
            config = BrokerConfig(lake.root, name, hosts[name], flush_mode="SYNC_FLUSH")
            try:
                started[name] = Broker(config).start()
            except BrokerError as err:
                raise LakeError(
                    f"cannot redrive through broker {name!r}: {err}; stop that broker and redrive again "
                    "(nothing was written)"
                ) from err
    except BaseException:
        for broker in started.values():
            broker.shutdown()
        raise
    return started


def _store_hosts(lake: Lake) -> dict[str, str]:
    rows = lake.read(BROKERS).groupBy("broker_name").agg(F.max_by("store_host", "started_timestamp").alias("host"))
    return {row["broker_name"]: row["host"] for row in rows.collect()}


def _producer(broker: Broker) -> Producer:
    # no send retry: a failed SYNC_FLUSH commit stored nothing, and the ledger lets a rerun send it
    return Producer([broker], REDRIVE_PRODUCER_GROUP, retry_times_when_send_failed=0)


def _find_redriven(
    brokers: Mapping[str, Broker], request_id: str, pending: Sequence[_Item]
) -> dict[tuple[str, str], _Item]:
    """The PENDING items whose message an interrupted run stored: per broker and target topic,
    every queue is read from the first message stored at or after the earliest PENDING time
    (less :data:`PENDING_SEARCH_MARGIN_MS`) for messages carrying the request's id and an item's
    ``DLQ_MSG_ID``. The first such message wins."""
    found: dict[tuple[str, str], _Item] = {}
    by_target: dict[tuple[str, str], dict[str, _Item]] = {}
    for item in pending:
        by_target.setdefault((item.broker_name, item.target_topic), {})[item.msg_id] = item
    for (broker_name, topic), wanted in sorted(by_target.items()):
        store = brokers[broker_name].store
        since = min(item.updated_timestamp or 0 for item in wanted.values()) - PENDING_SEARCH_MARGIN_MS
        for message in _messages_since(store, topic, since):
            dead = message.properties.get(PROPERTY_DLQ_MSG_ID)
            if message.properties.get(PROPERTY_REDRIVE_REQUEST_ID) != request_id or dead not in wanted:
                continue
            item = wanted.pop(dead)
            found[(broker_name, dead)] = _Item(
                item.broker_name, item.msg_id, item.group, item.target_topic, SENT, None, broker_name, message.msg_id
            )
    return found


def _messages_since(store: MessageStore, topic: str, since: int) -> Iterable[MessageExt]:
    """Messages of ``topic``'s queues on one broker stored at or after ``since`` (bodies as stored)."""
    for queue_topic, queue_id in store.queues():
        if queue_topic != topic:
            continue
        for offset in range(store.offset_by_time(topic, queue_id, since), store.max_offset(topic, queue_id)):
            message = store.message_at(topic, queue_id, offset, decompress=False)
            if message is not None:
                yield message


def _redrive_message(store: MessageStore, item: _Item, request_id: str) -> Message:
    """The new message for a dead letter, read from its broker's ``%DLQ%`` queue.

    Raises:
        LakeError: the broker's log has no such dead letter.
    """
    dead = _dead_letter(store, c.DLQ_GROUP_TOPIC_PREFIX + item.group, decode_msg_id(item.msg_id)[1])
    if dead is None or dead.msg_id != item.msg_id:
        raise LakeError(
            f"dead letter {item.msg_id} is not in {c.DLQ_GROUP_TOPIC_PREFIX + item.group} on broker "
            f"{item.broker_name!r}; run route_dlq and choose again (nothing was written)"
        )
    properties = {k: v for k, v in dead.properties.items() if k not in STRIPPED_PROPERTIES}
    properties[PROPERTY_DLQ_MSG_ID] = item.msg_id
    properties[PROPERTY_REDRIVE_REQUEST_ID] = request_id
    return Message(topic=item.target_topic, body=dead.body, flag=dead.flag, properties=properties)


def _dead_letter(store: MessageStore, topic: str, commit_log_offset: int) -> MessageExt | None:
    """The record at ``commit_log_offset`` in ``topic``'s queues (binary search: commit log
    offsets rise with queue offsets), body decompressed; None when absent."""
    for queue_topic, queue_id in store.queues():
        if queue_topic != topic:
            continue
        low, high = 0, store.max_offset(topic, queue_id) - 1
        while low <= high:
            middle = (low + high) // 2
            message = store.message_at(topic, queue_id, middle)
            if message is None:
                break
            if message.commit_log_offset == commit_log_offset:
                return message
            low, high = (middle + 1, high) if message.commit_log_offset < commit_log_offset else (low, middle - 1)
    return None


def _append_ledger(lake: Lake, request_id: str, entries: Sequence[tuple[_Item, str]]) -> None:
    """One ``dlq_redrives`` commit: a row per (item, state), stamped now."""
    now = time.time_ns() // 1_000_000
    operator = f"{getpass.getuser()}@{socket.gethostname()}"
    rows = [
        {
            "request_id": request_id,
            "broker_name": item.broker_name,
            "msg_id": item.msg_id,
            "group": item.group,
            "target_topic": item.target_topic,
            "state": state,
            "new_msg_id": item.new_msg_id if state == SENT else None,
            "new_broker_name": item.new_broker_name if state == SENT else None,
            "updated_timestamp": now,
            "operator": operator,
        }
        for item, state in entries
    ]
    if lake.append(DLQ_REDRIVES, lake.spark.createDataFrame(rows, spark_schema(DLQ_REDRIVES))) is None:
        raise LakeError("the dlq_redrives commit was skipped; run the redrive again")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _lake(spark: SparkSession, lake: str | Path | None) -> Lake:
    return Lake(spark, default_lake() if lake is None else Path(lake))


def _read_dlq(lake: Lake) -> DataFrame:
    if not lake.exists(DLQ):
        raise LakeError(
            f"lake {str(lake.root)!r} has no dlq table; build it with: python -m jobs route_dlq --lake {lake.root}"
        )
    return lake.read(DLQ)


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
    brokers = read_table(
        lake.root, BROKERS, ["broker_name", "segment_size", "started_timestamp"], [("broker_name", "=", broker_name)]
    ).to_pylist()
    offset = decode_msg_id(msg_id)[1]
    filters: list[tuple[str, str, Any]] = [("broker_name", "=", broker_name), ("commit_log_offset", "=", offset)]
    if brokers:
        size = max(brokers, key=lambda r: r["started_timestamp"])["segment_size"]
        filters.append(("segment", "=", offset - offset % size))
    rows = read_table(lake.root, COMMITLOG, ["flag", "sys_flag"], filters).to_pylist()
    return (rows[0]["flag"], rows[0]["sys_flag"]) if rows else None


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


def _hex_id(value: object, field: str) -> str:
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


def _time(epoch_ms: int | None) -> str:
    return "-" if epoch_ms is None else iso_utc(epoch_ms)


def _table(lines: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]
