"""A table's Delta log read commit by commit: where each commit file is, the actions it holds, what
it did to the table's data, and the table's newest version.

Every reader of the Delta log in the product reads it through this module: the broker's message
store and offset ledger follow it (:class:`CommitTail`), the append path skips the versions other
writers took, ``ingest-store`` looks for its own commits in it, and the Spark side's snapshots and
incremental reads (``jobs.lake``) are built on it. The Delta protocol numbers commits without
gaps, one JSON file a version, named by the version in 20 digits.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

LOG_DIR = "_delta_log"  # the Delta protocol's name for a table's log directory
LAST_CHECKPOINT = "_last_checkpoint"  # the log's pointer to its newest checkpoint
# what delta-rs says of a listing of the log that holds a commit but not the one before it
LISTING_GAP = "Expected contiguous commit files"
LISTING_ATTEMPTS = 5
_T = TypeVar("_T")


def log_dir(table_dir: str | Path) -> Path:
    """The Delta log directory of the table in ``table_dir``."""
    return Path(table_dir) / LOG_DIR


def commit_path(table_dir: str | Path, version: int) -> Path:
    """The commit file of ``version`` of the table in ``table_dir`` (it may not exist)."""
    return Path(table_dir) / LOG_DIR / f"{version:020d}.json"


def read_actions(table_dir: str | Path, version: int) -> list[dict[str, Any]] | None:
    """The actions of commit ``version`` in file order, one dict each; None when the commit file
    is absent (not written yet, or removed by a log cleanup)."""
    try:
        text = commit_path(table_dir, version).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def latest_version(table_dir: str | Path) -> int:
    """The newest version of the Delta table in ``table_dir`` (-1 when it has no log yet): its newest
    commit or checkpoint file, from one listing of the log directory."""
    try:
        names = os.listdir(log_dir(table_dir))
    except (FileNotFoundError, NotADirectoryError):
        return -1
    # 20-digit versions: the greatest name is the greatest version
    commits = [n[:20] for n in names if n.endswith(".json") and n[:20].isdigit()]
    checkpoints = [n[:20] for n in names if ".checkpoint" in n and n.endswith(".parquet") and n[:20].isdigit()]
    return int(max(commits + checkpoints, default="-1"))


def load_table(table_dir: str | Path, version: int | None = None) -> DeltaTable:
    """delta-rs's snapshot of the table in the local directory ``table_dir`` at ``version`` (None:
    the newest version one listing of its log shows).

    The newest version is pinned before delta-rs lists the log itself: a listing taken while another
    process commits can miss a commit file and hold the next one (a directory listing is no
    snapshot of the directory), and delta-rs refuses a log with a gap. Every commit up to the newest
    one a listing shows was written before delta-rs lists again, so the pinned load sees them all.

    Raises:
        deltalake.exceptions.TableNotFoundError: no Delta table in ``table_dir``.
    """
    if version is None:
        newest = latest_version(table_dir)
        version = newest if newest >= 0 else None
    return DeltaTable(str(table_dir), version=version)


def retry_listing_gap(action: Callable[[], _T], attempts: int = LISTING_ATTEMPTS) -> _T:
    """``action()``, a delta-rs load or commit, run again when delta-rs refused a listing of the log
    with a gap (:func:`load_table` says why a listing can show one while another process commits).

    delta-rs lists the log unpinned where a caller cannot pin it: loading a table by path, and
    finding the newest version after another writer took the one a commit wanted. Both come
    before the commit file is written, so a refused ``action`` committed nothing and may run again.
    """
    attempt = 1
    while True:
        try:
            return action()
        except DeltaError as error:
            if LISTING_GAP not in str(error) or attempt >= attempts:
                raise
        time.sleep(0.01 * attempt)
        attempt += 1


def last_checkpoint_version(table_dir: str | Path) -> int | None:
    """The version ``_last_checkpoint`` names (None when the log has no readable one)."""
    try:
        last = json.loads((log_dir(table_dir) / LAST_CHECKPOINT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = last.get("version") if isinstance(last, dict) else None
    return version if isinstance(version, int) else None


def checkpointed_after(table_dir: str | Path, version: int) -> bool:
    """Whether the log's last checkpoint is of a version after ``version``: then later commits
    were made even when a log cleanup removed their commit files after checkpointing them."""
    last = last_checkpoint_version(table_dir)
    return last is not None and last > version


def has_later_commit(table_dir: str | Path, version: int) -> bool:
    """Whether commits after ``version`` were made: commit ``version + 1``'s file is there, or the
    last checkpoint is of a later version (:func:`checkpointed_after`). Two small reads however long
    the log; only a log without ``_last_checkpoint`` is listed."""
    if commit_path(table_dir, version + 1).is_file() or checkpointed_after(table_dir, version):
        return True
    if (log_dir(table_dir) / LAST_CHECKPOINT).is_file():
        return False
    names = (p.name for p in log_dir(table_dir).glob("*.json"))
    return any(n[:20].isdigit() and int(n[:20]) > version for n in names)


@dataclass(frozen=True)
class FileAction:
    """One ``add`` or ``remove`` action of a commit.

    Attributes:
        log_path: the file's path as the log writes it (relative to the table and URL-encoded, or a URI).
        partition_values: the Delta partition value strings (None for null); empty on a remove
            that does not repeat them.
        size: bytes (0 when the action does not say).
        data_change: the action's ``dataChange``: False when it moves rows without changing them
            (a compaction), True by default.
        stats: the action's ``stats`` JSON text (None when it has none).
    """

    log_path: str
    partition_values: dict[str, str | None]
    size: int
    data_change: bool
    stats: str | None = None

    @property
    def path(self) -> str:
        """The path relative to the table, decoded."""
        return unquote(self.log_path)


@dataclass(frozen=True)
class CommitChange:
    """What one commit did to a table's data.

    Attributes:
        version: the commit's version.
        added: files added with new rows (``dataChange`` adds).
        rewritten: files a rewrite added (``dataChange=false`` adds: rows already in the table).
        removed: every file removed.
        data_removed: whether a removal took rows away (a ``dataChange`` remove).
        metadata_changed: whether the commit holds a ``metaData`` action (a new schema or a
            replaced table).
        protocol_changed: whether the commit holds a ``protocol`` action.
        app_transactions: the ``txn`` actions, application id to version.
        info: the ``commitInfo`` action, empty when the commit has none.
    """

    version: int
    added: list[FileAction] = field(default_factory=list)
    rewritten: list[FileAction] = field(default_factory=list)
    removed: list[FileAction] = field(default_factory=list)
    data_removed: bool = False
    metadata_changed: bool = False
    protocol_changed: bool = False
    app_transactions: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def data_neutral(self) -> bool:
        """Whether the table holds the same rows, schema and protocol after the commit as before:
        no file added or removed with ``dataChange``, no metadata or protocol action."""
        return not (self.added or self.data_removed or self.metadata_changed or self.protocol_changed)

    @property
    def starts_over(self) -> bool:
        """Whether a reader following the table must read it whole again: rows were removed, or
        the metadata was replaced."""
        return self.data_removed or self.metadata_changed


def commit_change(version: int, actions: list[dict[str, Any]]) -> CommitChange:
    """The :class:`CommitChange` of commit ``version`` holding ``actions`` (:func:`read_actions`)."""
    added: list[FileAction] = []
    rewritten: list[FileAction] = []
    removed: list[FileAction] = []
    transactions: dict[str, int] = {}
    info: dict[str, Any] = {}
    for action in actions:
        if "add" in action:
            file = _file_action(action["add"])
            (added if file.data_change else rewritten).append(file)
        elif "remove" in action:
            removed.append(_file_action(action["remove"]))
        elif "txn" in action:
            transactions[action["txn"]["appId"]] = int(action["txn"]["version"])
        elif "commitInfo" in action:
            info.update(action["commitInfo"])
    return CommitChange(
        version,
        added,
        rewritten,
        removed,
        data_removed=any(file.data_change for file in removed),
        metadata_changed=any("metaData" in action for action in actions),
        protocol_changed=any("protocol" in action for action in actions),
        app_transactions=transactions,
        info=info,
    )


def read_change(table_dir: str | Path, version: int) -> CommitChange | None:
    """The :class:`CommitChange` of commit ``version``, None when its file is absent."""
    actions = read_actions(table_dir, version)
    return None if actions is None else commit_change(version, actions)


CommitMark = tuple[int, int, int, int, bytes]
"""What identifies a commit file: its device, inode, size, change time and first bytes."""

# bytes of a commit file compared besides its identity: its first line, the commit info with its
# time, without reading a compaction's megabytes of remove and add actions on every call
_MARK_BYTES = 4096


def commit_mark(table_dir: str | Path, version: int) -> CommitMark | None:
    """The :data:`CommitMark` of commit ``version`` of a table; None when the file is gone (log
    cleanup) or unreadable. A table removed and written again in the same directory has other
    marks (another file, and its first commit holds another table id)."""
    try:
        with open(commit_path(table_dir, version), "rb") as handle:
            status = os.fstat(handle.fileno())
            return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, handle.read(_MARK_BYTES)
    except OSError:
        return None


# What read_changes keeps parsed, the least recently read dropped first, counted in file actions (a
# commit counts one more): about 1.8 KB for a commit of one file, 0.7 KB more per file. A day of
# offset flushes of a few brokers, which every incremental job of a nightly reads again, counts 2
# per flush.
CACHED_ACTIONS = 50_000


class _ParsedCommits:
    """Parsed commits of the tables this process read, per table directory, with the mark of the
    table's first commit file as it was when they were parsed (:func:`commit_mark`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # the weight of what is kept (_weight)
        self.lock = threading.Lock()
        self.changes: OrderedDict[tuple[str, int], CommitChange] = OrderedDict()
        self.origins: dict[str, CommitMark] = {}

    def table(self, table_dir: str) -> bool:
        """Whether commits of ``table_dir`` may be kept and reused: its first commit file is there
        (what was kept of another table in the same directory is dropped)."""
        origin = commit_mark(table_dir, 0)
        if origin is None:
            return False
        with self.lock:
            if self.origins.get(table_dir) != origin:
                for key in [k for k in self.changes if k[0] == table_dir]:
                    self.held -= _weight(self.changes.pop(key))
                self.origins[table_dir] = origin
        return True

    def get(self, table_dir: str, version: int) -> CommitChange | None:
        with self.lock:
            change = self.changes.get((table_dir, version))
            if change is not None:
                self.changes.move_to_end((table_dir, version))
            return change

    def put(self, table_dir: str, change: CommitChange) -> None:
        with self.lock:
            replaced = self.changes.pop((table_dir, change.version), None)
            self.held -= _weight(replaced) if replaced is not None else 0
            self.changes[(table_dir, change.version)] = change
            self.held += _weight(change)
            while self.held > self.limit and self.changes:
                self.held -= _weight(self.changes.popitem(last=False)[1])


