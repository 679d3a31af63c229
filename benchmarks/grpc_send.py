"""Sends through the gRPC endpoint against the same sends in process, as ratios in one run.

    python benchmarks/grpc_send.py [--threads 1,8,64] [--per-thread 200] [--flush-mode ASYNC_FLUSH]

For each thread count: (a) the official Python client (``rocketmq-python-client``) in a process
of its own, THREADS threads of single sends of 256-byte messages through ``python -m broker_model
serve`` (two brokers, the endpoint in its own process); (b) the same sends in process: THREADS
threads of this product's ``Producer`` over two brokers. Messages per second of each and their
ratio (target: the endpoint at least half the in-process rate at 64 threads); (c) the client's
ceiling: the same sends against a server that stores nothing (``grpc_null_server.py``), and the
endpoint's share of it.

Where the CPU goes, from the same runs: the server's CPU per send through the endpoint (Linux:
``/proc/PID/stat``, over the client's whole run, its start and shutdown included), and the
client's own CPU per send against the null server (over the sends only). The client's cost
alone bounds any endpoint on these cores: ``cores / client CPU per send`` messages a second with a
server that costs nothing, printed with its ratio to the in-process rate.

The peer: (d) the same client, threads and sends through Apache RocketMQ's own gRPC proxy (a name
server and a broker with the proxy in local mode, one JVM, from Maven Central's jars: the tests'
harness, ``tests/apache_rocketmq.py``, with its settings: ASYNC_FLUSH, small mapped files, the
heap it gives the broker beside a Spark session), topic ``Bench`` of 8 queues, message type NORMAL:
our endpoint's rate against it as a ratio (target: at least 1), and the RocketMQ processes' CPU
per send over the client's whole run (name server included). ``--no-proxy`` leaves it out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from threads import run_timed

from broker_model.broker import Broker, BrokerConfig, FlushMode
from broker_model.client import Producer
from broker_model.common import Message

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROXY_QUEUES = 8  # the queues of topic Bench on Apache RocketMQ: two brokers' default 4 on ours


@dataclass(frozen=True)
class ClientRun:
    """One run of the official client against a server process."""

    rate: float  # messages/s
    client_us: float  # the client process's CPU per send, µs
    server_us: float | None  # the server process's CPU per send, µs (None where /proc is absent)


def endpoint_rate(root: Path, threads: int, per_thread: int, flush_mode: str) -> ClientRun:
    """The official client through ``serve``."""
    command = [sys.executable, "-m", "broker_model", "serve", "--lake", str(root / "lake"), "--listen", "127.0.0.1:0"]
    command += ["--brokers", "broker-a,broker-b", "--flush-mode", flush_mode, "--auto-create-topics"]
    return _client_rate(command, root, threads, per_thread)


def ceiling_rate(root: Path, threads: int, per_thread: int) -> ClientRun:
    """The official client against a server that stores nothing (its own cost)."""
    return _client_rate([sys.executable, str(HERE / "grpc_null_server.py")], root, threads, per_thread)


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` so far, None without ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proxy_rate(root: Path, threads: int, per_thread: int) -> ClientRun:
    """The official client through Apache RocketMQ's proxy (the tests' harness)."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # the harness is a module of the tests
    from tests.apache_rocketmq import ApacheRocketMQ, TopicSpec

    with ApacheRocketMQ(root / "apache") as rocketmq:
        rocketmq.create(TopicSpec("Bench", queues=PROXY_QUEUES, message_type="NORMAL"))
        return _client_run(rocketmq.proxy_endpoint, root, threads, per_thread, rocketmq.cpu_seconds)


def _client_rate(command: list[str], root: Path, threads: int, per_thread: int) -> ClientRun:
    with serving(command) as (address, server_cpu):
        return _client_run(address, root, threads, per_thread, server_cpu)


@contextlib.contextmanager
def serving(command: list[str]) -> Iterator[tuple[str, Callable[[], float | None]]]:
    """A server process that prints ``... on HOST:PORT`` first: its address and a reader of its
    CPU seconds so far, until it is terminated at the block's end."""
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield server.stdout.readline().rsplit(" on ", 1)[1].strip(), lambda: _cpu_seconds(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)


