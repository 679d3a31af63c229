"""Redrive of dead letters, for the ``pyspark`` shell: each chosen dead letter is sent again to its
original topic through its broker, once per request (the ``dlq_redrives`` ledger), dry run unless
asked to execute. See docs/jobs.md (the dlq helper).
"""

from __future__ import annotations

import getpass
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.broker import Broker, start_lake_brokers
from broker_model.client import Producer
from broker_model.common import Message, decode_msg_id
from broker_model.common import constants as c
from broker_model.store import MessageExt, MessageStore
from jobs.cli import text_table
from jobs.dlq.inspect import check_hex_id, open_lake, read_dlq
from jobs.dlq.transforms import PENDING, POLICY_NOT_WRITTEN, PROPERTY_ROUTED_BY, SENT
from jobs.lake import Lake
from schemas.catalog import DLQ_REDRIVES, spark_schema
from schemas.errors import BrokerError, LakeError, ValidationError

SEND, SKIP, CHECK = "SEND", "SKIP", "CHECK"  # dry-run actions: new, already SENT, PENDING to look for
SENT_NOW, SKIPPED, RECOVERED = "SENT", "SKIPPED", "RECOVERED"  # outcomes of an executed redrive

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


REDRIVE_PRODUCER_GROUP = "DLQ_REDRIVE_PRODUCER"


# Ledger rows and store times come from two clocks of this process; a little slack makes the
# search for an interrupted run's messages immune to a clock step, at the cost of a few reads.
PENDING_SEARCH_MARGIN_MS = 1000


PLAN_LINES = 20  # rows of a redrive plan printed


_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$")


_RESULT_DDL = (
    "request_id string, broker_name string, msg_id string, group string, target_topic string, action string, "
    "new_broker_name string, new_msg_id string"
)


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
    lake_ = open_lake(spark, lake)
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
    lines = [head, *text_table([header, *shown])]
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
    keys = list(dict.fromkeys((broker, check_hex_id(value, "selection")) for broker, value in pairs))
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
        read_dlq(lake)
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
    """Send each chosen dead letter once per request (docs/jobs.md, the dlq helper, "Redrive");
    the result rows, in ``chosen`` order."""
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
    try:
        return start_lake_brokers(lake.root, names)
    except BrokerError as err:
        raise LakeError(f"cannot redrive: {err}; stop that broker and redrive again (nothing was written)") from err


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
        low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id) - 1
        while low <= high:
            middle = (low + high) // 2
            message = store.message_at(topic, queue_id, middle)
            if message is None:
                break
            if message.commit_log_offset == commit_log_offset:
                return message
            low, high = (middle + 1, high) if message.commit_log_offset < commit_log_offset else (low, middle - 1)
    return None


def _append_ledger(lake: Lake, request_id: str, outcomes: Sequence[tuple[_Item, str]]) -> None:
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
        for item, state in outcomes
    ]
    if lake.append(DLQ_REDRIVES, lake.spark.createDataFrame(rows, spark_schema(DLQ_REDRIVES))) is None:
        raise LakeError("the dlq_redrives commit was skipped; run the redrive again")
