"""The resolve_transactions job: its transforms on hand-built commit logs, its summary, its runs.

Commit logs are written with :class:`_Log`, which lays records out as a broker does (contiguous
commit log offsets of RocketMQ's record length, one queue offset counter per queue) and writes
transactions the way the broker stores them: half records in the half topic, re-put copies with
``TRANSACTION_CHECK_TIMES``, op records tagged ``d`` whose body is the half queue offset, final
records of COMMIT type pointing at the half they end, discard records in the check-max topic.
Times are offsets from ``T0`` so the ages can be checked by eye.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from broker_model.common import constants as c
from jobs.cli import format_age
from jobs.lake import Lake
from jobs.resolve_transactions import (
    ResolveTransactionsConfig,
    TransactionSummary,
    build_config,
    build_discards,
    build_finals,
    build_half_records,
    build_ops,
    build_transaction_state,
    format_summary,
    main,
    run,
)
from schemas.catalog import COMMITLOG, JOB_RUNS, TRANSACTION_RECORDS, TRANSACTION_STATE, spark_schema
from schemas.errors import LakeError, ValidationError
from tests.builders import commitlog_frame, commitlog_record
from tests.helpers import ENGINE, assert_frames_equal

T0 = 1_700_000_000_000
TIMEOUT = 6000
STORE_HOST = "10.0.0.1:10911"

_HALF_SCHEMA = (
    "broker_name string, queue_id int, queue_offset long, commit_log_offset long, born_timestamp long, "
    "store_timestamp long, producer_group string, uniq_key string, real_topic string, real_queue_id int, "
    "check_times int, prepared_queue_offset long, has_check_immunity boolean, check_immunity_ms long"
)
_OP_SCHEMA = (
    "broker_name string, queue_id int, op_queue_offset long, op_commit_log_offset long, store_timestamp long, "
    "removes boolean, half_queue_offset long"
)
_FINAL_SCHEMA = (
    "broker_name string, final_commit_log_offset long, prepared_transaction_offset long, topic string, "
    "queue_id int, store_timestamp long, producer_group string, uniq_key string"
)
_DISCARD_SCHEMA = (
    "broker_name string, discard_commit_log_offset long, store_timestamp long, producer_group string, "
    "uniq_key string, check_times int"
)
_BRIEF_SCHEMA = "uniq_key string, state string, check_times int, anomaly string"

Row = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Hand-built commit logs
# ---------------------------------------------------------------------------------------------


@dataclass
class _Log:
    """One broker's commit log being written, record by record."""

    broker: str = "broker-a"
    rows: list[Row] = field(default_factory=list)
    next_offset: int = 0
    queues: dict[tuple[str, int], int] = field(default_factory=dict)

    def put(
        self,
        topic: str,
        properties: dict[str, str],
        *,
        store: int,
        born: int | None = None,
        queue_id: int = 0,
        sys_flag: int = 0,
        body: bytes = b"body",
        prepared: int = 0,
    ) -> Row:
        """Append a record with every commit log column filled; returns it."""
        queue_offset = self.queues.get((topic, queue_id), 0)
        self.queues[(topic, queue_id)] = queue_offset + 1
        row = commitlog_record(
            broker_name=self.broker,
            topic=topic,
            queue_id=queue_id,
            queue_offset=queue_offset,
            body=body,
            properties=properties,
            sys_flag=sys_flag,
            commit_log_offset=self.next_offset,
            store_timestamp=store,
            born_timestamp=born,
            store_host=STORE_HOST,
            prepared_transaction_offset=prepared,
        )
        self.rows.append(row)
        self.next_offset += row["store_size"]
        return row

    def half(
        self,
        uniq: str | None,
        *,
        born: int,
        store: int | None = None,
        group: str = "pg",
        extra: dict[str, str] | None = None,
    ) -> Row:
        """A half message of ``uniq`` (its real destination is Orders queue 1)."""
        properties = {"TRAN_MSG": "true", "PGROUP": group, "REAL_TOPIC": "Orders", "REAL_QID": "1"}
        if uniq is not None:
            properties |= {"UNIQ_KEY": uniq, "__transactionId__": uniq}
        return self.put(
            c.RMQ_SYS_TRANS_HALF_TOPIC,
            properties | (extra or {}),
            store=born + 1 if store is None else store,
            born=born,
        )

    def copy(self, half: Row, checks: int, *, store: int) -> Row:
        """The re-put copy that check round ``checks`` writes before its check-back."""
        properties = half["properties"] | {"TRANSACTION_CHECK_TIMES": str(checks)}
        return self.put(c.RMQ_SYS_TRANS_HALF_TOPIC, properties, store=store, born=half["born_timestamp"])

    def op(self, body: str, *, store: int, tags: str = "d") -> Row:
        """An op record with ``body`` (as the broker writes it: WAIT and TAGS only)."""
        return self.put(c.RMQ_SYS_TRANS_OP_HALF_TOPIC, {"WAIT": "true", "TAGS": tags}, store=store, body=body.encode())

    def end(self, half: Row, *, store: int) -> Row:
        """The op record ending ``half`` (original or copy)."""
        return self.op(str(half["queue_offset"]), store=store)

    def final(self, half: Row, *, store: int) -> Row:
        """The committed message of ``half`` in its real topic."""
        properties = half["properties"]
        return self.put(
            properties["REAL_TOPIC"],
            properties,
            store=store,
            born=half["born_timestamp"],
            queue_id=int(properties["REAL_QID"]),
            sys_flag=c.TRANSACTION_COMMIT_TYPE,
            prepared=half["commit_log_offset"],
        )

    def discard(self, half: Row, *, store: int) -> Row:
        """The discard copy of ``half`` in TRANS_CHECK_MAX_TIME_TOPIC."""
        return self.put(c.TRANS_CHECK_MAX_TIME_TOPIC, half["properties"], store=store, born=half["born_timestamp"])

    def frame(self, spark: SparkSession, *others: _Log) -> DataFrame:
        """This log's rows (and those of ``others``) as a commitlog frame."""
        return commitlog_frame(spark, [row for log in (self, *others) for row in log.rows])


