"""A RocketMQ-like writer process for the follow test: ``python -m tests.store_writer_process ROOT FILE_SIZE OUT``.

Appends records to the store at ``ROOT`` (:class:`tests.rocketmq_store.StoreWriter`, files of
``FILE_SIZE`` bytes) until SIGTERM, then writes the physical offset of every record it finished to
``OUT`` as JSON and exits. Prints ``ready`` once the first record is written.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

from tests.rocketmq_store import StoreWriter


def main(root: str, file_size: int, out: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    writer = StoreWriter(Path(root), file_size)
    index = 0
    while not stop.is_set():
        writer.append(("Orders", "Audit")[index % 2], index % 4, f"live {index} ".encode() * (1 + index % 9))
        if index == 0:
            print("ready", flush=True)
        index += 1
        if index % 50 == 0:
            time.sleep(0.01)
    Path(out).write_text(json.dumps([w.offset for w in writer.written]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
