"""The official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified) as a consumer process
for the endpoint tests: ``python -m tests.grpc_consumer_process ENDPOINT TOPIC GROUP MODE COUNT``.

MODE ``simple``: a ``SimpleConsumer`` (await duration 2 s) receives ``message <i>`` bodies with an
invisible time of 2 s and treats message ``i`` by ``i % 3``: 0 is acked at once; 1 is left to
expire and acked when it comes again; 2 has its invisible time changed to 3 s, and is acked when
it comes again. Every delivery is printed as one JSON line (message id, body, delivery attempt,
milliseconds since the epoch, what was done); it stops once every message was acked, or after 60 s,
and prints ``done`` after the consumer shut down.

MODE ``push``: a ``PushConsumer`` whose listener fails message ``i`` when ``i % 4 == 1`` and
consumes the others; every delivery is printed (message id, body, delivery attempt, time, result).
It stops once every message consumed was delivered and every failing one was delivered
``ATTEMPTS`` times (the environment's ``RMQ_MAX_ATTEMPTS``, 3 by default) and 4 s passed with no
new delivery, or after 90 s, and prints ``done`` after the consumer shut down.

MODE ``crash``: a ``SimpleConsumer`` (await duration 2 s) receives all COUNT messages invisible for
2 s, acks those with an even index, prints ``ready``, and waits for a line on stdin (the test kills
the server and starts it again meanwhile); then it receives for 15 s more, acking everything, and
prints every delivery of both phases as JSON lines, then ``done``.

MODE ``fifo``: 4 ``SimpleConsumer`` instances of the group, one thread each, receive (2 at a time,
invisible 5 s), and ack every message after a pause of 20 ms; each delivery is printed with the
times its receive returned and its ack started (milliseconds since the epoch). It stops once COUNT
messages were acked, or after 60 s, and prints ``done``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)

INVISIBLE_S = 2
CHANGED_S = 3


def simple(endpoint: str, topic: str, group: str, count: int) -> None:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoint, Credentials("", "")), group, {topic: FilterExpression("*")}, await_duration=2
    )
    consumer.startup()
    acked: set[str] = set()
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    try:
        while len(acked) < count and time.monotonic() < deadline:
            for message in consumer.receive(32, INVISIBLE_S):
                body = message.body.decode()
                kind = int(body.split()[1]) % 3
                again = message.message_id in seen
                seen.add(message.message_id)
                if kind == 0 or again:
                    consumer.ack(message)
                    acked.add(message.message_id)
                    action = "ack"
                elif kind == 1:
                    action = "expire"
                else:
                    consumer.change_invisible_duration(message, CHANGED_S)
                    action = "change"
                line = {
                    "message_id": message.message_id,
                    "body": body,
                    "attempt": message.delivery_attempt,
                    "at": int(time.time() * 1000),
                    "action": action,
                }
                print(json.dumps(line), flush=True)
    finally:
        consumer.shutdown()
    print("done", flush=True)


def crash(endpoint: str, topic: str, group: str, count: int) -> None:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoint, Credentials("", "")), group, {topic: FilterExpression("*")}, await_duration=2
    )
    consumer.startup()
    deliveries = []

    def received(phase: str) -> list[Message]:
        try:
            messages = consumer.receive(32, INVISIBLE_S)
        except Exception as err:  # the server is away, or its settings have not come yet
            print(json.dumps({"error": str(err)[:200], "phase": phase}), file=sys.stderr, flush=True)
            time.sleep(0.2)
            return []
        for message in messages:
            body = message.body.decode()
            deliveries.append(
                {"message_id": message.message_id, "body": body, "attempt": message.delivery_attempt, "phase": phase}
            )
        return messages

    deadline = time.monotonic() + 60
    while len(deliveries) < count and time.monotonic() < deadline:
        for message in received("before"):
            if int(message.body.decode().split()[1]) % 2 == 0:
                consumer.ack(message)
    print("ready", flush=True)
    sys.stdin.readline()
    until = time.monotonic() + 15
    while time.monotonic() < until:
        for message in received("after"):
            try:
                consumer.ack(message)
            except Exception as err:
                print(json.dumps({"error": str(err)[:200], "phase": "ack"}), file=sys.stderr, flush=True)
    consumer.shutdown()
    for delivery in deliveries:
        print(json.dumps(delivery), flush=True)
    print("done", flush=True)


def fifo(endpoint: str, topic: str, group: str, count: int) -> None:
    configuration = ClientConfiguration(endpoint, Credentials("", ""))
    consumers = [
        SimpleConsumer(configuration, group, {topic: FilterExpression("*")}, await_duration=2) for _ in range(4)
    ]
    for consumer in consumers:
        consumer.startup()
    lock = threading.Lock()
    lines: list[dict[str, object]] = []
    deadline = time.monotonic() + 60

    def work(index: int) -> None:
        consumer = consumers[index]
        while time.monotonic() < deadline:
            with lock:
                if sum(1 for line in lines if "acked" in line) >= count:
                    return
            try:
                messages = consumer.receive(2, 5)
            except Exception as err:  # the server's settings have not reached this consumer yet
                print(json.dumps({"error": str(err)[:200]}), file=sys.stderr, flush=True)
                time.sleep(0.1)
                continue
            received = int(time.time() * 1000)
            for message in messages:
                time.sleep(0.02)
                acking = int(time.time() * 1000)
                consumer.ack(message)
                line = {
                    "message_id": message.message_id,
                    "body": message.body.decode(),
                    "group": message.message_group,
                    "attempt": message.delivery_attempt,
                    "received": received,
                    "acked": acking,
                    "consumer": index,
                }
                with lock:
                    lines.append(line)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for consumer in consumers:
        consumer.shutdown()
    for line in lines:
        print(json.dumps(line), flush=True)
    print("done", flush=True)


class Failing(MessageListener):  # type: ignore[misc]
    """Fails every fourth message, from the second on; prints every delivery."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deliveries: dict[str, int] = {}
        self.last = time.monotonic()

    def consume(self, message: Message) -> ConsumeResult:
        body = message.body.decode()
        fails = int(body.split()[1]) % 4 == 1
        with self.lock:
            self.deliveries[body] = self.deliveries.get(body, 0) + 1
            self.last = time.monotonic()
            line = {
                "message_id": message.message_id,
                "body": body,
                "attempt": message.delivery_attempt,
                "at": int(time.time() * 1000),
                "result": "failure" if fails else "success",
            }
            print(json.dumps(line), flush=True)
        return ConsumeResult.FAILURE if fails else ConsumeResult.SUCCESS


def push(endpoint: str, topic: str, group: str, count: int) -> None:
    attempts = int(os.environ.get("RMQ_MAX_ATTEMPTS", "3"))
    listener = Failing()
    consumer = PushConsumer(
        ClientConfiguration(endpoint, Credentials("", "")), group, listener, {topic: FilterExpression("*")}
    )
    consumer.startup()
    wanted = {f"message {i}": attempts if i % 4 == 1 else 1 for i in range(count)}
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            with listener.lock:
                complete = all(listener.deliveries.get(body, 0) >= n for body, n in wanted.items())
                quiet = time.monotonic() - listener.last > 4
            if complete and quiet:
                break
            time.sleep(0.1)
    finally:
        consumer.shutdown()
    print("done", flush=True)


if __name__ == "__main__":
    endpoint, topic, group, mode, count = sys.argv[1:6]
    modes = {"simple": simple, "push": push, "crash": crash, "fifo": fifo}
    if mode not in modes:
        raise SystemExit(f"MODE: {mode!r} is not a mode ({sorted(modes)})")
    modes[mode](endpoint, topic, group, int(count))
