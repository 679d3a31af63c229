"""The consume side of the broker: pull statuses, tag filtering, long polling, offsets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker_model.broker import Broker, BrokerConfig, InnerMessage
from broker_model.broker.consumer_offsets import ConsumerOffsetManager
from broker_model.client import LocalFileOffsetStore, PullConsumer, ReadOffsetType, RemoteBrokerOffsetStore
from broker_model.common import OFFSET_BAD_REQUEST, OFFSET_NOT_FOUND, OFFSET_READ_ERROR, MessageQueue
from broker_model.common import constants as c
from broker_model.store import MessageStore, OffsetCommit, OffsetLedger, PullResult, PullStatus, Subscription
from broker_model.store.delta_commits import read_change
from schemas.errors import ValidationError
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[1]
Q0 = MessageQueue("broker-a", "T", 0)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    started = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH")).start()
    started.ensure_topic("T", 2)
    yield started
    started.shutdown()


def _put(broker: Broker, tags: str | None = None, body: bytes = b"m", queue_id: int = 0, **props: str) -> None:
    properties = {"TAGS": tags, **props} if tags else dict(props)
    broker.put_message(InnerMessage("T", queue_id, body, properties, born_host="10.0.0.1:1"))


@pytest.mark.parametrize(
    ("stored", "offset", "status", "next_begin"),
    [
        (0, 0, PullStatus.NO_NEW_MSG, 0),  # empty queue, offset 0: can be held
        (0, 3, PullStatus.OFFSET_ILLEGAL, 0),  # empty queue, offset moved to 0
        (4, 4, PullStatus.NO_NEW_MSG, 4),  # at the end
        (4, 9, PullStatus.OFFSET_ILLEGAL, 4),  # far beyond the end: corrected to max
        (4, -1, PullStatus.OFFSET_ILLEGAL, 0),  # below min: corrected to min
        (4, 1, PullStatus.FOUND, 4),
    ],
)
def test_pull_statuses_and_offset_corrections_follow_rocketmq(
    broker: Broker, stored: int, offset: int, status: PullStatus, next_begin: int
) -> None:
    for _ in range(stored):
        _put(broker)
    result = broker.pull("T", 0, offset)
    assert (result.status, result.next_begin_offset, result.min_offset, result.max_offset) == (
        status,
        next_begin,
        0,
        stored,
    )


def test_pull_returns_at_most_max_msgs_and_marks_min_and_max_offsets(broker: Broker) -> None:
    for i in range(10):
        _put(broker, body=bytes([i]))
    result = broker.pull("T", 0, 2, max_msgs=3)
    assert [m.queue_offset for m in result.messages] == [2, 3, 4]
    assert result.next_begin_offset == 5
    assert {(m.properties[c.PROPERTY_MIN_OFFSET], m.properties[c.PROPERTY_MAX_OFFSET]) for m in result.messages} == {
        ("0", "10")
    }


def test_pull_stops_at_256_kib_but_always_returns_the_first_message(tmp_path: Path) -> None:
    with Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH")).start() as broker:
        for _ in range(3):
            _put(broker, body=b"x" * 200_000)
        first = broker.pull("T", 0, 0)
        assert [m.queue_offset for m in first.messages] == [0]
        assert first.next_begin_offset == 1


def test_tag_filter_uses_the_hash_then_the_exact_tag(broker: Broker) -> None:
    assert Subscription.parse("Aa").codes == Subscription.parse("BB").codes  # Java hash collision
    _put(broker, tags="BB")
    _put(broker, tags="Aa")
    _put(broker, tags="Other")
    result = broker.pull("T", 0, 0, tag_expression="Aa")
    assert result.status is PullStatus.FOUND
    assert [m.tags for m in result.messages] == ["Aa"]  # BB passed the broker's code check only
    assert result.next_begin_offset == 3


def test_no_matched_message_moves_past_what_was_scanned(broker: Broker) -> None:
    for _ in range(5):
        _put(broker, tags="B")
    result = broker.pull("T", 0, 1, tag_expression="A || C")
    assert (result.status, result.next_begin_offset, result.messages) == (PullStatus.NO_MATCHED_MSG, 5, [])


def test_or_expression_matches_each_tag(broker: Broker) -> None:
    for tags in ("A", "B", "C"):
        _put(broker, tags=tags)
    assert [m.tags for m in broker.pull("T", 0, 0, tag_expression=" A || C ").messages] == ["A", "C"]


def test_bad_tag_expression_and_max_msgs_are_refused(broker: Broker) -> None:
    with pytest.raises(ValidationError, match="tag_expression"):
        broker.pull("T", 0, 0, tag_expression="||")
    _put(broker)
    with pytest.raises(ValidationError, match="max_msgs"):
        broker.pull("T", 0, 0, max_msgs=0)


def test_schedule_topic_entries_carry_their_delivery_time_as_tags_code(broker: Broker) -> None:
    broker.put_message(InnerMessage("T", 1, b"later", {"TAGS": "x", "DELAY": "3"}, born_host="10.0.0.1:1"))
    stored = broker.pull(c.SCHEDULE_TOPIC, 2, 0).messages[0]
    queue = broker.store._queues[(c.SCHEDULE_TOPIC, 2)]
    assert queue.tags_codes[0] == stored.store_timestamp + 10_000


def test_committed_body_is_handed_back_decompressed(tmp_path: Path) -> None:
    from broker_model.client import Producer
    from broker_model.common import Message

    with Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH")).start() as broker:
        body = b"compress me " * 1000
        sent = Producer([broker], seed=1).send(Message.create("Big", body))
        pulled = broker.pull("Big", sent.message_queue.queue_id, sent.queue_offset).messages[0]
    assert pulled.body == body and pulled.sys_flag & c.COMPRESSED_FLAG
    assert pulled.uniq_key == sent.msg_id and pulled.msg_id == sent.offset_msg_id


# -- long polling ---------------------------------------------------------------------------------


class _HeldPull:
    """A pull run in a thread of its own, for tests that watch it being held."""

    def __init__(self, pull: Callable[[], PullResult]) -> None:
        self.result: PullResult | None = None
        self.started = time.monotonic()
        self.returned: float | None = None
        self._thread = threading.Thread(target=self._run, args=(pull,))
        self._thread.start()

    def _run(self, pull: Callable[[], PullResult]) -> None:
        self.result = pull()
        self.returned = time.monotonic()

    def join(self, timeout_s: float) -> PullResult:
        """The pull's result; fails when it is still held after ``timeout_s``."""
        self._thread.join(timeout_s)
        assert self.result is not None, f"the pull was still held after {timeout_s} s"
        return self.result

    @property
    def held_s(self) -> float:
        assert self.returned is not None
        return self.returned - self.started


