"""The broker: one per ``broker_name`` per lake, owning that broker's partition of ``commitlog``.

:class:`Broker` holds the name lock (an OS file lock, released when the process dies), recovers its
offsets on start, and serves puts (:mod:`~broker_model.broker.put`), pulls from its message store,
send-backs (:mod:`~broker_model.broker.send_back`), consumer offsets, orderly-queue locks and
consumer group membership. Services that write through it (schedule, transaction check) are
started by its owner and attached, so that :meth:`Broker.shutdown` stops them first.
See docs/architecture.md.
"""

from __future__ import annotations

import collections
import os
import random
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from broker_model.broker.config import BrokerConfig, SubscriptionGroupConfig, TopicConfig
from broker_model.broker.consumer_groups import ConsumerGroupManager
from broker_model.broker.consumer_offsets import ConsumerOffsetManager
from broker_model.broker.put import PutGroup
from broker_model.broker.rebalance_locks import RebalanceLockManager
from broker_model.broker.send_back import SendBack
from broker_model.common import MessageQueue, parse_host, validate_name
from broker_model.common import constants as c
from broker_model.store import (
    AppendLog,
    BrokerNameLock,
    MessageStore,
    PullResult,
    append_rows,
    ensure_table,
    ingested_end,
    read_table,
)
from schemas.catalog import BROKERS, COMMITLOG, TOPIC_CONFIG
from schemas.errors import ValidationError


class BrokerService(Protocol):
    """A service thread that writes through a broker (the schedule and transaction check services)."""

    def stop(self) -> None: ...


