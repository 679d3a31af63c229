"""The offset reset tool on a real lake with real brokers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from broker_model.broker import Broker, BrokerConfig, InnerMessage
from broker_model.store import MessageStore
from jobs.reset_offsets import main
from schemas.errors import ValidationError
from tests.helpers import ManualClock

BASE = 1_800_000_000_000


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[Path]:
    """Queue Orders:0 holds offsets 0..9 stored at BASE + 10 * offset; the group cg committed 6
    on Orders:0 and 2 on Orders:1 (which holds 3 messages)."""
    clock = ManualClock(BASE)
    with Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", clock=clock)).start() as broker:
        broker.ensure_topic("Orders", 2)
        for offset in range(10):
            clock.now = BASE + 10 * offset
            broker.put_message(InnerMessage("Orders", 0, b"m", {}, born_host="10.0.0.1:1"))
        for _ in range(3):
            broker.put_message(InnerMessage("Orders", 1, b"m", {}, born_host="10.0.0.1:1"))
        broker.commit_offset("cg", "Orders", 0, 6)
        broker.commit_offset("cg", "Orders", 1, 2)
    yield tmp_path


def _versions(lake: Path) -> int:
    return DeltaTable(str(lake / "consumer_offset_commits")).version()


def _offset(lake: Path, queue_id: int, group: str = "cg") -> int:
    with Broker(BrokerConfig(lake)).start() as broker:
        return broker.query_offset(group, "Orders", queue_id)


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [(BASE - 5, 0), (BASE, 0), (BASE + 30, 3), (BASE + 31, 4), (BASE + 90, 9), (BASE + 91, 10)],
)
def test_time_lookup_is_the_first_message_at_or_after_the_time(lake: Path, timestamp: int, expected: int) -> None:
    assert MessageStore(lake, "broker-a").load().offset_by_time("Orders", 0, timestamp) == expected


def test_dry_run_prints_the_plan_and_writes_nothing(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _versions(lake)
    assert main(["--lake", str(lake), "--group", "cg", "--topic", "Orders:0", "--to-timestamp", str(BASE + 31)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("cg ")]
    assert rows == [["cg", "broker-a", "Orders", "0", "6", "4", "0", "10", "2", "0"]]
    assert "2 message(s) delivered again" in out and "dry run: nothing written" in out
    assert _versions(lake) == before


def test_execute_moves_offsets_a_running_broker_sees_them_and_undo_restores_them(
    lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Broker(BrokerConfig(lake)).start() as running:
        main(
            [
                "--lake",
                str(lake),
                "--group",
                "cg",
                "--topic",
                "Orders",
                "--to-earliest",
                "--execute",
                "--reason",
                "re-read after a bug fix",
            ]
        )
        reset_id = capsys.readouterr().out.split("executed reset ")[1].split(":")[0]
        assert (running.query_offset("cg", "Orders", 0), running.query_offset("cg", "Orders", 1)) == (0, 0)
    rows = DeltaTable(str(lake / "consumer_offset_commits")).to_pyarrow_table().to_pylist()
    audit = sorted((r["queue_id"], r["previous_offset"], r["offset"]) for r in rows if r["reset_id"] == reset_id)
    assert audit == [(0, 6, 0), (1, 2, 0)]
    assert {r["reason"] for r in rows if r["reset_id"] == reset_id} == {"re-read after a bug fix"}
    assert all(r["source"] == "reset" and r["operator"] for r in rows if r["reset_id"] == reset_id)

    before = _versions(lake)
    main(["--lake", str(lake), "--undo", reset_id, "--execute"])
    assert _versions(lake) == before + 1  # both queues in one atomic commit
    assert (_offset(lake, 0), _offset(lake, 1)) == (6, 2)


def test_targets_outside_the_queue_are_clamped_and_the_clamp_is_reported(
    lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["--lake", str(lake), "--group", "cg", "--topic", "Orders:0", "--to-offset", "50", "--execute"])
    assert "clamped from 50 to [0, 10]" in capsys.readouterr().out
    assert _offset(lake, 0) == 10
    main(["--lake", str(lake), "--group", "cg", "--topic", "Orders:0", "--shift-by", "-99", "--execute"])
    assert "clamped from -89 to [0, 10]" in capsys.readouterr().out
    assert _offset(lake, 0) == 0


def test_a_reset_that_moves_nothing_says_so_and_writes_nothing(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _versions(lake)
    main(["--lake", str(lake), "--group", "cg", "--topic", "Orders:0", "--to-offset", "6", "--execute"])
    assert "nothing to move" in capsys.readouterr().out
    assert _versions(lake) == before


def test_export_then_from_file_applies_the_exported_plan(lake: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.csv"
    main(["--lake", str(lake), "--group", "cg", "--topic", "Orders", "--to-latest", "--export", str(plan)])
    assert plan.read_text().splitlines()[0].startswith("group,broker_name,topic,queue_id,current_offset,target_offset")
    main(["--lake", str(lake), "--group", "cg", "--topic", "Orders", "--from-file", str(plan), "--execute"])
    assert (_offset(lake, 0), _offset(lake, 1)) == (10, 3)


def test_by_duration_counts_back_from_now(lake: Path) -> None:
    main(["--lake", str(lake), "--group", "cg", "--topic", "Orders:0", "--by-duration", "P3650D", "--execute"])
    assert _offset(lake, 0) == 0  # ten years back is before every message


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--group", "nobody", "--all-topics", "--to-latest"], "group='nobody'"),
        (["--group", "cg", "--topic", "NoSuchTopic", "--to-latest"], "topic='NoSuchTopic'"),
        (["--group", "cg", "--topic", "Orders", "--to-datetime", "2026-01-01T00:00:00"], "to_datetime="),
        (["--group", "cg", "--topic", "Orders", "--by-duration", "1 day"], "by_duration='1 day'"),
        (["--group", "cg", "--topic", "Orders:a", "--to-latest"], "topic='Orders:a'"),
        (["--group", "cg", "--topic", "Orders"], "strategy"),
        (["--undo", "reset-000000000000"], "undo='reset-000000000000'"),
    ],
)
def test_bad_requests_name_the_option_and_write_nothing(lake: Path, args: list[str], field: str) -> None:
    before = _versions(lake)
    with pytest.raises(ValidationError, match=field):
        main(["--lake", str(lake), *args])
    assert _versions(lake) == before
