"""The official RocketMQ 5 Python client consuming for ``benchmarks/grpc_consume.py``:
``python benchmarks/grpc_consume_client.py ENDPOINT TOPIC GROUP CONSUMERS TOTAL``. CONSUMERS
``SimpleConsumer`` instances, one thread each, receive (32 at a time, invisible 30 s) and ack every
message until TOTAL were acked between them. Prints the seconds that took (after the consumers
started, before they shut down), the messages acked, and the CPU seconds this process spent
meanwhile. A receive refused because the server's settings have not reached its consumer yet is
tried again; any other failure ends the process with its error."""

from __future__ import annotations

import resource
import sys
import threading
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
from threads import run_timed


def main(endpoint: str, topic: str, group: str, consumers: int, total: int) -> None:
    configuration = ClientConfiguration(endpoint, Credentials())
    started = [
        SimpleConsumer(configuration, group, {topic: FilterExpression("*")}, await_duration=2) for _ in range(consumers)
    ]
    for consumer in started:
        consumer.startup()
    lock = threading.Lock()
    acked = [0]

    def work(index: int) -> None:
        consumer = started[index]
        while True:
            with lock:
                if acked[0] >= total:
                    return
            try:
                received = consumer.receive(32, 30)
            except Exception as err:  # the server's settings have not reached this consumer yet
                if "settings" not in str(err):
                    raise
                time.sleep(0.05)
                continue
            for message in received:
                consumer.ack(message)
                with lock:
                    acked[0] += 1

    before = resource.getrusage(resource.RUSAGE_SELF)
    elapsed = run_timed(consumers, work)
    after = resource.getrusage(resource.RUSAGE_SELF)
    for consumer in started:
        consumer.shutdown()
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"{elapsed:.6f} {acked[0]} {cpu:.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
