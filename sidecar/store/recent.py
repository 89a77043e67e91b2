"""What became of ids that are no longer pending: a bounded, in-memory, per-partition memory.

``status`` (``delay-sidecar status``, ``GET /ids/<id>``) answers from the store for a pending id
(id index, docs/design.md 3.3). Once a record is delivered, cancelled or dead-lettered its index
entry is gone, so this memory keeps the last outcomes, id -> (state, time), for an answer such as
"delivered at T" instead of "unknown".

Two generations of plain dicts: an outcome goes into ``cur``; when ``cur`` holds ``capacity / 2``
entries it becomes ``old`` (the previous ``old`` is dropped whole) and a new ``cur`` starts. A
look-up reads ``cur`` then ``old``. So at most ``capacity`` entries are held and at least the
last ``capacity / 2`` outcomes are known, with no per-entry eviction (an insertion-ordered dict
popped from the front degrades; an ``OrderedDict`` costs twice as much per insert). The value is
one int, ``at_ms << 2 | state``: no tuple per entry. The id's bytes are the record's own.

Deliveries, the hot path, are not put into the dicts as they happen: a dict store of a fresh id
(its hash computed, the table grown, the old generation freed) measured ~300 ns per record, about
as much as the rest of a delivery's Python work. ``note_settled`` keeps the batch's ids as one
list (~40 ns per record) and the dicts take them in only when a look-up comes (``_fold``), so
deliveries nobody asks about cost the list and nothing more. Unfolded batches are bounded too:
past ``capacity`` ids the oldest batches are dropped and the dicts with them (they are older
still). A look-up after a long quiet stretch folds up to ``capacity`` ids first (~25 ms at
100,000), once.

Nothing here is durable: after a restart or a handover only pending ids (and pre-cancels) are
known again; outcomes from before are "unknown".
"""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime
from typing import Any

DELIVERED, CANCELLED, DEAD_LETTERED = 1, 2, 3
STATES = {DELIVERED: "delivered", CANCELLED: "cancelled", DEAD_LETTERED: "dead-lettered"}


class RecentOutcomes:
    __slots__ = ("_batches", "_half", "_unfolded", "capacity", "cur", "old")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity {capacity} is negative")
        self.capacity = capacity
        self._half = (capacity + 1) // 2  # 0: remembers nothing
        self.cur: dict[bytes, int] = {}
        self.old: dict[bytes, int] = {}
        # delivered batches not folded into the dicts yet: (at_ms, ids; a dead letter's id as a 1-tuple)
        self._batches: deque[tuple[int, list[Any]]] = deque()
        self._unfolded = 0

    def note(self, rid: bytes, state: int, at_ms: int) -> None:
        """``rid`` stopped being pending at ``at_ms`` with ``state`` (DELIVERED, CANCELLED,
        DEAD_LETTERED)."""
        if self._half:
            if self._batches:
                self._fold()  # outcomes go in in the order they happened
            self._put(rid, at_ms << 2 | state)

    def note_settled(self, acked: list[tuple[int, Any]], at_ms: int, dead: int) -> None:
        """A batch of delivery reports (``PartitionStore.settle``'s ``(ref, Record)`` pairs): each
        record is delivered, or dead-lettered when it is a dead letter (``rtype == dead``)."""
        if self._half and acked:
            self.note_delivered([rec.id if rec.rtype != dead else (rec.id,) for _ref, rec in acked], at_ms)

    def note_delivered(self, ids: list[Any], at_ms: int) -> None:
        """A batch of ids delivered at ``at_ms`` (a dead letter's as a 1-tuple: dead-lettered);
        records published from the intake come as their ids (engine/direct.py: no Record)."""
        if not self._half or not ids:
            return
        self._batches.append((at_ms, ids))
        self._unfolded += len(ids)
        if self._unfolded > self.capacity:
            while len(self._batches) > 1 and self._unfolded - len(self._batches[0][1]) >= self._half:
                self._unfolded -= len(self._batches.popleft()[1])
            self.cur, self.old = {}, {}  # older than what was just dropped

    def _put(self, rid: bytes, v: int) -> None:
        cur = self.cur
        cur[rid] = v
        if len(cur) >= self._half:
            self.old, self.cur = cur, {}

    def _fold(self) -> None:
        batches, self._batches, self._unfolded = self._batches, deque(), 0
        half = self._half
        cur = self.cur
        for at_ms, ids in batches:
            delivered, dead_lettered = at_ms << 2 | DELIVERED, at_ms << 2 | DEAD_LETTERED
            for rid in ids:
                if type(rid) is tuple:
                    cur[rid[0]] = dead_lettered
                else:
                    cur[rid] = delivered
                if len(cur) >= half:
                    self.old, cur = cur, {}
                    self.cur = cur

    def get(self, rid: bytes) -> tuple[str, int] | None:
        """(state name, time in epoch ms) of ``rid``'s last remembered outcome, or None."""
        if self._batches:
            self._fold()
        v = self.cur.get(rid)
        if v is None:
            v = self.old.get(rid)
            if v is None:
                return None
        return STATES[v & 3], v >> 2

    def __len__(self) -> int:
        return len(self.cur) + len(self.old) + self._unfolded


def iso_ms(ms: int) -> str:
    """Epoch ms as ISO-8601 UTC with milliseconds (``2026-01-01T12:00:00.000Z``)."""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return str(ms)
