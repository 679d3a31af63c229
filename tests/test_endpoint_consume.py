"""The official RocketMQ 5 clients consuming through ``python -m broker_model serve`` with POP
(docs/pop.md): a Python ``SimpleConsumer`` that acks some messages, lets some expire and changes the
invisible time of others, checked for attempts and redelivery times; a Python ``PushConsumer``
whose failures end as dead letters; the Node.js ``SimpleConsumer`` consuming what the Python
producer sent; and the consumer calls' refusals, with their protocol codes."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from broker_model.__main__ import main as broker_main
from broker_model.broker import Broker, BrokerConfig
from jobs.consumer_offsets import ConsumerOffsetsConfig
from jobs.consumer_offsets import run as offsets
from jobs.dlq.job import RouteDlqConfig
from jobs.dlq.job import run as route_dlq
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as rebuild
from schemas.catalog import DLQ
from tests.helpers import ENGINE, wait_until
from tests.test_endpoint import NODE_CLIENT, ROOT, Server, _client, _records, start_serve

pytestmark = pytest.mark.subprocess
INVISIBLE_MS, CHANGED_MS = 2_000, 3_000
REVIVE_LATENCY_MS = (1_000, 3_500)  # after its invisible time ends, a message is received again within this


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = start_serve(tmp_path / "lake", "--auto-create-topics", "--min-invisible-ms", "1000")
    yield running
    if running.process.poll() is None:
        running.stop()


def _consume(server: Server, topic: str, group: str, mode: str, count: int) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "tests.grpc_consumer_process", server.address, topic, group, mode, str(count)]
    home = server.lake.parent / "client-home"
    home.mkdir(exist_ok=True)
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(home)}
    )
    assert done.returncode == 0 and done.stdout.rstrip().endswith("done"), done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_simple_consumer_acks_lets_expire_and_changes_invisible_times(server: Server) -> None:
    sent = _client(server, "Orders", "normal", 12)
    deliveries = _consume(server, "Orders", "cg-simple", "simple", len(sent))
    by_id: dict[str, list[dict[str, Any]]] = {}
    for delivery in deliveries:
        by_id.setdefault(delivery["message_id"], []).append(delivery)
    assert set(by_id) == {s["message_id"] for s in sent}
    for message_id, seen in by_id.items():
        kind = int(seen[0]["body"].split()[1]) % 3
        assert [d["attempt"] for d in seen] == ([1] if kind == 0 else [1, 2]), (message_id, seen)
        if kind == 0:
            continue
        waited = seen[1]["at"] - seen[0]["at"]
        invisible = INVISIBLE_MS if kind == 1 else CHANGED_MS
        assert invisible + REVIVE_LATENCY_MS[0] - 200 <= waited <= invisible + REVIVE_LATENCY_MS[1], (kind, waited)
    assert server.stop() == 0


def _stub(server: Server) -> service_pb2_grpc.MessagingServiceStub:
    return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(server.address))


META = (("x-mq-client-id", "stub-consumer"),)


def _receive(stub: service_pb2_grpc.MessagingServiceStub, **fields: Any) -> list[rpc.ReceiveMessageResponse]:
    request = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=fields.pop("group", "cg-stub")),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="Orders"), id=-1, broker=pb.Broker(name="broker-a")),
        filter_expression=pb.FilterExpression(
            type=fields.pop("filter_type", pb.TAG), expression=fields.pop("tags", "*")
        ),
        batch_size=fields.pop("batch_size", 32),
        **fields,
    )
    request.long_polling_timeout.FromMilliseconds(5_000)
    if not request.auto_renew and not request.HasField("invisible_duration"):
        request.invisible_duration.FromMilliseconds(INVISIBLE_MS)
    return list(stub.ReceiveMessage(request, metadata=META, timeout=10))


def test_consumer_calls_answer_the_proxys_codes(server: Server) -> None:
    _client(server, "Orders", "normal", 2)
    stub = _stub(server)
    refused = {
        "sql": _receive(stub, filter_type=pb.SQL, tags="a >")[0].status.code,
        "group": _receive(stub, group="CID_RMQ_SYS_X")[0].status.code,
        "batch": _receive(stub, batch_size=0)[0].status.code,
    }
    assert refused == {"sql": pb.ILLEGAL_FILTER_EXPRESSION, "group": pb.ILLEGAL_CONSUMER_GROUP, "batch": pb.BAD_REQUEST}
    too_short = rpc.ReceiveMessageRequest(
        group=pb.Resource(name="cg-stub"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="Orders"), broker=pb.Broker(name="broker-a")),
        batch_size=1,
    )
    too_short.invisible_duration.FromMilliseconds(500)
    too_short.long_polling_timeout.FromMilliseconds(5_000)
    (answer, _) = stub.ReceiveMessage(too_short, metadata=META, timeout=10)
    assert answer.status.code == pb.ILLEGAL_INVISIBLE_TIME
    by_sql = _receive(stub, group="cg-sql", filter_type=pb.SQL, tags="TAGS = 'created' AND KEYS IS NOT NULL")
    assert [r.message.system_properties.tag for r in by_sql if r.HasField("message")] == ["created", "created"]
    got = _receive(stub)
    assert got[0].status.code == pb.OK and got[-1].HasField("delivery_timestamp")
    messages = [r.message for r in got if r.HasField("message")]
    assert len(messages) == 2 and all(m.system_properties.receipt_handle for m in messages)
    entries = [rpc.AckMessageEntry(message_id="m", receipt_handle=m.system_properties.receipt_handle) for m in messages]
    entries.append(rpc.AckMessageEntry(message_id="bad", receipt_handle="not a handle"))
    ack = rpc.AckMessageRequest(group=pb.Resource(name="cg-stub"), topic=pb.Resource(name="Orders"), entries=entries)
    answered = stub.AckMessage(ack, metadata=META)
    assert [e.status.code for e in answered.entries] == [pb.OK, pb.OK, pb.INVALID_RECEIPT_HANDLE]
    assert answered.status.code == pb.MULTIPLE_RESULTS  # the entries' codes differ, as AckMessageActivity
    empty = _receive(stub)
    assert empty[0].status.code == pb.MESSAGE_NOT_FOUND and empty[-1].HasField("delivery_timestamp")
    assignment = stub.QueryAssignment(
        rpc.QueryAssignmentRequest(topic=pb.Resource(name="Orders"), group=pb.Resource(name="cg-stub")), metadata=META
    )
    assert [(a.message_queue.id, a.message_queue.broker.name) for a in assignment.assignments] == [(-1, "broker-a")]
    fifo_group = ["-c", "DefaultCluster", "-g", "cg-fifo", "-o", "true"]
    # while serving: the broker reads the group's row within a second
    assert broker_main(["admin", "updateSubGroup", "--lake", str(server.lake), *fifo_group]) == 0
    request = rpc.QueryAssignmentRequest(topic=pb.Resource(name="Orders"), group=pb.Resource(name="cg-fifo"))

    def assigned() -> list[int]:
        return sorted(a.message_queue.id for a in stub.QueryAssignment(request, metadata=META).assignments)

    wait_until(lambda: assigned() == list(range(4)), "every queue assigned to the FIFO group")
    assert server.stop() == 0


def test_a_push_consumer_failing_messages_dead_letters_them_after_the_groups_attempts(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    Broker(BrokerConfig(lake)).start().shutdown()  # registered, so that the group is set before serving
    policy = '{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000]}}'  # a second between attempts
    group = ["-c", "DefaultCluster", "-g", "cg-push", "-r", "2", "-p", policy]  # 3 attempts
    assert broker_main(["admin", "updateSubGroup", "--lake", str(lake), *group]) == 0
    server = start_serve(lake, "--auto-create-topics", "--min-invisible-ms", "1000")
    sent = _client(server, "Orders", "normal", 12)
    deliveries = _consume(server, "Orders", "cg-push", "push", len(sent))
    seen: dict[str, list[dict[str, Any]]] = {}
    for delivery in deliveries:
        seen.setdefault(delivery["body"], []).append(delivery)
    failing = {f"message {i}" for i in range(12) if i % 4 == 1}
    assert {body: [d["attempt"] for d in got] for body, got in seen.items()} == {
        f"message {i}": [1, 2, 3] if f"message {i}" in failing else [1] for i in range(12)
    }
    for body in failing:  # the client retried after the group's 1 s: its settings came from the group
        gaps = [later["at"] - earlier["at"] for earlier, later in itertools.pairwise(seen[body])]
        assert all(1_000 + REVIVE_LATENCY_MS[0] - 200 <= gap <= 1_000 + REVIVE_LATENCY_MS[1] for gap in gaps), gaps
    assert server.stop() == 0
    letters = [r for r in _records(server.lake, "%DLQ%cg-push").values()]
    assert sorted(r["body"].decode() for r in letters) == sorted(failing)
    assert {(r["properties"]["RETRY_TOPIC"], r["properties"]["ORIGIN_GROUP"]) for r in letters} == {
        ("%RETRY%cg-push_Orders", "cg-push")
    }
    ids = {s["message_id"] for s in sent}
    assert {r["uniq_key"] for r in letters} <= ids
    route_dlq(spark, RouteDlqConfig(server.lake, as_of=time.time_ns() // 1_000_000 + 1000, engine=ENGINE))
    dlq = DeltaTable(str(DLQ.location(server.lake))).to_pyarrow_table().to_pylist()
    assert sorted((r["group"], r["origin_topic"], r["body"].decode()) for r in dlq) == sorted(
        ("cg-push", "Orders", body) for body in failing
    )
    assert {r["uniq_key"] for r in dlq} == {r["uniq_key"] for r in letters}


NODE_CONSUMER = """
const { SimpleConsumer } = require('rocketmq-client-nodejs');
(async () => {
  const [endpoints, topic, group, count] = process.argv.slice(2);
  const consumer = new SimpleConsumer({
    consumerGroup: group, endpoints, subscriptions: new Map().set(topic, '*'), awaitDuration: 3000,
  });
  await consumer.startup();
  const deadline = Date.now() + 60000;
  let acked = 0;
  while (acked < Number(count) && Date.now() < deadline) {
    for (const message of await consumer.receive(16, 15000)) {
      await consumer.ack(message);
      acked += 1;
      console.log(JSON.stringify({
        message_id: message.messageId, body: message.body.toString(), attempt: message.deliveryAttempt,
      }));
    }
  }
  await consumer.shutdown();
  console.log('done');
})().catch((err) => { console.error(err); process.exit(1); });
"""


@pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_CLIENT / "node_modules" / "rocketmq-client-nodejs").is_dir(),
    reason="needs Node.js and the npm package rocketmq-client-nodejs in build/node-client (tests/run.sh installs it)",
)
def test_the_official_nodejs_client_consumes_what_the_python_client_produced(server: Server, tmp_path: Path) -> None:
    sent = _client(server, "Orders", "normal", 10)
    home = tmp_path / "node"
    home.mkdir()
    (home / "node_modules").symlink_to(NODE_CLIENT / "node_modules")
    (home / "consume.js").write_text(NODE_CONSUMER)
    command = ["node", "consume.js", server.address, "Orders", "cg-node", str(len(sent))]
    done = subprocess.run(
        command, cwd=home, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(home)}
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and "done" in lines, done.stderr[-2000:]
    received = [json.loads(line) for line in lines if line.startswith("{")]
    assert sorted(r["message_id"] for r in received) == sorted(s["message_id"] for s in sent)
    assert {r["body"] for r in received} == {f"message {i}" for i in range(10)}
    assert {r["attempt"] for r in received} == {1}
    assert server.stop() == 0


def test_an_offset_based_pull_from_a_raw_stub_and_its_committed_offsets_show_in_consumer_offsets(
    spark: SparkSession, server: Server
) -> None:
    sent = _client(server, "Orders", "normal", 6)
    stub = _stub(server)

    def queue(queue_id: int) -> pb.MessageQueue:
        return pb.MessageQueue(topic=pb.Resource(name="Orders"), id=queue_id, broker=pb.Broker(name="broker-a"))

    def query(queue_id: int, policy: int) -> int:
        answer = stub.QueryOffset(
            rpc.QueryOffsetRequest(message_queue=queue(queue_id), query_offset_policy=policy), metadata=META
        )
        assert answer.status.code == pb.OK
        return int(answer.offset)

    ends = {q: query(q, pb.END) for q in range(4)}
    assert sum(ends.values()) == len(sent) and {query(q, pb.BEGINNING) for q in range(4)} == {0}
    group = pb.Resource(name="cg-pull")
    missing = stub.GetOffset(rpc.GetOffsetRequest(group=group, message_queue=queue(0)), metadata=META)
    assert missing.status.code == pb.OFFSET_NOT_FOUND
    pulled, half = [], ends[0] // 2
    for q in range(4):
        request = rpc.PullMessageRequest(
            group=group,
            message_queue=queue(q),
            offset=0,
            batch_size=32,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        )
        status, *messages, last = stub.PullMessage(request, metadata=META, timeout=10)
        assert status.status.code == (pb.OK if ends[q] else pb.MESSAGE_NOT_FOUND) and last.next_offset == ends[q]
        pulled += [m.message.system_properties.message_id for m in messages]
        committed = half if q == 0 else int(last.next_offset)  # queue 0 is consumed half way
        update = rpc.UpdateOffsetRequest(group=group, message_queue=queue(q), offset=committed)
        assert stub.UpdateOffset(update, metadata=META).status.code == pb.OK
        answer = stub.GetOffset(rpc.GetOffsetRequest(group=group, message_queue=queue(q)), metadata=META)
        assert (answer.status.code, answer.offset) == (pb.OK, committed)
    assert sorted(pulled) == sorted(s["message_id"] for s in sent)  # each once, none missing
    beyond = rpc.PullMessageRequest(group=group, message_queue=queue(0), offset=ends[0] + 5, batch_size=1)
    assert next(iter(stub.PullMessage(beyond, metadata=META, timeout=10))).status.code == pb.ILLEGAL_OFFSET
    passed_over = rpc.PullMessageRequest(
        group=group,
        message_queue=queue(1),
        offset=0,
        batch_size=32,
        filter_expression=pb.FilterExpression(type=pb.SQL, expression="TAGS = 'none'"),
    )
    passed_over.long_polling_timeout.FromMilliseconds(20_000)
    status, last = stub.PullMessage(passed_over, metadata=META, timeout=10)  # at once, and on past what it read
    assert status.status.code == pb.MESSAGE_NOT_FOUND and last.next_offset == ends[1]
    later = rpc.PullMessageRequest(group=group, message_queue=queue(0), offset=ends[0], batch_size=1)
    later.long_polling_timeout.FromMilliseconds(300)
    status, last = stub.PullMessage(later, metadata=META, timeout=10)  # held 0.3 s, nothing came
    assert status.status.code == pb.MESSAGE_NOT_FOUND and last.next_offset == ends[0]
    assert server.stop() == 0  # the brokers persist the offsets as they stop
    assert rebuild(spark, RebuildConfig(server.lake, engine=ENGINE)).status == "SUCCEEDED"
    as_of = int(time.time() * 1000)
    assert offsets(spark, ConsumerOffsetsConfig(server.lake, as_of, engine=ENGINE)).status == "SUCCEEDED"
    rows = DeltaTable(str(server.lake / "consumer_offsets")).to_pyarrow_table().to_pylist()
    lag = {r["queue_id"]: (r["consumer_offset"], r["diff"]) for r in rows if r["group"] == "cg-pull"}
    assert lag == {q: (half, ends[q] - half) if q == 0 else (ends[q], 0) for q in range(4) if ends[q]}


def test_after_a_sigkill_of_the_server_acked_messages_never_come_back_and_unacked_ones_once(tmp_path: Path) -> None:
    with socket.socket() as probe:  # the server comes back on the port the client knows
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lake, options = tmp_path / "lake", ["--auto-create-topics", "--min-invisible-ms", "1000", "--listen"]
    server = start_serve(lake, *options, f"127.0.0.1:{port}")
    sent = _client(server, "Orders", "normal", 20)
    home = tmp_path / "client-home"
    home.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "tests.grpc_consumer_process", server.address, "Orders", "cg-crash", "crash", "20"]
    client = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": str(home)},
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        assert client.stdout.readline().strip() == "ready"
        server.process.send_signal(signal.SIGKILL)  # no flush, no unlock: the log and its checkpoints tell
        assert server.process.wait(timeout=30) == -signal.SIGKILL
        restarted = start_serve(lake, *options, f"127.0.0.1:{port}")
        client.stdin.write("go\n")
        client.stdin.flush()
        output, _ = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
    assert output.rstrip().endswith("done")
    deliveries = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    before = [d for d in deliveries if d["phase"] == "before"]
    after = [d for d in deliveries if d["phase"] == "after"]
    assert sorted(d["message_id"] for d in before) == sorted(s["message_id"] for s in sent)
    unacked = {d["message_id"] for d in before if int(d["body"].split()[1]) % 2 == 1}
    assert sorted(d["message_id"] for d in after) == sorted(unacked)  # once each, no acked one
    assert {d["attempt"] for d in after} == {2}
    assert restarted.stop() == 0


def test_a_fifo_group_under_four_consumers_gets_each_message_group_in_order_one_at_a_time(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    Broker(BrokerConfig(lake)).start().shutdown()
    assert (
        broker_main(
            ["admin", "updateSubGroup", "--lake", str(lake), "-c", "DefaultCluster", "-g", "cg-fifo", "-o", "true"]
        )
        == 0
    )
    server = start_serve(lake, "--auto-create-topics", "--min-invisible-ms", "1000")
    sent = _client(server, "Ledger", "fifo", 8, threads=3)
    deliveries = _consume(server, "Ledger", "cg-fifo", "fifo", len(sent))
    assert server.stop() == 0
    assert sorted(d["message_id"] for d in deliveries) == sorted(s["message_id"] for s in sent)  # each once
    assert {d["attempt"] for d in deliveries} == {1}
    for group in ("group-a", "group-b", "group-c"):
        mine = sorted((d for d in deliveries if d["group"] == group), key=lambda d: (d["received"], d["acked"]))
        assert [int(d["body"].split()[1]) for d in mine] == list(range(8)), group  # in send order
        for earlier, later in itertools.pairwise(mine):  # a batch is acked before the next is received
            assert earlier["received"] == later["received"] or later["received"] >= earlier["acked"], (earlier, later)
    assert len({d["consumer"] for d in deliveries}) > 1  # the consumers shared the work
