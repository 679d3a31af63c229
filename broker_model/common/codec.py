"""Pure codecs of RocketMQ values: property strings, tags codes, body CRC, message ids, hosts.

Every function here is deterministic and side-effect free, except :class:`UniqKeyFactory`, whose
ids depend on the clock it is given and on its counter.
"""

from __future__ import annotations

import calendar
import functools
import ipaddress
import itertools
import os
import struct
import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from broker_model.common import constants as c
from broker_model.common.constants import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from schemas.errors import ValidationError

# -- properties ----------------------------------------------------------------------------------


def encode_properties(properties: Mapping[str, str | None], trailing_separator: bool = True) -> str:
    """Encode properties as RocketMQ's property string ``name\\x01value\\x02...``.

    Entries with a ``None`` value are skipped (as ``messageProperties2String`` does). The
    trailing ``\\x02`` is kept by default (RocketMQ 5.2+); ``trailing_separator=False`` gives the
    4.9.1-5.1 form. Entry order is the mapping's order.
    """
    parts = [f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in properties.items() if v is not None]
    text = "".join(parts)
    if not trailing_separator and text:
        text = text[:-1]
    return text


def decode_properties(text: str) -> dict[str, str]:
    """Decode a RocketMQ property string, accepting both trailing-separator forms.

    Follows ``string2messageProperties``: segments shorter than 3 characters are ignored, the key
    is the text before the first ``\\x01`` and must be non-empty, the value is the rest and must be
    non-empty (a value may contain ``\\x01``). A later duplicate key wins.
    """
    result: dict[str, str] = {}
    for segment in text.split(PROPERTY_SEPARATOR):
        if len(segment) < 3:
            continue
        key, sep, value = segment.partition(NAME_VALUE_SEPARATOR)
        if sep and key and value:
            result[key] = value
    return result


# -- tags ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def java_string_hash(text: str) -> int:
    """Java ``String.hashCode`` of ``text`` (over UTF-16 code units), a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")  # Java hashes lone surrogates too
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The consume queue tags code of ``tags``: 0 when null or empty, else its Java hash."""
    return java_string_hash(tags) if tags else 0


# -- body CRC ------------------------------------------------------------------------------------


def body_crc(body: bytes) -> int:
    """``UtilAll.crc32``: the IEEE CRC-32 of ``body`` masked with 0x7FFFFFFF (never negative)."""
    return zlib.crc32(body) & 0x7FFFFFFF


# -- hosts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostAddress:
    """An IPv4 or IPv6 address with a port, as stored in BORNHOST / STOREHOST."""

    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def is_v6(self) -> bool:
        """True for an IPv6 address (the record then spends 20 bytes on it)."""
        return self.ip.version == 6

    def to_bytes(self) -> bytes:
        """IP bytes (4 or 16) followed by the port as a big-endian 4-byte int."""
        return self.ip.packed + struct.pack(">i", self.port)

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.is_v6 else f"{self.ip}:{self.port}"


@functools.lru_cache(maxsize=1024)
def parse_host(text: str, field: str = "host") -> HostAddress:
    """Parse ``ip:port`` or ``[ipv6]:port``.

    Raises:
        ValidationError: the text is not an address with a port in [0, 65535].
    """
    if text.startswith("["):
        ip_text, _, port_text = text[1:].partition("]:")
    else:
        ip_text, _, port_text = text.rpartition(":")
    try:
        port = int(port_text)
        ip = ipaddress.ip_address(ip_text)
    except ValueError:
        raise ValidationError(field, text, "not an address", "write ip:port or [ipv6]:port") from None
    if not 0 <= port <= 65535:
        raise ValidationError(field, text, "port out of range", "use a port in [0, 65535]")
    return HostAddress(ip, port)


@functools.lru_cache(maxsize=1024)
def host_from_bytes(data: bytes) -> HostAddress:
    """Inverse of :meth:`HostAddress.to_bytes` (8 bytes for IPv4, 20 for IPv6)."""
    ip_len = len(data) - 4
    ip = ipaddress.ip_address(data[:ip_len])
    (port,) = struct.unpack(">i", data[ip_len:])
    return HostAddress(ip, port)


# -- offset message id ---------------------------------------------------------------------------


def create_msg_id(store_host: HostAddress, commit_log_offset: int) -> str:
    """The offset message id: store IP, port (4 bytes), commit log offset (8 bytes), uppercase hex."""
    return (store_host.to_bytes() + struct.pack(">q", commit_log_offset)).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[HostAddress, int]:
    """Decode an offset message id into (store host, commit log offset); lowercase is accepted.

    Raises:
        ValidationError: the id is not 32 (IPv4) or 56 (IPv6) hex characters.
    """
    raw = _id_bytes("msg_id", msg_id)
    (offset,) = struct.unpack(">q", raw[-8:])
    return host_from_bytes(raw[:-8]), offset


# -- client unique id (UNIQ_KEY) ------------------------------------------------------------------


