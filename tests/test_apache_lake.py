"""The lake held to Apache RocketMQ's own word (issue 33, items 3 and 4), on one real Apache
RocketMQ 5 for the module (tests/apache_rocketmq.py), with RocketMQ's own delay-level table.

While the 4.x Java client (tests/apache/Driver.java) and the official Python client
(tests/apache_grpc_client.py) send and consume (normal, ordered by key, batch, delay levels,
timer, FIFO, transactions with check-backs, push consumers of clustering and broadcasting groups,
one message failed into ``%DLQ%``, a POP consumer that leaves one unacknowledged),
``python -m broker_model ingest-store --follow`` tails the live store. Once the consumers have
committed and the lake has caught up, the admin tool's view is taken, the follower is stopped
and the nightly runs on the lake. Then:

- consume queues: the broker's own ``consumequeue/`` files against the rebuilt ones
  (``--verify-broker``), and ``topicStatus`` against the rebuilt queues' bounds;
- consumer offsets: ``consumerProgress`` of each group against ``consumer_offsets``;
- dead letters: the ``%DLQ%`` topic's ``topicStatus`` and ``queryMsgById`` against ``dlq``;
- transactions: what the clients were told, and answered to the check-backs, against
  ``transaction_state``;
- what the lake does not interpret (the POP revive log, the timer's files) is listed;
- the way back: a reset is refused while the broker runs and written into the stopped broker's
  store otherwise, and a real consumer resumes where it put the group.

The differences between the two, and why they stay, are in docs/apache.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_model.common import constants as c
from broker_model.store import read_table
from broker_model.store.segment_files import list_commitlog_files
from broker_model.store.store_configs import parse_fastjson
from broker_model.store.store_ingest import ingest_store, ingested_end, walk_commitlog
from jobs.nightly import NightlyConfig
from jobs.nightly import run as nightly
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as rebuild
from jobs.rebuild_consume_queue.verify import BROKER_PROBLEMS
from jobs.replay import build_config as build_replay_config
from jobs.replay import run as replay
from jobs.runs import JobRun
from schemas.catalog import (
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUME_QUEUE_INTEGRITY,
    CONSUMER_OFFSET_COMMITS,
    CONSUMER_OFFSETS,
    DLQ,
    RETRY_CHAINS,
    STORE_INGESTS,
    TOPIC_CONFIG,
    TRANSACTION_STATE,
)
from tests.apache_fixture import started_rocketmq
from tests.apache_rocketmq import (
    BROKER_NAME,
    DEFAULT_DELAY_LEVELS,
    NO_MESSAGE,
    ApacheRocketMQ,
    QueueProgress,
    QueueStatus,
    check_mqadmin,
    parse_consumer_progress,
    parse_query_msg,
    parse_topic_status,
)
from tests.helpers import ENGINE, wait_for, wait_until

pytestmark = [pytest.mark.subprocess, pytest.mark.apache, pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
BROKER = BROKER_NAME  # the lake's name of the ingested broker: the broker's own

Events = list[dict[str, Any]]

POISON = "jn-poison-0"
MAX_RECONSUME = 2
# (group, topic): consumerProgress with -t for a POP group (no %RETRY%<group> topic) and the
# transaction service's group; None: the group's every topic. Given its POP retry topic
# %RETRY%py-group_PyNormal, the tool asks for the route of %RETRY%py-group_%RETRY%py-group_PyNormal
# and fails: the retry queue's offset is compared with the broker's file instead (ingest).
PROGRESS: tuple[tuple[str, str | None], ...] = (
    ("j-consumer", None),
    ("j-orderly", None),
    ("j-cluster", None),
    ("py-group", "PyNormal"),
    ("py-group", "PyTimer"),
    ("py-group", "PyTx"),
    ("py-fifo", "PyFifo"),
    ("CID_RMQ_SYS_TRANS", "RMQ_SYS_TRANS_HALF_TOPIC"),
    ("CID_RMQ_SYS_TRANS", "RMQ_SYS_TRANS_OP_HALF_TOPIC"),
    ("CID_RMQ_SYS_REVIVE_GROUP", "rmq_sys_REVIVE_LOG_DefaultCluster"),
)
CONSUMING_GROUPS = ("j-consumer", "j-orderly", "j-cluster", "py-group", "py-fifo")  # done when their diff is 0
# the retry topics RocketMQ creates for subscribing groups, with no message in them
EMPTY_TOPICS = ("%RETRY%j-cluster", "%RETRY%j-orderly")


def _by(events: Events, event: str, **match: Any) -> Events:
    return [e for e in events if e["event"] == event and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheRocketMQ]:
    """RocketMQ with its own delay-level table: the lake computes a schedule queue's tags code
    (the delivery time) from that table, and the store does not say which one the broker used."""
    overrides = {"messageDelayLevel": DEFAULT_DELAY_LEVELS}
    with started_rocketmq(tmp_path_factory, "apache-lake", overrides, clean_stop=False) as started:
        yield started


# ---------------------------------------------------------------------------------------------
# the run: traffic while the follower ingests, the broker's view, the nightly


@dataclass(frozen=True)
class Refused:
    """A reset run against the store while its broker ran: its exit status and output, and whether
    the broker's offsets file and the lake's offset commits were the same after it."""

    returncode: int
    output: str
    file_unchanged: bool
    lake_unchanged: bool


@dataclass
class Observed:
    """What the module's run saw: the clients' lines, the admin tool's view once the consumers had
    committed and the lake had caught up, the follower's output and the jobs' runs."""

    lake: Path
    java: Events
    python: Events
    progress: dict[tuple[str, str | None], list[QueueProgress]]
    status: dict[str, list[QueueStatus]]
    dead_letter: dict[str, str]
    follower_code: int
    follower_lines: list[str]
    store_end: int
    nightly: JobRun
    verified: JobRun
    report_page: Path
    refused: Refused


def _traffic_steps() -> list[list[str]]:
    """The driver's run: the Python client's topics and the groups with settings first, then the
    push consumers, then every kind of send (see the driver's usage)."""
    py_topics = [("PyNormal", 4, "NORMAL"), ("PyFifo", 2, "FIFO"), ("PyTimer", 2, "DELAY"), ("PyTx", 2, "TRANSACTION")]
    return [
        *(["topic", f"name={name}", f"queues={queues}", f"type={kind}"] for name, queues, kind in py_topics),
        ["group", "name=py-group"],
        ["group", "name=py-fifo", "orderly=true"],
        ["group", "name=j-consumer", f"retryMaxTimes={MAX_RECONSUME}"],
        # 11 normal, 3 batch, 2 delay, 2 committed transactions; the poison message fails into %DLQ%
        [
            "consume",
            "group=j-consumer",
            "topics=JNormal,JBatch,JDelay,JTx",
            f"fail={POISON}",
            f"maxReconsume={MAX_RECONSUME}",
            "retryLevel=1",
            "expect=18",
        ],
        ["consume", "group=j-orderly", "topics=JOrder", "orderly=true", "expect=9"],
        ["consume", "group=j-broadcast", "topics=JNormal", "model=broadcasting", "instance=b1", "expect=12"],
        ["consume", "group=j-cluster", "topics=JNormal", "instance=c1", "groupExpect=12"],
        ["consume", "group=j-cluster", "topics=JNormal", "instance=c2", "groupExpect=12"],
        ["send", "topic=JNormal", "kind=normal", "count=11", "prefix=jn"],
        ["send", "topic=JNormal", "kind=normal", "count=1", "prefix=jn-poison"],
        ["send", "topic=JOrder", "kind=ordered", "count=9", "prefix=jo", "orderKeys=A,B,C"],
        ["send", "topic=JBatch", "kind=batch", "count=3", "prefix=jb"],
        ["send", "topic=JDelay", "kind=delay", "count=2", "prefix=jd", "level=2"],
        ["send", "topic=JTx", "kind=tx", "prefix=jt", "outcomes=commit,rollback,check-commit,check-rollback"],
        ["wait", "seconds=150"],
    ]


PYTHON_STEPS = (
    ["send", "PyNormal", "normal", "4", "pn"],
    ["send", "PyFifo", "fifo", "3", "pf"],
    ["send", "PyTimer", "timer", "2", "pt", "2"],
    ["send", "PyTx", "transaction", "1", "px"],
    ["receive", "py-group", "PyNormal", "4", "pn-1"],  # pn-1 comes back through the POP retry topic
    ["receive", "py-fifo", "PyFifo", "6"],
    ["receive", "py-group", "PyTimer", "2"],
    ["receive", "py-group", "PyTx", "2"],
)


def _python_client(rocketmq: ApacheRocketMQ) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.apache_grpc_client", rocketmq.proxy_endpoint]
    for step in PYTHON_STEPS:
        command += [*(["--"] if len(command) > 4 else []), *step]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=rocketmq.client_environment(),
    )


