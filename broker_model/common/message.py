"""The message model and the validation rules a send must pass before anything is written."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from broker_model.common import constants as c
from schemas.errors import ValidationError

_VALID_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")


@dataclass(frozen=True, order=True)
class MessageQueue:
    """A message queue: (broker_name, topic, queue_id)."""

    broker_name: str
    topic: str
    queue_id: int


class WithProperties:
    """The properties every message carries, read by name (a mixin of :class:`Message` and the
    store's ``MessageExt``)."""

    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        """The TAGS property, or None."""
        return self.properties.get(c.PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        """The KEYS property (space separated), or None."""
        return self.properties.get(c.PROPERTY_KEYS)


@dataclass
class Message(WithProperties):
    """A message as a producer hands it to the broker.

    ``properties`` holds every property, system ones (TAGS, KEYS, WAIT, DELAY, UNIQ_KEY, ...)
    included; use :meth:`create` to build one from user-level arguments.
    """

    topic: str
    body: bytes
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    transaction_id: str | None = None

    @classmethod
    def create(
        cls,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        flag: int = 0,
        user_properties: Mapping[str, str] | None = None,
        delay_level: int = 0,
        wait_store_msg_ok: bool = True,
    ) -> Message:
        """Build a message as RocketMQ's ``Message`` constructor and ``putUserProperty`` do.

        TAGS and KEYS are set when non-empty (a key sequence is joined with a space), WAIT is
        always set, DELAY when ``delay_level > 0``.

        Raises:
            ValidationError: a user property name is reserved, or a name or value is blank.
        """
        properties: dict[str, str] = {}
        if tags:
            properties[c.PROPERTY_TAGS] = tags
        joined = keys if isinstance(keys, str) or keys is None else c.KEY_SEPARATOR.join(keys)
        if joined:
            properties[c.PROPERTY_KEYS] = joined
        properties[c.PROPERTY_WAIT_STORE_MSG_OK] = "true" if wait_store_msg_ok else "false"
        if delay_level > 0:
            properties[c.PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
        for name, value in (user_properties or {}).items():
            _check_user_property(name, value)
            properties[name] = value
        return cls(topic=topic, body=body, flag=flag, properties=properties)

    @property
    def delay_level(self) -> int:
        """The DELAY property as an int, 0 when absent."""
        return int(self.properties.get(c.PROPERTY_DELAY_TIME_LEVEL, "0"))

    @property
    def wait_store_msg_ok(self) -> bool:
        """The WAIT property, true when absent."""
        return self.properties.get(c.PROPERTY_WAIT_STORE_MSG_OK, "true") != "false"


def _check_user_property(name: str, value: str) -> None:
    if name in c.RESERVED_PROPERTY_NAMES:
        raise ValidationError("property name", name, "is reserved for the system", "choose another name")
    if not name.strip():
        raise ValidationError("property name", name, "is blank")
    if not str(value).strip():
        raise ValidationError(f"property {name}", value, "value is blank")


def validate_name(value: str, field_name: str, max_length: int) -> None:
    """Check a topic or group name: non-blank, ``[%|a-zA-Z0-9_-]`` only, at most ``max_length``.

    Raises:
        ValidationError: naming ``field_name`` and the value.
    """
    if not value or not value.strip():
        raise ValidationError(field_name, value, "is blank", f"give a {field_name} name")
    if len(value) > max_length:
        raise ValidationError(field_name, value, f"is longer than {field_name} max length {max_length}", "shorten it")
    if not _VALID_NAME.match(value):
        raise ValidationError(field_name, value, "contains illegal characters", "use only letters, digits and %|_-")


def validate_topic(topic: str) -> None:
    """Check a topic name (RocketMQ ``Validators.checkTopic``); see :func:`validate_name`."""
    validate_name(topic, "topic", c.TOPIC_MAX_LENGTH)


def validate_group(group: str) -> None:
    """Check a group name: same characters as a topic, at most 255 characters."""
    validate_name(group, "group", c.GROUP_MAX_LENGTH)


@functools.lru_cache(maxsize=4096)
def validate_send_topic(topic: str) -> None:
    """Check a topic a user sends to: a valid name and not a topic reserved for the broker.

    Raises:
        ValidationError: "Sending message to topic[...] is forbidden" for the broker's own topics.
    """
    validate_topic(topic)
    if topic in c.NOT_ALLOWED_SEND_TOPICS or topic.startswith(c.SYSTEM_TOPIC_PREFIX):
        raise ValidationError("topic", topic, f"Sending message to topic[{topic}] is forbidden", "send to a user topic")


def validate_message(message: Message, max_message_size: int = c.MAX_MESSAGE_SIZE) -> None:
    """Check one message before it is sent (``Validators.checkMessage``).

    Rules: a sendable topic; a non-empty body of at most ``max_message_size`` bytes (checked on
    the uncompressed body); an integer delay level; a flag that fits a Java int. The 32767-byte
    limit of the stored property string is the broker's check, made before anything is written.

    Raises:
        ValidationError: naming the field and the value.
    """
    validate_send_topic(message.topic)
    _check_content(message, max_message_size, "")


def _check_content(message: Message, max_message_size: int, where: str) -> None:
    body = message.body
    if body is None or len(body) == 0:
        raise ValidationError(f"{where}body", body, "is empty", "send at least one byte")
    if len(body) > max_message_size:
        raise ValidationError(
            f"{where}body",
            f"<{len(body)} bytes>",
            f"is over the max message size {max_message_size}",
            "split the message or raise max_message_size",
        )
    if not -(2**31) <= message.flag < 2**31:
        raise ValidationError(f"{where}flag", message.flag, "does not fit a 32-bit int")
    level = message.properties.get(c.PROPERTY_DELAY_TIME_LEVEL)
    if level is not None and not level.lstrip("-").isdigit():
        raise ValidationError(f"{where}DELAY", level, "is not an integer delay level", "use 0..18")


def validate_batch(messages: Iterable[Message], max_message_size: int = c.MAX_MESSAGE_SIZE) -> list[Message]:
    """Check a batch (``MessageBatch.generateFromList``) and each message in it.

    Rules: not empty; one topic; no retry topic; no delay level; the same WAIT flag.

    Returns:
        the messages as a list.

    Raises:
        ValidationError: naming the field and the value.
    """
    batch = list(messages)
    if not batch:
        raise ValidationError("messages", batch, "batch is empty", "send at least one message")
    first = batch[0]
    validate_send_topic(first.topic)
    for index, message in enumerate(batch):
        _check_content(message, max_message_size, f"messages[{index}].")
        if message.delay_level > 0:
            raise ValidationError(
                f"messages[{index}].DELAY", message.delay_level, "TimeDelayLevel is not supported for batching"
            )
        if message.topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX):
            raise ValidationError(
                f"messages[{index}].topic", message.topic, "retry group topic is not supported for batching"
            )
        if message.topic != first.topic:
            raise ValidationError(
                f"messages[{index}].topic",
                message.topic,
                f"differs from the batch's topic {first.topic!r}",
                "send one batch per topic",
            )
        if message.wait_store_msg_ok != first.wait_store_msg_ok:
            raise ValidationError(f"messages[{index}].WAIT", message.wait_store_msg_ok, "differs within the batch")
    return batch
