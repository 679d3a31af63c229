"""A real broker process for the crash tests: ``python tests/broker_process.py LAKE NAME THREADS SEGMENT``.

Starts a SYNC_FLUSH broker and ``THREADS`` threads that send until killed. Every send that
returned OK is printed as ``ack <uniq_key> <commit_log_offset> <topic> <queue_id> <queue_offset>``
(flushed at once), so the parent knows exactly what the broker acknowledged before it died.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from broker_model.broker import Broker, BrokerConfig
from broker_model.client import Producer
from broker_model.common import Message


def main(lake: str, name: str, threads: int, segment_size: int) -> None:
    config = BrokerConfig(lake=Path(lake), broker_name=name, segment_size=segment_size, flush_mode="SYNC_FLUSH")
    broker = Broker(config).start()
    broker.ensure_topic("Crash", 4)
    out = threading.Lock()
    print("ready", flush=True)

    def send_forever(index: int) -> None:
        producer = Producer([broker], f"crash-{index}", client_port=30000 + index, seed=index)
        sequence = 0
        while True:
            body = f"thread {index} message {sequence} ".encode() * (1 + sequence % 7)
            result = producer.send(Message.create("Crash", body, tags=f"t{index}", keys=[f"k{index}-{sequence}"]))
            with out:
                sys.stdout.write(
                    f"ack {result.msg_id} {result.commit_log_offset} {result.message_queue.topic} "
                    f"{result.message_queue.queue_id} {result.queue_offset}\n"
                )
                sys.stdout.flush()
            sequence += 1

    for index in range(threads):
        threading.Thread(target=send_forever, args=(index,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
