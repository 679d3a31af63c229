"""The official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified) as a consumer process
for the endpoint tests: ``python -m tests.grpc_consumer_process ENDPOINT TOPIC GROUP MODE COUNT``.

MODE ``simple``: a ``SimpleConsumer`` (await duration 2 s) receives ``message <i>`` bodies with an
invisible time of 2 s and treats message ``i`` by ``i % 3``: 0 is acked at once; 1 is left to
expire and acked when it comes again; 2 has its invisible time changed to 3 s, and is acked when
it comes again. Every delivery is printed as one JSON line (message id, body, delivery attempt,
milliseconds since the epoch, what was done); it stops once every message was acked, or after 60 s,
and prints ``done`` after the consumer shut down.
"""

from __future__ import annotations

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

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


if __name__ == "__main__":
    endpoint, topic, group, mode, count = sys.argv[1:6]
    if mode != "simple":
        raise SystemExit(f"MODE: {mode!r} is not a mode (simple)")
    simple(endpoint, topic, group, int(count))
