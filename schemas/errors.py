"""The product's error hierarchy: every error a user can see is one of these.

Messages name the field, the bad value (``!r``) and what to do about it. Validation errors are
raised before any work and before any write.
"""

from __future__ import annotations


class RmqLakeError(Exception):
    """Base of every error this product raises on purpose."""


class ValidationError(RmqLakeError, ValueError):
    """Bad input: a field has a value the product refuses. Nothing was written.

    Attributes:
        field: the name of the offending field or option.
        value: the offending value.
    """

    def __init__(self, field: str, value: object, problem: str, fix: str = "") -> None:
        self.field = field
        self.value = value
        text = f"{field}={value!r}: {problem}"
        if fix:
            text += f"; {fix}"
        super().__init__(text)


class BrokerError(RmqLakeError):
    """The broker cannot do what was asked (not started, stopped, failed commit)."""


class BrokerLockedError(BrokerError):
    """Another live process already runs a broker with this name on this lake."""


class CommitFailedError(BrokerError):
    """A commit log write did not become durable after its retries; the send did not happen."""


class CorruptRecordError(RmqLakeError):
    """A commit log record does not decode (bad magic, size mismatch, CRC mismatch).

    Attributes:
        source: the file (or table) holding the record.
        position: the byte position of the record in that file.
    """

    def __init__(self, source: str, position: int, problem: str) -> None:
        self.source = source
        self.position = position
        super().__init__(f"corrupt record in {source} at byte {position}: {problem}")


class LakeError(RmqLakeError):
    """A lake table cannot be read or written as asked."""


class UnsupportedTableError(LakeError):
    """A Delta table uses a feature this engine cannot honour; reading it would return wrong rows."""


class CommitConflictError(LakeError):
    """A commit made since the version a write read conflicts with the write; nothing was committed."""
