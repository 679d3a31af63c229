"""The endpoint's refusal of a request: a protocol code and a message naming the field."""

from __future__ import annotations


class RequestError(Exception):
    """A request refused with a protocol code (``apache.rocketmq.v2.Code``) and a message naming the field."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
