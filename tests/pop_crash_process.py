"""A broker process with POP consumers that is killed mid-flight:
``python tests/pop_crash_process.py LAKE COUNT INVISIBLE_MS``.

It starts an ASYNC_FLUSH broker with its timer and revive services, sends COUNT messages to topic
``T``, pops them all for group ``G`` invisible for INVISIBLE_MS, acks those of even index, prints
one JSON line (the acked and the unacked bodies), and then keeps popping (nothing is left) until it
is killed: with SIGKILL, nothing is flushed or persisted on the way out.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from broker_model.broker import Broker, BrokerConfig, InnerMessage, PopService, TimerMessageService


def main(lake: str, count: int, invisible_ms: int) -> None:
    broker = Broker(BrokerConfig(Path(lake))).start()
    broker.ensure_topic("T", 4)
    timer = TimerMessageService(broker).start()
    pops = PopService(broker, timer).start()
    for i in range(count):
        broker.put_message(InnerMessage("T", i % 4, f"m{i}".encode(), {"UNIQ_KEY": f"U{i}"}))
    broker.flush()
    popped = []
    while len(popped) < count:
        popped += pops.pop("G", "T", 32, invisible_ms=invisible_ms, poll_ms=1000).messages
    acked, unacked = [], []
    for item in sorted(popped, key=lambda m: int(m.message.body[1:])):
        index = int(item.message.body[1:])
        if index % 2 == 0:
            pops.ack("G", "T", item.receipt_handle)
            acked.append(item.message.body.decode())
        else:
            unacked.append(item.message.body.decode())
    print(json.dumps({"acked": acked, "unacked": unacked}), flush=True)
    while True:
        pops.pop("G", "T", 32, invisible_ms=invisible_ms, poll_ms=1000)
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
