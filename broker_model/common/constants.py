"""RocketMQ constants the product follows (docs/rocketmq.md gives the source of each)."""

from __future__ import annotations

from typing import Final

# -- record layout (MessageDecoder / CommitLog) ------------------------------------------------
MAGIC_CODE_V1: Final = -626843481  # 0xDAA320A7: one-byte topic length
MAGIC_CODE_V2: Final = -626843477  # 0xDAA320AB: two-byte topic length (topics over 127 chars)
BLANK_MAGIC_CODE: Final = -875286124  # 0xCBD43194: end-of-segment blank marker
END_FILE_MIN_BLANK_LENGTH: Final = 8  # a blank marker is TOTALSIZE + MAGIC
V1_MAX_TOPIC_LENGTH: Final = 127  # Byte.MAX_VALUE: longer topics need magic v2
MAX_PROPERTIES_LENGTH: Final = 32767  # PROPERTIESLENGTH is a signed short

DEFAULT_SEGMENT_SIZE: Final = 1024 * 1024 * 1024  # mappedFileSizeCommitLog, 1 GiB
MAX_MESSAGE_SIZE: Final = 4 * 1024 * 1024  # maxMessageSize, 4 MiB (body, before compression)
MAX_RECORD_SLACK: Final = 64 * 1024  # the store refuses a record over maxMessageSize + 64 KiB

# -- MessageSysFlag ----------------------------------------------------------------------------
COMPRESSED_FLAG: Final = 0x1
MULTI_TAGS_FLAG: Final = 0x2
TRANSACTION_NOT_TYPE: Final = 0
TRANSACTION_PREPARED_TYPE: Final = 0x1 << 2
TRANSACTION_COMMIT_TYPE: Final = 0x2 << 2
TRANSACTION_ROLLBACK_TYPE: Final = 0x3 << 2  # also the transaction-type mask
BORNHOST_V6_FLAG: Final = 0x1 << 4
STOREHOSTADDRESS_V6_FLAG: Final = 0x1 << 5
NEED_UNWRAP_FLAG: Final = 0x1 << 6
INNER_BATCH_FLAG: Final = 0x1 << 7
COMPRESSION_LZ4_TYPE: Final = 0x1 << 8
COMPRESSION_ZSTD_TYPE: Final = 0x2 << 8
COMPRESSION_ZLIB_TYPE: Final = 0x3 << 8
COMPRESSION_TYPE_MASK: Final = 0x7 << 8

# -- property codec ----------------------------------------------------------------------------
NAME_VALUE_SEPARATOR: Final = "\u0001"
PROPERTY_SEPARATOR: Final = "\u0002"
KEY_SEPARATOR: Final = " "

PROPERTY_KEYS: Final = "KEYS"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK: Final = "WAIT"
PROPERTY_DELAY_TIME_LEVEL: Final = "DELAY"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID: Final = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
PROPERTY_MIN_OFFSET: Final = "MIN_OFFSET"
PROPERTY_MAX_OFFSET: Final = "MAX_OFFSET"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: Final = "UNIQ_KEY"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_CLUSTER: Final = "CLUSTER"
PROPERTY_TRANSACTION_ID: Final = "__transactionId__"
# MessageConst.PROPERTY_ORIGIN_GROUP: the consumer group of a RocketMQ 5 POP retry (PopReviveService)
PROPERTY_ORIGIN_GROUP: Final = "ORIGIN_GROUP"

# MessageConst.STRING_HASH_SET: names a user property may not take (Message.putUserProperty).
RESERVED_PROPERTY_NAMES: Final = frozenset(
    {
        "TRACE_ON",
        "MSG_REGION",
        "KEYS",
        "TAGS",
        "WAIT",
        "DELAY",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "UNIQ_KEY",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "TRANSACTION_CHECK_TIMES",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "PUSH_REPLY_TIME",
        "CLUSTER",
        "MSG_TYPE",
        "INNER_MULTI_DISPATCH",
        "INNER_MULTI_QUEUE_OFFSET",
        "__transactionId__",
    }
)

