"""Our endpoint held to Apache RocketMQ's proxy: one client script (tests/endpoint_script.py, the
official Python client) run against a real Apache RocketMQ 5 (tests/apache_rocketmq.py) and against
``python -m broker_model serve``, with topics of the same names, queue counts and message types;
the normalised records must be equal but for the differences docs/endpoint.md lists as decisions
(``KNOWN_DIFFERENCES``), and each of those must still be a difference. The official Node.js client
sends to both too, and its receipts must have the same shape.

Timer delivery is compared through the script's SimpleConsumer on both sides, and on ours also
from the lake's commit log (the delivered copy stored not before its time).

The Node.js producer names no topics when it starts: the client (1.0.8) fetches their routes
before it waits for the server's settings, and a settings answer that comes first is missed (it
then waits for good); without topics it waits at once, as tests/test_endpoint.py's sender does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from broker_model.broker import Broker, BrokerConfig
from broker_model.tools.admin import update_topic
from schemas.catalog import COMMITLOG
from tests.apache_fixture import started_rocketmq
from tests.apache_rocketmq import ApacheRocketMQ, GroupSpec, TopicSpec
from tests.helpers import wait_until
from tests.test_endpoint import NODE_CLIENT, Server, start_serve

pytestmark = [pytest.mark.subprocess, pytest.mark.apache]
ROOT = Path(__file__).resolve().parent.parent

# (name, message type): the topics of the script, 2 queues each on both sides
TOPICS = (("DiffNormal", "NORMAL"), ("DiffFifo", "FIFO"), ("DiffDelay", "DELAY"), ("DiffTx", "TRANSACTION"))
MISSING = "DiffMissing"
GROUP = "diff-consumer"
# RocketMQ's check-back timing in the harness (transactionTimeOut, transactionCheckInterval), given to ours
CHECKS = ("--transaction-timeout-ms", "2000", "--transaction-check-interval-ms", "1000")
# Both sides authenticate every call (the script signs them all): ours with --acl, RocketMQ's proxy
# with ACL 2.0's authentication, its user created by the broker (the broker itself does not
# authenticate, so the harness's admin calls need no credentials).
ACCESS_KEY, SECRET_KEY = "diff-app", "diff-secret"
_PROVIDERS = "org.apache.rocketmq.auth.authentication.provider."
APACHE_BROKER_AUTH = {
    "authenticationMetadataProvider": _PROVIDERS + "LocalAuthenticationMetadataProvider",
    "initAuthenticationUser": json.dumps({"username": ACCESS_KEY, "password": SECRET_KEY}),
}
APACHE_PROXY_AUTH = {
    "authenticationEnabled": True,
    "authenticationProvider": _PROVIDERS + "DefaultAuthenticationProvider",
    "authenticationMetadataProvider": "org.apache.rocketmq.proxy.auth.ProxyAuthenticationMetadataProvider",
}

# Every difference between the two records that is a decision, by the record path it covers (a
# prefix of the flattened keys), with its reason; docs/endpoint.md ("Against RocketMQ's proxy")
# writes each one down.
KNOWN_DIFFERENCES: Mapping[str, str] = {
    "errors.delivery_time_in_milliseconds": "the Python client 5.1.2 writes milliseconds into Timestamp.seconds: "
    "taken as milliseconds here, refused by the proxy",
    "sends.delay.receipt.recall_handle": "RecallMessage is not served: a timer message gets no recall handle",
}


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``record`` as dotted paths to its leaves."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The paths whose leaves differ (a missing leaf is ``<absent>``): path -> (ours, theirs)."""
    a, b = flatten(ours), flatten(theirs)
    return {
        path: (a.get(path, "<absent>"), b.get(path, "<absent>"))
        for path in sorted(a.keys() | b.keys())
        if a.get(path, "<absent>") != b.get(path, "<absent>")
    }


def known(path: str) -> str | None:
    """The decision covering ``path``, None when no listed difference does."""
    return next((p for p in KNOWN_DIFFERENCES if path == p or path.startswith(p + ".")), None)