def _held(store: MessageStore, pull: _HeldPull) -> None:
    """Wait until the store holds the pull, then check it has not answered."""
    wait_until(lambda: store.held_pulls == 1, "the pull to be held")
    assert pull.result is None


def test_held_pull_returns_on_a_send_from_another_thread(broker: Broker) -> None:
    pull = _HeldPull(lambda: broker.pull("T", 0, 0, suspend_timeout_ms=60_000))
    _held(broker.store, pull)
    _put(broker, tags="A", body=b"wakes")
    result = pull.join(30)  # long before its hold of 60 s ends: the send woke it
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"wakes"]
    assert broker.store.held_pulls == 0


def test_held_pull_without_a_send_returns_no_new_message_at_its_timeout(broker: Broker) -> None:
    pull = _HeldPull(lambda: broker.pull("T", 0, 0, suspend_timeout_ms=600))
    _held(broker.store, pull)
    result = pull.join(30)
    assert result.status is PullStatus.NO_NEW_MSG
    assert pull.held_s >= 0.6  # held its whole timeout
    assert broker.store.held_pulls == 0


def test_a_message_that_does_not_match_the_tags_does_not_wake_a_held_pull(broker: Broker) -> None:
    pull = _HeldPull(lambda: broker.pull("T", 0, 0, tag_expression="A", suspend_timeout_ms=800))
    _held(broker.store, pull)
    _put(broker, tags="Other")
    result = pull.join(30)
    assert pull.held_s >= 0.8  # held to its timeout: the other tag did not wake it
    assert result.status is PullStatus.NO_MATCHED_MSG  # re-read after the hold: scanned, none matched


def test_with_long_polling_off_a_pull_is_held_for_the_short_polling_time_only(broker: Broker) -> None:
    pull = _HeldPull(lambda: broker.pull("T", 0, 0, suspend_timeout_ms=60_000, long_polling=False))
    _held(broker.store, pull)
    _put(broker, tags="A")
    result = pull.join(30)  # not held its 60 s
    assert pull.held_s >= 1.0  # not woken by the arrival: held the short-polling second
    assert result.status is PullStatus.FOUND


