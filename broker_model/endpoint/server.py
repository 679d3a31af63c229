"""The endpoint's process: brokers of the lake started under their name locks, gRPC's asyncio server
in front of them on its own event loop, and a clean stop (the server drains, the brokers flush and
release their locks). See docs/endpoint.md.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow.compute as pc
from rocketmq.grpc_protocol import service_pb2_grpc

from broker_model.broker import Broker, BrokerConfig, FlushMode, PopService, TimerMessageService
from broker_model.broker.transaction import (
    TRANSACTION_CHECK_INTERVAL_MS,
    TRANSACTION_CHECK_MAX,
    TRANSACTION_TIMEOUT_MS,
    TransactionCheckService,
)
from broker_model.common import constants as c
from broker_model.common import parse_host, validate_name
from broker_model.endpoint.acl import Acl
from broker_model.endpoint.consumer import MIN_INVISIBLE_MS
from broker_model.endpoint.service import MessagingService
from broker_model.store import read_table
from schemas.catalog import BROKERS
from schemas.errors import ValidationError

DEFAULT_LISTEN = "127.0.0.1:8081"
BLOCKING_WORKERS = 16  # threads for what blocks: topic creation, ending transactions
MAX_INBOUND_BYTES = 130 * 1024 * 1024  # the proxy's grpcMaxInboundMessageSize: a batch of 4 MiB bodies fits


@dataclass(frozen=True)
class EndpointConfig:
    """What ``serve`` runs.

    Attributes:
        lake: the lake root.
        brokers: names of the brokers served (each takes its name lock).
        listen: ``host:port`` to listen on (loopback unless told otherwise); port 0 picks one.
        flush_mode: the brokers' flush mode.
        auto_create_topics: create an unknown topic on every broker instead of TOPIC_NOT_FOUND.
        grace_seconds: how long calls in flight may finish at stop.
        check_interval_ms: rounds of each broker's transaction check service
            (``transactionCheckInterval``).
        check_timeout_ms: a half message younger than this is not checked yet (``transactionTimeOut``).
        check_max: checks before a half message is discarded (``transactionCheckMax``).
        acl: an ACL file (:mod:`.acl`): requests must then be signed, and use only what their
            account may; None: no authentication.
        tls_cert: PEM certificate chain to serve TLS with (with ``tls_key``); None: plaintext.
        tls_key: PEM private key of ``tls_cert``.
        min_invisible_ms: the shortest invisible time a receive may ask for
            (``minInvisibleTimeMillsForRecv``, 10 s).

    Raises:
        ValidationError: no broker, a bad broker name or listen address.
    """

    lake: Path
    brokers: tuple[str, ...] = ("broker-a",)
    listen: str = DEFAULT_LISTEN
    flush_mode: FlushMode = "ASYNC_FLUSH"
    auto_create_topics: bool = False
    grace_seconds: float = 5.0
    check_interval_ms: int = TRANSACTION_CHECK_INTERVAL_MS
    check_timeout_ms: int = TRANSACTION_TIMEOUT_MS
    check_max: int = TRANSACTION_CHECK_MAX
    acl: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    min_invisible_ms: int = MIN_INVISIBLE_MS

    def __post_init__(self) -> None:
        if not self.brokers:
            raise ValidationError("--brokers", "", "names no broker", "e.g. --brokers broker-a,broker-b")
        for name in self.brokers:
            validate_name(name, "--brokers", c.GROUP_MAX_LENGTH)
        if len(set(self.brokers)) != len(self.brokers):
            raise ValidationError("--brokers", ",".join(self.brokers), "names a broker twice", "name each once")
        parse_host(self.listen, "--listen")
        for name, value in (
            ("--transaction-check-interval-ms", self.check_interval_ms),
            ("--transaction-timeout-ms", self.check_timeout_ms),
            ("--transaction-check-max", self.check_max),
        ):
            if value < 1:
                raise ValidationError(name, value, "is not a positive number", "e.g. the default")
        if self.min_invisible_ms < 0:
            raise ValidationError("--min-invisible-ms", self.min_invisible_ms, "is negative", "e.g. the default, 10000")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValidationError("--tls-cert", self.tls_cert, "and --tls-key go together", "give both or neither")


def store_hosts(lake: Path, names: Sequence[str]) -> dict[str, str]:
    """Each broker's store host: the one it last registered in ``brokers``, else
    ``127.0.0.<n>:10911`` by its place in ``names`` (as the workload gives them)."""
    rows = read_table(lake, BROKERS, ["broker_name", "store_host", "started_timestamp"])
    hosts = {}
    for index, name in enumerate(names):
        mine = rows.filter(pc.equal(rows["broker_name"], name))
        if mine.num_rows:
            latest = mine.sort_by([("started_timestamp", "descending")])
            hosts[name] = str(latest["store_host"][0].as_py())
        else:
            hosts[name] = f"127.0.0.{index + 1}:10911"
    return hosts


def serve(config: EndpointConfig, stop: threading.Event, ready: Callable[[str], None] | None = None) -> None:
    """Start the brokers and the server, call ``ready`` with the address listened on, serve until
    ``stop`` is set, then stop the server (calls in flight get ``grace_seconds``) and shut the
    brokers down (flush, release their name locks), whatever happened.

    Raises:
        BrokerLockedError: a broker name is held by another process (nothing is served).
        ValidationError: the address cannot be listened on.
    """
    acl = Acl.load(config.acl) if config.acl is not None else None
    credentials = _tls(config)
    started: list[Broker] = []
    pops: dict[str, PopService] = {}
    try:
        for name, host in store_hosts(config.lake, config.brokers).items():
            broker = Broker(BrokerConfig(config.lake, name, store_host=host, flush_mode=config.flush_mode))
            started.append(broker.start())
            TransactionCheckService(
                broker, config.check_timeout_ms, config.check_max, config.check_interval_ms
            ).start()  # attached: the broker's shutdown stops it first
            timer = TimerMessageService(broker).start()  # delivery times of delayed sends; POP records
            pops[name] = PopService(broker, timer).start()  # POP consumers, and the revive service
        served = {b.broker_name: b for b in started}
        asyncio.run(_serve_calls(config, served, pops, acl, credentials, stop, ready))
    finally:
        for broker in reversed(started):
            broker.shutdown()


async def _serve_calls(
    config: EndpointConfig,
    brokers: dict[str, Broker],
    pops: dict[str, PopService],
    acl: Acl | None,
    credentials: grpc.ServerCredentials | None,
    stop: threading.Event,
    ready: Callable[[str], None] | None,
) -> None:
    """Serve ``brokers`` on the running loop until ``stop`` is set, then stop the server (calls in
    flight get ``grace_seconds``).

    Raises:
        ValidationError: the address cannot be listened on.
    """
    loop = asyncio.get_running_loop()
    loop.set_default_executor(futures.ThreadPoolExecutor(BLOCKING_WORKERS, thread_name_prefix="endpoint"))
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_INBOUND_BYTES)])
    try:
        if credentials is None:
            port = server.add_insecure_port(config.listen)
        else:
            port = server.add_secure_port(config.listen, credentials)
    except RuntimeError:  # grpc refuses an address it cannot bind
        port = 0
    if port == 0:
        raise ValidationError("--listen", config.listen, "cannot be listened on", "choose a free host:port")
    address = f"{config.listen.rsplit(':', 1)[0]}:{port}"
    service = MessagingService(brokers, address, config.auto_create_topics, acl, pops, config.min_invisible_ms)
    service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
    await server.start()
    stopping = asyncio.Event()

    def wake() -> None:  # the stop is a threading event: signal handlers and tests set it
        while not stop.wait(0.5):
            if loop.is_closed():  # the server failed before a stop
                return
        try:
            loop.call_soon_threadsafe(stopping.set)
        except RuntimeError:  # the loop ended already (the server failed)
            pass

    threading.Thread(target=wake, name="endpoint-stop", daemon=True).start()
    try:
        if ready is not None:
            ready(address)
        await stopping.wait()
    finally:
        await server.stop(config.grace_seconds)
        service.close_consumer_calls()


def _tls(config: EndpointConfig) -> grpc.ServerCredentials | None:
    """The server's TLS credentials from the PEM files, None without them.

    Raises:
        ValidationError: a file cannot be read.
    """
    if config.tls_cert is None or config.tls_key is None:
        return None
    pems = []
    for option, path in (("--tls-key", config.tls_key), ("--tls-cert", config.tls_cert)):
        try:
            pems.append(Path(path).read_bytes())
        except OSError as err:
            raise ValidationError(option, str(path), f"cannot be read ({err.strerror})", "give a PEM file") from None
    return grpc.ssl_server_credentials([(pems[0], pems[1])])
