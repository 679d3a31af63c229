"""A broker process that dies between a transaction's final message and its op:
``python tests/tx_crash_process.py LAKE``.

It sends a half message whose local transaction is unknown, then does the first half of a
commit (the final message in the real topic), prints ``final <uniq_key>`` and kills itself with
SIGKILL before the op message is written, as a broker crash at that point would.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from broker_model.broker import Broker, BrokerConfig, LocalTransactionState
from broker_model.broker.transaction import final_message, stored_record
from broker_model.client import TransactionProducer
from broker_model.common import Message


class Unknown:
    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW


def main(lake: str) -> None:
    broker = Broker(BrokerConfig(Path(lake), flush_mode="SYNC_FLUSH")).start()
    sent = TransactionProducer([broker], "pg-crash", Unknown(), seed=1).send_message_in_transaction(
        Message.create("Payments", b"paid 42")
    )
    half = stored_record(broker, "RMQ_SYS_TRANS_HALF_TOPIC", sent.send_result.queue_offset)
    assert half is not None
    broker.put_message(final_message(half, half.commit_log_offset))
    print(f"final {sent.transaction_id}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1])
