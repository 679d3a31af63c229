"""The clients: the producer (and the transactional producer), the pull consumer, the push consumers
(concurrent and orderly), queue allocation and the client offset stores (see docs/architecture.md).
"""

from __future__ import annotations

from broker_model.client.offset_store import LocalFileOffsetStore, ReadOffsetType, RemoteBrokerOffsetStore
from broker_model.client.orderly_config import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    OrderlyConsumerConfig,
)
from broker_model.client.orderly_consumer import OrderlyPushConsumer
from broker_model.client.producer import (
    LatencyFaultTolerance,
    MessageQueue,
    Producer,
    decompress_body,
    not_available_duration,
    select_by_hash,
)
from broker_model.client.pull_consumer import PullConsumer
from broker_model.client.push_consumer import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, PushConsumer
from broker_model.client.rebalance import allocate_averagely
from broker_model.client.transaction_producer import TransactionProducer

__all__ = [
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "LatencyFaultTolerance",
    "LocalFileOffsetStore",
    "MessageQueue",
    "OrderlyConsumerConfig",
    "OrderlyPushConsumer",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "ReadOffsetType",
    "RemoteBrokerOffsetStore",
    "TransactionProducer",
    "allocate_averagely",
    "decompress_body",
    "not_available_duration",
    "select_by_hash",
]
