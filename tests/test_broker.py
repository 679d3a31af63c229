"""The broker's write path on real Delta tables, real threads and real processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from broker_model.broker import Broker, BrokerConfig, InnerMessage
from broker_model.client import Producer, decompress_body
from broker_model.common import Message
from broker_model.common import constants as c
from broker_model.store.delta_commits import log_dir as delta_log_dir
from broker_model.tools import plan_sends, run_workload
from broker_model.tools.workload import FILLER, filler
from schemas.catalog import PLAIN_ENCODED_COLUMNS
from schemas.errors import BrokerError, BrokerLockedError, CommitFailedError, ValidationError
from tests.helpers import column_encodings
from tests.log_invariants import check_log, read_log

REPO = Path(__file__).resolve().parents[1]
SEGMENT = 16 * 1024


def _broker(lake: Path, name: str = "broker-a", **kwargs: object) -> Broker:
    kwargs.setdefault("flush_mode", "SYNC_FLUSH")
    return Broker(BrokerConfig(lake=lake, broker_name=name, segment_size=SEGMENT, **kwargs)).start()  # type: ignore[arg-type]


def _inner(topic: str = "T", queue_id: int = 0, body: bytes = b"hello", **props: str) -> InnerMessage:
    return InnerMessage(topic, queue_id, body, {"WAIT": "true", **props}, born_timestamp=1, born_host="10.0.0.9:4000")


@pytest.mark.slow
def test_differential_workload_matches_independent_recomputation(tmp_path: Path) -> None:
    seed, messages = 20261122, 10_000
    report = run_workload(tmp_path, messages, seed, brokers=2, threads=4, segment_size=SEGMENT)
    rows = {name: read_log(tmp_path, name) for name in ("broker-a", "broker-b")}

    assert report.messages == messages
    assert list(report.seconds) == ["sends", "consumers", "shutdown"]
    for name, log in rows.items():
        assert check_log(log, SEGMENT) == [], name
        assert len({r["segment"] for r in log}) > 20, "rollover must happen often with 16 KiB segments"
    stored = [r for log in rows.values() for r in log]
    assert len(stored) == messages
    assert len({r["uniq_key"] for r in stored}) == messages
    assert Counter(_content(r) for r in stored) == Counter(
        _planned(m) for send in plan_sends(messages, seed) for m in send.messages
    )


def test_a_second_workload_on_a_lake_consumes_from_where_its_groups_committed(tmp_path: Path) -> None:
    def latest(rows: list[dict[str, object]]) -> dict[tuple[object, ...], object]:
        ordered = sorted(rows, key=lambda r: (r["commit_timestamp"], r["offset"]))
        return {(r["group"], r["broker_name"], r["topic"], r["queue_id"]): r["offset"] for r in ordered}

    commits = tmp_path / "consumer_offset_commits"
    run_workload(tmp_path, 3_000, 3, brokers=2, threads=2)
    first = DeltaTable(str(commits)).to_pyarrow_table().to_pylist()
    before = latest([r for r in first if r["source"] != "reset"])
    run_workload(tmp_path, 300, 4, brokers=2, threads=2)
    new = [r for r in DeltaTable(str(commits)).to_pyarrow_table().to_pylist() if r not in first]
    clustering = [r for r in new if (r["group"], r["broker_name"], r["topic"], r["queue_id"]) in before]
    assert len(clustering) > 10  # the groups committed again on queues they had committed before
    # no group went back to the first offset: each commit is at or after the queue's last one before
    for row in clustering:
        key = (row["group"], row["broker_name"], row["topic"], row["queue_id"])
        assert row["offset"] >= before[key], (key, row["offset"], before[key])


def _content(row: dict[str, object]) -> tuple[object, ...]:
    props = row["properties"]
    assert isinstance(props, dict)
    topic = props.get(c.PROPERTY_REAL_TOPIC, row["topic"])
    body = decompress_body(row["body"], row["sys_flag"])  # type: ignore[arg-type]
    return topic, body, row["tags"], row["keys"], props.get(c.PROPERTY_DELAY_TIME_LEVEL)


def _planned(message: Message) -> tuple[object, ...]:
    return message.topic, message.body, message.tags, message.keys, message.properties.get("DELAY")


@pytest.mark.parametrize("seed", [0, 7, 41])
def test_the_bulk_filler_draws_what_one_choice_at_a_time_draws_and_leaves_the_generator_there(seed: int) -> None:
    one, bulk = random.Random(seed), random.Random(seed)
    for count in (0, 1, 4096, 9000):
        assert filler(bulk, count) == bytes(one.choice(FILLER) for _ in range(count))
        assert bulk.getstate() == one.getstate()


def test_delayed_message_goes_to_schedule_topic_with_real_topic_kept(tmp_path: Path) -> None:
    with _broker(tmp_path) as broker:
        result = broker.put_message(_inner("Orders", 3, DELAY="4"))
    row = read_log(tmp_path, "broker-a")[0]
    assert (row["topic"], row["queue_id"], result.topic) == (c.SCHEDULE_TOPIC, 3, c.SCHEDULE_TOPIC)
    assert row["properties"][c.PROPERTY_REAL_TOPIC] == "Orders"
    assert row["properties"][c.PROPERTY_REAL_QUEUE_ID] == "3"


def test_segment_rollover_blank_fills_and_record_starts_next_segment(tmp_path: Path) -> None:
    with Broker(BrokerConfig(lake=tmp_path, segment_size=4096, flush_mode="SYNC_FLUSH")).start() as broker:
        offsets = [broker.put_message(_inner(body=b"x" * 1000)).commit_log_offsets[0] for _ in range(5)]
    rows = read_log(tmp_path, "broker-a")
    size = rows[0]["store_size"]
    assert 3 * size + size + 8 > 4096 >= 3 * size + 8  # the fourth record cannot fit the first segment
    assert offsets == [0, size, 2 * size, 4096, 4096 + size]
    assert [r["segment"] for r in rows] == [0, 0, 0, 4096, 4096]
    assert check_log(rows, 4096) == []


def test_prepared_and_rollback_records_take_no_queue_offset(tmp_path: Path) -> None:
    with _broker(tmp_path) as broker:
        broker.put_message(_inner())
        prepared = InnerMessage("T", 0, b"p", {}, sys_flag=c.TRANSACTION_PREPARED_TYPE, born_host="1.1.1.1:1")
        broker.put_message(prepared)
        broker.put_message(_inner())
    assert [r["queue_offset"] for r in read_log(tmp_path, "broker-a")] == [0, 0, 1]


def test_record_too_large_for_a_segment_is_refused_and_nothing_written(tmp_path: Path) -> None:
    with Broker(BrokerConfig(lake=tmp_path, segment_size=4096, flush_mode="SYNC_FLUSH")).start() as broker:
        version = DeltaTable(str(tmp_path / "commitlog")).version()
        with pytest.raises(ValidationError, match="store_size"):
            broker.put_message(_inner(body=b"x" * 5000))
        assert broker.next_commit_log_offset == 0
    assert DeltaTable(str(tmp_path / "commitlog")).version() == version


def test_group_commit_turns_many_sync_sends_into_few_commits(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig(lake=tmp_path, flush_mode="SYNC_FLUSH")).start()
    threads = [
        threading.Thread(target=lambda: [broker.put_message(_inner(queue_id=q % 4)) for q in range(40)])
        for _ in range(32)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    broker.shutdown()
    rows = read_log(tmp_path, "broker-a")
    assert len(rows) == 32 * 40
    assert broker.commits < len(rows) / 4
    assert check_log(rows, c.DEFAULT_SEGMENT_SIZE) == []


def test_a_lone_sync_sender_is_committed_without_lingering(tmp_path: Path) -> None:
    # a step of 1 s: a commit that lingered would hold each put at least that long
    config = BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", group_commit_step_ms=1000, group_commit_linger_ms=5000)
    with Broker(config).start() as broker:
        broker.put_message(_inner())  # no commit before: this one may linger one step
        lingered = broker.lingered_steps
        for _ in range(5):
            broker.put_message(_inner())
        assert broker.lingered_steps == lingered  # each later commit went at once
        assert broker.commits == 6


def test_a_group_commits_once_every_recent_sender_is_back(tmp_path: Path) -> None:
    # senders that put in lockstep: once a group held all 8, later groups commit on reaching 8
    # puts instead of waiting for a step without growth (2 s here)
    config = BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", group_commit_step_ms=2000, group_commit_linger_ms=9000)
    with Broker(config).start() as broker:
        gate = threading.Barrier(8)

        def send() -> None:
            for _ in range(4):
                gate.wait()
                broker.put_message(_inner())

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert broker.lingered_steps <= 2  # the first group lingers a step or two, no later one
    assert len(read_log(tmp_path, "broker-a")) == 32


def test_broker_files_keep_bodies_and_ids_out_of_dictionaries(tmp_path: Path) -> None:
    with _broker(tmp_path) as broker:
        broker.put_messages([_inner(body=bytes([i % 2]) * 64, KEYS="k", UNIQ_KEY=f"u{i % 2}") for i in range(100)])
    paths, dictionary = column_encodings(tmp_path / "commitlog")
    assert set(PLAIN_ENCODED_COLUMNS) <= paths - dictionary
    assert {"topic", "born_host", "store_host", "properties.key_value.key", "queue_id"} <= dictionary


def test_sync_flush_send_is_in_the_log_when_it_returns(tmp_path: Path) -> None:
    with _broker(tmp_path) as broker:
        result = broker.put_message(_inner())
        visible = DeltaTable(str(tmp_path / "commitlog")).to_pyarrow_table(columns=["msg_id"])["msg_id"].to_pylist()
        assert result.msg_ids[0] in visible


def test_async_flush_returns_before_commit_and_flush_makes_it_durable(tmp_path: Path) -> None:
    with _broker(tmp_path, flush_mode="ASYNC_FLUSH") as broker:
        results = [broker.put_message(_inner(queue_id=i % 2)) for i in range(200)]
        broker.flush()
        table = DeltaTable(str(tmp_path / "commitlog")).to_pyarrow_table(columns=["msg_id"])
        visible = set(table["msg_id"].to_pylist())
        assert {r.msg_ids[0] for r in results} <= visible
        assert broker.commits < 200


@pytest.mark.parametrize(
    "put_while_unreadable", [False, True], ids=["log restored", "a put while the log is unreadable fails at once"]
)
def test_failed_commit_is_reported_and_offsets_continue_without_gap(tmp_path: Path, put_while_unreadable: bool) -> None:
    with _broker(tmp_path, commit_retries=1) as broker:
        broker.put_message(_inner())
        log_dir = delta_log_dir(tmp_path / "commitlog")
        hidden = tmp_path / "hidden_log"
        log_dir.rename(hidden)
        log_dir.write_text("not a directory")  # commits fail, and so does reading the offsets back
        with pytest.raises(CommitFailedError):
            broker.put_message(_inner())
        if put_while_unreadable:
            assert isinstance(_put_in_a_thread(broker), BrokerError)
        log_dir.unlink()
        hidden.rename(log_dir)
        retried = broker.put_message(_inner())
    rows = read_log(tmp_path, "broker-a")
    assert len(rows) == 2
    assert retried.queue_offsets == (1,)
    assert check_log(rows, SEGMENT) == []


def test_a_submit_that_must_not_block_places_nothing_while_the_lock_is_held_or_the_log_is_unread(
    tmp_path: Path,
) -> None:
    with _broker(tmp_path, commit_retries=1) as broker:
        first = broker.submit_messages([_inner()])
        first.wait()
        records = broker.prepare_put([_inner()])
        with broker._lock:  # another thread places a put, or the committer takes a group
            assert broker.try_submit_prepared(records) is None
        put = None
        for _ in range(1000):  # the committer may hold the lock a moment, going back to wait
            if (put := broker.try_submit_prepared(records)) is not None:
                break
            time.sleep(0.001)
        assert put is not None and put.result.queue_offsets == (1,)  # nothing was placed by the refusal
        put.wait()
        log_dir, hidden = delta_log_dir(tmp_path / "commitlog"), tmp_path / "hidden_log"
        log_dir.rename(hidden)
        log_dir.write_text("not a directory")
        with pytest.raises(CommitFailedError):
            broker.put_message(_inner())
        # re-reading the log would block: refused at once, and a blocking submit says why
        assert broker.try_submit_prepared(broker.prepare_put([_inner()])) is None
        with pytest.raises(BrokerError, match="cannot read its commit log"):
            broker.submit_prepared(broker.prepare_put([_inner()]))
        log_dir.unlink()
        hidden.rename(log_dir)
        again = broker.submit_prepared(broker.prepare_put([_inner()]))
        again.wait()
    assert again.result.queue_offsets == (2,)
    assert check_log(read_log(tmp_path, "broker-a"), SEGMENT) == []


def test_a_failing_completion_callback_stops_neither_the_committer_nor_the_other_callbacks(tmp_path: Path) -> None:
    called: list[str] = []

    def failing() -> None:
        called.append("failing")
        raise RuntimeError("a waiter's own failure")

    with _broker(tmp_path, flush_mode="SYNC_FLUSH") as broker:
        put = broker.submit_messages([_inner()])
        ran = threading.Event()
        put.add_callback(failing)
        put.add_callback(lambda: (called.append("next"), ran.set()))
        put.wait()  # waiters are released before the callbacks run
        assert ran.wait(timeout=30)
        assert called == ["failing", "next"]
        put.add_callback(lambda: called.append("late"))  # already done: called at once
        assert called[-1] == "late"
        assert _put_in_a_thread(broker) is None  # the committer lives on: a SYNC_FLUSH put returns
    assert len(read_log(tmp_path, "broker-a")) == 2


def _put_in_a_thread(broker: Broker) -> BaseException | None:
    """What one put raises (None: it stored), failing the test if it waits for 30 s: a committer
    that died leaves every later put waiting."""
    outcome: list[BaseException | None] = []

    def put() -> None:
        try:
            broker.put_message(_inner())
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    putter = threading.Thread(target=put, daemon=True)
    putter.start()
    putter.join(timeout=30)
    assert not putter.is_alive(), "the put waited for a committer that had died"
    return outcome[0]


def test_restart_recovers_physical_and_queue_offsets(tmp_path: Path) -> None:
    with _broker(tmp_path) as broker:
        for i in range(300):
            broker.put_message(_inner(queue_id=i % 3, body=b"y" * (i % 50 + 1)))
        before = (broker.next_commit_log_offset, dict(broker.max_offsets))
    with _broker(tmp_path) as again:
        assert (again.next_commit_log_offset, again.max_offsets) == before
        result = again.put_message(_inner(queue_id=1))
    assert result.queue_offsets == (100,)
    assert check_log(read_log(tmp_path, "broker-a"), SEGMENT) == []


def test_changing_segment_size_of_existing_broker_is_refused(tmp_path: Path) -> None:
    with _broker(tmp_path) as broker:
        broker.put_message(_inner())
    with pytest.raises(ValidationError, match="segment_size"):
        Broker(BrokerConfig(lake=tmp_path, segment_size=SEGMENT * 2)).start()
    Broker(BrokerConfig(lake=tmp_path)).start().shutdown()  # no size given: the stored one is kept


@pytest.mark.subprocess
def test_second_process_with_same_broker_name_fails_fast(tmp_path: Path) -> None:
    child = _start_child(tmp_path, "broker-a", threads=1)
    try:
        with pytest.raises(BrokerLockedError, match="broker-a"):
            Broker(BrokerConfig(lake=tmp_path, broker_name="broker-a")).start()
        other = _broker(tmp_path, "broker-b")  # another name on the same lake is fine
        other.put_message(_inner())
        other.shutdown()
    finally:
        child.kill()
        child.wait()


@pytest.mark.subprocess
def test_two_broker_processes_write_one_lake_side_by_side(tmp_path: Path) -> None:
    children = [_start_child(tmp_path, name, threads=4) for name in ("broker-a", "broker-b")]
    acks = [_read_acks(child, 400) for child in children]
    for child in children:
        child.kill()
        child.wait()
    for name, acked in zip(("broker-a", "broker-b"), acks, strict=True):
        rows = read_log(tmp_path, name)
        assert check_log(rows, SEGMENT) == []
        assert {a[0] for a in acked} <= {r["uniq_key"] for r in rows}


@pytest.mark.subprocess
def test_sigkill_while_sending_loses_no_acknowledged_send_and_restart_continues(tmp_path: Path) -> None:
    child = _start_child(tmp_path, "broker-a", threads=8)
    acked = _read_acks(child, 1500)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    rows = read_log(tmp_path, "broker-a")
    by_key = {r["uniq_key"]: r for r in rows}
    for uniq_key, offset, topic, queue_id, queue_offset in acked:
        row = by_key[uniq_key]
        assert (row["commit_log_offset"], row["topic"], row["queue_id"], row["queue_offset"]) == (
            offset,
            topic,
            queue_id,
            queue_offset,
        )
    assert check_log(rows, SEGMENT) == []

    with _broker(tmp_path) as broker:
        result = broker.put_message(_inner("Crash", 2))
    after = read_log(tmp_path, "broker-a")
    assert check_log(after, SEGMENT) == []
    assert len(after) == len(rows) + 1
    assert result.queue_offsets[0] == 1 + max(r["queue_offset"] for r in rows if r["queue_id"] == 2)


def _start_child(lake: Path, name: str, threads: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "broker_process.py"), str(lake), name, str(threads), str(SEGMENT)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    deadline = time.monotonic() + 60
    line = child.stdout.readline()
    assert line.strip() == "ready" and time.monotonic() < deadline, line
    return child


def _read_acks(child: subprocess.Popen[str], count: int) -> list[tuple[str, int, str, int, int]]:
    assert child.stdout is not None
    acks = []
    while len(acks) < count:
        line = child.stdout.readline()
        assert line, "broker process ended early"
        _, uniq, offset, topic, queue_id, queue_offset = line.split()
        acks.append((uniq, int(offset), topic, int(queue_id), int(queue_offset)))
    return acks


def test_compressed_body_is_stored_compressed_and_decompresses(tmp_path: Path) -> None:
    with _broker(tmp_path) as broker:
        body = b"abc" * 2000
        Producer([broker], seed=1).send(Message.create("T", body))
    row = read_log(tmp_path, "broker-a")[0]
    assert row["sys_flag"] & c.COMPRESSED_FLAG
    assert row["body"] == zlib.compress(body, c.COMPRESS_LEVEL)
    assert decompress_body(row["body"], row["sys_flag"]) == body


def test_a_pull_reads_the_messages_that_reads_one_by_one_read(tmp_path: Path) -> None:
    """A pull's batched read (rows taken file by file: a few as one-row slices, more in one take)
    against ``message_at``, over a queue's rows spread across files among another queue's rows."""
    with _broker(tmp_path) as broker:
        for i in range(12):  # one put per message: twelve files; queue 0 of T interleaved with queue 1
            broker.put_message(_inner(queue_id=i % 2, body=b"m%d" % i))
        # one put, one file: more of its rows than a batched read takes as one-row slices
        broker.put_messages([_inner(queue_id=i % 2, body=b"b%d" % i) for i in range(40)])
        store = broker.store
        one_by_one = [store.message_at("T", 0, q) for q in range(26)]
        assert [m.body for m in one_by_one if m is not None] == [
            *(b"m%d" % i for i in range(0, 12, 2)),
            *(b"b%d" % i for i in range(0, 40, 2)),
        ]
        for start, count in ((0, 6), (1, 3), (4, 10), (6, 20), (0, 32)):
            pulled = store.get_message("T", 0, start, max_msgs=count).messages
            assert pulled == one_by_one[start : start + count]


def test_non_numeric_delay_level_is_refused_and_nothing_written(tmp_path: Path) -> None:
    with _broker(tmp_path) as broker:
        with pytest.raises(ValidationError, match="DELAY='soon'"):
            broker.put_message(_inner(DELAY="soon"))
        assert broker.next_commit_log_offset == 0
    assert read_log(tmp_path, "broker-a") == []


@pytest.mark.parametrize(("value_length", "stored"), [(32731, True), (32732, False)])
def test_stored_property_string_over_32767_bytes_is_refused(tmp_path: Path, value_length: int, stored: bool) -> None:
    # stored: "WAIT\x01true\x02" (10) + "k\x01" value "\x02" (3 + n) + "CLUSTER\x01DefaultCluster\x02" (23)
    with Broker(BrokerConfig(lake=tmp_path, segment_size=65536, flush_mode="SYNC_FLUSH")).start() as broker:
        message = _inner(k="v" * value_length)
        if stored:
            broker.put_message(message)
        else:
            with pytest.raises(ValidationError, match=r"properties='<32768 bytes>'"):
                broker.put_message(message)
    rows = read_log(tmp_path, "broker-a")
    assert [len(r["raw_properties"]) for r in rows] == ([32767] if stored else [])


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [("messages", {"messages": -1}), ("transactions", {"transactions": -2}), ("brokers", {"brokers": 0})],
)
def test_a_workload_with_a_negative_count_is_refused_and_writes_nothing(
    tmp_path: Path, field: str, kwargs: dict[str, int]
) -> None:
    arguments = {"messages": 10, **kwargs}
    with pytest.raises(ValidationError, match=rf"^{field}="):
        run_workload(tmp_path, arguments.pop("messages"), 1, **arguments)
    assert list(tmp_path.iterdir()) == []
