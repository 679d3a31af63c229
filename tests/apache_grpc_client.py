"""The official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified) against Apache
RocketMQ's proxy, as a process of its own for tests/test_apache_rocketmq.py:
``python -m tests.apache_grpc_client ENDPOINT STEP [-- STEP ...]``, the steps run in order.

- ``send TOPIC normal COUNT PREFIX``: COUNT messages keyed ``PREFIX-0``, ``PREFIX-1``, ...
- ``send TOPIC fifo COUNT PREFIX``: COUNT messages in each of the message groups ``PREFIX-a`` and
  ``PREFIX-b``, one group after the other, keyed ``PREFIX-<group>-<i>`` (property ``seq`` = i).
- ``send TOPIC timer COUNT PREFIX DELAY_S``: COUNT messages due DELAY_S seconds from now. The
  client puts ``delivery_timestamp`` into the protobuf Timestamp's seconds as it is, and the proxy
  refuses a time in milliseconds there, so it is given in whole seconds (the line carries ``due_ms``).
- ``send TOPIC transaction COUNT PREFIX``: COUNT transactions of each outcome: ``commit`` and
  ``rollback`` end them at once, ``check-commit`` and ``check-rollback`` leave them open for the
  broker's check-back, which the checker answers from the message's real outcome. The process
  waits (at its end) until every open one was checked.
- ``receive GROUP TOPIC COUNT [NACK_KEYS] [INVISIBLE_S]``: a SimpleConsumer of GROUP receives until
  COUNT distinct keys were acknowledged; a key of NACK_KEYS (comma-separated) is not acknowledged
  on its first delivery, so it comes again after INVISIBLE_S (default 2) seconds.

One JSON line per send receipt (``sent``), per received message (``received``) and per
check-back (``checked``), then ``done``. Run it with ``HOME`` set: the client creates
``~/logs/rocketmq_python`` when it is imported. Waits end after 90 s (exit 1).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

OUTCOMES = ("commit", "rollback", "check-commit", "check-rollback")
WAIT_S = 90.0
INVISIBLE_S = 10  # a received message's invisible time before it is acknowledged (or delivered again)
# Every call may take this long (the client's default is 3 s). A receive's deadline is this plus its
# long polling time, and the proxy refuses one that reaches it with less time left than the long
# polling asks for (40018), which a loaded machine can cause with 3 s.
REQUEST_TIMEOUT_S = 10
_out = threading.Lock()


def emit(line: dict[str, Any]) -> None:
    with _out:
        print(json.dumps(line), flush=True)


class Checker(TransactionChecker):  # type: ignore[misc]
    """Answers a check-back from the transaction's real outcome, carried in its ``outcome`` property."""

    def __init__(self) -> None:
        self.checked: set[str] = set()

    def check(self, message: Message) -> Any:
        outcome = message.properties.get("outcome", "")
        key = next(iter(message.keys), "")
        answer = TransactionResolution.ROLLBACK if outcome.endswith("rollback") else TransactionResolution.COMMIT
        emit({"event": "checked", "key": key, "outcome": outcome, "message_id": message.message_id})
        self.checked.add(key)
        return answer


def _configuration(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=REQUEST_TIMEOUT_S)


def _message(topic: str, key: str, body: str, tag: str) -> Message:
    message = Message()
    message.topic = topic
    message.body = body.encode()
    message.tag = tag
    message.keys = key
    return message


def _sent(kind: str, key: str, receipt: Any, **extra: Any) -> None:
    queue = receipt.message_queue
    emit(
        {
            "event": "sent",
            "kind": kind,
            "key": key,
            "message_id": receipt.message_id,
            "transaction_id": receipt.transaction_id,
            "offset": receipt.offset,
            "queue_id": getattr(queue, "queue_id", None) if queue is not None else None,
            "sent_ms": int(time.time() * 1000),
            **extra,
        }
    )


