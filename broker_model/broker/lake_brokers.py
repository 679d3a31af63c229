"""The brokers a lake has run: each one's last store host, and starting several of them in this
process (tools that write through a broker: redrive, DLQ routing, replay into a topic)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from broker_model.broker.config import BrokerConfig, FlushMode
from broker_model.broker.controller import Broker
from broker_model.store import read_table
from schemas.catalog import BROKERS
from schemas.errors import LakeError


def last_store_hosts(lake: str | Path) -> dict[str, str]:
    """Each broker of the lake's ``brokers`` table with the store host it last started with."""
    starts = read_table(lake, BROKERS, ["broker_name", "store_host", "started_timestamp"]).to_pylist()
    return {row["broker_name"]: row["store_host"] for row in sorted(starts, key=lambda r: r["started_timestamp"])}


def start_lake_brokers(
    lake: str | Path, names: Sequence[str], flush_mode: FlushMode = "SYNC_FLUSH", new_ok: bool = False
) -> dict[str, Broker]:
    """Start a broker for each of ``names`` with the store host it last ran with (so its message
    ids keep their host), all or none: a broker that cannot start shuts down those started before.
    A name the lake has never run starts with the default store host when ``new_ok``.

    Raises:
        LakeError: a name the lake has never run, unless ``new_ok``.
        BrokerLockedError: another process runs one of the brokers.
    """
    hosts = last_store_hosts(lake)
    unknown = [name for name in names if name not in hosts]
    if unknown and not new_ok:
        raise LakeError(f"brokers {unknown} are not in the lake's brokers table")
    started: dict[str, Broker] = {}
    try:
        for name in names:
            config = BrokerConfig(
                Path(lake), name, store_host=hosts.get(name, BrokerConfig.store_host), flush_mode=flush_mode
            )
            started[name] = Broker(config).start()
    except BaseException:
        for broker in started.values():
            broker.shutdown()
        raise
    return started