# -- topics --------------------------------------------------------------------------------------
TOPIC_MAX_LENGTH: Final = 127
GROUP_MAX_LENGTH: Final = 255
AUTO_CREATE_TOPIC_KEY_TOPIC: Final = "TBW102"
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
RMQ_SYS_TRANS_HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC: Final = "TRANS_CHECK_MAX_TIME_TOPIC"
SYSTEM_TOPIC_PREFIX: Final = "rmq_sys_"
# RocketMQ 5's system topics this product stores but does not interpret yet
TIMER_TOPIC: Final = SYSTEM_TOPIC_PREFIX + "wheel_timer"  # TimerMessageStore.TIMER_TOPIC
REVIVE_TOPIC_PREFIX: Final = SYSTEM_TOPIC_PREFIX + "REVIVE_LOG_"  # PopAckConstants.REVIVE_TOPIC + cluster
POP_CHECKPOINT_TOPIC: Final = "CHECKPOINT_TOPIC"
# POP consumption (PopAckConstants, KeyBuilder, BrokerConfig; docs/pop.md)
REVIVE_QUEUE_NUM: Final = 8  # BrokerConfig.reviveQueueNum: queues of the revive topic
REVIVE_GROUP: Final = "CID_RMQ_SYS_REVIVE_GROUP"  # PopAckConstants.REVIVE_GROUP: the revive's offsets
POP_RETRY_QUEUE_NUM: Final = 1  # PopAckConstants.retryQueueNum: queues of a POP retry topic
CK_TAG: Final = "ck"
ACK_TAG: Final = "ack"
BATCH_ACK_TAG: Final = "bAck"
ACK_TIME_INTERVAL_MS: Final = 1000  # PopAckConstants.ackTimeInterval: a ck is due this long before its revive time
POP_ORDER_REVIVE_QUEUE: Final = 999  # KeyBuilder.POP_ORDER_REVIVE_QUEUE: a handle's mark of an orderly (FIFO) pop
MAX_POP_NUMS: Final = 32  # the most messages one pop returns
POP_FROM_RETRY_PROBABILITY: Final = 20  # BrokerConfig.popFromRetryProbability, percent of pops reading retries first
PROPERTY_FIRST_POP_TIME: Final = "1ST_POP_TIME"
RETRY_GROUP_TOPIC_PREFIX: Final = "%RETRY%"
# KeyBuilder.buildPopRetryTopic: %RETRY%<group>_<topic>, or %RETRY%<group>+<topic> with enableRetryTopicV2
POP_RETRY_SEPARATORS: Final = ("_", "+")
DLQ_GROUP_TOPIC_PREFIX: Final = "%DLQ%"

