"""Receive and ack through the gRPC endpoint against consuming in process, as ratios in one run.

    python benchmarks/grpc_consume.py [--consumers 1,8] [--messages 4000] [--no-proxy]

For each consumer count, on MESSAGES 256-byte messages already in topic ``Bench`` (4 queues of one
broker): (a) the official Python client (``rocketmq-python-client``) in a process of its own,
CONSUMERS ``SimpleConsumer`` instances of one group, one thread each, receiving 32 at a time and
acking every message, through ``python -m broker_model serve`` (its own process); (b) the same
work in process: CONSUMERS threads popping and acking through the broker's ``PopService`` (the
same checkpoints and acks in the log, no gRPC); (c) the in-process pull consumer: CONSUMERS
threads pulling the four queues with ``PullConsumer`` and committing offsets (no checkpoint, no
ack: the floor of reading the messages). Messages per second of each and the endpoint's ratio to
(b) and (c), and the server's CPU per message (Linux ``/proc``).

The peer: (d) the same client script through Apache RocketMQ's own gRPC proxy (the tests' harness,
``tests/apache_rocketmq.py``: a name server and a broker with the proxy in local mode), its topic
``Bench`` of 4 queues filled by the official producer first: our endpoint's rate against it as a
ratio. ``--no-proxy`` leaves it out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from grpc_send import ClientRun, serving, timed_client
from threads import run_timed

from broker_model.broker import Broker, BrokerConfig, InnerMessage, PopService, TimerMessageService
from broker_model.client import PullConsumer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUEUES = 4
GROUP = "cg-bench"


def fill(lake: Path, messages: int) -> None:
    """MESSAGES 256-byte messages in topic ``Bench`` of broker ``broker-a``, round robin over its queues."""
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    broker.ensure_topic("Bench", QUEUES)
    for start in range(0, messages, 256):
        batch = [
            InnerMessage("Bench", i % QUEUES, os.urandom(256), {"UNIQ_KEY": f"B{i}", "TAGS": "t"})
            for i in range(start, min(start + 256, messages))
        ]
        for queue_id in range(QUEUES):
            mine = [m for m in batch if m.queue_id == queue_id]
            if mine:
                broker.put_messages(mine)
    broker.shutdown()


def endpoint_rate(root: Path, consumers: int, messages: int) -> ClientRun:
    """The official client through ``serve``."""
    lake = root / f"lake-endpoint-{consumers}"
    fill(lake, messages)
    command = [sys.executable, "-m", "broker_model", "serve", "--lake", str(lake), "--listen", "127.0.0.1:0"]
    with serving(command) as (address, server_cpu):
        return _consume(address, root, consumers, messages, server_cpu)


def proxy_rate(root: Path, consumers: int, messages: int) -> ClientRun:
    """The official client through Apache RocketMQ's proxy (the tests' harness), the topic filled by
    the official producer."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # the harness is a module of the tests
    from tests.apache_rocketmq import ApacheRocketMQ, GroupSpec, TopicSpec

    with ApacheRocketMQ(root / f"apache-{consumers}") as rocketmq:
        rocketmq.create(TopicSpec("Bench", queues=QUEUES, message_type="NORMAL"), GroupSpec(GROUP))
        producer = [sys.executable, str(HERE / "grpc_client.py"), rocketmq.proxy_endpoint, "Bench", "8"]
        producer.append(str(-(-messages // 8)))
        _, sent = timed_client(producer, root, rocketmq.cpu_seconds)
        return _consume(rocketmq.proxy_endpoint, root, consumers, sent, rocketmq.cpu_seconds)


def _consume(
    address: str, root: Path, consumers: int, messages: int, server_cpu: Callable[[], float | None]
) -> ClientRun:
    client = [sys.executable, str(HERE / "grpc_consume_client.py"), address, "Bench", GROUP, str(consumers)]
    run, acked = timed_client([*client, str(messages)], root, server_cpu)
    if acked < messages:
        raise RuntimeError(f"the client acked {acked} of {messages} messages")
    return run


def pop_rate(root: Path, consumers: int, messages: int) -> float:
    """Messages/s popped and acked in process through the broker's POP service."""
    lake = root / f"lake-pop-{consumers}"
    fill(lake, messages)
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    pops = PopService(broker, TimerMessageService(broker))
    done = [0]

    def work(index: int) -> None:
        while done[0] < messages:
            for item in pops.pop(GROUP, "Bench", 32, invisible_ms=30_000, poll_ms=200).messages:
                pops.ack(GROUP, "Bench", item.receipt_handle)
                done[0] += 1

    elapsed = run_timed(consumers, work)
    broker.shutdown()
    return done[0] / elapsed


def pull_rate(root: Path, consumers: int, messages: int) -> float:
    """Messages/s pulled in process, the queues shared out among the threads."""
    lake = root / f"lake-pull-{consumers}"
    fill(lake, messages)
    broker = Broker(BrokerConfig(lake, "broker-a")).start()
    consumer = PullConsumer([broker], GROUP)
    queues = consumer.queues("Bench")
    pulled = [0] * consumers

    def work(index: int) -> None:
        for queue in queues[index::consumers]:
            offset = 0
            while True:
                result = consumer.pull(queue, offset, 32)
                if not result.messages:
                    break
                pulled[index] += len(result.messages)
                offset = result.next_begin_offset
                consumer.update_offset(queue, offset)

    elapsed = run_timed(consumers, work)
    broker.shutdown()
    return sum(pulled) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consumers", default="1,8", help="consumer counts (default 1,8)")
    parser.add_argument("--messages", type=int, default=4000, help="messages consumed per run (default 4000)")
    parser.add_argument("--no-proxy", action="store_true", help="leave Apache RocketMQ's proxy out")
    args = parser.parse_args()
    counts = [int(n) for n in args.consumers.split(",")]
    print(f"{os.cpu_count() or 1} cores, {args.messages} 256-byte messages in 4 queues, received 32 at a time, acked")
    print("msg/s: endpoint (official client), in-process POP, in-process pull; the endpoint's server CPU µs a message")
    header = ["consumers", "endpoint", "pop", "end/pop", "pull", "end/pull", "server µs"]
    header += [] if args.no_proxy else ["proxy", "end/proxy", "proxy µs"]
    print("".join(f"{h:>11}" for h in header))
    for consumers in counts:
        with tempfile.TemporaryDirectory(prefix="grpc-consume-") as tmp:
            remote = endpoint_rate(Path(tmp), consumers, args.messages)
            popped = pop_rate(Path(tmp), consumers, args.messages)
            pulled = pull_rate(Path(tmp), consumers, args.messages)
            proxy = None if args.no_proxy else proxy_rate(Path(tmp), consumers, args.messages)
        server = "-" if remote.server_us is None else f"{remote.server_us:,.0f}"
        cells = [f"{consumers}", f"{remote.rate:,.0f}", f"{popped:,.0f}", f"{remote.rate / popped:.2f}"]
        cells += [f"{pulled:,.0f}", f"{remote.rate / pulled:.2f}", server]
        if proxy is not None:
            proxy_us = "-" if proxy.server_us is None else f"{proxy.server_us:,.0f}"
            cells += [f"{proxy.rate:,.0f}", f"{remote.rate / proxy.rate:.2f}", proxy_us]
        print("".join(f"{cell:>11}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()
