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
# properties of the system (MessageConst.STRING_HASH_SET and the proxy's own), never user properties
SYSTEM_PROPERTIES: Final = c.RESERVED_PROPERTY_NAMES | {
    c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    c.PROPERTY_CLUSTER,
    c.PROPERTY_TRANSACTION_ID,
    c.PROPERTY_TIMER_DELIVER_MS,
    c.PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TRACE_CONTEXT,
    PROPERTY_BORN_HOST,
    PROPERTY_BORN_TIMESTAMP,
}


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