def month_start_ms(epoch_ms: int) -> int:
    """Epoch ms of midnight UTC on day 1 of the month holding ``epoch_ms``."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return calendar.timegm((moment.year, moment.month, 1, 0, 0, 0)) * 1000


def _previous_month_start_ms(month_start: int) -> int:
    return month_start_ms(month_start - 1)


@dataclass(frozen=True)
class UniqKey:
    """The parts of a decoded client unique id."""

    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    pid: int
    class_loader_hash: int
    time_ms: int
    counter: int


class UniqKeyFactory:
    """Creates client unique ids as ``MessageClientIDSetter`` does, thread-safe.

    Layout: IP (4 or 16 bytes), pid (2), class loader hash (4), ms since the start of the month
    (4), counter (2), uppercase hex. The month starts at midnight UTC: the product never uses the
    machine's local zone. The counter starts at ``counter_start`` and wraps at 16 bits.
    """

    def __init__(
        self,
        ip: str = "127.0.0.1",
        pid: int | None = None,
        class_loader_hash: int = 0,
        clock: Callable[[], int] | None = None,
        counter_start: int = 0,
    ) -> None:
        address = ipaddress.ip_address(ip)
        self._fixed = address.packed + struct.pack(">h", _to_short(os.getpid() if pid is None else pid))
        self._fixed += struct.pack(">i", _to_int(class_loader_hash))
        self._clock = clock or _now_ms
        self._counter = itertools.count(counter_start)
        self._lock = threading.Lock()
        self._month = (0, 0)  # [start, next start) of the month the last id fell in
        self._fixed_hex = self._fixed.hex().upper()

    def create(self) -> str:
        """A new unique id for now."""
        return self.create_many(1)[0]

    def create_many(self, count: int) -> list[str]:
        """``count`` new unique ids for now (one clock read, consecutive counters)."""
        now = self._clock()
        with self._lock:
            start, end = self._month
            if not start <= now < end:
                start = month_start_ms(now)
                self._month = (start, month_start_ms(start + 32 * 86_400_000))
            counters = [next(self._counter) & 0xFFFF for _ in range(count)]
        span = (now - start) & 0xFFFFFFFF
        return [self._fixed_hex + _SPAN_COUNTER.pack(span, counter).hex().upper() for counter in counters]


_SPAN_COUNTER = struct.Struct(">IH")
_PROCESS_FACTORIES: dict[str, UniqKeyFactory] = {}
_PROCESS_FACTORIES_LOCK = threading.Lock()


def process_uniq_key_factory(ip: str = "127.0.0.1") -> UniqKeyFactory:
    """The process-wide id factory of ``ip``: like RocketMQ's static counter, it is shared by every
    producer of the process so that two producers never create the same id."""
    with _PROCESS_FACTORIES_LOCK:
        factory = _PROCESS_FACTORIES.get(ip)
        if factory is None:
            factory = _PROCESS_FACTORIES[ip] = UniqKeyFactory(ip=ip)
        return factory


def decode_uniq_key(uniq_key: str, now_ms: int) -> UniqKey:
    """Decode a client unique id; its time is recovered relative to ``now_ms``.

    As ``getNearlyTimeFromID``: the id holds ms since a month start; the month is the current one
    unless that would put the time at or after ``now_ms``, then the previous one.

    Raises:
        ValidationError: the id is not 32 or 56 hex characters.
    """
    raw = _id_bytes("uniq_key", uniq_key)
    ip_len = len(raw) - 12
    pid, loader, span, counter = struct.unpack(">HiIH", raw[ip_len:])
    start = month_start_ms(now_ms)
    if start + span >= now_ms:
        start = _previous_month_start_ms(start)
    return UniqKey(ipaddress.ip_address(raw[:ip_len]), pid, loader, start + span, counter)


def _id_bytes(field: str, text: str) -> bytes:
    """The bytes of a 32 (IPv4) or 56 (IPv6) hex character id."""
    if len(text) not in (32, 56):
        raise ValidationError(field, text, "must be 32 (IPv4) or 56 (IPv6) hex characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValidationError(field, text, "not hexadecimal") from None


def _to_short(value: int) -> int:
    value &= 0xFFFF
    return value - 0x10000 if value & 0x8000 else value


def _to_int(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - 0x100000000 if value & 0x80000000 else value


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


def decompress_body(body: bytes, sys_flag: int) -> bytes:
    """The user's body of a stored record: decompressed when the compressed flag is set.

    Raises:
        ValidationError: the compression type (LZ4, ZSTD) is not one this product reads.
    """
    if not sys_flag & c.COMPRESSED_FLAG:
        return body
    kind = sys_flag & c.COMPRESSION_TYPE_MASK
    if kind in (0, c.COMPRESSION_ZLIB_TYPE):
        return zlib.decompress(body)
    raise ValidationError("sys_flag", sys_flag, "uses a compression type other than zlib", "decompress it yourself")
