"""The configuration files of a RocketMQ store (``{storePathRootDir}/config/``) as snapshots of the
lake's configuration tables, for :mod:`broker_model.store.store_ingest`.

RocketMQ writes them with fastjson through ``MixAll.string2File`` (a ``.tmp`` file, a ``.bak``
copy of the previous content, then the rename) and reads them back with ``ConfigManager.load``,
which falls back to the ``.bak`` copy when the file is missing. fastjson may leave integer map keys
unquoted (``{0:88526}``), so :func:`parse_fastjson` accepts both key forms; nothing is evaluated.

Each snapshot contributes only what differs from the lake's latest state of that broker:

- ``consumerOffset.json`` (``offsetTable``: ``"topic@group" -> {queueId: offset}``): one
  ``consumer_offset_commits`` row per changed offset, timed by the file's modification time;
- ``topics.json`` (``topicConfigTable``): ``topic_config`` rows of changed queue counts or
  permissions;
- ``subscriptionGroup.json`` (``subscriptionGroupTable``): ``subscription_group`` rows of changed
  settings (retry queues, max retries, the enable switches, orderly);
- ``delayOffset.json`` (``offsetTable``: ``level -> next schedule queue offset``): the schedule
  progress file the lake keeps per broker (where a broker of ours keeps its own).

The way back: :func:`write_store_offsets` writes a reset into a stopped broker's
``consumerOffset.json``. See docs/ingest.md.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import constants as c
from broker_model.common import now_ms
from broker_model.common.durable import write_json_durably
from broker_model.store.delta_tables import append_rows, read_table
from schemas.catalog import CONSUMER_OFFSET_COMMITS, SUBSCRIPTION_GROUP, TOPIC_CONFIG, TableSpec
from schemas.errors import ValidationError

CONFIG_FILES: Final = ("consumerOffset.json", "topics.json", "subscriptionGroup.json", "delayOffset.json")
_KEY_START: Final = frozenset("-0123456789")


# -- fastjson text -------------------------------------------------------------------------------


def parse_fastjson(text: str, source: str) -> Any:
    """Parse JSON as fastjson writes it: object keys may be bare integers (``{0:1}``).

    Raises:
        ValidationError: not such JSON; names ``source`` and the line and column in it.
    """
    quoted, inserted = _quote_bare_keys(text)
    try:
        return json.loads(quoted)
    except json.JSONDecodeError as err:
        position = err.pos - 2 * sum(1 for at in inserted if at < err.pos)
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        raise ValidationError(
            "config file",
            source,
            f"is not valid JSON at line {line}, column {column}: {err.msg}",
            "restore it from its .bak copy, or move it aside to skip it",
        ) from None


def _quote_bare_keys(text: str) -> tuple[str, list[int]]:
    """``text`` with every bare integer object key quoted; the positions (in the result) of the
    inserted opening quotes."""
    out: list[str] = []
    inserted: list[int] = []
    length = 0
    i, n = 0, len(text)
    in_string = False
    expect_key = False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            length += 1
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                length += 1
                i += 1
            elif ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string, expect_key = True, False
        elif ch in "{,":
            expect_key = True
        elif expect_key and ch in _KEY_START:
            end = i + 1
            while end < n and text[end].isdigit():
                end += 1
            rest = end
            while rest < n and text[rest] in " \t\r\n":
                rest += 1
            if rest < n and text[rest] == ":":
                inserted.append(length)
                token = '"' + text[i:end] + '"'
                out.append(token)
                length += len(token)
                i, expect_key = end, False
                continue
            expect_key = False
        elif not ch.isspace():
            expect_key = False
        out.append(ch)
        length += 1
        i += 1
    return "".join(out), inserted


def read_config(config_dir: Path, name: str) -> tuple[dict[str, Any], int] | None:
    """(content, modification time in epoch ms) of ``config_dir/name``, or of its ``.bak`` copy
    when the file is missing (as ``ConfigManager.load`` does); None when neither exists.

    Raises:
        ValidationError: the file is not a JSON object as fastjson writes it.
    """
    for path in (config_dir / name, config_dir / f"{name}.bak"):
        try:
            text = path.read_text(encoding="utf-8")
            mtime = path.stat().st_mtime_ns // 1_000_000
        except FileNotFoundError:
            continue
        except UnicodeDecodeError as err:
            raise ValidationError(
                "config file", str(path), f"is not UTF-8 text at byte {err.start}", "restore it from its .bak copy"
            ) from None
        if not text.strip():
            return None  # RocketMQ treats an empty file as no content
        data = parse_fastjson(text, str(path))
        if not isinstance(data, dict):
            raise ValidationError("config file", str(path), "is not a JSON object", "restore it from its .bak copy")
        return data, mtime
    return None


# -- the snapshot --------------------------------------------------------------------------------


@dataclass
class ConfigSnapshot:
    """What a store's config files say, read and checked before anything is written.

    Attributes:
        offsets: ``(group, topic, queue_id) -> offset`` of ``consumerOffset.json``.
        offsets_time: its modification time, epoch ms.
        topics: ``topic -> (queue count, perm, message type or None)`` of ``topics.json``.
        topics_time: its modification time.
        groups: ``group -> subscription_group`` settings of ``subscriptionGroup.json``.
        groups_time: its modification time.
        delay: ``level -> next schedule queue offset`` of ``delayOffset.json`` (None when absent).
    """

    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    offsets_time: int = 0
    topics: dict[str, tuple[int, int, str | None]] = field(default_factory=dict)
    topics_time: int = 0
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups_time: int = 0
    delay: dict[int, int] | None = None


def read_snapshot(store_dir: Path) -> ConfigSnapshot:
    """The config files of ``store_dir/config`` (missing ones contribute nothing).

    Raises:
        ValidationError: a malformed file, naming it and where.
    """
    config_dir = store_dir / "config"
    snapshot = ConfigSnapshot()
    found = read_config(config_dir, "consumerOffset.json")
    if found is not None:
        snapshot.offsets, snapshot.offsets_time = _offsets(found[0], config_dir / "consumerOffset.json"), found[1]
    found = read_config(config_dir, "topics.json")
    if found is not None:
        snapshot.topics, snapshot.topics_time = _topics(found[0], config_dir / "topics.json"), found[1]
    found = read_config(config_dir, "subscriptionGroup.json")
    if found is not None:
        snapshot.groups, snapshot.groups_time = _groups(found[0], config_dir / "subscriptionGroup.json"), found[1]
    found = read_config(config_dir, "delayOffset.json")
    if found is not None:
        table = _object(found[0].get("offsetTable", {}), config_dir / "delayOffset.json", "offsetTable")
        snapshot.delay = {_int(k, config_dir / "delayOffset.json", "level"): _int(v, "", "") for k, v in table.items()}
    return snapshot


def _object(value: Any, path: Path, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError("config file", str(path), f"{name} is not an object", "restore it from its .bak copy")
    return value


def _int(value: Any, path: Path | str, name: str) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        return int(value)
    except (TypeError, ValueError):
        raise ValidationError(
            "config file", str(path), f"{name} {value!r} is not an integer", "restore it from its .bak copy"
        ) from None


def _offsets(data: Mapping[str, Any], path: Path) -> dict[tuple[str, str, int], int]:
    offsets = {}
    for key, queues in _object(data.get("offsetTable", {}), path, "offsetTable").items():
        topic, at, group = key.partition("@")
        if not at or not topic or not group:
            raise ValidationError(
                "config file", str(path), f"offsetTable key {key!r} is not topic@group", "restore it from its .bak copy"
            )
        for queue_id, offset in _object(queues, path, f"offsetTable[{key!r}]").items():
            offsets[(group, topic, _int(queue_id, path, "queue id"))] = _int(offset, path, "offset")
    return offsets


def _topics(data: Mapping[str, Any], path: Path) -> dict[str, tuple[int, int, str | None]]:
    topics = {}
    for name, config in _object(data.get("topicConfigTable", {}), path, "topicConfigTable").items():
        config = _object(config, path, f"topicConfigTable[{name!r}]")
        queues = max(_int(config.get(k, 0), path, k) for k in ("readQueueNums", "writeQueueNums"))
        perm = _int(config.get("perm", c.PERM_READ | c.PERM_WRITE), path, "perm")
        attributes = _object(config.get("attributes") or {}, path, f"topicConfigTable[{name!r}].attributes")
        kind = attributes.get(c.MESSAGE_TYPE_ATTRIBUTE)
        if kind is not None and kind not in c.TOPIC_MESSAGE_TYPES:
            raise ValidationError(
                f"topicConfigTable[{name!r}].attributes.{c.MESSAGE_TYPE_ATTRIBUTE}",
                kind,
                f"in {path} is not a topic message type",
                f"one of {c.TOPIC_MESSAGE_TYPES}",
            )
        topics[name] = (queues, perm, kind)
    return topics


def _groups(data: Mapping[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    groups = {}
    for name, config in _object(data.get("subscriptionGroupTable", {}), path, "subscriptionGroupTable").items():
        config = _object(config, path, f"subscriptionGroupTable[{name!r}]")
        groups[name] = {
            "retry_max_times": _int(config.get("retryMaxTimes", 16), path, "retryMaxTimes"),
            "retry_queue_nums": _int(config.get("retryQueueNums", 1), path, "retryQueueNums"),
            "consume_enable": bool(config.get("consumeEnable", True)),
            "consume_broadcast_enable": bool(config.get("consumeBroadcastEnable", True)),
            "consume_from_min_enable": bool(config.get("consumeFromMinEnable", True)),
            "consume_message_orderly": bool(config.get("consumeMessageOrderly", False)),
            **retry_policy_columns(
                config.get("groupRetryPolicy"), f"subscriptionGroupTable[{name!r}].groupRetryPolicy", f" in {path}"
            ),
        }
    return groups


_NO_POLICY = dict.fromkeys(("retry_policy", "retry_next_ms", "retry_initial_ms", "retry_max_ms", "retry_multiplier"))


def retry_policy_columns(policy: Any, name: str, where: str = "") -> dict[str, Any]:
    """The ``subscription_group`` retry columns of a ``groupRetryPolicy`` object as RocketMQ writes
    it (``{"type": ..., "customizedRetryPolicy": {"next": [...]}}`` or ``"exponentialRetryPolicy":
    {"initial", "max", "multiplier"}``); None: no policy set.

    Raises:
        ValidationError: a value of another shape, named by its path under ``name`` (``where`` says
            where it was read).
    """
    if policy is None:
        return dict(_NO_POLICY)
    if not isinstance(policy, dict):
        raise ValidationError(name, policy, f"is not an object{where}")
    kind = policy.get("type", "CUSTOMIZED")
    if kind not in c.RETRY_POLICIES:
        raise ValidationError(f"{name}.type", kind, f"is not a retry policy{where}", f"{c.RETRY_POLICIES}")
    found = {**_NO_POLICY, "retry_policy": kind}
    inner = policy.get("customizedRetryPolicy" if kind == "CUSTOMIZED" else "exponentialRetryPolicy")
    if inner is None:
        return found
    path = f"{name}.{'customizedRetryPolicy' if kind == 'CUSTOMIZED' else 'exponentialRetryPolicy'}"
    if not isinstance(inner, dict):
        raise ValidationError(path, inner, f"is not an object{where}")
    keys = [("next", "retry_next_ms")] if kind == "CUSTOMIZED" else list(_EXPONENTIAL_KEYS)
    for key, column in keys:
        value = inner.get(key)
        values = value if key == "next" and isinstance(value, list) else [value]
        if value is None:
            continue
        if (key == "next" and not isinstance(value, list)) or not all(_whole(v) for v in values):
            kind_of = "a list of integers" if key == "next" else "an integer"
            raise ValidationError(f"{path}.{key}", value, f"is not {kind_of}{where}")
        found[column] = [int(v) for v in values if v is not None] if key == "next" else values[0]
    if kind == "EXPONENTIAL":  # the object given: RocketMQ's defaults for the keys it lacks
        defaults = dict(zip((column for _, column in _EXPONENTIAL_KEYS), c.EXPONENTIAL_RETRY_MS, strict=True))
        found.update({column: default for column, default in defaults.items() if found[column] is None})
    if found["retry_next_ms"] == []:
        raise ValidationError(f"{path}.next", [], f"holds no delay{where}")
    return found


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_EXPONENTIAL_KEYS = (("initial", "retry_initial_ms"), ("max", "retry_max_ms"), ("multiplier", "retry_multiplier"))


def retry_policy_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``subscription_group`` row's retry columns as RocketMQ writes ``groupRetryPolicy``."""
    policy: dict[str, Any] = {"type": row["retry_policy"]}
    if row["retry_policy"] == "CUSTOMIZED" and row["retry_next_ms"] is not None:
        policy["customizedRetryPolicy"] = {"next": list(row["retry_next_ms"])}
    given = {"initial": row["retry_initial_ms"], "max": row["retry_max_ms"], "multiplier": row["retry_multiplier"]}
    if row["retry_policy"] == "EXPONENTIAL" and any(value is not None for value in given.values()):
        defaults = dict(zip(("initial", "max", "multiplier"), c.EXPONENTIAL_RETRY_MS, strict=True))
        policy["exponentialRetryPolicy"] = {k: v if v is not None else defaults[k] for k, v in given.items()}
    return policy