def _states(spark: SparkSession, commitlog_df: DataFrame, as_of: int, **settings: int) -> DataFrame:
    return build_transaction_state(
        build_half_records(commitlog_df),
        build_ops(commitlog_df),
        build_finals(commitlog_df),
        build_discards(commitlog_df),
        as_of,
        **settings,
    )


def _brief(df: DataFrame) -> DataFrame:
    return df.select("uniq_key", "state", "check_times", "anomaly")


def _expected_brief(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, _BRIEF_SCHEMA)


def _state_row(
    half: Row,
    state: str,
    as_of: int,
    *,
    checks: int = 0,
    op: Row | None = None,
    final: Row | None = None,
    anomaly: str | None = None,
) -> tuple[Any, ...]:
    """The expected transaction_state row of the transaction whose original is ``half``."""
    properties = half["properties"]
    return (
        half["broker_name"],
        properties["PGROUP"],
        half["uniq_key"],
        half["queue_offset"],
        half["commit_log_offset"],
        properties["REAL_TOPIC"],
        int(properties["REAL_QID"]),
        state,
        checks,
        None if op is None else op["queue_offset"],
        None if final is None else final["commit_log_offset"],
        half["born_timestamp"],
        as_of,
        anomaly,
    )


def _orphan_row(broker: str, half_queue_offset: int, op: Row, as_of: int) -> tuple[Any, ...]:
    return (
        broker,
        None,
        None,
        half_queue_offset,
        -1,
        None,
        None,
        "ROLLED_BACK",
        None,
        op["queue_offset"],
        None,
        None,
        as_of,
        "OP_WITHOUT_HALF",
    )


def _table(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, spark_schema(TRANSACTION_STATE))


# ---------------------------------------------------------------------------------------------
# Record builders
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_half_records_decode_the_transaction_properties_of_originals_and_copies(spark: SparkSession) -> None:
    log = _Log()
    log.put("Orders", {"UNIQ_KEY": "plain"}, store=T0)  # not a half
    half = log.half("tx", born=T0, extra={"CHECK_IMMUNITY_TIME_IN_SECONDS": "abc"})
    copy = log.copy(half, 2, store=T0 + 60_000)
    immune = log.put(
        c.RMQ_SYS_TRANS_HALF_TOPIC,
        half["properties"]
        | {"CHECK_IMMUNITY_TIME_IN_SECONDS": "30", "TRAN_PREPARED_QUEUE_OFFSET": "1", "REAL_QID": "x"},
        store=T0 + 9,
    )
    log.put(
        c.RMQ_SYS_TRANS_HALF_TOPIC, half["properties"], store=T0 + 10, sys_flag=c.TRANSACTION_PREPARED_TYPE
    )  # a prepared record never reaches the half queue

    expected = [
        ("broker-a", 0, 0, half["commit_log_offset"], T0, T0 + 1, "pg", "tx", "Orders", 1, None, None, True, None),
        ("broker-a", 0, 1, copy["commit_log_offset"], T0, T0 + 60_000, "pg", "tx", "Orders", 1, 2, None, True, None),
        (
            "broker-a",
            0,
            2,
            immune["commit_log_offset"],
            T0 + 9,
            T0 + 9,
            "pg",
            "tx",
            "Orders",
            None,
            None,
            1,
            True,
            30_000,
        ),
    ]
    assert_frames_equal(build_half_records(log.frame(spark)), spark.createDataFrame(expected, _HALF_SCHEMA))