def _script(endpoint: str, home: Path) -> dict[str, Any]:
    names = [name for name, _ in TOPICS]
    command = [sys.executable, "-m", "tests.endpoint_script", endpoint, *names, MISSING, "--receive", GROUP]
    command += ["--credentials", ACCESS_KEY, SECRET_KEY]
    home.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, "HOME": str(home)}  # the client writes its logs under $HOME/logs
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240, env=environment)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("done"), done.stdout[-3000:] + done.stderr[-3000:]
    record: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return record


def _timer_delivery(record: dict[str, Any]) -> dict[str, Any]:
    """Whether the script's consumer received the timer message, and not before its time."""
    consumer = record.get("consumer", {})
    return {"delivered": consumer.get("received"), "not_before_due": consumer.get("not_before_due")}


def _timer_copy(lake: Path) -> dict[str, Any] | None:
    """The delivered copy of the script's timer message (body ``timer``) in its real topic."""
    columns = ["topic", "body", "store_timestamp", "properties"]
    rows = DeltaTable(str(COMMITLOG.location(lake))).to_pyarrow_table(columns=columns).to_pylist()
    return next((r for r in rows if r["topic"] == "DiffDelay" and r["body"] == b"timer"), None)


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], Server]]:
    """The script's record against ``serve`` (its timer delivery read from the lake), and the
    server, still running for the Node.js test."""
    base = tmp_path_factory.mktemp("endpoint-differential")
    lake = base / "lake"
    Broker(BrokerConfig(lake, "broker-a")).start().shutdown()
    for name, kind in TOPICS:  # as the harness creates them on RocketMQ's side: mqadmin updateTopic -a
        update_topic(lake, name, ["broker-a"], 2, attributes={"message.type": kind})
    acl = base / "acl.json"
    acl.write_text(json.dumps({"accounts": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY, "topics": ["*"]}]}))
    server = start_serve(lake, "--brokers", "broker-a", "--flush-mode", "SYNC_FLUSH", "--acl", str(acl), *CHECKS)
    try:
        record = _script(server.address, base / "client-home")
        wait_until(lambda: _timer_copy(lake) is not None, "the script's timer message delivered")
        copy = _timer_copy(lake)
        assert copy is not None
        due = int(dict(copy["properties"])["TIMER_DELIVER_MS"])
        assert copy["store_timestamp"] >= due
        consumer = record.get("consumer", {})
        record["timer_delivery"] = {
            "delivered": consumer.get("received"),
            "not_before_due": consumer.get("not_before_due"),
        }
        yield record, server
    finally:
        if server.process.poll() is None:
            assert server.stop() == 0


@pytest.fixture(scope="module")
def apache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], ApacheRocketMQ]]:
    """The script's record against RocketMQ's proxy (its timer delivery from the script's consumer)."""
    with started_rocketmq(
        tmp_path_factory,
        "apache-differential",
        broker_overrides=APACHE_BROKER_AUTH,
        clean_stop=False,
        proxy_overrides=APACHE_PROXY_AUTH,
    ) as rocketmq:
        rocketmq.create(*(TopicSpec(name, 2, kind) for name, kind in TOPICS), GroupSpec(GROUP))
        record = _script(rocketmq.proxy_endpoint, rocketmq.run_dir / "python-home")
        record["timer_delivery"] = _timer_delivery(record)
        yield record, rocketmq