def _python_events(client: subprocess.Popen[str]) -> Events:
    """The client's lines once it ended by itself (killed when it outlives 300 s)."""
    try:
        out, err = client.communicate(timeout=300)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    assert client.returncode == 0 and out.rstrip().endswith("done"), out[-3000:] + err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


AdminView = tuple[dict[tuple[str, str | None], list[QueueProgress]], dict[str, list[QueueStatus]], dict[str, str]]
"""consumerProgress per (group, topic), topicStatus per topic, queryMsgById of the dead letter."""


def _admin_view(rocketmq: ApacheRocketMQ, poison_id: str) -> AdminView | None:
    """consumerProgress of :data:`PROGRESS`, topicStatus of every topic with a consume queue (and
    of :data:`EMPTY_TOPICS`) once the name server routes it, and queryMsgById of the dead letter,
    in one admin JVM; None while the broker's index holds no dead letter of that id (the poison
    message is still being retried, or its %DLQ% copy not yet indexed)."""
    topics = sorted({p.name for p in (rocketmq.store_dir / "consumequeue").iterdir()} | set(EMPTY_TOPICS))
    for topic in topics:  # a topic the broker made itself (a POP retry topic) is routed at its next registration
        rocketmq.wait_for_route(topic, deadline_s=90)
    commands = [["consumerProgress", "-g", g, *(["-t", t] if t else [])] for g, t in PROGRESS]
    commands += [["topicStatus", "-t", topic] for topic in topics]
    commands.append(["queryMsgById", "-t", "%DLQ%j-consumer", "-i", poison_id])
    outputs = rocketmq.mqadmin_many(*commands, check=False)
    for command, output in zip(commands[:-1], outputs[:-1], strict=True):
        check_mqadmin(command, output)
    if NO_MESSAGE in outputs[-1]:
        return None
    check_mqadmin(commands[-1], outputs[-1])
    progress_outputs, status_outputs = outputs[: len(PROGRESS)], outputs[len(PROGRESS) : -1]
    progress = {key: parse_consumer_progress(out) for key, out in zip(PROGRESS, progress_outputs, strict=True)}
    status = {topic: parse_topic_status(out) for topic, out in zip(topics, status_outputs, strict=True)}
    return progress, status, parse_query_msg(outputs[-1])


