"""What every part of the broker shares: RocketMQ's constants, the message model and its validation, the codecs
(properties, ids, hashes) and the RocketMQ rules that several layers apply (see docs/rocketmq.md).
"""

from __future__ import annotations

from broker_model.common.codec import (
    HostAddress,
    UniqKeyFactory,
    body_crc,
    create_msg_id,
    decode_msg_id,
    decode_properties,
    decode_uniq_key,
    decompress_body,
    encode_properties,
    host_from_bytes,
    java_string_hash,
    parse_host,
    process_uniq_key_factory,
    tags_code,
)
from broker_model.common.constants import (
    OFFSET_BAD_REQUEST,
    OFFSET_NOT_FOUND,
    OFFSET_READ_ERROR,
    RETRY_GROUP_TOPIC_PREFIX,
)
from broker_model.common.lake_root import default_lake
from broker_model.common.message import (
    Message,
    MessageQueue,
    validate_batch,
    validate_group,
    validate_message,
    validate_name,
    validate_send_topic,
    validate_topic,
)
from broker_model.common.rules import (
    GROUP_QUEUE_KEY,
    QUEUE_KEY,
    GroupQueueKey,
    QueueKey,
    compute_deliver_timestamp,
    consume_queue_tags_code,
    dispatched_mask,
    is_dispatched,
    level_delay_ms,
    parse_delay_level,
    schedule_level,
    select_queue_by_hash,
)
from broker_model.common.timeutil import now_ms, parse_duration, parse_instant

__all__ = [
    "GROUP_QUEUE_KEY",
    "OFFSET_BAD_REQUEST",
    "OFFSET_NOT_FOUND",
    "OFFSET_READ_ERROR",
    "QUEUE_KEY",
    "RETRY_GROUP_TOPIC_PREFIX",
    "GroupQueueKey",
    "HostAddress",
    "Message",
    "MessageQueue",
    "QueueKey",
    "UniqKeyFactory",
    "body_crc",
    "compute_deliver_timestamp",
    "consume_queue_tags_code",
    "create_msg_id",
    "decode_msg_id",
    "decode_properties",
    "decode_uniq_key",
    "decompress_body",
    "default_lake",
    "dispatched_mask",
    "encode_properties",
    "host_from_bytes",
    "is_dispatched",
    "java_string_hash",
    "level_delay_ms",
    "now_ms",
    "parse_delay_level",
    "parse_duration",
    "parse_host",
    "parse_instant",
    "process_uniq_key_factory",
    "schedule_level",
    "select_queue_by_hash",
    "tags_code",
    "validate_batch",
    "validate_group",
    "validate_message",
    "validate_name",
    "validate_send_topic",
    "validate_topic",
]