@pytest.mark.spark
def test_ops_list_single_and_batched_offsets_and_keep_other_tags(spark: SparkSession) -> None:
    log = _Log()
    single = log.op("7", store=T0)
    batched = log.op("5,6,9,", store=T0 + 1)  # the 5.1+ form, trailing comma
    other_tag = log.op("3", store=T0 + 2, tags="x")
    garbled = log.op("x,4", store=T0 + 3)
    empty = log.op("", store=T0 + 4)

    def rows(op: Row, removes: bool, *offsets: int | None) -> list[tuple[Any, ...]]:
        place = ("broker-a", 0, op["queue_offset"], op["commit_log_offset"], op["store_timestamp"], removes)
        return [(*place, offset) for offset in offsets]

    expected = [
        *rows(single, True, 7),
        *rows(batched, True, 5, 6, 9),
        *rows(other_tag, False, 3),
        *rows(garbled, True, -1, 4),
        *rows(empty, True, None),
    ]
    assert_frames_equal(build_ops(log.frame(spark)), spark.createDataFrame(expected, _OP_SCHEMA))


@pytest.mark.spark
def test_finals_are_the_commit_type_records_only(spark: SparkSession) -> None:
    log = _Log()
    half = log.half("tx", born=T0)
    final = log.final(half, store=T0 + 2)
    log.put("Orders", {"UNIQ_KEY": "rolled"}, store=T0 + 3, sys_flag=c.TRANSACTION_ROLLBACK_TYPE)
    log.put("Orders", {"UNIQ_KEY": "plain"}, store=T0 + 4)
    for topic in ("%RETRY%cg", "%DLQ%cg", c.SCHEDULE_TOPIC):  # send-back copies keep the sys flag
        log.put(topic, {"UNIQ_KEY": "tx", "PGROUP": "pg"}, store=T0 + 5, sys_flag=c.TRANSACTION_COMMIT_TYPE)

    expected = [("broker-a", final["commit_log_offset"], half["commit_log_offset"], "Orders", 1, T0 + 2, "pg", "tx")]
    assert_frames_equal(build_finals(log.frame(spark)), spark.createDataFrame(expected, _FINAL_SCHEMA))


@pytest.mark.spark
def test_discards_are_the_records_of_the_check_max_topic(spark: SparkSession) -> None:
    log = _Log()
    half = log.half("tx", born=T0)
    copy = log.copy(half, 15, store=T0 + 900_000)
    discard = log.discard(copy, store=T0 + 960_000)
    bare = log.put(c.TRANS_CHECK_MAX_TIME_TOPIC, {"PGROUP": "pg"}, store=T0 + 960_001)  # no uniq key, no count

    expected = [
        ("broker-a", discard["commit_log_offset"], T0 + 960_000, "pg", "tx", 15),
        ("broker-a", bare["commit_log_offset"], T0 + 960_001, "pg", None, None),
    ]
    assert_frames_equal(build_discards(log.frame(spark)), spark.createDataFrame(expected, _DISCARD_SCHEMA))


# ---------------------------------------------------------------------------------------------
# build_transaction_state
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_commit_and_rollbacks_of_originals_with_single_and_batched_ops(spark: SparkSession) -> None:
    log = _Log()
    committed, rolled_a, rolled_b = (log.half(u, born=T0 + i) for i, u in enumerate(("c", "r1", "r2")))
    final = log.final(committed, store=T0 + 10)
    commit_op = log.end(committed, store=T0 + 11)
    batch_op = log.op(f"{rolled_a['queue_offset']},{rolled_b['queue_offset']},", store=T0 + 12)
    as_of = T0 + 20

    expected = [
        _state_row(committed, "COMMITTED", as_of, op=commit_op, final=final),
        _state_row(rolled_a, "ROLLED_BACK", as_of, op=batch_op),
        _state_row(rolled_b, "ROLLED_BACK", as_of, op=batch_op),
    ]
    assert_frames_equal(_states(spark, log.frame(spark), as_of), _table(spark, expected))


