"""A real Apache RocketMQ 5 for the tests: a name server and a broker with its gRPC proxy in local mode
(one JVM, ``ProxyStartup -pm local``), run from the Maven Central jars of ``tests/apache/pom.xml``.

- :func:`ensure_jars` copies the jars into ``build/apache-rocketmq/lib`` with Maven (once per
  pinned version), :func:`ensure_driver` compiles ``tests/apache/Driver.java`` (the 4.x remoting
  client traffic driver) against them.
- :class:`ApacheRocketMQ` renders the configuration into a run directory, starts, stops (SIGTERM,
  a clean shutdown), kills (SIGKILL, a crash) and restarts the two processes on the same store,
  and runs the admin tool (:meth:`ApacheRocketMQ.mqadmin`) and the driver against them.
- :func:`parse_topic_status`, :func:`parse_consumer_progress`, :func:`parse_query_msg` and
  :func:`parse_query_msg_by_key` read the admin tool's tables.
- ``python -m tests.apache_rocketmq start --dir DIR`` runs one by hand: it prints the addresses as
  one JSON line and stays up until SIGTERM or SIGINT, then stops RocketMQ cleanly and exits 0.

Everything the processes write (store, logs, ``user.home``) stays in the run directory; the
servers listen on 127.0.0.1, except the three sockets RocketMQ binds to every address with no
setting to change it: the proxy's gRPC and remoting ports and the broker's HA port (see
:class:`Ports`). docs/apache.md tells what was learned running it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
APACHE_SOURCES = ROOT / "tests" / "apache"
POM = APACHE_SOURCES / "pom.xml"
DRIVER_SOURCE = APACHE_SOURCES / "Driver.java"
BUILD_DIR = ROOT / "build" / "apache-rocketmq"
LIB_DIR = BUILD_DIR / "lib"
DRIVER_DIR = BUILD_DIR / "driver"

CLUSTER = "DefaultCluster"
BROKER_NAME = "broker-a"
LOOPBACK = "127.0.0.1"

# RocketMQ's own messageDelayLevel (MessageStoreConfig): the table a broker uses unless its
# configuration names another; broker_settings makes every level 1 s instead.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

# java -Xmx for each process. The broker and proxy share one JVM in local mode.
NAMESRV_HEAP = "128m"
BROKER_HEAP = "512m"
# Direct memory of the broker JVM: the timer wheel keeps a 38,707,200-byte direct copy of its
# mapped file (2 x 7 days of 1 s slots, 32 bytes each), and the broker's Netty and the proxy's
# shaded gRPC Netty each pool direct buffers of their own; 192 MiB holds the three with room.
BROKER_DIRECT_MEMORY = "192m"
TOOL_HEAP = "256m"

START_DEADLINE_S = 180.0  # a loaded 2-core machine takes 10-40 s to start the broker
STOP_DEADLINE_S = 90.0  # two shutdown hooks run BrokerController.shutdown in local mode: 10-25 s
TOOL_DEADLINE_S = 120.0

# The JVM flags of every RocketMQ process. Serial GC: on a shared 2-core machine the broker's own
# work is small and G1's background threads would cost more CPU than they save. The
# --add-exports/--add-opens let the store reach sun.nio.ch.DirectBuffer (mlock of mapped files)
# and Netty its direct buffers on JDK 17.
_JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:-UseLargePages",
    "-XX:MaxMetaspaceSize=160m",
    "-XX:ReservedCodeCacheSize=64m",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.net.preferIPv4Stack=true",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
)
# Short-lived JVMs (the admin tool, the driver) compile with C1 only: C2 would cost them more CPU
# than it saves. The servers keep C2: the timer's flush loop (a byte-by-byte compare of its 38.7 MB
# wheel) costs about 0.4 s of CPU per flush in C1 code.
_SHORT_LIVED_FLAGS = ("-XX:TieredStopAtLevel=1",)


class HarnessError(RuntimeError):
    """RocketMQ could not be prepared, started, stopped or asked; the message says what and why."""


# ---------------------------------------------------------------------------------------------
# jars and the driver


def rocketmq_version() -> str:
    """The RocketMQ version the pom pins (its ``rocketmq.version`` property)."""
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    found = ElementTree.parse(POM).getroot().find("m:properties/m:rocketmq.version", namespace)
    if found is None or not (found.text or "").strip():
        raise HarnessError(f"{POM} has no <rocketmq.version> property")
    return (found.text or "").strip()


def _require(tool: str, why: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise HarnessError(f"`{tool}` is not on PATH: {why}")
    return path


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One preparer of ``build/apache-rocketmq`` at a time (two test workers may ask at once)."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with (BUILD_DIR / ".lock").open("a") as handle:
        fcntl.lockf(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(handle, fcntl.LOCK_UN)


def ensure_jars() -> Path:
    """The folder of every jar the pinned RocketMQ needs, copied there by Maven when missing.

    Runs ``mvn -B -q dependency:copy-dependencies`` on ``tests/apache/pom.xml`` when the folder's
    stamp (``build/apache-rocketmq/lib.stamp``: the pinned version and the pom's SHA-256) is
    absent or differs, i.e. on the first run and after the pin moved; the old jars are removed
    first. Maven's local repository (``~/.m2``) caches the downloads.

    Raises:
        HarnessError: ``java`` or ``mvn`` is not installed (naming which), or Maven failed (with
            the tail of its output).
    """
    _require("java", "Apache RocketMQ runs on a Java 17 runtime (Debian: openjdk-17-jdk-headless)")
    stamp = BUILD_DIR / "lib.stamp"
    wanted = f"{rocketmq_version()} {hashlib.sha256(POM.read_bytes()).hexdigest()}"
    with _build_lock():
        if stamp.is_file() and stamp.read_text().strip() == wanted and LIB_DIR.is_dir():
            return LIB_DIR
        mvn = _require("mvn", "the Apache RocketMQ jars are fetched from Maven Central with Maven (Debian: maven)")
        stamp.unlink(missing_ok=True)
        shutil.rmtree(LIB_DIR, ignore_errors=True)
        command = [
            mvn,
            "-B",
            "-q",
            "-Dstyle.color=never",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={LIB_DIR}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        version = rocketmq_version()
        missing = [
            name
            for name in ("namesrv", "broker", "proxy", "tools", "client")
            if not (LIB_DIR / f"rocketmq-{name}-{version}.jar").is_file()
        ]
        if done.returncode != 0 or missing:
            tail = (done.stdout + done.stderr)[-3000:]
            raise HarnessError(
                f"mvn dependency:copy-dependencies on {POM} failed (exit {done.returncode}; missing jars: "
                f"{missing or 'none'}):\n{tail}"
            )
        stamp.write_text(wanted + "\n")
    return LIB_DIR


def ensure_driver() -> Path:
    """The folder of the compiled ``Driver`` class, compiled with ``javac`` against the jars when
    its source or the jars changed since the last compilation.

    Raises:
        HarnessError: ``javac`` is missing or the compilation failed (with its errors).
    """
    lib = ensure_jars()
    stamp = DRIVER_DIR / "driver.stamp"
    wanted = hashlib.sha256(DRIVER_SOURCE.read_bytes() + (BUILD_DIR / "lib.stamp").read_bytes()).hexdigest()
    with _build_lock():
        if stamp.is_file() and stamp.read_text().strip() == wanted:
            return DRIVER_DIR
        javac = _require("javac", "the traffic driver is compiled with a JDK 17 (Debian: openjdk-17-jdk-headless)")
        shutil.rmtree(DRIVER_DIR, ignore_errors=True)
        DRIVER_DIR.mkdir(parents=True)
        command = [javac, "-nowarn", "-encoding", "UTF-8", "-cp", f"{lib}/*", "-d", str(DRIVER_DIR), str(DRIVER_SOURCE)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise HarnessError(f"javac {DRIVER_SOURCE.name} failed:\n{done.stdout}{done.stderr}")
        stamp.write_text(wanted + "\n")
    return DRIVER_DIR


def _extract_logback(lib: Path, jar: str, resource: str, target: Path) -> None:
    """Write the jar's logback file with its log folder, ``${user.home}/logs/rocketmqlogs``, turned
    into ``${rmq.log.dir}`` (the run's log folder, a JVM property), and its rescans off."""
    with zipfile.ZipFile(lib / jar) as archive:
        text = archive.read(resource).decode()
    home_logs = "${user.home}${file.separator}logs${file.separator}rocketmqlogs"
    if home_logs not in text:
        raise HarnessError(f"{jar}!/{resource} no longer logs under {home_logs}: the log redirect needs a new rule")
    text = text.replace(home_logs, "${rmq.log.dir}").replace('scan="true"', 'scan="false"')
    target.write_text(text)


# ---------------------------------------------------------------------------------------------
# ports


@dataclass(frozen=True)
class Ports:
    """The TCP ports of one RocketMQ: the name server's, the broker's ``listenPort`` and the proxy's.

    The broker also listens on ``broker - 2`` (its "fast" VIP channel, on 127.0.0.1) and on
    ``broker + 1`` (HA replication). Three sockets bind to every address (0.0.0.0) and no setting
    changes that: the broker's HA port (``DefaultHAService`` binds ``new InetSocketAddress(port)``),
    and the proxy's gRPC (``NettyServerBuilder.forPort``) and remoting ports (a fresh
    ``NettyServerConfig``, whose bind address is 0.0.0.0). Every client here connects through
    127.0.0.1 all the same.
    """

    namesrv: int
    broker: int
    proxy_grpc: int
    proxy_remoting: int

    def loopback_only(self) -> tuple[int, ...]:
        """The ports bound to 127.0.0.1 only."""
        return (self.namesrv, self.broker - 2, self.broker)

    def every_address(self) -> tuple[int, ...]:
        """The ports bound to 0.0.0.0."""
        return (self.broker + 1, self.proxy_grpc, self.proxy_remoting)


def _port_free(port: int, host: str) -> bool:
    """Whether a server socket could bind ``host:port`` now (with SO_REUSEADDR, as Netty's do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def taken_ports(ports: Ports) -> list[int]:
    """The ports of ``ports`` some socket holds (0.0.0.0 is checked for those RocketMQ binds there)."""
    taken = [p for p in ports.loopback_only() if not _port_free(p, LOOPBACK)]
    return taken + [p for p in ports.every_address() if not _port_free(p, "0.0.0.0")]


# Candidates below Linux's ephemeral range (32768-60999), so that no outgoing connection takes one
# between the check and the bind; the process id spreads concurrent pickers apart.
_PORT_LOW, _PORT_HIGH = 20000, 32000


def pick_ports() -> Ports:
    """Free ports for one RocketMQ, checked free (a taken port can still be taken by another process
    before RocketMQ binds it: :meth:`ApacheRocketMQ.start` then tries new ones)."""
    span = _PORT_HIGH - _PORT_LOW - 8
    start = (os.getpid() * 7919 + time.monotonic_ns() // 1000) % span
    for step in range(0, span, 8):
        base = _PORT_LOW + (start + step) % span
        ports = Ports(namesrv=base, broker=base + 3, proxy_grpc=base + 5, proxy_remoting=base + 6)
        if not taken_ports(ports):
            return ports
    raise HarnessError(f"no free ports between {_PORT_LOW} and {_PORT_HIGH}")


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((LOOPBACK, port)) == 0


# ---------------------------------------------------------------------------------------------
# the name server, asked over RocketMQ's remoting protocol

GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
_opaque = itertools.count(1)
_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def remoting_call(address: str, code: int, fields: Mapping[str, str] | None = None, timeout_s: float = 3.0) -> Any:
    """One request over RocketMQ's remoting protocol (a length-prefixed frame, a JSON header, a body)
    to ``address``; the response body parsed as JSON, None when it has none.

    fastjson's bare integer keys (``{0:"127.0.0.1:10911"}``) are quoted first.

    Raises:
        HarnessError: the response's code is not SUCCESS (its code and remark named).
        OSError: the connection failed.
    """
    header = json.dumps(
        {
            "code": code,
            "flag": 0,
            "language": "JAVA",
            "opaque": next(_opaque),
            "serializeTypeCurrentRPC": "JSON",
            "version": 513,  # MQVersion.Version.V5_5_0's ordinal, as 5.5.0's own clients send it
            "extFields": dict(fields or {}),
        }
    ).encode()
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
        conn.sendall(struct.pack(">ii", 4 + len(header), len(header)) + header)
        (length,) = struct.unpack(">i", _read_exactly(conn, 4))
        frame = _read_exactly(conn, length)
    header_length = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
    answer = json.loads(frame[4 : 4 + header_length])
    body = frame[4 + header_length :]
    if answer.get("code") != 0:
        raise HarnessError(f"{address} answered request {code} with code {answer.get('code')}: {answer.get('remark')}")
    return json.loads(_BARE_KEY.sub(r'\1"\2"\3', body.decode())) if body else None


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = conn.recv(size - len(chunks))
        if not chunk:
            raise OSError(errno.ECONNRESET, "the name server closed the connection mid-frame")
        chunks += chunk
    return bytes(chunks)


# ---------------------------------------------------------------------------------------------
# the admin tool's tables


@dataclass(frozen=True)
class QueueStatus:
    """One row of ``topicStatus``: a queue's first and next offsets (max is one past the last)."""

    broker: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_updated: str


@dataclass(frozen=True)
class QueueProgress:
    """One row of ``consumerProgress -g``: a queue's next offset, the group's committed offset
    (its next message to consume), their difference, and the messages in flight (POP)."""

    topic: str
    broker: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    diff: int
    inflight: int
    last_time: str


def _rows(text: str, header: str) -> list[list[str]]:
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(header))
    except StopIteration:
        raise HarnessError(f"no table starting with {header!r} in the admin tool's output:\n{text[-2000:]}") from None
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def parse_topic_status(text: str) -> list[QueueStatus]:
    """The queues of ``mqadmin topicStatus -t TOPIC`` (``#Broker Name #QID #Min Offset #Max Offset
    #Last Updated``), in the tool's order."""
    return [
        QueueStatus(row[0], int(row[1]), int(row[2]), int(row[3]), " ".join(row[4:]))
        for row in _rows(text, "#Broker Name")
    ]


def parse_consumer_progress(text: str) -> list[QueueProgress]:
    """The queues of ``mqadmin consumerProgress -g GROUP [-t TOPIC]`` (``#Topic #Broker Name #QID
    #Broker Offset #Consumer Offset #Diff #Inflight #LastTime``): the group's topics, its
    ``%RETRY%`` topic included."""
    return [
        QueueProgress(
            row[0], row[1], int(row[2]), int(row[3]), int(row[4]), int(row[5]), int(row[6]), " ".join(row[7:])
        )
        for row in _rows(text, "#Topic")
    ]


def parse_query_msg(text: str) -> dict[str, str]:
    """The ``Name: value`` lines of ``queryMsgById`` / ``queryMsgByUniqueKey`` for one message
    (``OffsetID``, ``Topic``, ``Tags``, ``Keys``, ``Queue ID``, ``Queue Offset``, ``CommitLog
    Offset``, ``Reconsume Times``, ``Born Timestamp``, ``Store Timestamp``, ``Born Host``,
    ``Store Host``, ``System Flag``, ``Properties``, ``Message Body Path``), up to its
    ``MessageTrack`` lines; ``Tags`` and ``Keys`` without their brackets."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith(("MessageTrack", "WARN")) and found:
            break
        name, colon, value = line.partition(":")
        if colon and name and not name.startswith((" ", "\t")) and name.strip() not in found:
            found[name.strip()] = value.strip()
    for bracketed in ("Tags", "Keys"):
        if bracketed in found:
            found[bracketed] = found[bracketed].removeprefix("[").removesuffix("]")
    if "Queue Offset" not in found:
        raise HarnessError(f"no message in the admin tool's output:\n{text[-2000:]}")
    return found


FAILED = re.compile(r"command failed|Exception:|\[error\]")
"""What the admin tool prints when a command failed: ``... command failed``, an exception or
``[error]``."""


def check_mqadmin(command: Sequence[str], output: str) -> None:
    """Raise when the output of ``mqadmin command`` says it failed.

    Raises:
        HarnessError: the output holds :data:`FAILED`.
    """
    if FAILED.search(output):
        raise HarnessError(f"mqadmin {' '.join(command)} failed:\n{output[-4000:]}")


UNSENT = re.compile(r"Remoting(SendRequest|Connect)Exception")
"""An admin request that never reached its server (the client's channel failed to connect or to
write, seen on a loaded machine): the command is run again, since the server did nothing."""

UNSENT_TRIES = 3
"""Runs of an admin command whose request :data:`UNSENT` matches, before its output is taken."""

NO_MESSAGE = "but no message"
"""What ``queryMsgById`` prints for an id the broker's index does not hold (yet)."""


def remove_body_file(found: Mapping[str, str]) -> None:
    """Remove the body file ``queryMsgById`` wrote (``/tmp/rocketmq/msgbodys/<id>``, a path fixed in
    its code) for the parsed message ``found``, and the two folders when they are left empty."""
    body = Path(found.get("Message Body Path", ""))
    if body.is_absolute() and body.parent == Path("/tmp/rocketmq/msgbodys"):
        body.unlink(missing_ok=True)
        for folder in (body.parent, body.parent.parent):
            with contextlib.suppress(OSError):
                folder.rmdir()


def parse_query_msg_by_key(text: str) -> list[tuple[str, int, int]]:
    """(unique key, queue id, queue offset) of each message ``queryMsgByKey -t -k`` found."""
    return [(row[0], int(row[1]), int(row[2])) for row in _rows(text, "#Message ID")]


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create: its queue count (read and write), its ``message.type`` attribute
    (NORMAL, FIFO, DELAY, TRANSACTION: the proxy refuses a gRPC send of another type) and whether
    it is ordered."""

    name: str
    queues: int = 4
    message_type: str | None = None
    order: bool = False


@dataclass(frozen=True)
class GroupSpec:
    """A subscription group to create: ``orderly`` makes a FIFO group for gRPC consumers (a
    SimpleConsumer then receives a message group's messages one at a time, in order)."""

    name: str
    orderly: bool = False
    retry_max_times: int = 16


# ---------------------------------------------------------------------------------------------
# the configuration


def _properties(values: Mapping[str, object]) -> str:
    return "".join(f"{name}={value}\n" for name, value in values.items())


def broker_settings(run_dir: Path, ports: Ports) -> dict[str, object]:
    """The broker's ``broker.conf``: a single master on 127.0.0.1 with a small store and fast test
    timings. Every non-default value says why."""
    store = run_dir / "store"
    return {
        "brokerClusterName": CLUSTER,
        "brokerName": BROKER_NAME,
        "brokerId": 0,
        "brokerRole": "ASYNC_MASTER",
        "flushDiskType": "ASYNC_FLUSH",
        "namesrvAddr": f"{LOOPBACK}:{ports.namesrv}",
        # the addresses the broker registers and writes into every record's store host
        "brokerIP1": LOOPBACK,
        "brokerIP2": LOOPBACK,
        "listenPort": ports.broker,
        "bindAddress": LOOPBACK,
        "storePathRootDir": store,
        "storePathCommitLog": store / "commitlog",
        # Commit log files of 1 MiB (RocketMQ's default is 1 GiB): a few thousand small messages
        # roll over into the next file (the blank marker the lake's ingest must read), and the
        # store stays small. The largest message must fit in one file, hence maxMessageSize.
        "mappedFileSizeCommitLog": 1 << 20,
        "maxMessageSize": 256 << 10,
        "mappedFileSizeConsumeQueue": 30_000 * 20,  # 30,000 units of 20 bytes
        "mappedFileSizeTimerLog": 4 << 20,
        "mappedFileSizeConsumeQueueExt": 1 << 20,
        "mapperFileSizeBatchConsumeQueue": 1_000_000,
        "compactionMappedFileSize": 4 << 20,
        "compactionCqMappedFileSize": 1 << 20,
        "maxHashSlotNum": 50_000,  # index files of 4.2 MB instead of 420 MB
        "maxIndexNum": 200_000,
        # auto-created topics and groups for 4.x clients (gRPC clients still need topics made)
        "autoCreateTopicEnable": "true",
        "autoCreateSubscriptionGroup": "true",
        "enablePropertyFilter": "true",
        "timerWheelEnable": "true",
        # The timer's flush compares its whole 38.7 MB wheel byte by byte: about 12 % of a core
        # at the default 1 s. Every 10 s it costs about 1 %; after a crash the timer replays the
        # last 10 s of its log from the checkpoint.
        "timerFlushIntervalMs": 10_000,
        # Every delay level is 1 s: a 4.x consumer's retry N waits level 3 + N, so retries (and
        # the delay-level sends of the tests) take about 1 s each instead of 10 s to 2 h.
        "messageDelayLevel": " ".join(["1s"] * 18),
        # first check-back of a half message after transactionTimeOut, then every interval
        "transactionTimeOut": 2_000,
        "transactionCheckInterval": 1_000,
        "transactionCheckMax": 5,
        # 5.5.0 (apache/rocketmq#10966): TransactionalOpBatchService busy-loops a core once a
        # transaction's op context has been idle past transactionOpBatchInterval. An op batch of
        # 1 writes each commit/rollback marker at once, and an interval of 24.8 days keeps the
        # idle path from ever being taken. Wanted anyway: with the default 3 s batching a
        # rolled-back half message is still checked back (its op not yet written).
        "transactionOpMsgMaxSize": 1,
        "transactionOpBatchInterval": 2_147_483_647,
        # fewer threads on a small machine
        "sendMessageThreadPoolNums": 2,
        "pullMessageThreadPoolNums": 4,
        "litePullMessageThreadPoolNums": 2,
        "processReplyMessageThreadPoolNums": 2,
        "queryMessageThreadPoolNums": 2,
        "adminBrokerThreadPoolNums": 4,
        "clientManageThreadPoolNums": 4,
        "consumerManageThreadPoolNums": 4,
        "loadBalanceProcessorThreadPoolNums": 4,
        "ackMessageThreadPoolNums": 4,
        "endTransactionThreadPoolNums": 4,
        "recoverThreadPoolNums": 4,
    }


def proxy_settings(ports: Ports) -> dict[str, object]:
    """The proxy's ``rmq-proxy.json`` (local mode: it starts the broker in its own JVM)."""
    return {
        "rocketMQClusterName": CLUSTER,
        "proxyMode": "local",
        "namesrvAddr": f"{LOOPBACK}:{ports.namesrv}",
        "grpcServerPort": ports.proxy_grpc,
        "remotingListenPort": ports.proxy_remoting,
        "localServeAddr": LOOPBACK,  # the address it tells clients and heartbeats, not the host's IP
        "grpcThreadPoolNums": 4,
        "grpcWorkerLoopNum": 2,
        "enablePrintJstack": "false",
        "grpcShutdownTimeSeconds": 3,
        # a SimpleConsumer may ask for an invisible duration of 1 s (default minimum 10 s), so an
        # unacknowledged message of the tests comes back soon
        "minInvisibleTimeMillsForRecv": 1000,
    }


# ---------------------------------------------------------------------------------------------
# the processes


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    output: Path
    output_start: int  # the output file's size when the process started: what it wrote comes after

    def alive(self) -> bool:
        return self.popen.poll() is None


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path.name}: absent)"
    return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])


