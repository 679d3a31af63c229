"""One fixed sequence of producer operations through the official RocketMQ 5 Python client
(``rocketmq-python-client``, unmodified), run against any gRPC endpoint of the protocol, for
tests/test_endpoint_differential.py:
``python -m tests.endpoint_script ENDPOINT NORMAL FIFO DELAY TRANSACTION MISSING [--receive GROUP]
[--credentials ACCESS_KEY SECRET_KEY]``.

NORMAL, FIFO, DELAY and TRANSACTION are topics of those message types, MISSING a topic that does
not exist. The script prints one JSON line, the normalised record of what the endpoint answered,
then ``done``:

- ``route``: per topic, the route's status code, queue permissions and accepted message types
  (QueryRoute through the client package's own stub); ``settings``: what the server answers a
  producer's settings with (the body limit, the type check, the retry policy).
- ``sends``: per send kind (normal, two FIFO sends of one message group, a timer message, a
  transaction committed, one rolled back, one left open for the check-back), the receipt's shape:
  which fields are set and their format (``hex34`` for 34 hexadecimal digits), whether the
  receipt's message id is the one the client made, how the second FIFO offset follows the first.
- ``errors``: per bad request, the exception class the client raised and the protocol code it
  carries (or the receipt's shape when the endpoint took the request); requests the client
  refuses before sending are also sent raw, for the server's own answer (``raw_*``).
- ``check_back``: the open transaction's check-back as the client's checker saw it (which
  message, which fields); ``consumer``: a SimpleConsumer of GROUP (``--receive``) receiving the
  timer message, or the error of trying.
- ``acl`` (with ``--credentials``, which every other call is signed with): what a producer with a
  wrong secret or an unknown access key gets when it starts, and the server's code for a raw
  send signed so, or not signed.

Normalised away: ids, offsets, timestamps, hosts and ports (their presence and format stay).
Run it with ``HOME`` set: the client creates ``~/logs/rocketmq_python`` when it is imported. Waits
end after 60 s (the record then says what was not seen).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.util.signature import Signature

WAIT_S = 60.0
REQUEST_TIMEOUT_S = 10  # every call (the client's default, 3 s, is short on a loaded machine)
MAX_BODY = 4 * 1024 * 1024  # the body limit both endpoints announce (checked by ``settings``)
DAY_S = 86_400


def shape(value: Any) -> str:
    """The format of a receipt field, without its value: ``absent``, ``int``, ``hexN`` (N hex
    digits), ``textN``."""
    if value is None or value == "":
        return "absent"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if value >= 0 else "negative int"
    text = str(value)
    if re.fullmatch(r"[0-9A-F]+", text):
        return f"hex{len(text)}"
    if re.fullmatch(r"[0-9a-fA-F]+", text):
        return f"mixed-case hex{len(text)}"
    return f"text{len(text)}"


def receipt_shape(message: Message, receipt: Any) -> dict[str, Any]:
    """The shape of a send receipt, and whether its message id is the client's own."""
    return {
        "message_id": shape(receipt.message_id),
        "message_id_is_the_clients": receipt.message_id == message.message_id,
        "transaction_id": shape(receipt.transaction_id),
        "transaction_id_is_the_message_id": receipt.transaction_id == receipt.message_id,
        "offset": shape(receipt.offset),
        "recall_handle": shape(receipt.recall_handle),
    }


def raised(err: Exception) -> dict[str, Any]:
    """The exception class and the code it carries: a protocol code, or gRPC's own status."""
    code = getattr(err, "code", None)
    if callable(code):  # a gRPC error: the call itself failed
        return {"raised": type(err).__name__, "code": f"grpc {code().name}"}
    return {"raised": type(err).__name__, "code": pb.Code.Name(code) if isinstance(code, int) else None}


def outcome(call: Callable[[], Any], message: Message | None = None) -> dict[str, Any]:
    """What one client call gave: the receipt's shape, or the exception class and its code."""
    try:
        result = call()
    except Exception as err:
        return raised(err)
    if message is not None and result is not None and hasattr(result, "message_id"):
        return {"receipt": receipt_shape(message, result)}
    return {"returned": type(result).__name__}


class Checker(TransactionChecker):  # type: ignore[misc]
    """Commits every check-back, and keeps what each one showed."""

    def __init__(self) -> None:
        self.seen: list[Message] = []

    def check(self, message: Message) -> Any:
        self.seen.append(message)
        return TransactionResolution.COMMIT