@pytest.mark.spark
def test_copies_resolve_to_their_original_and_an_op_on_a_copy_ends_it(spark: SparkSession) -> None:
    log = _Log()
    half = log.half("tx", born=T0)
    log.copy(half, 1, store=T0 + 60_000)
    second = log.copy(half, 2, store=T0 + 120_000)
    final = log.final(second, store=T0 + 120_005)  # the check-back answer commits the copy
    op = log.end(second, store=T0 + 120_006)
    as_of = T0 + 200_000

    expected = [_state_row(half, "COMMITTED", as_of, checks=2, op=op, final=final, anomaly="OP_ON_REPUT_COPY")]
    assert_frames_equal(_states(spark, log.frame(spark), as_of), _table(spark, expected))


@pytest.mark.spark
def test_undecided_halves_are_pending_inside_the_timeout_and_due_from_it_on(spark: SparkSession) -> None:
    log = _Log()
    as_of = T0 + 100_000
    for uniq, age in (("just-born", 0), ("almost", TIMEOUT - 1), ("timed-out", TIMEOUT), ("future", -1)):
        log.half(uniq, born=as_of - age, store=as_of)

    expected = [
        ("just-born", "PENDING", 0, None),
        ("almost", "PENDING", 0, None),
        ("timed-out", "CHECK_DUE", 0, None),
        ("future", "CHECK_DUE", 0, None),
    ]  # born after T by the producer's clock: checked at once
    assert_frames_equal(_brief(_states(spark, log.frame(spark), as_of)), _expected_brief(spark, expected))


@pytest.mark.spark
def test_check_immunity_replaces_the_timeout(spark: SparkSession) -> None:
    log = _Log()
    as_of = T0 + 100_000

    def immune(uniq: str, seconds: str, age: int) -> None:
        log.half(uniq, born=as_of - age, store=as_of, extra={"CHECK_IMMUNITY_TIME_IN_SECONDS": seconds})

    immune("long", "60", 59_999)
    immune("long-over", "60", 60_000)
    immune("short", "1", 2000)  # due before the 6 s timeout: no timeout minimum
    immune("not-a-number", "abc", TIMEOUT - 1)  # falls back to the timeout
    immune("minus-one", "-1", TIMEOUT)

    expected = [
        ("long", "PENDING", 0, None),
        ("long-over", "CHECK_DUE", 0, None),
        ("short", "CHECK_DUE", 0, None),
        ("not-a-number", "PENDING", 0, None),
        ("minus-one", "CHECK_DUE", 0, None),
    ]
    assert_frames_equal(_brief(_states(spark, log.frame(spark), as_of)), _expected_brief(spark, expected))


@pytest.mark.spark
def test_reaching_the_check_limit_discards_without_a_discard_record(spark: SparkSession) -> None:
    log = _Log()
    below, reached = log.half("below", born=T0), log.half("reached", born=T0 + 1)
    for checks in (1, 2):
        log.copy(below, checks, store=T0 + 60_000 * checks)
    for checks in (1, 2, 3):
        log.copy(reached, checks, store=T0 + 60_000 * checks + 1)

    expected = [("below", "CHECK_DUE", 2, None), ("reached", "DISCARDED", 3, None)]
    actual = _states(spark, log.frame(spark), T0 + 600_000, check_max=3)
    assert_frames_equal(_brief(actual), _expected_brief(spark, expected))


@pytest.mark.spark
def test_a_discard_record_discards_but_a_later_op_still_ends_the_transaction(spark: SparkSession) -> None:
    log = _Log()
    discarded, revived = log.half("discarded", born=T0), log.half("revived", born=T0 + 1)
    log.discard(discarded, store=T0 + 60_000)
    log.discard(revived, store=T0 + 60_001)
    log.end(revived, store=T0 + 60_002)  # the producer still rolls it back

    expected = [("discarded", "DISCARDED", 0, None), ("revived", "ROLLED_BACK", 0, None)]
    assert_frames_equal(_brief(_states(spark, log.frame(spark), T0 + 100_000)), _expected_brief(spark, expected))


@pytest.mark.spark
def test_halves_older_than_the_file_reserve_time_expire_unless_discarded(spark: SparkSession) -> None:
    log, reserve = _Log(), 100_000
    as_of = T0 + 1_000_000
    log.half("at-reserve", born=as_of - reserve)
    log.half("expired", born=as_of - reserve - 1)
    log.discard(log.half("discarded", born=as_of - reserve - 1), store=as_of - 10)
    log.end(log.half("ended", born=as_of - reserve - 1), store=as_of - 10)

    expected = [
        ("at-reserve", "CHECK_DUE", 0, None),
        ("expired", "EXPIRED", 0, None),
        ("discarded", "DISCARDED", 0, None),
        ("ended", "ROLLED_BACK", 0, None),
    ]
    actual = _states(spark, log.frame(spark), as_of, reserve_ms=reserve)
    assert_frames_equal(_brief(actual), _expected_brief(spark, expected))


