"""``python -m broker_model admin``: topics created and changed as with mqadmin, in ``topic_config``,
applied by running brokers; bad input named, with nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from broker_model.__main__ import main
from broker_model.broker import Broker, BrokerConfig, SubscriptionGroupConfig, TopicConfig
from broker_model.cli_exit import run_main
from broker_model.client import Producer
from broker_model.common import Message
from broker_model.tools.admin import parse_attributes
from schemas.catalog import SUBSCRIPTION_GROUP, TOPIC_CONFIG
from schemas.errors import ValidationError


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A lake with two brokers that ran once (broker-b at a store address of its own)."""
    root = tmp_path / "lake"
    Broker(BrokerConfig(root, "broker-a")).start().shutdown()
    Broker(BrokerConfig(root, "broker-b", store_host="127.0.0.2:10911")).start().shutdown()
    return root


def _admin(lake: Path, *argv: str) -> int:
    command, *rest = argv
    return run_main(lambda: main(["admin", command, "--lake", str(lake), *rest]))


def _latest(lake: Path) -> dict[tuple[str, str], tuple[int, int, str | None]]:
    rows = DeltaTable(str(TOPIC_CONFIG.location(lake))).to_pyarrow_table().to_pylist()
    latest: dict[tuple[str, str], tuple[int, int, str | None]] = {}
    for row in sorted(rows, key=lambda r: r["updated_timestamp"]):
        latest[(row["broker_name"], row["topic"])] = (row["queue_nums"], row["perm"], row["message_type"])
    return latest


def _versions(lake: Path) -> int:
    return DeltaTable(str(TOPIC_CONFIG.location(lake))).version()


def test_update_topic_creates_on_the_cluster_then_changes_one_broker_keeping_its_type(
    lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        _admin(
            lake,
            "updateTopic",
            "-c",
            "DefaultCluster",
            "-t",
            "Orders",
            "-r",
            "2",
            "-w",
            "2",
            "-a",
            "+message.type=FIFO",
        )
        == 0
    )
    assert "create topic to broker-a success" in capsys.readouterr().out
    assert _latest(lake) == {("broker-a", "Orders"): (2, 6, "FIFO"), ("broker-b", "Orders"): (2, 6, "FIFO")}

    # by store address; no -a: the attributes stay; -w alone gives the one queue count
    assert _admin(lake, "updateTopic", "-b", "127.0.0.2:10911", "-t", "Orders", "-w", "3", "-p", "4") == 0
    assert _latest(lake)[("broker-b", "Orders")] == (3, 4, "FIFO")
    assert _latest(lake)[("broker-a", "Orders")] == (2, 6, "FIFO")

    assert _admin(lake, "updateTopic", "-b", "broker-a", "-t", "Orders", "-r", "2", "--attributes=-message.type") == 0
    assert _latest(lake)[("broker-a", "Orders")] == (2, 6, None)

    capsys.readouterr()
    assert _admin(lake, "topicList") == 0
    assert capsys.readouterr().out.splitlines() == ["Orders"]
    assert _admin(lake, "topicList", "-c") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["#Cluster", "Name", "#Broker", "Name", "#Topic", "#Queues", "#Perm", "#Message", "Type"]
    assert [line.split() for line in lines[1:]] == [
        ["DefaultCluster", "broker-a", "Orders", "2", "6", "-"],
        ["DefaultCluster", "broker-b", "Orders", "3", "4", "FIFO"],
    ]


BAD = [
    (("-r", "2", "-w", "3"), "writeQueueNums"),
    (("-a", "+message.type=ORDERED"), "message_type"),
    (("-a", "+retention=3d"), "attributes"),
    (("-a", "message.type=FIFO"), "attributes"),
    (("--attributes=-message.type",), "attributes"),  # the topic has no type to remove
    (("-p", "5"), "perm"),
    (("-r", "0"), "queue_nums"),
]


@pytest.mark.parametrize(("extra", "field"), BAD, ids=[" ".join(extra) for extra, _ in BAD])
def test_bad_settings_exit_2_naming_the_field_and_write_nothing(
    lake: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], field: str
) -> None:
    before = _versions(lake)
    assert _admin(lake, "updateTopic", "-c", "DefaultCluster", "-t", "Orders", *extra) == 2
    assert f"error: {field}" in capsys.readouterr().err
    assert _versions(lake) == before


@pytest.mark.parametrize(
    ("where", "field"),
    [(("-b", "broker-z"), "brokerAddr"), (("-c", "OtherCluster"), "clusterName"), ((), "one of the arguments")],
)
def test_an_unknown_broker_or_cluster_or_none_exits_2(
    lake: Path, capsys: pytest.CaptureFixture[str], where: tuple[str, ...], field: str
) -> None:
    before = _versions(lake)
    assert _admin(lake, "updateTopic", "-t", "Orders", *where) == 2
    assert field in capsys.readouterr().err
    assert _versions(lake) == before