def _consumers_done(progress: dict[tuple[str, str | None], list[QueueProgress]]) -> bool:
    """Whether every consuming group has committed up to each queue's end."""
    rows = [row for (group, _), rows in progress.items() if group in CONSUMING_GROUPS for row in rows]
    return all(row.diff == 0 and row.inflight == 0 for row in rows)


def _latest_offsets(lake: Path) -> dict[tuple[str, str, int], int]:
    """(group, topic, queue id) -> the broker's latest offset commit in the lake."""
    rows = read_table(lake, CONSUMER_OFFSET_COMMITS, ["group", "topic", "queue_id", "offset", "commit_timestamp"])
    latest: dict[tuple[str, str, int], tuple[int, int]] = {}
    for row in rows.to_pylist():
        key = (row["group"], row["topic"], row["queue_id"])
        latest[key] = max((row["commit_timestamp"], row["offset"]), latest.get(key, (-1, -1)))
    return {key: offset for key, (_, offset) in latest.items()}


def _records_after(store_dir: Path, offset: int) -> int:
    """Records the store's commit log holds after ``offset`` (the walk of the ingest, nothing kept)."""
    walk = walk_commitlog(list_commitlog_files(store_dir / "commitlog"), offset, lambda table: None, BROKER)
    return walk.records


def _every(seconds: float, condition: Callable[[], bool]) -> Callable[[], bool]:
    """``condition``, evaluated at most once per ``seconds`` (False in between): a condition that
    reads the lake need not run 200 times a second."""
    last = [0.0]

    def throttled() -> bool:
        if time.monotonic() - last[0] < seconds:
            return False
        last[0] = time.monotonic()
        return condition()

    return throttled


def _traffic(rocketmq: ApacheRocketMQ) -> tuple[Events, Events]:
    """The driver's run and, once the driver made their topics, the Python client's, side by
    side; (the driver's lines, the Python client's lines)."""
    with rocketmq.start_driver(*_traffic_steps()) as driver:
        for topic in ("PyNormal", "PyFifo", "PyTimer", "PyTx"):
            rocketmq.wait_for_route(topic, deadline_s=120)
        python = _python_events(_python_client(rocketmq))
        return driver.finish(deadline_s=200), python


def _admin_view_once_consumed(rocketmq: ApacheRocketMQ, poison_id: str) -> AdminView:
    """:func:`_admin_view` once every consuming group has committed to the end of its queues and
    the poison message's dead letter is found by its id."""
    views: list[AdminView] = []

    def consumers_done() -> bool:
        view = _admin_view(rocketmq, poison_id)
        if view is None:
            return False
        views[:] = [view]
        return _consumers_done(view[0])

    wait_until(consumers_done, "the consumers' offsets at the end of their queues and the dead letter", 180)
    return views[0]