@pytest.mark.spark
def test_only_records_stored_at_or_before_as_of_count(spark: SparkSession) -> None:
    log = _Log()
    as_of = T0 + 100_000
    late_op = log.half("op-too-late", born=T0)
    on_time = log.half("on-time", born=T0 + 1)
    log.half("half-too-late", born=T0 + 2, store=as_of + 1)
    log.final(on_time, store=as_of)
    log.end(on_time, store=as_of)
    log.end(late_op, store=as_of + 1)

    expected = [("op-too-late", "CHECK_DUE", 0, None), ("on-time", "COMMITTED", 0, None)]
    assert_frames_equal(_brief(_states(spark, log.frame(spark), as_of)), _expected_brief(spark, expected))


@pytest.mark.spark
def test_ops_without_half_get_rows_of_their_own(spark: SparkSession) -> None:
    log = _Log()
    half = log.half("tx", born=T0)
    log.op(str(half["queue_offset"]), store=T0 + 10, tags="x")  # not "d": ignored, tx stays undecided
    log.op("", store=T0 + 11)  # ends nothing
    orphan = log.op("42", store=T0 + 12)
    log.op("42", store=T0 + 13)  # a second op for the same missing half: one row, the first op
    garbled = log.op("x", store=T0 + 14)
    as_of = T0 + 100_000

    expected = [
        _state_row(half, "CHECK_DUE", as_of),
        _orphan_row("broker-a", 42, orphan, as_of),
        _orphan_row("broker-a", -1, garbled, as_of),
    ]
    assert_frames_equal(_states(spark, log.frame(spark), as_of), _table(spark, expected))


@pytest.mark.spark
def test_final_without_op_and_double_commits_are_reported(spark: SparkSession) -> None:
    log = _Log()
    crashed, twice, twice_no_op = (log.half(u, born=T0 + i) for i, u in enumerate(("crashed", "twice", "both")))
    crashed_final = log.final(crashed, store=T0 + 10)  # the broker died before the op
    first_final = log.final(twice, store=T0 + 11)
    first_op = log.end(twice, store=T0 + 12)
    copy = log.copy(twice, 1, store=T0 + 60_000)  # a check raced the producer's own commit
    log.final(copy, store=T0 + 60_001)
    log.end(copy, store=T0 + 60_002)
    both_final = log.final(twice_no_op, store=T0 + 60_003)
    log.final(twice_no_op, store=T0 + 60_004)
    as_of = T0 + 100_000

    expected = [
        _state_row(crashed, "CHECK_DUE", as_of, final=crashed_final, anomaly="FINAL_WITHOUT_OP"),
        _state_row(twice, "COMMITTED", as_of, checks=1, op=first_op, final=first_final, anomaly="DOUBLE_COMMIT"),
        _state_row(twice_no_op, "CHECK_DUE", as_of, final=both_final, anomaly="FINAL_WITHOUT_OP,DOUBLE_COMMIT"),
    ]
    assert_frames_equal(_states(spark, log.frame(spark), as_of), _table(spark, expected))


@pytest.mark.spark
def test_each_broker_resolves_its_own_offsets_and_groups_tell_transactions_apart(spark: SparkSession) -> None:
    broker_a, broker_b = _Log("broker-a"), _Log("broker-b")
    a = broker_a.half("tx", born=T0)
    b = broker_b.half("tx", born=T0)  # same uniq key and the same offsets, on another broker
    other_group = broker_a.half("tx", born=T0 + 1, group="pg2")
    op = broker_b.end(b, store=T0 + 5)
    as_of = T0 + 100_000

    expected = [
        _state_row(a, "CHECK_DUE", as_of),
        _state_row(b, "ROLLED_BACK", as_of, op=op),
        _state_row(other_group, "CHECK_DUE", as_of),
    ]
    assert_frames_equal(_states(spark, broker_a.frame(spark, broker_b), as_of), _table(spark, expected))


@pytest.mark.spark
def test_a_resent_half_is_a_duplicate_and_halves_without_uniq_key_stand_alone(spark: SparkSession) -> None:
    log = _Log()
    first = log.half("resent", born=T0)
    resent = log.half("resent", born=T0 + 3000)  # a send retry: same uniq key, no check count
    op = log.end(resent, store=T0 + 3005)
    keyless_a, keyless_b = log.half(None, born=T0 + 4), log.half(None, born=T0 + 5)
    as_of = T0 + 100_000

    expected = [
        _state_row(first, "ROLLED_BACK", as_of, op=op, anomaly="OP_ON_REPUT_COPY,DUPLICATE_HALF"),
        _state_row(keyless_a, "CHECK_DUE", as_of),
        _state_row(keyless_b, "CHECK_DUE", as_of),
    ]
    assert_frames_equal(_states(spark, log.frame(spark), as_of), _table(spark, expected))


