"""Every command line ends with its own exit status: 0 done, 1 failed, 2 bad input, never a signal.

Before :mod:`broker_model.cli_exit`, a process that had read Delta tables could abort after its
work and its output were done (``terminate called without an active exception``, SIGABRT, 134):
``python -m jobs reset_offsets`` with an unknown group did in about 1 run in 40, more often on a
busy machine. So the Spark-free paths run :data:`RUNS` times each, a few at a time; a Spark job's
start costs seconds, so its paths run once each. Each run must give the exact status, and its
output must still arrive. A Spark job's JVM (and its ``pyspark.daemon`` workers) must have ended
when the job's process ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker_model.broker import Broker, BrokerConfig

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
RUNS = 20  # runs of each Spark-free path
PARALLEL = 4  # of them at a time: a busy machine makes the abort more likely, not less
PROC = Path("/proc")


@dataclass(frozen=True)
class Run:
    """One finished command line process."""

    status: int
    stdout: str
    stderr: str
    left: tuple[int, ...]  # processes started by it that were still running when it ended


def run_cli(args: Sequence[str], out: Path, env: dict[str, str] | None = None, timeout: float = 300) -> Run:
    """Run ``args`` in ``REPO`` with stdout and stderr in files under ``out``.

    Files, not pipes: a child that outlives the process (a JVM) would hold the pipes open and hide
    itself. Every process started by the run carries a marker in its environment; those still
    running when ``args`` has ended are returned in ``left``.
    """
    out.mkdir(parents=True)
    marker = uuid.uuid4().hex
    child_env = {**os.environ, **(env or {}), "RMQ_EXIT_TEST_RUN": marker}
    with (out / "stdout").open("w+", encoding="utf-8") as stdout, (out / "stderr").open("w+", encoding="utf-8") as err:
        done = subprocess.run(list(args), cwd=REPO, env=child_env, stdout=stdout, stderr=err, timeout=timeout)
        left = _marked_processes(marker)
        stdout.seek(0)
        err.seek(0)
        return Run(done.returncode, stdout.read(), err.read(), left)


def _marked_processes(marker: str) -> tuple[int, ...]:
    if not PROC.is_dir():  # not Linux: nothing to check
        return ()
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # ended meanwhile, or not ours to read
                pass
    return tuple(found)


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def repeat(args_of: Callable[[int], list[str]], out: Path, runs: int = RUNS) -> list[Run]:
    """``runs`` runs of a command line, :data:`PARALLEL` at a time; run ``i`` runs ``args_of(i)``."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(lambda i: run_cli(args_of(i), out / f"run-{i}"), range(runs)))


