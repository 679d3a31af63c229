"""Real traffic through a real Apache RocketMQ 5 (name server, broker and proxy in local mode, from
Maven Central's jars: tests/apache_rocketmq.py), one instance for the module.

- The official Python client sends normal, FIFO, timer and transactional messages through the
  proxy's gRPC port and receives them with a SimpleConsumer (tests/apache_grpc_client.py).
- The 4.x remoting Java client sends normal, ordered, batch, delay-level and transactional
  messages, and push consumers receive them; one message fails until it reaches ``%DLQ%``
  (tests/apache/Driver.java).
- ``mqadmin`` topicStatus, consumerProgress and queryMsgById agree with what the clients were told.
- A SIGKILL in the middle of a flood of sends, then a restart on the same store, loses no
  acknowledged send; a clean stop deletes ``abort`` and writes the offsets as fastjson does.

What the tests show about the broker's own records (system topics, retry names, where a send's
queue offset points) is written down in docs/apache.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from broker_model.store.store_configs import parse_fastjson
from tests.apache_fixture import apache_rocketmq, running
from tests.apache_grpc_client import INVISIBLE_S
from tests.apache_rocketmq import ApacheRocketMQ, GroupSpec, TopicSpec

pytestmark = [pytest.mark.subprocess, pytest.mark.apache]
ROOT = Path(__file__).resolve().parent.parent
__all__ = ["apache_rocketmq"]  # the fixture, imported for pytest

Events = list[dict[str, Any]]


def _by(events: Events, event: str, **match: Any) -> Events:
    return [e for e in events if e["event"] == event and all(e.get(k) == v for k, v in match.items())]


# ---------------------------------------------------------------------------------------------
# the official Python client through the proxy


@pytest.fixture(scope="module")
def python_traffic(apache_rocketmq: ApacheRocketMQ) -> Events:
    """The Python client's run: its sends, receives and check-backs, as JSON lines."""
    rocketmq = running(apache_rocketmq)
    rocketmq.create(
        TopicSpec("PyNormal", 4, "NORMAL"),
        TopicSpec("PyFifo", 2, "FIFO"),
        TopicSpec("PyTimer", 2, "DELAY"),
        TopicSpec("PyTx", 2, "TRANSACTION"),
        GroupSpec("py-group"),
        GroupSpec("py-fifo", orderly=True),
    )
    steps = [
        ["send", "PyNormal", "normal", "4", "pn"],
        ["send", "PyFifo", "fifo", "3", "pf"],
        ["send", "PyTimer", "timer", "2", "pt", "2"],
        ["send", "PyTx", "transaction", "1", "px"],
        ["receive", "py-group", "PyNormal", "4", "pn-1"],  # pn-1 comes back after its invisible time
        ["receive", "py-fifo", "PyFifo", "6"],
        ["receive", "py-group", "PyTimer", "2"],
        ["receive", "py-group", "PyTx", "2"],
    ]
    command = [sys.executable, "-m", "tests.apache_grpc_client", rocketmq.proxy_endpoint]
    for step in steps:
        command += [*(["--"] if len(command) > 4 else []), *step]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=240, env=rocketmq.client_environment()
    )
    assert done.returncode == 0 and done.stdout.rstrip().endswith("done"), done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_python_client_sends_through_the_proxy_and_a_simple_consumer_receives(python_traffic: Events) -> None:
    sent = {e["key"]: e for e in _by(python_traffic, "sent")}
    acked = {e["key"]: e for e in _by(python_traffic, "received", acked=True)}
    assert len(sent) == 4 + 6 + 2 + 4
    for key, received in acked.items():
        assert received["message_id"] == sent[key]["message_id"], key  # the id the client was told

    # normal: all four; the one left unacknowledged came again, after its invisible duration
    assert {k for k, e in acked.items() if e["topic"] == "PyNormal"} == {f"pn-{i}" for i in range(4)}
    first, again = _by(python_traffic, "received", key="pn-1")
    assert (first["acked"], first["delivery_attempt"]) == (False, 1)
    assert (again["acked"], again["delivery_attempt"]) == (True, 2)
    assert again["received_ms"] - first["received_ms"] >= INVISIBLE_S * 1000

    # FIFO: each message group in its send order
    for group in ("pf-a", "pf-b"):
        order = [e["properties"]["seq"] for e in _by(python_traffic, "received", message_group=group)]
        assert order == ["0", "1", "2"], group

    # timer: delivered at its time (whole seconds: RocketMQ's proxy takes them from this client)
    for key in ("pt-0", "pt-1"):
        assert acked[key]["delivery_timestamp"] == sent[key]["due_ms"]
        assert acked[key]["received_ms"] >= sent[key]["due_ms"]

    # transactions: the committed ones only; the open ones were checked back and resolved
    tx = {k: e for k, e in acked.items() if e["topic"] == "PyTx"}
    assert {tx[k]["properties"]["outcome"] for k in tx} == {"commit", "check-commit"}
    assert {e["outcome"] for e in _by(python_traffic, "checked")} == {"check-commit", "check-rollback"}
    checked_commit = next(e for e in tx.values() if e["properties"]["outcome"] == "check-commit")
    assert checked_commit["properties"]["TRANSACTION_CHECK_TIMES"] == "1"  # committed on the first check-back


