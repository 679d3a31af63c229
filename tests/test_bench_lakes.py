"""``benchmarks/run_all.py --lake DIR``, given once per size, runs on kept lakes of one shape and of
distinct sizes, and refuses others (exit status 2, the reason named)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

ROOT = Path(__file__).resolve().parent.parent


def _kept_lake(root: Path, name: str, shape: str, messages: int) -> Path:
    source = root / name
    (source / "lake").mkdir(parents=True)
    size = {"feature_messages": messages, "bulk_messages": 0} if shape == "users" else {"bulk_messages": messages}
    (source / "lake.json").write_text(json.dumps({"shape": shape, "seed": 1, "feature_messages": 20_000, **size}))
    return source


@pytest.mark.parametrize(
    ("lakes", "refusal"),
    [
        ((("a", "users", 1000), ("b", "benchmark", 2000)), "lakes of shapes ['benchmark', 'users']"),
        ((("a", "users", 1000), ("b", "users", 1000)), "two of the lakes hold the same number of messages"),
        ((("a", "users", 1000), ("missing", None, 0)), "no lake/ and lake.json there"),
    ],
)
def test_kept_lakes_of_two_shapes_or_one_size_are_refused(
    tmp_path: Path, lakes: tuple[tuple[str, str | None, int], ...], refusal: str
) -> None:
    paths = [_kept_lake(tmp_path, n, s, m) if s else tmp_path / n for n, s, m in lakes]
    command = [sys.executable, "benchmarks/run_all.py", *[a for p in paths for a in ("--lake", str(p))]]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and refusal in done.stderr, done.stderr


def test_nightly_lake_writes_a_kept_lake_that_says_what_it_holds(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    command = [sys.executable, "benchmarks/nightly_lake.py", str(kept), "--messages", "300", "--shape", "users"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    facts = json.loads((kept / "lake.json").read_text())
    assert (facts["shape"], facts["feature_messages"], facts["seed"]) == ("users", 300, 1)
    assert (kept / "lake" / "commitlog" / "_delta_log").is_dir() and facts["offset_commit_rows"] > 0

    refused = subprocess.run([*command[:3], "--messages", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--messages 0" in refused.stderr, refused.stderr


@pytest.mark.parametrize("existed", [True, False])
def test_a_table_rolled_back_reads_as_before_the_commits_and_checkpoint_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existed: bool
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from run_all import TableLog

    table_dir = tmp_path / "t"
    if existed:
        write_deltalake(str(table_dir), pa.table({"n": [1, 2]}))
    before = TableLog.of(table_dir)
    for n in range(3, 6):
        write_deltalake(str(table_dir), pa.table({"n": [n]}), mode="append")
    DeltaTable(str(table_dir)).create_checkpoint()
    write_deltalake(str(table_dir), pa.table({"n": [9]}), mode="overwrite")
    assert (table_dir / "_delta_log" / "_last_checkpoint").exists()
    before.roll_back()
    if not existed:
        assert not table_dir.exists()
        return
    rolled = DeltaTable(str(table_dir))
    assert rolled.version() == before.version == 0
    assert sorted(rolled.to_pyarrow_table()["n"].to_pylist()) == [1, 2]
    assert not (table_dir / "_delta_log" / "_last_checkpoint").exists()