def test_a_store_of_another_process_notices_new_commits_by_polling_the_log(broker: Broker, tmp_path: Path) -> None:
    reader = MessageStore(tmp_path, "broker-a", log_poll_ms=50).load()  # not fed by the broker
    pull = _HeldPull(lambda: reader.pull("T", 0, 0, suspend_timeout_ms=60_000))
    _held(reader, pull)
    _put(broker, tags="A", body=b"from the log")
    result = pull.join(30)  # woken by polling the commit log, long before the hold ends
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"from the log"]


@pytest.mark.subprocess
def test_held_pull_sees_commits_of_a_broker_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "broker_process.py"), str(tmp_path), "broker-a", "1", "65536"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        threading.Thread(target=child.stdout.read, daemon=True).start()  # its acks never fill the pipe
        wait_until(lambda: any(MessageStore(tmp_path, "broker-a").load().queues()), "the first commits")
        child.send_signal(signal.SIGSTOP)  # no send while the reader settles at the queue's end
        reader = MessageStore(tmp_path, "broker-a").load()
        queue_id = next(q for q in range(4) if reader.max_offset("Crash", q) > 0)
        end = reader.max_offset("Crash", queue_id)
        pull = _HeldPull(lambda: reader.pull("Crash", queue_id, end, suspend_timeout_ms=60_000))
        _held(reader, pull)
        child.send_signal(signal.SIGCONT)  # the broker process sends again
        result = pull.join(30)
        assert result.status is PullStatus.FOUND and result.messages[0].queue_offset == end
    finally:
        child.kill()
        child.wait()


# -- offsets --------------------------------------------------------------------------------------


def test_clustering_offsets_are_queried_before_and_after_persist_and_survive_restart(tmp_path: Path) -> None:
    with Broker(BrokerConfig(tmp_path, offset_persist_interval_ms=60_000)).start() as broker:
        assert broker.query_offset("g", "T", 0) == OFFSET_NOT_FOUND
        broker.commit_offset("g", "T", 0, 5)
        broker.commit_offset("g", "T", 0, 7)
        assert broker.query_offset("g", "T", 0) == 7
        broker.offsets.persist()
        broker.commit_offset("g", "T", 0, 3)  # a plain overwrite, as RocketMQ's
    with Broker(BrokerConfig(tmp_path)).start() as again:
        assert again.query_offset("g", "T", 0) == 3
        assert again.query_offset("g", "T", 1) == OFFSET_NOT_FOUND
    rows = OffsetLedger(tmp_path).load()
    assert rows.current(("g", "broker-a", "T", 0))[0] == 3  # type: ignore[index]


def test_a_running_broker_sees_offsets_another_process_appended(tmp_path: Path) -> None:
    with Broker(BrokerConfig(tmp_path)).start() as broker:
        broker.commit_offset("g", "T", 0, 10)
        broker.offsets.persist()
        other = OffsetLedger(tmp_path).load()
        key = ("g", "broker-a", "T", 0)
        other.append([OffsetCommit("g", "broker-a", "T", 0, 2, other.next_timestamp(key), "reset", reset_id="r1")])
        assert broker.query_offset("g", "T", 0) == 2


def test_a_brokers_offsets_follow_only_files_that_may_hold_its_queues(tmp_path: Path) -> None:
    """A broker's offset manager reads no file of another broker's commits (their statistics say so)
    and none of its own commits, even when other commits came between; it still reads a reset of
    its queues and a file holding several brokers' rows."""
    ours = ConsumerOffsetManager(tmp_path, "broker-a").load()
    theirs = ConsumerOffsetManager(tmp_path, "broker-b").load()
    other = OffsetLedger(tmp_path).load()  # another process: the reset tool
    ours.commit_offset("g", "T", 0, 10)
    own_version = ours.persist()
    theirs.commit_offset("g", "T", 0, 20)
    their_version = theirs.persist()
    ours.commit_offset("g", "T", 1, 30)
    later_own_version = ours.persist()  # not the version after ours' last: the ledger's tail stays behind
    assert own_version is not None and their_version is not None and later_own_version is not None
    assert later_own_version != own_version + 1
    # the files the manager must not read are gone: reading one would fail
    for version in (their_version, later_own_version):
        (read_file,) = read_change(tmp_path / "consumer_offset_commits", version).added  # type: ignore[union-attr]
        os.remove(tmp_path / "consumer_offset_commits" / read_file.path)
    key = ("g", "broker-a", "T", 0)
    other.append([OffsetCommit("g", "broker-a", "T", 0, 2, other.next_timestamp(key), "reset", reset_id="r1")])
    both = [
        OffsetCommit("g", "broker-a", "T", 1, 3, other.next_timestamp(("g", "broker-a", "T", 1)), "reset"),
        OffsetCommit("g", "broker-c", "T", 1, 4, other.next_timestamp(("g", "broker-c", "T", 1)), "reset"),
    ]
    other.append(both)
    assert ours.query_offset("g", "T", 0) == 2
    assert ours.query_offset("g", "T", 1) == 3
    assert ours.ledger.keys() == [("g", "broker-a", "T", 0), ("g", "broker-a", "T", 1)]


