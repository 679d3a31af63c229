"""The official RocketMQ 5 Python client sending for ``benchmarks/grpc_send.py``:
``python benchmarks/grpc_client.py ENDPOINT TOPIC THREADS PER_THREAD``. Prints the seconds the
sends took (after the producer started, before it shut down), the sends that succeeded, and the
CPU seconds this process spent meanwhile (the client's own cost)."""

from __future__ import annotations

import os
import resource
import sys

from rocketmq import ClientConfiguration, Credentials, Message, Producer
from threads import run_timed


def main(endpoint: str, topic: str, threads: int, per_thread: int) -> None:
    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    bodies = [[os.urandom(256) for _ in range(per_thread)] for _ in range(threads)]
    sent = [0] * threads

    def work(index: int) -> None:
        for body in bodies[index]:
            message = Message()
            message.topic = topic
            message.body = body
            message.tag = "t"
            producer.send(message)
            sent[index] += 1

    before = resource.getrusage(resource.RUSAGE_SELF)
    elapsed = run_timed(threads, work)
    after = resource.getrusage(resource.RUSAGE_SELF)
    producer.shutdown()
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"{elapsed:.6f} {sum(sent)} {cpu:.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
