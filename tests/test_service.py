"""What the broker's services share, on a real broker: the rounds of a periodic service, and
starting the brokers a lake has run, all or none."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from broker_model.broker import Broker, BrokerConfig, start_lake_brokers
from broker_model.broker.service import PeriodicService
from schemas.errors import BrokerLockedError, LakeError


class Flaky(PeriodicService):
    thread_name = "flaky"

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker, interval_ms=10, first_delay_ms=0)
        self.rounds: list[int] = []
        self.second = threading.Event()

    def run_round(self, now: int) -> object:
        self.rounds.append(now)
        if len(self.rounds) == 1:
            raise OSError("the first round fails")
        self.second.set()
        return None


def test_a_failed_round_is_logged_and_the_next_round_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH")).start()
    try:
        with caplog.at_level(logging.ERROR, logger="broker_model.broker.service"):
            service = Flaky(broker).start()
            assert service.second.wait(10)
        assert broker.services == (service,)
        assert "Flaky round failed on broker broker-a" in caplog.text
    finally:
        broker.shutdown()
    assert broker.services == ()
    assert not [t for t in threading.enumerate() if t.name == "service-broker-a"]  # stopped with the broker


def test_the_lake_brokers_start_with_their_store_hosts_all_or_none(tmp_path: Path) -> None:
    with pytest.raises(LakeError, match=r"\['broker-a'\] are not in the lake's brokers table"):
        start_lake_brokers(tmp_path, ["broker-a"])
    Broker(BrokerConfig(tmp_path, "broker-a", store_host="127.0.0.7:10911")).start().shutdown()
    Broker(BrokerConfig(tmp_path, "broker-b", store_host="127.0.0.8:10911")).start().shutdown()
    held = Broker(BrokerConfig(tmp_path, "broker-b")).start()  # another owner of broker-b
    try:
        with pytest.raises(BrokerLockedError):
            start_lake_brokers(tmp_path, ["broker-a", "broker-b"])
        again = start_lake_brokers(tmp_path, ["broker-a"])  # broker-a was shut down, not left locked
        assert again["broker-a"].store_host == "127.0.0.7:10911"
        again["broker-a"].shutdown()
    finally:
        held.shutdown()
    fresh = start_lake_brokers(tmp_path, ["broker-c"], new_ok=True)
    assert fresh["broker-c"].store_host == BrokerConfig.store_host
    fresh["broker-c"].shutdown()
