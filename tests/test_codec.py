"""Pure tests (no Spark) of the codecs, the record layout and the send validation rules.

Expected values come from docs/rocketmq.md (RocketMQ's own tests where
it has them) or from reference implementations written here independently of the code under test.
"""

from __future__ import annotations

import ipaddress
import struct
import time
import zlib
from calendar import timegm
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_model.common import (
    HostAddress,
    Message,
    UniqKeyFactory,
    body_crc,
    create_msg_id,
    decode_msg_id,
    decode_properties,
    decode_uniq_key,
    encode_properties,
    java_string_hash,
    parse_host,
    tags_code,
    validate_batch,
    validate_group,
    validate_message,
    validate_send_topic,
    validate_topic,
)
from broker_model.common import constants as c
from broker_model.store import decode_record, encode_blank, encode_record, magic_for_topic, peek_header, record_length
from schemas.errors import CorruptRecordError, ValidationError
from tests.builders import commitlog_record, record_fields

SOH, STX = "\x01", "\x02"  # NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, milli: int = 0) -> int:
    """Epoch milliseconds of a UTC wall-clock time."""
    return timegm((year, month, day, hour, minute, second)) * 1000 + milli


# -- Java String.hashCode and tags codes --------------------------------------------------------


def reference_java_hash(text: str) -> int:
    """Java ``String.hashCode`` written from its definition: s[0]*31^(n-1) + ... over UTF-16 units."""
    units: list[int] = []
    for char in text:
        point = ord(char)
        if point > 0xFFFF:
            point -= 0x10000
            units += [0xD800 + (point >> 10), 0xDC00 + (point & 0x3FF)]
        else:
            units.append(point)
    total = sum(unit * pow(31, len(units) - 1 - i, 2**32) for i, unit in enumerate(units)) % 2**32
    return total - 2**32 if total >= 2**31 else total


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TagA", 2598919),
        ("*", 42),
        ("123", 48690),
        ("234", 49683),
        ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE, the classic overflow example
        ("", 0),
        ("é", 233),
        ("中文", 20013 * 31 + 25991),
        ("😀", 0xD83D * 31 + 0xDE00),  # one code point, two UTF-16 units
        ("a😀b", ((97 * 31 + 0xD83D) * 31 + 0xDE00) * 31 + 98),
    ],
)
def test_java_string_hash_known_values(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


@given(st.text())
def test_java_string_hash_matches_reference(text: str) -> None:
    assert java_string_hash(text) == reference_java_hash(text)


@pytest.mark.parametrize("tags", [None, ""])
def test_tags_code_of_missing_tags_is_zero(tags: str | None) -> None:
    assert tags_code(tags) == 0


def test_tags_code_is_the_java_hash() -> None:
    assert tags_code("TagA") == 2598919


# -- body CRC ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "expected"), [(b"hello!q!", 1020379427), (b"", 0)])
def test_body_crc_known_values(body: bytes, expected: int) -> None:
    assert body_crc(body) == expected


def test_body_crc_masks_the_sign_bit() -> None:
    assert zlib.crc32(b"hello!q!") == 3167863075  # the raw CRC has the top bit set
    assert body_crc(b"hello!q!") == 3167863075 - 2**31


@given(st.binary())
def test_body_crc_is_never_negative(body: bytes) -> None:
    assert 0 <= body_crc(body) < 2**31


# -- offset message ids --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("msg_id", "ip", "port", "offset"),
    [
        ("645100FA00002A9F000000489A3AA09E", "100.81.0.250", 10911, 311825178782),
        (
            "24084004018081003FAA1DDE2B3F898A00002A9F0000000000000CA0",
            "2408:4004:180:8100:3faa:1dde:2b3f:898a",
            10911,
            3232,
        ),
        ("7F0000010000238F000000000001E240", "127.0.0.1", 9103, 123456),
    ],
)
@pytest.mark.parametrize("case", [str.upper, str.lower])
def test_decode_msg_id_known_values(msg_id: str, ip: str, port: int, offset: int, case: Any) -> None:
    host, decoded_offset = decode_msg_id(case(msg_id))
    assert (host.ip, host.port, decoded_offset) == (ipaddress.ip_address(ip), port, offset)


def test_create_msg_id_known_value() -> None:
    assert create_msg_id(parse_host("127.0.0.1:9103"), 123456) == "7F0000010000238F000000000001E240"