def send(producer: Producer, checker: Checker, awaited: set[str], args: list[str]) -> None:
    topic, kind, count, prefix = args[0], args[1], int(args[2]), args[3]
    if kind == "normal":
        for i in range(count):
            key = f"{prefix}-{i}"
            _sent(kind, key, producer.send(_message(topic, key, f"normal {key}", "normal")))
    elif kind == "fifo":
        for group in (f"{prefix}-a", f"{prefix}-b"):
            for i in range(count):
                key = f"{group}-{i}"
                message = _message(topic, key, f"fifo {key}", "fifo")
                message.message_group = group
                message.add_property("seq", str(i))
                _sent(kind, key, producer.send(message), group=group, seq=i)
    elif kind == "timer":
        due_s = int(time.time()) + int(args[4])
        for i in range(count):
            key = f"{prefix}-{i}"
            message = _message(topic, key, f"timer {key}", "timer")
            message.delivery_timestamp = due_s
            _sent(kind, key, producer.send(message), due_ms=due_s * 1000)
    elif kind == "transaction":
        n = 0
        for _ in range(count):
            for outcome in OUTCOMES:
                key = f"{prefix}-{n}"
                n += 1
                message = _message(topic, key, f"{outcome} {key}", "tx")
                message.add_property("outcome", outcome)
                transaction = producer.begin_transaction()
                receipt = producer.send(message, transaction)
                if outcome == "commit":
                    transaction.commit()
                elif outcome == "rollback":
                    transaction.rollback()
                else:
                    awaited.add(key)
                _sent(kind, key, receipt, outcome=outcome)
    else:
        raise SystemExit(f"unknown kind {kind}")


def receive(endpoint: str, args: list[str]) -> bool:
    group, topic, count = args[0], args[1], int(args[2])
    nack = set(args[3].split(",")) if len(args) > 3 and args[3] else set()
    # long enough to acknowledge a batch on a loaded machine: with 2 s, a whole test pass on 2 cores
    # saw acks refused as INVALID_RECEIPT_HANDLE, the receipts expired before the ack reached the proxy
    invisible_s = int(args[4]) if len(args) > 4 else INVISIBLE_S
    consumer = SimpleConsumer(_configuration(endpoint), group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    acked: set[str] = set()
    deadline = time.monotonic() + WAIT_S
    try:
        while len(acked) < count and time.monotonic() < deadline:
            try:
                messages = consumer.receive(16, invisible_s) or []
            except Exception as err:
                # right after startup the proxy may not have the client's settings yet (they come
                # over the telemetry stream): "settings" is null; anything else is an error
                if "settings" not in str(err):
                    raise
                time.sleep(0.2)
                continue
            for message in messages:
                key = next(iter(message.keys), "")
                first = message.delivery_attempt in (None, 0, 1)
                ack = not (key in nack and first)
                emit(
                    {
                        "event": "received",
                        "group": group,
                        "topic": message.topic,
                        "key": key,
                        "message_id": message.message_id,
                        "message_group": message.message_group,
                        "delivery_attempt": message.delivery_attempt,
                        "born_ms": message.born_timestamp,
                        "delivery_timestamp": message.delivery_timestamp,
                        "received_ms": int(time.time() * 1000),
                        "properties": dict(message.properties),
                        "acked": ack,
                    }
                )
                if ack:
                    consumer.ack(message)
                    acked.add(key)
    finally:
        consumer.shutdown()
    return len(acked) >= count


def main(argv: list[str]) -> int:
    endpoint, steps = argv[0], [[]]  # type: tuple[str, list[list[str]]]
    for arg in argv[1:]:
        if arg == "--":
            steps.append([])
        else:
            steps[-1].append(arg)
    sends = [step[1:] for step in steps if step[0] == "send"]
    checker = Checker()
    awaited: set[str] = set()
    producer = None
    ok = True
    if sends:
        topics = tuple(dict.fromkeys(step[0] for step in sends))
        producer = Producer(_configuration(endpoint), topics, checker=checker)
        producer.startup()
    try:
        for step in steps:
            if step[0] == "send":
                assert producer is not None
                send(producer, checker, awaited, step[1:])
            elif step[0] == "receive":
                ok = receive(endpoint, step[1:]) and ok
            else:
                raise SystemExit(f"unknown step {step[0]}")
        deadline = time.monotonic() + WAIT_S
        while not awaited <= checker.checked and time.monotonic() < deadline:
            time.sleep(0.05)
        ok = ok and awaited <= checker.checked
    finally:
        if producer is not None:
            producer.shutdown()
    print("done", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