def test_attributes_parse_as_mqadmin_writes_them() -> None:
    assert parse_attributes("+message.type=FIFO") == {"message.type": "FIFO"}
    assert parse_attributes("-message.type") == {"message.type": None}
    for text in ("+message.type", "+message.type=", "-message.type=FIFO", "+a=1,+a=2", ""):
        with pytest.raises(ValidationError, match="attributes"):
            parse_attributes(text)


def test_a_running_broker_applies_a_change_and_a_restarted_one_keeps_it(lake: Path) -> None:
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    try:
        broker.ensure_topic("Audit", 2)
        assert broker.topic_config("Audit") == TopicConfig("Audit", 2)
        assert _admin(lake, "updateTopic", "-b", "broker-a", "-t", "Audit", "-r", "5", "-a", "+message.type=DELAY") == 0
        broker.refresh_topics(interval_s=0)
        assert broker.topic_config("Audit") == TopicConfig("Audit", 5, 6, "DELAY")
        assert broker.queue_nums("Audit") == 5
        broker.create_topic("Audit", 6)  # a resize of the broker's own keeps the type
        assert broker.topic_config("Audit") == TopicConfig("Audit", 6, 6, "DELAY")
    finally:
        broker.shutdown()
    again = Broker(BrokerConfig(lake, "broker-a")).start()
    try:
        assert again.topic_config("Audit") == TopicConfig("Audit", 6, 6, "DELAY")
    finally:
        again.shutdown()