@given(
    st.ip_addresses(),
    st.integers(0, 65535),
    st.integers(0, 2**63 - 1),
)
def test_msg_id_round_trips(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, offset: int) -> None:
    msg_id = create_msg_id(HostAddress(ip, port), offset)
    assert len(msg_id) == (32 if ip.version == 4 else 56)
    assert msg_id == msg_id.upper()
    assert decode_msg_id(msg_id) == (HostAddress(ip, port), offset)


@pytest.mark.parametrize(
    "msg_id", ["", "7F", "7F0000010000238F000000000001E24", "7F0000010000238F000000000001E2400", "A" * 55]
)
def test_decode_msg_id_rejects_a_bad_length(msg_id: str) -> None:
    with pytest.raises(ValidationError) as caught:
        decode_msg_id(msg_id)
    assert (caught.value.field, caught.value.value) == ("msg_id", msg_id)


def test_decode_msg_id_rejects_non_hex() -> None:
    with pytest.raises(ValidationError, match="hexadecimal"):
        decode_msg_id("ZZ0000010000238F000000000001E240")


# -- client unique ids (UNIQ_KEY) ----------------------------------------------------------------


def test_uniq_key_time_is_within_20_ms_of_creation() -> None:
    before = time.time_ns() // 1_000_000
    uniq_key = UniqKeyFactory(ip="10.1.2.3").create()
    after = time.time_ns() // 1_000_000
    decoded = decode_uniq_key(uniq_key, now_ms=after + 1)
    assert before - 20 <= decoded.time_ms <= after + 20


def test_uniq_key_counter_increments_by_one_in_the_last_four_hex_chars() -> None:
    factory = UniqKeyFactory(ip="10.1.2.3", clock=lambda: ms(2024, 5, 6))
    first, second = factory.create(), factory.create()
    assert int(second[-4:], 16) == int(first[-4:], 16) + 1
    assert first[:-4] == second[:-4]


def test_uniq_key_counter_wraps_at_16_bits() -> None:
    factory = UniqKeyFactory(ip="10.1.2.3", clock=lambda: ms(2024, 5, 6), counter_start=0xFFFF)
    assert [factory.create()[-4:] for _ in range(3)] == ["FFFF", "0000", "0001"]


@pytest.mark.parametrize(
    ("ip", "pid", "stored_pid", "length"),
    [
        ("10.1.2.3", 12345, 12345, 32),
        ("10.1.2.3", 65535, 65535, 32),
        ("10.1.2.3", 70000, 70000 & 0xFFFF, 32),  # (short) pid, read back masked & 0xFFFF
        ("2408:4004:180:8100:3faa:1dde:2b3f:898a", 4321, 4321, 56),
    ],
)
def test_uniq_key_ip_and_pid_round_trip(ip: str, pid: int, stored_pid: int, length: int) -> None:
    uniq_key = UniqKeyFactory(ip=ip, pid=pid, class_loader_hash=-5, clock=lambda: ms(2024, 5, 6)).create()
    decoded = decode_uniq_key(uniq_key, now_ms=ms(2024, 5, 7))
    assert len(uniq_key) == length and uniq_key == uniq_key.upper()
    assert (decoded.ip, decoded.pid, decoded.class_loader_hash) == (ipaddress.ip_address(ip), stored_pid, -5)


@pytest.mark.parametrize(
    ("created", "decoded_at"),
    [
        (ms(2024, 3, 1, 0, 0, 0, 0), ms(2024, 3, 1, 0, 0, 0, 1)),  # span 0, read 1 ms later
        (ms(2024, 3, 15), ms(2024, 3, 15, 0, 0, 0, 5)),  # same month
        (ms(2024, 2, 29, 23, 59, 59, 990), ms(2024, 3, 1, 0, 0, 0, 10)),  # previous month (leap day)
        (ms(2024, 1, 31, 12), ms(2024, 2, 2)),  # previous month, span over 29 days
        (ms(2023, 12, 31, 23, 59, 59, 999), ms(2024, 1, 1, 0, 0, 0, 1)),  # previous month and year
    ],
)
def test_uniq_key_time_uses_the_previous_month_when_needed(created: int, decoded_at: int) -> None:
    uniq_key = UniqKeyFactory(ip="10.1.2.3", clock=lambda: created).create()
    assert decode_uniq_key(uniq_key, now_ms=decoded_at).time_ms == created


