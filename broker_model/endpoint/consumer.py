"""The consumer side of ``apache.rocketmq.v2.MessagingService`` with RocketMQ 5's proxy semantics
(``ReceiveMessageActivity``, ``AckMessageActivity``, ``ChangeInvisibleDurationActivity``,
``ForwardMessageToDLQActivity``, ``RouteActivity.queryAssignment``, ``GrpcClientSettingsManager``):
POP consumption served by each broker's :class:`~broker_model.broker.PopService`. See
docs/endpoint.md and docs/pop.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Final, TypeVar

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from broker_model.broker import Broker, PoppedMessage, PopService, SubscriptionGroupConfig
from broker_model.common import constants as c
from broker_model.common import validate_name
from broker_model.common.pop_records import PopError, ReceiptHandle
from broker_model.common.sql92 import SqlFilter
from broker_model.endpoint.convert import protocol_message
from broker_model.endpoint.errors import RequestError
from broker_model.store import MessageExt
from broker_model.store.message_store import PullResult, PullStatus, Subscription
from schemas.errors import BrokerError, ValidationError

MIN_POLLING_MS: Final = 5_000  # ProxyConfig.grpcClientConsumerMinLongPollingTimeoutMillis
MAX_POLLING_MS: Final = 20_000  # grpcClientConsumerMaxLongPollingTimeoutMillis
RECEIVE_BATCH_SIZE: Final = 32  # grpcClientConsumerLongPollingBatchSize
MIN_INVISIBLE_MS: Final = 10_000  # minInvisibleTimeMillsForRecv
MAX_INVISIBLE_MS: Final = 43_200_000  # maxInvisibleTimeMills, 12 h
DEFAULT_INVISIBLE_MS: Final = 60_000  # defaultInvisibleTimeMills: a receive with auto_renew
POP_WORKERS: Final = 32  # threads for pops and their long polls' looks, apart from the loop's executor
_CONSUMERS: Final = (pb.SIMPLE_CONSUMER, pb.PUSH_CONSUMER)
_ERROR_CODES: Final[Mapping[str, int]] = {
    "INVALID_RECEIPT_HANDLE": pb.INVALID_RECEIPT_HANDLE,
    "MESSAGE_NOT_FOUND": pb.MESSAGE_NOT_FOUND,
    "TOPIC_NOT_FOUND": pb.TOPIC_NOT_FOUND,
    "NOT_IMPLEMENTED": pb.NOT_IMPLEMENTED,
}

_T = TypeVar("_T")


class ConsumerCalls:
    """The consumer RPCs, mixed into the endpoint's ``MessagingService``, which provides the
    brokers, admission and routes."""

    brokers: dict[str, Broker]
    pops: dict[str, PopService]
    min_invisible_ms: int
    _pop_threads: futures.ThreadPoolExecutor

    def _admit(self, context: grpc.aio.ServicerContext, topic: str | None = None) -> None:
        raise NotImplementedError  # MessagingService's

    async def _readable_brokers(self, topic: str) -> list[tuple[Broker, int, pb.MessageQueue]]:
        raise NotImplementedError  # MessagingService's

    def _admit_consumer(
        self, context: grpc.aio.ServicerContext, topic: pb.Resource, field: str, group: pb.Resource
    ) -> tuple[str, str]:
        """The topic and group of a consumer's call, once the call is admitted.

        Raises:
            RequestError: as ``_admit``; BAD_REQUEST for no topic, ILLEGAL_CONSUMER_GROUP.
        """
        name = _name(topic, field)
        self._admit(context, name)
        return name, _group(group)

    def _init_consumer_calls(self, pops: Mapping[str, PopService], min_invisible_ms: int) -> None:
        self.pops = dict(pops)
        self.min_invisible_ms = min_invisible_ms
        # pops wait for a group's turn and their commit: apart, they never hold up acks and sends
        self._pop_threads = futures.ThreadPoolExecutor(POP_WORKERS, thread_name_prefix="endpoint-pop")

    def close_consumer_calls(self) -> None:
        """Let the pop threads go once their work is done (the server has stopped taking calls)."""
        self._pop_threads.shutdown(wait=False)

    # -- assignment and settings --------------------------------------------------------------

    async def QueryAssignment(
        self, request: rpc.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> rpc.QueryAssignmentResponse:
        """One queue of id -1 per broker with readable queues of the topic (the broker pops every
        queue); for a FIFO group every queue, as ``RouteActivity.queryAssignment``."""
        try:
            topic, group = self._admit_consumer(context, request.topic, "topic", request.group)
            readable = await self._readable_brokers(topic)
        except RequestError as err:
            return rpc.QueryAssignmentResponse(status=_status(err.code, err.message))
        assignments = []
        for broker, queue_nums, template in readable:
            config = await asyncio.to_thread(broker.subscription_group, group)  # may read the group table
            fifo = config.consume_message_orderly
            for queue_id in range(queue_nums) if fifo else (-1,):
                queue = pb.MessageQueue()
                queue.CopyFrom(template)
                queue.id = queue_id
                assignments.append(pb.Assignment(message_queue=queue))
        if not assignments:
            return rpc.QueryAssignmentResponse(status=_status(pb.FORBIDDEN, f"topic {topic!r}: no readable queue"))
        return rpc.QueryAssignmentResponse(status=_status(), assignments=assignments)

    def consumer_settings(self, client: pb.Settings, settings: pb.Settings) -> None:
        """A consumer's settings as the proxy merges them with its group's (``mergeSubscriptionData``):
        batch size, long polling timeout, the FIFO flag, the attempts and the backoff."""
        group = client.subscription.group.name
        config = self._group_config(group) if group else SubscriptionGroupConfig("DEFAULT")
        subscription = settings.subscription
        subscription.receive_batch_size = RECEIVE_BATCH_SIZE
        subscription.long_polling_timeout.FromMilliseconds(MAX_POLLING_MS)
        subscription.fifo = config.consume_message_orderly
        settings.backoff_policy.Clear()  # the client's own policy is replaced, not merged into
        settings.backoff_policy.max_attempts = config.retry_max_times + 1
        exponential = (config.retry_initial_ms, config.retry_max_ms, config.retry_multiplier)
        if config.retry_policy == "EXPONENTIAL":
            initial, largest, multiplier = (
                given if given is not None else default
                for given, default in zip(exponential, c.EXPONENTIAL_RETRY_MS, strict=True)
            )
            backoff = settings.backoff_policy.exponential_backoff
            backoff.initial.FromMilliseconds(initial)
            backoff.max.FromMilliseconds(largest)
            backoff.multiplier = float(multiplier)
        else:
            for delay in config.retry_next_ms or c.CUSTOMIZED_RETRY_NEXT_MS:
                settings.backoff_policy.customized_backoff.next.add().FromMilliseconds(delay)

    def _group_config(self, group: str) -> SubscriptionGroupConfig:
        return next(iter(self.brokers.values())).subscription_group(group)

    def consumer_heartbeat(self, request: rpc.HeartbeatRequest, client_id: str) -> None:
        """A consumer's heartbeat registers it in its group on every broker."""
        if request.client_type in _CONSUMERS and request.group.name:
            for broker in self.brokers.values():
                broker.heartbeat(request.group.name, client_id)

    # -- receiving ---------------------------------------------------------------------------

    async def ReceiveMessage(
        self, request: rpc.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpc.ReceiveMessageResponse]:
        """Pop from the broker the request names, holding the call until a message arrives or the
        polling time passes; the stream is the status, the messages, then the time of delivery."""
        try:
            queue = request.message_queue
            topic, group = self._admit_consumer(context, queue.topic, "message_queue.topic", request.group)
            poll_ms = self._polling_ms(request, context)
            invisible_ms = self._invisible_ms(request)
            chosen = _filter(request.filter_expression)
            batch = request.batch_size
            if batch <= 0:
                raise RequestError(pb.BAD_REQUEST, f"batch_size: {batch} must be greater than 0")
            pops = self._pops_of(request.message_queue.broker.name)
            attempt_id = request.attempt_id if request.HasField("attempt_id") else None
            result = await self._receive(
                pops, group, topic, min(batch, c.MAX_POP_NUMS), invisible_ms, chosen, poll_ms, attempt_id
            )
        except RequestError as err:
            yield rpc.ReceiveMessageResponse(status=_status(err.code, err.message))
            yield _delivered_now()
            return
        if not result:
            yield rpc.ReceiveMessageResponse(status=_status(pb.MESSAGE_NOT_FOUND, "no new message"))
            yield _delivered_now()
            return
        yield rpc.ReceiveMessageResponse(status=_status(pb.OK, "OK"))
        for item in result:
            shown = _shown(item.message, topic)
            shown.system_properties.receipt_handle = item.receipt_handle
            shown.system_properties.delivery_attempt = item.delivery_attempt
            yield rpc.ReceiveMessageResponse(message=shown)
        yield _delivered_now()

    async def _receive(
        self,
        pops: PopService,
        group: str,
        topic: str,
        batch: int,
        invisible_ms: int,
        chosen: _Filter,
        poll_ms: int,
        attempt_id: str | None = None,
    ) -> list[PoppedMessage]:
        """Pop; while nothing comes, wait for the broker to store a matching message in a queue the
        pop read (:meth:`_long_poll`), then pop again, until ``poll_ms`` passed."""

        def attempt() -> tuple[list[PoppedMessage], Sequence[tuple[str, int, int]] | None, int | None]:
            result = pops.pop(
                group, topic, batch, invisible_ms, chosen.expression, attempt_id=attempt_id, expression_type=chosen.kind
            )
            return result.messages, None if result.orderly else result.looked, result.unblocks_in_ms

        return await self._long_poll(pops.broker, chosen.sub, poll_ms, attempt)

    async def _long_poll(
        self,
        broker: Broker,
        sub: Subscription,
        poll_ms: int,
        attempt: Callable[[], tuple[list[_T], Sequence[tuple[str, int, int]] | None, int | None]],
    ) -> list[_T]:
        """Run ``attempt`` in a pop thread: what it found, the queues it read with their offsets,
        and the ms after which it may find something without any new message. While it finds
        nothing, wait on the loop (no thread held) until the broker stores a message matching
        ``sub`` in one of those queues (or, when it names none, None, until the broker changes at
        all), or those ms pass, then run it again, until ``poll_ms`` passed. An empty list of
        queues means there is nothing to wait for: it answers at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_ms / 1000
        arrived = asyncio.Event()

        def listener() -> None:  # in the thread that dispatched
            try:
                loop.call_soon_threadsafe(arrived.set)
            except RuntimeError:  # the loop closed (the server stops): nobody waits any more
                pass

        store = broker.store
        store.add_arrival_listener(listener)
        try:
            while True:
                arrived.clear()
                found, looked, again_in_ms = await self._blocking(attempt, self._pop_threads)
                if found or loop.time() >= deadline or looked == []:  # nothing to wait for: answer now
                    return found
                wake_by = deadline if again_in_ms is None else min(deadline, loop.time() + again_in_ms / 1000)
                while looked is None or not await loop.run_in_executor(
                    self._pop_threads, functools.partial(store.arrived_any, looked, sub)
                ):
                    try:
                        await asyncio.wait_for(arrived.wait(), max(0.0, wake_by - loop.time()))
                    except TimeoutError:
                        if loop.time() >= deadline:
                            return []
                        break  # a blocked FIFO batch's invisible time ended
                    arrived.clear()
                    if looked is None:
                        break
        finally:
            store.remove_arrival_listener(listener)

    def _polling_ms(self, request: rpc.ReceiveMessageRequest, context: grpc.aio.ServicerContext) -> int:
        """The proxy's polling time: the request's, else what the deadline leaves; clamped to
        [5 s, 20 s], then cut to the deadline.

        Raises:
            RequestError: ILLEGAL_POLLING_TIME when under 5 s of the deadline remain.
        """
        remaining_s = context.time_remaining()
        remaining = int(remaining_s * 1000) if remaining_s is not None else MAX_POLLING_MS
        if request.HasField("long_polling_timeout"):
            polling = int(request.long_polling_timeout.ToMilliseconds())
        else:
            polling = remaining - 3_000 // 2  # the clients' request timeout is 3 s
        polling = min(max(polling, MIN_POLLING_MS), MAX_POLLING_MS)
        if polling > remaining:
            if remaining < MIN_POLLING_MS:
                raise RequestError(
                    pb.ILLEGAL_POLLING_TIME,
                    "The deadline time remaining is not enough for polling, please check network condition",
                )
            polling = remaining
        return polling

    def _invisible_ms(self, request: rpc.ReceiveMessageRequest) -> int:
        """The request's invisible time, or the default with ``auto_renew``.

        Raises:
            RequestError: ILLEGAL_INVISIBLE_TIME outside [the minimum, 12 h].
        """
        if request.auto_renew:
            return DEFAULT_INVISIBLE_MS
        return _invisible(int(request.invisible_duration.ToMilliseconds()), self.min_invisible_ms)

    def _pops_of(self, broker_name: str) -> PopService:
        pops = self.pops.get(broker_name)
        if pops is None:
            raise RequestError(
                pb.BAD_REQUEST, f"message_queue.broker.name: {broker_name!r} is not served here ({sorted(self.pops)})"
            )
        return pops

    # -- acks --------------------------------------------------------------------------------

    async def AckMessage(
        self, request: rpc.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> rpc.AckMessageResponse:
        """Ack each entry; every entry gets its own status, the response theirs when they agree,
        else ``MULTIPLE_RESULTS``."""
        try:
            topic, group = self._admit_consumer(context, request.topic, "topic", request.group)
            if not request.entries:
                raise RequestError(pb.BAD_REQUEST, "entries: nothing to ack")
        except RequestError as err:
            return rpc.AckMessageResponse(status=_status(err.code, err.message))
        entries = []
        for entry in request.entries:
            try:
                handle = _handle(entry.receipt_handle)
                pops = self._pops_of_handle(handle)
                await self._blocking(functools.partial(pops.ack, group, topic, entry.receipt_handle))
                outcome = _status()
            except RequestError as err:
                outcome = _status(err.code, err.message)
            entries.append(
                rpc.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=outcome
                )
            )
        codes = {e.status.code for e in entries}
        if len(codes) > 1:  # AckMessageActivity: the entries' own codes differ
            return rpc.AckMessageResponse(status=_status(pb.MULTIPLE_RESULTS, "MULTIPLE_RESULTS"), entries=entries)
        return rpc.AckMessageResponse(status=entries[0].status, entries=entries)

    async def ChangeInvisibleDuration(
        self, request: rpc.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> rpc.ChangeInvisibleDurationResponse:
        """A new invisible time for one received message; the response carries its new handle."""
        try:
            topic, group = self._admit_consumer(context, request.topic, "topic", request.group)
            invisible_ms = _invisible(int(request.invisible_duration.ToMilliseconds()), 0)
            handle = _handle(request.receipt_handle)
            pops = self._pops_of_handle(handle)
            renewed = await self._blocking(
                lambda: pops.change_invisible(group, topic, request.receipt_handle, invisible_ms)
            )
        except RequestError as err:
            return rpc.ChangeInvisibleDurationResponse(status=_status(err.code, err.message))
        return rpc.ChangeInvisibleDurationResponse(status=_status(), receipt_handle=renewed)

    async def ForwardMessageToDeadLetterQueue(
        self, request: rpc.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> rpc.ForwardMessageToDeadLetterQueueResponse:
        """Send the message to ``%DLQ%<group>`` and ack it, whatever its attempts (the proxy ignores
        the request's counts)."""
        try:
            topic, group = self._admit_consumer(context, request.topic, "topic", request.group)
            handle = _handle(request.receipt_handle)
            pops = self._pops_of_handle(handle)
            if handle.expires <= pops.broker.config.clock():
                raise RequestError(pb.INVALID_RECEIPT_HANDLE, "receipt_handle: the receipt handle is expired")

            def forward() -> None:
                pops.broker.consumer_send_back(group, handle.commit_log_offset, delay_level=-1)
                pops.ack(group, topic, request.receipt_handle)

            await self._blocking(forward)
        except RequestError as err:
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=_status(err.code, err.message))
        return rpc.ForwardMessageToDeadLetterQueueResponse(status=_status())

    # -- offset-based consumption ----------------------------------------------------------

    async def PullMessage(
        self, request: rpc.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpc.PullMessageResponse]:
        """Read one queue from an offset, as a 4.x pull consumer does (the group's offset does not
        move: ``UpdateOffset`` commits it); held up to ``long_polling_timeout`` while nothing
        matching is there. The stream is the status, the messages, then the next offset."""
        try:
            topic, _, broker, queue_id = self._admit_queue(context, request.message_queue, request.group)
            chosen = _filter(request.filter_expression)
            batch = request.batch_size
            if not 1 <= batch <= c.MAX_POP_NUMS:
                raise RequestError(pb.BAD_REQUEST, f"batch_size: {batch} must be in [1, {c.MAX_POP_NUMS}]")
            if request.offset < 0:
                raise RequestError(pb.ILLEGAL_OFFSET, f"offset: {request.offset} must not be negative")
            remaining = context.time_remaining()
            poll_ms = (
                int(request.long_polling_timeout.ToMilliseconds()) if request.HasField("long_polling_timeout") else 0
            )
            if remaining is not None:
                poll_ms = max(0, min(poll_ms, int(remaining * 1000) - 500))
            outcome: list[PullResult] = []

            def attempt() -> tuple[list[MessageExt], Sequence[tuple[str, int, int]] | None, int | None]:
                result = broker.pull(topic, queue_id, request.offset, batch, chosen.sub.expression)
                # only a pull at the queue's end waits; one that read rows the filter passed over, or
                # an offset outside the queue, answers at once with where to go on
                waits = result.status == PullStatus.NO_NEW_MSG
                if chosen.sql is not None:  # the broker's filter by the messages' properties
                    result = dataclasses.replace(
                        result, messages=[m for m in result.messages if chosen.sql.matches(m.properties)]
                    )
                outcome[:] = [result]
                return result.messages, [(topic, queue_id, request.offset)] if waits else [], None

            messages = await self._long_poll(broker, chosen.sub, poll_ms, attempt)
        except RequestError as err:
            yield rpc.PullMessageResponse(status=_status(err.code, err.message))
            return
        result = outcome[0]
        if messages:
            yield rpc.PullMessageResponse(status=_status())
        elif result.status == PullStatus.OFFSET_ILLEGAL:
            yield rpc.PullMessageResponse(
                status=_status(
                    pb.ILLEGAL_OFFSET,
                    f"offset: {request.offset} is outside [{result.min_offset}, {result.max_offset}] of the queue",
                )
            )
        else:
            yield rpc.PullMessageResponse(status=_status(pb.MESSAGE_NOT_FOUND, "no new message"))
        for message in messages:
            yield rpc.PullMessageResponse(message=_shown(message, topic))
        yield rpc.PullMessageResponse(next_offset=result.next_begin_offset)

    async def UpdateOffset(
        self, request: rpc.UpdateOffsetRequest, context: grpc.aio.ServicerContext
    ) -> rpc.UpdateOffsetResponse:
        """Commit the group's next offset of one queue (as a 4.x consumer's ``updateConsumerOffset``)."""
        try:
            topic, group, broker, queue_id = self._admit_queue(context, request.message_queue, request.group)
            if request.offset < 0:
                raise RequestError(pb.ILLEGAL_OFFSET, f"offset: {request.offset} must not be negative")
            client = str(dict(context.invocation_metadata() or ()).get("x-mq-client-id", "")) or None
            broker.commit_offset(group, topic, queue_id, request.offset, client)
        except RequestError as err:
            return rpc.UpdateOffsetResponse(status=_status(err.code, err.message))
        return rpc.UpdateOffsetResponse(status=_status())

    async def GetOffset(
        self, request: rpc.GetOffsetRequest, context: grpc.aio.ServicerContext
    ) -> rpc.GetOffsetResponse:
        """The group's committed offset of one queue; ``OFFSET_NOT_FOUND`` when it has none."""
        try:
            topic, group, broker, queue_id = self._admit_queue(context, request.message_queue, request.group)
            offset = await asyncio.to_thread(broker.query_offset, group, topic, queue_id)  # may read the ledger
            if offset < 0:
                raise RequestError(pb.OFFSET_NOT_FOUND, f"group {group!r} has no offset of {topic}:{queue_id}")
        except RequestError as err:
            return rpc.GetOffsetResponse(status=_status(err.code, err.message))
        return rpc.GetOffsetResponse(status=_status(), offset=offset)

    async def QueryOffset(
        self, request: rpc.QueryOffsetRequest, context: grpc.aio.ServicerContext
    ) -> rpc.QueryOffsetResponse:
        """A queue's first offset (``BEGINNING``), its next offset to be written (``END``), or the
        first offset stored at or after ``timestamp`` (``TIMESTAMP``, RocketMQ 5's lower boundary)."""
        try:
            queue = request.message_queue
            topic = _name(queue.topic, "message_queue.topic")
            self._admit(context, topic)
            broker, queue_id = self._queue_of(queue)
            store = broker.store
            if request.query_offset_policy == pb.BEGINNING:
                offset = store.min_offset(topic, queue_id)
            elif request.query_offset_policy == pb.END:
                offset = store.max_offset(topic, queue_id)
            else:
                offset = store.offset_by_time(topic, queue_id, request.timestamp.ToMilliseconds())
        except RequestError as err:
            return rpc.QueryOffsetResponse(status=_status(err.code, err.message))
        return rpc.QueryOffsetResponse(status=_status(), offset=offset)

    def _admit_queue(
        self, context: grpc.aio.ServicerContext, queue: pb.MessageQueue, group: pb.Resource
    ) -> tuple[str, str, Broker, int]:
        """The topic, group, broker and queue id of an offset-based call, once it is admitted."""
        topic, name = self._admit_consumer(context, queue.topic, "message_queue.topic", group)
        return (topic, name, *self._queue_of(queue))

    def _queue_of(self, queue: pb.MessageQueue) -> tuple[Broker, int]:
        """The broker and queue id a request's queue names.

        Raises:
            RequestError: BAD_REQUEST for a broker not served here or a queue the topic lacks there.
        """
        broker = self.brokers.get(queue.broker.name)
        if broker is None:
            raise RequestError(
                pb.BAD_REQUEST,
                f"message_queue.broker.name: {queue.broker.name!r} is not served here ({sorted(self.brokers)})",
            )
        nums = broker.queue_nums(queue.topic.name)
        if nums is None:
            raise RequestError(
                pb.TOPIC_NOT_FOUND, f"topic {queue.topic.name!r} not found on broker {broker.broker_name!r}"
            )
        if not 0 <= queue.id < nums:
            raise RequestError(
                pb.BAD_REQUEST, f"message_queue.id: {queue.id} is not a queue of {queue.topic.name} (0..{nums - 1})"
            )
        return broker, queue.id

    def _pops_of_handle(self, handle: ReceiptHandle) -> PopService:
        pops = self.pops.get(handle.broker_name)
        if pops is None:
            raise RequestError(
                pb.INVALID_RECEIPT_HANDLE, f"receipt_handle: names broker {handle.broker_name!r}, not served here"
            )
        return pops

    async def _blocking(self, call: Callable[[], _T], threads: futures.Executor | None = None) -> _T:
        """Run what writes and waits for its commit off the loop (in ``threads``, else the loop's
        executor); the broker's refusals as codes."""
        try:
            return await asyncio.get_running_loop().run_in_executor(threads, call)
        except PopError as err:
            raise RequestError(_ERROR_CODES.get(err.code, pb.BAD_REQUEST), str(err)) from None
        except ValidationError as err:
            raise RequestError(pb.BAD_REQUEST, str(err)) from None
        except BrokerError as err:
            raise RequestError(pb.INTERNAL_SERVER_ERROR, str(err)) from None


