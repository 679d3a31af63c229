"""Where a Spark session's Delta jars come from: Ivy's resolution at a start, or the jars an earlier
start had it resolve (``jobs.lake.session.with_delta_jars``), checked on the conf it builds and on
real JVM starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.lake import delta_package, with_delta_jars
from jobs.lake.session import (
    CACHE_HOME_ENV,
    SUBMIT_ARGS_ENV,
    delta_jars_record,
    delta_submit_flags,
    recorded_delta_jars,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user cache directory of the test's own, and Ivy at its defaults."""
    monkeypatch.setenv(CACHE_HOME_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(SUBMIT_ARGS_ENV, raising=False)
    return tmp_path / "cache"


def _record(tmp_path: Path, *names: str, missing: str | None = None) -> list[str]:
    """Jar files under ``tmp_path`` (``missing`` is listed but not there), listed in the record."""
    jars = []
    for name in names:
        jar = tmp_path / "ivy" / "jars" / name
        jar.parent.mkdir(parents=True, exist_ok=True)
        if name != missing:
            jar.write_bytes(b"PK")
        jars.append(str(jar))
    delta_jars_record().parent.mkdir(parents=True, exist_ok=True)
    delta_jars_record().write_text("\n".join(jars) + "\n", encoding="utf-8")
    return jars


DELTA_JAR = "io.delta_delta-spark_4.2_2.13-4.4.0.jar"
STORAGE_JAR = "io.delta_delta-storage-4.4.0.jar"


def test_without_a_record_ivy_resolves_the_delta_package(cache: Path) -> None:
    conf = with_delta_jars({"spark.jars.packages": "org.example:other:1.0"})
    assert conf["spark.jars.packages"] == f"org.example:other:1.0,{delta_package()}"
    assert "spark.jars" not in conf and recorded_delta_jars() == []
    assert delta_jars_record().parent == cache / "rmq-lake"


def test_a_record_of_jars_that_are_there_replaces_the_resolution(cache: Path, tmp_path: Path) -> None:
    jars = _record(tmp_path, DELTA_JAR, STORAGE_JAR)
    conf = with_delta_jars({"spark.jars": "/opt/mine.jar"})
    assert conf["spark.jars"].split(",") == ["/opt/mine.jar", *jars]
    assert "spark.jars.packages" not in conf


@pytest.mark.parametrize(
    ("case", "conf", "submit_args"),
    [
        ("a listed jar is gone", {}, None),
        ("no Delta jar is listed", {}, None),
        ("Ivy's home is given in the confs", {"spark.jars.ivy": "/elsewhere"}, None),
        ("Ivy's repositories are given in the confs", {"spark.jars.repositories": "https://repo.example"}, None),
        ("Ivy's settings are given to spark-submit", {}, "--conf spark.jars.ivySettings=/x.xml pyspark-shell"),
    ],
)
def test_ivy_resolves_the_delta_package_when_the_record_cannot_stand_for_it(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, conf: dict[str, str], submit_args: str
) -> None:
    if case == "a listed jar is gone":
        _record(tmp_path, DELTA_JAR, STORAGE_JAR, missing=STORAGE_JAR)
    elif case == "no Delta jar is listed":
        _record(tmp_path, STORAGE_JAR)
    else:
        _record(tmp_path, DELTA_JAR, STORAGE_JAR)
    if submit_args is not None:
        monkeypatch.setenv(SUBMIT_ARGS_ENV, submit_args)
    built = with_delta_jars(conf)
    assert built["spark.jars.packages"] == delta_package(), case
    assert "spark.jars" not in built, case


def test_delta_jars_named_by_the_caller_are_left_as_they_are(cache: Path, tmp_path: Path) -> None:
    _record(tmp_path, DELTA_JAR, STORAGE_JAR)
    named = {"spark.jars": "/opt/delta-spark_2.13-4.4.0.jar"}
    assert with_delta_jars(named) == named


@pytest.mark.parametrize(
    ("submit_args", "recorded"),
    [
        ([], True),
        (["--master", "spark://127.0.0.1:7077", "--conf", "spark.executor.memory=768m"], True),
        (["--conf", "spark.jars.ivy=/elsewhere"], False),
        (["--repositories", "https://repo.example"], False),
        (["--jars", "/opt/mine.jar"], False),
        (["--conf", "spark.jars=/opt/mine.jar"], False),
    ],
)
def test_spark_submit_is_given_the_recorded_jars_unless_its_flags_set_ivy_or_jars(
    cache: Path, tmp_path: Path, submit_args: list[str], recorded: bool
) -> None:
    jars = _record(tmp_path, DELTA_JAR, STORAGE_JAR)
    expected = ["--jars", ",".join(jars)] if recorded else ["--packages", delta_package()]
    assert delta_submit_flags(submit_args) == expected
    delta_jars_record().unlink()
    assert delta_submit_flags(submit_args) == ["--packages", delta_package()]


_START = """
import sys
from jobs.lake import build_session
spark = build_session("jars", master="local[1]", engine="delta-spark")
conf = spark.sparkContext.getConf()
print("packages", conf.get("spark.jars.packages", "-"))
print("jars", conf.get("spark.jars", "-"))
if sys.argv[1:]:  # build_session checked that the Delta classes load; this uses them
    spark.range(3).write.format("delta").save(sys.argv[1])
    print("rows", spark.read.format("delta").load(sys.argv[1]).count())
spark.stop()
"""


@pytest.mark.slow
@pytest.mark.engine("delta-spark")  # the delta-spark pass: its JVM starts are the ones it saves
def test_a_start_records_the_jars_ivy_resolved_and_the_next_start_takes_them(tmp_path: Path) -> None:
    env = {**os.environ, CACHE_HOME_ENV: str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    env.pop(SUBMIT_ARGS_ENV, None)

    def start(*table: str) -> dict[str, str]:
        done = subprocess.run(
            [sys.executable, "-c", _START, *(str(tmp_path / name) for name in table)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)

    record = tmp_path / "cache" / "rmq-lake" / f"{delta_package().replace(':', '_')}.jars"
    first = start()
    assert delta_package() in first["packages"]  # resolved by Ivy
    listed = record.read_text(encoding="utf-8").split()
    assert any(Path(jar).name.startswith("io.delta_delta-spark_") for jar in listed)
    assert all(Path(jar).is_file() for jar in listed)

    second = start("table")
    assert second["packages"] == "-" and second["rows"] == "3"  # no resolution, Delta works the same
    assert [jar.removeprefix("file://") for jar in second["jars"].split(",")] == listed