def _client_run(
    address: str, root: Path, threads: int, per_thread: int, server_cpu: Callable[[], float | None]
) -> ClientRun:
    """The client process against the server at ``address``."""
    client = [sys.executable, str(HERE / "grpc_client.py"), address, "Bench", str(threads), str(per_thread)]
    return timed_client(client, root, server_cpu)[0]


def timed_client(client: list[str], root: Path, server_cpu: Callable[[], float | None]) -> tuple[ClientRun, int]:
    """Run a client process that prints its seconds, its messages and its CPU seconds; its rate,
    CPU per message and the server's (``server_cpu`` reads the server's CPU seconds so far, None
    where it cannot be read), and its message count."""
    home = root / "home"
    home.mkdir(exist_ok=True)
    environment = {**os.environ, "HOME": str(home)}  # the client's log files
    server_before = server_cpu()
    done = subprocess.run(client, capture_output=True, text=True, timeout=900, env=environment)
    server_after = server_cpu()
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    seconds, sent, client_cpu = done.stdout.split()
    count = int(sent)
    server_us = None
    if server_before is not None and server_after is not None and count:
        server_us = (server_after - server_before) / count * 1e6
    rate = ClientRun(count / float(seconds), float(client_cpu) / max(count, 1) * 1e6, server_us)
    return rate, count


def in_process_rate(root: Path, threads: int, per_thread: int, flush_mode: FlushMode) -> float:
    """Messages/s of the same single sends by this product's producer, in process."""
    brokers = [
        Broker(BrokerConfig(root / "lake-in", name, store_host=f"127.0.0.{i + 1}:10911", flush_mode=flush_mode)).start()
        for i, name in enumerate(("broker-a", "broker-b"))
    ]
    for broker in brokers:
        broker.ensure_topic("Bench")
    producers = [Producer(brokers, f"p{i}", seed=i) for i in range(threads)]
    messages = [[Message.create("Bench", os.urandom(256), tags="t") for _ in range(per_thread)] for _ in range(threads)]

    def work(index: int) -> None:
        for message in messages[index]:
            producers[index].send(message)

    elapsed = run_timed(threads, work)
    for broker in brokers:
        broker.shutdown()
    return threads * per_thread / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,8,64", help="thread counts (default 1,8,64)")
    parser.add_argument("--per-thread", type=int, default=200, help="sends per thread (default 200)")
    parser.add_argument("--flush-mode", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], default="ASYNC_FLUSH")
    parser.add_argument("--no-proxy", action="store_true", help="leave Apache RocketMQ's proxy out")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    cores = os.cpu_count() or 1
    print(f"{cores} cores, 256-byte bodies, {args.per_thread} single sends per thread, {args.flush_mode}")
    print("msg/s: endpoint, in-process and the client against a null server (ceiling); CPU µs per send")
    header = ["threads", "endpoint", "in-process", "ratio", "ceiling", "end/ceil"]
    header += ["server µs", "client µs", "bound", "bound/in"]
    header += [] if args.no_proxy else ["proxy", "end/proxy", "proxy µs"]
    print("".join(f"{h:>11}" for h in header))
    for threads in counts:
        with tempfile.TemporaryDirectory(prefix="grpc-bench-") as tmp:
            remote = endpoint_rate(Path(tmp), threads, args.per_thread, args.flush_mode)
            local = in_process_rate(Path(tmp), threads, args.per_thread, args.flush_mode)
            ceiling = ceiling_rate(Path(tmp), threads, args.per_thread)
            proxy = None if args.no_proxy else proxy_rate(Path(tmp), threads, args.per_thread)
        bound = cores * 1e6 / ceiling.client_us  # any server, even one that costs nothing
        server = "-" if remote.server_us is None else f"{remote.server_us:,.0f}"
        cells = [f"{threads}", f"{remote.rate:,.0f}", f"{local:,.0f}", f"{remote.rate / local:.2f}"]
        cells += [f"{ceiling.rate:,.0f}", f"{remote.rate / ceiling.rate:.2f}", server]
        cells += [f"{ceiling.client_us:,.0f}", f"{bound:,.0f}", f"{bound / local:.2f}"]
        if proxy is not None:
            proxy_us = "-" if proxy.server_us is None else f"{proxy.server_us:,.0f}"
            cells += [f"{proxy.rate:,.0f}", f"{remote.rate / proxy.rate:.2f}", proxy_us]
        print("".join(f"{cell:>11}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()