class ApacheRocketMQ:
    """One Apache RocketMQ 5: a name server and a broker with the gRPC proxy in local mode, with
    everything they write under ``run_dir`` (``conf/``, ``store/``, ``logs/``, ``home/`` as their
    ``user.home``).

    Contract:

    - :meth:`start` renders the configuration, starts the name server and then the broker with
      the proxy, and returns once the name server answers, the broker is registered there under
      its address and the proxy's ports accept connections; or raises :class:`HarnessError` with
      the last log lines after ``START_DEADLINE_S`` (or at once when a process exits). Nothing
      is left running when it raises. Ports are picked once, free, and kept across restarts.
    - :meth:`stop` sends SIGTERM (the broker's clean shutdown: it flushes, persists its config
      files and deletes ``store/abort``) and waits; :meth:`kill` sends SIGKILL (a crash: ``abort``
      stays, and the next start recovers the store as after a power cut, except that the page
      cache kept every write). :meth:`restart` does either, then :meth:`start` on the same store.
    - As a context manager it starts and always stops; :meth:`stop` and :meth:`kill` do nothing
      when nothing runs.
    """

    def __init__(
        self,
        run_dir: Path,
        ports: Ports | None = None,
        broker_overrides: Mapping[str, object] | None = None,
        proxy_overrides: Mapping[str, object] | None = None,
    ) -> None:
        """``ports``: fixed ports (else free ones are picked); ``broker_overrides``: broker.conf
        settings that replace or add to :func:`broker_settings`; ``proxy_overrides`` the same for
        the proxy's ``rmq-proxy.json`` (:func:`proxy_settings`)."""
        self.run_dir = run_dir.resolve()
        self.ports = ports or pick_ports()
        self.broker_overrides = dict(broker_overrides or {})
        self.proxy_overrides = dict(proxy_overrides or {})
        self._explicit_ports = ports is not None
        self._namesrv: _Process | None = None
        self._broker: _Process | None = None
        self.starts = 0
        self.cpu_seconds_of_stopped = 0.0  # CPU of the server processes that have exited

    # -- where things are

    @property
    def conf_dir(self) -> Path:
        return self.run_dir / "conf"

    @property
    def store_dir(self) -> Path:
        """The broker's ``storePathRootDir``: ``commitlog/``, ``consumequeue/``, ``config/``, ``abort``, ``lock``."""
        return self.run_dir / "store"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def home_dir(self) -> Path:
        """``user.home`` of every JVM here, and ``HOME`` for the Python client."""
        return self.run_dir / "home"

    @property
    def namesrv_address(self) -> str:
        return f"{LOOPBACK}:{self.ports.namesrv}"

    @property
    def broker_address(self) -> str:
        return f"{LOOPBACK}:{self.ports.broker}"

    @property
    def proxy_endpoint(self) -> str:
        """The proxy's gRPC endpoint, for RocketMQ 5 clients."""
        return f"{LOOPBACK}:{self.ports.proxy_grpc}"

    @property
    def abort_file(self) -> Path:
        """Present while the broker runs and after a crash (it holds the broker's pid); deleted by a clean stop."""
        return self.store_dir / "abort"

    def addresses(self) -> dict[str, object]:
        """What a client needs, as one JSON-able mapping."""
        return {
            "namesrv": self.namesrv_address,
            "broker": self.broker_address,
            "proxy_grpc": self.proxy_endpoint,
            "proxy_remoting": f"{LOOPBACK}:{self.ports.proxy_remoting}",
            "store": str(self.store_dir),
            "logs": str(self.log_dir),
            "version": rocketmq_version(),
        }

    def running(self) -> bool:
        return any(p is not None and p.alive() for p in (self._namesrv, self._broker))

    def pids(self) -> list[int]:
        return [p.popen.pid for p in (self._namesrv, self._broker) if p is not None and p.alive()]

    def cpu_seconds(self) -> float:
        """CPU seconds the server processes used so far, those of earlier runs included."""
        return self.cpu_seconds_of_stopped + sum(_cpu_seconds(pid) for pid in self.pids())

    def store_locked(self) -> bool:
        """Whether a process holds the broker's lock on ``store/lock`` (``FileChannel.tryLock``,
        an fcntl lock: only ``lockf``/``fcntl`` see it, ``flock`` does not)."""
        lock = self.store_dir / "lock"
        if not lock.exists():
            return False
        with lock.open("r+b") as handle:
            try:
                fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError as err:
                if err.errno in (errno.EAGAIN, errno.EACCES):
                    return True
                raise
            fcntl.lockf(handle, fcntl.LOCK_UN, 1, 0)
        return False

    # -- configuration

    def _render(self) -> None:
        lib = ensure_jars()
        for folder in (self.conf_dir, self.store_dir, self.log_dir, self.home_dir):
            folder.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "namesrv.properties").write_text(
            _properties(
                {
                    "listenPort": self.ports.namesrv,
                    "bindAddress": LOOPBACK,
                    "kvConfigPath": self.home_dir / "namesrv" / "kvConfig.json",
                }
            )
        )
        broker = broker_settings(self.run_dir, self.ports) | self.broker_overrides
        (self.conf_dir / "broker.conf").write_text(_properties(broker))
        proxy = proxy_settings(self.ports) | self.proxy_overrides
        (self.conf_dir / "rmq-proxy.json").write_text(json.dumps(proxy, indent=2) + "\n")
        version = rocketmq_version()
        # With every jar on one class path, RocketMQ's logback lookup would find the proxy's file
        # first for every process: each process is given its own.
        for module in ("namesrv", "proxy", "tools"):
            target = self.conf_dir / f"rmq.{module}.logback.xml"
            if not target.exists():
                _extract_logback(lib, f"rocketmq-{module}-{version}.jar", f"rmq.{module}.logback.xml", target)

    def java_command(
        self, main: str, heap: str, logback: str, *args: str, extra: Sequence[str] = (), short_lived: bool = False
    ) -> list[str]:
        """A ``java`` command line for ``main`` on the jars, with ``user.home``, ``rocketmq.home.dir``
        (without it NamesrvStartup and BrokerStartup exit with -2) and the logs in the run directory."""
        return [
            _require("java", "Apache RocketMQ runs on a Java 17 runtime"),
            f"-Xms{heap}" if not short_lived else "-Xms32m",
            f"-Xmx{heap}",
            *_JVM_FLAGS,
            *(_SHORT_LIVED_FLAGS if short_lived else ()),
            f"-Duser.home={self.home_dir}",
            f"-Drocketmq.home.dir={self.home_dir}",
            f"-Drmq.log.dir={self.log_dir}",
            f"-Drmq.logback.configurationFile={logback}",
            *extra,
            "-cp",
            f"{LIB_DIR}/*",
            main,
            *args,
        ]

    def _spawn(self, name: str, command: list[str]) -> _Process:
        output = self.log_dir / f"{name}.out"
        with output.open("ab") as sink:
            start = sink.tell()
            popen = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        return _Process(name, popen, output, start)

    # -- lifecycle

    def start(self, deadline_s: float = START_DEADLINE_S) -> ApacheRocketMQ:
        """Start both processes and wait until RocketMQ is ready (see the class contract).

        Raises:
            HarnessError: a port is taken (after three tries with new ports when they were picked
                here), a process exited, or the deadline passed; the last log lines are in it.
        """
        if self.running():
            raise HarnessError(f"RocketMQ of {self.run_dir} is already running (pids {self.pids()})")
        for attempt in itertools.count(1):
            self._render()
            taken = taken_ports(self.ports)
            if taken and (self._explicit_ports or self.starts > 0 or attempt >= 3):
                raise HarnessError(f"ports {taken} of {self.ports} are taken")
            if taken:
                self.ports = pick_ports()
                continue
            try:
                self._start_processes(deadline_s)
            except _PortRace:
                self._kill_all()
                if self._explicit_ports or self.starts > 0 or attempt >= 3:
                    raise HarnessError(f"a port of {self.ports} was taken while RocketMQ started") from None
                self.ports = pick_ports()
                continue
            except BaseException:
                self._kill_all()
                raise
            self.starts += 1
            return self
        raise AssertionError("unreachable")

    def _start_processes(self, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        self._namesrv = self._spawn(
            "namesrv",
            self.java_command(
                "org.apache.rocketmq.namesrv.NamesrvStartup",
                NAMESRV_HEAP,
                str(self.conf_dir / "rmq.namesrv.logback.xml"),
                "-c",
                str(self.conf_dir / "namesrv.properties"),
                extra=["-XX:MaxDirectMemorySize=64m"],
            ),
        )
        self._wait(deadline, "the name server answering", self._namesrv_ready, self._namesrv)
        self._broker = self._spawn(
            "broker",
            self.java_command(
                "org.apache.rocketmq.proxy.ProxyStartup",
                BROKER_HEAP,
                str(self.conf_dir / "rmq.proxy.logback.xml"),
                "-pm",
                "local",
                "-bc",
                str(self.conf_dir / "broker.conf"),
                "-pc",
                str(self.conf_dir / "rmq-proxy.json"),
                "-n",
                self.namesrv_address,
                extra=[f"-XX:MaxDirectMemorySize={BROKER_DIRECT_MEMORY}"],
            ),
        )
        self._wait(deadline, "the broker registered in the name server", self.broker_registered, self._broker)
        for port in (self.ports.proxy_grpc, self.ports.proxy_remoting):
            self._wait(deadline, f"the proxy's port {port}", functools.partial(_port_open, port), self._broker)

    def _namesrv_ready(self) -> bool:
        try:
            remoting_call(self.namesrv_address, GET_BROKER_CLUSTER_INFO, timeout_s=1.0)
        except (OSError, HarnessError):
            return False
        return True

    def cluster_info(self) -> dict[str, Any]:
        """The name server's ``GET_BROKER_CLUSTER_INFO`` answer: ``brokerAddrTable`` (broker name
        -> ``brokerAddrs`` by broker id) and ``clusterAddrTable``."""
        info = remoting_call(self.namesrv_address, GET_BROKER_CLUSTER_INFO)
        return info if isinstance(info, dict) else {}

    def broker_registered(self) -> bool:
        """Whether the name server lists this broker, as master, at its address."""
        try:
            table = self.cluster_info().get("brokerAddrTable", {})
        except (OSError, HarnessError):
            return False
        return bool(table.get(BROKER_NAME, {}).get("brokerAddrs", {}).get("0") == self.broker_address)

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        """The name server's route of ``topic`` (``queueDatas``, ``brokerDatas``), None when it has none."""
        try:
            route = remoting_call(self.namesrv_address, GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        except HarnessError as err:
            if "code 17" in str(err):  # TOPIC_NOT_EXIST
                return None
            raise
        return route if isinstance(route, dict) else None

    def wait_for_route(self, topic: str, deadline_s: float = 30.0) -> dict[str, Any]:
        """The route of ``topic`` once the name server has it (a topic the broker created
        registers itself there a moment later)."""
        deadline = time.monotonic() + deadline_s
        while (route := self.topic_route(topic)) is None:
            if time.monotonic() > deadline:
                raise HarnessError(f"the name server has no route of {topic} after {deadline_s} s")
            time.sleep(0.05)
        return route

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool], process: _Process) -> None:
        while not ready():
            if self._bind_failed(process):
                raise _PortRace()
            if not process.alive():
                raise HarnessError(
                    f"{process.name} exited with {process.popen.returncode} before {what}\n{self._logs_tail(process)}"
                )
            if time.monotonic() > deadline:
                raise HarnessError(f"waited in vain for {what}\n{self._logs_tail(process)}")
            time.sleep(0.2)

    def _bind_failed(self, process: _Process) -> bool:
        try:
            with process.output.open("rb") as output:
                output.seek(process.output_start)
                return b"Address already in use" in output.read()
        except OSError:
            return False

    def _logs_tail(self, process: _Process) -> str:
        logs = [process.output]
        if process.name == "namesrv":
            logs.append(self.log_dir / "namesrv.log")
        else:
            logs += [self.log_dir / "broker.log", self.log_dir / "proxy.log"]
        return "\n".join(_tail(path) for path in logs)

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> None:
        """SIGTERM the broker (and proxy), then the name server, each waited for; a no-op when
        nothing runs.

        Raises:
            HarnessError: a process outlived the deadline (it is then killed), or the broker
                exited but left ``store/abort`` (not a clean shutdown).
        """
        broker_was_running = self._broker is not None and self._broker.alive()
        late = [
            p.name
            for p in (self._broker, self._namesrv)
            if p is not None and not self._end(p, signal.SIGTERM, deadline_s)
        ]
        self._broker = self._namesrv = None
        if late:
            raise HarnessError(f"{late} did not stop within {deadline_s} s of SIGTERM and were killed")
        if broker_was_running and self.abort_file.exists():
            raise HarnessError(
                f"the broker exited on SIGTERM but left {self.abort_file}\n{_tail(self.log_dir / 'broker.log')}"
            )

    def kill(self) -> None:
        """SIGKILL both processes (a crash) and reap them; a no-op when nothing runs."""
        self._kill_all()

    def _kill_all(self) -> None:
        for process in (self._broker, self._namesrv):
            if process is not None:
                self._end(process, signal.SIGKILL, 30.0)
        self._broker = self._namesrv = None

    def _end(self, process: _Process, signum: signal.Signals, deadline_s: float) -> bool:
        """Signal and reap ``process``; False when SIGTERM was not enough (it was killed)."""
        if not process.alive():
            process.popen.wait()
            return True
        cpu = _cpu_seconds(process.popen.pid)
        with contextlib.suppress(ProcessLookupError):
            process.popen.send_signal(signum)
        try:
            process.popen.wait(timeout=deadline_s)
            clean = True
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait(timeout=30)
            clean = False
        self.cpu_seconds_of_stopped += cpu  # the shutdown's own CPU is not counted
        return clean

    def restart(self, crash: bool = False) -> ApacheRocketMQ:
        """:meth:`kill` (``crash``) or :meth:`stop`, then :meth:`start` on the same store and ports."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    def __enter__(self) -> ApacheRocketMQ:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            self._kill_all()

    # -- the admin tool

    def mqadmin(self, *args: str, check: bool = True, timeout_s: float = TOOL_DEADLINE_S) -> str:
        """Run ``mqadmin ARGS -n <name server>`` (``MQAdminStartup``) and return its output (stdout
        then stderr); its logs go to the run's log folder.

        A request that never reached its server (:data:`UNSENT`) is made again.

        Raises:
            HarnessError: with ``check``, it exited non-zero or printed a failure
                (``... command failed``, an exception); the output is in the message.
        """
        _require("java", "the admin tool runs on Java")
        self._render()
        command = self.java_command(
            "org.apache.rocketmq.tools.command.MQAdminStartup",
            TOOL_HEAP,
            str(self.conf_dir / "rmq.tools.logback.xml"),
            *args,
            "-n",
            self.namesrv_address,
            short_lived=True,
        )
        for _ in range(UNSENT_TRIES):
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
            output = done.stdout + done.stderr
            if not UNSENT.search(output):
                break
        failed = done.returncode != 0 or FAILED.search(output)
        if check and failed:
            raise HarnessError(f"mqadmin {' '.join(args)} failed (exit {done.returncode}):\n{output[-4000:]}")
        return output

    def mqadmin_many(self, *commands: Sequence[str], check: bool = True) -> list[str]:
        """Run several admin commands (each ``mqadmin ARGS`` without ``-n``) in one JVM, the driver's
        ``mqadmin`` steps: the admin tool's own ``MQAdminStartup.main0``, without a JVM start per
        command (6-10 s each on a loaded machine). Their outputs, in order; the body files
        ``queryMsgById`` writes are removed. A command whose request never reached its server
        (:data:`UNSENT`) is run again.

        Raises:
            HarnessError: with ``check``, a command printed a failure (``... command failed``, an
                exception); its output is in the message.
        """
        outputs: list[str] = [""] * len(commands)
        pending = list(range(len(commands)))
        for _ in range(UNSENT_TRIES):
            lines = self.driver(*(["mqadmin", *commands[i]] for i in pending))
            for i, line in zip(pending, (line for line in lines if line["event"] == "mqadmin"), strict=True):
                outputs[i] = line["output"]
            pending = [i for i in pending if UNSENT.search(outputs[i])]
            if not pending:
                break
        for output in outputs:  # queryMsgById's body files (see :meth:`query_msg_by_id`)
            for path in re.findall(r"^Message Body Path:\s*(\S+)", output, re.MULTILINE):
                remove_body_file({"Message Body Path": path})
        for command, output in zip(commands, outputs, strict=True):
            if check:
                check_mqadmin(command, output)
        return outputs

    def create(self, *specs: TopicSpec | GroupSpec) -> None:
        """Create or update topics and subscription groups on the broker (one driver run: the
        admin API ``mqadmin updateTopic``/``updateSubGroup`` call, in one JVM instead of one per
        item), then wait until the name server has each topic's route."""
        steps: list[list[str]] = []
        for spec in specs:
            if isinstance(spec, TopicSpec):
                step = ["topic", f"name={spec.name}", f"queues={spec.queues}", f"order={str(spec.order).lower()}"]
                steps.append(step + ([f"type={spec.message_type}"] if spec.message_type else []))
            else:
                orderly = str(spec.orderly).lower()
                steps.append(
                    ["group", f"name={spec.name}", f"orderly={orderly}", f"retryMaxTimes={spec.retry_max_times}"]
                )
        self.driver(*steps)
        for spec in specs:
            if isinstance(spec, TopicSpec):
                self.wait_for_route(spec.name)

    def topic_status(self, topic: str) -> list[QueueStatus]:
        return parse_topic_status(self.mqadmin("topicStatus", "-t", topic))

    def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """``consumerProgress -g GROUP`` (``-t TOPIC`` is needed for POP groups, which have no
        ``%RETRY%GROUP`` topic)."""
        args = ["consumerProgress", "-g", group] + (["-t", topic] if topic else [])
        return parse_consumer_progress(self.mqadmin(*args))

    def query_msg_by_id(self, topic: str, message_id: str) -> dict[str, str]:
        """``queryMsgById -t TOPIC -i ID`` (a client's message id), parsed.

        The tool writes the body to ``/tmp/rocketmq/msgbodys/<id>``, a path fixed in its code;
        that file is removed again, and the two folders when they are left empty.
        """
        found = parse_query_msg(self.mqadmin("queryMsgById", "-t", topic, "-i", message_id))
        remove_body_file(found)
        return found

    # -- the traffic driver (4.x remoting client) and the Python client

    def driver_command(self, *steps: Sequence[str]) -> list[str]:
        """The command of ``tests/apache/Driver.java`` with ``steps`` (each a command and its
        ``name=value`` options; see the driver's usage) against this name server."""
        classes = ensure_driver()
        args: list[str] = []
        for step in steps:
            args += [*(["--"] if args else []), *step]
        return [
            _require("java", "the driver runs on Java"),
            "-Xms32m",
            "-Xmx256m",
            *_JVM_FLAGS,
            *_SHORT_LIVED_FLAGS,
            f"-Duser.home={self.home_dir}",
            f"-Drocketmq.log.root={self.log_dir / 'client'}",
            "-Drmq.logback.configurationFile=rmq.client.logback.xml",
            # a new consumer's queues are assigned at its next rebalance: every second, not 20 s
            "-Drocketmq.client.rebalance.waitInterval=1000",
            "-cp",
            f"{LIB_DIR}/*{os.pathsep}{classes}",
            "Driver",
            self.namesrv_address,
            *args,
        ]

    def driver(self, *steps: Sequence[str], timeout_s: float = 180.0) -> list[dict[str, Any]]:
        """Run the driver to its end; its JSON lines.

        Raises:
            HarnessError: it exited non-zero or did not end with ``done`` (its output in the message).
        """
        done = subprocess.run(
            self.driver_command(*steps), capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0 or not done.stdout.rstrip().endswith("done"):
            raise HarnessError(
                f"the driver failed (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def start_driver(self, *steps: Sequence[str]) -> DriverProcess:
        """Start the driver in the background (for ``flood``, which sends until its standard
        input closes): see :class:`DriverProcess`."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return DriverProcess(self.driver_command(*steps), self.log_dir / "driver.err")

    def client_environment(self) -> dict[str, str]:
        """The environment for a Python RocketMQ 5 client process: ``HOME`` in the run directory
        (the client creates ``~/logs/rocketmq_python`` when it is imported)."""
        home = self.run_dir / "python-home"
        home.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "HOME": str(home)}


class DriverProcess:
    """The driver running in the background: its JSON lines are collected as they come.

    :meth:`finish` closes its standard input (a ``flood`` step then stops sending), waits for it
    and returns every line; the process is killed if it outlives the deadline, and always when
    used as a context manager that exits by an error.
    """

    def __init__(self, command: list[str], stderr: Path) -> None:
        self.stderr = stderr
        with stderr.open("a") as sink:
            self.popen = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sink, text=True
            )
        self._lines: list[dict[str, Any]] = []
        self._tail: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._lock:
                if line.startswith("{"):
                    self._lines.append(json.loads(line))
                else:
                    self._tail = [*self._tail[-20:], line.rstrip()]

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The lines so far (of one ``event`` kind)."""
        with self._lock:
            return [line for line in self._lines if event is None or line.get("event") == event]

    def wait_for(self, condition: Callable[[DriverProcess], bool], what: str, deadline_s: float = 120.0) -> None:
        """Return once ``condition(self)`` holds; raise :class:`HarnessError` naming ``what`` when
        the deadline passes or the driver exits first."""
        deadline = time.monotonic() + deadline_s
        while not condition(self):
            if self.popen.poll() is not None:
                raise HarnessError(f"the driver exited ({self.popen.returncode}) before {what}: {self._tail}")
            if time.monotonic() > deadline:
                raise HarnessError(f"waited {deadline_s} s for {what}")
            time.sleep(0.05)

    def finish(self, deadline_s: float = 120.0) -> list[dict[str, Any]]:
        """Close standard input, wait for the driver's end and return its lines.

        Raises:
            HarnessError: it exited non-zero, without ``done``, or outlived the deadline (killed).
        """
        assert self.popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise HarnessError(f"the driver did not end within {deadline_s} s and was killed") from None
        self._reader.join(timeout=10)
        if self.popen.returncode != 0 or self._tail[-1:] != ["done"]:
            raise HarnessError(f"the driver failed (exit {self.popen.returncode}): {self._tail}\n{_tail(self.stderr)}")
        return self.events()

    def __enter__(self) -> DriverProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class _PortRace(Exception):
    """A RocketMQ process could not bind a port that was free a moment before."""


# ---------------------------------------------------------------------------------------------
# the command


def _serve(run_dir: Path) -> int:
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rocketmq = ApacheRocketMQ(run_dir)
    try:
        rocketmq.start()
        out: IO[str] = sys.stdout
        with contextlib.suppress(BrokenPipeError):
            out.write(json.dumps(rocketmq.addresses()) + "\n")
            out.flush()
        while not stopping.wait(1.0):
            if not rocketmq.running():
                print("RocketMQ exited by itself; see " + str(rocketmq.log_dir), file=sys.stderr)
                return 1
    finally:
        rocketmq.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.apache_rocketmq start --dir DIR``: run RocketMQ until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m tests.apache_rocketmq", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start a name server and a broker with its proxy; stop on SIGTERM")
    start.add_argument("--dir", type=Path, required=True, help="run directory: conf, store, logs, home")
    commands.add_parser("jars", help="copy the jars with Maven (when needed) and print their folder")
    options = parser.parse_args(argv)
    try:
        if options.command == "jars":
            print(ensure_jars())
            return 0
        return _serve(options.dir)
    except HarnessError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
