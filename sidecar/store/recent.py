"""What became of ids that are no longer pending: a bounded, in-memory, per-partition memory.

``status`` (``delay-sidecar status``, ``GET /ids/<id>``) answers from the store for a pending id
(id index, docs/design.md 3.3). Once a record is delivered, cancelled or dead-lettered its index
entry is gone, so this memory keeps the last outcomes, id -> (state, time), for an answer such as
"delivered at T" instead of "unknown".

Two generations of plain dicts: a note goes into ``cur``; when ``cur`` holds ``capacity / 2``
entries it becomes ``old`` (the previous ``old`` is dropped whole) and a new ``cur`` starts. A
look-up reads ``cur`` then ``old``. So at most ``capacity`` entries are held, at least the last
``capacity / 2`` outcomes are known, and a note costs one dict store (no per-entry eviction: an
insertion-ordered dict popped from the front degrades, an ``OrderedDict`` costs twice as much per
insert). The value is one int, ``at_ms << 2 | state``: no tuple per entry. The id's bytes are the
record's own (no copy). About 120 bytes of heap per entry (dict slot, int, the id).

Nothing here is durable: after a restart or a handover only pending ids (and pre-cancels) are
known again; outcomes from before are "unknown".
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

DELIVERED, CANCELLED, DEAD_LETTERED = 1, 2, 3
STATES = {DELIVERED: "delivered", CANCELLED: "cancelled", DEAD_LETTERED: "dead-lettered"}


class RecentOutcomes:
    __slots__ = ("_half", "capacity", "cur", "old")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity {capacity} is negative")
        self.capacity = capacity
        self._half = (capacity + 1) // 2  # 0: remembers nothing
        self.cur: dict[bytes, int] = {}
        self.old: dict[bytes, int] = {}

    def note(self, rid: bytes, state: int, at_ms: int) -> None:
        """``rid`` stopped being pending at ``at_ms`` with ``state`` (DELIVERED, CANCELLED,
        DEAD_LETTERED)."""
        if self._half:
            cur = self.cur
            cur[rid] = at_ms << 2 | state
            if len(cur) >= self._half:
                self.old, self.cur = cur, {}

    def note_settled(self, acked: Iterable[tuple[int, Any]], at_ms: int, dead: int) -> None:
        """A batch of delivery reports (``PartitionStore.settle``'s ``(ref, Record)`` pairs): each
        record is delivered, or dead-lettered when it is a dead letter (``rtype == dead``)."""
        half = self._half
        if not half:
            return
        cur = self.cur
        delivered, dead_lettered = at_ms << 2 | DELIVERED, at_ms << 2 | DEAD_LETTERED
        for _ref, rec in acked:
            cur[rec.id] = dead_lettered if rec.rtype == dead else delivered
            if len(cur) >= half:
                self.old, cur = cur, {}
                self.cur = cur

    def get(self, rid: bytes) -> tuple[str, int] | None:
        """(state name, time in epoch ms) of ``rid``'s last remembered outcome, or None."""
        v = self.cur.get(rid)
        if v is None:
            v = self.old.get(rid)
            if v is None:
                return None
        return STATES[v & 3], v >> 2

    def __len__(self) -> int:
        return len(self.cur) + len(self.old)


def iso_ms(ms: int) -> str:
    """Epoch ms as ISO-8601 UTC with milliseconds (``2026-01-01T12:00:00.000Z``)."""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return str(ms)