def _status(code: int = pb.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


def _shown(message: MessageExt, topic: str) -> pb.Message:
    """A popped or pulled message as the protocol's, under ``topic``: its body is decompressed
    already, so it is sent as it is."""
    if message.sys_flag & c.COMPRESSED_FLAG:
        message = dataclasses.replace(message, sys_flag=message.sys_flag & ~c.COMPRESSED_FLAG)
    return protocol_message(message, topic)


def _delivered_now() -> rpc.ReceiveMessageResponse:
    response = rpc.ReceiveMessageResponse()
    response.delivery_timestamp.GetCurrentTime()
    return response


def _name(resource: pb.Resource, field: str) -> str:
    if not resource.name.strip():
        raise RequestError(pb.BAD_REQUEST, f"{field}: no name")
    return str(resource.name)


def _group(resource: pb.Resource) -> str:
    """The consumer group of a request (``validateConsumerGroup``).

    Raises:
        RequestError: ILLEGAL_CONSUMER_GROUP for a bad or system group name.
    """
    name = str(resource.name)
    try:
        validate_name(name, "group", c.GROUP_MAX_LENGTH)
    except ValidationError as err:
        raise RequestError(pb.ILLEGAL_CONSUMER_GROUP, str(err)) from None
    if name.startswith("CID_RMQ_SYS_"):
        raise RequestError(pb.ILLEGAL_CONSUMER_GROUP, f"group: {name!r}: cannot use system consumer group")
    return name


@dataclass(frozen=True)
class _Filter:
    """A request's filter: the broker's subscription (what wakes a long poll: every tag for SQL92),
    the expression and its type (TAG or SQL92), and the SQL92 condition."""

    sub: Subscription
    expression: str
    kind: str
    sql: SqlFilter | None = None


def _filter(expression: pb.FilterExpression) -> _Filter:
    """A TAG or SQL92 expression, checked.

    Raises:
        RequestError: ILLEGAL_FILTER_EXPRESSION for an expression that does not parse.
    """
    try:
        if expression.type == pb.SQL:
            sql = SqlFilter.parse(expression.expression)
            return _Filter(Subscription.parse("*"), expression.expression, "SQL92", sql)
        sub = Subscription.parse(expression.expression or "*")
        return _Filter(sub, sub.expression, "TAG")
    except ValidationError as err:
        raise RequestError(pb.ILLEGAL_FILTER_EXPRESSION, str(err)) from None


def _invisible(invisible_ms: int, least: int) -> int:
    if invisible_ms < least:
        raise RequestError(pb.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too small. min is {least}")
    if invisible_ms > MAX_INVISIBLE_MS:
        raise RequestError(pb.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too large. max is {MAX_INVISIBLE_MS}")
    return invisible_ms


def _handle(text: str) -> ReceiptHandle:
    try:
        return ReceiptHandle.decode(text)
    except PopError as err:
        raise RequestError(pb.INVALID_RECEIPT_HANDLE, str(err)) from None
