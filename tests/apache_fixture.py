"""The pytest fixture of a real Apache RocketMQ 5 (tests/apache_rocketmq.py), one per test module:
``from tests.apache_fixture import apache_rocketmq`` in the module that uses it, or a module's own
fixture over :func:`started_rocketmq` for other broker settings.

It is skipped, naming what is missing, where Java or Maven is not installed (and the jars were
never copied); a CI run with ``RMQ_FAIL_ON_SKIP=1`` then fails. The instance is always stopped at
the module's end, and killed if a clean stop fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import pytest

from tests.apache_rocketmq import ApacheRocketMQ, HarnessError, ensure_driver


@contextlib.contextmanager
def started_rocketmq(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    broker_overrides: Mapping[str, object] | None = None,
    clean_stop: bool = True,
    proxy_overrides: Mapping[str, object] | None = None,
) -> Iterator[ApacheRocketMQ]:
    """A RocketMQ started in a fresh run directory named after ``name`` (``broker_overrides``: its
    broker.conf settings that differ from the harness's; ``proxy_overrides``: its proxy's),
    always stopped at the end, and killed if the clean stop fails; without ``clean_stop``, killed
    at once (a module that looks at its store no more saves the 13-25 s of a clean shutdown).
    Skips, naming what is missing, where Java or Maven is not installed."""
    try:
        ensure_driver()  # the jars, then the driver compiled against them
    except HarnessError as err:
        if "is not on PATH" in str(err):
            pytest.skip(str(err))
        raise
    rocketmq = ApacheRocketMQ(
        tmp_path_factory.mktemp(name), broker_overrides=broker_overrides, proxy_overrides=proxy_overrides
    )
    try:
        rocketmq.start()
        yield rocketmq
    finally:
        try:
            if clean_stop:
                rocketmq.stop()
        finally:
            rocketmq.kill()


@pytest.fixture(scope="module")
def apache_rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheRocketMQ]:
    """A name server and a broker with its proxy, started for the module in a fresh run directory
    (its store under ``store_dir``). A test may stop or kill it; the next test that asks for it
    through :func:`running` gets it started again on the same store."""
    with started_rocketmq(tmp_path_factory, "apache-rocketmq") as rocketmq:
        yield rocketmq


def running(rocketmq: ApacheRocketMQ) -> ApacheRocketMQ:
    """``rocketmq``, started again on its store if a test left it stopped or killed."""
    if not rocketmq.running():
        rocketmq.start()
    return rocketmq
