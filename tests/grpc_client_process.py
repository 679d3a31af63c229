"""The official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified) as a producer process
for the endpoint tests: ``python -m tests.grpc_client_process ENDPOINT TOPIC MODE COUNT [THREADS]``.

MODE ``normal`` sends COUNT messages; ``fifo`` sends COUNT messages of each of three message groups
from THREADS threads (a group's messages from one thread at a time, in order). Each send the client
saw succeed is printed as one JSON line: message id, queue offset, group, sequence (the queue the
client picked is not told: the endpoint chooses it, as RocketMQ's proxy does). Ends with
``done`` after the producer shut down.
"""

from __future__ import annotations

import json
import sys
import threading

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main(endpoint: str, topic: str, mode: str, count: int, threads: int) -> None:
    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    out = threading.Lock()

    def send(body: str, group: str | None, sequence: int) -> None:
        message = Message()
        message.topic = topic
        message.body = body.encode()
        message.tag = "created"
        message.keys = f"key-{group or 'n'}-{sequence}"
        if group is not None:
            message.message_group = group
        receipt = producer.send(message)
        line = {
            "message_id": receipt.message_id,
            "offset": receipt.offset,
            "group": group,
            "sequence": sequence,
        }
        with out:
            print(json.dumps(line), flush=True)

    try:
        if mode == "normal":
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
