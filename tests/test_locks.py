"""Broker queue locks, group membership and the averaging allocation (no Spark)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_model.broker import Broker, BrokerConfig, ConsumerGroupManager, RebalanceLockManager
from broker_model.client import allocate_averagely
from broker_model.common import MessageQueue
from schemas.errors import ValidationError

T0 = 1_800_000_000_000
LEASE = 60_000
QUEUES = [MessageQueue("broker-a", "T", q) for q in range(4)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    started = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH")).start()
    yield started
    started.shutdown()


# -- the lock table ---------------------------------------------------------------------------------


def test_a_free_queue_goes_to_the_first_client_and_is_refused_to_the_second() -> None:
    locks = RebalanceLockManager()
    assert locks.lock_batch("g", QUEUES[:2], "A", now=T0) == set(QUEUES[:2])
    assert locks.lock_batch("g", QUEUES[1:3], "B", now=T0 + 1) == {QUEUES[2]}
    assert [locks.holder("g", q, now=T0 + 2) for q in QUEUES] == ["A", "A", "B", None]
    assert locks.lock_batch("other-group", QUEUES[:1], "B", now=T0) == {QUEUES[0]}  # locks are per group


def test_a_lock_expires_only_after_the_lease_when_its_holder_stops_renewing() -> None:
    locks = RebalanceLockManager()
    locks.lock_batch("g", [QUEUES[0]], "A", now=T0)
    assert locks.lock_batch("g", [QUEUES[0]], "B", now=T0 + LEASE) == set()  # exactly the lease: still held
    assert locks.is_locked("g", QUEUES[0], "A", now=T0 + LEASE)
    assert not locks.is_locked("g", QUEUES[0], "A", now=T0 + LEASE + LEASE + 1)  # A stopped renewing
    assert locks.lock_batch("g", [QUEUES[0]], "B", now=T0 + 2 * LEASE + 1) == {QUEUES[0]}
    assert locks.holder("g", QUEUES[0], now=T0 + 2 * LEASE + 1) == "B"
    assert not locks.is_locked("g", QUEUES[0], "A", now=T0 + 2 * LEASE + 2)


@pytest.mark.parametrize("renew", ["lock_batch", "is_locked"])
def test_the_holder_renews_its_lease_by_locking_again_or_by_asking(renew: str) -> None:
    locks = RebalanceLockManager()
    locks.lock_batch("g", [QUEUES[0]], "A", now=T0)
    if renew == "lock_batch":
        assert locks.lock_batch("g", [QUEUES[0]], "A", now=T0 + 50_000) == {QUEUES[0]}
    else:
        assert locks.is_locked("g", QUEUES[0], "A", now=T0 + 50_000)
    assert locks.lock_batch("g", [QUEUES[0]], "B", now=T0 + 50_000 + LEASE) == set()
    assert locks.lock_batch("g", [QUEUES[0]], "B", now=T0 + 50_000 + LEASE + 1) == {QUEUES[0]}


def test_only_the_holder_unlocks_and_then_anyone_may_lock() -> None:
    locks = RebalanceLockManager()
    locks.lock_batch("g", QUEUES[:2], "A", now=T0)
    assert locks.unlock_batch("g", QUEUES[:2], "B") == set()
    assert locks.holder("g", QUEUES[0], now=T0) == "A"
    assert locks.unlock_batch("g", [QUEUES[0]], "A") == {QUEUES[0]}
    assert locks.lock_batch("g", QUEUES[:2], "B", now=T0 + 1) == {QUEUES[0]}


def test_lock_all_expired_is_true_only_when_every_lock_of_the_group_is_past_its_lease() -> None:
    locks = RebalanceLockManager()
    assert locks.is_lock_all_expired("g", now=T0)
    locks.lock_batch("g", [QUEUES[0]], "A", now=T0)
    locks.lock_batch("g", [QUEUES[1]], "B", now=T0 + 10_000)
    assert not locks.is_lock_all_expired("g", now=T0 + LEASE + 1)  # B's is still live
    assert locks.is_lock_all_expired("g", now=T0 + 10_000 + LEASE + 1)
    assert locks.is_lock_all_expired("other", now=T0)


def test_lock_requests_name_group_and_client() -> None:
    locks = RebalanceLockManager()
    with pytest.raises(ValidationError, match="client_id"):
        locks.lock_batch("g", QUEUES, "", now=T0)
    with pytest.raises(ValidationError, match="group"):
        locks.unlock_batch("", QUEUES, "A")
    with pytest.raises(ValidationError, match="lock_max_live_time_ms"):
        RebalanceLockManager(lock_max_live_time_ms=0)


def test_two_clients_competing_in_threads_never_hold_a_queue_at_once() -> None:
    """Each thread locks a random subset, marks what it got as its own (failing if the other
    thread marked it), unmarks and unlocks; many rounds with the real clock."""
    locks = RebalanceLockManager()
    marks: dict[MessageQueue, str] = {}
    marks_lock = threading.Lock()
    conflicts: list[tuple[MessageQueue, str, str]] = []
    held_counts = {"A": 0, "B": 0}

    start = threading.Barrier(2)

    def compete(client: str, seed: int) -> None:
        rng = random.Random(seed)
        held: set[MessageQueue] = set()
        start.wait()
        for _ in range(3000):
            wanted = rng.sample(QUEUES, rng.randint(1, len(QUEUES)))
            got = locks.lock_batch("g", wanted, client)
            assert got <= set(wanted)
            with marks_lock:
                for queue in got:
                    other = marks.get(queue)
                    if other is not None and other != client:
                        conflicts.append((queue, other, client))
                    marks[queue] = client
                held_counts[client] += len(got)
            held |= got
            release = {q for q in held if rng.random() < 0.5}
            with marks_lock:
                for queue in release:
                    marks.pop(queue, None)
            locks.unlock_batch("g", release, client)
            held -= release
            time.sleep(0)  # let the other thread in between rounds

    threads = [threading.Thread(target=compete, args=(name, seed)) for name, seed in (("A", 1), ("B", 2))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert conflicts == []
    assert held_counts["A"] > 0 and held_counts["B"] > 0  # both really got queues


# -- the broker's side ------------------------------------------------------------------------------


def test_each_broker_locks_only_its_own_queues(broker: Broker) -> None:
    assert broker.lock_batch("g", QUEUES[:2], "A", now=T0) == set(QUEUES[:2])
    assert broker.rebalance_locks.holder("g", QUEUES[0], now=T0) == "A"
    with pytest.raises(ValidationError, match="broker_name"):
        broker.lock_batch("g", [MessageQueue("broker-b", "T", 0)], "A", now=T0)
    assert broker.unlock_batch("g", QUEUES[:2], "A") == set(QUEUES[:2])
    assert broker.rebalance_locks.is_lock_all_expired("g", now=T0)


def test_broker_membership_follows_heartbeats_unregistering_and_expiry(broker: Broker) -> None:
    assert broker.heartbeat("g", "B", now=T0)
    assert broker.heartbeat("g", "A", now=T0 + 1000)
    assert not broker.heartbeat("g", "A", now=T0 + 2000)  # already a member
    assert broker.consumer_ids("g", now=T0 + 2000) == ["A", "B"]
    assert broker.consumer_ids("g", now=T0 + 120_000) == ["A", "B"]  # B silent exactly 120 s
    assert broker.consumer_ids("g", now=T0 + 120_001) == ["A"]
    assert broker.unregister_client("g", "A")
    assert not broker.unregister_client("g", "A")
    assert broker.consumer_ids("g", now=T0 + 120_001) == []


def test_membership_version_changes_on_join_leave_and_expiry_only() -> None:
    groups = ConsumerGroupManager(channel_expired_timeout_ms=100)
    before = groups.version("g", now=0)
    groups.register("g", "A", now=0)
    joined = groups.version("g", now=0)
    groups.register("g", "A", now=50)
    assert groups.version("g", now=50) == joined != before
    assert groups.version("g", now=151) != joined  # A expired


# -- AllocateMessageQueueAveragely -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queue_count", "client_count", "shares"),
    [
        (4, 2, [[0, 1], [2, 3]]),
        (5, 2, [[0, 1, 2], [3, 4]]),
        (5, 3, [[0, 1], [2, 3], [4]]),
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (2, 3, [[0], [1], []]),
        (3, 3, [[0], [1], [2]]),
        (1, 1, [[0]]),
    ],
)
def test_averaging_split_matches_rocketmq(queue_count: int, client_count: int, shares: list[list[int]]) -> None:
    queues = [MessageQueue("broker-a", "T", q) for q in range(queue_count)]
    clients = [f"c{i}" for i in range(client_count)]
    got = [[q.queue_id for q in allocate_averagely("g", cid, queues, clients)] for cid in clients]
    assert got == shares


def test_allocation_sorts_queues_by_topic_broker_and_queue_and_clients_by_id() -> None:
    queues = [MessageQueue(b, "T", q) for b in ("broker-b", "broker-a") for q in (1, 0)]
    first = allocate_averagely("g", "10.0.0.1@1", queues, ["10.0.0.2@1", "10.0.0.1@1"])
    assert first == [MessageQueue("broker-a", "T", 0), MessageQueue("broker-a", "T", 1)]
    assert allocate_averagely("g", "stranger", queues, ["10.0.0.1@1"]) == []
    with pytest.raises(ValidationError, match="queues"):
        allocate_averagely("g", "a", [], ["a"])
    with pytest.raises(ValidationError, match="current_client_id"):
        allocate_averagely("g", "", queues, ["a"])


@given(st.integers(1, 40), st.integers(1, 12))
def test_allocation_shares_are_disjoint_cover_every_queue_and_differ_by_one_at_most(
    queue_count: int, client_count: int
) -> None:
    queues = [MessageQueue("broker-a", "T", q) for q in range(queue_count)]
    clients = [f"c{i:02d}" for i in range(client_count)]
    shares = [allocate_averagely("g", cid, queues, clients) for cid in clients]
    flat = [q for share in shares for q in share]
    assert sorted(flat) == queues and len(set(flat)) == queue_count
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1