SYSTEM_TOPICS: Final = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        SCHEDULE_TOPIC,
        "BenchmarkTest",
        RMQ_SYS_TRANS_HALF_TOPIC,
        "RMQ_SYS_TRACE_TOPIC",
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "CHECKPOINT_TOPIC",
    }
)
# TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET: "Sending message to topic[%s] is forbidden."
NOT_ALLOWED_SEND_TOPICS: Final = frozenset(
    {
        SCHEDULE_TOPIC,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)

SCHEDULE_TOPIC_QUEUE_NUMS: Final = 18  # one queue per delay level
DEFAULT_TOPIC_QUEUE_NUMS: Final = 4  # min(client defaultTopicQueueNums 4, TBW102's 8)
PERM_READ: Final = 4
PERM_WRITE: Final = 2
PERM_INHERIT: Final = 1
# RocketMQ 5's topic message types (TopicMessageType, the topic's ``message.type`` attribute)
TOPIC_MESSAGE_TYPES: Final = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
MESSAGE_TYPE_ATTRIBUTE: Final = "message.type"

# messageDelayLevel "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h", level i at [i-1]
DELAY_LEVEL_MILLIS: Final = (
    1000,
    5000,
    10000,
    30000,
    60000,
    120000,
    180000,
    240000,
    300000,
    360000,
    420000,
    480000,
    540000,
    600000,
    1200000,
    1800000,
    3600000,
    7200000,
)
MAX_DELAY_LEVEL: Final = len(DELAY_LEVEL_MILLIS)

# -- producer ------------------------------------------------------------------------------------
COMPRESS_MSG_BODY_OVER: Final = 4096  # compressMsgBodyOverHowmuch: compress at >= 4 KiB
COMPRESS_LEVEL: Final = 5  # rocketmq.message.compressLevel default
RETRY_TIMES_WHEN_SEND_FAILED: Final = 2  # a sync send tries 1 + 2 times

# MQFaultStrategy (5.x values): latency thresholds (ms) and how long a broker is then avoided (ms)
LATENCY_MAX: Final = (50, 100, 550, 1800, 3000, 5000, 15000)
NOT_AVAILABLE_DURATION: Final = (0, 0, 2000, 5000, 6000, 10000, 30000)
ISOLATION_LATENCY: Final = 10000  # a failed send counts as this latency (5.x)

# -- ordered consumption and rebalance (docs/rocketmq.md) ---------------------------------------------
REBALANCE_LOCK_MAX_LIVE_TIME_MS: Final = 60000  # broker RebalanceLockManager lease
CLIENT_LOCK_MAX_LIVE_TIME_MS: Final = 30000  # ProcessQueue: the client trusts a lock this long
REBALANCE_LOCK_INTERVAL_MS: Final = 20000  # ProcessQueue: the client renews its locks this often
LOCK_ALL_INITIAL_DELAY_MS: Final = 1000  # lockMQPeriodically's first run after start
UNLOCK_DELAY_TIME_MS: Final = 20000  # RebalancePushImpl: unlock of a released queue with cached messages
MAX_TIME_CONSUME_CONTINUOUSLY_MS: Final = 60000  # an orderly consume request yields after this long
SUSPEND_CURRENT_QUEUE_TIME_MS: Final = 1000  # DefaultMQPushConsumer.suspendCurrentQueueTimeMillis
SUSPEND_TIME_MIN_MS: Final = 10  # submitConsumeRequestLater clamps its delay to [10, 30000]
SUSPEND_TIME_MAX_MS: Final = 30000
CONSUME_MESSAGE_BATCH_MAX_SIZE: Final = 1  # consumeMessageBatchMaxSize, range [1, 1024]
PULL_BATCH_SIZE: Final = 32  # pullBatchSize, range [1, 1024]
PULL_THRESHOLD_FOR_QUEUE: Final = 1000  # cached messages per queue before pulls pause
PULL_THRESHOLD_SIZE_FOR_QUEUE_MIB: Final = 100  # cached body MiB per queue before pulls pause
PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL: Final = 50  # PULL_TIME_DELAY_MILLS_WHEN_CACHE_FLOW_CONTROL
PULL_TIME_DELAY_MS_WHEN_EXCEPTION: Final = 3000  # also the retry delay of a pull on an unlocked queue
OFFSET_MOVED_DELAY_MS: Final = 10000  # OFFSET_ILLEGAL: the queue is rebuilt after this long
REBALANCE_INTERVAL_MS: Final = 20000  # RebalanceService waitInterval
REBALANCE_RETRY_MS: Final = 500  # rebalanceLater when a new queue could not be locked
HEARTBEAT_BROKER_INTERVAL_MS: Final = 30000  # ClientConfig.heartbeatBrokerInterval
CHANNEL_EXPIRED_TIMEOUT_MS: Final = 120000  # BrokerConfig.channelExpiredTimeout: a silent client leaves

# -- retries, dead letters and delayed delivery (docs/rocketmq.md) ---------------------------------------
DLQ_NUMS_PER_GROUP: Final = 1  # a group's %DLQ% topic has one queue: dead letters go to queue 0
RETRY_MAX_TIMES: Final = 16  # SubscriptionGroupConfig.retryMaxTimes
RETRY_QUEUE_NUMS: Final = 1  # SubscriptionGroupConfig.retryQueueNums
# GroupRetryPolicy: its types, CustomizedRetryPolicy's delays and ExponentialRetryPolicy's defaults
RETRY_POLICIES: Final = ("CUSTOMIZED", "EXPONENTIAL")
CUSTOMIZED_RETRY_NEXT_MS: Final = tuple(
    1000 * s for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
EXPONENTIAL_RETRY_MS: Final = (5000, 7_200_000, 2)  # initial, max, multiplier
MAX_RECONSUME_TIMES_CONCURRENTLY: Final = 16  # a concurrent consumer's maxReconsumeTimes -1 means this
FIRST_RETRY_DELAY_LEVEL: Final = 3  # a send-back with delay level 0 waits level 3 + reconsume times
SCHEDULE_FIRST_DELAY_MS: Final = 1000  # FIRST_DELAY_TIME: the schedule service's first round
SCHEDULE_DELAY_FOR_A_WHILE_MS: Final = 100  # DELAY_FOR_A_WHILE: pause between delivery rounds
UNKNOWN_LEVEL_DELAY_MS: Final = 1000  # computeDeliverTimestamp of a level outside the table
CONSUME_REQUEST_LATER_MS: Final = 5000  # submitConsumeRequestLater: messages whose send-back failed
CONSUME_CONCURRENTLY_MAX_SPAN: Final = 2000  # consumeConcurrentlyMaxSpan: pulls pause past this span
CONSUME_THREADS: Final = 20  # consumeThreadMin and consumeThreadMax
PERSIST_CONSUMER_OFFSET_INTERVAL_MS: Final = 5000  # the client's persistConsumerOffsetInterval
PROPERTY_CONSUME_START_TIMESTAMP: Final = "CONSUME_START_TIME"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"  # 5.x timer property cleared on delivery
PROPERTY_TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"  # 5.x timer property cleared on delivery
PROPERTY_TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"  # 5.x: deliver this many ms after the put
PROPERTY_TIMER_OUT_MS: Final = "TIMER_OUT_MS"  # 5.x: the delivery time a timer record waits for
PROPERTY_TIMER_DEQUEUE_MS: Final = "TIMER_DEQUEUE_MS"  # 5.x: when the timer delivered the copy
TIMER_MAX_DELAY_MS: Final = 3 * 24 * 3600 * 1000  # MessageStoreConfig.timerMaxDelaySec, 3 days


# -- Java's integer ranges: RocketMQ's ints and longs, which values parsed from text must fit -------
JAVA_INT_MIN: Final = -(1 << 31)  # Integer.MIN_VALUE
JAVA_INT_MAX: Final = (1 << 31) - 1  # Integer.MAX_VALUE
JAVA_LONG_MIN: Final = -(1 << 63)  # Long.MIN_VALUE
JAVA_LONG_MAX: Final = (1 << 63) - 1  # Long.MAX_VALUE
JAVA_LONG_RANGE: Final = (JAVA_LONG_MIN, JAVA_LONG_MAX)


# -- readOffset answers besides offsets >= 0 (RemoteBrokerOffsetStore, ConsumerOffsetManager) -------
OFFSET_NOT_FOUND: Final = -1  # nothing in memory / no offset stored
OFFSET_READ_ERROR: Final = -2  # the store could not be read
OFFSET_BAD_REQUEST: Final = -3  # no queue given, or an unknown read type (5.x)