# alone the follower catches up within seconds; in a whole pass on 2 cores the admin view it was
# compared with once fell behind the broker's own revive offset for 300 s
LAKE_DEADLINE_S = 300
VIEW_PATIENCE_S = 30  # then the view is taken again


def _settled_view(rocketmq: ApacheRocketMQ, poison_id: str, lake: Path, log_path: Path) -> tuple[*AdminView, int]:
    """The admin view once the consumers are done, the lake caught up with it, and the broker still
    showing the same offsets after that; with the lake's end. The broker's own services (the POP
    revive, the transaction checks) may store records and commit offsets after a view is taken, so
    a view the lake has not reached within :data:`VIEW_PATIENCE_S` is taken again: the lake may be
    at the broker's later offsets, which that view never shows."""
    deadline = time.monotonic() + LAKE_DEADLINE_S
    view = _admin_view_once_consumed(rocketmq, poison_id)
    while True:
        left = deadline - time.monotonic()
        reached = _wait_for_the_lake(lake, rocketmq.store_dir, view[0], min(VIEW_PATIENCE_S, max(left, 0)))
        again = _admin_view_once_consumed(rocketmq, poison_id)
        if reached.end is not None and _offsets(again) == _offsets(view):
            return (*view, reached.end)
        if time.monotonic() > deadline:
            tail = "\n".join(log_path.read_text().splitlines()[-15:])
            raise AssertionError(
                f"waited {LAKE_DEADLINE_S} s for the follower's lake at the broker's offsets and log end: "
                f"{'; '.join(reached.behind[:20]) or 'the broker moved on'}\nthe follower's last lines:\n{tail}"
            )
        view = again


def _offsets(view: AdminView) -> list[object]:
    """The offsets of an admin view: consumerProgress's and topicStatus's, without their times."""
    progress, status, _ = view
    groups = [
        (key, [(r.topic, r.queue_id, r.broker_offset, r.consumer_offset) for r in rows])
        for key, rows in progress.items()
    ]
    topics = [(topic, [(q.queue_id, q.min_offset, q.max_offset) for q in queues]) for topic, queues in status.items()]
    return sorted([*groups, *topics], key=repr)


@dataclass(frozen=True)
class Reached:
    """Where the follower's lake stood against a view: its end once it held every offset of the
    view and the store no record after it (None before), and what still differed."""

    end: int | None
    behind: list[str]


def _wait_for_the_lake(
    lake: Path, store_dir: Path, progress: dict[tuple[str, str | None], list[QueueProgress]], patience_s: float
) -> Reached:
    """Wait at most ``patience_s`` until the follower's lake holds every offset of ``progress`` and
    the store no record after the lake's end."""
    behind: list[str] = []

    def caught_up() -> bool:
        end = ingested_end(lake, BROKER)
        after = 0 if end is None else _records_after(store_dir, end)
        latest = _latest_offsets(lake)
        rows = [(group, row) for (group, _), rows in progress.items() for row in rows]
        behind[:] = [
            f"{group} {row.topic}:{row.queue_id} lake {latest.get((group, row.topic, row.queue_id))} "
            f"broker {row.consumer_offset}"
            for group, row in rows
            if latest.get((group, row.topic, row.queue_id), 0) != row.consumer_offset
        ]
        if end is None or after:
            behind.insert(0, f"lake end {end}, {after} store records after it")
        return not behind

    if not wait_for(_every(0.5, caught_up), patience_s):
        return Reached(None, behind)
    return Reached(ingested_end(lake, BROKER) or 0, [])