@given(st.integers(ms(2000, 1, 1), ms(2100, 1, 1)), st.integers(1, 28 * 24 * 3600 * 1000))
def test_uniq_key_time_is_exact_within_28_days(created: int, age: int) -> None:
    uniq_key = UniqKeyFactory(ip="10.1.2.3", clock=lambda: created).create()
    assert decode_uniq_key(uniq_key, now_ms=created + age).time_ms == created


@pytest.mark.parametrize("uniq_key", ["", "0A010203", "0" * 31, "0" * 57])
def test_decode_uniq_key_rejects_a_bad_length(uniq_key: str) -> None:
    with pytest.raises(ValidationError) as caught:
        decode_uniq_key(uniq_key, now_ms=0)
    assert (caught.value.field, caught.value.value) == ("uniq_key", uniq_key)


# -- property strings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # MessageDecoderTest.testString2messageProperties
        (f"k1{SOH}v1", {"k1": "v1"}),
        ("", {}),
        (" ", {}),
        ("aaa", {}),
        (f"k1{SOH}", {}),
        (f"{SOH}v1", {}),
        (f"k1{SOH}v1{STX}", {"k1": "v1"}),
        (f"k1{SOH}v1{STX}{STX}", {"k1": "v1"}),
        (f"k1{SOH}v1{STX}k2{SOH}v2", {"k1": "v1", "k2": "v2"}),
        (f"k1{SOH}v1{STX}k2{SOH}v2{STX}", {"k1": "v1", "k2": "v2"}),
        (f"k1{SOH}v1{STX}{SOH}v2", {"k1": "v1"}),
        (f"k1{SOH}v1{STX}k2{SOH}", {"k1": "v1"}),
        (f"k1{SOH}v1{STX}k2", {"k1": "v1"}),
        (f"{STX}k1{SOH}v1", {"k1": "v1"}),
        (f"1{SOH}1{STX}2{SOH}2", {"1": "1", "2": "2"}),
        (f"1{SOH}{STX}2{SOH}2", {"2": "2"}),
        (f"1{SOH}1{STX}2{SOH}", {"1": "1"}),
        (f"{SOH}1{STX}2{SOH}2", {"2": "2"}),
        (f"k{SOH}v{SOH}w", {"k": f"v{SOH}w"}),  # a value may hold the name/value separator
        (f"k{SOH}v", {"k": "v"}),  # the shortest entry: 3 chars
        (f"k{SOH}1{STX}k{SOH}2", {"k": "2"}),  # a later duplicate wins, as HashMap.put does
    ],
)
def test_decode_properties_edge_cases(text: str, expected: dict[str, str]) -> None:
    assert decode_properties(text) == expected


@pytest.mark.parametrize(
    ("trailing", "expected"),
    [(True, f"a{SOH}123{STX}b{SOH}hello{STX}"), (False, f"a{SOH}123{STX}b{SOH}hello")],
)
def test_encode_properties_trailing_separator(trailing: bool, expected: str) -> None:
    properties = {"a": "123", "skipped": None, "b": "hello"}  # a null value is not stored
    assert encode_properties(properties, trailing_separator=trailing) == expected


@pytest.mark.parametrize("trailing", [True, False])
def test_encode_properties_of_nothing_is_empty(trailing: bool) -> None:
    assert encode_properties({}, trailing_separator=trailing) == ""


_KEYS = st.text(st.characters(blacklist_characters=f"{SOH}{STX}", blacklist_categories=("Cs",)), min_size=1)
_VALUES = st.text(st.characters(blacklist_characters=STX, blacklist_categories=("Cs",)), min_size=1)


@given(st.dictionaries(_KEYS, _VALUES), st.booleans())
def test_properties_round_trip(properties: dict[str, str], trailing: bool) -> None:
    text = encode_properties(properties, trailing_separator=trailing)
    assert decode_properties(text) == properties
    assert text.endswith(STX) == (trailing and bool(properties))


# -- record length, encode and decode ------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "born_v6", "store_v6", "v2", "expected"),
    [
        ((0, 0, 0), False, False, False, 91),
        ((8, 3, 5), False, False, False, 107),
        ((8, 3, 6), False, False, False, 108),
        ((8, 3, 5), True, False, False, 119),
        ((8, 3, 5), False, True, False, 119),
        ((8, 3, 5), True, True, False, 131),
        ((8, 3, 5), False, False, True, 108),
        ((8, 3, 5), True, True, True, 132),
        ((4 * 1024 * 1024, 255, 32767), False, False, True, 92 + 4 * 1024 * 1024 + 255 + 32767),
    ],
)
def test_record_length_formula(
    lengths: tuple[int, int, int], born_v6: bool, store_v6: bool, v2: bool, expected: int
) -> None:
    assert record_length(*lengths, born_v6=born_v6, store_v6=store_v6, magic_v2=v2) == expected


