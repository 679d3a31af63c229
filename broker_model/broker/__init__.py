"""The broker: its configuration, the controller that owns a commit log, the put path with group commit,
send-back, subscriptions, consumer groups and offsets, orderly-queue locks, POP consumption, and the schedule,
timer, revive and transaction check services its owner starts (see docs/architecture.md).
"""

from __future__ import annotations

from broker_model.broker.config import (
    BrokerConfig,
    FlushMode,
    InnerMessage,
    PutResult,
    SubscriptionGroupConfig,
    TopicConfig,
)
from broker_model.broker.consumer_groups import ConsumerGroupManager
from broker_model.broker.consumer_offsets import ConsumerOffsetManager
from broker_model.broker.controller import Broker
from broker_model.broker.lake_brokers import start_lake_brokers
from broker_model.broker.pop import PoppedMessage, PopResult, PopService, revive_progress_path
from broker_model.broker.put import PendingPut
from broker_model.broker.rebalance_locks import RebalanceLockManager
from broker_model.broker.schedule import (
    ScheduleMessageService,
    correct_deliver_timestamp,
    progress_path,
)
from broker_model.broker.timer import TimerMessageService, timer_progress_path
from broker_model.broker.transaction import (
    FILE_RESERVED_MS,
    REMOVE_TAG,
    TRANSACTION_CHECK_MAX,
    TRANSACTION_GROUP,
    TRANSACTION_TIMEOUT_MS,
    EndTransactionRequest,
    LocalTransactionState,
    TransactionCheckService,
    TransactionError,
    calculate_op_offset,
    end_transaction,
    parse_op_body,
)

__all__ = [
    "FILE_RESERVED_MS",
    "REMOVE_TAG",
    "TRANSACTION_CHECK_MAX",
    "TRANSACTION_GROUP",
    "TRANSACTION_TIMEOUT_MS",
    "Broker",
    "BrokerConfig",
    "ConsumerGroupManager",
    "ConsumerOffsetManager",
    "EndTransactionRequest",
    "FlushMode",
    "InnerMessage",
    "LocalTransactionState",
    "PendingPut",
    "PopResult",
    "PopService",
    "PoppedMessage",
    "PutResult",
    "RebalanceLockManager",
    "ScheduleMessageService",
    "SubscriptionGroupConfig",
    "TimerMessageService",
    "TopicConfig",
    "TransactionCheckService",
    "TransactionError",
    "calculate_op_offset",
    "correct_deliver_timestamp",
    "end_transaction",
    "parse_op_body",
    "progress_path",
    "revive_progress_path",
    "start_lake_brokers",
    "timer_progress_path",
]
