"""Subscription groups and the consumer send-back: a failed message goes to the group's retry topic with a
delay level, or to its DLQ topic once its reconsume times are exhausted."""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from broker_model.broker.config import InnerMessage, PutResult, SubscriptionGroupConfig
from broker_model.broker.put import PutPath
from broker_model.common import constants as c
from broker_model.common import validate_name
from broker_model.store import (
    MessageExt,
    append_rows,
)
from broker_model.store.delta_commits import latest_version
from broker_model.store.store_configs import latest_rows
from schemas.catalog import SUBSCRIPTION_GROUP
from schemas.errors import ValidationError

_SERVED_CAPACITY = 32768  # pulled messages whose queue position the broker remembers for send-backs
GROUP_REFRESH_S = 1.0
"""How often, at most, a broker looks for group settings written while it runs."""


def group_row(broker_name: str, config: SubscriptionGroupConfig, deleted: bool = False) -> dict[str, Any]:
    """The ``subscription_group`` row of ``config`` on ``broker_name``."""
    row: dict[str, Any] = {"broker_name": broker_name, **vars(config), "deleted": deleted}
    row["retry_next_ms"] = list(config.retry_next_ms) if config.retry_next_ms is not None else None
    return row


def group_config(row: Mapping[str, Any]) -> SubscriptionGroupConfig:
    """The settings a ``subscription_group`` row holds."""
    fields = {name: row[name] for name in SubscriptionGroupConfig.__dataclass_fields__}
    if fields["retry_next_ms"] is not None:
        fields["retry_next_ms"] = tuple(fields["retry_next_ms"])
    return SubscriptionGroupConfig(**fields)


