"""The gRPC endpoint (``python -m broker_model serve``) against the official RocketMQ 5 Python client
(``rocketmq-python-client``, unmodified) in processes of their own, on loopback: what the client was
told is what the lake holds, FIFO groups keep one queue and their order, the protocol's error codes
for bad requests from a raw stub with nothing written, and a clean stop on SIGTERM.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
from broker_model.client import PullConsumer
from broker_model.endpoint.service import consistent_hash, java_hash
from broker_model.tools.admin import update_topic
from jobs.consumer_offsets import ConsumerOffsetsConfig
from jobs.consumer_offsets import run as offsets
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as rebuild
from jobs.resolve_transactions import ResolveTransactionsConfig
from jobs.resolve_transactions import run as resolve
from schemas.catalog import COMMITLOG
from tests.helpers import ENGINE, wait_until

pytestmark = pytest.mark.subprocess
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Server:
    process: subprocess.Popen[str]
    address: str
    lake: Path

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def start_serve(lake: Path, *extra: str) -> Server:
    """``python -m broker_model serve`` on the lake, on a free loopback port, with ``extra`` options;
    returns once it printed its address."""
    command = [sys.executable, "-m", "broker_model", "serve", "--lake", str(lake), "--listen", "127.0.0.1:0", *extra]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("serving brokers"), line
    return Server(process, line.rsplit(" on ", 1)[1].strip(), lake)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = start_serve(tmp_path / "lake", "--brokers", "broker-a,broker-b", "--auto-create-topics")
    yield running
    if running.process.poll() is None:
        running.stop()


def _run_client(
    server: Server, topic: str, mode: str, count: int, threads: int = 1, **env: str
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.grpc_client_process", server.address, topic, mode, str(count), str(threads)]
    home = server.lake.parent / "client-home"  # the client writes its log files under $HOME/logs
    home.mkdir(exist_ok=True)
    environment = {**os.environ, "HOME": str(home), **env}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=environment)


def _client(server: Server, topic: str, mode: str, count: int, threads: int = 1, **env: str) -> list[dict[str, Any]]:
    done = _run_client(server, topic, mode, count, threads, **env)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("done"), done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _records(lake: Path, topic: str) -> dict[str, dict[str, Any]]:
    columns = ["broker_name", "topic", "queue_id", "queue_offset", "body", "tags", "keys", "uniq_key", "properties"]
    rows = DeltaTable(str(COMMITLOG.location(lake))).to_pyarrow_table(columns=columns).to_pylist()
    return {r["uniq_key"]: {**r, "properties": dict(r["properties"])} for r in rows if r["topic"] == topic}


def test_the_official_client_sends_and_the_lake_holds_what_it_was_told(server: Server) -> None:
    receipts = _client(server, "Orders", "normal", 12)
    assert server.stop() == 0  # SIGTERM: the brokers flush and stop

    records = _records(server.lake, "Orders")
    assert len(receipts) == 12 and len(records) == 12
    for receipt in receipts:
        record = records[receipt["message_id"]]
        assert record["queue_offset"] == receipt["offset"]
        assert record["body"] == f"message {receipt['sequence']}".encode()
        assert (record["tags"], record["keys"]) == ("created", f"key-n-{receipt['sequence']}")
        assert record["properties"]["PGROUP"] == "Orders"  # the proxy names the topic as producer group
    assert {r["broker_name"] for r in records.values()} == {"broker-a", "broker-b"}  # round robin
    Broker(BrokerConfig(server.lake, "broker-a")).start().shutdown()  # the name lock was released


def test_a_server_whose_output_reader_is_gone_still_stops_cleanly(tmp_path: Path) -> None:
    running = start_serve(tmp_path / "lake", "--brokers", "broker-a")
    assert running.process.stdout is not None
    running.process.stdout.close()  # the process that started it went away
    assert running.stop() == 0
    broker = Broker(BrokerConfig(tmp_path / "lake", "broker-a")).start()  # its name lock was released
    broker.shutdown()


@pytest.mark.spark
def test_the_rebuilt_consume_queues_hold_what_the_clients_were_told(spark: SparkSession, server: Server) -> None:
    told = _client(server, "Orders", "normal", 6) + _client(server, "Ledger", "fifo", 3, threads=2)
    assert server.stop() == 0
    assert rebuild(spark, RebuildConfig(server.lake, engine=ENGINE)).status == "SUCCEEDED"
    units = DeltaTable(str(server.lake / "consume_queue")).to_pyarrow_table().to_pylist()
    records = {**_records(server.lake, "Orders"), **_records(server.lake, "Ledger")}
    for line in told:
        record = records[line["message_id"]]
        key = (record["broker_name"], record["topic"], record["queue_id"], line["offset"])
        found = [u for u in units if (u["broker_name"], u["topic"], u["queue_id"], u["queue_offset"]) == key]
        assert len(found) == 1 and found[0]["tags_code"] == java_hash("created"), line


@pytest.mark.spark
def test_consumer_offsets_measure_lag_from_the_offsets_the_client_was_told(spark: SparkSession, server: Server) -> None:
    told = _client(server, "Orders", "normal", 12)
    assert server.stop() == 0
    records = _records(server.lake, "Orders")
    ends: dict[tuple[str, int], int] = {}  # the next offset of each queue, from what the client was told
    for line in told:
        record = records[line["message_id"]]
        key = (record["broker_name"], record["queue_id"])
        ends[key] = max(ends.get(key, 0), line["offset"] + 1)
    # a consumer group of ours consumes the first message of every queue the client wrote
    brokers = [Broker(BrokerConfig(server.lake, name)).start() for name in ("broker-a", "broker-b")]
    try:
        consumer = PullConsumer(brokers, "cg-orders")
        for queue in consumer.queues("Orders"):
            if (queue.broker_name, queue.queue_id) in ends:
                pulled = consumer.pull(queue, 0, max_nums=1)
                consumer.update_offset(queue, pulled.next_begin_offset)
        consumer.persist()
    finally:
        for broker in brokers:
            broker.shutdown()
    assert rebuild(spark, RebuildConfig(server.lake, engine=ENGINE)).status == "SUCCEEDED"
    as_of = int(time.time() * 1000)
    assert offsets(spark, ConsumerOffsetsConfig(server.lake, as_of, engine=ENGINE)).status == "SUCCEEDED"
    rows = DeltaTable(str(server.lake / "consumer_offsets")).to_pyarrow_table().to_pylist()
    lag = {(r["broker_name"], r["queue_id"]): r for r in rows if (r["group"], r["topic"]) == ("cg-orders", "Orders")}
    assert set(lag) == set(ends)
    for key, end in ends.items():
        assert (lag[key]["consumer_offset"], lag[key]["broker_offset"], lag[key]["diff"]) == (1, end, end - 1), key


def test_fifo_groups_each_keep_one_queue_in_send_order(server: Server) -> None:
    receipts = _client(server, "Ledger", "fifo", 6, threads=4)
    assert server.stop() == 0

    records = _records(server.lake, "Ledger")
    assert len(receipts) == 18 and len(records) == 18
    queues = sorted((b, q) for b in ("broker-a", "broker-b") for q in range(4))  # 4 queues per broker, auto-created
    for group in ("group-a", "group-b", "group-c"):
        mine = sorted((r for r in receipts if r["group"] == group), key=lambda r: r["sequence"])
        stored = [records[r["message_id"]] for r in mine]
        assert {(s["broker_name"], s["queue_id"]) for s in stored} == {queues[consistent_hash(java_hash(group), 8)]}
        offsets = [s["queue_offset"] for s in stored]
        assert offsets == sorted(offsets) and offsets == [r["offset"] for r in mine]
        assert all(s["properties"]["__SHARDINGKEY"] == group for s in stored)


CLIENT = [("x-mq-client-id", "test-endpoint")]  # every official client names itself, as the proxy requires


def _stub(server: Server) -> service_pb2_grpc.MessagingServiceStub:
    return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(server.address))


def _message(topic: str, body: bytes = b"x", **system: Any) -> pb.Message:
    properties = pb.SystemProperties(message_id=system.pop("message_id", "0102FC00000001"), **system)
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=properties)


def test_bad_requests_get_the_protocol_codes_and_write_nothing(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    broker.ensure_topic("Orders", 2)
    broker.shutdown()
    server = start_serve(lake, "--flush-mode", "SYNC_FLUSH")  # no auto-creation; an answered send is committed
    try:
        stub = _stub(server)
        version = DeltaTable(str(COMMITLOG.location(lake))).version()
        route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="Nowhere")), timeout=10, metadata=CLIENT)
        assert route.status.code == pb.TOPIC_NOT_FOUND and "Nowhere" in route.status.message
        route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="Orders")), timeout=10, metadata=CLIENT)
        assert route.status.code == pb.OK and [q.id for q in route.message_queues] == [0, 1]

        def send(*messages: pb.Message) -> pb.Status:
            return stub.SendMessage(rpc.SendMessageRequest(messages=messages), timeout=10, metadata=CLIENT).status

        cases = [
            (send(_message("")), pb.ILLEGAL_TOPIC, "topic"),
            (send(_message("Nowhere")), pb.TOPIC_NOT_FOUND, "Nowhere"),
            (send(_message("Orders", b"x" * (4 * 1024 * 1024 + 1))), pb.MESSAGE_BODY_TOO_LARGE, "body"),
            (send(_message("Orders", message_id=" ")), pb.ILLEGAL_MESSAGE_ID, "message_id"),
            (send(_message("Orders", tag="a|b")), pb.ILLEGAL_MESSAGE_TAG, "tag"),
            (send(_message("Orders", message_group="g\\x01")), pb.OK, ""),
            (send(_message("Orders"), _message("Ledger")), pb.MESSAGE_CORRUPTED, "topic"),
            (send(), pb.MESSAGE_CORRUPTED, "messages"),
            (send(_message("Orders", b"")), pb.MESSAGE_BODY_EMPTY, "body"),
        ]
        unnamed = stub.SendMessage(rpc.SendMessageRequest(messages=[_message("Orders")]), timeout=10)
        cases.append((unnamed.status, pb.CLIENT_ID_REQUIRED, "x-mq-client-id"))
        reserved = _message("Orders")
        reserved.user_properties["TAGS"] = "sneaky"
        cases.append((send(reserved), pb.ILLEGAL_MESSAGE_PROPERTY_KEY, "TAGS"))
        delayed = _message("Orders", message_type=pb.DELAY)
        # the proxy's limit, 1 day ahead (ProxyConfig.maxDelayTimeMills), not the broker's 3 days
        delayed.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 2 * 86_400_000)
        cases.append((send(delayed), pb.ILLEGAL_DELIVERY_TIME, "delivery_timestamp"))
        cases.append((send(_message("Orders", message_type=pb.LITE)), pb.UNSUPPORTED, "LITE"))
        for got, code, named in cases[:5] + cases[6:]:
            assert (pb.Code.Name(got.code), named in got.message) == (pb.Code.Name(code), True), got
        assert DeltaTable(str(COMMITLOG.location(lake))).version() == version + 1  # only the valid FIFO send
    finally:
        assert server.stop() == 0


def test_topic_types_and_permissions_set_by_admin_shape_routes_and_sends_even_while_serving(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    Broker(BrokerConfig(lake, "broker-a")).start().shutdown()
    for topic, perm, kind in [
        ("Orders", 6, "NORMAL"),
        ("Fifo", 6, "FIFO"),
        ("Mixed", 6, "MIXED"),
        ("Plain", 6, None),
        ("Closed", 4, None),
    ]:
        update_topic(lake, topic, ["broker-a"], 2, perm, {"message.type": kind} if kind else None)
    server = start_serve(lake, "--flush-mode", "SYNC_FLUSH")
    try:
        stub = _stub(server)

        def route(topic: str) -> tuple[set[str], set[str]]:
            answer = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=10, metadata=CLIENT)
            assert answer.status.code == pb.OK, answer.status
            types = {pb.MessageType.Name(t) for q in answer.message_queues for t in q.accept_message_types}
            return types, {pb.Permission.Name(q.permission) for q in answer.message_queues}

        every = {"NORMAL", "FIFO", "DELAY", "TRANSACTION"}
        assert route("Orders") == ({"NORMAL"}, {"READ_WRITE"})
        assert route("Fifo") == ({"FIFO"}, {"READ_WRITE"})
        assert route("Mixed") == (every, {"READ_WRITE"})
        assert route("Plain") == (every, {"READ_WRITE"})
        assert route("Closed") == (every, {"READ"})

        def send(message: pb.Message) -> str:
            answer = stub.SendMessage(rpc.SendMessageRequest(messages=[message]), timeout=10, metadata=CLIENT)
            return str(pb.Code.Name(answer.status.code))

        def delayed(topic: str) -> pb.Message:
            message = _message(topic, message_type=pb.DELAY)
            message.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 60_000)
            return message

        version = DeltaTable(str(COMMITLOG.location(lake))).version()
        conflict = "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        assert send(_message("Fifo", message_type=pb.NORMAL)) == conflict
        assert send(_message("Orders", message_type=pb.FIFO, message_group="g")) == conflict
        assert send(delayed("Orders")) == conflict
        assert send(_message("Closed")) == "FORBIDDEN"
        assert DeltaTable(str(COMMITLOG.location(lake))).version() == version  # nothing written
        assert send(_message("Fifo", message_type=pb.FIFO, message_group="g")) == "OK"
        assert send(delayed("Mixed")) == "OK"
        assert send(_message("Plain", message_type=pb.FIFO, message_group="g")) == "OK"
        assert DeltaTable(str(COMMITLOG.location(lake))).version() == version + 3

        # an operator types Plain while the server runs: the broker applies it within a second
        assert broker_main(["admin", "updateTopic", "--lake", str(lake), "-b", "broker-a", "-t", "Plain",
                            "-r", "2", "-a", "+message.type=TRANSACTION"]) == 0  # fmt: skip
        wait_until(lambda: route("Plain")[0] == {"TRANSACTION"}, "the server applies the new message type")
        assert send(_message("Plain", message_type=pb.FIFO, message_group="g")) == conflict
    finally:
        assert server.stop() == 0


NODE_SENDER = """
const { Producer } = require('rocketmq-client-nodejs');
(async () => {
  const producer = new Producer({ endpoints: process.argv[2] });
  await producer.startup();
  for (let i = 0; i < Number(process.argv[4]); i++) {
    const receipt = await producer.send({
      topic: process.argv[3], tag: 'nodejs', keys: ['node-' + i], body: Buffer.from('from node ' + i),
    });
    console.log(JSON.stringify({ message_id: receipt.messageId, offset: Number(receipt.offset), sequence: i }));
  }
  await producer.shutdown();
  console.log('done');
})().catch((err) => { console.error(err); process.exit(1); });
"""


NODE_CLIENT = ROOT / "build" / "node-client"  # tests/run.sh installs the npm package here


@pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_CLIENT / "node_modules" / "rocketmq-client-nodejs").is_dir(),
    reason="needs Node.js and the npm package rocketmq-client-nodejs in build/node-client (tests/run.sh installs it)",
)
def test_the_official_nodejs_client_sends_and_its_message_ids_are_in_the_log(server: Server, tmp_path: Path) -> None:
    home = tmp_path / "node"
    home.mkdir()
    environment = {**os.environ, "HOME": str(home)}  # the client's log files go under $HOME/logs
    (home / "node_modules").symlink_to(NODE_CLIENT / "node_modules")
    (home / "send.js").write_text(NODE_SENDER)
    command = ["node", "send.js", server.address, "Orders", "8"]
    done = subprocess.run(command, cwd=home, capture_output=True, text=True, timeout=120, env=environment)
    lines = done.stdout.splitlines()
    assert "done" in lines, done.stderr[-2000:]
    receipts = [json.loads(line) for line in lines if line.startswith("{")]
    assert server.stop() == 0

    records = _records(server.lake, "Orders")
    assert len(receipts) == 8 == len(records)
    for receipt in receipts:
        record = records[receipt["message_id"]]
        body = f"from node {receipt['sequence']}".encode()
        assert (record["queue_offset"], record["body"]) == (receipt["offset"], body)
        assert (record["tags"], record["keys"]) == ("nodejs", f"node-{receipt['sequence']}")


@pytest.mark.spark
def test_transactions_commit_roll_back_and_are_checked_back_through_the_clients_stream(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    checks = ["--transaction-check-interval-ms", "300", "--transaction-timeout-ms", "1000", "--transaction-check-max"]
    server = start_serve(lake, "--brokers", "broker-a,broker-b", "--auto-create-topics", *checks, "3")
    try:
        lines = _client(server, "Payments", "transaction", 2, threads=3)  # then the 3 check-backs of the open ones
        stub = _stub(server)
        unknown = rpc.EndTransactionRequest(
            topic=pb.Resource(name="Payments"), message_id="X", transaction_id="7F00000100002A9F00000000DEADBEEF"
        )
        answer = stub.EndTransaction(unknown, timeout=10, metadata=CLIENT)
        assert answer.status.code == pb.INTERNAL_SERVER_ERROR and "transaction_id" in answer.status.message
        # a transaction the client committed cannot be ended again, whichever the resolution
        done = next(line for line in lines if line.get("outcome") == "commit")
        for resolution in (pb.COMMIT, pb.ROLLBACK):
            again = rpc.EndTransactionRequest(
                topic=pb.Resource(name="Payments"),
                message_id=done["message_id"],
                transaction_id=done["transaction_id"],
                resolution=resolution,
            )
            assert stub.EndTransaction(again, timeout=10, metadata=CLIENT).status.code == pb.INTERNAL_SERVER_ERROR
    finally:
        assert server.stop() == 0
    sent = [line for line in lines if "outcome" in line and "checked" not in line]
    checked = [line["checked"] for line in lines if "checked" in line]
    assert len(sent) == 8 and all(line["transaction_id"] == line["message_id"] for line in sent)
    for line in sent:
        asked = checked.count(line["message_id"])
        if line["outcome"] == "open":
            assert asked == 3, line  # asked check-max times, then discarded
        elif line["outcome"] == "check-commit":
            assert asked >= 1, line  # its end comes from the checker
        else:  # ended by the client; a check-back may still come first on a loaded machine
            assert asked <= 1, line

    as_of = time.time_ns() // 1_000_000
    resolve(spark, ResolveTransactionsConfig(lake, as_of, timeout_ms=1000, check_max=3, engine=ENGINE))
    table = DeltaTable(str(lake / "transaction_state")).to_pyarrow_table(columns=["uniq_key", "state"])
    states = {row["uniq_key"]: row["state"] for row in table.to_pylist()}
    wanted = {"commit": "COMMITTED", "rollback": "ROLLED_BACK", "check-commit": "COMMITTED", "open": "DISCARDED"}
    assert {line["message_id"]: states.get(line["message_id"]) for line in sent} == {
        line["message_id"]: wanted[line["outcome"]] for line in sent
    }
    committed = _records(lake, "Payments")  # the final messages, in the real topic
    assert sorted(r["body"] for r in committed.values()) == sorted(
        f"{line['outcome']} {line['sequence']}".encode() for line in sent if wanted[line["outcome"]] == "COMMITTED"
    )


def test_every_send_the_client_saw_succeed_survives_a_sigkill_of_the_server(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    server = start_serve(lake, "--brokers", "broker-a,broker-b", "--auto-create-topics", "--flush-mode", "SYNC_FLUSH")
    home = tmp_path / "client-home"
    home.mkdir()
    command = [sys.executable, "-m", "tests.grpc_client_process", server.address, "Crash", "flood", "8", "16"]
    environment = {**os.environ, "HOME": str(home)}
    client = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment
    )
    assert client.stdout is not None
    before_kill = [client.stdout.readline() for _ in range(60)]  # the client was told 60 sends
    server.process.send_signal(signal.SIGKILL)  # mid-flood: no flush, no unlock
    server.process.wait(timeout=30)
    output, _ = client.communicate(timeout=120)
    told = [json.loads(line) for line in [*before_kill, *output.splitlines()] if line.startswith("{")]
    assert len(told) >= 60

    restarted = start_serve(lake, "--brokers", "broker-a,broker-b", "--flush-mode", "SYNC_FLUSH")  # recovery
    assert restarted.stop() == 0
    records = _records(lake, "Crash")
    missing = [t for t in told if t["message_id"] not in records]
    assert missing == []
    assert all(records[t["message_id"]]["queue_offset"] == t["offset"] for t in told)


def _signed(access_key: str, secret_key: str) -> list[tuple[str, str]]:
    """The signature headers the official clients send (``Signature.metadata``)."""
    date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    digest = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    authorization = f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={digest}"
    return [("x-mq-date-time", date_time), ("authorization", authorization)]


def test_with_an_acl_requests_must_be_signed_and_stay_within_their_topics(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    for topic in ("Orders", "Ledger"):
        broker.ensure_topic(topic, 2)
    broker.shutdown()
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [{"accessKey": "orders-app", "secretKey": "s3cret", "topics": ["Orders"]}]}))
    server = start_serve(lake, "--acl", str(acl), "--flush-mode", "SYNC_FLUSH")  # an answered send is committed
    try:
        sent = _client(server, "Orders", "normal", 3, RMQ_CLIENT_AK="orders-app", RMQ_CLIENT_SK="s3cret")
        assert len(sent) == 3
        version = DeltaTable(str(COMMITLOG.location(lake))).version()
        refused = _run_client(server, "Orders", "normal", 3, RMQ_CLIENT_AK="orders-app", RMQ_CLIENT_SK="wrong")
        assert refused.returncode != 0 and "done" not in refused.stdout

        stub = _stub(server)
        request = rpc.SendMessageRequest(messages=[_message("Orders")])
        assert stub.SendMessage(request, timeout=10).status.code == pb.UNAUTHORIZED  # no signature
        wrong = stub.SendMessage(request, timeout=10, metadata=_signed("orders-app", "guess"))
        assert wrong.status.code == pb.UNAUTHORIZED and "wrong signature" in wrong.status.message
        other = rpc.SendMessageRequest(messages=[_message("Ledger")])
        forbidden = stub.SendMessage(other, timeout=10, metadata=_signed("orders-app", "s3cret"))
        assert forbidden.status.code == pb.FORBIDDEN and "Ledger" in forbidden.status.message
        assert DeltaTable(str(COMMITLOG.location(lake))).version() == version  # nothing written
    finally:
        assert server.stop() == 0
    assert len(_records(lake, "Orders")) == 3 and not _records(lake, "Ledger")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_the_official_client_sends_over_tls(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    make = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
    names = ["-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
    subprocess.run([*make, *names], check=True, capture_output=True)
    server = start_serve(tmp_path / "lake", "--auto-create-topics", "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        sent = _client(server, "Orders", "normal", 4, RMQ_CLIENT_TLS="1", GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(cert))
        assert len(sent) == 4
        with pytest.raises(grpc.RpcError):  # plaintext is not served
            _stub(server).QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="Orders")), timeout=5)
    finally:
        assert server.stop() == 0
    assert {r["uniq_key"] for r in _records(tmp_path / "lake", "Orders").values()} == {s["message_id"] for s in sent}


def _timer_records(lake: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The timer entries by message id, and every record of the real topic ``Later``."""
    columns = ["topic", "queue_offset", "uniq_key", "store_timestamp", "properties", "body"]
    rows = DeltaTable(str(COMMITLOG.location(lake))).to_pyarrow_table(columns=columns).to_pylist()
    rows = [{**r, "properties": dict(r["properties"])} for r in rows]
    entries = {r["uniq_key"]: r for r in rows if r["topic"] == "rmq_sys_wheel_timer"}
    return entries, [r for r in rows if r["topic"] == "Later"]