def assert_every_run(runs: list[Run], status: int, stream: str, text: str) -> None:
    """Every run ended with ``status`` (never a signal) and wrote ``text`` to ``stream``."""
    statuses = sorted(run.status for run in runs)
    wrong = [run for run in runs if run.status != status]
    assert not wrong, (
        f"statuses {statuses}, expected {status} every time; stderr of a wrong one:\n{wrong[0].stderr[-3000:]}"
    )
    for run in runs:
        assert "terminate called" not in run.stderr
        assert text in getattr(run, stream), f"{text!r} missing from {stream}:\n{getattr(run, stream)[-3000:]}"
        assert not run.left, f"processes {run.left} outlived the command"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small lake written by the broker command line itself."""
    root = tmp_path_factory.mktemp("exit-codes") / "lake"
    done = run_cli(
        python("-m", "broker_model", "workload", "--lake", str(root), "--messages", "200", "--seed", "1"),
        root.parent / "setup",
    )
    assert done.status == 0, done.stderr
    return root


# ---------------------------------------------------------------------------------------------
# What the end of a process keeps: output, threads, atexit handlers, the statuses of exceptions
# ---------------------------------------------------------------------------------------------

_END = "from broker_model.cli_exit import run_and_exit\n"


@pytest.mark.parametrize(
    ("body", "status", "stdout", "stderr"),
    [
        # block-buffered output (stdout is a file) without a newline arrives
        ("def main():\n    print('done', end='')\n    return 0\n", 0, "done", ""),
        # an exception prints its traceback and gives 1
        ("def main():\n    raise RuntimeError('boom')\n", 1, "", "RuntimeError: boom"),
        # sys.exit's codes and messages, as the interpreter makes them
        ("import sys\ndef main():\n    sys.exit(3)\n", 3, "", ""),
        ("import sys\ndef main():\n    sys.exit('no such file')\n", 1, "", "no such file"),
        # a non-daemon thread still running when main returns finishes first
        (
            "import threading, time\ndef late():\n    time.sleep(0.3)\n    print('thread done', flush=True)\n"
            "def main():\n    threading.Thread(target=late).start()\n    return 0\n",
            0,
            "thread done",
            "",
        ),
        # atexit handlers run (logging's flush is one)
        (
            "import atexit\ndef main():\n    atexit.register(print, 'atexit ran')\n    return 2\n",
            2,
            "atexit ran",
            "",
        ),
    ],
    ids=["unflushed-output", "exception", "exit-3", "exit-message", "non-daemon-thread", "atexit"],
)
def test_run_and_exit_ends_as_the_interpreter_would(
    tmp_path: Path, body: str, status: int, stdout: str, stderr: str
) -> None:
    done = run_cli(python("-c", _END + body + "run_and_exit(main)\n"), tmp_path / "out")
    assert done.status == status, done.stderr
    assert stdout in done.stdout and stderr in done.stderr


def test_a_failing_cleanup_fails_a_successful_run(tmp_path: Path) -> None:
    body = "def cleanup():\n    raise OSError('cleanup failed')\nrun_and_exit(lambda: 0, cleanup=cleanup)\n"
    done = run_cli(python("-c", _END + body), tmp_path / "out")
    assert done.status == 1 and "OSError: cleanup failed" in done.stderr


# ---------------------------------------------------------------------------------------------
# The Spark-free paths, RUNS times each
# ---------------------------------------------------------------------------------------------


def test_broker_workload_succeeds_every_time(tmp_path: Path) -> None:
    runs = repeat(
        lambda i: python("-m", "broker_model", "workload", "--lake", str(tmp_path / f"lake-{i}"), "--messages", "50"),
        tmp_path,
    )
    assert_every_run(runs, 0, "stdout", "workload seed 1 into")


def test_broker_workload_refuses_a_bad_segment_size_every_time(tmp_path: Path) -> None:
    bad = ["--messages", "50", "--segment-size", "100"]
    runs = repeat(
        lambda i: python("-m", "broker_model", "workload", "--lake", str(tmp_path / f"lake-{i}"), *bad), tmp_path
    )
    assert_every_run(runs, 2, "stderr", "error: segment_size=100: is below 4096 bytes")


def test_broker_usage_errors_exit_2(tmp_path: Path) -> None:
    done = run_cli(python("-m", "broker_model", "workload", "--messages", "many"), tmp_path / "out")
    assert done.status == 2 and "--messages: invalid int value: 'many'" in done.stderr


def test_broker_admin_creates_a_topic_and_refuses_a_bad_one_every_time(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    Broker(BrokerConfig(lake, "broker-a")).start().shutdown()
    update = ["-m", "broker_model", "admin", "updateTopic", "--lake", str(lake), "-b", "broker-a", "-t", "Orders"]
    runs = repeat(lambda i: python(*update, "-r", str(i + 1), "-a", "+message.type=FIFO"), tmp_path / "good")
    assert_every_run(runs, 0, "stdout", "create topic to broker-a success")
    runs = repeat(lambda _: python(*update, "-a", "+message.type=ORDERED"), tmp_path / "bad")
    assert_every_run(runs, 2, "stderr", "error: message_type='ORDERED': is not a topic message type")


def test_reset_offsets_refuses_an_unknown_group_every_time(lake: Path, tmp_path: Path) -> None:
    args = python("-m", "jobs", "reset_offsets", "--lake", str(lake), "--group", "nosuch", "--topic", "Orders")
    runs = repeat(lambda _: [*args, "--to-earliest"], tmp_path)
    assert_every_run(runs, 2, "stderr", "error: group='nosuch': has no committed offset on any broker of this lake")


def test_reset_offsets_dry_run_succeeds_every_time(lake: Path, tmp_path: Path) -> None:
    args = python("-m", "jobs", "reset_offsets", "--lake", str(lake), "--group", "cg-orders", "--topic", "Orders")
    runs = repeat(lambda _: [*args, "--to-earliest"], tmp_path)
    assert_every_run(runs, 0, "stdout", "dry run: nothing written (add --execute to apply)")


def test_reset_offsets_as_a_module_exits_as_the_job(lake: Path, tmp_path: Path) -> None:
    args = python("-m", "jobs.reset_offsets", "--lake", str(lake), "--group", "nosuch", "--topic", "Orders")
    done = run_cli([*args, "--to-earliest"], tmp_path / "out")
    assert done.status == 2 and "error: group='nosuch'" in done.stderr


def test_a_spark_job_refuses_a_bad_as_of_before_spark_starts_every_time(lake: Path, tmp_path: Path) -> None:
    args = python("-m", "jobs", "consumer_offsets", "--lake", str(lake), "--as-of", "yesterday")
    runs = repeat(lambda _: args, tmp_path)
    assert_every_run(runs, 2, "stderr", "error: --as-of='yesterday': is neither epoch milliseconds nor an ISO-8601")
    assert not any("SparkContext" in run.stderr for run in runs)


def test_unknown_jobs_and_usage_errors_exit_2(tmp_path: Path) -> None:
    unknown = run_cli(python("-m", "jobs", "nosuch"), tmp_path / "unknown")
    assert unknown.status == 2 and "error: job='nosuch' is unknown" in unknown.stderr
    usage = run_cli(python("-m", "jobs", "reset_offsets", "--shift-by", "x"), tmp_path / "usage")
    assert usage.status == 2 and "--shift-by: invalid int value: 'x'" in usage.stderr
    helped = run_cli(python("-m", "jobs", "--help"), tmp_path / "help")
    assert helped.status == 0 and "jobs: compact_commitlog" in helped.stdout


# ---------------------------------------------------------------------------------------------
# Spark jobs: a few runs, each starting a JVM
# ---------------------------------------------------------------------------------------------


def test_a_spark_job_succeeds_and_its_jvm_ends_with_it(lake: Path, tmp_path: Path) -> None:
    done = run_cli(python("-m", "jobs", "consumer_offsets", "--lake", str(lake)), tmp_path / "out")
    assert_every_run([done], 0, "stdout", "consumer_offsets SUCCEEDED in")
    assert "Group: cg-orders" in done.stdout


def test_a_spark_job_failing_after_spark_started_exits_1_and_its_jvm_ends_with_it(lake: Path, tmp_path: Path) -> None:
    # the commit log's newest commit names a data file that is not there: Spark starts, then the scan fails
    broken = tmp_path / "lake"
    shutil.copytree(lake, broken)
    newest = sorted((broken / "commitlog" / "_delta_log").glob("*.json"))[-1]
    gone = {"path": "gone.parquet", "partitionValues": {"broker_name": "broker-a", "segment": "0"}, "size": 10}
    with newest.open("a", encoding="utf-8") as log:
        log.write(json.dumps({"add": {**gone, "modificationTime": 1, "dataChange": True}}) + "\n")
    done = run_cli(python("-m", "jobs", "rebuild_consume_queue", "--lake", str(broken)), tmp_path / "out")
    assert_every_run([done], 1, "stderr", "gone.parquet")


def test_the_delta_spark_engine_without_reachable_jars_exits_1_saying_why(lake: Path, tmp_path: Path) -> None:
    # Ivy resolves from an empty folder only: the Delta jar cannot be fetched, as without Maven Central
    (tmp_path / "empty-repository").mkdir()
    settings = tmp_path / "ivysettings.xml"
    settings.write_text(
        '<ivysettings><settings defaultResolver="nowhere"/><resolvers><filesystem name="nowhere">'
        f'<artifact pattern="{tmp_path}/empty-repository/[organisation]/[module]/[revision]/[artifact].[ext]"/>'
        "</filesystem></resolvers></ivysettings>",
        encoding="utf-8",
    )
    submit_args = f"--conf spark.jars.ivySettings={settings} --conf spark.jars.ivy={tmp_path / 'ivy'} pyspark-shell"
    done = run_cli(
        python("-m", "jobs", "consumer_offsets", "--lake", str(lake), "--engine", "delta-spark"),
        tmp_path / "out",
        env={"PYSPARK_SUBMIT_ARGS": submit_args},
    )
    assert_every_run([done], 1, "stderr", "error: Spark did not start with the Delta jars (io.delta:delta-spark_")


def test_spark_submit_exits_with_the_job_status(lake: Path, tmp_path: Path) -> None:
    env = {"RMQ_VENV": sys.prefix}  # the venv running the tests (spark-submit.sh would make one)
    submit = [str(REPO / "spark-submit.sh"), "consumer_offsets", "--lake", str(lake)]
    refused = run_cli([*submit, "--as-of", "yesterday"], tmp_path / "refused", env=env)
    # spark-submit's PythonRunner merges the driver's stderr into its stdout
    assert_every_run([refused], 2, "stdout", "error: --as-of='yesterday'")
    done = run_cli(submit, tmp_path / "done", env=env)
    assert_every_run([done], 0, "stdout", "consumer_offsets SUCCEEDED in")


def test_spark_submit_gives_the_recorded_delta_jars_else_has_ivy_resolve_them(
    lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.lake.session import CACHE_HOME_ENV, delta_jars_record, delta_package, recorded_delta_jars

    recorded = recorded_delta_jars()
    assert recorded, f"no Delta jars recorded in {delta_jars_record()}: tests/run.sh starts a session that records them"
    submit = [str(REPO / "spark-submit.sh"), "consumer_offsets", "--lake", str(lake), "--engine", "delta-spark"]
    submit += ["--as-of", "yesterday"]  # refused by the job after spark-submit's JVM started with the jars
    # a cache holding the record: the jars are given, Ivy resolves nothing
    monkeypatch.setenv(CACHE_HOME_ENV, str(tmp_path / "cache"))
    delta_jars_record().parent.mkdir(parents=True)
    delta_jars_record().write_text("\n".join(recorded) + "\n", encoding="utf-8")
    given = run_cli(submit, tmp_path / "given", env={"RMQ_VENV": sys.prefix})
    # an empty cache: Ivy resolves the package (from its own cache)
    monkeypatch.setenv(CACHE_HOME_ENV, str(tmp_path / "empty"))
    resolved = run_cli(submit, tmp_path / "resolved", env={"RMQ_VENV": sys.prefix})
    assert_every_run([given, resolved], 2, "stdout", "error: --as-of='yesterday'")
    package = delta_package().replace(":", "#", 1).split(":")[0]  # as Ivy names it: io.delta#delta-spark_...
    assert package not in given.stdout + given.stderr
    assert package in resolved.stdout + resolved.stderr