def make_row(
    topic: str = "abc",
    body: bytes = b"hello!q!",
    raw_properties: bytes = b"a\x01123\x02",
    born_host: str = "127.0.0.1:5555",
    store_host: str = "127.0.0.1:9103",
    magic: int = c.MAGIC_CODE_V1,
    commit_log_offset: int = 123456,
    extra_sys_flag: int = 0,
) -> dict[str, Any]:
    """A record row with every field set to a distinct value; store_size from the formula."""
    return record_fields(
        commitlog_record(
            topic=topic,
            body=body,
            born_host=str(parse_host(born_host)),
            store_host=str(parse_host(store_host)),
            commit_log_offset=commit_log_offset,
            sys_flag=extra_sys_flag,
            queue_id=1,
            flag=7,
            queue_offset=123,
            born_timestamp=1_700_000_000_001,
            store_timestamp=1_700_000_000_002,
            reconsume_times=2,
            prepared_transaction_offset=99,
            magic_code=magic,
            raw_properties=raw_properties,
        )
    )


@pytest.mark.parametrize(("trailing", "expected"), [(False, 107), (True, 108)])
def test_record_of_the_facts_example_is_107_or_108_bytes(trailing: bool, expected: int) -> None:
    raw = encode_properties({"a": "123"}, trailing_separator=trailing).encode()
    row = make_row(raw_properties=raw)
    assert row["store_size"] == expected
    assert len(encode_record(row)) == expected


@pytest.mark.parametrize(("store_host", "id_length"), [("127.0.0.1:9103", 32), ("[::1]:9103", 56)])
def test_record_round_trip_of_message_decoder_test(store_host: str, id_length: int) -> None:
    raw = encode_properties({"a": "123", "b": "hello", "c": "3.14"}).encode()
    row = make_row(raw_properties=raw, born_host=store_host.replace("9103", "5555"), store_host=store_host)
    decoded = decode_record(encode_record(row))
    assert {k: decoded[k] for k in row} == row
    assert decoded["properties"] == {"a": "123", "b": "hello", "c": "3.14"}
    assert decoded["msg_id"] == create_msg_id(parse_host(store_host), 123456)
    assert len(decoded["msg_id"]) == id_length


def test_decode_record_fills_tags_keys_and_uniq_key() -> None:
    raw = encode_properties({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "0A01", "WAIT": "true"}).encode()
    decoded = decode_record(encode_record(make_row(raw_properties=raw)))
    assert (decoded["tags"], decoded["keys"], decoded["uniq_key"]) == ("TagA", "k1 k2", "0A01")


def test_decode_record_leaves_missing_tags_null() -> None:
    decoded = decode_record(encode_record(make_row(raw_properties=b"")))
    assert (decoded["tags"], decoded["keys"], decoded["uniq_key"], decoded["properties"]) == (None, None, None, {})


_TOPIC_CHARS = "abcXYZ019_-%|"
_HOSTS = st.builds(lambda ip, port: str(HostAddress(ip, port)), st.ip_addresses(), st.integers(0, 65535))


@st.composite
def record_rows(draw: st.DrawFn) -> dict[str, Any]:
    """Rows as RocketMQ 4.9 or 5.x writes them: v1 or v2, IPv4 or IPv6, either property form."""
    topic = draw(st.text(_TOPIC_CHARS, min_size=1, max_size=255))
    magic = c.MAGIC_CODE_V2 if len(topic) > 127 else draw(st.sampled_from([c.MAGIC_CODE_V1, c.MAGIC_CODE_V2]))
    properties = draw(st.dictionaries(_KEYS, _VALUES, max_size=5))
    raw = encode_properties(properties, trailing_separator=draw(st.booleans())).encode()
    transaction = draw(st.sampled_from([0, c.TRANSACTION_PREPARED_TYPE, c.TRANSACTION_COMMIT_TYPE]))
    return make_row(
        topic,
        draw(st.binary(max_size=300)),
        raw,
        draw(_HOSTS),
        draw(_HOSTS),
        magic,
        draw(st.integers(0, 2**62)),
        transaction | draw(st.sampled_from([0, c.COMPRESSED_FLAG])),
    )


