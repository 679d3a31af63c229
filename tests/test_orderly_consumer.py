"""The orderly push consumer on a real broker: order, suspension, commits, DLQ, locks, rebalance.

Most tests step the consumer with :meth:`OrderlyPushConsumer.poll_once` at explicit times (epoch
ms from ``T0``); the tests about threads run the consumers' own threads on the real clock.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_model.broker import Broker, BrokerConfig, InnerMessage
from broker_model.client import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    OrderlyConsumerConfig,
    OrderlyPushConsumer,
    ReadOffsetType,
)
from broker_model.common import MessageQueue
from broker_model.common import constants as c
from broker_model.store import MessageExt
from schemas.errors import BrokerError, ValidationError
from tests.helpers import wait_until

T0 = 1_800_000_000_000
SUCCESS = ConsumeOrderlyStatus.SUCCESS
COMMIT = ConsumeOrderlyStatus.COMMIT
ROLLBACK = ConsumeOrderlyStatus.ROLLBACK
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

Script = Callable[[MessageExt, int, ConsumeOrderlyContext], "ConsumeOrderlyStatus | None"]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    started = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH")).start()
    yield started
    started.shutdown()


def _fill(broker: Broker, topic: str, queue_nums: int, per_queue: int, start: int = 0) -> None:
    """Put ``per_queue`` messages into every queue of ``topic`` (bodies ``q-i``), one commit."""
    broker.ensure_topic(topic, queue_nums)
    broker.put_messages(
        [
            InnerMessage(topic, q, f"{q}-{i}".encode(), {}, born_host="10.0.0.1:1")
            for i in range(start, start + per_queue)
            for q in range(queue_nums)
        ]
    )


class Recorder:
    """A listener that records each call and answers with ``script(first message, attempt, context)``
    (attempt counts the calls that started with that message, from 1)."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script
        self.calls: list[tuple[int, list[int]]] = []  # (queue id, queue offsets of the batch)
        self.attempts: Counter[tuple[int, int]] = Counter()
        self.seen_reconsume_times: dict[tuple[int, int], list[int]] = defaultdict(list)  # in-memory counts seen

    def __call__(self, messages: list[MessageExt], context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus | None:
        first = messages[0]
        key = (first.queue_id, first.queue_offset)
        self.attempts[key] += 1
        self.calls.append((first.queue_id, [m.queue_offset for m in messages]))
        self.seen_reconsume_times[key].append(first.reconsume_times)
        if self.script is None:
            return SUCCESS
        return self.script(first, self.attempts[key], context)

    def offsets(self, queue_id: int) -> list[int]:
        """Every delivered offset of one queue, in delivery order."""
        return [o for q, batch in self.calls if q == queue_id for o in batch]


def _consumer(
    broker: Broker, listener: Any, client_id: str = "A", topic: str = "T", group: str = "g", **settings: Any
) -> OrderlyPushConsumer:
    config = OrderlyConsumerConfig(client_id=client_id, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **settings)
    consumer = OrderlyPushConsumer([broker], group, listener, config)
    consumer.subscribe(topic)
    return consumer


def _memory_offset(consumer: OrderlyPushConsumer, queue: MessageQueue) -> int:
    return consumer.offset_store.read_offset(queue, ReadOffsetType.READ_FROM_MEMORY)


def _queue(queue_id: int, topic: str = "T") -> MessageQueue:
    return MessageQueue("broker-a", topic, queue_id)


# -- order and offsets ------------------------------------------------------------------------------


def test_each_queue_is_delivered_in_queue_order_one_message_per_call(broker: Broker) -> None:
    _fill(broker, "T", 4, 5)
    recorder = Recorder()
    consumer = _consumer(broker, recorder)
    consumer.poll_once(T0)
    for queue_id in range(4):
        assert recorder.offsets(queue_id) == [0, 1, 2, 3, 4]
        assert _memory_offset(consumer, _queue(queue_id)) == 5
    assert all(len(batch) == 1 for _, batch in recorder.calls)  # consume_message_batch_max_size 1
    _fill(broker, "T", 4, 2, start=5)  # later arrivals continue the order
    consumer.poll_once(T0 + 200)
    assert recorder.offsets(2) == [0, 1, 2, 3, 4, 5, 6]
    consumer.shutdown()
    assert [broker.query_offset("g", "T", q) for q in range(4)] == [7, 7, 7, 7]
    assert broker.consumer_ids("g") == []  # left the group
    assert broker.rebalance_locks.is_lock_all_expired("g")  # released every lock


def test_a_restarted_consumer_continues_after_the_persisted_offsets(broker: Broker) -> None:
    _fill(broker, "T", 2, 3)
    first = _consumer(broker, Recorder())
    first.poll_once(T0)
    first.shutdown()
    _fill(broker, "T", 2, 2, start=3)
    recorder = Recorder()
    again = _consumer(broker, recorder, client_id="A2")
    again.poll_once(T0 + 1000)
    assert (recorder.offsets(0), recorder.offsets(1)) == ([3, 4], [3, 4])
    again.shutdown()


def test_batches_hold_at_most_consume_message_batch_max_size_messages(broker: Broker) -> None:
    _fill(broker, "T", 1, 7)
    recorder = Recorder()
    consumer = _consumer(broker, recorder, consume_message_batch_max_size=3)
    consumer.poll_once(T0)
    assert recorder.calls == [(0, [0, 1, 2]), (0, [3, 4, 5]), (0, [6])]
    assert _memory_offset(consumer, _queue(0)) == 7


# -- suspension ---------------------------------------------------------------------------------------


def test_suspend_stalls_only_its_own_queue_for_the_suspend_time(broker: Broker) -> None:
    _fill(broker, "T", 4, 5)
    recorder = Recorder(
        lambda m, attempt, _: SUSPEND if m.queue_id == 0 and m.queue_offset == 1 and attempt < 3 else SUCCESS
    )
    consumer = _consumer(broker, recorder)
    consumer.poll_once(T0)
    assert recorder.offsets(0) == [0, 1]
    assert [recorder.offsets(q) for q in (1, 2, 3)] == [[0, 1, 2, 3, 4]] * 3
    assert _memory_offset(consumer, _queue(0)) == 1  # the suspended message is not committed
    _fill(broker, "T", 4, 1, start=5)
    consumer.poll_once(T0 + 999)
    assert recorder.offsets(0) == [0, 1]  # still suspended, new arrivals wait behind it
    assert recorder.offsets(3)[-1] == 5  # other queues keep going
    consumer.poll_once(T0 + 1000)
    assert recorder.offsets(0) == [0, 1, 1]
    consumer.poll_once(T0 + 2000)
    assert recorder.offsets(0) == [0, 1, 1, 1, 2, 3, 4, 5]
    assert recorder.seen_reconsume_times[(0, 1)] == [0, 1, 2]  # counted in memory by the consumer
    assert _memory_offset(consumer, _queue(0)) == 6


@pytest.mark.parametrize(("asked", "waited"), [(-1, 1000), (1, 10), (250, 250), (50_000, 30_000)])
def test_suspend_time_comes_from_the_context_clamped_to_10_ms_and_30_s(broker: Broker, asked: int, waited: int) -> None:
    _fill(broker, "T", 1, 1)

    def script(_: MessageExt, attempt: int, context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        context.suspend_current_queue_time_millis = asked
        return SUSPEND if attempt == 1 else SUCCESS

    recorder = Recorder(script)
    consumer = _consumer(broker, recorder)
    consumer.poll_once(T0)
    consumer.poll_once(T0 + waited - 1)
    assert recorder.offsets(0) == [0]
    consumer.poll_once(T0 + waited)
    assert recorder.offsets(0) == [0, 0]


def _raise(*_: object) -> ConsumeOrderlyStatus:
    raise RuntimeError("listener failed")


@pytest.mark.parametrize("failing", [_raise, lambda *_: None], ids=["raises", "returns-none"])
def test_a_listener_that_raises_or_returns_none_suspends_its_queue(broker: Broker, failing: Script) -> None:
    _fill(broker, "T", 2, 2)
    recorder = Recorder(lambda m, n, ctx: failing(m, n, ctx) if m.queue_id == 0 and n == 1 else SUCCESS)
    consumer = _consumer(broker, recorder)
    consumer.poll_once(T0)
    assert (recorder.offsets(0), recorder.offsets(1)) == ([0], [0, 1])
    consumer.poll_once(T0 + 1000)
    assert recorder.offsets(0) == [0, 0, 1]


# -- the reconsume limit ------------------------------------------------------------------------------


def test_reconsume_limit_sends_the_message_to_the_dlq_and_consumption_moves_on(broker: Broker) -> None:
    _fill(broker, "T", 2, 4)
    poison = (0, 1)
    recorder = Recorder(lambda m, _a, _c: SUSPEND if (m.queue_id, m.queue_offset) == poison else SUCCESS)
    consumer = _consumer(broker, recorder, group="orders", max_reconsume_times=2)
    for step in range(3):
        consumer.poll_once(T0 + step * 1000)
    assert recorder.offsets(0) == [0, 1, 1, 1, 2, 3]  # the first try plus 2 reconsumes, then on
    assert recorder.seen_reconsume_times[poison] == [0, 1, 2]
    assert _memory_offset(consumer, _queue(0)) == 4
    dead = broker.pull(c.DLQ_GROUP_TOPIC_PREFIX + "orders", 0, 0).messages
    assert [(m.body, m.reconsume_times, m.properties[c.PROPERTY_RETRY_TOPIC]) for m in dead] == [(b"0-1", 3, "T")]
    assert broker.queue_nums(c.DLQ_GROUP_TOPIC_PREFIX + "orders") == 1
    consumer.shutdown()


def test_orderly_reconsume_limit_defaults_to_unlimited(broker: Broker) -> None:
    _fill(broker, "T", 1, 1)
    recorder = Recorder(lambda *_: SUSPEND)
    consumer = _consumer(broker, recorder, group="orders")
    assert consumer.max_reconsume_times() == c.JAVA_INT_MAX
    for step in range(20):
        consumer.poll_once(T0 + step * 1000)
    assert recorder.offsets(0) == [0] * 20
    assert broker.queue_nums(c.DLQ_GROUP_TOPIC_PREFIX + "orders") is None


# -- auto commit ---------------------------------------------------------------------------------------


def test_auto_commit_false_commits_on_commit_and_redelivers_everything_uncommitted_on_rollback(
    broker: Broker,
) -> None:
    _fill(broker, "T", 1, 5)
    answers = {
        (0, 1): SUCCESS,
        (1, 1): ROLLBACK,
        (0, 2): SUCCESS,
        (1, 2): COMMIT,
        (2, 1): SUCCESS,
        (3, 1): SUSPEND,
        (3, 2): COMMIT,
        (4, 1): SUCCESS,
    }

    def script(m: MessageExt, attempt: int, context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        context.auto_commit = False
        return answers[(m.queue_offset, attempt)]

    recorder = Recorder(script)
    consumer = _consumer(broker, recorder)
    consumer.poll_once(T0)
    assert recorder.offsets(0) == [0, 1]  # SUCCESS did not commit; ROLLBACK put 0 and 1 back
    assert _memory_offset(consumer, _queue(0)) == -1
    consumer.poll_once(T0 + 1000)
    assert recorder.offsets(0) == [0, 1, 0, 1, 2, 3]
    assert _memory_offset(consumer, _queue(0)) == 2  # COMMIT of 1; 2 (SUCCESS) and 3 (SUSPEND) are open
    consumer.poll_once(T0 + 2000)
    assert recorder.offsets(0) == [0, 1, 0, 1, 2, 3, 3, 4]
    assert _memory_offset(consumer, _queue(0)) == 4  # COMMIT of 3 covers 2; 4 (SUCCESS) stays open
    consumer.shutdown()
    assert broker.query_offset("g", "T", 0) == 4


def test_auto_commit_true_treats_commit_and_rollback_as_success(broker: Broker) -> None:
    _fill(broker, "T", 1, 3)
    answers = iter([ROLLBACK, COMMIT, SUCCESS])
    recorder = Recorder(lambda *_: next(answers))
    consumer = _consumer(broker, recorder)
    consumer.poll_once(T0)
    assert recorder.offsets(0) == [0, 1, 2]
    assert _memory_offset(consumer, _queue(0)) == 3


# -- locks and rebalance ------------------------------------------------------------------------------


def test_two_clients_split_the_queues_and_one_takes_all_when_the_other_leaves(broker: Broker) -> None:
    _fill(broker, "T", 4, 3)
    a_calls, b_calls = Recorder(), Recorder()
    a = _consumer(broker, a_calls, client_id="A")
    b = _consumer(broker, b_calls, client_id="B")
    a.poll_once(T0)
    assert a.held_queues(T0) == {_queue(q) for q in range(4)}
    b.poll_once(T0 + 10)  # B joins; its share is still locked by A
    assert b.held_queues(T0 + 10) == set()
    a.poll_once(T0 + 20)  # A sees the new member and gives q2, q3 away (nothing cached: unlocked at once)
    assert a.held_queues(T0 + 20) == {_queue(0), _queue(1)}
    assert broker.rebalance_locks.holder("g", _queue(2), T0 + 20) is None
    b.poll_once(T0 + 510)  # B's retry 500 ms after the refused lock
    assert b.held_queues(T0 + 510) == {_queue(2), _queue(3)}
    assert b_calls.calls == []  # A's persisted offsets: nothing to consume again
    _fill(broker, "T", 4, 1, start=3)
    a.poll_once(T0 + 700)  # the next pulls of idle queues come pull_idle_delay_ms (100 ms) later
    b.poll_once(T0 + 700)
    assert {q for q, batch in a_calls.calls if 3 in batch} == {0, 1}
    assert sorted(b_calls.calls) == [(2, [3]), (3, [3])]
    b.shutdown()  # unlocks and leaves
    a.poll_once(T0 + 700)
    assert a.held_queues(T0 + 700) == {_queue(q) for q in range(4)}
    a.shutdown()


def test_renewal_every_20_s_keeps_a_consumers_locks_past_the_lease(broker: Broker) -> None:
    _fill(broker, "T", 2, 1)
    a = _consumer(broker, Recorder(), client_id="A")
    for moment in (T0, T0 + 1000, T0 + 21_000, T0 + 41_000):  # lock_all: 1 s after start, then every 20 s
        a.poll_once(moment)
    queues = [_queue(0), _queue(1)]
    assert broker.lock_batch("g", queues, "X", now=T0 + 100_000) == set()  # renewed at T0 + 41 s
    assert a.held_queues(T0 + 71_000) == set(queues)  # the client trusts the last grant for 30 s
    assert a.held_queues(T0 + 71_001) == set()
    assert broker.lock_batch("g", queues, "X", now=T0 + 101_001) == set(queues)


def test_a_lock_of_a_silent_client_expires_and_another_client_takes_it(broker: Broker) -> None:
    _fill(broker, "T", 4, 2)
    a = _consumer(broker, Recorder(), client_id="A")
    a.poll_once(T0)  # A takes every queue, then stops renewing (a hung or crashed client)
    b_calls = Recorder()
    b = _consumer(broker, b_calls, client_id="B")
    _fill(broker, "T", 4, 1, start=2)
    b.poll_once(T0 + 10)
    b.poll_once(T0 + 60_000)  # A's lease: exactly 60 s, still A's; B retries 500 ms later
    assert b.held_queues(T0 + 60_000) == set() and b_calls.calls == []
    b.poll_once(T0 + 60_500)
    assert b.held_queues(T0 + 60_500) == {_queue(2), _queue(3)}
    assert broker.rebalance_locks.holder("g", _queue(2), T0 + 60_500) == "B"
    assert broker.rebalance_locks.holder("g", _queue(0), T0 + 60_500) is None  # expired, not B's share
    # A died before its first offset persist (every 5 s): B starts over, at least once
    assert (b_calls.offsets(2), b_calls.offsets(3)) == ([0, 1, 2], [0, 1, 2])
    assert a.held_queues(T0 + 30_000) == {_queue(q) for q in range(4)}
    assert a.held_queues(T0 + 30_001) == set()  # A's own view lapsed 30 s after its last grant
    a.poll_once(T0 + 60_501)  # A comes back: it gives B's share away and renews its own
    assert a.held_queues(T0 + 60_501) == {_queue(0), _queue(1)}
    assert broker.rebalance_locks.holder("g", _queue(2), T0 + 60_501) == "B"


def test_releasing_a_queue_with_cached_messages_delays_the_unlock_by_20_s(broker: Broker) -> None:
    _fill(broker, "T", 2, 3)
    a_calls = Recorder(lambda m, _a, _c: SUSPEND if m.queue_id == 1 else SUCCESS)
    a = _consumer(broker, a_calls, client_id="A")
    b_calls = Recorder()
    b = _consumer(broker, b_calls, client_id="B")
    a.poll_once(T0)  # q1's messages stay cached behind the suspended one
    b.poll_once(T0 + 10)
    a.poll_once(T0 + 20)  # q1 goes to B: A drops it and schedules the unlock at T0 + 20_020
    assert _queue(1) not in a.held_queues(T0 + 20)
    b.poll_once(T0 + 20_000)
    assert b.held_queues(T0 + 20_000) == set()
    a.poll_once(T0 + 20_019)
    assert broker.rebalance_locks.holder("g", _queue(1), T0 + 20_019) == "A"
    a.poll_once(T0 + 20_020)
    assert broker.rebalance_locks.holder("g", _queue(1), T0 + 20_020) is None
    assert a_calls.offsets(1) == [0]  # the dropped queue was not consumed again
    b.poll_once(T0 + 20_500)
    assert b.held_queues(T0 + 20_500) == {_queue(1)}
    assert b_calls.offsets(1) == [0, 1, 2]


def test_releasing_a_queue_with_nothing_cached_unlocks_at_once(broker: Broker) -> None:
    _fill(broker, "T", 2, 3)
    a = _consumer(broker, Recorder(), client_id="A")
    b = _consumer(broker, Recorder(), client_id="B")
    a.poll_once(T0)
    b.poll_once(T0 + 10)
    a.poll_once(T0 + 20)
    assert broker.rebalance_locks.holder("g", _queue(1), T0 + 20) is None
    b.poll_once(T0 + 510)
    assert b.held_queues(T0 + 510) == {_queue(1)}


def test_two_clients_in_threads_never_consume_a_queue_at_once(broker: Broker) -> None:
    """A runs throughout; clients B0..B3 join and leave in turn while a producer keeps sending.
    Every listener call records the queue's lock holder on the broker (it must be the caller) and
    checks that no other call runs on its queue; every queue's deliveries start at 0 and never
    skip an offset (a new owner may repeat uncommitted ones)."""
    _fill(broker, "R", 4, 20)
    guard = threading.Lock()
    running: dict[int, str] = {}
    overlaps: list[tuple[int, str, str]] = []
    holders: list[tuple[int, str, str | None]] = []  # (queue id, caller, broker lock holder)
    deliveries: dict[int, list[tuple[str, int]]] = defaultdict(list)

    def listener_of(client: str) -> Callable[[list[MessageExt], ConsumeOrderlyContext], ConsumeOrderlyStatus]:
        def listener(messages: list[MessageExt], context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
            queue_id = context.message_queue.queue_id
            holder = broker.rebalance_locks.holder("g", context.message_queue)
            with guard:
                holders.append((queue_id, client, holder))
                if queue_id in running:
                    overlaps.append((queue_id, running[queue_id], client))
                running[queue_id] = client
                deliveries[queue_id].extend((client, m.queue_offset) for m in messages)
            time.sleep(0.004)  # long enough that a queue is mostly busy while it changes hands
            with guard:
                running.pop(queue_id, None)
            return SUCCESS

        return listener

    produced = [20] * 4
    stop = threading.Event()

    def produce() -> None:  # 4 messages per queue every 30 ms: about half of what the listener keeps up with
        while not stop.wait(0.03):
            _fill(broker, "R", 4, 4, start=produced[0])
            produced[:] = [n + 4 for n in produced]

    fast = {
        "rebalance_interval_ms": 100,
        "lock_interval_ms": 200,
        "unlock_delay_ms": 100,
        "pull_idle_delay_ms": 10,
        "persist_offset_interval_ms": 200,
        "consume_thread_max": 4,
    }
    producer = threading.Thread(target=produce)
    producer.start()
    a = _consumer(broker, listener_of("A"), client_id="A", topic="R", **fast).start()
    try:
        for round_ in range(4):
            b = _consumer(broker, listener_of(f"B{round_}"), client_id=f"B{round_}", topic="R", **fast).start()
            wait_until(lambda name=f"B{round_}": _has_consumed(holders, name, guard), f"B{round_} consuming")
            b.shutdown()
            wait_until(lambda: _holds_all(broker, "A", 4), "A holding every queue again")
    finally:
        stop.set()
        producer.join()
    wait_until(lambda: _all_delivered(deliveries, produced, guard), "every produced message delivered")
    a.shutdown()
    assert overlaps == []
    assert [h for h in holders if h[1] != h[2]] == []
    assert _all_delivered(deliveries, produced, guard)
    for queue_id in range(4):
        offsets = [o for _, o in deliveries[queue_id]]
        assert offsets[0] == 0
        assert all(later <= earlier + 1 for earlier, later in itertools.pairwise(offsets))
    consumers_per_queue = {q: {client for client, _ in deliveries[q]} for q in range(4)}
    assert any(len(clients) > 1 for clients in consumers_per_queue.values())  # queues changed hands
    assert a.last_listener_error is None


def _has_consumed(holders: list[tuple[int, str, str | None]], client: str, guard: threading.Lock) -> bool:
    with guard:
        return any(consumer == client for _, consumer, _ in holders)


def _holds_all(broker: Broker, client: str, queues: int) -> bool:
    return all(broker.rebalance_locks.holder("g", MessageQueue("broker-a", "R", q)) == client for q in range(queues))


def _all_delivered(deliveries: dict[int, list[tuple[str, int]]], produced: list[int], guard: threading.Lock) -> bool:
    with guard:
        return all({o for _, o in deliveries[q]} >= set(range(produced[q])) for q in range(4))


def test_broadcasting_consumers_each_take_every_queue_without_locks(broker: Broker, tmp_path: Path) -> None:
    _fill(broker, "T", 2, 2)
    recorders = {"A": Recorder(), "B": Recorder()}
    consumers = [
        _consumer(broker, recorders[cid], client_id=cid, message_model="BROADCASTING", offset_dir=tmp_path / "local")
        for cid in ("A", "B")
    ]
    for consumer in consumers:
        consumer.poll_once(T0)
    assert all(r.offsets(0) == [0, 1] and r.offsets(1) == [0, 1] for r in recorders.values())
    assert broker.rebalance_locks.is_lock_all_expired("g", T0)  # no lock was ever taken
    for consumer in consumers:
        consumer.shutdown()
    assert (tmp_path / "local" / "A" / "g" / "offsets.json").exists()
    assert broker.query_offset("g", "T", 0) == -1  # broadcasting offsets stay with the clients


# -- configuration and life cycle ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"consume_message_batch_max_size": 0}, "consume_message_batch_max_size"),
        ({"consume_message_batch_max_size": 1025}, "consume_message_batch_max_size"),
        ({"message_model": "BROADCASTING"}, "offset_dir"),
        ({"max_reconsume_times": -2}, "max_reconsume_times"),
        ({"message_model": "FANOUT"}, "message_model"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(broker: Broker, settings: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        OrderlyPushConsumer([broker], "g", Recorder(), OrderlyConsumerConfig(**settings))


def test_stepping_needs_a_subscription_and_is_refused_while_threads_run(broker: Broker) -> None:
    _fill(broker, "T", 1, 1)
    idle = OrderlyPushConsumer([broker], "g", Recorder(), OrderlyConsumerConfig(client_id="A"))
    with pytest.raises(BrokerError, match="subscribe"):
        idle.poll_once(T0)
    running = _consumer(broker, Recorder(), client_id="B").start()
    try:
        with pytest.raises(BrokerError, match="poll_once"):
            running.poll_once(T0)
    finally:
        running.shutdown()
