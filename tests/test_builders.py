"""The shared commit log row builder (tests/builders.py) builds the rows RocketMQ's layout gives."""

from __future__ import annotations

import pytest

from broker_model.common import body_crc
from broker_model.common import constants as c
from broker_model.store import decode_record, encode_record
from schemas.catalog import COMMITLOG
from tests.builders import commitlog_record, commitlog_table, laid_out


@pytest.mark.parametrize(
    ("topic", "born_host", "store_host"),
    [
        ("TopicA", "10.0.0.9:5000", "10.0.0.1:10911"),
        ("T" * 200, "[fe80::1]:5000", "[::2]:10911"),  # magic v2, IPv6 hosts
    ],
)
def test_a_built_record_is_what_decoding_its_exact_bytes_gives(topic: str, born_host: str, store_host: str) -> None:
    properties = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "0A01", "WAIT": "true"}
    row = commitlog_record(
        topic=topic, body=b"hello!q!", properties=properties, born_host=born_host, store_host=store_host
    )
    data = encode_record(row)
    assert list(row) == COMMITLOG.column_names
    assert len(data) == row["store_size"]
    assert decode_record(data) == {k: v for k, v in row.items() if k not in ("broker_name", "segment")}
    assert (row["tags"], row["keys"], row["uniq_key"]) == ("TagA", "k1 k2", "0A01")


def test_a_derived_column_given_is_kept_and_the_others_follow_the_columns_given() -> None:
    row = commitlog_record(body=b"x", body_crc=7, raw_properties=b"")
    assert row["body_crc"] == 7 != body_crc(b"x")
    assert row["store_size"] == 91 + 1 + len("TopicA")  # no property bytes
    with pytest.raises(TypeError, match="segmnet"):
        commitlog_record(segmnet=1)


def test_records_are_laid_out_contiguously_and_roll_when_the_blank_does_not_fit() -> None:
    records = laid_out([commitlog_record(queue_offset=i, body=b"x" * 1000) for i in range(5)], segment_size=4096)
    size = records[0]["store_size"]
    assert 3 * size + c.END_FILE_MIN_BLANK_LENGTH <= 4096 < 4 * size + c.END_FILE_MIN_BLANK_LENGTH
    assert [r["commit_log_offset"] for r in records] == [0, size, 2 * size, 4096, 4096 + size]
    assert [r["segment"] for r in records] == [0, 0, 0, 4096, 4096]
    assert len({r["msg_id"] for r in records}) == 5
    assert commitlog_table(records).schema == COMMITLOG.arrow_schema