# -- what changed --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigCounts:
    """Rows a snapshot appended: offset commits, topic configurations, group settings, and
    whether the schedule progress changed."""

    offsets: int = 0
    topics: int = 0
    groups: int = 0
    delay: bool = False


def write_snapshot(lake: Path, broker_name: str, snapshot: ConfigSnapshot, delay_path: Path) -> ConfigCounts:
    """Append what ``snapshot`` changed against the lake's latest state of ``broker_name``; write
    the schedule progress to ``delay_path`` when it changed. A rerun writes nothing twice."""
    return ConfigCounts(
        _write_offsets(lake, broker_name, snapshot),
        _write_topics(lake, broker_name, snapshot),
        _write_groups(lake, broker_name, snapshot),
        _write_delay(snapshot.delay, delay_path),
    )


def _write_offsets(lake: Path, broker_name: str, snapshot: ConfigSnapshot) -> int:
    wanted = {key: {"offset": offset} for key, offset in snapshot.offsets.items()}
    key = ("group", "topic", "queue_id")
    extra = {"source": "consumer"}
    when = ("commit_timestamp", snapshot.offsets_time)
    return _append_changed(lake, CONSUMER_OFFSET_COMMITS, broker_name, key, wanted, when, extra)


def _write_topics(lake: Path, broker_name: str, snapshot: ConfigSnapshot) -> int:
    wanted = {
        (topic,): {"queue_nums": q, "perm": perm, "message_type": kind}
        for topic, (q, perm, kind) in snapshot.topics.items()
    }
    when = ("updated_timestamp", snapshot.topics_time)
    return _append_changed(lake, TOPIC_CONFIG, broker_name, ("topic",), wanted, when)