def test_the_store_holds_rocketmq5s_system_topics(apache_rocketmq: ApacheRocketMQ, python_traffic: Events) -> None:
    """Timer messages wait in ``rmq_sys_wheel_timer``; POP consumers keep their checkpoints in
    ``rmq_sys_REVIVE_LOG_<cluster>`` and retry through ``%RETRY%<group>_<topic>`` (RocketMQ 5's
    POP retry topic: no ``%RETRY%<group>`` for a gRPC group); transactions write half and op
    messages into their own topics."""
    queues = {path.name for path in (apache_rocketmq.store_dir / "consumequeue").iterdir()}
    assert {
        "rmq_sys_wheel_timer",
        "rmq_sys_REVIVE_LOG_DefaultCluster",
        "%RETRY%py-group_PyNormal",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    } <= queues
    assert "%RETRY%py-group" not in queues


def test_mqadmin_agrees_with_the_python_client(apache_rocketmq: ApacheRocketMQ, python_traffic: Events) -> None:
    rocketmq = running(apache_rocketmq)
    # a POP group has no %RETRY%<group> topic: consumerProgress needs -t
    progress = rocketmq.consumer_progress("py-group", "PyNormal")
    assert sum(row.broker_offset for row in progress) == 4
    assert all(row.consumer_offset == row.broker_offset and row.inflight == 0 for row in progress), progress
    # the rolled-back transactions never reached their topic
    assert sum(q.max_offset - q.min_offset for q in rocketmq.topic_status("PyTx")) == 2


# ---------------------------------------------------------------------------------------------
# the 4.x remoting Java client

POISON = "jn-poison-0"
MAX_RECONSUME = 2


@pytest.fixture(scope="module")
def java_traffic(apache_rocketmq: ApacheRocketMQ) -> Events:
    """The driver's run: push consumers first, then every kind of send; it ends once every
    consumer got what it waits for (see the driver's usage)."""
    rocketmq = running(apache_rocketmq)
    return rocketmq.driver(
        # 5 normal, 3 batch, 2 delay, 2 committed transactions; the poison message fails
        ["consume", "group=j-consumer", "topics=JNormal,JBatch,JDelay,JTx", f"fail={POISON}", "expect=12"],
        ["consume", "group=j-orderly", "topics=JOrder", "orderly=true", "expect=9"],
        ["consume", "group=j-broadcast", "topics=JNormal", "model=broadcasting", "instance=b1", "expect=6"],
        ["consume", "group=j-broadcast", "topics=JNormal", "model=broadcasting", "instance=b2", "expect=6"],
        ["send", "topic=JNormal", "kind=normal", "count=5", "prefix=jn"],
        ["send", "topic=JNormal", "kind=normal", "count=1", "prefix=jn-poison"],
        ["send", "topic=JOrder", "kind=ordered", "count=9", "prefix=jo", "orderKeys=A,B,C"],
        ["send", "topic=JBatch", "kind=batch", "count=3", "prefix=jb"],
        ["send", "topic=JDelay", "kind=delay", "count=2", "prefix=jd", "level=3"],
        ["send", "topic=JTx", "kind=tx", "prefix=jt", "outcomes=commit,rollback,check-commit,check-rollback"],
        ["wait", "seconds=120"],
    )


