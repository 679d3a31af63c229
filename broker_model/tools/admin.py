"""``python -m broker_model admin``: topic administration as operators do it with RocketMQ's
``mqadmin``, on the lake's ``topic_config`` table, where the brokers and ``serve`` read it (a running
broker applies a change within :data:`~broker_model.broker.put.TOPIC_REFRESH_S`). See docs/broker.md
("Administration").

- ``updateTopic -t T (-b BROKER | -c CLUSTER) [-r N -w N] [-p PERM] [-a +message.type=TYPE]``
- ``topicList [-c]``
- ``updateSubGroup -g G (-b BROKER | -c CLUSTER) [-s BOOL] [-m BOOL] [-d BOOL] [-o BOOL] [-q N] [-r N]
  [-p POLICY_JSON]``, ``deleteSubGroup -g G (-b BROKER | -c CLUSTER)``, ``groupList``: the same for
  consumer groups, on ``subscription_group``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from broker_model.broker.config import SubscriptionGroupConfig, TopicConfig
from broker_model.broker.send_back import group_config, group_row
from broker_model.common import constants as c
from broker_model.common import default_lake, now_ms
from broker_model.store.delta_tables import append_rows, read_table
from broker_model.store.store_configs import retry_policy_columns
from schemas.catalog import BROKERS, SUBSCRIPTION_GROUP, TOPIC_CONFIG
from schemas.errors import ValidationError

CLUSTER_NAME = "DefaultCluster"
"""The cluster the lake's brokers form (``BrokerConfig.cluster_name``): the lake records no other."""

DEFAULT_QUEUE_NUMS = 8  # mqadmin updateTopic's -r and -w
ATTRIBUTES = (c.MESSAGE_TYPE_ATTRIBUTE,)  # the topic attributes the lake keeps


