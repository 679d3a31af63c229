"""The orderly push consumer: one listener call per queue at a time, in queue order, under broker
locks (RocketMQ's ``DefaultMQPushConsumer`` with a ``MessageListenerOrderly``).
:meth:`OrderlyPushConsumer.start` runs a service thread and a pool of consume threads;
:meth:`OrderlyPushConsumer.poll_once` runs everything due at an explicit time, for deterministic
tests. See docs/clients.md for its rules and where it deviates from the Java client.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from broker_model.broker import Broker
from broker_model.client.consume_core import (
    ProcessQueue,
    compute_pull_from_where,
)
from broker_model.client.offset_store import (
    LocalFileOffsetStore,
    RemoteBrokerOffsetStore,
)
from broker_model.client.orderly_config import (
    CONSUME_TIMESTAMP_DEFAULT_AGO_MS,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
    OrderlyConsumerConfig,
)
from broker_model.client.rebalance import allocate_averagely, queue_sort_key
from broker_model.common import MessageQueue, now_ms, validate_group, validate_topic
from broker_model.common import constants as c
from broker_model.store import MessageExt, PullStatus, Subscription
from schemas.errors import BrokerError, ValidationError

LOCK_RETRY_IN_LOOP_MS = 10  # tryLockLaterAndReconsume delay inside the consume loop
LOCK_RETRY_OUTSIDE_LOOP_MS = 100  # ... and when a request finds its queue unlocked
RECONSUME_AFTER_LOCK_MS = 10  # a request resubmitted after the lock was regained
RECONSUME_AFTER_LOCK_FAILED_MS = 3000  # ... and after it was not
RESUBMIT_AFTER_YIELD_MS = 10  # a request that consumed for too long continues this much later
CONSUME_LOCK_WAIT_S = 1.0  # removeUnnecessaryMessageQueue waits this long for a running listener
SERVICE_MAX_WAIT_S = 0.05  # the service thread looks at its timers at least this often
_client_numbers = itertools.count()


@dataclass
class _PullRequest:
    queue: MessageQueue
    process_queue: ProcessQueue
    pull_offset: int
    previously_locked: bool = False


@dataclass(order=True)
class _Task:
    """A timer entry: ``action(now)`` at ``due``, or a consume request of ``consume``."""

    due: int
    seq: int
    action: Callable[[int], object] | None = field(compare=False, default=None)
    consume: tuple[ProcessQueue, MessageQueue] | None = field(compare=False, default=None)


class OrderlyPushConsumer:
    """A push consumer with an orderly listener over brokers of this process (module docstring).

    Args:
        brokers: the brokers whose queues the consumer reads (each started).
        group: the consumer group.
        listener: called with a batch of messages of one queue and a context; returns a status.
        config: settings (defaults are RocketMQ's).
        clock: epoch-ms clock of the threaded mode and of calls without an explicit ``now``.

    Raises:
        ValidationError: a bad group, config field, or no broker.
    """

    def __init__(
        self,
        brokers: Sequence[Broker],
        group: str,
        listener: MessageListenerOrderly,
        config: OrderlyConsumerConfig | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        validate_group(group)
        self.config = config or OrderlyConsumerConfig()
        self.config.validate()
        if not brokers:
            raise ValidationError("brokers", list(brokers), "an orderly consumer needs at least one broker")
        self.brokers = {b.broker_name: b for b in brokers}
        self.group = group
        self.listener = listener
        self.clustering = self.config.message_model == "CLUSTERING"
        self.client_id = self.config.client_id or f"127.0.0.1@{os.getpid()}#{next(_client_numbers)}"
        self.offset_store: RemoteBrokerOffsetStore | LocalFileOffsetStore
        if self.clustering:
            managers = {name: b.offsets for name, b in self.brokers.items()}
            self.offset_store = RemoteBrokerOffsetStore(managers, group, self.client_id)
        elif self.config.offset_dir is not None:  # validate() refused BROADCASTING without it
            self.offset_store = LocalFileOffsetStore(self.config.offset_dir, self.client_id, group)
        self._clock = clock
        self.subscriptions: dict[str, str] = {}  # topic -> tag expression
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.last_listener_error: BaseException | None = None
        self._table_lock = threading.RLock()
        self._queue_locks: dict[MessageQueue, threading.Lock] = {}
        self._timers = threading.Condition()
        self._tasks: list[_Task] = []
        self._seq = itertools.count()
        self._pending_unlocks: dict[MessageQueue, _Task] = {}
        self._membership: tuple[int, ...] | None = None
        self._retry_pending = False
        self.last_service_error: BaseException | None = None
        self._opened = False
        self._stopping = False
        self._service: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- life cycle -------------------------------------------------------------------------------

    def subscribe(self, topic: str, tag_expression: str = "*") -> None:
        """Consume ``topic`` (messages whose tags match ``tag_expression``); before starting.

        Raises:
            ValidationError: a bad topic or tag expression.
            BrokerError: the consumer already started.
        """
        validate_topic(topic)
        Subscription.parse(tag_expression)
        if self._opened:
            raise BrokerError(f"consumer {self.client_id!r} already started; subscribe before starting")
        self.subscriptions[topic] = tag_expression

    def start(self) -> OrderlyPushConsumer:
        """Register with the brokers and run the service thread and the consume threads (once).

        Raises:
            BrokerError: already started or shut down, or nothing subscribed.
        """
        if self._service is not None:
            raise BrokerError(f"consumer {self.client_id!r} already runs its threads")
        self._open(self._clock())
        self._executor = ThreadPoolExecutor(self.config.consume_thread_max, thread_name_prefix=f"orderly-{self.group}")
        self._service = threading.Thread(target=self._service_loop, name=f"orderly-service-{self.client_id}")
        self._service.daemon = True
        self._service.start()
        return self

    def poll_once(self, now: int | None = None) -> int:
        """Run, in this thread, every timer due at ``now`` (default: the clock), including those
        that become due while running (consume requests, immediate pulls); returns how many ran.

        The first call registers with the brokers as :meth:`start` does. Deterministic for a given
        log, ``now`` sequence and listener.

        Raises:
            BrokerError: the consumer runs its own threads or was shut down, or nothing is
                subscribed.
        """
        if self._service is not None:
            raise BrokerError(f"consumer {self.client_id!r} runs its own threads; poll_once is for the stepped mode")
        moment = self._clock() if now is None else now
        self._open(moment)
        return self._run_due(moment, inline=True)

    def shutdown(self) -> None:
        """Stop consuming, persist offsets, release every lock and leave the group (idempotent)."""
        if not self._opened or self._stopping:
            return
        self._stopping = True
        with self._timers:
            self._timers.notify_all()
        if self._service is not None:
            self._service.join()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self.persist_offsets()
        if self.clustering:
            self._unlock_all_now()
        for broker in self.brokers.values():
            broker.unregister_client(self.group, self.client_id)
        with self._timers:
            self._tasks.clear()

    def __enter__(self) -> OrderlyPushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _open(self, now: int) -> None:
        if self._stopping:
            raise BrokerError(f"consumer {self.client_id!r} was shut down; create a new consumer")
        if self._opened:
            return
        if not self.subscriptions:
            raise BrokerError(f"consumer {self.client_id!r} subscribes to nothing; call subscribe first")
        self._opened = True
        self._heartbeat(now)
        config = self.config
        self._every(now, config.rebalance_interval_ms, self.rebalance)
        self._every(now + config.heartbeat_interval_ms, config.heartbeat_interval_ms, self._heartbeat)
        self._every(now + config.persist_offset_interval_ms, config.persist_offset_interval_ms, self._persist_task)
        if self.clustering:
            self._every(now + c.LOCK_ALL_INITIAL_DELAY_MS, config.lock_interval_ms, self.lock_all)

    # -- timers -----------------------------------------------------------------------------------

    def _every(self, first: int, interval_ms: int, action: Callable[[int], object]) -> None:
        """Run ``action(now)`` at ``first`` and then every ``interval_ms`` after each run."""

        def run(now: int) -> None:
            try:
                action(now)
            finally:
                self._schedule(now + interval_ms, run)

        self._schedule(first, run)

    def _persist_task(self, _now: int) -> None:
        self.persist_offsets()

    def _schedule(
        self,
        due: int,
        action: Callable[[int], object] | None = None,
        consume: tuple[ProcessQueue, MessageQueue] | None = None,
    ) -> _Task:
        task = _Task(due, next(self._seq), action, consume)
        with self._timers:
            if self._stopping:
                return task
            heapq.heappush(self._tasks, task)
            self._timers.notify_all()
        return task

    def _run_due(self, now: int, inline: bool) -> int:
        self._watch_membership(now)
        ran = 0
        while not self._stopping:
            with self._timers:
                if not self._tasks or self._tasks[0].due > now:
                    return ran
                task = heapq.heappop(self._tasks)
            ran += 1
            if inline:  # stepped mode: errors reach the caller
                self._run_task(task, now)
                continue
            try:
                self._run_task(task, now)
            except Exception as error:  # a timer task failing must not stop the service thread
                self.last_service_error = error
        return ran

    def _run_task(self, task: _Task, now: int) -> None:
        if task.consume is not None:
            pq, queue = task.consume
            if self._executor is None:
                self._consume(pq, queue, lambda: now)
            else:
                self._executor.submit(self._consume_in_thread, pq, queue)
        elif task.action is not None:
            task.action(now)

    def _consume_in_thread(self, pq: ProcessQueue, queue: MessageQueue) -> None:
        try:
            self._consume(pq, queue, self._clock)
        except Exception as error:  # kept for inspection; the queue is consumed again on the next dispatch
            self.last_service_error = error

    def _service_loop(self) -> None:
        while not self._stopping:
            self._run_due(self._clock(), inline=False)
            with self._timers:
                if self._stopping:
                    return
                wait = SERVICE_MAX_WAIT_S
                if self._tasks:
                    wait = min(wait, max(0.0, (self._tasks[0].due - self._clock()) / 1000))
                if wait > 0:
                    self._timers.wait(wait)

    # -- membership and rebalance -----------------------------------------------------------------

    def _heartbeat(self, now: int) -> None:
        for broker in self.brokers.values():
            broker.heartbeat(self.group, self.client_id, now)

    def _watch_membership(self, now: int) -> None:
        """Rebalance at once when a broker's view of the group changed (the broker's
        ``NOTIFY_CONSUMER_IDS_CHANGED``)."""
        if not self._opened or self._stopping:
            return
        seen = tuple(b.consumer_groups.version(self.group, now) for b in self.brokers.values())
        if seen != self._membership:
            self._membership = seen
            self.rebalance(now)

    def rebalance(self, now: int) -> bool:
        """Recompute this client's queues of every subscribed topic and update the process queues
        (clustering: a new queue only once its lock is granted); True when all wanted queues are
        held. When a lock was refused, another rebalance runs 500 ms later."""
        all_held = True
        for topic in sorted(self.subscriptions):
            wanted = self._allocate(topic, now)
            if wanted is None:
                continue
            all_held = self._update_process_queues(topic, wanted, now) and all_held
        if not all_held and not self._retry_pending:  # rebalanceLater: one pending retry at most
            self._retry_pending = True
            self._schedule(now + c.REBALANCE_RETRY_MS, self._rebalance_retry)
        return all_held

    def _rebalance_retry(self, now: int) -> None:
        self._retry_pending = False
        self.rebalance(now)

    def _allocate(self, topic: str, now: int) -> set[MessageQueue] | None:
        queues = [
            MessageQueue(name, topic, q)
            for name, broker in self.brokers.items()
            for q in range(broker.queue_nums(topic) or 0)
        ]
        if not queues:
            return None
        if not self.clustering:
            return set(queues)
        client_ids = sorted({cid for b in self.brokers.values() for cid in b.consumer_ids(self.group, now)})
        if not client_ids:
            return None
        return set(allocate_averagely(self.group, self.client_id, queues, client_ids))

    def _update_process_queues(self, topic: str, wanted: set[MessageQueue], now: int) -> bool:
        with self._table_lock:
            gone = [(q, pq) for q, pq in self.process_queues.items() if q.topic == topic and q not in wanted]
        for queue, pq in gone:
            pq.dropped = True
            if self._remove_unnecessary(queue, pq, now):
                with self._table_lock:
                    if self.process_queues.get(queue) is pq:
                        del self.process_queues[queue]
        all_held = True
        for queue in sorted(wanted, key=queue_sort_key):
            with self._table_lock:
                if queue in self.process_queues:
                    continue
            if self.clustering and not self._lock_one(queue, now):
                all_held = False
                continue
            pq = ProcessQueue(now)
            pq.locked = self.clustering
            pull_offset = self._compute_pull_from_where(queue, now)
            if pull_offset is None:
                all_held = False
                continue
            with self._table_lock:
                self.process_queues[queue] = pq
            self._pull_later(_PullRequest(queue, pq, pull_offset), now)
        return all_held

    def _remove_unnecessary(self, queue: MessageQueue, pq: ProcessQueue, now: int) -> bool:
        """Persist a dropped queue's offset; in clustering mode release its lock once no listener
        call runs on it (delayed while messages are cached). False: try again next rebalance."""
        self._persist_queue(queue)
        if not self.clustering:
            return True
        if not pq.consume_lock.acquire(timeout=CONSUME_LOCK_WAIT_S):
            pq.try_unlock_times += 1
            return False
        try:
            if pq.has_temp_message() and self.config.unlock_delay_ms > 0:
                due = now + self.config.unlock_delay_ms
                self._pending_unlocks[queue] = self._schedule(due, lambda _t: self._delayed_unlock(queue))
            else:
                self._unlock([queue])
            return True
        finally:
            pq.consume_lock.release()

    def _delayed_unlock(self, queue: MessageQueue) -> None:
        """The unlock of a released queue, ``unlock_delay_ms`` later; skipped when a rebalance gave
        the queue back to this client meanwhile (the lock is in use again)."""
        self._pending_unlocks.pop(queue, None)
        with self._table_lock:
            back_again = queue in self.process_queues
        if not back_again:
            self._unlock([queue])

    def _compute_pull_from_where(self, queue: MessageQueue, now: int) -> int | None:
        """The first offset to pull of a newly taken queue; None when the offset store could not
        be read. CONSUME_FROM_TIMESTAMP without a time starts half an hour before ``now``."""
        moment = self.config.consume_timestamp
        if moment is None:
            moment = now - CONSUME_TIMESTAMP_DEFAULT_AGO_MS
        store = self.brokers[queue.broker_name].store
        return compute_pull_from_where(self.offset_store, store, queue, self.config.consume_from_where, moment)

    # -- locks ------------------------------------------------------------------------------------

    def _lock_one(self, queue: MessageQueue, now: int) -> bool:
        """Lock one queue on its broker (``lockOneMQ``); marks every granted process queue locked."""
        if self._stopping:
            return False
        granted = self.brokers[queue.broker_name].lock_batch(self.group, [queue], self.client_id, now)
        with self._table_lock:
            for each in granted:
                pq = self.process_queues.get(each)
                if pq is not None:
                    pq.locked = True
                    pq.last_lock_timestamp = now
        return queue in granted

    def lock_all(self, now: int) -> None:
        """Renew (or take) the locks of every queue of the process-queue table, per broker
        (``lockAll``); a refused queue is marked unlocked and stops being consumed."""
        with self._table_lock:
            by_broker: dict[str, list[MessageQueue]] = {}
            for queue in self.process_queues:
                by_broker.setdefault(queue.broker_name, []).append(queue)
        for name, queues in sorted(by_broker.items()):
            granted = self.brokers[name].lock_batch(self.group, queues, self.client_id, now)
            with self._table_lock:
                for queue in queues:
                    pq = self.process_queues.get(queue)
                    if pq is None:
                        continue
                    pq.locked = queue in granted
                    if pq.locked:
                        pq.last_lock_timestamp = now

    def _unlock(self, queues: Sequence[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for queue in queues:
            by_broker.setdefault(queue.broker_name, []).append(queue)
        for name, mine in sorted(by_broker.items()):
            self.brokers[name].unlock_batch(self.group, mine, self.client_id)

    def _unlock_all_now(self) -> None:
        with self._table_lock:
            held = list(self.process_queues)
            for pq in self.process_queues.values():
                pq.locked = False
        pending = list(self._pending_unlocks)
        self._pending_unlocks.clear()
        self._unlock(held + [q for q in pending if q not in held])

    def held_queues(self, now: int | None = None) -> set[MessageQueue]:
        """Queues this client consumes now: in its table, not dropped, and (clustering) locked
        with an unexpired client-side lock."""
        moment = self._clock() if now is None else now
        with self._table_lock:
            return {q for q, pq in self.process_queues.items() if self._consumable(pq, moment)}

    def _consumable(self, pq: ProcessQueue, now: int) -> bool:
        if pq.dropped:
            return False
        return not self.clustering or (pq.locked and not self._lock_expired(pq, now))

    def _lock_expired(self, pq: ProcessQueue, now: int) -> bool:
        return pq.is_lock_expired(now, self.config.client_lock_max_live_time_ms)

    # -- pulls ------------------------------------------------------------------------------------

    def _pull_later(self, request: _PullRequest, due: int) -> None:
        self._schedule(due, lambda now: self._pull(request, now))

    def _pull(self, request: _PullRequest, now: int) -> None:
        """One pull of a process queue's next batch (``pullMessage`` and its callback); schedules
        the next pull: at once after messages came, later after nothing came or a refusal."""
        pq, queue = request.process_queue, request.queue
        if pq.dropped or self._stopping:
            return
        pq.last_pull_timestamp = now

        def again(delay: int) -> None:
            self._pull_later(request, now + delay)

        too_many = pq.cached_count > self.config.pull_threshold_for_queue
        if too_many or pq.cached_bytes > self.config.pull_threshold_size_for_queue_mib * 1024 * 1024:
            again(c.PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL)
            return
        if self.clustering:
            if not pq.locked:
                again(c.PULL_TIME_DELAY_MS_WHEN_EXCEPTION)
                return
            if not request.previously_locked:
                offset = self._compute_pull_from_where(queue, now)
                if offset is None:
                    again(c.PULL_TIME_DELAY_MS_WHEN_EXCEPTION)
                    return
                request.previously_locked = True
                request.pull_offset = offset
        broker = self.brokers[queue.broker_name]
        try:
            result = broker.pull(
                queue.topic,
                queue.queue_id,
                request.pull_offset,
                self.config.pull_batch_size,
                self.subscriptions.get(queue.topic, "*"),
            )
        except Exception:  # an unreadable log or a stopped broker: retried, as after a failed RPC
            again(c.PULL_TIME_DELAY_MS_WHEN_EXCEPTION)
            return
        if result.status is PullStatus.OFFSET_ILLEGAL:
            self._offset_moved(request, result.next_begin_offset, now)
            return
        request.pull_offset = result.next_begin_offset
        if result.status is PullStatus.FOUND:
            if result.messages and pq.put_messages(result.messages):
                self._schedule(now, consume=(pq, queue))
            again(0)
            return
        if pq.cached_count == 0:  # correctTagsOffset
            self.offset_store.update_offset(queue, request.pull_offset, increase_only=True)
        again(self.config.pull_idle_delay_ms)

    def _offset_moved(self, request: _PullRequest, next_begin: int, now: int) -> None:
        """OFFSET_ILLEGAL: drop the queue; 10 s later store the corrected offset and let the next
        rebalance take the queue again."""
        request.process_queue.dropped = True

        def fix(_: int) -> None:
            self.offset_store.update_offset(request.queue, next_begin, increase_only=False)
            self._persist_queue(request.queue)
            with self._table_lock:
                if self.process_queues.get(request.queue) is request.process_queue:
                    del self.process_queues[request.queue]

        self._schedule(now + c.OFFSET_MOVED_DELAY_MS, fix)

    # -- consumption ------------------------------------------------------------------------------

    def _queue_lock(self, queue: MessageQueue) -> threading.Lock:
        with self._table_lock:
            return self._queue_locks.setdefault(queue, threading.Lock())

    def _consume(self, pq: ProcessQueue, queue: MessageQueue, clock: Callable[[], int]) -> None:
        """One consume request (``ConsumeRequest.run``): consume the queue's cached messages in
        order until none is left, the queue is suspended, or it must yield."""
        if pq.dropped:
            return
        with self._queue_lock(queue):
            begin = clock()
            if self.clustering and (not pq.locked or self._lock_expired(pq, begin)):
                if not pq.dropped:
                    self._try_lock_later(queue, pq, LOCK_RETRY_OUTSIDE_LOOP_MS, begin)
                return
            while not pq.dropped and not self._stopping:
                now = clock()
                if self.clustering and (not pq.locked or self._lock_expired(pq, now)):
                    self._try_lock_later(queue, pq, LOCK_RETRY_IN_LOOP_MS, now)
                    return
                if now - begin > self.config.max_time_consume_continuously_ms:
                    self._submit_later(pq, queue, RESUBMIT_AFTER_YIELD_MS, now)
                    return
                messages = pq.take_messages(self.config.consume_message_batch_max_size)
                if not messages:
                    return
                context = ConsumeOrderlyContext(queue)
                status = self._call_listener(pq, messages, context)
                if status is None:  # dropped while waiting for the consume lock
                    return
                if not self._process_result(messages, status, context, pq, queue, clock()):
                    return

    def _call_listener(
        self, pq: ProcessQueue, messages: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus | None:
        """The listener's status; SUSPEND when it raised or returned no status; None when the
        queue was dropped before the call could start."""
        with pq.consume_lock:
            if pq.dropped:
                return None
            try:
                status = self.listener(list(messages), context)
            except Exception as error:  # a failing listener suspends its queue, as in RocketMQ
                self.last_listener_error = error
                status = None
        if not isinstance(status, ConsumeOrderlyStatus):
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return status

    def _process_result(
        self,
        messages: list[MessageExt],
        status: ConsumeOrderlyStatus,
        context: ConsumeOrderlyContext,
        pq: ProcessQueue,
        queue: MessageQueue,
        now: int,
    ) -> bool:
        """``processConsumeResult``: commit, roll back or suspend; True to go on consuming."""
        suspend = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        commit_offset = -1
        go_on = True
        if status is suspend:
            if self._check_reconsume_times(messages):
                pq.make_message_to_consume_again(messages)
                self._submit_later(pq, queue, context.suspend_current_queue_time_millis, now)
                go_on = False
            elif context.auto_commit:
                commit_offset = pq.commit()
        elif context.auto_commit or status is ConsumeOrderlyStatus.COMMIT:
            commit_offset = pq.commit()  # with auto_commit, COMMIT and ROLLBACK act as SUCCESS
        elif status is ConsumeOrderlyStatus.ROLLBACK:
            pq.rollback()
            self._submit_later(pq, queue, context.suspend_current_queue_time_millis, now)
            go_on = False
        if commit_offset >= 0 and not pq.dropped:
            self.offset_store.update_offset(queue, commit_offset, increase_only=False)
        return go_on

    def max_reconsume_times(self) -> int:
        """The effective limit: ``max_reconsume_times``, or Java's Integer.MAX_VALUE for -1."""
        configured = self.config.max_reconsume_times
        return c.JAVA_INT_MAX if configured == -1 else configured  # -1 means Integer.MAX_VALUE

    def _check_reconsume_times(self, messages: list[MessageExt]) -> bool:
        """True when the batch must be suspended: a message under the limit (its in-memory
        ``reconsume_times`` grows by one), or one whose send to the DLQ failed."""
        suspend = False
        limit = self.max_reconsume_times()
        for message in messages:
            if message.reconsume_times >= limit:
                message.properties[c.PROPERTY_RECONSUME_TIME] = str(message.reconsume_times)
                if self._send_to_dlq(message):
                    continue
            suspend = True
            message.reconsume_times += 1
        return suspend

    def _send_to_dlq(self, message: MessageExt) -> bool:
        """Hand an exhausted message to its broker's send-back with a negative delay level, so it is
        stored in ``%DLQ%<group>``; False when that failed. The send-back stores the in-memory
        ``reconsume_times`` + 1, as RocketMQ 5.x's orderly send-back does."""
        broker = self.brokers.get(message.broker_name)
        if broker is None:
            return False
        origin = message.properties.get(c.PROPERTY_ORIGIN_MESSAGE_ID) or message.uniq_key or message.msg_id
        try:
            broker.consumer_send_back(
                self.group,
                message.commit_log_offset,
                delay_level=-1,
                max_reconsume_times=self.max_reconsume_times(),
                reconsume_times=message.reconsume_times,
                client_msg_id=origin,
            )
        except Exception as error:  # the message is suspended and tried again, as in RocketMQ
            self.last_listener_error = error
            return False
        return True

    def _submit_later(self, pq: ProcessQueue, queue: MessageQueue, suspend_ms: int, now: int) -> None:
        """Resubmit a consume request after ``suspend_ms`` (-1: the consumer's suspend time),
        clamped to [10, 30000] ms."""
        delay = self.config.suspend_current_queue_time_millis if suspend_ms == -1 else suspend_ms
        delay = min(max(delay, c.SUSPEND_TIME_MIN_MS), c.SUSPEND_TIME_MAX_MS)
        self._schedule(now + delay, consume=(pq, queue))

    def _try_lock_later(self, queue: MessageQueue, pq: ProcessQueue, delay_ms: int, now: int) -> None:
        def retry(at: int) -> None:
            locked = self._lock_one(queue, at)
            self._submit_later(pq, queue, RECONSUME_AFTER_LOCK_MS if locked else RECONSUME_AFTER_LOCK_FAILED_MS, at)

        self._schedule(now + delay_ms, retry)

    # -- offsets ----------------------------------------------------------------------------------

    def _persist_queue(self, queue: MessageQueue) -> None:
        if isinstance(self.offset_store, RemoteBrokerOffsetStore):
            self.offset_store.persist(queue)
        else:
            self.offset_store.persist_all()

    def persist_offsets(self) -> None:
        """Send the offsets of the queues this client has to their brokers (clustering), or write
        the local offset file (broadcasting)."""
        if isinstance(self.offset_store, RemoteBrokerOffsetStore):
            with self._table_lock:
                queues = list(self.process_queues)
            for queue in queues:
                self.offset_store.persist(queue)
        else:
            self.offset_store.persist_all()