def _write_groups(lake: Path, broker_name: str, snapshot: ConfigSnapshot) -> int:
    # a group the file holds exists: one deleted in the lake (deleteSubGroup) is written again
    wanted = {(group,): {**settings, "deleted": False} for group, settings in snapshot.groups.items()}
    when = ("updated_timestamp", snapshot.groups_time)
    return _append_changed(lake, SUBSCRIPTION_GROUP, broker_name, ("group",), wanted, when)


def _append_changed(
    lake: Path,
    spec: TableSpec,
    broker_name: str,
    key: tuple[str, ...],
    wanted: Mapping[tuple[Any, ...], Mapping[str, Any]],
    when: tuple[str, int],
    extra: Mapping[str, Any] | None = None,
) -> int:
    """Append a row for every key of ``wanted`` whose values differ from the broker's latest row of
    that key (by ``when``'s time column), timed ``when``'s file time or 1 ms after that latest row,
    whichever is later; the number of rows appended."""
    if not wanted:
        return 0
    time, file_time = when
    latest = latest_rows(lake, spec, broker_name, key, time)
    changed = []
    for values, settings in sorted(wanted.items()):
        last = latest.get(values)
        if last is not None and all(_same(last[name], value) for name, value in settings.items()):
            continue
        moment = file_time if last is None else max(file_time, last[time] + 1)
        row = {"broker_name": broker_name, **dict(zip(key, values, strict=True)), **settings, **(extra or {})}
        changed.append({**row, time: moment})
    if changed:
        append_rows(lake, spec, pa.Table.from_pylist(changed, schema=spec.arrow_schema))
    return len(changed)