def test_timer_messages_are_delivered_at_their_millisecond(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    server = start_serve(lake, "--brokers", "broker-a,broker-b", "--auto-create-topics", "--flush-mode", "SYNC_FLUSH")
    try:
        sent = _client(server, "Later", "timer", 8)
        wait_until(lambda: len(_timer_records(lake)[1]) >= len(sent), "every timer message delivered")
    finally:
        assert server.stop() == 0
    entries, delivered = _timer_records(lake)
    for line in sent:
        entry = entries[line["message_id"]]
        assert entry["properties"]["TIMER_OUT_MS"] == str(line["due"]) == entry["properties"]["TIMER_DELIVER_MS"]
        assert entry["queue_offset"] == line["offset"]  # the client is told where the entry waits
        copies = [r for r in delivered if r["uniq_key"] == line["message_id"]]
        assert len(copies) == 1, line
        copy = copies[0]
        assert line["due"] <= copy["store_timestamp"]  # never early
        assert "REAL_TOPIC" not in copy["properties"] and copy["body"] == f"timer {line['sequence']}".encode()
        assert int(copy["properties"]["TIMER_DEQUEUE_MS"]) >= line["due"]


def test_timer_delivery_neither_repeats_nor_skips_a_message_after_a_sigkill(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    arguments = ["--brokers", "broker-a", "--auto-create-topics", "--flush-mode", "SYNC_FLUSH"]
    server = start_serve(lake, *arguments)
    sent = _client(server, "Later", "timer", 16, RMQ_TIMER_STEP_MS="500")  # due over 1 s to 8.5 s from now
    wait_until(lambda: len(_timer_records(lake)[1]) >= 1, "a first timer message delivered")
    server.process.send_signal(signal.SIGKILL)  # some delivered, the later ones not yet
    server.process.wait(timeout=30)
    delivered_before = len(_timer_records(lake)[1])
    assert 1 <= delivered_before < len(sent)  # the kill landed between deliveries
    restarted = start_serve(lake, *arguments)
    try:
        wait_until(lambda: len(_timer_records(lake)[1]) >= len(sent), "every timer message delivered")
    finally:
        assert restarted.stop() == 0
    _, delivered = _timer_records(lake)
    ids = [r["uniq_key"] for r in delivered]
    assert sorted(ids) == sorted(s["message_id"] for s in sent)  # each exactly once
    due = {s["message_id"]: s["due"] for s in sent}
    assert all(r["store_timestamp"] >= due[r["uniq_key"]] for r in delivered)