def test_the_java_client_sends_every_kind_and_push_consumers_receive_them(java_traffic: Events) -> None:
    sent = {e["key"]: e for e in _by(java_traffic, "sent")}
    assert len(sent) == 6 + 9 + 3 + 2 + 4 and {e["status"] for e in sent.values()} == {"SEND_OK"}
    consumed = {e["key"]: e for e in _by(java_traffic, "consumed", group="j-consumer", result="success")}

    # normal and batch: consumed at the queue and offset the producer was told
    for key in [f"jn-{i}" for i in range(5)] + [f"jb-{i}" for i in range(3)]:
        told, got = sent[key], consumed[key]
        assert (got["topic"], got["queueId"], got["queueOffset"], got["msgId"]) == (
            told["topic"],
            told["queueId"],
            told["queueOffset"],
            told["msgId"],
        ), key
    batch = [sent[f"jb-{i}"] for i in range(3)]
    assert len({b["queueId"] for b in batch}) == 1 and [b["queueOffset"] for b in batch] == [
        batch[0]["queueOffset"] + i for i in range(3)
    ]

    # ordered: one queue per order key, consumed in send order
    orderly = _by(java_traffic, "consumed", group="j-orderly")
    for order_key in "ABC":
        mine = [e for e in orderly if e["properties"]["orderKey"] == order_key]
        assert [int(e["properties"]["seq"]) for e in mine] == sorted(int(e["properties"]["seq"]) for e in mine)
        assert len(mine) == 3 and len({e["queueId"] for e in mine} | {sent[e["key"]]["queueId"] for e in mine}) == 1

    # delay level 3 (1 s here): in the queue the producer chose, stored again 1 s after its birth.
    # The producer was told the offset of its schedule queue, not of the topic's queue.
    for key in ("jd-0", "jd-1"):
        got = consumed[key]
        assert got["queueId"] == sent[key]["queueId"] and got["properties"]["DELAY"] == "3"
        assert got["storeTime"] - got["bornTime"] >= 1000

    # transactions: the committed ones only; each open one checked back and answered from its outcome
    delivered = {k for k in consumed if k.startswith("jt-")}
    outcomes = {sent[k]["outcome"] for k in delivered}
    assert outcomes == {"commit", "check-commit"}
    answers = {e["outcome"]: e["answer"] for e in _by(java_traffic, "checked")}
    assert answers == {"check-commit": "COMMIT_MESSAGE", "check-rollback": "ROLLBACK_MESSAGE"}

    # the poison message: delivered 1 + maxReconsumeTimes times, the retries through %RETRY%<group>
    poison = _by(java_traffic, "consumed", group="j-consumer", key=POISON)
    assert [e["reconsumeTimes"] for e in poison] == list(range(MAX_RECONSUME + 1))
    assert {e["result"] for e in poison} == {"later"}
    for retry in poison[1:]:
        assert retry["properties"]["REAL_TOPIC"] == "%RETRY%j-consumer"
        assert retry["properties"]["RETRY_TOPIC"] == "JNormal"
        assert retry["properties"]["ORIGIN_MESSAGE_ID"] == sent[POISON]["offsetMsgId"]

    # broadcasting: each instance of the group gets every message
    for instance in ("b1", "b2"):
        keys = {e["key"] for e in _by(java_traffic, "consumed", group="j-broadcast", instance=instance)}
        assert keys == {f"jn-{i}" for i in range(5)} | {POISON}