class Script:
    def __init__(self, endpoint: str, topics: dict[str, str], credentials: tuple[str, str] | None = None) -> None:
        self.endpoint = endpoint
        self.topics = topics
        self.credentials = credentials
        self.configuration = self._configuration(*(credentials or ("", "")))
        self.checker = Checker()
        kinds = ("normal", "fifo", "delay", "transaction")
        self.producer = Producer(self.configuration, tuple(topics[k] for k in kinds), checker=self.checker)
        self.stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(endpoint))
        # what the official clients send with every call (the client id, the signature headers)
        self.metadata = Signature.metadata(self.configuration, "endpoint-script-raw")

    def _configuration(self, access_key: str, secret_key: str) -> ClientConfiguration:
        credentials = Credentials(access_key, secret_key) if access_key else Credentials()
        return ClientConfiguration(self.endpoint, credentials, request_timeout=REQUEST_TIMEOUT_S)

    def acl(self) -> dict[str, Any]:
        """What a wrong secret, an unknown access key and no signature get (with credentials only)."""
        assert self.credentials is not None
        access_key, secret_key = self.credentials
        found: dict[str, Any] = {}
        for case, (key, secret) in {
            "wrong_secret": (access_key, secret_key + "-wrong"),
            "unknown_access_key": (access_key + "-unknown", secret_key),
        }.items():
            producer = Producer(self._configuration(key, secret), (self.topics["normal"],))
            found[f"{case}_startup"] = outcome(producer.startup)
            if "raised" not in found[f"{case}_startup"]:  # the client starts without its routes
                message = self.message("normal")
                found[f"{case}_send"] = outcome(functools.partial(producer.send, message), message)
                producer.shutdown()
            metadata = Signature.metadata(self._configuration(key, secret), "endpoint-script-raw")
            found[f"raw_{case}"] = self.raw_send(self.raw_message("normal"), metadata=metadata)
        unsigned = [(k, v) for k, v in self.metadata if k not in ("authorization", "x-mq-date-time")]
        found["raw_unsigned"] = self.raw_send(self.raw_message("normal"), metadata=unsigned)
        return found

    def message(self, kind: str, body: bytes = b"differential", **system: Any) -> Message:
        message = Message()
        message.topic = self.topics[kind]
        message.body = body
        message.tag = "diff"
        message.keys = f"key-{kind}"
        message.add_property("origin", "endpoint_script")
        for name, value in system.pop("properties", {}).items():
            message.add_property(name, value)
        for name, value in system.items():
            setattr(message, name, value)
        return message

    def send(self, kind: str, body: bytes = b"differential", **system: Any) -> dict[str, Any]:
        message = self.message(kind, body, **system)
        return outcome(lambda: self.producer.send(message), message)

    def raw_send(self, *messages: pb.Message, metadata: list[tuple[str, str]] | None = None) -> str:
        request = rpc.SendMessageRequest(messages=messages)
        sent = self.metadata if metadata is None else metadata
        answer = self.stub.SendMessage(request, timeout=REQUEST_TIMEOUT_S, metadata=sent)
        return str(pb.Code.Name(answer.status.code))

    def raw_message(self, kind: str, body: bytes = b"x", **system: Any) -> pb.Message:
        properties = pb.SystemProperties(message_id="01" + "0" * 31 + "1", **system)
        return pb.Message(topic=pb.Resource(name=self.topics[kind]), body=body, system_properties=properties)

    # -- the record, part by part

    def route(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for kind, topic in self.topics.items():
            request = rpc.QueryRouteRequest(topic=pb.Resource(name=topic))
            answer = self.stub.QueryRoute(request, timeout=REQUEST_TIMEOUT_S, metadata=self.metadata)
            found[kind] = {
                "code": pb.Code.Name(answer.status.code),
                "permissions": sorted({pb.Permission.Name(q.permission) for q in answer.message_queues}),
                "accept_message_types": sorted(
                    {pb.MessageType.Name(t) for q in answer.message_queues for t in q.accept_message_types}
                ),
            }
        return found

    def settings(self) -> dict[str, Any]:
        """The server's answer to a producer's settings on the Telemetry stream."""
        sent = threading.Event()

        def commands() -> Iterator[rpc.TelemetryCommand]:
            settings = pb.Settings(client_type=pb.PRODUCER, request_timeout={"seconds": REQUEST_TIMEOUT_S})
            settings.publishing.topics.add(name=self.topics["normal"])
            settings.publishing.max_body_size = 128 * 1024 * 1024  # what the Python client asks for
            settings.publishing.validate_message_type = True
            yield rpc.TelemetryCommand(settings=settings)
            sent.wait(WAIT_S)  # the stream stays open until the answer came

        stream = self.stub.Telemetry(commands(), timeout=WAIT_S, metadata=self.metadata)
        try:
            answer = next(iter(stream))
        finally:
            sent.set()
            stream.cancel()
        publishing, backoff = answer.settings.publishing, answer.settings.backoff_policy
        return {
            "code": pb.Code.Name(answer.status.code),
            "max_body_size": publishing.max_body_size,
            "validate_message_type": publishing.validate_message_type,
            "max_attempts": backoff.max_attempts,
            "backoff": backoff.WhichOneof("strategy"),
        }

    def sends(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The receipts of each send kind, and the errors of ending a transaction again."""
        found: dict[str, Any] = {"normal": self.send("normal")}
        first, second = self.message("fifo"), self.message("fifo")
        for message in (first, second):
            message.message_group = "diff-group"
        receipts = [self.producer.send(first), self.producer.send(second)]
        found["fifo"] = receipt_shape(first, receipts[0])
        found["fifo_offset_step"] = receipts[1].offset - receipts[0].offset
        found["delay"] = self.send("delay", delivery_timestamp=int(time.time()) + 2)
        errors: dict[str, Any] = {}
        for resolution in ("commit", "rollback"):
            message = self.message("transaction", f"{resolution}".encode())
            transaction = self.producer.begin_transaction()
            send = functools.partial(self.producer.send, message, transaction)
            found[f"transaction_{resolution}"] = outcome(send, message)
            found[f"transaction_{resolution}_end"] = outcome(getattr(transaction, resolution))
            errors[f"{resolution}_then_commit"] = outcome(transaction.commit)
            errors[f"{resolution}_then_rollback"] = outcome(transaction.rollback)
        open_message = self.message("transaction", b"check-back")
        open_transaction = self.producer.begin_transaction()
        self.open_receipt = self.producer.send(open_message, open_transaction)
        found["transaction_open"] = receipt_shape(open_message, self.open_receipt)
        return found, errors

    def errors(self) -> dict[str, Any]:
        now_s = int(time.time())
        missing = Message()
        missing.topic, missing.body = self.topics["missing"], b"x"
        found: dict[str, Any] = {
            "missing_topic": outcome(lambda: self.producer.send(missing), missing),
            "body_too_large": outcome(lambda: self.producer.send(self.message("normal", b"x" * (MAX_BODY + 1)))),
            "raw_body_too_large": self.raw_send(self.raw_message("normal", b"x" * (MAX_BODY + 1))),
            "raw_body_empty": self.raw_send(self.raw_message("normal", b"")),
            "raw_no_message": self.raw_send(),
            "group_on_normal_topic": self.send("normal", message_group="diff-group"),
            "raw_group_on_normal_topic": self.raw_send(
                self.raw_message("normal", message_type=pb.FIFO, message_group="diff-group")
            ),
            "delivery_time_on_normal_topic": self.send("normal", delivery_timestamp=now_s + 2),
            "no_group_on_fifo_topic": self.send("fifo"),
            "raw_no_group_on_fifo_topic": self.raw_send(self.raw_message("fifo", message_type=pb.NORMAL)),
            "group_of_64_bytes": self.send("fifo", message_group="g" * 64),
            "group_with_control_character": self.send("fifo", message_group="diff\x01group"),
            "delivery_time_in_the_past": self.send("delay", delivery_timestamp=now_s - 60),
            "delivery_time_2_days_ahead": self.send("delay", delivery_timestamp=now_s + 2 * DAY_S),
            "delivery_time_4_days_ahead": self.send("delay", delivery_timestamp=now_s + 4 * DAY_S),
            # the client puts the value into Timestamp.seconds as it is: milliseconds there
            "delivery_time_in_milliseconds": self.send("delay", delivery_timestamp=(now_s + 2) * 1000),
            "raw_delivery_time_nanos_out_of_range": self.raw_send(
                self.raw_message("delay", message_type=pb.DELAY, delivery_timestamp={"seconds": now_s, "nanos": -1})
            ),
            "raw_unknown_transaction_id": self.raw_end(),
            "raw_without_client_id": self.raw_without_client_id(),
            "user_property_named_TIMER_DELIVER_MS": self.send("normal", properties={"TIMER_DELIVER_MS": "1"}),
            "user_property_named_TRANSACTION_CHECK_TIMES": self.send(
                "normal", properties={"TRANSACTION_CHECK_TIMES": "1"}
            ),
        }
        return found

    def raw_end(self) -> str:
        request = rpc.EndTransactionRequest(
            topic=pb.Resource(name=self.topics["transaction"]),
            message_id="01" + "0" * 31 + "2",
            transaction_id="7F00000100002A9F00000000DEADBEEF",
            resolution=pb.COMMIT,
        )
        answer = self.stub.EndTransaction(request, timeout=REQUEST_TIMEOUT_S, metadata=self.metadata)
        return str(pb.Code.Name(answer.status.code))

    def raw_without_client_id(self) -> str:
        signed_only = [(k, v) for k, v in self.metadata if k != "x-mq-client-id"]
        return self.raw_send(self.raw_message("normal"), metadata=signed_only)

    def check_back(self) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while not self.checker.seen and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.checker.seen:
            return {"checked": False}
        seen = self.checker.seen[0]
        return {
            "checked": True,
            "same_message_id": seen.message_id == self.open_receipt.message_id,
            "topic_is_the_real_one": seen.topic == self.topics["transaction"],
            "body": seen.body.decode(errors="replace"),
            "tag": seen.tag,
            "keys": sorted(seen.keys),
            "user_properties": sorted(seen.properties),
            "message_type": pb.MessageType.Name(seen.message_type),
            "born_timestamp": shape(seen.born_timestamp),
            "born_host": shape(seen.born_host) != "absent",
            "corrupted": seen.corrupted,
        }

    def consumer(self, group: str) -> dict[str, Any]:
        """A SimpleConsumer receiving the timer message sent due now + 2 s."""
        due_s = int(time.time()) + 2
        message = self.message("delay", b"timer", delivery_timestamp=due_s)
        self.producer.send(message)
        consumer = SimpleConsumer(
            self.configuration, group, {self.topics["delay"]: FilterExpression("*")}, await_duration=2
        )
        try:
            consumer.startup()
        except Exception as err:
            return raised(err)
        try:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                try:
                    received = consumer.receive(16, 10) or []
                except Exception as err:
                    if "settings" in str(err):  # the server has not had the client's settings yet
                        time.sleep(0.2)
                        continue
                    return raised(err)
                for got in received:
                    consumer.ack(got)
                    if got.message_id == message.message_id:
                        now_ms = int(time.time() * 1000)
                        return {
                            "received": True,
                            "not_before_due": now_ms >= due_s * 1000,
                            "delivery_timestamp_is_the_due_time": got.delivery_timestamp == due_s * 1000,
                            "message_type": pb.MessageType.Name(got.message_type),
                        }
            return {"received": False}
        finally:
            consumer.shutdown()

    def run(self, group: str | None) -> dict[str, Any]:
        record: dict[str, Any] = {"route": self.route(), "settings": self.settings()}
        self.producer.startup()
        try:
            record["sends"], ended_again = self.sends()
            record["errors"] = {**self.errors(), **ended_again}
            record["check_back"] = self.check_back()
            if group is not None:
                record["consumer"] = self.consumer(group)
            if self.credentials is not None:
                record["acl"] = self.acl()
        finally:
            self.producer.shutdown()
        return record


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.endpoint_script", description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoint")
    for kind in ("normal", "fifo", "delay", "transaction", "missing"):
        parser.add_argument(kind)
    parser.add_argument("--receive", metavar="GROUP", help="receive the timer message as this SimpleConsumer group")
    parser.add_argument("--credentials", nargs=2, metavar=("ACCESS_KEY", "SECRET_KEY"), help="sign every call")
    options = parser.parse_args(argv)
    topics = {k: getattr(options, k) for k in ("normal", "fifo", "delay", "transaction", "missing")}
    credentials = (options.credentials[0], options.credentials[1]) if options.credentials else None
    record = Script(options.endpoint, topics, credentials).run(options.receive)
    print(json.dumps(record, sort_keys=True), flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
