"""A MessagingService that stores nothing, for ``benchmarks/grpc_send.py``: it answers QueryRoute
(4 queues), Telemetry settings and SendMessage at once, so that the official client's own cost,
the ceiling of any endpoint on the same cores, is measured. ``python benchmarks/grpc_null_server.py``
prints ``listening on HOST:PORT`` and serves until SIGTERM."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

OK = pb.Status(code=pb.OK, message="OK")


class NullService(service_pb2_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(self, port: int) -> None:
        self.port = port

    def QueryRoute(self, request: Any, context: Any) -> Any:
        endpoints = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=self.port)])
        broker = pb.Broker(name="null", id=0, endpoints=endpoints)
        fields = {"topic": request.topic, "permission": pb.READ_WRITE, "broker": broker}
        fields["accept_message_types"] = [pb.NORMAL]
        queues = [pb.MessageQueue(id=i, **fields) for i in range(4)]
        return rpc.QueryRouteResponse(status=OK, message_queues=queues)

    def Heartbeat(self, request: Any, context: Any) -> Any:
        return rpc.HeartbeatResponse(status=OK)

    def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        return rpc.NotifyClientTerminationResponse(status=OK)

    def Telemetry(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        for command in requests:
            if command.HasField("settings"):
                settings = pb.Settings()
                settings.CopyFrom(command.settings)
                settings.publishing.max_body_size = 4 * 1024 * 1024
                settings.publishing.validate_message_type = True
                yield rpc.TelemetryCommand(status=OK, settings=settings)

    def SendMessage(self, request: Any, context: Any) -> Any:
        ids = [m.system_properties.message_id for m in request.messages]
        entries = [rpc.SendResultEntry(status=OK, message_id=i, offset=0) for i in ids]
        return rpc.SendMessageResponse(status=OK, entries=entries)


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    port = server.add_insecure_port("127.0.0.1:0")
    service_pb2_grpc.add_MessagingServiceServicer_to_server(NullService(port), server)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"listening on 127.0.0.1:{port}", flush=True)
    stop.wait()
    server.stop(1).wait()


if __name__ == "__main__":
    main()
