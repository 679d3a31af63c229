"""Authentication and authorization of the endpoint's requests (``serve --acl FILE``), off by default.

A request carries RocketMQ 5's signature headers, as the official clients compute them from their
credentials: ``x-mq-date-time`` (``yyyyMMdd'T'HHmmss'Z'``) and ``authorization`` =
``MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex of
HMAC-SHA1(secret key, date-time)>``. The file names the accounts and what each may use:

    {"accounts": [{"accessKey": "orders-app", "secretKey": "...", "topics": ["Orders"], "groups": []}]}

(``"*"`` allows every topic or group). See docs/endpoint.md.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import sha1
from pathlib import Path
from typing import Any, Final

from rocketmq.grpc_protocol import definition_pb2 as pb

from broker_model.endpoint.errors import RequestError
from schemas.errors import ValidationError

ALGORITHM: Final = "MQv2-HMAC-SHA1"
DATE_HEADER: Final = "x-mq-date-time"
_AUTHORIZATION: Final = re.compile(
    rf"^{ALGORITHM} Credential=(?P<key>[^,\s]+), ?SignedHeaders=(?P<headers>[^,\s]+), ?"
    r"Signature=(?P<signature>[0-9A-Fa-f]+)$"
)


@dataclass(frozen=True)
class Account:
    """An access key, its secret and the topics and groups it may use."""

    access_key: str
    secret_key: str
    topics: frozenset[str]
    groups: frozenset[str]

    def may_use_topic(self, topic: str) -> bool:
        """Whether the account may send to (or route) ``topic``."""
        return "*" in self.topics or topic in self.topics


def signature(secret_key: str, date_time: str) -> str:
    """The hex HMAC-SHA1 of ``date_time`` keyed by ``secret_key`` (``Signature.sign``)."""
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


class Acl:
    """The accounts of an ACL file."""

    def __init__(self, accounts: Mapping[str, Account]) -> None:
        self.accounts = dict(accounts)

    @classmethod
    def load(cls, path: Path) -> Acl:
        """Read the ACL file.

        Raises:
            ValidationError: not such a JSON file; names the file and the field.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            problem = f"is not a readable JSON file ({err})"
            raise ValidationError("--acl", str(path), problem, "see docs/endpoint.md") from None
        accounts = data.get("accounts") if isinstance(data, dict) else None
        if not isinstance(accounts, list) or not accounts:
            raise ValidationError("--acl", str(path), "has no accounts list", 'write {"accounts": [...]}')
        parsed: dict[str, Account] = {}
        for index, item in enumerate(accounts):
            account = _account(item, f"{path}: accounts[{index}]")
            parsed[account.access_key] = account
        return cls(parsed)

    def authenticate(self, metadata: Mapping[str, str]) -> Account:
        """The account whose signature the request carries.

        Raises:
            RequestError: UNAUTHORIZED, when the headers are missing, malformed, of an unknown access key,
                or the signature does not match.
        """
        header = metadata.get("authorization", "")
        date_time = metadata.get(DATE_HEADER, "")
        found = _AUTHORIZATION.match(header)
        if not found or not date_time:
            problem = f"authorization: missing or not {ALGORITHM} with a {DATE_HEADER} header"
            raise RequestError(pb.UNAUTHORIZED, problem)
        if DATE_HEADER not in found["headers"].split(";"):
            raise RequestError(pb.UNAUTHORIZED, f"authorization: SignedHeaders must name {DATE_HEADER}")
        account = self.accounts.get(found["key"])
        if account is None:
            raise RequestError(pb.UNAUTHORIZED, f"authorization: unknown access key {found['key']!r}")
        if not hmac.compare_digest(found["signature"].lower(), signature(account.secret_key, date_time)):
            raise RequestError(pb.UNAUTHORIZED, f"authorization: wrong signature for access key {account.access_key!r}")
        return account

    @staticmethod
    def authorize_topic(account: Account, topic: str) -> None:
        """Raises RequestError (FORBIDDEN) when ``account`` may not use ``topic``."""
        if not account.may_use_topic(topic):
            raise RequestError(pb.FORBIDDEN, f"topic: access key {account.access_key!r} may not use topic {topic!r}")


def _account(item: Any, where: str) -> Account:
    if not isinstance(item, dict):
        raise ValidationError("--acl", where, "is not an object", "see docs/endpoint.md")
    values = {}
    for name in ("accessKey", "secretKey"):
        value = item.get(name)
        if not isinstance(value, str) or not value:
            raise ValidationError("--acl", f"{where}.{name}", "is missing or not a string", "see docs/endpoint.md")
        values[name] = value
    lists = {}
    for name in ("topics", "groups"):
        value = item.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValidationError("--acl", f"{where}.{name}", "is not a list of names", 'e.g. ["Orders"] or ["*"]')
        lists[name] = frozenset(value)
    return Account(values["accessKey"], values["secretKey"], lists["topics"], lists["groups"])