@given(record_rows())
def test_record_round_trips_byte_exactly(row: dict[str, Any]) -> None:
    data = encode_record(row)
    assert len(data) == row["store_size"]
    decoded = decode_record(data)
    assert {k: decoded[k] for k in row} == row
    assert encode_record(decoded) == data


@given(record_rows(), st.binary(max_size=40))
def test_decode_record_reads_at_a_position(row: dict[str, Any], prefix: bytes) -> None:
    data = prefix + encode_record(row) + b"\x00" * 8
    assert decode_record(data, len(prefix))["commit_log_offset"] == row["commit_log_offset"]


def _corrupt_magic(data: bytearray) -> None:
    data[4:8] = struct.pack(">i", 0x12345678)


def _corrupt_size(data: bytearray) -> None:
    data[0:4] = struct.pack(">i", struct.unpack(">i", data[0:4])[0] - 1)


def _corrupt_body(data: bytearray) -> None:
    data[88] ^= 0xFF  # first body byte (IPv4 hosts): BODYLENGTH is at 84


@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        (_corrupt_magic, "bad magic code"),
        (_corrupt_size, "TOTALSIZE 106 but the fields add up to 107"),
        (_corrupt_body, "body CRC"),
    ],
)
def test_decode_record_rejects_corruption_with_its_position(corrupt: Any, problem: str) -> None:
    record = bytearray(encode_record(make_row(raw_properties=b"a\x01123")))
    corrupt(record)
    data = b"x" * 17 + bytes(record)
    with pytest.raises(CorruptRecordError, match=problem) as caught:
        decode_record(data, 17, source="seg-file")
    assert (caught.value.source, caught.value.position) == ("seg-file", 17)


def test_decode_record_without_crc_check_accepts_a_changed_body() -> None:
    record = bytearray(encode_record(make_row(raw_properties=b"a\x01123")))
    _corrupt_body(record)
    assert decode_record(bytes(record), check_crc=False)["body"][0] == ord("h") ^ 0xFF


def test_decode_record_rejects_a_truncated_record() -> None:
    record = encode_record(make_row())
    with pytest.raises(CorruptRecordError, match="runs past") as caught:
        decode_record(record[:-1], 0, source="f")
    assert caught.value.position == 0


def test_blank_marker_is_eight_bytes_read_back_by_peek_header() -> None:
    blank = encode_blank(1000)  # AppendCallbackTest: maxBlank 1000, 8 bytes written
    assert len(blank) == c.END_FILE_MIN_BLANK_LENGTH
    assert peek_header(blank, 0) == (1000, c.BLANK_MAGIC_CODE)
    assert blank[4:] == bytes.fromhex("CBD43194")


@pytest.mark.parametrize(("data", "position"), [(b"", 0), (b"\x00" * 7, 0), (b"\x00" * 16, 9)])
def test_peek_header_past_the_data_is_zero(data: bytes, position: int) -> None:
    assert peek_header(data, position) == (0, 0)


@pytest.mark.parametrize(("length", "magic"), [(1, c.MAGIC_CODE_V1), (127, c.MAGIC_CODE_V1), (128, c.MAGIC_CODE_V2)])
def test_magic_for_topic_switches_to_v2_over_127_chars(length: int, magic: int) -> None:
    assert magic_for_topic("t" * length) == magic


def test_magic_codes_match_their_hex() -> None:
    codes = [c.MAGIC_CODE_V1, c.MAGIC_CODE_V2, c.BLANK_MAGIC_CODE]
    assert [struct.pack(">i", code).hex().upper() for code in codes] == ["DAA320A7", "DAA320AB", "CBD43194"]


def test_v1_record_with_a_long_topic_round_trips() -> None:
    row = make_row(topic="t" * 200, magic=c.MAGIC_CODE_V1)
    assert decode_record(encode_record(row))["topic"] == "t" * 200


# -- send validation (broker_model/message.py): one test per rule --------------------------------


def _raises(call: Any, *args: Any) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        call(*args)
    return caught.value


def _assert_names(error: ValidationError, field: str, value: object) -> None:
    assert (error.field, error.value) == (field, value)
    assert str(error).startswith(f"{field}={value!r}: ")


def msg(topic: str = "TopicA", body: bytes = b"x", **properties: str) -> Message:
    return Message(topic=topic, body=body, properties=dict(properties))


@pytest.mark.parametrize("topic", ["", " ", "\t"])
def test_blank_topic_is_refused(topic: str) -> None:
    _assert_names(_raises(validate_topic, topic), "topic", topic)


