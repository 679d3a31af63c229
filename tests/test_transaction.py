"""Transactional messages through the real broker: every path, the check service, a crash."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_model.broker import (
    TRANSACTION_GROUP,
    Broker,
    BrokerConfig,
    EndTransactionRequest,
    LocalTransactionState,
    TransactionCheckService,
    TransactionError,
    calculate_op_offset,
    end_transaction,
    parse_op_body,
)
from broker_model.client import TransactionProducer
from broker_model.common import Message
from broker_model.common import constants as c
from broker_model.store import MessageExt
from tests.helpers import ManualClock
from tests.log_invariants import check_log, read_log

REPO = Path(__file__).resolve().parents[1]
COMMIT, ROLLBACK, UNKNOW = (
    LocalTransactionState.COMMIT_MESSAGE,
    LocalTransactionState.ROLLBACK_MESSAGE,
    LocalTransactionState.UNKNOW,
)


class Listener:
    """Executes to ``arg``; answers check-backs from ``answers`` (UNKNOW when absent)."""

    def __init__(self) -> None:
        self.answers: dict[str, LocalTransactionState | Exception] = {}
        self.checked: list[MessageExt] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        if isinstance(arg, Exception):
            raise arg
        return arg  # type: ignore[no-any-return]

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message)
        answer = self.answers.get(message.uniq_key or "", UNKNOW)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Iterator[Broker]:
    started = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", clock=clock)).start()
    yield started
    started.shutdown()


@pytest.fixture
def listener() -> Listener:
    return Listener()


@pytest.fixture
def producer(broker: Broker, listener: Listener, clock: ManualClock) -> TransactionProducer:
    return TransactionProducer([broker], "pg", listener, seed=1, clock=clock)


def _log(broker: Broker, topic: str | None = None) -> list[dict[str, Any]]:
    rows = read_log(broker.config.lake, broker.broker_name)
    return [r for r in rows if topic is None or r["topic"] == topic]


def test_commit_writes_half_then_final_then_op_exactly_as_rocketmq(
    broker: Broker, producer: TransactionProducer
) -> None:
    sent = producer.send_message_in_transaction(Message.create("Pay", b"ok", tags="t", delay_level=4), COMMIT)
    half, final, op = _log(broker)
    assert (half["topic"], half["queue_id"], half["sys_flag"] & 12) == (c.RMQ_SYS_TRANS_HALF_TOPIC, 0, 0)
    assert {
        k: half["properties"][k] for k in ("REAL_TOPIC", "REAL_QID", "PGROUP", "TRAN_MSG", "__transactionId__")
    } == {
        "REAL_TOPIC": "Pay",
        "REAL_QID": str(sent.send_result.message_queue.queue_id),
        "PGROUP": "pg",
        "TRAN_MSG": "true",
        "__transactionId__": sent.transaction_id,
    }
    assert "DELAY" not in half["properties"]  # delay levels are dropped on transactional messages
    assert (final["topic"], final["queue_id"]) == ("Pay", sent.send_result.message_queue.queue_id)
    assert final["sys_flag"] & 12 == c.TRANSACTION_COMMIT_TYPE
    assert final["prepared_transaction_offset"] == half["commit_log_offset"]
    assert final["properties"]["TRAN_MSG"] == "true" and final["body"] == b"ok"
    assert (op["topic"], op["queue_id"], op["tags"], op["body"]) == (c.RMQ_SYS_TRANS_OP_HALF_TOPIC, 0, "d", b"0")
    assert broker.pull("Pay", final["queue_id"], 0).messages[0].body == b"ok"
    assert check_log(_log(broker), c.DEFAULT_SEGMENT_SIZE) == []


def test_rollback_writes_only_the_op(broker: Broker, producer: TransactionProducer) -> None:
    producer.send_message_in_transaction(Message.create("Pay", b"no"), ROLLBACK)
    assert [r["topic"] for r in _log(broker)] == [c.RMQ_SYS_TRANS_HALF_TOPIC, c.RMQ_SYS_TRANS_OP_HALF_TOPIC]
    assert broker.max_offset("Pay", 0) + broker.max_offset("Pay", 1) == 0


@pytest.mark.parametrize(("answer", "finals"), [(COMMIT, 1), (ROLLBACK, 0)])
def test_unknown_then_checked_back_ends_the_transaction(
    broker: Broker,
    producer: TransactionProducer,
    listener: Listener,
    clock: ManualClock,
    answer: LocalTransactionState,
    finals: int,
) -> None:
    sent = producer.send_message_in_transaction(Message.create("Pay", b"later"), UNKNOW)
    service = TransactionCheckService(broker)
    assert service.check(clock.now + 1000).checked == []  # inside the 6 s timeout: too new
    listener.answers[sent.transaction_id] = answer
    clock.now += 7000
    report = service.check(clock.now)
    assert report.checked == [sent.transaction_id]
    copy = listener.checked[0]
    assert copy.properties[c.PROPERTY_TRANSACTION_CHECK_TIMES] == "1" and copy.queue_offset == 1
    assert len(_log(broker, "Pay")) == finals
    if finals:
        assert _log(broker, "Pay")[0]["prepared_transaction_offset"] == copy.commit_log_offset
    assert [r["body"] for r in _log(broker, c.RMQ_SYS_TRANS_OP_HALF_TOPIC)] == [b"1"]  # the op ends the copy
    clock.now += 60_000
    assert service.check(clock.now).checked == []  # resolved: never asked again


def test_unknown_forever_is_discarded_after_fifteen_checks(
    broker: Broker, producer: TransactionProducer, listener: Listener, clock: ManualClock
) -> None:
    sent = producer.send_message_in_transaction(Message.create("Pay", b"stuck"), UNKNOW)
    service = TransactionCheckService(broker)
    rounds = 0
    while True:
        clock.now += 60_000
        report = service.check(clock.now)
        rounds += 1
        if report.discarded:
            break
        assert report.checked == [sent.transaction_id]
    assert rounds == 16 and len(listener.checked) == 15
    discard = _log(broker, c.TRANS_CHECK_MAX_TIME_TOPIC)
    assert [(d["properties"]["TRANSACTION_CHECK_TIMES"], d["uniq_key"]) for d in discard] == [
        ("15", sent.transaction_id)
    ]
    clock.now += 60_000
    assert service.check(clock.now).checked == []
    assert broker.query_offset(TRANSACTION_GROUP, c.RMQ_SYS_TRANS_HALF_TOPIC, 0) == 16


def test_half_message_older_than_the_file_reserve_time_is_discarded_unchecked(
    broker: Broker, producer: TransactionProducer, listener: Listener, clock: ManualClock
) -> None:
    producer.send_message_in_transaction(Message.create("Pay", b"old"), UNKNOW)
    clock.now += 72 * 3600 * 1000 + 1
    report = TransactionCheckService(broker).check(clock.now)
    assert report.discarded and not listener.checked


def test_a_listener_that_raises_leaves_the_transaction_to_the_check_service(
    broker: Broker, producer: TransactionProducer, listener: Listener, clock: ManualClock
) -> None:
    sent = producer.send_message_in_transaction(Message.create("Pay", b"boom"), RuntimeError("db down"))
    assert sent.local_transaction_state is UNKNOW
    listener.answers[sent.transaction_id] = RuntimeError("still down")
    service = TransactionCheckService(broker)
    clock.now += 7000
    assert service.check(clock.now).checked == [sent.transaction_id]
    assert _log(broker, c.RMQ_SYS_TRANS_OP_HALF_TOPIC) == []
    listener.answers[sent.transaction_id] = COMMIT
    clock.now += 60_000
    assert service.check(clock.now).checked == [sent.transaction_id]
    assert len(_log(broker, "Pay")) == 1


def test_immunity_time_delays_the_check_and_forbids_a_late_end_outside_a_check(
    broker: Broker, producer: TransactionProducer, listener: Listener, clock: ManualClock
) -> None:
    message = Message.create("Pay", b"slow")
    message.properties[c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = "60"  # as MessageAccessor.putProperty
    sent = producer.send_message_in_transaction(message, UNKNOW)
    service = TransactionCheckService(broker)
    clock.now += 10_000
    assert service.check(clock.now).checked == []  # inside its immunity: copied forward, not checked
    copies = _log(broker, c.RMQ_SYS_TRANS_HALF_TOPIC)[1:]
    assert [r["properties"][c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] for r in copies] == ["0"]
    clock.now += 61_000
    request = EndTransactionRequest("pg", sent.send_result.queue_offset, sent.send_result.commit_log_offset, COMMIT)
    with pytest.raises(TransactionError, match="ILLEGAL_OPERATION"):
        end_transaction(broker, request)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"producer_group": "other"}, "The producer group wrong"),
        ({"tran_state_table_offset": 5}, "The transaction state table offset wrong"),
        ({"commit_log_offset": 12345}, "Find prepared transaction message failed"),
    ],
)
def test_end_transaction_checks_the_half_message_and_writes_nothing_when_wrong(
    broker: Broker, producer: TransactionProducer, change: dict[str, Any], message: str
) -> None:
    sent = producer.send_message_in_transaction(Message.create("Pay", b"x"), UNKNOW)
    fields = {
        "producer_group": "pg",
        "tran_state_table_offset": sent.send_result.queue_offset,
        "commit_log_offset": sent.send_result.commit_log_offset,
        "commit_or_rollback": COMMIT,
        **change,
    }
    before = len(_log(broker))
    with pytest.raises(TransactionError, match=message):
        end_transaction(broker, EndTransactionRequest(**fields))
    assert len(_log(broker)) == before


def test_unknown_end_does_nothing(broker: Broker, producer: TransactionProducer) -> None:
    sent = producer.send_message_in_transaction(Message.create("Pay", b"x"), UNKNOW)
    request = EndTransactionRequest("pg", sent.send_result.queue_offset, sent.send_result.commit_log_offset, UNKNOW)
    assert end_transaction(broker, request) == "NONE"
    assert len(_log(broker)) == 1


@pytest.mark.subprocess
def test_crash_between_final_and_op_ends_with_exactly_one_final_message(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.run(
        [sys.executable, str(REPO / "tests" / "tx_crash_process.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    uniq_key = child.stdout.split()[1]
    rows = read_log(tmp_path, "broker-a")
    assert [r["topic"] for r in rows] == [c.RMQ_SYS_TRANS_HALF_TOPIC, "Payments"]  # final written, op not

    listener = Listener()
    listener.answers[uniq_key] = COMMIT
    with Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH")).start() as broker:
        TransactionProducer([broker], "pg-crash", listener, seed=2)
        report = TransactionCheckService(broker).check(broker.config.clock() + 10_000)
    assert report.checked == [uniq_key]
    rows = read_log(tmp_path, "broker-a")
    assert [r["uniq_key"] for r in rows if r["topic"] == "Payments"] == [uniq_key]  # still exactly one
    assert len([r for r in rows if r["topic"] == c.RMQ_SYS_TRANS_OP_HALF_TOPIC]) == 1


@pytest.mark.parametrize(
    ("done", "old", "expected"), [([], 3, 3), ([3, 4, 6], 3, 5), ([4, 5], 3, 3), ([3, 3, 4], 3, 4)]
)
def test_calculate_op_offset_advances_over_a_contiguous_run_only(done: list[int], old: int, expected: int) -> None:
    assert calculate_op_offset(done, old) == expected


@pytest.mark.parametrize(("body", "offsets"), [(b"123", [123]), (b"5,6,9,", [5, 6, 9]), (b"7,", [7])])
def test_op_bodies_of_both_forms_parse(body: bytes, offsets: list[int]) -> None:
    assert parse_op_body(body) == offsets
