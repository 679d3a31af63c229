"""RocketMQ 5 timer messages on the real broker: the put path stores a message with a future
delivery time in the timer topic, the timer service delivers it at its millisecond in delivery-time
order, and a round a crash left pending is settled from the log, neither twice nor skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_model.broker import Broker, InnerMessage, TimerMessageService, timer_progress_path
from broker_model.common import constants as c
from broker_model.store import MessageExt
from schemas.errors import ValidationError
from tests.helpers import ManualClock

T0 = 1_800_000_000_000


def _put(broker: Broker, body: bytes, **properties: str) -> None:
    message = InnerMessage(topic="T", queue_id=1, body=body, properties={"UNIQ_KEY": body.hex(), **properties})
    broker.put_message(message)


def _queue(broker: Broker, topic: str, queue_id: int) -> list[MessageExt]:
    store = broker.store
    broker.flush()
    found = (store.message_at(topic, queue_id, q, decompress=False) for q in range(store.max_offset(topic, queue_id)))
    return [m for m in found if m is not None]


def test_a_future_delivery_time_waits_in_the_timer_topic_and_a_past_one_is_stored_at_once(
    broker: Broker, clock: ManualClock
) -> None:
    clock.now = T0
    _put(broker, b"later", TIMER_DELIVER_MS=str(T0 + 1234))
    _put(broker, b"now", TIMER_DELIVER_MS=str(T0))
    _put(broker, b"in-ms", TIMER_DELAY_MS="500")
    (entry, in_ms) = _queue(broker, c.TIMER_TOPIC, 0)
    assert (entry.body, entry.properties["TIMER_OUT_MS"]) == (b"later", str(T0 + 1234))
    assert (entry.properties["REAL_TOPIC"], entry.properties["REAL_QID"]) == ("T", "1")
    assert in_ms.properties["TIMER_OUT_MS"] == str(T0 + 500)
    assert [m.body for m in _queue(broker, "T", 1)] == [b"now"]
    bad_times = [  # (the property the error names, the properties)
        ("TIMER_DELIVER_MS", {"TIMER_DELIVER_MS": "soon"}),
        ("TIMER_DELIVER_MS", {"TIMER_DELIVER_MS": str(T0 + 4 * 86_400_000)}),
        ("TIMER_DELAY_SEC", {"TIMER_DELAY_SEC": "1.5"}),
        ("TIMER_DELAY_MS", {"TIMER_DELAY_MS": str(4 * 86_400_000), "TIMER_DELIVER_MS": str(T0 + 1)}),  # a delay wins
    ]
    for named, bad in bad_times:
        with pytest.raises(ValidationError, match=f"^{named}="):
            _put(broker, b"bad", **bad)
    assert len(_queue(broker, c.TIMER_TOPIC, 0)) == 2
    assert len(_queue(broker, "T", 1)) == 1


def test_a_timer_service_delivering_nothing_a_round_is_refused(broker: Broker) -> None:
    with pytest.raises(ValidationError, match="round_size"):
        TimerMessageService(broker, round_size=0)  # its rounds would never empty the heap


def test_entries_are_delivered_at_their_millisecond_in_delivery_time_order(broker: Broker, clock: ManualClock) -> None:
    clock.now = T0
    for delay in (300, 100, 200, 100):
        _put(broker, f"due+{delay}-{len(_queue(broker, c.TIMER_TOPIC, 0))}".encode(), TIMER_DELIVER_MS=str(T0 + delay))
    service = TimerMessageService(broker)
    assert service.deliver_due(T0 + 99) == 0 and service.waiting() == 4
    assert service.deliver_due(T0 + 100) == 2
    assert service.deliver_due(T0 + 299) == 1
    assert service.deliver_due(T0 + 300) == 1 and service.waiting() == 0
    delivered = _queue(broker, "T", 1)
    assert [m.body for m in delivered] == [b"due+100-1", b"due+100-3", b"due+200-2", b"due+300-0"]
    assert all("REAL_TOPIC" not in m.properties and "TIMER_DEQUEUE_MS" in m.properties for m in delivered)
    assert TimerMessageService(broker).deliver_due(T0 + 10_000) == 0  # a new service reads the progress


@pytest.mark.parametrize("landed", [True, False], ids=["put-landed", "put-lost"])
def test_a_round_a_crash_left_pending_is_settled_from_the_log(
    broker: Broker, clock: ManualClock, tmp_path: Path, landed: bool
) -> None:
    clock.now = T0
    for i in range(3):
        _put(broker, f"m{i}".encode(), TIMER_DELIVER_MS=str(T0 + 10))
    path = timer_progress_path(tmp_path, broker.broker_name)
    log_offset = broker.next_commit_log_offset
    if landed:  # the round's put went through, then the process died before the progress was saved
        TimerMessageService(broker, path=tmp_path / "elsewhere.json").deliver_due(T0 + 10)
    path.parent.mkdir(parents=True, exist_ok=True)
    pending = {"offsets": [0, 1, 2], "log_offset": log_offset}  # what the progress says before a put
    path.write_text(json.dumps({"floor": 0, "settled": [], "pending": pending}))

    service = TimerMessageService(broker)
    delivered_now = service.deliver_due(T0 + 10)

    assert delivered_now == (0 if landed else 3)
    assert sorted(m.body for m in _queue(broker, "T", 1)) == [b"m0", b"m1", b"m2"]  # each once
    assert json.loads(path.read_text()) == {"floor": 3, "settled": []}