def test_a_topic_config_table_of_an_older_release_gets_the_message_type_column(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    lake = tmp_path / "lake"
    old = pa.schema([field for field in TOPIC_CONFIG.arrow_schema if field.name != "message_type"])
    row: dict[str, Any] = {
        "broker_name": "broker-a",
        "topic": "Orders",
        "queue_nums": 2,
        "perm": 6,
        "updated_timestamp": 1,
    }
    write_deltalake(str(TOPIC_CONFIG.location(lake)), pa.Table.from_pylist([row], schema=old))
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    try:
        assert broker.topic_config("Orders") == TopicConfig("Orders", 2)
    finally:
        broker.shutdown()
    assert _admin(lake, "updateTopic", "-b", "broker-a", "-t", "Orders", "-r", "2", "-a", "+message.type=NORMAL") == 0
    assert _latest(lake)[("broker-a", "Orders")] == (2, 6, "NORMAL")


# -- consumer groups ---------------------------------------------------------------------------

EXPONENTIAL = '{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":2000,"max":60000,"multiplier":3}}'


def _groups(lake: Path) -> dict[tuple[str, str], dict[str, Any]]:
    rows = DeltaTable(str(SUBSCRIPTION_GROUP.location(lake))).to_pyarrow_table().to_pylist()
    return {(r["broker_name"], r["group"]): r for r in sorted(rows, key=lambda r: r["updated_timestamp"])}


def test_update_sub_group_sets_the_policy_a_running_broker_applies_and_delete_restores_the_defaults(
    lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    try:
        broker.ensure_topic("Orders", 1)
        sent = Producer([broker], "p").send(Message.create("Orders", b"order"))
        assert broker.consumer_send_back("cg", sent.commit_log_offset).topic == "SCHEDULE_TOPIC_XXXX"  # a retry

        group = ("-c", "DefaultCluster", "-g", "cg", "-r", "0", "-o", "true", "-p", EXPONENTIAL)
        assert _admin(lake, "updateSubGroup", *group) == 0
        latest = _groups(lake)[("broker-b", "cg")]
        assert (latest["retry_max_times"], latest["consume_message_orderly"], latest["consume_broadcast_enable"]) == (
            0,
            True,
            False,  # mqadmin's default for a group it writes
        )
        assert (latest["retry_policy"], latest["retry_initial_ms"], latest["retry_max_ms"]) == (
            "EXPONENTIAL",
            2000,
            60000,
        )
        broker.refresh_subscription_groups(interval_s=0)
        config = broker.subscription_group("cg")
        assert [config.next_delay_ms(n) for n in (0, 1, 2, 5)] == [2000, 6000, 18000, 60000]
        assert broker.consumer_send_back("cg", sent.commit_log_offset).topic == "%DLQ%cg"  # 0 retries now

        capsys.readouterr()
        assert _admin(lake, "groupList") == 0
        listed = capsys.readouterr().out.splitlines()
        assert [line.split()[:2] for line in listed[1:]] == [["broker-a", "cg"], ["broker-b", "cg"]]
        assert "groupRetryPolicy=EXPONENTIAL(2000,60000,3)" in listed[1]

        assert _admin(lake, "deleteSubGroup", "-b", "broker-a", "-g", "cg") == 0
        assert _groups(lake)[("broker-a", "cg")]["deleted"] is True
        broker.refresh_subscription_groups(interval_s=0)
        assert broker.subscription_group("cg") == SubscriptionGroupConfig("cg")
        assert _admin(lake, "deleteSubGroup", "-b", "broker-a", "-g", "cg") == 0  # gone already: nothing written
        assert "had no settings there" in capsys.readouterr().out
    finally:
        broker.shutdown()
    assert _admin(lake, "groupList") == 0
    assert [line.split()[:2] for line in capsys.readouterr().out.splitlines()[1:]] == [["broker-b", "cg"]]


GROUP_BAD = [
    (("-s", "yes"), "consumeEnable='yes': is not true or false"),
    (("-r", "-1"), "retry_max_times"),
    (("-q", "2000"), "retry_queue_nums"),
    (("-p", "{not json"), "groupRetryPolicy"),
    (("-p", '{"type":"LINEAR"}'), "groupRetryPolicy.type"),
    (("-p", '{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,"5s"]}}'), "next"),
    (("-p", '{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[0]}}'), "retry_next_ms"),
    (("-p", '{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[]}}'), "holds no delay"),
]


@pytest.mark.parametrize(("extra", "named"), GROUP_BAD, ids=[" ".join(extra) for extra, _ in GROUP_BAD])
def test_bad_group_settings_exit_2_naming_the_field_and_write_nothing(
    lake: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], named: str
) -> None:
    assert _admin(lake, "updateSubGroup", "-c", "DefaultCluster", "-g", "cg", *extra) == 2
    assert named in capsys.readouterr().err
    assert not SUBSCRIPTION_GROUP.location(lake).exists() or _groups(lake) == {}


def test_customized_delays_follow_rocketmqs_index() -> None:
    default = SubscriptionGroupConfig("cg")
    assert [default.next_delay_ms(n) for n in (0, 1, 15, 16, 40)] == [10_000, 30_000, 7_200_000, 7_200_000, 7_200_000]
    custom = SubscriptionGroupConfig("cg", retry_policy="CUSTOMIZED", retry_next_ms=(1, 2, 3, 4))
    assert [custom.next_delay_ms(n) for n in (-1, 0, 1, 2)] == [3, 3, 4, 4]
    exponential = SubscriptionGroupConfig("cg", retry_policy="EXPONENTIAL", retry_multiplier=2)
    assert [exponential.next_delay_ms(n) for n in (0, 3, 40)] == [5000, 40000, 7_200_000]
    unset = SubscriptionGroupConfig("cg", retry_policy="EXPONENTIAL")  # RocketMQ: the default policy
    assert [unset.next_delay_ms(n) for n in (0, 1, 40)] == [default.next_delay_ms(n) for n in (0, 1, 40)]


def test_a_running_broker_keeps_what_an_operator_set_a_moment_ago_and_the_queues_its_log_holds(lake: Path) -> None:
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    try:
        assert _admin(lake, "updateTopic", "-b", "broker-a", "-t", "Fresh", "-r", "3", "-a", "+message.type=FIFO") == 0
        versions = _versions(lake)
        Producer([broker], "p").send(Message.create("Fresh", b"x"))  # within the second: not auto-created
        assert broker.topic_config("Fresh") == TopicConfig("Fresh", 3, 6, "FIFO")
        assert _versions(lake) == versions

        broker.ensure_topic("Wide", 4)
        producer = Producer([broker], "p")
        while broker.max_offset("Wide", 3) == 0:
            producer.send(Message.create("Wide", b"x"))
        assert _admin(lake, "updateTopic", "-b", "broker-a", "-t", "Wide", "-r", "2", "-p", "4") == 0
        broker.refresh_topics(interval_s=0)
        assert broker.topic_config("Wide") == TopicConfig("Wide", 4, 4, None)  # queue 3 holds messages
    finally:
        broker.shutdown()
    again = Broker(BrokerConfig(lake, "broker-a")).start()
    try:
        assert again.topic_config("Wide") == TopicConfig("Wide", 4, 4, None)  # as at a start
    finally:
        again.shutdown()


def test_a_broker_setting_a_group_after_an_operator_deleted_it_is_the_latest(lake: Path) -> None:
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    try:
        broker.update_subscription_group(SubscriptionGroupConfig("cg", retry_max_times=2))
        assert _admin(lake, "deleteSubGroup", "-b", "broker-a", "-g", "cg") == 0
        broker.refresh_subscription_groups(interval_s=0)
        assert broker.subscription_group("cg").retry_max_times == 16
        broker.update_subscription_group(SubscriptionGroupConfig("cg", retry_max_times=5))
        broker.refresh_subscription_groups(interval_s=0)
        assert broker.subscription_group("cg").retry_max_times == 5
    finally:
        broker.shutdown()
    assert _groups(lake)[("broker-a", "cg")]["retry_max_times"] == 5