@pytest.fixture(scope="module")
def observed(rocketmq: ApacheRocketMQ, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Observed:
    """The module's run: the traffic while ``ingest-store --follow`` tails the store, the admin
    tool's view once the consumers committed, the follower stopped (SIGTERM) once the lake caught
    up, a reset tried while the broker runs, then the nightly and ``--verify-broker`` while the
    broker stops cleanly (it stays stopped for the reset written for real)."""
    lake = tmp_path_factory.mktemp("apache-lake-lake") / "lake"
    follow = [sys.executable, "-m", "broker_model", "ingest-store", "--lake", str(lake), "--broker-name", BROKER]
    # the follower's output goes to a file: into a pipe read only at its end, a follower that ran
    # long enough to print more than the pipe holds would block on its next line, never catching up
    log_path = lake.parent / "follower.log"
    with log_path.open("w") as log:
        follower = subprocess.Popen(
            [*follow, "--follow", "--interval", "1", str(rocketmq.store_dir)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            java, python = _traffic(rocketmq)
            poison_id = next(e["msgId"] for e in _by(java, "sent", key=POISON))
            progress, status, dead_letter, store_end = _settled_view(rocketmq, poison_id, lake, log_path)
        finally:
            follower.terminate()
            follower.wait(timeout=120)
    output = log_path.read_text()
    refused = _refused_reset(rocketmq, lake)  # while the broker still runs
    out = tmp_path_factory.mktemp("apache-lake-report")
    with ThreadPoolExecutor(1) as stopper:  # the clean stop takes 13-25 s: beside the nightly
        stopped = stopper.submit(rocketmq.stop)
        nightly_run = nightly(spark, NightlyConfig(lake, out=out, engine=ENGINE))
        verified = rebuild(spark, RebuildConfig(lake, engine=ENGINE, verify_brokers=(BROKER,)))
        stopped.result()
    views = (progress, status, dead_letter, follower.returncode, output.splitlines(), store_end)
    return Observed(lake, java, python, *views, nightly_run, verified, out / "report.html", refused)


def _refused_reset(rocketmq: ApacheRocketMQ, lake: Path) -> Refused:
    assert rocketmq.running() and rocketmq.store_locked()
    offsets = rocketmq.store_dir / "config" / "consumerOffset.json"
    before, commits = offsets.read_bytes(), len(_rows(lake, CONSUMER_OFFSET_COMMITS))
    done = _reset(lake, rocketmq.store_dir)
    same_file, same_lake = offsets.read_bytes() == before, len(_rows(lake, CONSUMER_OFFSET_COMMITS)) == commits
    return Refused(done.returncode, done.stdout + done.stderr, same_file, same_lake)


def _rows(lake: Path, spec: Any, **match: Any) -> list[dict[str, Any]]:
    rows = read_table(lake, spec).to_pylist()
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


# ---------------------------------------------------------------------------------------------
# the follower


def test_the_follower_tailed_the_live_store_and_stopped_cleanly_on_sigterm(observed: Observed) -> None:
    assert observed.follower_code == 0, observed.follower_lines[-20:]
    stopped = f"ingest-store {BROKER!r}: stopped, ingested up to offset {observed.store_end}"
    assert observed.follower_lines[-1] == stopped
    ingests = _rows(observed.lake, STORE_INGESTS, broker_name=BROKER)
    assert len(ingests) >= 2  # runs of the follower while the traffic went on
    assert sum(r["records"] for r in ingests) == len(_rows(observed.lake, CONSUME_QUEUE)) > 0
    assert all(r["stop"] in ("END", "TORN") for r in ingests)
    assert observed.nightly.status == "SUCCEEDED", observed.nightly.message


# ---------------------------------------------------------------------------------------------
# consume queues


def test_the_brokers_own_consume_queues_are_the_rebuilt_ones(observed: Observed) -> None:
    counts = observed.verified.row_counts
    assert counts[f"verified {BROKER}"] == len(_rows(observed.lake, CONSUME_QUEUE)) > 0
    assert {p: counts[f"{BROKER} {p}"] for p in BROKER_PROBLEMS} == dict.fromkeys(BROKER_PROBLEMS, 0)
    assert _rows(observed.lake, CONSUME_QUEUE_INTEGRITY) == []  # nor any finding of the log itself


def test_topic_status_is_the_rebuilt_consume_queue_of_every_queue(observed: Observed) -> None:
    """topicStatus lists every read queue of a topic: one with rows has the rebuilt queue's first
    offset and end; an empty one 0 and 0, and the lake's topic configuration has it."""
    bounds: dict[tuple[str, int], tuple[int, int]] = {}
    for row in _rows(observed.lake, CONSUME_QUEUE, broker_name=BROKER):
        key = (row["topic"], row["queue_id"])
        low, high = bounds.get(key, (row["queue_offset"], row["queue_offset"] + 1))
        bounds[key] = (min(low, row["queue_offset"]), max(high, row["queue_offset"] + 1))
    configured = _configured_queue_counts(observed.lake, observed.nightly)
    compared = 0
    for topic, queues in observed.status.items():
        assert {q.queue_id for q in queues} == set(range(configured[topic])), topic
        for queue in queues:
            assert (queue.broker, queue.min_offset, queue.max_offset) == (
                BROKER,
                *bounds.get((topic, queue.queue_id), (0, 0)),
            ), (topic, queue.queue_id)
            compared += 1
    assert {topic for topic, _ in bounds} <= set(observed.status)  # every queue with rows was compared
    assert compared >= 50


def _configured_queue_counts(lake: Path, run: JobRun) -> dict[str, int]:
    """Each topic's queue count of the lake's latest topic configuration at the nightly's T."""
    as_of = int(str(run.parameters["as_of"]))
    latest: dict[str, tuple[int, int]] = {}
    for row in _rows(lake, TOPIC_CONFIG, broker_name=BROKER):
        if row["updated_timestamp"] <= as_of:
            latest[row["topic"]] = max((row["updated_timestamp"], row["queue_nums"]), latest.get(row["topic"], (-1, 0)))
    return {topic: queues for topic, (_, queues) in latest.items()}


# ---------------------------------------------------------------------------------------------
# consumer offsets


def test_consumer_progress_of_every_group_is_the_lakes_consumer_offsets(observed: Observed) -> None:
    lake_rows = {
        (r["group"], r["topic"], r["queue_id"]): r for r in _rows(observed.lake, CONSUMER_OFFSETS, broker_name=BROKER)
    }
    for (group, topic), rows in observed.progress.items():
        listed = {(r["topic"], r["queue_id"]) for key, r in lake_rows.items() if key[0] == group}
        shown = {(row.topic, row.queue_id) for row in rows}
        assert shown and listed >= shown, (group, topic)
        if topic is None:
            assert listed == shown, group  # the same queues: the group's topics and its retry topic
        else:
            assert {q for q in listed if q[0] == topic} == shown, (group, topic)
        for row in rows:
            mine = lake_rows[(group, row.topic, row.queue_id)]
            assert (mine["broker_offset"], mine["consumer_offset"] or 0, mine["diff"]) == (
                row.broker_offset,
                row.consumer_offset,
                row.diff,
            ), (group, row)
            assert mine["anomaly"] is None


def test_a_broadcasting_groups_offsets_are_kept_under_the_name_the_broker_gives_them(observed: Observed) -> None:
    """RocketMQ 5 keeps what its broadcasting consumers pulled as ``<topic>@<group>@broadcast``:
    the lake keeps the group as ``<group>@broadcast`` (consumerProgress has no view of it)."""
    rows = _rows(observed.lake, CONSUMER_OFFSETS, group="j-broadcast@broadcast")
    ends = {q.queue_id: q.max_offset for q in observed.status["JNormal"]}
    assert {r["queue_id"]: (r["consumer_offset"], r["diff"]) for r in rows} == {q: (end, 0) for q, end in ends.items()}


# ---------------------------------------------------------------------------------------------
# dead letters and retries


def test_the_dlq_table_is_the_dead_letter_topic_as_the_admin_tool_reports_it(observed: Observed) -> None:
    dead = _rows(observed.lake, DLQ, group="j-consumer")
    assert len(dead) == sum(q.max_offset - q.min_offset for q in observed.status["%DLQ%j-consumer"]) == 1
    letter, found = dead[0], observed.dead_letter
    properties = dict(letter["properties"])
    shown = dict(pair.split("=", 1) for pair in found["Properties"].strip("{}").split(", "))
    assert (found["OffsetID"], found["Topic"], found["Keys"]) == (letter["msg_id"], "%DLQ%j-consumer", POISON)
    assert int(found["Reconsume Times"]) == letter["reconsume_times"] == MAX_RECONSUME + 1
    assert shown["ORIGIN_MESSAGE_ID"] == letter["origin_msg_id"] == properties["ORIGIN_MESSAGE_ID"]
    assert shown["RETRY_TOPIC"] == letter["origin_topic"] == "JNormal"
    assert letter["reason"] == "MAX_RECONSUME_TIMES"
    attempts = [(a["topic"], a["reconsume_times"]) for a in letter["attempts"]]
    assert attempts == [("JNormal", 0), ("%RETRY%j-consumer", 1), ("%RETRY%j-consumer", 2)]


def test_the_pop_consumers_retry_is_a_consumed_chain_of_its_group(observed: Observed) -> None:
    """The message the POP consumer left unacknowledged came back through
    ``%RETRY%py-group_PyNormal`` and was acknowledged: its chain is py-group's, consumed."""
    [chain] = _rows(observed.lake, RETRY_CHAINS, origin_topic="PyNormal")
    nacked = next(e for e in _by(observed.python, "received", key="pn-1", acked=False))
    assert (chain["group"], chain["state"], chain["uniq_key"]) == ("py-group", "CONSUMED", nacked["message_id"])
    assert [a["topic"] for a in chain["attempts"]][-1] == "%RETRY%py-group_PyNormal"


# ---------------------------------------------------------------------------------------------
# transactions


def test_transaction_states_are_what_the_clients_were_told(observed: Observed) -> None:
    states = {r["uniq_key"]: r for r in _rows(observed.lake, TRANSACTION_STATE, broker_name=BROKER)}
    told = [
        (e["msgId"], e["outcome"], e["topic"], e["queueId"], e["queueOffset"], "driver-tx")
        for e in _by(observed.java, "sent", kind="tx")
    ]
    told += [
        (e["message_id"], e["outcome"], "PyTx", e["queue_id"], e["offset"], "PyTx")  # gRPC: the topic as group
        for e in _by(observed.python, "sent", kind="transaction")
    ]
    assert len(told) == len(states) == 8
    for uniq_key, outcome, topic, queue_id, half_offset, producer_group in told:
        state = states[uniq_key]
        expected = "COMMITTED" if outcome.endswith("commit") else "ROLLED_BACK"
        assert (state["state"], state["real_topic"]) == (expected, topic), uniq_key
        assert queue_id is None or state["real_queue_id"] == queue_id, uniq_key  # the Python client gives none
        assert (state["half_queue_offset"], state["producer_group"]) == (half_offset, producer_group), uniq_key
        assert (state["check_times"] >= 1) == outcome.startswith("check-"), uniq_key  # checked back, as answered
    answers = {e["key"]: e["answer"] for e in _by(observed.java, "checked")}
    assert answers == {"jt-2": "COMMIT_MESSAGE", "jt-3": "ROLLBACK_MESSAGE"}


# ---------------------------------------------------------------------------------------------
# what the lake does not interpret: listed, not lost


def test_the_pop_revive_log_and_the_timer_files_are_listed_as_not_interpreted(observed: Observed) -> None:
    page = observed.report_page.read_text()
    topics = page[page.index("RocketMQ 5 system topics: stored, not interpreted yet") :].split("</table>")[0]
    revive = "rmq_sys_REVIVE_LOG_DefaultCluster"
    messages = sum(q.max_offset - q.min_offset for q in observed.status[revive])
    [row] = [row for row in topics.split("<tr>") if revive in row]
    assert messages > 0 and "POP checkpoints and acks" in row and f"<td>{messages}</td>" in row

    latest = max(_rows(observed.lake, STORE_INGESTS, broker_name=BROKER), key=lambda r: r["commitlog_version"])
    unread = dict(latest["unread"])
    assert unread["timerwheel"] == (Path(latest["store_dir"]) / "timerwheel").stat().st_size > 0
    assert {"timerlog/", "config/timercheck", "index/"} <= set(unread)
    files = page[page.index("RocketMQ store files: kept by the broker, not read into the lake") :]
    assert "timerwheel" in files and "RocketMQ 5 timer wheel" in files and "timerlog/" in files


# ---------------------------------------------------------------------------------------------
# the way back: offsets written into the broker's own store


RESET = ("--group", "j-cluster", "--topic", "JNormal", "--to-offset", "1", "--execute")


def _reset(lake: Path, store_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "jobs", "reset_offsets", "--lake", str(lake), *RESET]
    return subprocess.run(
        [*command, "--broker-config", str(store_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def _resets(lake: Path) -> list[dict[str, Any]]:
    return _rows(lake, CONSUMER_OFFSET_COMMITS, group="j-cluster", source="reset")


def test_a_reset_is_refused_while_the_broker_holds_its_store_and_writes_nothing(observed: Observed) -> None:
    """Run by the module's run while the broker still held its store (``lock``)."""
    refused = observed.refused
    assert refused.returncode == 2 and "running broker" in refused.output, refused.output
    assert refused.file_unchanged and refused.lake_unchanged


def test_a_reset_written_into_the_stopped_store_is_where_a_real_consumer_resumes(
    rocketmq: ApacheRocketMQ, observed: Observed
) -> None:
    assert not rocketmq.running() and not rocketmq.store_locked()  # stopped cleanly by the module's run
    done = _reset(observed.lake, rocketmq.store_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (rocketmq.store_dir / "config" / "consumerOffset.json").read_text()
    ends = {q.queue_id: q.max_offset for q in observed.status["JNormal"]}
    assert parse_fastjson(text, "consumerOffset.json")["offsetTable"]["JNormal@j-cluster"] == {str(q): 1 for q in ends}
    assert sorted((r["queue_id"], r["offset"]) for r in _resets(observed.lake)) == [(q, 1) for q in sorted(ends)]
    mine = len(_rows(observed.lake, CONSUMER_OFFSET_COMMITS, group="j-cluster"))
    ingest_store(observed.lake, BROKER, rocketmq.store_dir)  # the file agrees with the lake on the reset
    assert len(_rows(observed.lake, CONSUMER_OFFSET_COMMITS, group="j-cluster")) == mine

    rocketmq.start()
    expected = sum(end - 1 for end in ends.values())
    events = rocketmq.driver(
        ["consume", "group=j-cluster", "topics=JNormal", "instance=resumed", f"expect={expected}"],
        ["wait", "seconds=120"],
    )
    consumed = [e for e in _by(events, "consumed", group="j-cluster") if e["topic"] == "JNormal"]
    first: dict[int, int] = defaultdict(lambda: 1 << 62)
    for event in consumed:
        first[event["queueId"]] = min(first[event["queueId"]], event["queueOffset"])
    assert dict(first) == {q: 1 for q, end in ends.items() if end > 1}  # each queue from the reset offset on
    assert {(e["queueId"], e["queueOffset"]) for e in consumed} == {
        (q, offset) for q, end in ends.items() for offset in range(1, end)
    }


# how late after its due time the broker may deliver on a busy machine: the schedule service scans
# each level's queue every 100 ms, the timer wheel reads its slots every second
DELIVERY_SLACK_MS = 15_000


def test_delayed_and_timer_messages_were_delivered_when_the_lake_says_they_were_due(observed: Observed) -> None:
    """Each delay-level message's schedule record has, in the rebuilt consume queue, the delivery
    time as its tags code (from the broker's delay-level table); the copy the broker put back into
    the real topic was stored at or after it, within the services' slack, and the push consumer
    got it after that. A timer message's record in the timer topic says its time (``TIMER_OUT_MS``);
    its delivered copy was stored at or after it, and the SimpleConsumer received it after that."""
    log = read_table(observed.lake, COMMITLOG, ["topic", "commit_log_offset", "store_timestamp", "properties"])
    units = read_table(observed.lake, CONSUME_QUEUE, ["topic", "commit_log_offset", "tags_code"]).to_pylist()
    due_of_unit = {r["commit_log_offset"]: r["tags_code"] for r in units if r["topic"] == c.SCHEDULE_TOPIC}
    waiting: dict[str, int] = {}  # key -> due time, from the schedule and timer records
    delivered: dict[str, list[int]] = defaultdict(list)  # key -> store times of the copies in real topics
    for row in log.to_pylist():
        properties = dict(row["properties"])
        key = properties.get(c.PROPERTY_KEYS)
        if key is None or not key.startswith(("jd-", "pt-")):  # the delayed sends (not the retries)
            continue
        if row["topic"] == c.SCHEDULE_TOPIC:
            waiting[key] = due_of_unit[row["commit_log_offset"]]
        elif row["topic"] == c.TIMER_TOPIC:
            waiting[key] = int(properties[c.PROPERTY_TIMER_OUT_MS])
        elif row["topic"] in ("JDelay", "PyTimer"):
            delivered[key].append(row["store_timestamp"])
    assert set(waiting) == {"jd-0", "jd-1", "pt-0", "pt-1"}
    received = {e["key"]: e["deliverTime"] for e in _by(observed.java, "consumed", topic="JDelay")}
    received |= {e["key"]: e["received_ms"] for e in _by(observed.python, "received", topic="PyTimer")}
    for key, due in waiting.items():
        stored = delivered[key]
        assert len(stored) == 1, (key, stored)  # one copy delivered
        assert due <= stored[0] <= due + DELIVERY_SLACK_MS, (key, due, stored[0])
        assert received[key] >= stored[0], key


def test_a_replay_of_the_ordered_topic_is_in_the_order_the_orderly_consumer_consumed(
    observed: Observed, spark: SparkSession, tmp_path: Path
) -> None:
    """``replay_ordered`` of ``JOrder`` (sent through a selector by order key) into a table, on a copy
    of the lake: per queue, the keys in replay order are the keys in the order the broker handed
    them to the orderly push consumer (its first delivery of each)."""
    lake, sink = tmp_path / "lake", tmp_path / "replayed"
    shutil.copytree(observed.lake, lake)
    args = ["--lake", str(lake), "--replay-id", "r1", "--topic", "JOrder", "--to-table", str(sink)]
    assert replay(spark, build_replay_config([*args, "--engine", ENGINE])).status == "SUCCEEDED"
    keys = {
        (r["broker_name"], r["commit_log_offset"]): dict(r["properties"]).get(c.PROPERTY_KEYS)
        for r in read_table(lake, COMMITLOG, ["broker_name", "commit_log_offset", "properties"]).to_pylist()
    }
    columns = ["source_queue_id", "source_broker_name", "source_commit_log_offset", "replay_batch", "replay_sequence"]
    rows = sorted(
        DeltaTable(str(sink)).to_pyarrow_table(columns=columns).to_pylist(),
        key=lambda r: (r["replay_batch"], r["replay_sequence"]),
    )
    replayed: dict[int, list[str]] = defaultdict(list)
    for row in rows:
        replayed[row["source_queue_id"]].append(keys[(row["source_broker_name"], row["source_commit_log_offset"])])
    consumed: dict[int, list[str]] = defaultdict(list)
    for event in _by(observed.java, "consumed", group="j-orderly"):
        if event["key"] not in consumed[event["queueId"]]:
            consumed[event["queueId"]].append(event["key"])
    assert sum(len(v) for v in replayed.values()) == 9
    assert dict(replayed) == dict(consumed)