@pytest.mark.spark
def test_no_records_give_an_empty_table_with_the_catalog_columns(spark: SparkSession) -> None:
    assert_frames_equal(_states(spark, _Log().frame(spark), T0), _table(spark, []))


# ---------------------------------------------------------------------------------------------
# Summary, settings, command line
# ---------------------------------------------------------------------------------------------


def test_summary_lists_every_state_the_anomalies_and_the_oldest_due_checks() -> None:
    due = {
        "broker_name": "broker-a",
        "producer_group": "pg",
        "uniq_key": "AC1",
        "real_topic": "Orders",
        "real_queue_id": 1,
        "half_queue_offset": 7,
        "check_times": 2,
        "born_timestamp": T0 - 3_723_004,
    }
    summary = TransactionSummary(
        T0, {"COMMITTED": 5, "CHECK_DUE": 3}, {"DOUBLE_COMMIT": 1, "OP_WITHOUT_HALF": 2}, [due], ignored_ops=4
    )

    assert format_summary(summary) == [
        "transaction state as of 2023-11-14T22:13:20.000Z (1700000000000): 8 transactions",
        "COMMITTED    5",
        "ROLLED_BACK  0",
        "DISCARDED    0",
        "EXPIRED      0",
        "PENDING      0",
        "CHECK_DUE    3",
        "anomalies: OP_WITHOUT_HALF 2, DOUBLE_COMMIT 1",
        'op records ignored (tag is not "d"): 4',
        "check-back due now: 3",
        "#Broker Name  #Producer Group  #Uniq Key  #Real Topic  #QID  #Half Offset  #Checks  #Age",
        "broker-a      pg               AC1        Orders       1     7             2        1h 2m 3.004s",
        "... and 2 more",
    ]


def test_summary_of_an_empty_table_says_none() -> None:
    assert format_summary(TransactionSummary(T0))[-2:] == ["anomalies: none", "check-back due now: 0"]


@pytest.mark.parametrize(
    ("millis", "text"),
    [(0, "0s"), (999, "0.999s"), (6000, "6s"), (90_061_001, "1d 1h 1m 1.001s"), (3_600_000, "1h"), (-1500, "-1.500s")],
)
def test_ages_print_for_people(millis: int, text: str) -> None:
    assert format_age(millis) == text