def test_the_endpoint_answers_the_client_script_as_rocketmqs_proxy_does(
    ours: tuple[dict[str, Any], Server], apache: tuple[dict[str, Any], ApacheRocketMQ]
) -> None:
    found = differences(ours[0], apache[0])
    unexplained = {path: pair for path, pair in found.items() if known(path) is None}
    assert unexplained == {}, "differences (ours, RocketMQ's) not listed in docs/endpoint.md"
    stale = [prefix for prefix in KNOWN_DIFFERENCES if not any(known(path) == prefix for path in found)]
    assert stale == [], "listed differences that are gone: take them out of KNOWN_DIFFERENCES and docs/endpoint.md"
    # what the comparison stands on: the script saw every kind of answer on both sides
    record = apache[0]
    assert record["check_back"]["checked"] and record["timer_delivery"] == {"delivered": True, "not_before_due": True}
    assert record["errors"]["commit_then_commit"]["code"] == "INTERNAL_SERVER_ERROR"
    assert record["sends"]["transaction_commit"]["receipt"]["transaction_id_is_the_message_id"]
    assert record["acl"]["raw_wrong_secret"] == "UNAUTHORIZED"  # RocketMQ did authenticate
    assert record["acl"]["wrong_secret_send"]["raised"], record["acl"]


# the differences of the Node.js receipts, by path: those of the Python client's
NODE_KNOWN_DIFFERENCES: Mapping[str, str] = {
    "delay.recall_handle": KNOWN_DIFFERENCES["sends.delay.receipt.recall_handle"],
}

NODE_SENDS = """
const { Producer } = require('rocketmq-client-nodejs');
const shape = (v) => v === undefined || v === null || v === '' ? 'absent'
  : typeof v === 'number' || typeof v === 'bigint' ? 'int'
  : /^[0-9A-F]+$/.test(v) ? 'hex' + v.length : 'text' + String(v).length;
(async () => {
  const [endpoints, normal, fifo, delay, accessKey, accessSecret] = process.argv.slice(2);
  const producer = new Producer({ endpoints, sessionCredentials: { accessKey, accessSecret } });
  await producer.startup();
  const sends = {
    normal: { topic: normal, tag: 'nodejs', keys: ['node-n'], body: Buffer.from('from node') },
    fifo: { topic: fifo, tag: 'nodejs', messageGroup: 'node-group', body: Buffer.from('from node') },
    delay: { topic: delay, tag: 'nodejs', delay: 2000, body: Buffer.from('from node') },
  };
  const record = {};
  for (const [kind, message] of Object.entries(sends)) {
    const receipt = await producer.send(message);
    record[kind] = {
      message_id: shape(receipt.messageId), transaction_id: shape(receipt.transactionId),
      recall_handle: shape(receipt.recallHandle), offset: shape(receipt.offset),
    };
  }
  await producer.shutdown();
  console.log(JSON.stringify(record));
  console.log('done');
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _node_sends(endpoint: str, home: Path) -> dict[str, Any]:
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "node_modules").exists():
        (home / "node_modules").symlink_to(NODE_CLIENT / "node_modules")
    (home / "sends.js").write_text(NODE_SENDS)
    names = [name for name, kind in TOPICS if kind != "TRANSACTION"]
    environment = {**os.environ, "HOME": str(home)}  # the client's log files go under $HOME/logs
    command = ["node", "sends.js", endpoint, *names, ACCESS_KEY, SECRET_KEY]
    done = subprocess.run(command, cwd=home, capture_output=True, text=True, timeout=120, env=environment)
    assert "done" in done.stdout.splitlines(), done.stdout[-2000:] + done.stderr[-2000:]
    record: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return record


@pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_CLIENT / "node_modules" / "rocketmq-client-nodejs").is_dir(),
    reason="needs Node.js and the npm package rocketmq-client-nodejs in build/node-client (tests/run.sh installs it)",
)
def test_the_nodejs_clients_receipts_have_the_same_shape_from_both(
    ours: tuple[dict[str, Any], Server], apache: tuple[dict[str, Any], ApacheRocketMQ], tmp_path: Path
) -> None:
    from_ours = _node_sends(ours[1].address, tmp_path / "ours")
    from_apache = _node_sends(apache[1].proxy_endpoint, tmp_path / "apache")
    found = differences(from_ours, from_apache)
    assert set(found) == set(NODE_KNOWN_DIFFERENCES), found
    normal = {"message_id": "hex34", "transaction_id": "hex34", "recall_handle": "absent", "offset": "int"}
    assert from_apache["normal"] == normal
