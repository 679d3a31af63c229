"""The transactional producer: sends a half message, runs the local transaction, ends it, and
answers the brokers' check-backs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from broker_model.broker import Broker, EndTransactionRequest, InnerMessage, LocalTransactionState, end_transaction
from broker_model.client.producer import Producer, SendResult
from broker_model.common import Message, MessageQueue
from broker_model.common import constants as c
from broker_model.store import MessageExt


class TransactionListener(Protocol):
    """What a transactional producer's application provides."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState: ...

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState: ...


@dataclass(frozen=True)
class TransactionSendResult:
    """The send result of the half message plus the local transaction's outcome."""

    send_result: SendResult
    local_transaction_state: LocalTransactionState
    transaction_id: str


class TransactionProducer(Producer):
    """A producer of transactional messages for one group, with its listener.

    It registers with every broker so that their check services can ask it about open
    transactions (the broker's producer channel table).
    """

    def __init__(self, brokers: Sequence[Broker], group: str, listener: TransactionListener, **kwargs: Any) -> None:
        super().__init__(brokers, group, **kwargs)
        self.listener = listener
        for broker in brokers:
            broker.transaction_producers.setdefault(group, []).append(self)

    def close(self) -> None:
        """Unregister from the brokers (check-backs no longer reach this producer)."""
        for broker in self.brokers.values():
            producers = broker.transaction_producers.get(self.group, [])
            if self in producers:
                producers.remove(self)

    def send_message_in_transaction(self, message: Message, arg: Any = None) -> TransactionSendResult:
        """Send ``message`` as a half message, run the local transaction, end it.

        A delay level is dropped (transactional messages are never delayed). A listener that
        raises counts as UNKNOW: the check service will ask later.
        """
        properties = {k: v for k, v in message.properties.items() if k != c.PROPERTY_DELAY_TIME_LEVEL}
        properties[c.PROPERTY_TRANSACTION_PREPARED] = "true"
        properties[c.PROPERTY_PRODUCER_GROUP] = self.group
        half = Message(message.topic, message.body, message.flag, properties, message.transaction_id)
        result = self.send(half)
        try:
            state = self.listener.execute_local_transaction(message, arg)
        except Exception:  # the local transaction's outcome is unknown: a check-back will ask
            state = LocalTransactionState.UNKNOW
        request = EndTransactionRequest(
            self.group, result.queue_offset, result.commit_log_offset, state, False, result.offset_msg_id, result.msg_id
        )
        end_transaction(self.brokers[result.message_queue.broker_name], request)
        return TransactionSendResult(result, state, result.msg_id)

    def _inner(self, message: Message, queue: MessageQueue, uniq_key: str, compress: bool = True) -> InnerMessage:
        inner = super()._inner(message, queue, uniq_key, compress)
        if message.properties.get(c.PROPERTY_TRANSACTION_PREPARED) == "true":
            inner.sys_flag |= c.TRANSACTION_PREPARED_TYPE
        return inner

    def check_transaction_state(self, broker: Broker, message: MessageExt) -> None:
        """Answer a check-back: ask the listener about the re-put copy ``message`` and end it."""
        try:
            state = self.listener.check_local_transaction(message)
        except Exception:  # no answer this round; the next check asks again
            return
        request = EndTransactionRequest(
            self.group, message.queue_offset, message.commit_log_offset, state, True, message.msg_id, message.uniq_key
        )
        end_transaction(broker, request)