class Broker(SendBack):
    """One broker of the lake: owns its partition of ``commitlog`` (see module docstring)."""

    def __init__(self, config: BrokerConfig) -> None:
        validate_name(config.broker_name, "broker_name", c.GROUP_MAX_LENGTH)
        self.config = config
        self.broker_name = config.broker_name
        self.store_host = str(parse_host(config.store_host, "store_host"))
        self._store_address = parse_host(config.store_host, "store_host")
        self._msg_id_prefix = self._store_address.to_bytes()  # msg_id = prefix + offset, as hex
        self._clock = config.clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: PutGroup | None = None  # accumulating puts
        self._committing: PutGroup | None = None  # being committed
        self._recent_puts: collections.deque[int] = collections.deque(maxlen=8)  # puts of the last commits
        self._full_group = 0  # the most of those: a group that large commits without lingering
        self._running = False
        self._failed: BaseException | None = None
        self._lock_file: BrokerNameLock | None = None
        self._committer: threading.Thread | None = None
        self.segment_size = config.segment_size or c.DEFAULT_SEGMENT_SIZE
        self.next_commit_log_offset = 0
        self.segment_base = 0
        self.max_offsets: dict[tuple[str, int], int] = {}
        self.topics: dict[str, int] = {}
        self.topic_configs: dict[str, TopicConfig] = {}  # the latest topic_config row per topic
        self._topic_times: dict[str, int] = {}  # the time of each
        self._topic_configs_version = -1  # the topic_config version they were read at
        self._topic_configs_checked = float("-inf")  # when refresh_topics last looked (monotonic seconds)
        self._topics_refresh_lock = threading.Lock()
        self.commits = 0
        self.lingered_steps = 0  # group commit steps that passed with no put arriving to end them
        self.store = MessageStore(
            config.lake, config.broker_name, cache_bytes=config.store_cache_bytes, clock=config.clock
        )
        self.offsets = ConsumerOffsetManager(config.lake, config.broker_name, config.clock)
        self.transaction_producers: dict[str, list[Any]] = {}  # producer group -> live transactional producers
        self.rebalance_locks = RebalanceLockManager(clock=config.clock)  # orderly queue locks of this broker
        self.consumer_groups = ConsumerGroupManager(clock=config.clock)  # live consumer clients per group
        self._stopped = threading.Event()
        self._persister: threading.Thread | None = None
        self._services: list[BrokerService] = []  # attached by their owners: see attach
        self._subscription_groups: dict[str, SubscriptionGroupConfig] = {}
        self._subscription_lock = threading.Lock()
        self._groups_version = -1  # the subscription_group version the groups were read at
        self._groups_checked = float("-inf")  # when refresh_subscription_groups last looked
        self._groups_refresh_lock = threading.Lock()
        self._group_times: dict[str, int] = {}  # the time of each group's latest row, deleted or not
        self._retry_random = random.Random()  # picks a retry queue, as the broker's send-back does
        self._served: OrderedDict[int, tuple[str, int, int]] = OrderedDict()  # see _remember_served
        self._served_lock = threading.Lock()

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> Broker:
        """Lock the broker name, create missing tables, recover state, start the committer.

        Raises:
            BrokerLockedError: another live process runs a broker with this name on this lake.
            ValidationError: ``segment_size`` differs from the size this broker used before.
        """
        self._acquire_name_lock()
        try:
            for spec in (COMMITLOG, TOPIC_CONFIG, BROKERS):
                ensure_table(self.config.lake, spec)
            if ingested_end(self.config.lake, self.broker_name) is not None:
                raise ValidationError(
                    "broker_name",
                    self.broker_name,
                    "is a RocketMQ broker whose log comes from its store (ingest-store)",
                    "start a broker of ours under a name of its own",
                )
            self.segment_size = self._settle_segment_size()
            self._log = AppendLog(
                COMMITLOG.location(self.config.lake), COMMITLOG, self.config.fsync, self.config.checkpoint_interval
            )
            self._recover()
            self.store.load()
            self.store.fed_locally = True
            self.offsets.load()
            self._load_subscription_groups()
            self._record_start()
        except BaseException:
            self._release_name_lock()
            raise
        self._running = True
        self._committer = threading.Thread(target=self._commit_loop, name=f"commit-{self.broker_name}", daemon=True)
        self._committer.start()
        self._stopped.clear()
        self._persister = threading.Thread(target=self._persist_loop, name=f"offsets-{self.broker_name}", daemon=True)
        self._persister.start()
        return self

    def attach(self, service: BrokerService) -> None:
        """Have :meth:`shutdown` stop ``service`` (a thread writing through this broker) first."""
        self._services.append(service)

    @property
    def services(self) -> tuple[BrokerService, ...]:
        """The attached services still running, in the order they were attached."""
        return tuple(self._services)

    def shutdown(self) -> None:
        """Commit everything pending, stop the committer and release the broker name."""
        while self._services:  # their rounds write through this broker: stop them first
            self._services.pop().stop()
        with self._lock:
            if not self._running:
                return
            self._running = False
            self._wake.notify_all()
        if self._committer is not None:
            self._committer.join()
        self._stopped.set()
        if self._persister is not None:
            self._persister.join()
        self.offsets.persist()
        self._log.wait_for_checkpoint()
        self._release_name_lock()

    def __enter__(self) -> Broker:
        return self if self._running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`shutdown`."""
        return self._running

    def _persist_loop(self) -> None:
        """``persistAll`` of consumer offsets every ``offset_persist_interval_ms``."""
        while not self._stopped.wait(self.config.offset_persist_interval_ms / 1000):
            try:
                self.offsets.persist()
            except Exception:  # kept pending and retried at the next round or at shutdown
                continue

    def commit_offset(
        self, group: str, topic: str, queue_id: int, offset: int, client_id: str | None = None, source: str = "consumer"
    ) -> None:
        """Commit a clustering group's next offset of one of this broker's queues (persisted to
        the lake within ``offset_persist_interval_ms``)."""
        self.offsets.commit_offset(group, topic, queue_id, offset, client_id, source)

    def lock_batch(
        self, group: str, queues: Iterable[MessageQueue], client_id: str, now: int | None = None
    ) -> set[MessageQueue]:
        """``LOCK_BATCH_MQ``: lock this broker's ``queues`` for an orderly client of ``group``;
        returns the queues it now holds (see :meth:`RebalanceLockManager.lock_batch`).

        Raises:
            ValidationError: a queue of another broker, an empty group or client id.
        """
        wanted = self._own_queues(queues)
        return self.rebalance_locks.lock_batch(group, wanted, client_id, now)

    def unlock_batch(self, group: str, queues: Iterable[MessageQueue], client_id: str) -> set[MessageQueue]:
        """``UNLOCK_BATCH_MQ``: release the locks of ``queues`` that ``client_id`` holds; returns
        the queues released.

        Raises:
            ValidationError: a queue of another broker, an empty group or client id.
        """
        return self.rebalance_locks.unlock_batch(group, self._own_queues(queues), client_id)

    def _own_queues(self, queues: Iterable[MessageQueue]) -> list[MessageQueue]:
        wanted = list(queues)
        for queue in wanted:
            if queue.broker_name != self.broker_name:
                raise ValidationError(
                    "queue.broker_name",
                    queue.broker_name,
                    f"is not this broker ({self.broker_name!r})",
                    "lock each queue on the broker that holds it",
                )
        return wanted

    def heartbeat(self, group: str, client_id: str, now: int | None = None) -> bool:
        """A consumer client's heartbeat for ``group``; True when it joined the group now."""
        return self.consumer_groups.register(group, client_id, now)

    def unregister_client(self, group: str, client_id: str) -> bool:
        """A consumer client leaves ``group`` (at its shutdown); True when it was a member."""
        return self.consumer_groups.unregister(group, client_id)

    def consumer_ids(self, group: str, now: int | None = None) -> list[str]:
        """Live client ids of ``group`` on this broker, sorted (``GET_CONSUMER_LIST_BY_GROUP``)."""
        return self.consumer_groups.client_ids(group, now)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset of the queue, -1 when none (``queryOffset``)."""
        return self.offsets.query_offset(group, topic, queue_id)

    def _acquire_name_lock(self) -> None:
        self._lock_file = BrokerNameLock(self.config.lake, self.broker_name).acquire()

    def _release_name_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.release()
            self._lock_file = None

    def _settle_segment_size(self) -> int:
        rows = read_table(self.config.lake, BROKERS, ["broker_name", "segment_size", "started_timestamp"])
        mine = rows.filter(pc.equal(rows["broker_name"], self.broker_name))
        if mine.num_rows == 0:
            size = self.config.segment_size or c.DEFAULT_SEGMENT_SIZE
        else:
            size = int(mine.sort_by([("started_timestamp", "descending")])["segment_size"][0].as_py())
            if self.config.segment_size not in (None, size):
                raise ValidationError(
                    "segment_size",
                    self.config.segment_size,
                    f"broker {self.broker_name!r} already writes segments of {size} bytes",
                    "omit segment_size or pass the stored size",
                )
        if size < 4096:
            raise ValidationError("segment_size", size, "is below 4096 bytes", "use a larger segment size")
        return size

    def _record_start(self) -> None:
        row = {
            "broker_name": [self.broker_name],
            "store_host": [self.store_host],
            "segment_size": [self.segment_size],
            "flush_mode": [self.config.flush_mode],
            "started_timestamp": [self._clock()],
            "process": [f"{os.getpid()}@{socket.gethostname()}"],
        }
        append_rows(self.config.lake, BROKERS, pa.table(row))

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        tag_expression: str | None = "*",
        suspend_timeout_ms: int = 0,
        long_polling: bool = True,
    ) -> PullResult:
        """Pull from one of this broker's queues (see :meth:`MessageStore.pull`); the queue must
        be committed to be visible, as RocketMQ only serves dispatched messages."""
        result = self.store.pull(topic, queue_id, offset, max_msgs, tag_expression, suspend_timeout_ms, long_polling)
        self._remember_served(result.messages)
        return result
