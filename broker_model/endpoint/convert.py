"""A stored message as the protocol's ``Message`` (``GrpcConverter.buildMessage`` of RocketMQ 5's
proxy): what the endpoint sends to clients (transaction check-backs now, consumption later)."""

from __future__ import annotations

import hashlib
from typing import Final

from rocketmq.grpc_protocol import definition_pb2 as pb

from broker_model.common import constants as c
from broker_model.store import MessageExt

PROPERTY_SHARDING_KEY: Final = "__SHARDINGKEY"
PROPERTY_TRACE_CONTEXT: Final = "TRACE_CONTEXT"
PROPERTY_BORN_HOST: Final = "__BORNHOST"
PROPERTY_BORN_TIMESTAMP: Final = "BORN_TIMESTAMP"
# RocketMQ 5's MessageConst.STRING_HASH_SET: the properties of the system. The proxy refuses them as
# user properties of a send and shows every other property of a stored message as a user property
# (GrpcConverter.buildUserAttributes), TRANSACTION_CHECK_TIMES and __transactionId__ included.
SYSTEM_PROPERTIES: Final = frozenset(
    {
        "1ST_POP_TIME",
        "ARRIVE_TIME",
        "BORN_TIMESTAMP",
        "BUYER_ID",
        "CLUSTER",
        "CONSUME_START_TIME",
        "CORRECTION_FLAG",
        "CORRELATION_ID",
        "DELAY",
        "DLQ_ORIGIN_MESSAGE_ID",
        "DLQ_ORIGIN_TOPIC",
        "DUP_INFO",
        "EXTEND_UNIQ_INFO",
        "INNER_MULTI_QUEUE_OFFSET",
        "INSTANCE_ID",
        "KEYS",
        "MAX_OFFSET",
        "MAX_RECONSUME_TIMES",
        "MIN_OFFSET",
        "MQ2_FLAG",
        "MSG_REGION",
        "MSG_TYPE",
        "ORIGIN_MESSAGE_ID",
        "PGROUP",
        "POP_CK",
        "POP_CK_OFFSET",
        "PUSH_REPLY_TIME",
        "REAL_QID",
        "REAL_TOPIC",
        "RECONSUME_TIME",
        "REPLY_TO_CLIENT",
        "RETRY_TOPIC",
        "TAGS",
        "TIMER_DELAY_LEVEL",
        "TIMER_DELAY_MS",
        "TIMER_DELAY_SEC",
        "TIMER_DELIVER_MS",
        "TIMER_DEL_UNIQKEY",
        "TIMER_DEQUEUE_MS",
        "TIMER_ENQUEUE_MS",
        "TIMER_OUT_MS",
        "TIMER_ROLL_TIMES",
        "TRACE_ON",
        "TRANSFER_FLAG",
        "TRAN_MSG",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "TTL",
        "UNIQ_KEY",
        "WAIT",
        PROPERTY_BORN_HOST,
        "__CRC32#",
    }
)


def protocol_message(message: MessageExt, topic: str | None = None, queue_id: int | None = None) -> pb.Message:
    """``message`` (its body as stored) as a protocol ``Message``, under ``topic`` and ``queue_id``
    when given (a half message is shown in its real topic)."""
    properties = message.properties
    system = pb.SystemProperties(
        message_id=properties.get(c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or message.msg_id,
        body_encoding=pb.GZIP if message.sys_flag & c.COMPRESSED_FLAG else pb.IDENTITY,
        message_type=_message_type(properties),
        born_host=properties.get(PROPERTY_BORN_HOST) or message.born_host,
        store_host=message.store_host,
        queue_id=message.queue_id if queue_id is None else queue_id,
        queue_offset=message.queue_offset,
        delivery_attempt=message.reconsume_times + 1,
    )
    system.body_digest.type = pb.MD5
    system.body_digest.checksum = hashlib.md5(message.body).hexdigest().upper()
    system.born_timestamp.FromMilliseconds(message.born_timestamp)
    system.store_timestamp.FromMilliseconds(message.store_timestamp)
    if c.PROPERTY_TAGS in properties:
        system.tag = properties[c.PROPERTY_TAGS]
    if properties.get(c.PROPERTY_KEYS):
        system.keys.extend(properties[c.PROPERTY_KEYS].split(c.KEY_SEPARATOR))
    if c.PROPERTY_TIMER_DELIVER_MS in properties:
        system.delivery_timestamp.FromMilliseconds(int(properties[c.PROPERTY_TIMER_DELIVER_MS]))
    if PROPERTY_SHARDING_KEY in properties:
        system.message_group = properties[PROPERTY_SHARDING_KEY]
    if PROPERTY_TRACE_CONTEXT in properties:
        system.trace_context = properties[PROPERTY_TRACE_CONTEXT]
    user = {k: v for k, v in properties.items() if k not in SYSTEM_PROPERTIES}
    return pb.Message(
        topic=pb.Resource(name=topic or message.topic),
        user_properties=user,
        system_properties=system,
        body=message.body,
    )


def _message_type(properties: dict[str, str]) -> int:
    kind: int = pb.NORMAL
    if properties.get(c.PROPERTY_TRANSACTION_PREPARED) == "true":
        kind = pb.TRANSACTION
    elif {c.PROPERTY_DELAY_TIME_LEVEL, c.PROPERTY_TIMER_DELIVER_MS, c.PROPERTY_TIMER_DELAY_SEC} & properties.keys():
        kind = pb.DELAY
    elif PROPERTY_SHARDING_KEY in properties:
        kind = pb.FIFO
    return kind
