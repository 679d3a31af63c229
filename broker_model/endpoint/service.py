"""``apache.rocketmq.v2.MessagingService`` for producers, served from brokers of the lake with
RocketMQ 5's proxy semantics (``proxy/.../grpc/v2``: ``RouteActivity``, ``ClientActivity``,
``SendMessageActivity``). See docs/endpoint.md.

The protocol's messages are the generated code the official Python client publishes
(``rocketmq.grpc_protocol``, from apache/rocketmq-apis). The service runs on gRPC's asyncio server:
a call holds no thread while it waits for its commit or a client's next command, so that held
calls (streams, and the long polls of consumers) are not bounded by a thread pool; what blocks
(creating topics, ending transactions) runs in the loop's executor.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import grpc
from google.protobuf import timestamp_pb2 as pb_timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from broker_model.broker import Broker, InnerMessage, PendingPut, PopService, TopicConfig
from broker_model.broker.transaction import (
    EndTransactionRequest,
    LocalTransactionState,
    TransactionError,
    end_transaction,
)
from broker_model.common import constants as c
from broker_model.common import parse_host
from broker_model.endpoint.acl import Acl
from broker_model.endpoint.consumer import MIN_INVISIBLE_MS, ConsumerCalls
from broker_model.endpoint.convert import (
    PROPERTY_BORN_HOST,
    PROPERTY_BORN_TIMESTAMP,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TRACE_CONTEXT,
    SYSTEM_PROPERTIES,
    protocol_message,
)
from broker_model.endpoint.errors import RequestError
from broker_model.store import MessageExt
from schemas.errors import BrokerError, ValidationError

MAX_MESSAGE_GROUP_BYTES: Final = 64  # ProxyConfig.maxMessageGroupSize
MAX_DELAY_MS: Final = 24 * 3600 * 1000  # ProxyConfig.maxDelayTimeMills, 1 day (the broker's own limit is 3)
CLIENT_ID_HEADER: Final = "x-mq-client-id"  # every official client sends it; the proxy requires it
TRANSACTION_DATA_EXPIRE_MS: Final = 30_000  # ProxyConfig.transactionDataExpireMillis
TRANSACTION_DATA_MAX_NUM: Final = 15  # ProxyConfig.transactionDataMaxNum: entries kept per transaction id
# the message types this endpoint stores so far (unspecified is taken as normal, as the proxy does)
ACCEPTED_TYPES: Final = (pb.MESSAGE_TYPE_UNSPECIFIED, pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
_RESOLUTIONS: Final = {
    pb.COMMIT: LocalTransactionState.COMMIT_MESSAGE,
    pb.ROLLBACK: LocalTransactionState.ROLLBACK_MESSAGE,
    pb.TRANSACTION_RESOLUTION_UNSPECIFIED: LocalTransactionState.UNKNOW,
}
_SENDABLE_TYPES: Final = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
# the types a route's queues take, by the topic's message type (RouteActivity.parseTopicMessageType);
# a topic without one takes every type (docs/broker.md)
_ACCEPTED_BY_TYPE: Final[Mapping[str | None, tuple[int, ...]]] = {
    None: _SENDABLE_TYPES,
    "NORMAL": (pb.NORMAL,),
    "FIFO": (pb.FIFO,),
    "DELAY": (pb.DELAY,),
    "TRANSACTION": (pb.TRANSACTION,),
    "MIXED": _SENDABLE_TYPES,
}


def status(code: int = pb.OK, message: str = "OK") -> pb.Status:
    """A protocol ``Status``."""
    return pb.Status(code=code, message=message)


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def consistent_hash(key: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)``: the bucket of ``key`` among ``buckets``,
    which the proxy uses to put every message of one message group into one queue."""
    state = key & 0xFFFFFFFFFFFFFFFF
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        next_double = ((state >> 33) + 1) / float(1 << 31)  # ((int) (state >>> 33) + 1) / 2^31
        following = int((candidate + 1) / next_double)
        if 0 <= following < buckets:
            candidate = following
        else:
            return candidate


