"""The delay-level scheduler (RocketMQ 4.x ``ScheduleMessageService``, seeds 000, 001, 003).

One append-only queue per level (plus level 0, "due now"). Within a level every record waits the
same delay, so arrival order is due order and the scanner of a level only ever looks at its head:
insert O(1), dequeue O(1), no sorting, no per-record objects in memory.

Each level keeps three cursors over its entry indexes::

    done <= send <= write
    [ done .. send )   handed to the publisher, waiting for a terminal ack
    [ send .. write )  waiting for their due time

``due(now)`` walks each level from ``send`` while the head is due. ``ack`` marks an entry
delivered; ``done`` advances over the contiguous prefix of finished entries (faust's contiguous
offset commit: acks arrive out of order, the checkpoint only ever moves over a gap-free prefix),
releasing each record's commit-log slot as it passes. Only ``done`` and ``write`` are
checkpointed: after a crash everything in ``[done, write)`` is handed out again, except entries
whose state byte already says delivered or cancelled, so duplicates are limited to records that
were in flight.

Recovery validates the restored entries against the commit log (``validate``): every entry in
``[done, write)`` of the checkpoint — bounded by what was pending, never history — must point
below the checkpointed log head, into a segment that exists, at a record whose CRC verifies and
whose due time and level match. A dangling entry (disk damage; with ``fsync: none`` a power loss
that kept a queue page but not the log page behind it) is marked DROPPED and reported instead of
crashing the partition on first read. Its log slot is not released (see ``LevelQueue.drop``).

Producer timestamps are not globally ordered, so a later entry in a level can carry an earlier
due time than its head; it is then delivered when the head is due — late, never early (RocketMQ
has the same property and uses the store time to minimise it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sidecar.levels import table
from sidecar.levels.queue import CANCELLED, DELIVERED, NO_POS, PENDING, LevelQueue
from sidecar.store import codec
from sidecar.store.codec import Record
from sidecar.store.log import CommitLog
from sidecar.store.mapped import StoreError

_IDX_BITS = 48
_IDX_MASK = (1 << _IDX_BITS) - 1


class _Level:
    __slots__ = ("acked", "done", "queue", "restored", "send", "write")

    def __init__(self, queue: LevelQueue) -> None:
        self.queue = queue
        self.write = 0
        self.send = 0
        self.done = 0
        self.restored = 0  # ``write`` as restored from the checkpoint: [done, restored) is validated
        self.acked: set[int] = set()  # acked indexes above done: bounded by what is in flight


class LevelsScheduler:
    name = "levels"

    def __init__(
        self, directory: Path, log: CommitLog, levels_ms: tuple[int, ...], entries_per_file: int = 65536
    ) -> None:
        self.log = log
        self.levels_ms = levels_ms
        self.dir = directory / "levels"
        self.levels = [_Level(LevelQueue(self.dir / f"{i:02d}", entries_per_file)) for i in range(len(levels_ms) + 1)]

    # -- planning -------------------------------------------------------------------------------
    def plan(self, mode: str, level: int, requested_due_ms: int, enqueue_ms: int) -> tuple[int, int] | None:
        return table.plan(self.levels_ms, mode, level, requested_due_ms, enqueue_ms)

    # -- intake ---------------------------------------------------------------------------------
    def add(self, due_ms: int, level: int, log_pos: int) -> int:
        lv = self.levels[level]
        idx = lv.write
        lv.queue.write(idx, log_pos, due_ms)
        lv.write = idx + 1
        return (level << _IDX_BITS) | idx

    # -- dequeue --------------------------------------------------------------------------------
    def due(self, now_ms: int, limit: int) -> list[tuple[int, Record]]:
        out: list[tuple[int, Record]] = []
        heads = []
        for n, lv in enumerate(self.levels):
            if lv.send < lv.write:
                heads.append((lv.queue.due_of(lv.send), n))
        heads.sort()
        for head_due, n in heads:
            if head_due > now_ms or len(out) >= limit:
                break
            lv = self.levels[n]
            q = lv.queue
            while lv.send < lv.write and len(out) < limit:
                idx = lv.send
                pos, due, state = q.read(idx)
                if due > now_ms and state == PENDING:
                    break
                lv.send = idx + 1
                ref = (n << _IDX_BITS) | idx
                if state != PENDING:  # cancelled, or delivered before a restart
                    self._finish(lv, idx)
                    continue
                out.append((ref, self.log.read(pos)))
        return out

    def ack(self, ref: int) -> None:
        lv = self.levels[ref >> _IDX_BITS]
        idx = ref & _IDX_MASK
        if idx < lv.done or idx >= lv.send:
            return
        lv.queue.set_state(idx, DELIVERED)
        self._finish(lv, idx)

    def _finish(self, lv: _Level, idx: int) -> None:
        if idx != lv.done:
            lv.acked.add(idx)
            return
        q = lv.queue
        while True:
            pos, _due, _state = q.read(lv.done)
            if pos != NO_POS:
                self.log.release(pos)
            lv.done += 1
            if lv.done not in lv.acked:
                break
            lv.acked.discard(lv.done)

    def cancel(self, ref: int) -> bool:
        lv = self.levels[ref >> _IDX_BITS]
        idx = ref & _IDX_MASK
        if idx < lv.send or idx >= lv.write:
            return False
        if lv.queue.read(idx)[2] != PENDING:
            return False
        lv.queue.set_state(idx, CANCELLED)
        return True

    def record(self, ref: int) -> Record | None:
        n = ref >> _IDX_BITS
        if n >= len(self.levels):
            return None
        lv = self.levels[n]
        idx = ref & _IDX_MASK
        if idx < lv.done or idx >= lv.write:
            return None
        pos, _due, state = lv.queue.read(idx)
        if state != PENDING:
            return None
        return self.log.read(pos)

    def next_due_ms(self) -> int | None:
        best: int | None = None
        for lv in self.levels:
            if lv.send < lv.write:
                d = lv.queue.due_of(lv.send)
                if best is None or d < best:
                    best = d
        return best

    # -- durability -----------------------------------------------------------------------------
    def flush(self) -> None:
        for lv in self.levels:
            lv.queue.flush()

    def trim(self) -> None:
        for lv in self.levels:
            lv.queue.trim()

    def state(self) -> dict[str, Any]:
        return {"levels": [[lv.done, lv.write] for lv in self.levels], "table": list(self.levels_ms)}

    def restore(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        if list(state.get("table", [])) != list(self.levels_ms):
            from sidecar.store.mapped import GeometryMismatch

            raise GeometryMismatch(
                f"the store was written with levels {state.get('table')} but the configured table is "
                f"{list(self.levels_ms)}; pending records would change level. Drain it first or keep the table"
            )
        for lv, (done, write) in zip(self.levels, state["levels"], strict=True):
            lv.done = lv.send = int(done)
            lv.write = lv.restored = int(write)
            lv.acked.clear()

    def validate(self, head: int) -> list[tuple[int, int, str]]:
        """Check the entries restored from the checkpoint against the log (see the module
        docstring); ``head`` is the checkpointed log head. Returns the dropped ones as
        ``(ref, log_pos, reason)``. A missing queue file inside ``[done, write)`` is not a dangling
        entry but a lost queue: that raises ``StoreError``."""
        dropped: list[tuple[int, int, str]] = []
        for n, lv in enumerate(self.levels):
            q = lv.queue
            bad: list[tuple[int, int, str]] = []
            try:
                for idx, pos, due, state in q.scan(lv.done, lv.restored):
                    if state != PENDING:
                        continue
                    if pos >= head:
                        bad.append((idx, pos, f"position {pos} is at or beyond the log head {head}"))
                        continue
                    try:
                        rtype, rdue, rlevel = self.log.check(pos)
                    except (codec.CorruptRecord, StoreError) as e:
                        bad.append((idx, pos, f"record does not verify: {e}"))
                        continue
                    if rdue != due or rlevel != n or rtype == codec.CANCEL:
                        bad.append((idx, pos, f"record at {pos} (type {rtype}, level {rlevel}, due {rdue}) "
                                              f"does not match the entry (level {n}, due {due})"))
            except KeyError:
                raise StoreError(f"{q.dir}: a queue file holding pending entries is missing") from None
            for idx, pos, reason in bad:
                q.drop(idx)
                dropped.append(((n << _IDX_BITS) | idx, pos, reason))
        return dropped

    def reclaim(self) -> None:
        for lv in self.levels:
            lv.queue.drop_before(lv.done)

    def pending(self) -> dict[str, int]:
        return {f"level-{n}": lv.write - lv.done for n, lv in enumerate(self.levels) if lv.write > lv.done}

    def disk_bytes(self) -> int:
        return sum(lv.queue.disk_bytes() for lv in self.levels)

    def close(self) -> None:
        for lv in self.levels:
            lv.queue.close()