def add_admin_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``admin`` (``updateTopic``, ``topicList``, ``updateSubGroup``, ``deleteSubGroup``,
    ``groupList``) on ``subparsers``."""
    admin = subparsers.add_parser("admin", help="topics and consumer groups as with mqadmin (updateTopic, ...)")
    commands = admin.add_subparsers(dest="admin_command", required=True)
    update = commands.add_parser("updateTopic", help="create or change a topic on brokers of the lake")
    update.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    update.add_argument("-t", "--topic", required=True, help="topic name")
    where = update.add_mutually_exclusive_group(required=True)
    where.add_argument("-b", "--brokerAddr", help="one broker: its name or its store address (host:port)")
    where.add_argument("-c", "--clusterName", help=f"every broker of the lake (the cluster {CLUSTER_NAME})")
    update.add_argument("-r", "--readQueueNums", type=int, default=None, help="read queues (default 8)")
    update.add_argument("-w", "--writeQueueNums", type=int, default=None, help="write queues (default 8)")
    update.add_argument("-p", "--perm", type=int, default=c.PERM_READ | c.PERM_WRITE, help="2 W, 4 R, 6 RW (default)")
    update.add_argument("-a", "--attributes", default=None, help="+message.type=NORMAL|FIFO|DELAY|TRANSACTION|MIXED")
    update.set_defaults(func=_update_topic)
    listing = commands.add_parser("topicList", help="the lake's topics, or with -c each broker's settings of them")
    listing.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    listing.add_argument("-c", "--clusterModel", action="store_true", help="one line per broker and topic")
    listing.set_defaults(func=_topic_list)
    group = commands.add_parser("updateSubGroup", help="create or change a consumer group on brokers of the lake")
    _lake_and_brokers(group)
    group.add_argument("-g", "--groupName", required=True, help="consumer group name")
    for letter, name, default in (
        ("-s", "--consumeEnable", "true"),
        ("-m", "--consumeFromMinEnable", "false"),
        ("-d", "--consumeBroadcastEnable", "false"),
        ("-o", "--consumeMessageOrderly", "false"),
    ):
        group.add_argument(letter, name, type=_boolean(name[2:]), default=_boolean(name[2:])(default), help=default)
    group.add_argument("-q", "--retryQueueNums", type=int, default=c.RETRY_QUEUE_NUMS, help="retry queues (1)")
    group.add_argument("-r", "--retryMaxTimes", type=int, default=c.RETRY_MAX_TIMES, help="retries (16)")
    group.add_argument("-p", "--groupRetryPolicy", default=None, help='e.g. {"type":"EXPONENTIAL",...} as mqadmin')
    group.set_defaults(func=_update_group)
    deletion = commands.add_parser("deleteSubGroup", help="delete a consumer group's settings on brokers of the lake")
    _lake_and_brokers(deletion)
    deletion.add_argument("-g", "--groupName", required=True, help="consumer group name")
    deletion.set_defaults(func=_delete_group)
    groups = commands.add_parser("groupList", help="every broker's consumer groups and their settings")
    groups.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    groups.set_defaults(func=_group_list)


def _lake_and_brokers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("-b", "--brokerAddr", help="one broker: its name or its store address (host:port)")
    where.add_argument("-c", "--clusterName", help=f"every broker of the lake (the cluster {CLUSTER_NAME})")


def _boolean(name: str) -> Callable[[str], bool]:
    def parse(text: str) -> bool:
        if text.strip().lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"{name}={text!r}: is not true or false")
        return text.strip().lower() == "true"

    return parse


def update_group(lake: Path, config: SubscriptionGroupConfig, brokers: Sequence[str]) -> SubscriptionGroupConfig:
    """Create or change a consumer group on each broker of ``brokers`` (names) as ``mqadmin
    updateSubGroup`` does: the settings replace the group's. One ``subscription_group`` row per
    broker, in one commit, each timed after the group's latest row there; the settings written.

    Raises:
        ValidationError: a bad setting (nothing is written).
    """
    config.validate()
    latest = latest_group_rows(lake)
    moment = now_ms()
    rows = []
    for broker in brokers:
        previous = latest.get((broker, config.group))
        at = max(moment, previous["updated_timestamp"] + 1) if previous is not None else moment
        rows.append(group_row(broker, replace(config, updated_timestamp=at)))
    append_rows(lake, SUBSCRIPTION_GROUP, pa.Table.from_pylist(rows, schema=SUBSCRIPTION_GROUP.arrow_schema))
    return config


def delete_group(lake: Path, group: str, brokers: Sequence[str]) -> list[str]:
    """Delete ``group`` on each broker of ``brokers`` where it has settings (``mqadmin
    deleteSubGroup``): a row of the defaults marked ``deleted`` per such broker, in one commit; the
    brokers it was deleted on (a broker without it writes nothing, as RocketMQ's answers success)."""
    latest = latest_group_rows(lake)
    moment = now_ms()
    rows = []
    for broker in brokers:
        previous = latest.get((broker, group))
        if previous is None or previous["deleted"]:
            continue
        at = max(moment, previous["updated_timestamp"] + 1)
        rows.append(group_row(broker, SubscriptionGroupConfig(group, updated_timestamp=at), deleted=True))
    if rows:
        append_rows(lake, SUBSCRIPTION_GROUP, pa.Table.from_pylist(rows, schema=SUBSCRIPTION_GROUP.arrow_schema))
    return [row["broker_name"] for row in rows]


def latest_group_rows(lake: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Every broker's latest ``subscription_group`` row per group: ``(broker, group) -> row``."""
    rows = read_table(lake, SUBSCRIPTION_GROUP).sort_by("updated_timestamp").to_pylist()
    return {(row["broker_name"], row["group"]): row for row in rows}


def update_topic(
    lake: Path,
    topic: str,
    brokers: Sequence[str],
    queue_nums: int = DEFAULT_QUEUE_NUMS,
    perm: int = c.PERM_READ | c.PERM_WRITE,
    attributes: Mapping[str, str | None] | None = None,
) -> list[TopicConfig]:
    """Create or change ``topic`` on each broker of ``brokers`` (names) as ``mqadmin updateTopic``
    does: the queue count and permission given, the attributes altered (``key -> value`` adds or
    changes, ``key -> None`` removes) from the broker's current ones. One ``topic_config`` row per
    broker, in one commit; the settings written.

    Raises:
        ValidationError: a bad setting, an unsupported attribute, or removing one the topic lacks on
            a broker (nothing is written).
    """
    latest = _latest_topic_rows(lake)
    configs = []
    for broker in brokers:
        current = latest.get((broker, topic))
        kind = current["message_type"] if current is not None else None
        for key, value in (attributes or {}).items():
            if key not in ATTRIBUTES:
                raise ValidationError(
                    "attributes", key, "is not a topic attribute the lake keeps", f"one of {ATTRIBUTES}"
                )
            if value is None and kind is None:
                raise ValidationError("attributes", f"-{key}", f"removes an attribute {topic!r} lacks on {broker!r}")
            kind = value
        config = TopicConfig(topic, queue_nums, perm, kind)
        config.validate()
        configs.append(config)
    moment = now_ms()
    rows = []
    for broker, config in zip(brokers, configs, strict=True):
        previous = latest.get((broker, topic))
        at = max(moment, previous["updated_timestamp"] + 1) if previous is not None else moment  # the latest
        rows.append({"broker_name": broker, **vars(config), "updated_timestamp": at})
    append_rows(lake, TOPIC_CONFIG, pa.Table.from_pylist(rows, schema=TOPIC_CONFIG.arrow_schema))
    return configs


def latest_topic_configs(lake: Path) -> dict[tuple[str, str], TopicConfig]:
    """Every broker's latest ``topic_config`` row per topic: ``(broker, topic) -> settings``."""
    return {
        key: TopicConfig(row["topic"], row["queue_nums"], row["perm"], row["message_type"])
        for key, row in _latest_topic_rows(lake).items()
    }


def _latest_topic_rows(lake: Path) -> dict[tuple[str, str], dict[str, Any]]:
    rows = read_table(lake, TOPIC_CONFIG).sort_by("updated_timestamp").to_pylist()
    return {(row["broker_name"], row["topic"]): row for row in rows}


def lake_brokers(lake: Path) -> dict[str, str | None]:
    """The brokers of the lake: every name in ``brokers`` (with its latest store address) or in
    ``topic_config`` (an address only when registered)."""
    found: dict[str, str | None] = {}
    for row in read_table(lake, TOPIC_CONFIG, ["broker_name"]).to_pylist():
        found[row["broker_name"]] = None
    registered = read_table(lake, BROKERS, ["broker_name", "store_host", "started_timestamp"])
    for row in registered.sort_by("started_timestamp").to_pylist():
        found[row["broker_name"]] = row["store_host"]
    return found


def parse_attributes(text: str) -> dict[str, str | None]:
    """mqadmin's ``-a``: ``+key=value`` adds or changes, ``-key`` removes, comma-separated.

    Raises:
        ValidationError: a part of another form, or a key given twice.
    """
    parsed: dict[str, str | None] = {}
    for part in (part.strip() for part in text.split(",")):
        key, value = part[1:].partition("=")[0].strip(), part.partition("=")[2].strip()
        adds = part.startswith("+") and "=" in part and key and value
        if not adds and not (part.startswith("-") and "=" not in part and key):
            raise ValidationError("attributes", part, "is not +key=value or -key")
        if key in parsed:
            raise ValidationError("attributes", key, "is given twice")
        parsed[key] = value if adds else None
    return parsed


def _targets(lake: Path, broker: str | None, cluster: str | None) -> list[str]:
    known = lake_brokers(lake)
    if cluster is not None:
        if cluster != CLUSTER_NAME:
            raise ValidationError("clusterName", cluster, f"is not the lake's cluster ({CLUSTER_NAME})")
        if not known:
            raise ValidationError("clusterName", cluster, "has no broker in the lake yet", "name one with -b")
        return sorted(known)
    assert broker is not None  # argparse requires one of the two
    named = [name for name, address in known.items() if broker in (name, address)]
    if not named:
        raise ValidationError(
            "brokerAddr", broker, "is neither a broker name nor a store address of the lake", f"one of {sorted(known)}"
        )
    return named


def _update_topic(args: argparse.Namespace) -> int:
    lake = Path(args.lake)
    read, write = args.readQueueNums, args.writeQueueNums
    if read is not None and write is not None and read != write:
        raise ValidationError(
            "writeQueueNums", write, f"differs from readQueueNums {read}", "the lake keeps one queue count: give one"
        )
    queue_nums = read if read is not None else write if write is not None else DEFAULT_QUEUE_NUMS
    attributes = parse_attributes(args.attributes) if args.attributes is not None else None
    brokers = _targets(lake, args.brokerAddr, args.clusterName)
    written = update_topic(lake, args.topic, brokers, queue_nums, args.perm, attributes)
    for broker, config in zip(brokers, written, strict=True):
        kind = config.message_type or "not set (every type)"
        print(
            f"create topic to {broker} success. topic={config.topic} queues={config.queue_nums} "
            f"perm={config.perm} message.type={kind}"
        )
    return 0


def _topic_list(args: argparse.Namespace) -> int:
    latest = latest_topic_configs(Path(args.lake))
    if not args.clusterModel:
        for topic in sorted({topic for _, topic in latest}):
            print(topic)
        return 0
    header = ("#Cluster Name", "#Broker Name", "#Topic", "#Queues", "#Perm", "#Message Type")
    rows = [
        (CLUSTER_NAME, broker, topic, str(config.queue_nums), str(config.perm), config.message_type or "-")
        for (broker, topic), config in sorted(latest.items())
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _update_group(args: argparse.Namespace) -> int:
    lake = Path(args.lake)
    policy: dict[str, Any] = {}
    if args.groupRetryPolicy is not None:
        try:
            parsed = json.loads(args.groupRetryPolicy)
        except json.JSONDecodeError as err:
            raise ValidationError("groupRetryPolicy", args.groupRetryPolicy, f"is not JSON: {err.msg}") from None
        policy = retry_policy_columns(parsed, "groupRetryPolicy")
        policy["retry_next_ms"] = tuple(policy["retry_next_ms"]) if policy["retry_next_ms"] is not None else None
    config = SubscriptionGroupConfig(
        args.groupName,
        retry_max_times=args.retryMaxTimes,
        retry_queue_nums=args.retryQueueNums,
        consume_enable=args.consumeEnable,
        consume_broadcast_enable=args.consumeBroadcastEnable,
        consume_from_min_enable=args.consumeFromMinEnable,
        consume_message_orderly=args.consumeMessageOrderly,
        **policy,
    )
    brokers = _targets(lake, args.brokerAddr, args.clusterName)
    update_group(lake, config, brokers)
    for broker in brokers:
        print(f"create subscription group to {broker} success. {_group_text(config)}")
    return 0


def _delete_group(args: argparse.Namespace) -> int:
    lake = Path(args.lake)
    brokers = _targets(lake, args.brokerAddr, args.clusterName)
    deleted = delete_group(lake, args.groupName, brokers)
    for broker in brokers:
        done = "success" if broker in deleted else "success (the group had no settings there)"
        print(
            f"delete subscription group [{args.groupName}] from broker [{broker}] in cluster [{CLUSTER_NAME}] {done}."
        )
    return 0


def _group_list(args: argparse.Namespace) -> int:
    header = ("#Broker Name", "#Group", "#Settings")
    rows = [
        (broker, group, _group_text(group_config(row)))
        for (broker, group), row in sorted(latest_group_rows(Path(args.lake)).items())
        if not row["deleted"]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _group_text(config: SubscriptionGroupConfig) -> str:
    policy = config.retry_policy or "default"
    if config.retry_policy == "CUSTOMIZED" and config.retry_next_ms is not None:
        policy += "(" + ",".join(str(ms) for ms in config.retry_next_ms) + ")"
    given = (config.retry_initial_ms, config.retry_max_ms, config.retry_multiplier)
    if config.retry_policy == "EXPONENTIAL" and all(value is None for value in given):
        policy += "(no settings: the default CUSTOMIZED delays)"
    elif config.retry_policy == "EXPONENTIAL":
        values = [str(v if v is not None else d) for v, d in zip(given, c.EXPONENTIAL_RETRY_MS, strict=True)]
        policy += "(" + ",".join(values) + ")"
    return (
        f"retryMaxTimes={config.retry_max_times} retryQueueNums={config.retry_queue_nums} "
        f"consumeEnable={_java(config.consume_enable)} consumeFromMinEnable={_java(config.consume_from_min_enable)} "
        f"consumeBroadcastEnable={_java(config.consume_broadcast_enable)} "
        f"consumeMessageOrderly={_java(config.consume_message_orderly)} groupRetryPolicy={policy}"
    )


def _java(flag: bool) -> str:
    return "true" if flag else "false"


__all__ = [
    "add_admin_commands",
    "delete_group",
    "lake_brokers",
    "latest_group_rows",
    "latest_topic_configs",
    "parse_attributes",
    "update_group",
    "update_topic",
]
