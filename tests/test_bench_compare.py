"""The benchmarks' comparison of a job's table with its DuckDB peer's result (benchmarks/compare.py):
every column, maps in any order, lists in order, and what differs said by column."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

from benchmarks.compare import PeerOutcome, canonical, compare
from schemas.catalog import CONSUMER_OFFSETS, DLQ

KEY = ("group", "broker_name", "msg_id")


def dead_letter(msg_id: str, **changes: Any) -> dict[str, Any]:
    row = {
        "group": "cg",
        "broker_name": "broker-a",
        "msg_id": msg_id,
        "uniq_key": f"u-{msg_id}",
        "origin_msg_id": f"o-{msg_id}",
        "origin_topic": "Orders",
        "reconsume_times": 3,
        "first_failure_timestamp": 10,
        "dlq_timestamp": 20,
        "body": b"\x00body",
        "properties": [("KEYS", "k1"), ("TAGS", "t")],
        "attempts": [
            {
                "broker_name": "broker-a",
                "topic": "Orders",
                "commit_log_offset": 1,
                "reconsume_times": 0,
                "store_timestamp": 5,
            },
            {
                "broker_name": "broker-a",
                "topic": "%RETRY%cg",
                "commit_log_offset": 9,
                "reconsume_times": 1,
                "store_timestamp": 7,
            },
        ],
        "reason": "MAX_RECONSUME_TIMES",
        "redrive_state": None,
    }
    return row | changes


def registered(con: duckdb.DuckDBPyConnection, name: str, rows: list[dict[str, Any]]) -> str:
    con.register(name, pa.Table.from_pylist(rows, schema=DLQ.arrow_schema))
    return name


def test_the_same_rows_in_any_order_with_maps_in_any_order_are_the_same() -> None:
    con = duckdb.connect()
    job = registered(con, "job", [dead_letter("m1"), dead_letter("m2")])
    shuffled = dead_letter("m1", properties=[("TAGS", "t"), ("KEYS", "k1")])
    peer = registered(con, "peer", [dead_letter("m2"), shuffled])

    check = compare(con, DLQ, job, peer, KEY)

    assert check.same and check.differences() == []
    assert (check.job_rows, check.peer_rows, check.columns) == (2, 2, tuple(DLQ.column_names))


@pytest.mark.parametrize(
    ("change", "column"),
    [
        ({"reconsume_times": 4}, "reconsume_times"),
        ({"body": b"\x00bodz"}, "body"),
        ({"properties": [("KEYS", "k2"), ("TAGS", "t")]}, "properties"),
        ({"redrive_state": "SENT r1"}, "redrive_state"),
    ],
)
def test_a_value_that_differs_is_named_by_its_column(change: dict[str, Any], column: str) -> None:
    con = duckdb.connect()
    job = registered(con, "job", [dead_letter("m1"), dead_letter("m2")])
    peer = registered(con, "peer", [dead_letter("m1"), dead_letter("m2", **change)])

    check = compare(con, DLQ, job, peer, KEY)

    assert not check.same
    assert check.differences() == [f"dlq.{column}"]
    assert (check.only_job, check.only_peer, check.unpaired_job, check.unpaired_peer) == (1, 1, 0, 0)
    assert check.examples and check.examples[0].startswith("at group='cg', broker_name='broker-a', msg_id='m2': ")


def test_the_order_of_a_list_counts() -> None:
    con = duckdb.connect()
    row = dead_letter("m1")
    job = registered(con, "job", [row])
    peer = registered(con, "peer", [dead_letter("m1", attempts=list(reversed(row["attempts"])))])

    assert compare(con, DLQ, job, peer, KEY).differences() == ["dlq.attempts"]


def test_rows_only_on_one_side_and_duplicates_are_counted() -> None:
    con = duckdb.connect()
    job = registered(con, "job", [dead_letter("m1"), dead_letter("m1"), dead_letter("m2")])
    peer = registered(con, "peer", [dead_letter("m1"), dead_letter("m2"), dead_letter("m3")])

    check = compare(con, DLQ, job, peer, KEY)

    assert (check.only_job, check.only_peer) == (1, 1)
    assert (check.unpaired_job, check.unpaired_peer) == (1, 1)
    assert check.differences() == ["dlq rows (1 only in the job's, 1 only in the peer's)"]
    assert any(example.startswith("only in the peer's: group='cg'") for example in check.examples)


def test_what_is_left_out_is_said_and_not_compared() -> None:
    con = duckdb.connect()
    job = registered(con, "job", [dead_letter("m1"), dead_letter("m2", reason="POLICY")])
    peer = registered(con, "peer", [dead_letter("m1", body=b"other")])

    check = compare(
        con, DLQ, job, peer, KEY, skip_columns={"body": "no bodies in the peer"}, skip_rows={"reason = 'POLICY'": "why"}
    )

    assert check.same and "body" not in check.columns
    assert check.skipped == {"column body": "no bodies in the peer", "rows where reason = 'POLICY'": "why"}
    assert "not compared: column body (no bodies in the peer); rows where reason = 'POLICY' (why)" in check.summary()


def test_a_perturbed_peer_differs_in_that_column() -> None:
    con = duckdb.connect()
    rows = [
        {"group": "g", "broker_name": "b", "topic": "t", "queue_id": q, "consumer_offset": None, "broker_min_offset": 0}
        | {"broker_offset": 10, "diff": 10, "last_timestamp": None, "oldest_unconsumed_timestamp": 1, "as_of": 5}
        | {"anomaly": None}
        for q in range(3)
    ]
    table = pa.Table.from_pylist(rows, schema=CONSUMER_OFFSETS.arrow_schema)
    con.register("job", table)
    con.register("peer", table)
    key = ("group", "broker_name", "topic", "queue_id")

    assert compare(con, CONSUMER_OFFSETS, "job", "peer", key).same
    check = compare(con, CONSUMER_OFFSETS, "job", "peer", key, perturb="broker_offset")

    assert check.differences() == ["consumer_offsets.broker_offset"]
    assert check.perturbed == "broker_offset changed in one row"
    outcome = PeerOutcome(1.0, [check])
    assert not outcome.same and outcome.note() == "peer differs: consumer_offsets.broker_offset"


def test_canonical_forms() -> None:
    assert canonical('"x"', pa.int32()) == 'CAST("x" AS INTEGER)'
    assert canonical('"m"', pa.map_(pa.string(), pa.string())) == (
        'list_sort(list_transform(map_entries("m"), lambda x0: '
        "{'key': CAST(x0.key AS VARCHAR), 'value': CAST(x0.value AS VARCHAR)}))"
    )
    with pytest.raises(ValueError):
        canonical('"f"', pa.float64())


def test_a_column_the_peer_lacks_is_a_difference() -> None:
    con = duckdb.connect()
    job = registered(con, "job", [dead_letter("m1")])
    con.execute("CREATE TABLE peer AS SELECT * EXCLUDE (attempts) FROM job")

    check = compare(con, DLQ, job, "peer", KEY)

    assert not check.same
    assert check.differences()[0] == "dlq.attempts (not in the peer's result)"