def test_command_line_takes_iso_instants_and_the_check_settings() -> None:
    config = build_config(
        [
            "--lake",
            "/l",
            "--as-of",
            "2026-11-22T10:00:00+08:00",
            "--timeout-ms",
            "3000",
            "--check-max",
            "5",
            "--reserve-ms",
            "60000",
            "--show",
            "3",
        ]
    )
    assert config == ResolveTransactionsConfig(Path("/l"), 1_795_312_800_000, 3000, 5, 60_000, "auto", 3)
    assert config.parameters == {"as_of": 1795312800000, "timeout_ms": 3000, "check_max": 5, "reserve_ms": 60000}


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--as-of", "2026-11-22T02:00:00"], r"--as-of.*no time zone"),
        (["--as-of", "0", "--check-max", "0"], r"check_max=0: is below 1"),
        (["--as-of", "0", "--timeout-ms", "-1"], r"timeout_ms=-1: is below 0"),
    ],
)
def test_command_line_refuses_bad_settings_before_starting_spark(argv: list[str], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        main(argv)


# ---------------------------------------------------------------------------------------------
# run() on real Delta tables
# ---------------------------------------------------------------------------------------------

AS_OF = T0 + 3_600_000  # one hour after T0
RESERVE_HOURS_MS = 72 * 3_600_000


@dataclass
class _Scenario:
    """A broker log with every path a transaction can take, and the expected table at AS_OF."""

    log: _Log
    expected: list[tuple[Any, ...]]


def _scenario() -> _Scenario:
    log, expected = _Log(), []
    old = log.half("expired", born=AS_OF - RESERVE_HOURS_MS - 1)
    expected.append(_state_row(old, "EXPIRED", AS_OF))
    log.put("Orders", {"UNIQ_KEY": "plain", "TAGS": "t"}, store=T0)  # an ordinary message

    commit = log.half("commit", born=T0)
    final = log.final(commit, store=T0 + 5)
    expected.append(_state_row(commit, "COMMITTED", AS_OF, op=log.end(commit, store=T0 + 6), final=final))

    rollback = log.half("rollback", born=T0 + 10)
    expected.append(_state_row(rollback, "ROLLED_BACK", AS_OF, op=log.end(rollback, store=T0 + 12)))

    checked = log.half("checked", born=T0 + 20)
    log.copy(checked, 1, store=T0 + 60_000)
    copy = log.copy(checked, 2, store=T0 + 120_000)
    final = log.final(copy, store=T0 + 120_010)
    op = log.end(copy, store=T0 + 120_011)
    expected.append(_state_row(checked, "COMMITTED", AS_OF, checks=2, op=op, final=final, anomaly="OP_ON_REPUT_COPY"))

    given_up = log.half("given-up", born=T0 + 30)
    copies = [log.copy(given_up, n, store=T0 + 30 + 60_000 * n) for n in range(1, 16)]
    log.discard(copies[-1], store=T0 + 30 + 60_000 * 16)
    expected.append(_state_row(given_up, "DISCARDED", AS_OF, checks=15))

    due = log.half("due", born=T0 + 40)
    log.copy(due, 1, store=T0 + 60_040)
    expected.append(_state_row(due, "CHECK_DUE", AS_OF, checks=1))

    crashed = log.half("crashed", born=T0 + 50)
    final = log.final(crashed, store=T0 + 55)
    expected.append(_state_row(crashed, "CHECK_DUE", AS_OF, final=final, anomaly="FINAL_WITHOUT_OP"))

    twice = log.half("twice", born=T0 + 60)
    first_final, first_op = log.final(twice, store=T0 + 61), log.end(twice, store=T0 + 62)
    copy = log.copy(twice, 1, store=T0 + 60_060)
    log.final(copy, store=T0 + 60_061)
    log.end(copy, store=T0 + 60_062)
    expected.append(
        _state_row(twice, "COMMITTED", AS_OF, checks=1, op=first_op, final=first_final, anomaly="DOUBLE_COMMIT")
    )

    orphan = log.op("9999", store=T0 + 70)
    expected.append(_orphan_row("broker-a", 9999, orphan, AS_OF))
    log.op("0", store=T0 + 71, tags="x")  # ignored for its tag

    pending = log.half("pending", born=AS_OF - 1000)
    expected.append(_state_row(pending, "PENDING", AS_OF))
    log.end(pending, store=AS_OF + 1)  # after T: ignored
    return _Scenario(log, expected)


@pytest.fixture(scope="module")
def template_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, _Scenario]]:
    """A lake whose commit log holds the scenario, written once; tests work on copies."""
    root = tmp_path_factory.mktemp("template-lake")
    scenario = _scenario()
    Lake(spark, root, ENGINE).append(COMMITLOG, scenario.log.frame(spark))
    yield root, scenario
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, template_lake: tuple[Path, _Scenario]) -> Lake:
    shutil.copytree(template_lake[0], tmp_path / "lake")
    return Lake(spark, tmp_path / "lake", ENGINE)


def _runs(lake: Lake) -> list[str]:
    return [row["status"] for row in lake.read(JOB_RUNS).orderBy("started_timestamp", "run_id").collect()]


@pytest.mark.spark
def test_run_resolves_every_path_of_a_broker_log(
    spark: SparkSession, lake: Lake, template_lake: tuple[Path, _Scenario], capsys: pytest.CaptureFixture[str]
) -> None:
    job_run = run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE))
    out = capsys.readouterr().out

    assert_frames_equal(lake.read(TRANSACTION_STATE), _table(spark, template_lake[1].expected))
    assert job_run.status == "SUCCEEDED"
    assert job_run.input_versions == {
        "commitlog": lake.version(COMMITLOG),
        "transaction_records": lake.version(TRANSACTION_RECORDS),
    }
    assert job_run.output_versions == {"transaction_state": lake.version(TRANSACTION_STATE)}
    assert job_run.row_counts == {
        "half_records": 28,
        "op_records": 7,
        "ignored_op_records": 1,
        "final_records": 5,
        "discard_records": 1,
        "new_transaction_records": 42,
        "transaction_state": 10,
    }
    assert lake.read(TRANSACTION_RECORDS).count() == 42  # 28 + 7 + 5 + 1 and the op after T
    assert "anomalies: OP_WITHOUT_HALF 1, FINAL_WITHOUT_OP 1, DOUBLE_COMMIT 1, OP_ON_REPUT_COPY 1" in out
    assert "check-back due now: 2" in out
    assert "broker-a      pg               due        Orders       1     " in out


