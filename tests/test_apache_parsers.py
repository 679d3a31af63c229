"""The parsers of the Apache RocketMQ admin tool's tables (tests/apache_rocketmq.py), on output in
the layout ``mqadmin`` 5.5.0 prints; no RocketMQ runs here."""

from __future__ import annotations

import pytest

from tests.apache_rocketmq import (
    HarnessError,
    QueueProgress,
    QueueStatus,
    parse_consumer_progress,
    parse_query_msg,
    parse_query_msg_by_key,
    parse_topic_status,
)

TOPIC_STATUS = """\
#Broker Name                      #QID  #Min Offset           #Max Offset             #Last Updated
broker-a                          0     0                     9                       2026-11-27 13:10:45,609
broker-a                          1     2                     2                       \n
Topic Put TPS: 0.0
"""

CONSUMER_PROGRESS = """\
#Topic            #Broker Name    #QID  #Broker Offset  #Consumer Offset  #Diff  #Inflight  #LastTime
%RETRY%cg         broker-a        0     9               9                 0      0          2026-11-27 13:10:49
Orders            broker-a        0     6               4                 2      1          2026-11-27 13:10:45
Orders            broker-a        1     0               0                 0      0          N/A

Consume TPS: 0.68
Consume Diff Total: 2
Consume Inflight Total: 1
"""

QUERY_MSG = """\
OffsetID:            7F000001000051AF000000000001E3E9
Topic:               Orders
Tags:                [fail]
Keys:                [k-1]
Queue ID:            1
Queue Offset:        7
CommitLog Offset:    123881
Reconsume Times:     0
Born Timestamp:      2026-11-27 13:10:45,615
Store Timestamp:     2026-11-27 13:10:45,618
Born Host:           127.0.0.1:35036
Store Host:          127.0.0.1:20911
System Flag:         0
Properties:          {UNIQ_KEY=C0000202, TAGS=fail, KEYS=k-1}
Message Body Path:   /tmp/rocketmq/msgbodys/C0000202


MessageTrack [consumerGroup=cg, trackType=NOT_ONLINE, exceptionDesc=CODE:206 DESC:the consumer group[cg] not online]
"""

QUERY_BY_KEY = """\
#Message ID                       #QID  #Offset #IndexKey
C00002023C3F4E0E2F2A890175DE0005     2        3 1795788000000@Orders@K@k-5@C00002023C3F4E0E2F2A890175DE0005@11648
"""


def test_topic_status_rows_with_and_without_an_update_time() -> None:
    assert parse_topic_status(TOPIC_STATUS) == [
        QueueStatus("broker-a", 0, 0, 9, "2026-11-27 13:10:45,609"),
        QueueStatus("broker-a", 1, 2, 2, ""),
    ]


def test_consumer_progress_rows_of_the_retry_topic_and_of_a_never_consumed_queue() -> None:
    rows = parse_consumer_progress(CONSUMER_PROGRESS)
    assert rows[0] == QueueProgress("%RETRY%cg", "broker-a", 0, 9, 9, 0, 0, "2026-11-27 13:10:49")
    assert rows[1] == QueueProgress("Orders", "broker-a", 0, 6, 4, 2, 1, "2026-11-27 13:10:45")
    assert rows[2].last_time == "N/A" and len(rows) == 3


def test_query_msg_fields_stop_at_the_message_track() -> None:
    found = parse_query_msg(QUERY_MSG)
    assert (found["Topic"], found["Tags"], found["Keys"], found["Queue Offset"]) == ("Orders", "fail", "k-1", "7")
    assert found["Store Host"] == "127.0.0.1:20911"
    assert not any(name.startswith("MessageTrack") for name in found)


def test_query_msg_by_key_rows() -> None:
    assert parse_query_msg_by_key(QUERY_BY_KEY) == [("C00002023C3F4E0E2F2A890175DE0005", 2, 3)]


def test_an_output_without_the_table_is_an_error_that_shows_it() -> None:
    with pytest.raises(HarnessError, match="no table starting with '#Topic'"):
        parse_consumer_progress("org.apache.rocketmq.tools.command.SubCommandException: failed")
    with pytest.raises(HarnessError, match="no message"):
        parse_query_msg("\nMessage not found!\n")
