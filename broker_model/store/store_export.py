"""A broker of the lake written out as a RocketMQ store root (``storePathRootDir``): the commit log
files (:func:`~broker_model.store.segment_files.export_commitlog`), the consume queue files of the
broker's own index, and the config files RocketMQ keeps, written as fastjson writes them. What
``ingest-store`` reads back, and what a RocketMQ broker started on that root would serve. See
docs/ingest.md.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from broker_model.common import constants as c
from broker_model.common import delay_progress_path, now_ms
from broker_model.store.message_store import MessageStore
from broker_model.store.segment_files import export_commitlog
from broker_model.store.store_configs import latest_rows, retry_policy_json
from schemas.catalog import CONSUMER_OFFSET_COMMITS, SUBSCRIPTION_GROUP, TOPIC_CONFIG
from schemas.errors import ValidationError

CQ_UNIT_SIZE: Final = 20  # ConsumeQueue.CQ_STORE_UNIT_SIZE
CQ_UNITS_PER_FILE: Final = 300_000  # mappedFileSizeConsumeQueue = 300000 * 20
_UNIT: Final = struct.Struct(">qiq")


@dataclass(frozen=True)
class StoreExportReport:
    """What :func:`export_store` wrote: commit log files and records, consume queues and their
    units, and the config entries (offsets, topics, groups)."""

    broker_name: str
    out_dir: Path
    commitlog_files: int
    records: int
    queues: int
    units: int
    offsets: int
    topics: int
    groups: int

    def summary(self) -> str:
        """One line for the command line."""
        return (
            f"exported broker {self.broker_name!r} as a RocketMQ store in {self.out_dir}: {self.records} records in "
            f"{self.commitlog_files} commit log files, {self.units} units in {self.queues} consume queues, "
            f"{self.offsets} offsets, {self.topics} topics, {self.groups} groups"
        )


def export_store(
    lake: Path, broker_name: str, out_dir: Path, cq_units_per_file: int = CQ_UNITS_PER_FILE
) -> StoreExportReport:
    """Write broker ``broker_name`` of ``lake`` as a RocketMQ store root in ``out_dir`` (new or empty):
    ``commitlog/``, ``consumequeue/<topic>/<queueId>/`` (files of ``cq_units_per_file`` units,
    named by their first byte, the last one zero-filled to its size), and ``config/``
    (``consumerOffset.json`` with each queue's latest offset, ``topics.json``,
    ``subscriptionGroup.json``, ``delayOffset.json`` when the broker has schedule progress).

    Raises:
        ValidationError: unknown broker, ``out_dir`` not new or empty, or ``cq_units_per_file`` < 1.
    """
    out_dir = Path(out_dir)
    if cq_units_per_file < 1:
        raise ValidationError("cq_units_per_file", cq_units_per_file, "must be positive")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValidationError("out_dir", str(out_dir), "is not a new or empty directory", "export into a new one")
    log = export_commitlog(lake, broker_name, out_dir / "commitlog")
    queues, units = _write_consume_queues(MessageStore(lake, broker_name).load(), out_dir, cq_units_per_file)
    config = out_dir / "config"
    config.mkdir()
    group_queue = ("group", "topic", "queue_id")
    offsets = latest_rows(lake, CONSUMER_OFFSET_COMMITS, broker_name, group_queue, "commit_timestamp")
    topics = latest_rows(lake, TOPIC_CONFIG, broker_name, ("topic",), "updated_timestamp")
    groups = latest_rows(lake, SUBSCRIPTION_GROUP, broker_name, ("group",), "updated_timestamp")
    (config / "consumerOffset.json").write_text(_offsets_json(offsets), encoding="utf-8")
    (config / "topics.json").write_text(_topics_json(topics), encoding="utf-8")
    (config / "subscriptionGroup.json").write_text(_groups_json(groups), encoding="utf-8")
    delay = delay_progress_path(lake, broker_name)
    if delay.exists():
        table = json.loads(delay.read_text(encoding="utf-8")).get("offsetTable", {})
        level_offsets = ",".join(f"{int(level)}:{int(offset)}" for level, offset in sorted(table.items(), key=_level))
        (config / "delayOffset.json").write_text(f'{{"offsetTable":{{{level_offsets}}}}}', encoding="utf-8")
    return StoreExportReport(
        broker_name, out_dir, log.files, log.records, queues, units, len(offsets), len(topics), len(groups)
    )


def _level(item: tuple[str, Any]) -> int:
    return int(item[0])


def _write_consume_queues(store: MessageStore, out_dir: Path, units_per_file: int) -> tuple[int, int]:
    file_size = units_per_file * CQ_UNIT_SIZE
    total = 0
    queues = store.queues()
    for topic, queue_id in queues:
        base, offsets, sizes, tags = store.cq_rows(topic, queue_id)
        directory = out_dir / "consumequeue" / topic / str(queue_id)
        directory.mkdir(parents=True)
        end = base + len(offsets)
        for first in range(base - base % units_per_file, end, units_per_file):
            data = bytearray(file_size)
            for queue_offset in range(first, min(first + units_per_file, end)):
                at = (queue_offset - first) * CQ_UNIT_SIZE
                if queue_offset < base:  # before a queue's first row, as ConsumeQueue.fillPreBlank writes
                    _UNIT.pack_into(data, at, 0, c.JAVA_INT_MAX, 0)
                else:
                    i = queue_offset - base
                    _UNIT.pack_into(data, at, offsets[i], sizes[i], tags[i])
            (directory / f"{first * CQ_UNIT_SIZE:020d}").write_bytes(bytes(data))
        total += len(offsets)
    return len(queues), total


def _data_version() -> str:
    return json.dumps({"counter": 1, "stateVersion": 0, "timestamp": now_ms()}, separators=(",", ":"))


def _offsets_json(latest: Mapping[tuple[Any, ...], Mapping[str, Any]]) -> str:
    """``offsetTable`` as fastjson writes a ``ConcurrentMap<String, ConcurrentMap<Integer, Long>>``:
    the integer queue ids as bare keys."""
    by_key: dict[str, list[tuple[int, int]]] = {}
    for (group, topic, queue_id), row in sorted(latest.items()):
        by_key.setdefault(f"{topic}@{group}", []).append((queue_id, row["offset"]))
    tables = ",".join(
        f"{json.dumps(key)}:{{{','.join(f'{q}:{o}' for q, o in queues)}}}" for key, queues in by_key.items()
    )
    return f'{{"dataVersion":{_data_version()},"offsetTable":{{{tables}}}}}'


def _topics_json(latest: Mapping[tuple[Any, ...], Mapping[str, Any]]) -> str:
    table = {
        topic: {
            "order": False,
            "perm": row["perm"],
            "readQueueNums": row["queue_nums"],
            "topicFilterType": "SINGLE_TAG",
            "topicName": topic,
            "topicSysFlag": 0,
            "writeQueueNums": row["queue_nums"],
            **({"attributes": {c.MESSAGE_TYPE_ATTRIBUTE: row["message_type"]}} if row["message_type"] else {}),
        }
        for (topic,), row in sorted(latest.items())
    }
    return f'{{"dataVersion":{_data_version()},"topicConfigTable":{json.dumps(table, separators=(",", ":"))}}}'


def _groups_json(latest: Mapping[tuple[Any, ...], Mapping[str, Any]]) -> str:
    table = {
        group: {
            "brokerId": 0,
            "consumeBroadcastEnable": row["consume_broadcast_enable"],
            "consumeEnable": row["consume_enable"],
            "consumeFromMinEnable": row["consume_from_min_enable"],
            "consumeMessageOrderly": row["consume_message_orderly"],
            "groupName": group,
            "notifyConsumerIdsChangedEnable": True,
            "retryMaxTimes": row["retry_max_times"],
            "retryQueueNums": row["retry_queue_nums"],
            "whichBrokerWhenConsumeSlowly": 1,
            **({"groupRetryPolicy": retry_policy_json(row)} if row["retry_policy"] else {}),
        }
        for (group,), row in sorted(latest.items())
        if not row["deleted"]
    }
    body = json.dumps(table, separators=(",", ":"))
    return f'{{"dataVersion":{_data_version()},"subscriptionGroupTable":{body}}}'
