"""POP consumption on the real broker (docs/pop.md): checkpoints and acks in the revive topic in
RocketMQ's own form, revives into the POP retry topic once per expiry, changes of the invisible
time, dead letters past the group's attempts, and a revive round a crash left pending settled
from the log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_model.broker import (
    Broker,
    InnerMessage,
    PopResult,
    PopService,
    SubscriptionGroupConfig,
    TimerMessageService,
    revive_progress_path,
)
from broker_model.common import constants as c
from broker_model.common.pop_records import AckMsg, PopCheckPoint, PopError, ReceiptHandle
from broker_model.store import MessageExt
from schemas.errors import ValidationError
from tests.helpers import ManualClock

T0 = 1_800_000_000_000
REVIVE = "rmq_sys_REVIVE_LOG_DefaultCluster"
RETRY = "%RETRY%G_T"


class Pop:
    """A broker's timer and POP services, moved by hand on the test's clock."""

    def __init__(self, broker: Broker, clock: ManualClock) -> None:
        self.broker, self.clock = broker, clock
        self.timer = TimerMessageService(broker)
        self.service = PopService(broker, self.timer, seed=7)

    def at(self, now: int) -> int:
        """Move the clock to ``now``, deliver the due timer records, run a revive round; the copies revived."""
        self.clock.now = now
        self.timer.deliver_due(now)
        return self.service.revive(now)


def _send(broker: Broker, count: int, tags: str = "a") -> None:
    for i in range(count):
        properties = {"UNIQ_KEY": f"U{i}", "TAGS": tags}
        broker.put_message(InnerMessage("T", i % 2, f"m{i}".encode(), properties, born_timestamp=T0))


def _records(broker: Broker, topic: str, queue_id: int) -> list[MessageExt]:
    store = broker.store
    broker.flush()
    found = (store.message_at(topic, queue_id, q, decompress=False) for q in range(store.max_offset(topic, queue_id)))
    return [m for m in found if m is not None]


def _bodies(result_messages: list) -> list[bytes]:  # type: ignore[type-arg]
    return sorted(m.message.body for m in result_messages)


@pytest.fixture
def pop(broker: Broker, clock: ManualClock) -> Pop:
    clock.now = T0
    return Pop(broker, clock)


def test_checkpoint_and_ack_bodies_are_rocketmqs() -> None:
    ck = PopCheckPoint("T", 1, 5, 1700000000000, 30000, (0, 2), "G", "broker-a")
    assert ck.to_json() == (
        '{"bm":0,"bn":"broker-a","c":"G","d":[0,2],"it":30000,"n":2,"pt":1700000000000,"q":1,'
        '"reviveTime":1700000030000,"ro":0,"so":5,"sp":false,"t":"T"}'
    )
    assert PopCheckPoint.from_json(ck.to_json(), revive_offset=3) == PopCheckPoint(
        "T", 1, 5, 1700000000000, 30000, (0, 2), "G", "broker-a", revive_offset=3
    )
    assert ck.unique_id == "T@1@5@G@1700000000000@broker-a@ck" and ck.offsets == (5, 7)
    old = PopCheckPoint.from_json(
        '{"startOffset":4,"num":3,"popTime":1,"invisibleTime":2,"queueId":0,"topic":"T","cid":"G"}'
    )
    assert old.offsets == (4, 5, 6) and old.broker_name == ""
    ack = AckMsg("T", 1, 5, 1700000000000, (7,), "G", "broker-a")
    assert ack.to_json() == '{"ao":7,"bn":"broker-a","c":"G","pt":1700000000000,"q":1,"so":5,"t":"T"}'
    assert ack.key == ck.key and ack.unique_id == "T@1@7@G@1700000000000@broker-a@ack"
    batch = AckMsg.from_json('{"ao":-1,"aol":[5,7],"c":"G","pt":1,"q":1,"so":5,"t":"T"}', "own")
    assert batch.offsets == (5, 7) and batch.broker_name == "own"
    with pytest.raises(ValidationError, match=r"^so="):
        PopCheckPoint.from_json('{"n":1,"pt":1,"it":1,"q":0,"t":"T","c":"G"}')
    handle = ReceiptHandle(5, 1700000000000, 30000, 3, "1", "broker-a", 1, 7, 1234)
    assert handle.encode() == "5 1700000000000 30000 3 1 broker-a 1 7 1234"
    assert ReceiptHandle.decode(handle.encode()) == handle and handle.real_topic("T", "G") == RETRY
    for bad in ("5 1 2 3 1 b 1 7", "x 1 2 3 0 b 1 7 9", "5 1 2 3 7 b 1 7 9"):
        with pytest.raises(PopError, match=r"^receipt_handle=") as raised:
            ReceiptHandle.decode(bad)
        assert raised.value.code == "INVALID_RECEIPT_HANDLE"


def test_a_pop_writes_one_checkpoint_per_queue_through_the_timer_and_moves_the_offset_on(
    broker: Broker, pop: Pop
) -> None:
    _send(broker, 6)
    result = pop.service.pop("G", "T", 32, invisible_ms=30_000)
    assert result.status == "FOUND" and _bodies(result.messages) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    timer_records = _records(broker, c.TIMER_TOPIC, 0)
    assert len(timer_records) == 2 and not any(_records(broker, REVIVE, q) for q in range(8))
    cks = sorted((PopCheckPoint.from_json(r.body.decode()) for r in timer_records), key=lambda ck: ck.queue_id)
    assert [(ck.queue_id, ck.start_offset, ck.offset_diffs, ck.pop_time) for ck in cks] == [
        (0, 0, (0, 1, 2), T0),
        (1, 0, (0, 1, 2), T0),
    ]
    record = timer_records[0]
    assert record.properties["TAGS"] == "ck" and record.properties["REAL_TOPIC"] == REVIVE
    assert record.properties["TIMER_DELIVER_MS"] == str(T0 + 30_000 - 1000)
    assert record.properties["UNIQ_KEY"].endswith(f"@G@{T0}@broker-a@ck")
    assert [broker.query_offset("G", "T", q) for q in (0, 1)] == [3, 3]  # popped up to
    handle = ReceiptHandle.decode(result.messages[0].receipt_handle)
    message = result.messages[0].message
    assert (handle.queue_offset, handle.commit_log_offset, handle.topic_type) == (
        message.queue_offset,
        message.commit_log_offset,
        "0",
    )
    assert result.messages[0].delivery_attempt == 1
    assert pop.service.pop("G", "T", 32, invisible_ms=30_000).status == "NO_NEW_MSG"


def test_unacked_messages_are_revived_once_per_expiry_and_acked_ones_never(broker: Broker, pop: Pop) -> None:
    _send(broker, 4)
    first = pop.service.pop("G", "T", 32, invisible_ms=10_000)
    acked = [m for m in first.messages if m.message.body in (b"m0", b"m3")]
    for item in acked:
        pop.service.ack("G", "T", item.receipt_handle)
    assert pop.at(T0 + 9_999) == 0
    assert pop.at(T0 + 10_999) == 0  # due only once the acks' time is a second behind
    assert pop.at(T0 + 11_000) == 2
    assert pop.at(T0 + 60_000) == 0
    revived = _records(broker, RETRY, 0)
    assert sorted(m.body for m in revived) == [b"m1", b"m2"]
    copy = revived[0]
    assert copy.reconsume_times == 1 and copy.born_host == broker.store_host
    assert copy.properties["ORIGIN_GROUP"] == "G" and copy.properties["1ST_POP_TIME"] == str(T0)
    assert copy.properties["UNIQ_KEY"] in ("U1", "U2") and "RETRY_TOPIC" not in copy.properties
    second = pop.service.pop("G", "T", 32, invisible_ms=10_000)
    assert _bodies(second.messages) == [b"m1", b"m2"]
    assert {m.message.topic for m in second.messages} == {"T"} and {m.delivery_attempt for m in second.messages} == {2}
    assert {ReceiptHandle.decode(m.receipt_handle).topic_type for m in second.messages} == {"1"}
    for item in second.messages:
        pop.service.ack("G", "T", item.receipt_handle)
    assert pop.at(T0 + 120_000) == 0
    assert pop.service.pop("G", "T", 32, invisible_ms=10_000).status == "NO_NEW_MSG"
    assert broker.query_offset(c.REVIVE_GROUP, REVIVE, 0) >= 0  # the revive's progress, as RocketMQ keeps it


def test_an_expired_handle_is_refused_and_writes_nothing(broker: Broker, pop: Pop) -> None:
    _send(broker, 1)
    (item,) = pop.service.pop("G", "T", 1, invisible_ms=5_000).messages
    pop.clock.now = T0 + 5_000
    written = broker.next_commit_log_offset
    with pytest.raises(PopError, match="is expired") as raised:
        pop.service.ack("G", "T", item.receipt_handle)
    assert raised.value.code == "INVALID_RECEIPT_HANDLE" and broker.next_commit_log_offset == written
    with pytest.raises(PopError, match="is expired"):
        pop.service.change_invisible("G", "T", item.receipt_handle, 1_000)
    assert broker.next_commit_log_offset == written


def test_a_changed_invisible_time_moves_the_revive_and_the_old_handle_is_acked(broker: Broker, pop: Pop) -> None:
    _send(broker, 1)
    (item,) = pop.service.pop("G", "T", 1, invisible_ms=5_000).messages
    pop.clock.now = T0 + 1_000
    renewed = pop.service.change_invisible("G", "T", item.receipt_handle, 20_000)
    handle = ReceiptHandle.decode(renewed)
    assert (handle.pop_time, handle.invisible_time, handle.start_offset) == (
        T0 + 1_000,
        20_000,
        item.message.queue_offset,
    )
    assert pop.at(T0 + 10_000) == 0  # the first window closed by the ack of the change
    assert pop.at(T0 + 21_999) == 0
    assert pop.at(T0 + 22_000) == 1
    assert pop.at(T0 + 90_000) == 0
    assert [m.body for m in _records(broker, RETRY, 0)] == [b"m0"]


def test_a_message_past_the_groups_attempts_is_dead_lettered_and_acked(broker: Broker, pop: Pop) -> None:
    broker.update_subscription_group(SubscriptionGroupConfig("G", retry_max_times=1))  # 2 attempts
    _send(broker, 1)
    now = T0
    for attempt in (1, 2):
        (item,) = pop.service.pop("G", "T", 1, invisible_ms=5_000).messages
        assert item.delivery_attempt == attempt
        now += 10_000
        assert pop.at(now) == 1
    result = pop.service.pop("G", "T", 1, invisible_ms=5_000)
    assert result.status == "NO_NEW_MSG" and result.dead_lettered == 1
    (dead,) = _records(broker, "%DLQ%G", 0)
    assert (dead.body, dead.reconsume_times, dead.properties["RETRY_TOPIC"]) == (b"m0", 3, RETRY)
    assert pop.at(now + 60_000) == 0  # acked: never revived again
    assert pop.service.pop("G", "T", 1, invisible_ms=5_000).status == "NO_NEW_MSG"


def test_tags_filter_skips_and_bad_requests_name_the_field(broker: Broker, pop: Pop) -> None:
    _send(broker, 2, tags="a")
    _send(broker, 2, tags="b")
    result = pop.service.pop("G", "T", 32, invisible_ms=5_000, expression="b")
    assert [m.message.tags for m in result.messages] == ["b", "b"]
    for kwargs, named in (
        ({"max_nums": 33}, "max_nums"),
        ({"invisible_ms": -1}, "invisible_ms"),
        ({"init_mode": "LAST"}, "init_mode"),
    ):
        with pytest.raises(ValidationError, match=rf"^{named}="):
            pop.service.pop("G", "T", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(PopError, match=r"^topic=") as raised:
        pop.service.pop("G", "NOPE")
    assert raised.value.code == "TOPIC_NOT_FOUND"


@pytest.mark.parametrize("landed", [True, False], ids=["put-landed", "put-lost"])
def test_a_revive_round_a_crash_left_pending_is_settled_from_the_log(
    broker: Broker, pop: Pop, clock: ManualClock, landed: bool
) -> None:
    _send(broker, 1)
    pop.service.pop("G", "T", 1, invisible_ms=5_000)
    assert pop.at(T0 + 6_000) == 1
    progress = revive_progress_path(broker.config.lake, broker.broker_name)
    done = json.loads(progress.read_text())["done"]
    (copy,) = _records(broker, RETRY, 0)
    log_offset = copy.commit_log_offset if landed else broker.next_commit_log_offset
    before = {q: o - 1 for q, o in done.items()}  # as if the round had not finished
    pending = {"done": done, "log_offset": log_offset, "first": [RETRY, "U0", 1]}
    progress.write_text(json.dumps({"done": before, "pending": pending}))
    again = PopService(broker, pop.timer)
    assert json.loads(progress.read_text())["done"] == (done if landed else before)
    assert again.revive(T0 + 60_000) == (0 if landed else 1)
    assert len(_records(broker, RETRY, 0)) == (1 if landed else 2)


def test_a_started_broker_moves_pop_offsets_on_to_the_checkpoints_it_did_not_persist(
    tmp_path: Path, clock: ManualClock
) -> None:
    from broker_model.broker import BrokerConfig

    clock.now = T0
    lake = tmp_path / "lake"
    first = Broker(BrokerConfig(lake, flush_mode="SYNC_FLUSH", clock=clock)).start()
    first.ensure_topic("T", 2)
    _send(first, 4)
    pops = PopService(first, TimerMessageService(first))
    assert len(pops.pop("G", "T", 32, invisible_ms=30_000).messages) == 4
    first.offsets._pending.clear()  # killed before the offsets reached the lake
    first.shutdown()
    second = Broker(BrokerConfig(lake, flush_mode="SYNC_FLUSH", clock=clock)).start()
    try:
        assert [second.offsets.ledger.current(("G", "broker-a", "T", q)) for q in (0, 1)] == [None, None]
        again = PopService(second, TimerMessageService(second))
        assert [second.query_offset("G", "T", q) for q in (0, 1)] == [2, 2]
        assert again.pop("G", "T", 32, invisible_ms=30_000).status == "NO_NEW_MSG"
    finally:
        second.shutdown()


def test_after_sigkill_acked_messages_never_come_back_and_unacked_ones_once_per_expiry(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from broker_model.broker import BrokerConfig

    lake, count, invisible_ms = tmp_path / "lake", 40, 3_000
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "pop_crash_process.py"), str(lake), str(count), str(invisible_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        told = json.loads(child.stdout.readline())
        time.sleep(0.3)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -9 and len(told["acked"]) == len(told["unacked"]) == count // 2
    broker = Broker(BrokerConfig(lake)).start()
    try:  # the kill landed before the pop offsets were persisted: only the checkpoints tell them
        assert all(broker.offsets.ledger.current(("G", "broker-a", "T", q)) is None for q in range(4))
        timer = TimerMessageService(broker).start()
        pops = PopService(broker, timer).start()
        started = time.monotonic()
        first = pops.pop("G", "T", 32, invisible_ms=60_000, poll_ms=500)
        assert first.messages == []  # acked ones never again, unacked ones still invisible
        seen: list[str] = []
        while time.monotonic() - started < 20 and len(seen) < count // 2:
            result = pops.pop("G", "T", 32, invisible_ms=60_000, poll_ms=1_000)
            for item in result.messages:
                assert item.delivery_attempt == 2
                seen.append(item.message.body.decode())
        assert sorted(seen) == sorted(told["unacked"])
        time.sleep(invisible_ms / 1000 + 1)
        assert pops.pop("G", "T", 32, invisible_ms=60_000, poll_ms=500).messages == []  # once per expiry
    finally:
        broker.shutdown()


def test_an_unreadable_revive_progress_file_is_refused_naming_it(broker: Broker, pop: Pop) -> None:
    from schemas.errors import BrokerError

    progress = revive_progress_path(broker.config.lake, broker.broker_name)
    progress.parent.mkdir(parents=True, exist_ok=True)
    progress.write_text('{"done": {"0": "x"}}')
    with pytest.raises(BrokerError, match=r"revive progress file .*reviveProgress\.json is unreadable"):
        PopService(broker, pop.timer)


def test_a_checkpoint_that_cannot_be_revived_is_given_up_and_holds_up_no_other(broker: Broker, pop: Pop) -> None:
    long_group = "g" * 250  # %RETRY%<group>_T is over the 255 characters of a topic name
    _send(broker, 2)
    (first,) = pop.service.pop(long_group, "T", 1, invisible_ms=5_000).messages
    assert first.delivery_attempt == 1
    assert len(pop.service.pop("G", "T", 32, invisible_ms=5_000).messages) == 2
    assert pop.at(T0 + 6_000) == 2  # G's two; the long group's copy is refused by the broker, not stored
    assert len(_records(broker, RETRY, 0)) == 2
    assert pop.at(T0 + 60_000) == 0


def test_a_broker_without_revive_progress_takes_it_from_the_revive_groups_offsets(broker: Broker, pop: Pop) -> None:
    _send(broker, 1)
    pop.service.pop("G", "T", 1, invisible_ms=5_000)
    assert pop.at(T0 + 6_000) == 1
    broker.offsets.persist()
    revive_progress_path(broker.config.lake, broker.broker_name).unlink()  # as a store ingested from RocketMQ
    again = PopService(broker, pop.timer)
    assert again.revive(T0 + 60_000) == 0 and len(_records(broker, RETRY, 0)) == 1


def test_checkpoint_keys_and_handles_that_rocketmqs_joined_keys_would_confuse() -> None:
    one = PopCheckPoint("T", 1, 23, 1000, 5000, (0,), "G", "b")
    other = PopCheckPoint("T", 12, 3, 1000, 5000, (0,), "G", "b")
    assert one.key != other.key  # joined with no separator both are "TG1231000b"
    with pytest.raises(PopError, match=r"^receipt_handle="):
        ReceiptHandle.decode("5 1 2 9 0 b 1 7 9")  # revive queue 9 of 8


def _bodies_of(result: PopResult) -> list[bytes]:
    return [m.message.body for m in result.messages]


def test_a_fifo_group_gets_a_queues_next_message_only_once_the_previous_is_acked_or_dead(
    broker: Broker, pop: Pop
) -> None:
    broker.update_subscription_group(SubscriptionGroupConfig("F", retry_max_times=1, consume_message_orderly=True))
    _send(broker, 6)  # m0, m2, m4 in queue 0; m1, m3, m5 in queue 1
    timer_records = len(_records(broker, c.TIMER_TOPIC, 0))
    (head,) = pop.service.pop("F", "T", 1, invisible_ms=5_000, attempt_id="a").messages
    (other,) = pop.service.pop("F", "T", 1, invisible_ms=5_000).messages  # the first queue waits for its head
    q, o = head.message.queue_id, other.message.queue_id
    assert {head.message.body, other.message.body} == {b"m0", b"m1"} and q != o
    blocked = pop.service.pop("F", "T", 32, invisible_ms=5_000)
    assert blocked.messages == [] and blocked.orderly and blocked.unblocks_in_ms == 5_000
    assert len(_records(broker, c.TIMER_TOPIC, 0)) == timer_records  # FIFO pops write no checkpoint
    same = pop.service.pop("F", "T", 1, invisible_ms=5_000, attempt_id="a")  # a repeated receive
    assert _bodies_of(same) == [head.message.body] and same.messages[0].delivery_attempt == 1
    pop.service.ack("F", "T", same.messages[0].receipt_handle)
    assert broker.query_offset("F", "T", q) == 1  # acked up to
    (following,) = pop.service.pop("F", "T", 1, invisible_ms=5_000).messages  # queue o is still blocked
    assert following.message.body == f"m{q + 2}".encode()
    pop.clock.now = T0 + 5_000  # the other head and the following one were not acked: given again
    restarted = PopService(broker, pop.timer)  # the batches are kept durably
    again = [restarted.pop("F", "T", 1, invisible_ms=5_000).messages[0] for _ in range(2)]
    assert sorted((m.message.body, m.delivery_attempt) for m in again) == sorted(
        [(other.message.body, 2), (following.message.body, 2)]
    )
    pop.clock.now = T0 + 10_000  # still not acked: past the group's 2 attempts, dead-lettered and acked
    dead = restarted.pop("F", "T", 32, invisible_ms=5_000)  # each queue's batch: its dead letter, then the next
    assert dead.dead_lettered == 2
    rest = {f"m{q + 4}".encode(), f"m{o + 2}".encode(), f"m{o + 4}".encode()}
    assert {m.message.body for m in dead.messages} == rest and {m.delivery_attempt for m in dead.messages} == {1}
    assert sorted(m.body for m in _records(broker, "%DLQ%F", 0)) == sorted([other.message.body, following.message.body])
    assert [broker.query_offset("F", "T", queue) for queue in (q, o)] == [2, 1]  # past the dead letters


def test_a_sql92_filter_pops_the_messages_whose_properties_match_and_passes_over_the_rest(
    broker: Broker, pop: Pop
) -> None:
    for i in range(6):
        broker.put_message(InnerMessage("T", 0, f"m{i}".encode(), {"UNIQ_KEY": f"U{i}", "n": str(i)}))
    result = pop.service.pop("G", "T", 32, invisible_ms=5_000, expression="n >= 3", expression_type="SQL92")
    assert _bodies(result.messages) == [b"m3", b"m4", b"m5"]
    assert broker.query_offset("G", "T", 0) == 6  # the others were passed over
    (ck,) = (PopCheckPoint.from_json(r.body.decode()) for r in _records(broker, c.TIMER_TOPIC, 0))
    assert ck.offsets == (3, 4, 5)
    with pytest.raises(ValidationError, match=r"^filter_expression="):
        pop.service.pop("G", "T", expression="n >", expression_type="SQL92")
