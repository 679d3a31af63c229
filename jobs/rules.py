"""The Spark column forms of the RocketMQ rules in :mod:`broker_model.common.rules`, for the jobs:
dispatch, the DELAY level of a record's property bytes, the consume-queue tags code, the Java string
hash, and the consumer's current offset (the latest commit per group-queue key).

``tests/test_rules.py`` holds each form against the Python one. See docs/rocketmq.md.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker_model.common import GROUP_QUEUE_KEY
from broker_model.common import constants as c
from broker_model.common.rules import DISPATCHED_TRANSACTION_TYPES

_UINT32 = 1 << 32  # Java int arithmetic is modulo 2^32


_INT_SIGN = 1 << 31


_UNKNOWN_DELAY_LEVEL_MILLIS = 1000  # ScheduleMessageService.computeDeliverTimestamp for a level not in the table


_SEP, _KV = c.PROPERTY_SEPARATOR, c.NAME_VALUE_SEPARATOR
_DELAY_PATTERN = f"(?:^|{_SEP}){c.PROPERTY_DELAY_TIME_LEVEL}{_KV}([^{_SEP}]+)"
_DELAY_ENTRY = f"{_SEP}{c.PROPERTY_DELAY_TIME_LEVEL}{_KV}"  # an entry keyed DELAY, after its separator


def java_string_hash(text: Column) -> Column:
    """Java ``String.hashCode`` of a string column, as a long (a signed 32-bit value).

    ``h = 31 * h + unit`` over the string's UTF-16 code units (a character outside the BMP is two
    surrogate units), modulo 2^32 in bigint arithmetic (no overflow under ANSI mode), then
    sign-extended. "" gives 0, null gives null.
    """
    units = F.regexp_extract_all(F.hex(F.encode(text, "UTF-16BE")), F.lit("([0-9A-F]{4})"), 1)
    unsigned = F.aggregate(
        units, F.lit(0).cast("long"), lambda h, unit: (h * 31 + F.conv(unit, 16, 10).cast("long")) % _UINT32
    )
    return (unsigned + _INT_SIGN) % _UINT32 - _INT_SIGN


def delay_level(raw_properties: Column) -> Column:
    """The DELAY property in a record's property bytes as an int; null when absent or not an integer.

    Parsed as the broker parses a stored record (``string2messageProperties``): entries are
    ``key\\x01value`` separated by ``\\x02``, a value is non-empty, the last DELAY entry wins.
    """
    raw = raw_properties.cast("string")
    text = F.concat(F.lit(_SEP), raw)  # every entry, the first one too, follows a separator
    # the last entry keyed DELAY, found by plain search; a regular expression over every property
    # took a fifth of the consume-queue rows pass on a log where retries put many records on the
    # schedule topic. Only an empty last value (no entry for the broker) needs the expression.
    last = F.substring_index(F.substring_index(text, _DELAY_ENTRY, -1), _SEP, 1)
    nonempty_last = F.try_element_at(F.regexp_extract_all(raw, F.lit(_DELAY_PATTERN), 1), F.lit(-1))
    value = F.when(text.contains(_DELAY_ENTRY), F.when(last != "", last).otherwise(nonempty_last))
    return F.when(value.rlike("^[+-]?[0-9]+$"), value.try_cast("int"))


def delay_millis(level: Column) -> Column:
    """The delay (ms) of a level in 1..18; ``computeDeliverTimestamp``'s +1000 ms for any other level."""
    table = F.create_map(*[F.lit(x) for i, ms in enumerate(c.DELAY_LEVEL_MILLIS, 1) for x in (i, ms)])
    return F.coalesce(F.try_element_at(table, level).cast("long"), F.lit(_UNKNOWN_DELAY_LEVEL_MILLIS).cast("long"))


def is_dispatched(sys_flag: Column) -> Column:
    """True when the record's transaction type (``sys_flag & 12``) is NOT (0) or COMMIT (8)."""
    return sys_flag.bitwiseAND(c.TRANSACTION_ROLLBACK_TYPE).isin(*DISPATCHED_TRANSACTION_TYPES)


def consume_queue_tags_code(tags_hash: Column, delay_level: Column, store_timestamp: Column) -> Column:
    """The tags code of a record's consume-queue row: with a DELAY level (:func:`delay_level`, null
    off the schedule topic) capped at 18 and above 0, the delivery time; otherwise ``tags_hash``
    (the Java hash of the tags, null for null or empty tags, which code 0)."""
    level = F.when(delay_level > c.MAX_DELAY_LEVEL, F.lit(c.MAX_DELAY_LEVEL)).otherwise(delay_level)
    scheduled_code = F.when(level > 0, store_timestamp + delay_millis(level))
    return F.coalesce(scheduled_code, tags_hash, F.lit(0).cast("long"))


CURRENT_OFFSET_COLUMNS = (*GROUP_QUEUE_KEY, "consumer_offset", "commit_timestamp", "source")


def build_current_offsets(commits_df: DataFrame, as_of: int) -> DataFrame:
    """The latest offset commit per (group, broker_name, topic, queue_id) at or before ``as_of``.

    Args:
        commits_df: rows of ``consumer_offset_commits`` (at least the key, ``offset``,
            ``commit_timestamp`` and ``source``).
        as_of: epoch milliseconds; commits with ``commit_timestamp <= as_of`` count.

    Returns:
        :data:`CURRENT_OFFSET_COLUMNS`, one row per key that has such a commit;
        ``consumer_offset`` is the committed ``offset`` (the next queue offset to consume).

    Determinism: the latest commit is the one with the greatest ``commit_timestamp``; a tie (writers
    keep the timestamp strictly increasing per key, so a tie is a writer's fault) goes to source
    ``reset`` (an operator's reset overrides a consumer commit of the same instant, as a pending
    server-side reset does in RocketMQ 5), then to the larger offset, then to the greatest source
    name: a total order on every output column, so tied rows left over are identical.
    """
    latest = F.max(
        F.struct(
            F.col("commit_timestamp"),
            (F.col("source") == F.lit("reset")).alias("is_reset"),
            F.col("offset"),
            F.col("source"),
        )
    ).alias("latest")
    return (
        commits_df.where(F.col("commit_timestamp") <= F.lit(as_of))
        .groupBy(*GROUP_QUEUE_KEY)
        .agg(latest)
        .select(
            *GROUP_QUEUE_KEY,
            F.col("latest.offset").alias("consumer_offset"),
            F.col("latest.commit_timestamp").alias("commit_timestamp"),
            F.col("latest.source").alias("source"),
        )
    )