def _same(stored: Any, wanted: Any) -> bool:
    """Whether a stored value is the wanted one; a null flag (a row written before the column
    existed) is false."""
    return bool(stored == wanted or (wanted is False and stored is None))


def latest_rows(
    lake: Path, spec: TableSpec, broker_name: str, key: tuple[str, ...], time: str
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The latest row (greatest ``time``) of each ``key`` among ``broker_name``'s rows of ``spec``."""
    rows = read_table(lake, spec)
    mine = rows.filter(pc.equal(rows["broker_name"], broker_name)).sort_by(time).to_pylist()
    return {tuple(r[k] for k in key): r for r in mine}


def _write_delay(delay: dict[int, int] | None, path: Path) -> bool:
    """Replace the schedule progress file atomically when it differs."""
    if delay is None:
        return False
    content = {"offsetTable": {str(level): offset for level, offset in sorted(delay.items())}}
    try:
        if json.loads(path.read_text(encoding="utf-8")) == content:
            return False
    except (FileNotFoundError, ValueError):
        pass
    write_json_durably(path, content)
    return True


# -- the way back --------------------------------------------------------------------------------


def broker_running(store_dir: Path) -> bool:
    """Whether a RocketMQ broker runs on ``store_dir``: it holds a lock on the first byte of the
    store's ``lock`` file while it runs (``DefaultMessageStore.start``: ``tryLock(0, 1, false)``,
    a POSIX record lock), which the kernel drops when it exits."""
    path = store_dir / "lock"
    if not path.exists():
        return False
    with open(path, "rb+") as handle:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            return True
        fcntl.lockf(handle, fcntl.LOCK_UN, 1, 0)
    return False


def write_store_offsets(store_dir: Path, offsets: Mapping[tuple[str, str, int], int]) -> Path:
    """Set ``(group, topic, queue_id) -> offset`` in the stopped broker's ``config/consumerOffset.json``,
    keeping every other entry and field, and write it as ``MixAll.string2File`` does: the new
    text to ``consumerOffset.json.tmp``, the current file copied to ``consumerOffset.json.bak``,
    then the rename. The file's path.

    Raises:
        ValidationError: a broker runs on the store, or its file is malformed (nothing written).
    """
    if broker_running(store_dir):
        raise ValidationError(
            "--broker-config",
            str(store_dir),
            "belongs to a running broker (it holds the store's lock file)",
            "stop the broker first: it would overwrite the file with its own offsets",
        )
    config_dir = store_dir / "config"
    found = read_config(config_dir, "consumerOffset.json")
    data: dict[str, Any] = found[0] if found is not None else {}
    table = _object(data.setdefault("offsetTable", {}), config_dir / "consumerOffset.json", "offsetTable")
    for (group, topic, queue_id), offset in sorted(offsets.items()):
        queues = _object(table.setdefault(f"{topic}@{group}", {}), config_dir / "consumerOffset.json", "offsetTable")
        queues[str(queue_id)] = offset
    version = data.get("dataVersion")
    if isinstance(version, dict):
        version["counter"] = int(version.get("counter", 0)) + 1
        version["timestamp"] = now_ms()
    path = config_dir / "consumerOffset.json"
    config_dir.mkdir(parents=True, exist_ok=True)
    temp, backup = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".bak")
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent="\t")
        handle.flush()
        os.fsync(handle.fileno())
    if path.exists():
        shutil.copyfile(path, backup)
    os.replace(temp, path)
    return path