@pytest.mark.spark
def test_rerun_with_the_same_inputs_and_settings_commits_nothing(spark: SparkSession, lake: Lake) -> None:
    config = ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE)
    first = run(spark, config)
    version = lake.version(TRANSACTION_STATE)

    second = run(spark, config)

    assert (first.status, second.status) == ("SUCCEEDED", "NOOP")
    assert lake.version(TRANSACTION_STATE) == version
    assert second.output_versions == {"transaction_state": version}
    assert second.row_counts == {**first.row_counts, "new_transaction_records": 0}
    assert second.input_versions == first.input_versions
    assert _runs(lake) == ["SUCCEEDED", "NOOP"]

    third = run(spark, ResolveTransactionsConfig(lake.root, AS_OF, check_max=1, engine=ENGINE))

    assert third.status == "SUCCEEDED"  # another setting: computed again
    assert lake.version(TRANSACTION_STATE) == (version or 0) + 1
    due = lake.read(TRANSACTION_STATE).where("uniq_key = 'due'").first()
    assert due is not None and due["state"] == "DISCARDED"


@pytest.mark.spark
def test_a_run_reads_only_the_new_commit_log_versions_and_resolves_as_a_full_one(
    spark: SparkSession, tmp_path: Path, template_lake: tuple[Path, _Scenario]
) -> None:
    scenario = template_lake[1]
    log_df = scenario.log.frame(spark)
    split = log_df.orderBy("commit_log_offset").collect()[30]["commit_log_offset"]
    lake = Lake(spark, tmp_path / "lake", ENGINE)
    lake.append(COMMITLOG, log_df.where(f"commit_log_offset < {split}"))
    first = run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE))
    lake.append(COMMITLOG, log_df.where(f"commit_log_offset >= {split}"))

    second = run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE))

    assert first.row_counts["new_transaction_records"] + second.row_counts["new_transaction_records"] == 42
    assert 0 < second.row_counts["new_transaction_records"] < 42
    appended = first.input_versions["transaction_records"] + 1
    assert second.input_versions == {"commitlog": lake.version(COMMITLOG), "transaction_records": appended}
    assert_frames_equal(lake.read(TRANSACTION_STATE), _table(spark, scenario.expected))
    assert lake.read(TRANSACTION_RECORDS).count() == 42

    records_version = lake.version(TRANSACTION_RECORDS)
    # a commit that adds nothing, from delta-rs (delta-spark commits no version for an empty frame)
    lake.append_rows(COMMITLOG, COMMITLOG.arrow_schema.empty_table())

    full = run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE, full=True))

    assert full.row_counts["new_transaction_records"] == 42
    assert lake.version(TRANSACTION_RECORDS) == (records_version or 0) + 1
    assert lake.read(TRANSACTION_RECORDS).count() == 42
    assert_frames_equal(lake.read(TRANSACTION_STATE), _table(spark, scenario.expected))
    again = run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE, full=True))
    assert (again.status, again.row_counts["new_transaction_records"]) == ("NOOP", 0)


@pytest.mark.spark
def test_a_commit_log_that_lost_rows_is_read_whole_and_a_replaced_one_is_refused(
    spark: SparkSession, lake: Lake, template_lake: tuple[Path, _Scenario]
) -> None:
    run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE))
    rollback = lake.read(TRANSACTION_STATE).where("uniq_key = 'rollback'").first()
    assert rollback is not None
    lost = (rollback["half_commit_log_offset"], rollback["op_queue_offset"])
    op_topic = c.RMQ_SYS_TRANS_OP_HALF_TOPIC
    kept_df = (
        template_lake[1]
        .log.frame(spark)
        .where(f"commit_log_offset != {lost[0]} AND NOT (topic = '{op_topic}' AND queue_offset = {lost[1]})")
    )
    lake.overwrite(COMMITLOG, kept_df)  # removes files: not an append

    after = run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE))

    assert after.row_counts["new_transaction_records"] == 40  # rebuilt from the whole log: 42 less a half and an op
    assert lake.read(TRANSACTION_STATE).where("uniq_key = 'rollback'").count() == 0
    shutil.rmtree(lake.location(COMMITLOG))
    lake.append(COMMITLOG, kept_df)  # a new table: version 0, behind what was read
    with pytest.raises(LakeError, match="was replaced; delete the transaction_records table"):
        run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE, full=True))
    shutil.rmtree(lake.location(TRANSACTION_RECORDS))
    assert run(spark, ResolveTransactionsConfig(lake.root, AS_OF, engine=ENGINE)).status == "SUCCEEDED"
    assert lake.read(TRANSACTION_RECORDS).count() == 40