def test_commit_timestamps_strictly_increase_per_queue_even_within_one_millisecond(tmp_path: Path) -> None:
    frozen = 1_800_000_000_000
    with Broker(BrokerConfig(tmp_path, clock=lambda: frozen)).start() as broker:
        for offset in range(5):
            broker.commit_offset("g", "T", 0, offset)
            broker.offsets.persist()
    from deltalake import DeltaTable

    rows = DeltaTable(str(tmp_path / "consumer_offset_commits")).to_pyarrow_table().sort_by("offset").to_pylist()
    assert [r["commit_timestamp"] - frozen for r in rows] == [0, 1, 2, 3, 4]


def test_offsets_of_several_commits_reach_the_lake_in_one_atomic_commit(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    with Broker(BrokerConfig(tmp_path, offset_persist_interval_ms=60_000)).start() as broker:
        for queue_id in range(4):
            broker.commit_offset("g", "T", queue_id, queue_id + 1)
        version = broker.offsets.persist()
    table = DeltaTable(str(tmp_path / "consumer_offset_commits"))
    assert table.version() == version
    assert table.to_pyarrow_table().num_rows == 4


def test_local_file_offset_store_behaves_as_rocketmq_test_expects(tmp_path: Path) -> None:
    store = LocalFileOffsetStore(tmp_path, "127.0.0.1@1", "bc")
    queue = MessageQueue("broker-a", "T", 1)
    store.update_offset(queue, 1024)
    assert store.read_offset(queue, ReadOffsetType.READ_FROM_STORE) == OFFSET_NOT_FOUND
    assert store.read_offset(queue, ReadOffsetType.READ_FROM_MEMORY) == 1024
    store.persist_all()
    store.update_offset(queue, 1023, increase_only=False)
    assert store.read_offset(queue, ReadOffsetType.READ_FROM_MEMORY) == 1023
    store.update_offset(queue, 1022, increase_only=True)
    assert store.read_offset(queue, ReadOffsetType.READ_FROM_MEMORY) == 1023
    fresh = LocalFileOffsetStore(tmp_path, "127.0.0.1@1", "bc")
    assert fresh.read_offset(queue, ReadOffsetType.READ_FROM_STORE) == 1024
    store.persist_all()
    assert (tmp_path / "127.0.0.1@1" / "bc" / "offsets.json.bak").exists()
    again = LocalFileOffsetStore(tmp_path, "127.0.0.1@1", "bc")
    assert again.read_offset(queue, ReadOffsetType.READ_FROM_STORE) == 1023


def test_read_offset_return_codes(broker: Broker) -> None:
    store = RemoteBrokerOffsetStore({"broker-a": broker.offsets}, "g", "c1")
    assert store.read_offset(None, ReadOffsetType.READ_FROM_STORE) == OFFSET_BAD_REQUEST
    assert store.read_offset(Q0, ReadOffsetType.READ_FROM_STORE) == OFFSET_NOT_FOUND
    assert store.read_offset(MessageQueue("broker-x", "T", 0), ReadOffsetType.READ_FROM_STORE) == OFFSET_READ_ERROR
    broker.commit_offset("g", "T", 0, 4)
    assert store.read_offset(Q0, ReadOffsetType.READ_FROM_MEMORY) == OFFSET_NOT_FOUND
    assert store.read_offset(Q0, ReadOffsetType.MEMORY_FIRST_THEN_STORE) == 4


def test_pull_consumer_commits_through_the_queue_broker(broker: Broker) -> None:
    for _ in range(3):
        _put(broker)
    consumer = PullConsumer([broker], "cg")
    result = consumer.pull(Q0, 0)
    consumer.update_offset(Q0, result.next_begin_offset)
    consumer.persist()
    assert broker.query_offset("cg", "T", 0) == 3


def test_broadcasting_consumer_needs_a_local_offset_directory(broker: Broker) -> None:
    with pytest.raises(ValidationError, match="offset_dir"):
        PullConsumer([broker], "bc", message_model="BROADCASTING")