def test_mqadmin_agrees_with_the_java_client(apache_rocketmq: ApacheRocketMQ, java_traffic: Events) -> None:
    rocketmq = running(apache_rocketmq)
    sent = _by(java_traffic, "sent", topic="JNormal")
    ends: dict[int, int] = defaultdict(int)  # the next offset of each queue, from what the producer was told
    for told in sent:
        ends[told["queueId"]] = max(ends[told["queueId"]], told["queueOffset"] + 1)

    progress = rocketmq.consumer_progress("j-consumer")
    normal = {row.queue_id: row for row in progress if row.topic == "JNormal"}
    assert {q: row.broker_offset for q, row in normal.items() if row.broker_offset} == dict(ends)
    assert all(row.consumer_offset == row.broker_offset and row.diff == 0 for row in normal.values())
    assert "%RETRY%j-consumer" in {row.topic for row in progress}
    assert sum(row.broker_offset for row in progress if row.topic == "JTx") == 2  # committed ones only

    # the poison message is in the group's dead letter queue
    assert sum(q.max_offset for q in rocketmq.topic_status("%DLQ%j-consumer")) == 1

    told = next(e for e in sent if e["key"] == "jn-0")
    consumed = _by(java_traffic, "consumed", group="j-consumer", key="jn-0")[0]
    found = rocketmq.query_msg_by_id("JNormal", told["msgId"])
    assert (found["Topic"], found["Keys"], int(found["Queue ID"]), int(found["Queue Offset"])) == (
        "JNormal",
        "jn-0",
        told["queueId"],
        told["queueOffset"],
    )
    assert found["OffsetID"] == told["offsetMsgId"]
    assert int(found["CommitLog Offset"]) == consumed["commitLogOffset"]
    assert found["Store Host"] == rocketmq.broker_address


# ---------------------------------------------------------------------------------------------
# crashes and clean stops


def test_a_sigkill_in_the_middle_of_a_flood_loses_no_acknowledged_send(
    apache_rocketmq: ApacheRocketMQ, tmp_path: Path
) -> None:
    rocketmq = running(apache_rocketmq)
    # 1 KiB bodies: the crash comes after the commit log rolled over into its second 1 MiB file
    with rocketmq.start_driver(["flood", "topic=JFlood", "prefix=fl", "size=1024"]) as flood:
        flood.wait_for(lambda d: len(d.events("sent")) >= 1200, "1200 acknowledged sends")
        rocketmq.kill()
        assert rocketmq.abort_file.exists() and not rocketmq.store_locked()  # a crash: abort stays
        before = len(flood.events("sent"))
        flood.wait_for(lambda d: len(d.events("error")) > 0, "a send refused while the broker is down")
        rocketmq.start()
        flood.wait_for(lambda d: len(d.events("sent")) >= before + 100, "100 sends after the restart")
        lines = flood.finish()
    acked = _by(lines, "sent")
    assert len(list((rocketmq.store_dir / "commitlog").iterdir())) >= 2

    keys = tmp_path / "acked-keys"
    keys.write_text("".join(f"{e['key']}\n" for e in acked))
    check = rocketmq.driver(
        ["consume", "group=j-flood-check", "topics=JFlood", f"keysFile={keys}"], ["wait", "seconds=120"]
    )
    found = {e["key"]: e for e in _by(check, "consumed")}
    for told in acked:
        got = found[told["key"]]
        assert (got["queueId"], got["queueOffset"], got["msgId"]) == (
            told["queueId"],
            told["queueOffset"],
            told["msgId"],
        )


def test_a_clean_stop_deletes_abort_and_writes_fastjson_offsets(
    apache_rocketmq: ApacheRocketMQ, java_traffic: Events
) -> None:
    """Last in the module: it leaves RocketMQ stopped (a later test would start it again)."""
    rocketmq = running(apache_rocketmq)
    offsets = {(row.topic, row.queue_id): row.consumer_offset for row in rocketmq.consumer_progress("j-consumer")}
    rocketmq.stop()
    assert not rocketmq.abort_file.exists() and not rocketmq.store_locked()

    text = (rocketmq.store_dir / "config" / "consumerOffset.json").read_text()
    assert re.search(r"\{\s*\d+\s*:\s*\d+", text), "fastjson writes the queue ids as bare integer keys"
    table = parse_fastjson(text, "consumerOffset.json")["offsetTable"]
    for (topic, queue_id), offset in offsets.items():
        if offset:  # a queue never consumed has no entry
            assert table[f"{topic}@j-consumer"][str(queue_id)] == offset, (topic, queue_id)