class SendBack(PutPath):
    """Subscription groups and send-back of a :class:`~broker_model.broker.controller.Broker` (a mixin)."""

    _subscription_groups: dict[str, SubscriptionGroupConfig]
    _subscription_lock: threading.Lock
    _groups_version: int
    _groups_checked: float  # when the table was last looked at, once the look is done
    _groups_refresh_lock: threading.Lock
    _group_times: dict[str, int]
    _retry_random: random.Random
    _served: OrderedDict[int, tuple[str, int, int]]
    _served_lock: threading.Lock

    # -- subscription groups, retries and dead letters ---------------------------------------------

    def update_subscription_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create or change a consumer group's settings on this broker
        (``updateAndCreateSubscriptionGroup``): appends one ``subscription_group`` row and applies
        it at once. Returns the settings as stored, with an ``updated_timestamp`` strictly greater
        than the group's previous one.

        Raises:
            ValidationError: a bad group name or setting; nothing is written.
        """
        config.validate()
        with self._subscription_lock:
            moment = max(self._clock(), self._group_times.get(config.group, -1) + 1)  # after a deletion too
            stored = replace(config, updated_timestamp=moment)
            rows = pa.Table.from_pylist([group_row(self.broker_name, stored)], SUBSCRIPTION_GROUP.arrow_schema)
            append_rows(self.config.lake, SUBSCRIPTION_GROUP, rows)
            self._subscription_groups[stored.group] = stored
            self._group_times[stored.group] = moment
        return stored

    def subscription_group(self, group: str) -> SubscriptionGroupConfig:
        """The group's settings on this broker: its latest ``subscription_group`` row, or the
        defaults when it has none (RocketMQ auto-creates a missing group with the defaults).

        Raises:
            ValidationError: a bad group name.
        """
        validate_name(group, "group", c.GROUP_MAX_LENGTH)
        self.refresh_subscription_groups()
        with self._subscription_lock:
            found = self._subscription_groups.get(group)
        return found if found is not None else SubscriptionGroupConfig(group)

    def refresh_subscription_groups(self, interval_s: float = GROUP_REFRESH_S) -> None:
        """Apply the ``subscription_group`` rows written since this broker read them (an
        operator's ``admin updateSubGroup`` or ``deleteSubGroup`` while it runs): looked for at most
        once per ``interval_s``, read only when the table has a new version. A caller that comes
        while another reads the table waits for that read: it is never answered from the settings
        the read replaces."""
        if time.monotonic() - self._groups_checked < interval_s:
            return
        with self._groups_refresh_lock:
            if time.monotonic() - self._groups_checked < interval_s:  # read by the caller it waited for
                return
            try:
                if latest_version(SUBSCRIPTION_GROUP.location(self.config.lake)) != self._groups_version:
                    self._load_subscription_groups()
            finally:  # a table that cannot be read is tried again after the interval, not by every caller
                self._groups_checked = time.monotonic()

    def _load_subscription_groups(self) -> None:
        """This broker's latest row per group of ``subscription_group`` (read at start, and again
        when the table changed); a deleted group has the defaults again."""
        version = latest_version(SUBSCRIPTION_GROUP.location(self.config.lake))
        latest = latest_rows(self.config.lake, SUBSCRIPTION_GROUP, self.broker_name, ("group",), "updated_timestamp")
        groups = {group: group_config(row) for (group,), row in latest.items() if not row["deleted"]}
        times = {group: row["updated_timestamp"] for (group,), row in latest.items()}
        with self._subscription_lock:
            self._subscription_groups, self._group_times, self._groups_version = groups, times, version
            self._groups_checked = time.monotonic()

    def consumer_send_back(
        self,
        group: str,
        commit_log_offset: int,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        reconsume_times: int | None = None,
        client_msg_id: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        """``CONSUMER_SEND_MSG_BACK``: store again a message a consumer of ``group`` failed on, as a
        retry or as a dead letter (docs/rocketmq.md, RocketMQ 5.3).

        The original record is read back by ``commit_log_offset`` from this broker. Let ``times``
        be ``reconsume_times`` (None: the stored record's count) and ``limit`` be
        ``max_reconsume_times`` (None: the group's ``retry_max_times``, default 16).

        - ``times >= limit`` or ``delay_level < 0``: a dead letter in ``%DLQ%group`` queue 0,
          stored directly (DELAY set to 0, as RocketMQ stores it).
        - otherwise a retry in ``%RETRY%group`` (created with the group's ``retry_queue_nums``
          queues, one picked at random) with DELAY = ``delay_level``, or ``3 + times`` when 0,
          so that the put redirects it to ``SCHEDULE_TOPIC_XXXX`` until the level's delay passes.

        The copy keeps body (as stored), flag, properties, sys flag, born time and born host; it
        has ``reconsume_times = times + 1``, WAIT=false, RETRY_TOPIC (the original's topic unless
        already set) and ORIGIN_MESSAGE_ID (the original's ``msg_id``, the offset message id,
        unless already set, so it names the first stored copy through every retry).
        ``client_msg_id`` is the client's id of the message, which RocketMQ's request carries for
        its hooks only; it is not stored. ``properties`` are added to the copy's (a tool that
        dead-letters a message on a group's behalf marks the copy with them).

        Returns:
            where the copy went (the schedule topic and level queue for a retry). When the group's
            ``retry_queue_nums`` is 0 nothing is stored and the offsets are empty (RocketMQ then
            answers SUCCESS).

        Raises:
            ValidationError: a bad group name, a negative ``commit_log_offset`` or
                ``reconsume_times``, or no message at ``commit_log_offset``; nothing is written.
            BrokerError, CommitFailedError: as :meth:`put_messages`.
        """
        validate_name(group, "group", c.GROUP_MAX_LENGTH)
        for name, value in (
            ("delay_level", delay_level),
            ("max_reconsume_times", max_reconsume_times),
            ("reconsume_times", reconsume_times),
        ):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValidationError(name, value, "must be an int")
        if reconsume_times is not None and reconsume_times < 0:
            raise ValidationError("reconsume_times", reconsume_times, "must not be negative")
        original = self._look_message_by_offset(commit_log_offset)
        config = self.subscription_group(group)
        if config.retry_queue_nums <= 0:
            return PutResult(self.broker_name, c.RETRY_GROUP_TOPIC_PREFIX + group, -1, (), (), (), self._clock())
        times = original.reconsume_times if reconsume_times is None else reconsume_times
        limit = config.retry_max_times if max_reconsume_times is None else max_reconsume_times
        copied = {**original.properties, **(properties or {})}
        copied.setdefault(c.PROPERTY_RETRY_TOPIC, original.topic)
        copied[c.PROPERTY_WAIT_STORE_MSG_OK] = "false"
        if not (copied.get(c.PROPERTY_ORIGIN_MESSAGE_ID) or "").strip():
            copied[c.PROPERTY_ORIGIN_MESSAGE_ID] = original.msg_id
        if times >= limit or delay_level < 0:
            topic, queue_id = c.DLQ_GROUP_TOPIC_PREFIX + group, 0
            self._ensure_send_back_topic(topic, c.DLQ_NUMS_PER_GROUP)
            copied[c.PROPERTY_DELAY_TIME_LEVEL] = "0"
        else:
            topic, queue_id = c.RETRY_GROUP_TOPIC_PREFIX + group, self._retry_random.randrange(config.retry_queue_nums)
            self._ensure_send_back_topic(topic, config.retry_queue_nums)
            copied[c.PROPERTY_DELAY_TIME_LEVEL] = str(delay_level or c.FIRST_RETRY_DELAY_LEVEL + times)
        host_bits = c.BORNHOST_V6_FLAG | c.STOREHOSTADDRESS_V6_FLAG  # the put sets them for this record
        return self.put_message(
            InnerMessage(
                topic,
                queue_id,
                original.body,
                copied,
                original.flag,
                original.sys_flag & ~host_bits,
                original.born_timestamp,
                original.born_host,
                times + 1,
            )
        )

    def _ensure_send_back_topic(self, topic: str, queue_nums: int) -> None:
        """``createTopicInSendMessageBackMethod``; a retry topic with fewer queues than the group
        now wants is grown, so that consumers see every queue a retry can land in."""
        with self._subscription_lock:
            if (self.topics.get(topic) or 0) < queue_nums:
                self.create_topic(topic, queue_nums)

    def _remember_served(self, messages: Sequence[MessageExt]) -> None:
        """Remember where recently pulled messages sit (commit log offset -> topic, queue, queue
        offset): the store indexes by queue, and a send-back names a message by its commit log
        offset only. Bounded; a forgotten message is found by a slower search."""
        if not messages:
            return
        with self._served_lock:
            for message in messages:
                self._served[message.commit_log_offset] = (message.topic, message.queue_id, message.queue_offset)
                self._served.move_to_end(message.commit_log_offset)
            while len(self._served) > _SERVED_CAPACITY:
                self._served.popitem(last=False)

    def _look_message_by_offset(self, commit_log_offset: int) -> MessageExt:
        """``lookMessageByOffset``: the dispatched record at ``commit_log_offset``, body as stored.

        Raises:
            ValidationError: not a non-negative int, or no dispatched record starts there.
        """
        if not isinstance(commit_log_offset, int) or isinstance(commit_log_offset, bool) or commit_log_offset < 0:
            raise ValidationError("commit_log_offset", commit_log_offset, "must be a non-negative int")
        with self._served_lock:
            place = self._served.get(commit_log_offset)
        found = None if place is None else self.store.message_at(*place, decompress=False)
        if found is None or found.commit_log_offset != commit_log_offset:
            found = self.store.message_by_offset(commit_log_offset)
        if found is None:
            found = self._search_queues(commit_log_offset)
        if found is None:
            raise ValidationError(
                "commit_log_offset",
                commit_log_offset,
                f"no message is stored there on broker {self.broker_name!r}",
                "pass the commit_log_offset of a message pulled from this broker",
            )
        return found

    def _search_queues(self, commit_log_offset: int) -> MessageExt | None:
        """Binary search of every consume queue (commit log offsets rise with queue offsets)."""
        if commit_log_offset >= self.next_commit_log_offset:
            return None
        self.flush()  # an ASYNC_FLUSH put becomes readable once committed
        store = self.store
        for topic, queue_id in store.queues():
            low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id) - 1
            while low <= high:
                middle = (low + high) // 2
                message = store.message_at(topic, queue_id, middle, decompress=False)
                if message is None:
                    break
                if message.commit_log_offset == commit_log_offset:
                    return message
                if message.commit_log_offset < commit_log_offset:
                    low = middle + 1
                else:
                    high = middle - 1
        return None
