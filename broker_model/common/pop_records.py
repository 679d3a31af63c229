"""The records of POP consumption in RocketMQ 5's own form (docs/pop.md): the checkpoint (``ck``)
and ack bodies of the revive topic, the receipt handle, and the names of the revive and POP retry
topics. Our brokers write them (``broker_model.broker.pop``) and the jobs read them, from our
brokers' logs and from stores ingested from Apache RocketMQ 5 brokers alike.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker_model.common import constants as c
from schemas.errors import ValidationError

TOPIC_TYPE_NORMAL: Final = "0"
TOPIC_TYPE_RETRY_V1: Final = "1"
TOPIC_TYPE_RETRY_V2: Final = "2"


class PopError(ValidationError):
    """A pop, ack or change the broker refuses; ``code`` is the gRPC status code the proxy answers
    with (``INVALID_RECEIPT_HANDLE``, ``MESSAGE_NOT_FOUND``, ...)."""

    def __init__(self, code: str, field_name: str, value: object, problem: str, fix: str = "") -> None:
        super().__init__(field_name, value, problem, fix)
        self.code = code


def revive_topic(cluster_name: str) -> str:
    """``PopAckConstants.buildClusterReviveTopic``."""
    return c.REVIVE_TOPIC_PREFIX + cluster_name


def pop_retry_topic(topic: str, group: str) -> str:
    """``KeyBuilder.buildPopRetryTopic`` (v1, RocketMQ's default): ``%RETRY%<group>_<topic>``."""
    return f"{c.RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


def _json(data: Mapping[str, Any]) -> str:
    """fastjson2's compact form: keys in order, no spaces, null fields left out, UTF-8 as is."""
    kept = {k: v for k, v in sorted(data.items()) if v is not None}
    return json.dumps(kept, separators=(",", ":"), ensure_ascii=False)


def _field(data: Mapping[str, Any], short: str, long: str, kind: type, text: str) -> Any:
    value = data.get(short, data.get(long))
    if kind is int and isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ValidationError(short, value, f"is not a {kind.__name__} in the POP record {text[:200]!r}")
    return value


def _parse(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValidationError("body", text[:200], f"is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValidationError("body", text[:200], "is not a JSON object")
    return data


@dataclass(frozen=True)
class PopCheckPoint:
    """``PopCheckPoint``: one pop of one queue by one group (docs/pop.md, "The checkpoint")."""

    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    invisible_time: int
    offset_diffs: tuple[int, ...]
    group: str
    broker_name: str
    re_put_times: str | None = None
    suspend: bool = False
    revive_offset: int = 0  # where it was read in its revive queue; 0 in a stored record

    @property
    def num(self) -> int:
        return len(self.offset_diffs)

    @property
    def revive_time(self) -> int:
        return self.pop_time + self.invisible_time

    @property
    def offsets(self) -> tuple[int, ...]:
        """The queue offset of each of its messages (``ackOffsetByIndex``)."""
        return tuple(self.start_offset + d for d in self.offset_diffs)

    @property
    def key(self) -> tuple[str, str, int, int, int, str]:
        """What its acks are matched by: topic, group, queue, start offset, pop time, broker
        (RocketMQ joins them with no separator; apart, queue 1 at offset 23 is not queue 12 at 3)."""
        return self.topic, self.group, self.queue_id, self.start_offset, self.pop_time, self.broker_name

    @property
    def unique_id(self) -> str:
        """``genCkUniqueId``: the record's UNIQ_KEY."""
        parts = (self.topic, self.queue_id, self.start_offset, self.group, self.pop_time, self.broker_name)
        return "@".join(str(p) for p in parts) + "@" + c.CK_TAG

    def to_json(self) -> str:
        return _json(
            {
                "bm": 0,
                "bn": self.broker_name,
                "c": self.group,
                "d": list(self.offset_diffs),
                "it": self.invisible_time,
                "n": self.num,
                "pt": self.pop_time,
                "q": self.queue_id,
                "reviveTime": self.revive_time,
                "ro": 0,
                "rp": self.re_put_times,
                "so": self.start_offset,
                "sp": self.suspend,
                "t": self.topic,
            }
        )

    @classmethod
    def from_json(cls, text: str, revive_offset: int = 0) -> PopCheckPoint:
        """A ck record's body (short or long keys; a ck without ``d`` covers ``so .. so+n-1``).

        Raises:
            ValidationError: not a ck, naming the field.
        """
        data = _parse(text)
        start = _field(data, "so", "startOffset", int, text)
        num = _field(data, "n", "num", int, text)
        diffs = data.get("d", data.get("queueOffsetDiff"))
        if diffs is None:
            diffs = list(range(num))
        if not isinstance(diffs, list) or not all(isinstance(d, int) for d in diffs):
            raise ValidationError("d", diffs, f"is not a list of ints in the POP record {text[:200]!r}")
        re_put = data.get("rp", data.get("rePutTimes"))
        return cls(
            topic=_field(data, "t", "topic", str, text),
            queue_id=_field(data, "q", "queueId", int, text),
            start_offset=start,
            pop_time=_field(data, "pt", "popTime", int, text),
            invisible_time=_field(data, "it", "invisibleTime", int, text),
            offset_diffs=tuple(diffs),
            group=_field(data, "c", "cid", str, text),
            broker_name=str(data.get("bn", data.get("brokerName")) or ""),
            re_put_times=None if re_put is None else str(re_put),
            suspend=bool(data.get("sp", data.get("suspend", False))),
            revive_offset=revive_offset,
        )


@dataclass(frozen=True)
class AckMsg:
    """``AckMsg`` (and ``BatchAckMsg``: several ``offsets``): the ack of messages of one checkpoint."""

    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    offsets: tuple[int, ...]
    group: str
    broker_name: str

    @property
    def key(self) -> tuple[str, str, int, int, int, str]:
        """The key of the checkpoint it acks (:attr:`PopCheckPoint.key`)."""
        return self.topic, self.group, self.queue_id, self.start_offset, self.pop_time, self.broker_name

    @property
    def unique_id(self) -> str:
        """``genAckUniqueId``."""
        parts = (self.topic, self.queue_id, self.offsets[0], self.group, self.pop_time, self.broker_name)
        return "@".join(str(p) for p in parts) + "@" + c.ACK_TAG

    def to_json(self) -> str:
        return _json(
            {
                "ao": self.offsets[0],
                "bn": self.broker_name,
                "c": self.group,
                "pt": self.pop_time,
                "q": self.queue_id,
                "so": self.start_offset,
                "t": self.topic,
            }
        )

    @classmethod
    def from_json(cls, text: str, own_broker: str) -> AckMsg:
        """An ack or batch-ack record's body; a blank broker name is the broker's own.

        Raises:
            ValidationError: not an ack, naming the field.
        """
        data = _parse(text)
        listed = data.get("aol", data.get("ackOffsetList"))
        if isinstance(listed, list) and all(isinstance(o, int) for o in listed):
            offsets = tuple(listed)
        else:
            offsets = (_field(data, "ao", "ackOffset", int, text),)
        return cls(
            topic=_field(data, "t", "topic", str, text),
            queue_id=_field(data, "q", "queueId", int, text),
            start_offset=_field(data, "so", "startOffset", int, text),
            pop_time=_field(data, "pt", "popTime", int, text),
            offsets=offsets,
            group=_field(data, "c", "consumerGroup", str, text),
            broker_name=str(data.get("bn", data.get("brokerName")) or "") or own_broker,
        )


@dataclass(frozen=True)
class ReceiptHandle:
    """The gRPC receipt handle: the broker's extraInfo plus the commit log offset, joined by one
    space (``ExtraInfoUtil``, ``ReceiptHandle``; docs/pop.md)."""

    start_offset: int
    pop_time: int
    invisible_time: int
    revive_queue_id: int
    topic_type: str
    broker_name: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int

    def encode(self) -> str:
        return c.KEY_SEPARATOR.join(str(v) for v in dataclasses.astuple(self))

    @property
    def expires(self) -> int:
        return self.pop_time + self.invisible_time

    @property
    def orderly(self) -> bool:
        """Whether a FIFO group's pop gave it (no checkpoint: revive queue 999)."""
        return self.revive_queue_id == c.POP_ORDER_REVIVE_QUEUE

    def real_topic(self, topic: str, group: str) -> str:
        """``ReceiptHandle.getRealTopic``: the retry topic for a retried message."""
        if self.topic_type == TOPIC_TYPE_RETRY_V1:
            return pop_retry_topic(topic, group)
        if self.topic_type == TOPIC_TYPE_RETRY_V2:
            return f"{c.RETRY_GROUP_TOPIC_PREFIX}{group}+{topic}"
        return topic

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        """Raises:
        PopError: ``INVALID_RECEIPT_HANDLE`` for text that is not nine fields of a handle."""
        parts = text.split(c.KEY_SEPARATOR) if isinstance(text, str) else []
        numbers = (0, 1, 2, 3, 6, 7, 8)
        kinds = (TOPIC_TYPE_NORMAL, TOPIC_TYPE_RETRY_V1, TOPIC_TYPE_RETRY_V2)
        well_formed = len(parts) == 9 and all(parts[i].lstrip("-").isdigit() for i in numbers) and parts[4] in kinds
        if not well_formed or not (
            0 <= int(parts[3]) < c.REVIVE_QUEUE_NUM or int(parts[3]) == c.POP_ORDER_REVIVE_QUEUE
        ):
            raise PopError(
                "INVALID_RECEIPT_HANDLE",
                "receipt_handle",
                text,
                "is not a receipt handle of this endpoint",
                "pass the receipt_handle of a received message",
            )
        so, pt, it, rq, kind, bn, q, qo, clo = parts
        return cls(int(so), int(pt), int(it), int(rq), kind, bn, int(q), int(qo), int(clo))


def ack_of(handle: ReceiptHandle, real_topic: str, group: str) -> AckMsg:
    """The ack of the message of ``handle``, in the checkpoint the handle names."""
    where = (real_topic, handle.queue_id, handle.start_offset, handle.pop_time)
    return AckMsg(*where, (handle.queue_offset,), group, handle.broker_name)