@pytest.mark.parametrize("topic", ["a b", "topic.x", "t/1", "中文", "a\x01"])
def test_topic_with_illegal_characters_is_refused(topic: str) -> None:
    error = _raises(validate_topic, topic)
    _assert_names(error, "topic", topic)
    assert "illegal characters" in str(error)


@pytest.mark.parametrize(("length", "valid"), [(1, True), (127, True), (128, False), (255, False)])
def test_topic_longer_than_127_chars_is_refused(length: int, valid: bool) -> None:
    topic = "T" * length
    if valid:
        validate_topic(topic)
    else:
        _assert_names(_raises(validate_topic, topic), "topic", topic)


@pytest.mark.parametrize("topic", [*sorted(c.NOT_ALLOWED_SEND_TOPICS), "rmq_sys_anything"])
def test_sending_to_a_broker_topic_is_refused(topic: str) -> None:
    error = _raises(validate_send_topic, topic)
    _assert_names(error, "topic", topic)
    assert f"Sending message to topic[{topic}] is forbidden" in str(error)


def test_empty_body_is_refused() -> None:
    _assert_names(_raises(validate_message, msg(body=b"")), "body", b"")


@pytest.mark.parametrize(("size", "valid"), [(c.MAX_MESSAGE_SIZE, True), (c.MAX_MESSAGE_SIZE + 1, False)])
def test_body_over_4_mib_is_refused(size: int, valid: bool) -> None:
    message = msg(body=b"x" * size)
    if valid:
        validate_message(message)
    else:
        _assert_names(_raises(validate_message, message), "body", f"<{size} bytes>")


@pytest.mark.parametrize(
    ("flag", "valid"), [(2**31 - 1, True), (-(2**31), True), (2**31, False), (-(2**31) - 1, False)]
)
def test_flag_outside_a_java_int_is_refused(flag: int, valid: bool) -> None:
    message = Message(topic="TopicA", body=b"x", flag=flag)
    if valid:
        validate_message(message)
    else:
        _assert_names(_raises(validate_message, message), "flag", flag)


def test_non_integer_delay_level_is_refused() -> None:
    _assert_names(_raises(validate_message, msg(DELAY="soon")), "DELAY", "soon")


@pytest.mark.parametrize("name", ["KEYS", "TAGS", "UNIQ_KEY", "DELAY", "__transactionId__"])
def test_reserved_user_property_name_is_refused(name: str) -> None:
    error = _raises(lambda: Message.create("TopicA", b"x", user_properties={name: "v"}))
    _assert_names(error, "property name", name)


@pytest.mark.parametrize(
    ("name", "value", "field", "bad"), [(" ", "v", "property name", " "), ("n", " ", "property n", " ")]
)
def test_blank_user_property_name_or_value_is_refused(name: str, value: str, field: str, bad: str) -> None:
    error = _raises(lambda: Message.create("TopicA", b"x", user_properties={name: value}))
    _assert_names(error, field, bad)


@pytest.mark.parametrize(("length", "valid"), [(255, True), (256, False)])
def test_group_longer_than_255_chars_is_refused(length: int, valid: bool) -> None:
    group = "G" * length
    if valid:
        validate_group(group)
    else:
        _assert_names(_raises(validate_group, group), "group", group)


def test_empty_batch_is_refused() -> None:
    _assert_names(_raises(validate_batch, []), "messages", [])


def test_batch_with_mixed_topics_is_refused() -> None:
    error = _raises(validate_batch, [msg("TopicA"), msg("TopicA"), msg("TopicB")])
    _assert_names(error, "messages[2].topic", "TopicB")


def test_batch_to_a_retry_topic_is_refused() -> None:
    error = _raises(validate_batch, [msg("%RETRY%group"), msg("%RETRY%group")])
    _assert_names(error, "messages[0].topic", "%RETRY%group")


def test_batch_with_a_delay_level_is_refused() -> None:
    error = _raises(validate_batch, [msg(), msg(DELAY="3")])
    _assert_names(error, "messages[1].DELAY", 3)


def test_batch_with_mixed_wait_flags_is_refused() -> None:
    error = _raises(validate_batch, [msg(WAIT="true"), msg(WAIT="false")])
    _assert_names(error, "messages[1].WAIT", False)


def test_valid_batch_is_returned_as_a_list() -> None:
    batch = (m for m in [msg(), msg()])
    assert len(validate_batch(batch)) == 2
