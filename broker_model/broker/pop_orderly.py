"""FIFO (orderly) POP as RocketMQ 5 does it (docs/pop.md, "FIFO (orderly) pop and consumerOrderInfo"):
a FIFO group's pop writes no checkpoint; each queue keeps its last batch, and the queue is blocked,
so that no later message of it is delivered, while a message of that batch is unacked and still
invisible. An ack moves the group's offset to the batch's first unacked message (past the batch
once all are acked); a message not acked in time is popped again from the same queue, its consume
count one more. The batches are kept as RocketMQ's ``consumerOrderInfo.json`` keeps them, in
``<lake>/_config/<broker>/consumerOrderInfo.json``, written durably on every pop, ack and change,
so that a restarted broker neither delivers an acked message again nor skips an unacked one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_model.common.durable import read_progress, write_json_durably


def order_info_path(lake: str | Path, broker_name: str) -> Path:
    """Where a broker's FIFO batches live."""
    return Path(lake) / "_config" / broker_name / "consumerOrderInfo.json"


@dataclass
class OrderInfo:
    """One queue's last batch for one group (``OrderInfo``): when it was popped and for how long,
    its offsets, each one's consume count and next visible time when changed, which are acked,
    and the attempt id of the receive that popped it."""

    pop_time: int
    invisible_time: int
    offsets: list[int]
    counts: dict[int, int] = field(default_factory=dict)
    next_visible: dict[int, int] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    attempt_id: str | None = None

    def visible_at(self, offset: int) -> int:
        """When the message at ``offset`` may be popped again unless acked."""
        return self.next_visible.get(offset, self.pop_time + self.invisible_time)

    def blocks(self, now: int, attempt_id: str | None) -> bool:
        """``checkBlock``: an unacked message of the batch is still invisible; a receive repeated
        with the batch's attempt id is never blocked (it gets the same batch again)."""
        if attempt_id is not None and attempt_id == self.attempt_id:
            return False
        return any(o not in self.acked and now < self.visible_at(o) for o in self.offsets)

    def committed(self) -> int:
        """``commitAndNext``: the first unacked offset of the batch, else the one after its last."""
        unacked = [o for o in self.offsets if o not in self.acked]
        return min(unacked) if unacked else max(self.offsets) + 1

    def to_json(self) -> dict[str, Any]:
        """RocketMQ's keys: ``popTime``, ``i``, ``o`` (the first offset, then differences from it),
        ``oc`` and ``ot`` (by offset), ``cm`` (the acked offsets' bits, by place in the batch), ``a``."""
        first = self.offsets[0]
        bits = sum(1 << i for i, o in enumerate(self.offsets) if o in self.acked)
        return {
            "popTime": self.pop_time,
            "i": self.invisible_time,
            "o": [first, *(o - first for o in self.offsets[1:])],
            "oc": {str(o): n for o, n in self.counts.items()},
            "ot": {str(o): t for o, t in self.next_visible.items()},
            "cm": bits,
            "a": self.attempt_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OrderInfo:
        raw = [int(o) for o in data["o"]]
        offsets = [raw[0], *(raw[0] + d for d in raw[1:])]
        bits = int(data.get("cm", 0))
        return cls(
            pop_time=int(data["popTime"]),
            invisible_time=int(data["i"]),
            offsets=offsets,
            counts={int(o): int(n) for o, n in data.get("oc", {}).items()},
            next_visible={int(o): int(t) for o, t in data.get("ot", {}).items()},
            acked={o for i, o in enumerate(offsets) if bits >> i & 1},
            attempt_id=data.get("a"),
        )


class OrderInfoTable:
    """Every FIFO batch of one broker, by ``topic@group`` and queue id, kept durably."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()  # callers hold it across a read, a change and save
        self._table: dict[str, dict[int, OrderInfo]] = {}

        def parse(data: dict[str, Any]) -> dict[str, dict[int, OrderInfo]]:
            return {
                key: {int(q): OrderInfo.from_json(info) for q, info in queues.items()}
                for key, queues in data.get("table", {}).items()
            }

        read = read_progress(path, "FIFO batch", "to deliver the FIFO groups' unacked batches again", parse)
        if read is not None:
            self._table = read

    def get(self, topic: str, group: str, queue_id: int) -> OrderInfo | None:
        return self._table.get(f"{topic}@{group}", {}).get(queue_id)

    def put(self, topic: str, group: str, queue_id: int, info: OrderInfo) -> None:
        self._table.setdefault(f"{topic}@{group}", {})[queue_id] = info

    def items(self) -> list[tuple[str, str, int, OrderInfo]]:
        """(topic, group, queue id, batch) of every batch kept."""
        found = []
        for key, queues in self._table.items():
            topic, group = key.split("@", 1)
            found += [(topic, group, queue_id, info) for queue_id, info in queues.items()]
        return found

    def save(self) -> None:
        """Replace the file atomically and durably (caller holds :attr:`lock`)."""
        table = {key: {str(q): info.to_json() for q, info in queues.items()} for key, queues in self._table.items()}
        write_json_durably(self.path, {"table": table})
