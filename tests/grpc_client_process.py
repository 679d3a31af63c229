"""The official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified) as a producer process
for the endpoint tests: ``python -m tests.grpc_client_process ENDPOINT TOPIC MODE COUNT [THREADS]``.

MODE ``normal`` sends COUNT messages; ``fifo`` sends COUNT messages of each of three message groups
from THREADS threads (a group's messages from one thread at a time, in order); ``transaction``
sends COUNT transactional messages of each outcome (committed, rolled back, left open then
committed by the checker, left open for good), then waits for the check-backs: until each
message left open for good was checked THREADS times (the broker's check max) and each one the
checker commits once;
``flood`` sends from THREADS threads for COUNT seconds, a failed send (the server killed) counted
as not told; ``timer`` sends COUNT messages due 1 s, 1.25 s, 1.5 s, ... after now (the step is
``RMQ_TIMER_STEP_MS``, 250 by default; the line carries ``due``).
Each send the client saw succeed is printed as one JSON line: message id, queue offset, group or
outcome, sequence (the queue the client picked is not told: the endpoint chooses it, as RocketMQ's
proxy does); each check-back as a line with ``checked``. The environment's ``RMQ_CLIENT_AK`` and
``RMQ_CLIENT_SK`` are the client's credentials, ``RMQ_CLIENT_TLS=1`` turns TLS on. Ends with
``done`` after the producer shut down.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer, TransactionChecker
from rocketmq.grpc_protocol import TransactionResolution

OUTCOMES = ("commit", "rollback", "check-commit", "open")


class Checker(TransactionChecker):  # type: ignore[misc]
    """Answers as an application does, from the transaction's real outcome: commits what was
    committed or left open to be committed, rolls back what was rolled back (a check-back may come
    before the client's own end, on a slow machine), leaves the rest open (an unknown answer)."""

    def __init__(self, out: threading.Lock) -> None:
        self.out = out
        self.asked: dict[str, int] = {}

    def check(self, message: Message) -> int:
        outcome = message.body.decode().split()[0]
        with self.out:
            print(json.dumps({"checked": message.message_id, "outcome": outcome}), flush=True)
            self.asked[message.message_id] = self.asked.get(message.message_id, 0) + 1
        if outcome in ("commit", "check-commit"):
            return int(TransactionResolution.COMMIT)
        if outcome == "rollback":
            return int(TransactionResolution.ROLLBACK)
        return int(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)


def main(endpoint: str, topic: str, mode: str, count: int, threads: int) -> None:
    out = threading.Lock()
    credentials = Credentials(os.environ.get("RMQ_CLIENT_AK", ""), os.environ.get("RMQ_CLIENT_SK", ""))
    tls = os.environ.get("RMQ_CLIENT_TLS") == "1"
    checker = Checker(out)
    producer = Producer(ClientConfiguration(endpoint, credentials), (topic,), checker=checker, tls_enable=tls)
    awaited: dict[str, int] = {}  # message id -> the check-backs it must get
    producer.startup()

    def send(body: str, group: str | None, sequence: int, due: int | None = None) -> None:
        message = Message()
        message.topic = topic
        message.body = body.encode()
        message.tag = "created"
        message.keys = f"key-{group or 'n'}-{sequence}"
        if group is not None:
            message.message_group = group
        if due is not None:
            message.delivery_timestamp = due
        receipt = producer.send(message)
        line = {
            "message_id": receipt.message_id,
            "offset": receipt.offset,
            "group": group,
            "sequence": sequence,
            "due": due,
        }
        with out:
            print(json.dumps(line), flush=True)

    def send_in_transaction(outcome: str, sequence: int) -> None:
        message = Message()
        message.topic = topic
        message.body = f"{outcome} {sequence}".encode()
        message.tag = "tx"
        transaction = producer.begin_transaction()
        receipt = producer.send(message, transaction)
        if outcome == "commit":
            transaction.commit()
        elif outcome == "rollback":
            transaction.rollback()
        if outcome in ("open", "check-commit"):
            awaited[receipt.message_id] = threads if outcome == "open" else 1
        line = {"message_id": receipt.message_id, "transaction_id": receipt.transaction_id}
        with out:
            print(json.dumps({**line, "offset": receipt.offset, "outcome": outcome, "sequence": sequence}), flush=True)

    def flood(index: int, until: float) -> None:
        sequence = 0
        while time.monotonic() < until:
            try:
                send(f"thread {index} message {sequence}", None, index * 1_000_000 + sequence)
            except Exception:  # not told: the send may or may not be stored
                time.sleep(0.05)
            sequence += 1

    try:
        if mode == "timer":
            start = int(time.time() * 1000)
            for i in range(count):
                step = int(os.environ.get("RMQ_TIMER_STEP_MS", "250"))
                send(f"timer {i}", None, i, start + 1000 + step * i)
        elif mode == "flood":
            until = time.monotonic() + count
            workers = [threading.Thread(target=flood, args=(i, until)) for i in range(threads)]
            for thread in workers:
                thread.start()
            for thread in workers:
                thread.join()
        elif mode == "transaction":
            for sequence in range(count):
                for outcome in OUTCOMES:
                    send_in_transaction(outcome, sequence)
            deadline = time.monotonic() + 100  # the check-backs come over the telemetry stream meanwhile
            while time.monotonic() < deadline:
                with out:
                    if all(checker.asked.get(message, 0) >= times for message, times in awaited.items()):
                        break
                time.sleep(0.05)
        elif mode == "normal":
            for i in range(count):
                send(f"message {i}", None, i)
        else:
            groups = ["group-a", "group-b", "group-c"]
            locks = {g: threading.Lock() for g in groups}
            sequences = dict.fromkeys(groups, 0)

            def worker(index: int) -> None:
                for step in range(count * len(groups) // threads + 1):
                    group = groups[(index + step) % len(groups)]
                    with locks[group]:  # one group's sends one at a time, in order
                        if sequences[group] >= count:
                            continue
                        sequence = sequences[group]
                        send(f"{group} {sequence}", group, sequence)
                        sequences[group] = sequence + 1

            workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
            for thread in workers:
                thread.start()
            for thread in workers:
                thread.join()
            for group in groups:  # the rest, if the round robin left any
                while sequences[group] < count:
                    send(f"{group} {sequences[group]}", group, sequences[group])
                    sequences[group] += 1
    finally:
        producer.shutdown()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 1)