@dataclass(frozen=True)
class TransactionData:
    """Where the half message of a transaction is: its broker and commit log offset."""

    broker: Broker
    commit_log_offset: int
    expires: float  # time.monotonic() seconds


class TransactionDataTable:
    """The proxy's ``TransactionDataManager``: the half message each (producer group, transaction
    id) names, kept from the send (or the check-back) until the transaction is ended once, or for
    ``TRANSACTION_DATA_EXPIRE_MS``. The transaction id the client is told is the message id, so a
    second end, a late end or an id never told finds nothing here (and a restart forgets them all:
    the check-back ends those)."""

    def __init__(self, expire_ms: int = TRANSACTION_DATA_EXPIRE_MS) -> None:
        self.expire_s = expire_ms / 1000
        self._data: dict[tuple[str, str], list[TransactionData]] = {}  # oldest first
        self._lock = threading.Lock()

    def add(self, group: str, transaction_id: str, broker: Broker, commit_log_offset: int) -> None:
        """Keep where the half message of ``transaction_id`` is; drop what has expired."""
        now = time.monotonic()
        with self._lock:
            # every entry lives as long, and an id added again moves to the end: the oldest come first
            while self._data:
                oldest = next(iter(self._data))
                if self._data[oldest][-1].expires >= now:
                    break
                del self._data[oldest]
            found = self._data.pop((group, transaction_id), [])
            found.append(TransactionData(broker, commit_log_offset, now + self.expire_s))
            self._data[(group, transaction_id)] = found[-TRANSACTION_DATA_MAX_NUM:]

    def poll(self, group: str, transaction_id: str) -> TransactionData | None:
        """The newest unexpired half message of ``transaction_id``, taken out; None when there is none."""
        now = time.monotonic()
        with self._lock:
            found = self._data.get((group, transaction_id), [])
            while found and found[-1].expires < now:
                found.pop()
            data = found.pop() if found else None
            if not found:
                self._data.pop((group, transaction_id), None)
        return data


@dataclass(frozen=True)
class Queue:
    """A queue of a topic on one broker, with the topic's settings there."""

    broker: Broker
    queue_id: int
    config: TopicConfig

    @property
    def permission(self) -> int:
        """The route's permission of the queue, from the topic's (``RouteActivity``)."""
        readable, writable = self.config.perm & c.PERM_READ, self.config.perm & c.PERM_WRITE
        permission: int = pb.READ_WRITE if readable and writable else pb.READ if readable else pb.WRITE
        return permission if readable or writable else int(pb.NONE)

    @property
    def accepted_types(self) -> tuple[int, ...]:
        """The message types the route says the queue takes, from the topic's message type."""
        return _ACCEPTED_BY_TYPE[self.config.message_type]