def _weight(change: CommitChange) -> int:
    return 1 + len(change.added) + len(change.rewritten) + len(change.removed)


_parsed = _ParsedCommits(CACHED_ACTIONS)


def read_changes(table_dir: str | Path, after_version: int, last_version: int) -> Iterator[CommitChange | None]:
    """The :class:`CommitChange` of each commit ``after_version + 1 .. last_version``, oldest first,
    None for a commit whose file is absent.

    A commit this process parsed before is not parsed again, within :data:`CACHED_ACTIONS` (the jobs
    of one nightly read the same thousands of offset flushes): a Delta commit file never changes
    once written. The table is known to be the same one by the :func:`commit_mark` of its first
    commit file, the mark the jobs check their table snapshots by (a table removed and written again
    in the same directory has another file, holding another table id); when that file is absent (a
    log cleanup), every commit is parsed. A commit whose file a log cleanup removed is absent,
    parsed before or not (one listing of the log, made once a parsed commit is found, tells).
    """
    directory = os.path.abspath(table_dir)
    reuse = _parsed.table(directory)
    listed: set[str] | None = None  # the log's files, listed at the first commit found parsed
    for version in range(after_version + 1, last_version + 1):
        change = _parsed.get(directory, version) if reuse else None
        if change is not None:
            # a commit parsed before but since removed (log cleanup) is absent, as its file is
            listed = set(os.listdir(log_dir(directory))) if listed is None else listed
            if f"{version:020d}.json" not in listed:
                yield None
                continue
        else:
            change = read_change(directory, version)
            if change is not None and reuse:
                _parsed.put(directory, change)
        yield change


def _file_action(action: dict[str, Any]) -> FileAction:
    return FileAction(
        action["path"],
        dict(action.get("partitionValues") or {}),
        int(action.get("size") or 0),
        bool(action.get("dataChange", True)),
        action.get("stats"),
    )


class CommitTail:
    """Follows a table's Delta log from a version on, reading each new commit file.

    Cheap when nothing is new (one ``open`` of the next commit's name).
    """

    def __init__(self, table_dir: str | Path, after_version: int) -> None:
        self.table_dir = Path(table_dir)
        self.version = after_version

    def poll(self) -> list[CommitChange] | None:
        """The changes of the commits after :attr:`version`, oldest first, advancing it.

        Returns None when a commit needed is gone (log cleanup): the caller must read the table whole.
        """
        changes: list[CommitChange] = []
        while True:
            change = read_change(self.table_dir, self.version + 1)
            if change is None:
                if changes or not has_later_commit(self.table_dir, self.version + 1):
                    return changes
                # a later commit is there: this one was written since the open above, or is gone
                change = read_change(self.table_dir, self.version + 1)
                if change is None:
                    return None
            self.version += 1
            changes.append(change)
