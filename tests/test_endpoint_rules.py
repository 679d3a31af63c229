"""The endpoint's rules that must give RocketMQ's (and Guava's) exact numbers: the FIFO queue of a
message group (``Hashing.consistentHash`` of the group's ``String.hashCode``) and the delivery time
of a protocol ``Timestamp``, checked against published values."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb

from broker_model.broker import Broker
from broker_model.endpoint import EndpointConfig
from broker_model.endpoint.acl import Acl
from broker_model.endpoint.errors import RequestError
from broker_model.endpoint.service import TransactionDataTable, consistent_hash, java_hash, timestamp_millis
from schemas.errors import ValidationError


def test_consistent_hash_gives_guavas_published_values() -> None:
    # Guava's own compatibility values (HashingTest, linear congruential generator)
    golden100 = [0, 55, 62, 8, 45, 59, 86, 97, 82, 59, 73, 37, 17, 56, 86, 21, 90, 37, 38, 83]
    assert [consistent_hash(i, 100) for i in range(20)] == golden100
    assert [consistent_hash(k, 11) for k in (10863919174838991, 2016238256797177309, 1673758223894951030)] == [6, 3, 5]
    assert [consistent_hash(k, 100001) for k in (2, 2201, 2202)] == [80343, 22152, 15018]


def test_a_negative_group_hash_is_taken_as_javas_sign_extended_long() -> None:
    assert java_hash("hello") == 99162322
    assert java_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert 0 <= consistent_hash(java_hash("polygenelubricants"), 8) < 8
    assert consistent_hash(-1, 1) == 0


def test_a_delivery_time_in_seconds_or_in_the_python_clients_milliseconds() -> None:
    assert timestamp_millis(timestamp_pb2.Timestamp(seconds=1_800_000_000, nanos=250_000_000), "t") == 1_800_000_000_250
    assert timestamp_millis(timestamp_pb2.Timestamp(seconds=1_800_000_000_123), "t") == 1_800_000_000_123
    with pytest.raises(RequestError) as refused:
        timestamp_millis(timestamp_pb2.Timestamp(seconds=-5), "system_properties.delivery_timestamp")
    assert refused.value.code == pb.ILLEGAL_DELIVERY_TIME and "delivery_timestamp" in refused.value.message
    with pytest.raises(RequestError) as invalid:  # the proxy's Timestamps.toMillis refuses it: an internal error
        timestamp_millis(timestamp_pb2.Timestamp(seconds=1_800_000_000, nanos=-1), "delivery_timestamp")
    assert invalid.value.code == pb.INTERNAL_SERVER_ERROR and "not valid" in invalid.value.message


def test_bad_serve_settings_and_acl_files_are_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="--tls-cert"):
        EndpointConfig(tmp_path, tls_cert=tmp_path / "cert.pem")
    with pytest.raises(ValidationError, match="--transaction-check-max"):
        EndpointConfig(tmp_path, check_max=0)
    with pytest.raises(ValidationError, match="--brokers"):
        EndpointConfig(tmp_path, brokers=("broker-a", "broker-a"))
    acl = tmp_path / "acl.json"
    for text, field in (
        ("{not json", "readable JSON"),
        ('{"accounts": []}', "no accounts"),
        ('{"accounts": [{"accessKey": "a"}]}', r"accounts\[0\]\.secretKey"),
        ('{"accounts": [{"accessKey": "a", "secretKey": "s", "topics": "Orders"}]}', r"accounts\[0\]\.topics"),
    ):
        acl.write_text(text)
        with pytest.raises(ValidationError, match=field):
            Acl.load(acl)
    acl.write_text('{"accounts": [{"accessKey": "a", "secretKey": "s", "topics": ["*"]}]}')
    assert Acl.load(acl).accounts["a"].may_use_topic("Anything")


def test_transaction_data_is_taken_once_newest_first_and_forgotten_once_expired(broker: Broker) -> None:
    table = TransactionDataTable()
    table.add("T", "id-1", broker, 100)
    table.add("T", "id-1", broker, 200)  # the same id sent again (a client's retry)
    table.add("T", "id-2", broker, 300)
    assert table.poll("other-group", "id-1") is None
    assert [table.poll("T", "id-1").commit_log_offset for _ in range(2)] == [200, 100]  # type: ignore[union-attr]
    assert table.poll("T", "id-1") is None  # ended: a second end finds nothing
    expired = TransactionDataTable(expire_ms=0)
    expired.add("T", "id-3", broker, 400)
    expired.add("T", "id-4", broker, 500)  # drops id-3, expired, from the front
    assert expired.poll("T", "id-3") is None and expired.poll("T", "id-4") is None
    assert table.poll("T", "id-2").commit_log_offset == 300  # type: ignore[union-attr]