class MessagingService(ConsumerCalls, service_pb2_grpc.MessagingServiceServicer):  # type: ignore[misc]
    """``MessagingService`` over ``brokers`` (by name): routes, clients and sends here, the
    consumer calls in :class:`~broker_model.endpoint.consumer.ConsumerCalls`.

    Args:
        brokers: the running brokers served, by name.
        advertised: the ``host:port`` clients reach this endpoint at (routes name it).
        auto_create_topics: an unknown topic is created on every broker (RocketMQ's
            ``autoCreateTopicEnable``) instead of answering TOPIC_NOT_FOUND.
        acl: when given, every request must carry a valid signature of one of its accounts,
            and use only topics that account may use (UNAUTHORIZED, FORBIDDEN).
        pops: each broker's POP service (by broker name), which consumers receive from.
        min_invisible_ms: the shortest invisible time a receive may ask for.
    """

    def __init__(
        self,
        brokers: Mapping[str, Broker],
        advertised: str,
        auto_create_topics: bool = False,
        acl: Acl | None = None,
        pops: Mapping[str, PopService] | None = None,
        min_invisible_ms: int = MIN_INVISIBLE_MS,
    ) -> None:
        self.brokers = dict(sorted(brokers.items()))
        self.advertised = advertised
        self.auto_create_topics = auto_create_topics
        self.acl = acl
        self._round_robin = itertools.count()
        self._lock = threading.Lock()
        self.transactions = TransactionDataTable()
        self._init_consumer_calls(pops or {}, min_invisible_ms)

    def _admit(self, context: grpc.aio.ServicerContext, topic: str | None = None) -> None:
        """Check the request's signature, and its account's right to ``topic`` (with an ACL), then
        that it names its client (``x-mq-client-id``), in the proxy's order (its authentication
        and authorization pipeline, then ``validateContext``).

        Raises:
            RequestError: UNAUTHORIZED, FORBIDDEN or CLIENT_ID_REQUIRED.
        """
        metadata = dict(context.invocation_metadata() or ())
        if self.acl is not None:
            account = self.acl.authenticate(metadata)
            if topic is not None:
                self.acl.authorize_topic(account, topic)
        if not str(metadata.get(CLIENT_ID_HEADER, "")).strip():
            raise RequestError(pb.CLIENT_ID_REQUIRED, f"{CLIENT_ID_HEADER}: the request names no client")

    # -- routes ------------------------------------------------------------------------------

    async def QueryRoute(
        self, request: rpc.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> rpc.QueryRouteResponse:
        try:
            topic = _topic_name(request.topic)
            self._admit(context, topic)
            queues = await self._queues(topic)
        except RequestError as err:
            return rpc.QueryRouteResponse(status=status(err.code, err.message))
        endpoints = self._endpoints(request.endpoints)
        message_queues = [
            pb.MessageQueue(
                topic=request.topic,
                id=queue.queue_id,
                permission=queue.permission,
                broker=pb.Broker(name=queue.broker.broker_name, id=0, endpoints=endpoints),
                accept_message_types=queue.accepted_types,
            )
            for queue in queues
        ]
        return rpc.QueryRouteResponse(status=status(), message_queues=message_queues)

    async def _queues(self, topic: str) -> list[Queue]:
        """Every broker's queues of ``topic`` (by broker name, then queue id), with its settings
        there (a broker applies an operator's change within a second, see
        :meth:`~broker_model.broker.controller.Broker.refresh_topics`).

        Raises:
            RequestError: TOPIC_NOT_FOUND (unless topics are created on first use).
        """
        due = [b for b in self.brokers.values() if b.topics_refresh_due()]
        if due:  # a look at the table (a read when it changed) off the loop
            await asyncio.to_thread(_refresh_topics, due)
        found = [(b, b.topic_config(topic)) for b in self.brokers.values()]
        if not any(config for _, config in found):
            if not self.auto_create_topics:
                raise RequestError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} not found on brokers {list(self.brokers)}")
            await asyncio.to_thread(self._create_topic, topic)  # a commit on every broker
            found = [(b, b.topic_config(topic)) for b in self.brokers.values()]
        return [Queue(broker, qid, config) for broker, config in found if config for qid in range(config.queue_nums)]

    async def _readable_brokers(self, topic: str) -> list[tuple[Broker, int, pb.MessageQueue]]:
        """Each broker with readable queues of ``topic``: the broker, its queue count, and the
        route's queue of id 0 there (a consumer's assignment names queues so).

        Raises:
            RequestError: TOPIC_NOT_FOUND.
        """
        readable: dict[str, tuple[Broker, int, pb.MessageQueue]] = {}
        for queue in await self._queues(topic):
            if queue.config.perm & c.PERM_READ and queue.broker.broker_name not in readable:
                route = pb.MessageQueue(
                    topic=pb.Resource(name=topic),
                    id=0,
                    permission=queue.permission,
                    broker=pb.Broker(name=queue.broker.broker_name, id=0, endpoints=self._endpoints(pb.Endpoints())),
                    accept_message_types=queue.accepted_types,
                )
                readable[queue.broker.broker_name] = (queue.broker, queue.config.queue_nums, route)
        return list(readable.values())

    def _create_topic(self, topic: str) -> None:
        with self._lock:
            for broker in self.brokers.values():
                broker.ensure_topic(topic)

    def _endpoints(self, asked: pb.Endpoints) -> pb.Endpoints:
        """The endpoints a route names: the ones the client asked through, else the advertised one."""
        if len(asked.addresses):
            return asked
        host, port = self.advertised.rsplit(":", 1)
        scheme = pb.IPv6 if ":" in host else pb.IPv4
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host.strip("[]"), port=int(port))])

    # -- clients -----------------------------------------------------------------------------

    async def Heartbeat(
        self, request: rpc.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> rpc.HeartbeatResponse:
        try:
            self._admit(context)
        except RequestError as err:
            return rpc.HeartbeatResponse(status=status(err.code, err.message))
        self.consumer_heartbeat(request, str(dict(context.invocation_metadata() or ())[CLIENT_ID_HEADER]))
        return rpc.HeartbeatResponse(status=status())

    async def NotifyClientTermination(
        self, request: rpc.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> rpc.NotifyClientTerminationResponse:
        try:
            self._admit(context)
        except RequestError as err:
            return rpc.NotifyClientTerminationResponse(status=status(err.code, err.message))
        return rpc.NotifyClientTerminationResponse(status=status())

    async def Telemetry(
        self, requests: AsyncIterator[rpc.TelemetryCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpc.TelemetryCommand]:
        """The client's settings in, the server's settings out (``ClientActivity.processClientSettings``);
        a producer's stream also carries the check-backs of its topics' open transactions
        (``RecoverOrphanedTransactionCommand``) while it lasts."""
        try:
            self._admit(context)
        except RequestError as err:
            yield rpc.TelemetryCommand(status=status(err.code, err.message))
            return
        stream = TelemetryStream(self.brokers, asyncio.get_running_loop(), self.transactions)

        async def read() -> None:
            try:
                async for command in requests:
                    if command.HasField("settings"):
                        stream.register(command.settings)
                        answer = await asyncio.to_thread(self._settings, command.settings)  # may read a table
                        stream.outbox.put_nowait(rpc.TelemetryCommand(status=status(), settings=answer))
            except Exception:  # the client went away: the stream ends
                pass
            finally:
                stream.outbox.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (command := await stream.outbox.get()) is not None:
                yield command
        finally:  # the stream ended, or the call was cancelled (the client left, the server stops)
            reader.cancel()
            stream.unregister()

    def _settings(self, client: pb.Settings) -> pb.Settings:
        settings = pb.Settings()
        settings.CopyFrom(client)
        if client.client_type == pb.PRODUCER:
            settings.publishing.max_body_size = c.MAX_MESSAGE_SIZE
            settings.publishing.validate_message_type = True
            settings.backoff_policy.max_attempts = 3
            backoff = settings.backoff_policy.exponential_backoff
            backoff.initial.FromMilliseconds(10)
            backoff.max.FromMilliseconds(1000)
            backoff.multiplier = 2.0
        elif client.client_type in (pb.SIMPLE_CONSUMER, pb.PUSH_CONSUMER):
            self.consumer_settings(client, settings)
        return settings

    # -- sending -----------------------------------------------------------------------------

    async def SendMessage(
        self, request: rpc.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> rpc.SendMessageResponse:
        try:
            if request.messages:
                self._admit(context, _topic_name(request.messages[0].topic))
            else:
                self._admit(context)
            queue, messages = await self._prepare(request.messages, context.peer())
            records = queue.broker.prepare_put(messages)
            put = queue.broker.try_submit_prepared(records)
            if put is None:  # the broker's lock is busy or it must re-read its log: not on the loop
                put = await asyncio.to_thread(queue.broker.submit_prepared, records)
            if queue.broker.config.flush_mode == "SYNC_FLUSH":
                await committed(put)
            result = put.result
        except RequestError as err:
            return rpc.SendMessageResponse(status=status(err.code, err.message))
        except ValidationError as err:
            return rpc.SendMessageResponse(status=status(pb.BAD_REQUEST, str(err)))
        except BrokerError as err:
            return rpc.SendMessageResponse(status=status(pb.INTERNAL_SERVER_ERROR, str(err)))
        entries = []
        for message, offset, commit_log_offset in zip(
            messages, result.queue_offsets, result.commit_log_offsets, strict=True
        ):
            message_id = message.properties[c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
            if message.sys_flag & c.TRANSACTION_PREPARED_TYPE:
                group = message.properties[c.PROPERTY_PRODUCER_GROUP]
                self.transactions.add(group, message_id, queue.broker, commit_log_offset)
            # the broker's transaction id of every send is the message id (SendMessageProcessor)
            entries.append(
                rpc.SendResultEntry(status=status(), message_id=message_id, transaction_id=message_id, offset=offset)
            )
        return rpc.SendMessageResponse(status=status(), entries=entries)

    async def EndTransaction(
        self, request: rpc.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> rpc.EndTransactionResponse:
        """Commit or roll back the half message the transaction id names (``EndTransactionActivity``):
        the producer group is the topic, as the proxy sends; a check's answer counts as one. A
        transaction id this endpoint does not hold (ended already, expired, never told) is the
        proxy's "cannot found transaction data": INTERNAL_SERVER_ERROR."""
        try:
            self._admit(context, _topic_name(request.topic))
            await asyncio.to_thread(self._end_transaction, request)  # it waits for its commits
        except RequestError as err:
            return rpc.EndTransactionResponse(status=status(err.code, err.message))
        except TransactionError as err:
            return rpc.EndTransactionResponse(status=status(pb.INVALID_TRANSACTION_ID, f"transaction_id: {err}"))
        return rpc.EndTransactionResponse(status=status())

    def _end_transaction(self, request: rpc.EndTransactionRequest) -> None:
        """Write the op (and final) records of the resolution.

        Raises:
            RequestError: INVALID_TRANSACTION_ID for an empty id; INTERNAL_SERVER_ERROR for an id
                this endpoint holds no half message of (ended already, expired, never told).
            TransactionError: the half message cannot take this resolution.
        """
        if not request.transaction_id.strip():
            raise RequestError(pb.INVALID_TRANSACTION_ID, "transaction_id: transaction id cannot be empty")
        data = self.transactions.poll(_topic_name(request.topic), request.transaction_id)
        if data is None:
            raise RequestError(
                pb.INTERNAL_SERVER_ERROR,
                f"transaction_id: cannot find transaction data of {request.transaction_id!r} (ended already, "
                f"or sent more than {TRANSACTION_DATA_EXPIRE_MS} ms ago: the check-back ends it)",
            )
        broker, offset = data.broker, data.commit_log_offset
        queue_offset = broker.store.half_queue_offset(offset)
        if queue_offset is None:
            broker.flush()
            queue_offset = broker.store.half_queue_offset(offset)
        if queue_offset is None:
            raise RequestError(pb.INVALID_TRANSACTION_ID, f"transaction_id: no half message at {offset}")
        end = EndTransactionRequest(
            producer_group=_topic_name(request.topic),
            tran_state_table_offset=queue_offset,
            commit_log_offset=offset,
            commit_or_rollback=_RESOLUTIONS.get(request.resolution, LocalTransactionState.UNKNOW),
            from_transaction_check=request.source == pb.SOURCE_SERVER_CHECK,
            msg_id=request.transaction_id,
            transaction_id=request.message_id,
        )
        end_transaction(broker, end)

    async def _prepare(self, messages: Sequence[pb.Message], peer: str) -> tuple[Queue, list[InnerMessage]]:
        """The queue and the broker messages of one send (``SendMessageActivity``).

        Raises:
            RequestError: an empty request, messages of several topics, an unknown topic, or a
                message the protocol refuses (see :func:`build_message`).
        """
        if not messages:
            raise RequestError(pb.MESSAGE_CORRUPTED, "messages: no message to send")
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise RequestError(pb.MESSAGE_CORRUPTED, "messages: topic in message is not same")
        queues = [q for q in await self._queues(_topic_name(topic)) if q.config.perm & c.PERM_WRITE]
        if not queues:
            raise RequestError(pb.FORBIDDEN, f"topic {topic.name!r}: no writable queue")
        built = [build_message(m, peer) for m in messages]
        group = messages[0].system_properties.message_group if len(messages) == 1 else ""
        if group:
            queue = queues[consistent_hash(java_hash(group), len(queues))]
        else:
            queue = queues[next(self._round_robin) % len(queues)]
        check_message_type(topic.name, queue.config.message_type, built[0].properties)  # that broker's type
        for message in built:
            message.queue_id = queue.queue_id
        return queue, built


def _refresh_topics(brokers: Sequence[Broker]) -> None:
    for broker in brokers:
        broker.refresh_topics()


def check_message_type(topic: str, topic_type: str | None, properties: Mapping[str, str]) -> None:
    """Refuse a message whose type the topic does not take, as the proxy's
    ``DefaultTopicMessageTypeValidator`` does: the message's type from its properties
    (``TopicMessageType.parseFromMessageProperty``), against the topic's; a topic without a type
    takes every type, a MIXED one every type. Retry and dead-letter topics are not checked.

    Raises:
        RequestError: MESSAGE_PROPERTY_CONFLICT_WITH_TYPE.
    """
    if topic_type is None or topic_type == "MIXED":
        return
    if topic.startswith((c.RETRY_GROUP_TOPIC_PREFIX, c.DLQ_GROUP_TOPIC_PREFIX)):
        return
    if properties.get(c.PROPERTY_TRANSACTION_PREPARED) == "true":
        kind = "TRANSACTION"
    elif any(name in properties for name in _DELAY_PROPERTIES):
        kind = "DELAY"
    elif PROPERTY_SHARDING_KEY in properties:
        kind = "FIFO"
    else:
        kind = "NORMAL"
    if kind != topic_type:
        raise RequestError(
            pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"TopicMessageType validate failed, the expected type is {topic_type}, but actual type is {kind}",
        )


_DELAY_PROPERTIES: Final = (
    c.PROPERTY_DELAY_TIME_LEVEL,
    c.PROPERTY_TIMER_DELIVER_MS,
    c.PROPERTY_TIMER_DELAY_SEC,
    c.PROPERTY_TIMER_DELAY_MS,
)


async def committed(put: PendingPut) -> None:
    """Return once the commit of ``put`` is done, holding no thread meanwhile.

    Raises:
        CommitFailedError: the commit failed; nothing of the put is stored.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake() -> None:  # in the committing thread: it must not raise
        try:
            loop.call_soon_threadsafe(_resolve, done)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    put.add_callback(wake)
    await done
    put.check()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled wait (the client left) is done already
        future.set_result(None)


def _topic_name(resource: pb.Resource) -> str:
    name: str = resource.name
    if not name or not name.strip():
        raise RequestError(pb.ILLEGAL_TOPIC, "topic.name: the topic cannot be empty")
    if len(name) > c.TOPIC_MAX_LENGTH or not _is_topic(name):
        raise RequestError(pb.ILLEGAL_TOPIC, f"topic.name: {name!r} is not a valid topic name")
    return name


def _is_topic(name: str) -> bool:
    return all(ch.isascii() and (ch.isalnum() or ch in "%|_-") for ch in name)


def _has_control(text: str) -> bool:
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text)


def build_message(message: pb.Message, peer: str) -> InnerMessage:
    """The broker message of a protocol message (``SendMessageActivity.buildMessage``), stored
    with the proxy's properties.

    Raises:
        RequestError: an unsupported message type, a body over the limit, a blank message id, a
            tag or key or group or user property the proxy refuses.
    """
    system = message.system_properties
    if not message.body:
        raise RequestError(pb.MESSAGE_BODY_EMPTY, "body: message body cannot be empty")
    if len(message.body) > c.MAX_MESSAGE_SIZE:
        raise RequestError(
            pb.MESSAGE_BODY_TOO_LARGE, f"body: {len(message.body)} bytes, the max is {c.MAX_MESSAGE_SIZE}"
        )
    if not system.message_id.strip():
        raise RequestError(pb.ILLEGAL_MESSAGE_ID, "system_properties.message_id: message id cannot be empty")
    properties: dict[str, str] = {}
    for key, value in message.user_properties.items():
        if key in SYSTEM_PROPERTIES:
            raise RequestError(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user_properties: {key!r} is used by system")
        if _has_control(key) or _has_control(value) or not key:
            raise RequestError(
                pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user_properties: {key!r} holds a control character or is empty"
            )
        properties[key] = value
    if system.tag:
        if not system.tag.strip() or "|" in system.tag or _has_control(system.tag):
            raise RequestError(pb.ILLEGAL_MESSAGE_TAG, f"system_properties.tag: {system.tag!r} is not a valid tag")
        properties[c.PROPERTY_TAGS] = system.tag
    for key in system.keys:
        if not key.strip() or _has_control(key):
            raise RequestError(pb.ILLEGAL_MESSAGE_KEY, f"system_properties.keys: {key!r} is not a valid key")
    if system.keys:
        properties[c.PROPERTY_KEYS] = c.KEY_SEPARATOR.join(system.keys)
    properties[c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = system.message_id
    properties[c.PROPERTY_RECONSUME_TIME] = str(system.delivery_attempt)
    properties[c.PROPERTY_PRODUCER_GROUP] = message.topic.name  # the proxy names the topic as the group
    if system.message_group:
        group = system.message_group
        if not group.strip() or len(group.encode()) >= MAX_MESSAGE_GROUP_BYTES or _has_control(group):
            raise RequestError(pb.ILLEGAL_MESSAGE_GROUP, f"system_properties.message_group: {group!r} is not valid")
        properties[PROPERTY_SHARDING_KEY] = group
    if system.message_type not in ACCEPTED_TYPES:
        kind = pb.MessageType.Name(system.message_type)
        raise RequestError(pb.UNSUPPORTED, f"system_properties.message_type: {kind} messages are not served yet")
    sys_flag = c.COMPRESSED_FLAG if system.body_encoding == pb.GZIP else 0
    if system.message_type == pb.TRANSACTION:
        properties[c.PROPERTY_TRANSACTION_PREPARED] = "true"
        sys_flag |= c.TRANSACTION_PREPARED_TYPE
        if system.HasField("orphaned_transaction_recovery_duration"):
            seconds = system.orphaned_transaction_recovery_duration.ToSeconds()
            properties[c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
    if system.HasField("delivery_timestamp"):  # fillDelayMessageProperty: the broker's timer takes it
        deliver = timestamp_millis(system.delivery_timestamp, "system_properties.delivery_timestamp")
        if deliver - time.time() * 1000 > MAX_DELAY_MS:
            raise RequestError(
                pb.ILLEGAL_DELIVERY_TIME, f"system_properties.delivery_timestamp: {deliver} is more than 1 day ahead"
            )
        properties[c.PROPERTY_TIMER_DELIVER_MS] = str(deliver)
    if system.trace_context:
        properties[PROPERTY_TRACE_CONTEXT] = system.trace_context
    if system.born_host:
        properties[PROPERTY_BORN_HOST] = system.born_host
    born = 0
    if system.HasField("born_timestamp"):
        born = timestamp_millis(system.born_timestamp, "system_properties.born_timestamp")
    if born:
        properties[PROPERTY_BORN_TIMESTAMP] = str(born)
    return InnerMessage(
        topic=message.topic.name,
        queue_id=0,
        body=bytes(message.body),
        properties=properties,
        sys_flag=sys_flag,
        born_timestamp=born,
        born_host=_peer_host(peer),
        reconsume_times=system.delivery_attempt,
    )


MAX_TIMESTAMP_SECONDS: Final = 253_402_300_799  # 9999-12-31T23:59:59Z, google.protobuf.Timestamp's bound


def timestamp_millis(value: pb_timestamp.Timestamp, field: str) -> int:
    """Epoch ms of a protocol ``Timestamp``. The official Python client (5.1.2) writes a delivery time
    in ms into ``seconds``: a value beyond ``Timestamp``'s range (which no time in seconds can be)
    is taken as ms, where RocketMQ's proxy refuses the message.

    Raises:
        RequestError: ILLEGAL_DELIVERY_TIME for a negative time; INTERNAL_SERVER_ERROR for nanos
            outside [0, 999999999], as the proxy answers such a timestamp.
    """
    seconds, millis = int(value.seconds), int(value.nanos) // 1_000_000
    if not 0 <= value.nanos <= 999_999_999:
        raise RequestError(pb.INTERNAL_SERVER_ERROR, f"{field}: Timestamp is not valid (nanos {value.nanos})")
    if seconds > MAX_TIMESTAMP_SECONDS:
        return seconds + millis
    if seconds < 0:
        raise RequestError(pb.ILLEGAL_DELIVERY_TIME, f"{field}: {seconds} s is before 1970")
    return seconds * 1000 + millis


def _peer_host(peer: str) -> str:
    """``ip:port`` of a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``), for the
    record's BORNHOST; the loopback address when the peer is not an IP one."""
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        try:
            return str(parse_host(address))
        except ValidationError:
            pass
    return "127.0.0.1:0"


class TelemetryStream:
    """One client's ``Telemetry`` stream: what the server sends it (``outbox``), and, for a
    producer, its place among the transactional producers of every served broker under each of
    its topics (the proxy's producer group), so that their check services reach it."""

    def __init__(
        self, brokers: Mapping[str, Broker], loop: asyncio.AbstractEventLoop, transactions: TransactionDataTable
    ) -> None:
        self.brokers = brokers
        self.loop = loop
        self.transactions = transactions
        self.outbox: asyncio.Queue[rpc.TelemetryCommand | None] = asyncio.Queue()  # the loop's own
        self.groups: set[str] = set()
        self._lock = threading.Lock()

    def register(self, settings: pb.Settings) -> None:
        """Register as a producer of the settings' topics (once per topic)."""
        if settings.client_type != pb.PRODUCER:
            return
        with self._lock:
            for topic in settings.publishing.topics:
                if topic.name not in self.groups:
                    self.groups.add(topic.name)
                    for broker in self.brokers.values():
                        broker.transaction_producers.setdefault(topic.name, []).append(self)

    def unregister(self) -> None:
        """Leave every broker's producers: check-backs no longer come here."""
        with self._lock:
            for group in self.groups:
                for broker in self.brokers.values():
                    producers = broker.transaction_producers.get(group, [])
                    if self in producers:
                        producers.remove(self)
            self.groups.clear()

    def check_transaction_state(self, broker: Broker, message: MessageExt) -> None:
        """A check-back of the re-put half ``message``: sent to the client, shown in its real topic
        and queue, with its message id as transaction id; the re-put copy is what the client's
        answer (``EndTransaction``) ends (``AbstractProxyRelayService.processCheckTransactionState``)."""
        real_topic = message.properties.get(c.PROPERTY_REAL_TOPIC, message.topic)
        real_queue = int(message.properties.get(c.PROPERTY_REAL_QUEUE_ID, message.queue_id))
        transaction_id = message.uniq_key or message.msg_id
        group = message.properties.get(c.PROPERTY_PRODUCER_GROUP, real_topic)
        self.transactions.add(group, transaction_id, broker, message.commit_log_offset)
        command = rpc.RecoverOrphanedTransactionCommand(
            message=protocol_message(message, real_topic, real_queue), transaction_id=transaction_id
        )
        out = rpc.TelemetryCommand(recover_orphaned_transaction_command=command)
        try:  # called from the broker's check service thread
            self.loop.call_soon_threadsafe(self.outbox.put_nowait, out)
        except RuntimeError:  # the server stopped: the check counts, as for a client that left
            pass
