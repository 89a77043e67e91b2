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
releasing each record's commit-log slot as it passes. An entry in ``[done, send)`` is finished
exactly when its state byte is no longer PENDING (delivered, cancelled before it was due,
dropped), so the state bytes are the record of out-of-order acks and no set of them is kept. The
per-entry loops — the walk of ``due`` over one queue file, decoding each due record, and the
batch ack with the done cursor's advance — run in C (``sidecar._native.lv_due``, ``lv_ack``) or
in their Python twins in ``sidecar.levels.queue``; restored entries (below) and records that do
not decode are left to the Python code here. Only ``done`` and ``write`` are
checkpointed: after a crash everything in ``[done, write)`` is handed out again, except entries
whose state byte already says delivered or cancelled, so duplicates are limited to records that
were in flight.

Recovery does not read the log behind the restored entries (that would be O(pending) at every
start). The durability order is data -> index -> checkpoint: every entry in ``[done, write)`` of
the checkpoint points at a record that was msynced before the checkpoint was written, so it can
only dangle if the disk is damaged (or, with ``fsync: none``, after a power loss); entries written
after the checkpoint are rewritten by the log replay. ``arm(head, report)`` makes the cheap
structural checks at open — the queue files holding restored entries exist, and no restored entry
points at or beyond the checkpointed log head (positions grow with the index within a level, so
that is a binary search) — and arms the full check, which runs on the *first read* of each
restored entry, in ``due`` (before it is handed out) and in ``record``: below the checkpointed
head, in a segment that exists, CRC intact, same due time and level, not a cancel. A dangling
entry is marked DROPPED, passed over (never handed out) and reported through ``report`` instead of
crashing the partition. Its log slot is not released (see ``LevelQueue.drop``).

Producer timestamps are not globally ordered, so a later entry in a level can carry an earlier
due time than its head; it is then delivered when the head is due — late, never early (RocketMQ
has the same property and uses the store time to minimise it).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.levels import table
from sidecar.levels.queue import (
    BLOCKED,
    CALLER,
    CANCELLED,
    DELIVERED,
    IDX_BITS,
    IDX_MASK,
    PENDING,
    LevelQueue,
    lv_ack,
    lv_advance,
    lv_due,
)
from sidecar.store import native_args
from sidecar.store.codec import NATIVE, Record
from sidecar.store.codec import native as _native
from sidecar.store.intake_layout import LEVEL_STRIDE, Level, Levels, level_at, levels_state
from sidecar.store.log import CommitLog
from sidecar.store.mapped import HEADER_SIZE, StoreError
from sidecar.store.native_args import LvDue

_IDX_BITS = IDX_BITS
_IDX_MASK = IDX_MASK


class _Level:
    __slots__ = ("done", "queue", "restored", "send", "write")

    def __init__(self, queue: LevelQueue) -> None:
        self.queue = queue
        self.write = 0
        self.send = 0
        self.done = 0
        self.restored = 0  # ``write`` as restored from the checkpoint: [done, restored) is checked on first read


class LevelsScheduler:
    name = "levels"

    def __init__(
        self, directory: Path, log: CommitLog, levels_ms: tuple[int, ...], entries_per_file: int = 65536,
        native: bool = True,
    ) -> None:
        self.log = log
        self.levels_ms = levels_ms
        self.dir = directory / "levels"
        self.per_file = entries_per_file
        self.levels = [
            _Level(LevelQueue(self.dir / f"{i:02d}", entries_per_file, log.pages)) for i in range(len(levels_ms) + 1)
        ]
        self._files = [lv.queue.files for lv in self.levels]
        # the per-entry walks in C (sidecar._native), or their Python twins in queue.py
        nat = native and NATIVE
        self._lv_due = _native.lv_due if nat else lv_due
        self._due_args: LvDue = native_args.make(LvDue, _native if nat else None)
        self._lv_ack = _native.lv_ack if nat else lv_ack
        self._snap_done: list[int] = []  # each level's done at the last state() snapshot
        self.log_head: int | None = None  # the checkpointed log head: restored entries point below it
        self.dropped: list[tuple[int, int, str]] = []  # what the default ``report`` collects
        self.report: Callable[[int, int, str], None] = self._collect

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

    def intake_begin(self) -> tuple[list[int], tuple[Any, ...]]:
        """The state ``_native.ingest_run`` needs for ``plan`` and ``add``: the intake state with the
        levels' part (sidecar/store/intake_layout.py: the level count and file size, then per level
        its write index, the first index of the queue file holding it, the queue's dirty range and
        the level's delay), and each level's queue file holding its write index (None: not created
        yet)."""
        lvs = self.levels
        st = levels_state(len(lvs))
        st[Levels.PER_FILE] = lvs[0].queue.per_file
        bufs = []
        write, file_first, dirty_from, dirty_to, delay = (
            Level.WRITE, Level.FIRST, Level.DIRTY_FROM, Level.DIRTY_TO, Level.DELAY_MS
        )
        at = level_at(0)
        for n, lv in enumerate(lvs):
            q, idx = lv.queue, lv.write
            first = idx - idx % q.per_file
            f = q.files.get(first)
            st[at + write] = idx
            st[at + file_first] = -1 if f is None else first
            st[at + dirty_from] = -1 if q.dirty_from is None else q.dirty_from
            st[at + dirty_to] = q.dirty_to
            st[at + delay] = self.levels_ms[n - 1] if n else 0
            bufs.append(None if f is None else f.buf)
            at += LEVEL_STRIDE
        return st, tuple(bufs)

    def range_walk(self) -> Any:
        """What ``delay-sidecar list`` reads of these levels (``sidecar.levels.listing``)."""
        from sidecar.levels.listing import LevelsWalk

        return LevelsWalk(self)

    def intake_end(self, st: list[int], count: int) -> None:
        """Take back the write indexes and dirty ranges ``ingest_run`` moved."""
        write, dirty_from, dirty_to = Level.WRITE, Level.DIRTY_FROM, Level.DIRTY_TO
        at = level_at(0)
        for lv in self.levels:
            q = lv.queue
            w = st[at + write]
            if w != lv.write and q.ahead.near(w):
                q.prefault(w)
            lv.write = w
            d = st[at + dirty_from]
            q.dirty_from = None if d < 0 else d
            q.dirty_to = st[at + dirty_to]
            at += LEVEL_STRIDE

    # -- dequeue --------------------------------------------------------------------------------
    def due(self, now_ms: int, limit: int) -> list[tuple[int, Record]]:
        out: list[tuple[int, Record]] = []
        heads = []
        for n, lv in enumerate(self.levels):
            if lv.send < lv.write:
                heads.append((lv.queue.due_of(lv.send), n))
        heads.sort()
        walk, per = self._lv_due, self.per_file
        log = self.log
        segments = log.segments
        a = self._due_args
        a.hs, a.now, a.seg_bytes = HEADER_SIZE, now_ms, log.segment_bytes
        segs: dict[int, int] = {}  # releases by the done cursor, per log segment
        try:
            for head_due, n in heads:
                if head_due > now_ms or len(out) >= limit:
                    break
                lv = self.levels[n]
                q = lv.queue
                idx, write = lv.send, lv.write
                while idx < write and len(out) < limit:
                    # one call per queue file, read straight from its buffer (lv_due), and one
                    # per entry it leaves to Python (restored, or its record does not decode)
                    f, _off = q._locate(idx)
                    first = idx - idx % per
                    a.f0, a.idx, a.stop, a.restored = first, idx, min(write, first + per), lv.restored
                    a.done, a.room, a.ref_hi = lv.done, limit - len(out), n << IDX_BITS
                    why = walk(f.buf, segments, segs, out, a)
                    lv.send = idx = a.idx
                    lv.done = a.done
                    if why == BLOCKED:
                        break
                    if why == CALLER:  # pending and due
                        pos, due, _state = q.read(idx)
                        lv.send = idx + 1
                        if idx < lv.restored and self._dangles(n, idx, pos, due):
                            self._finish(lv, idx)  # restored, and its record fails the check: dropped, never handed out
                        else:
                            out.append(((n << IDX_BITS) | idx, log.read(pos)))
                        idx += 1
        finally:
            if segs:
                log.release_counts(segs)
        return out

    def ack(self, ref: int) -> None:
        lv = self.levels[ref >> IDX_BITS]
        idx = ref & IDX_MASK
        if idx < lv.done or idx >= lv.send:
            return
        lv.queue.set_state(idx, DELIVERED)
        self._finish(lv, idx)

    def ack_many(self, refs: list[int]) -> None:
        """``ack`` for each ref (one call per batch of delivery reports): ``lv_ack``."""
        levels = self.levels
        cur = array("q")
        for lv in levels:
            cur.extend((lv.done, lv.send, -1, -1))
        segs: dict[int, int] = {}
        try:
            self._lv_ack(refs, self._files, self.per_file, HEADER_SIZE, cur, self.log.segment_bytes, segs)
        finally:
            for n, lv in enumerate(levels):
                lv.done = cur[4 * n]
                if cur[4 * n + 2] >= 0:
                    lv.queue._dirty(cur[4 * n + 2])
                    lv.queue._dirty(cur[4 * n + 3] - 1)
            if segs:
                self.log.release_counts(segs)

    def _finish(self, lv: _Level, idx: int) -> None:
        """Entry ``idx`` of ``lv`` (handed out, its state no longer PENDING) is finished: if the
        done cursor waits on it, advance the cursor over every finished entry from there."""
        if idx != lv.done:
            return  # its state byte says it is finished: the cursor crosses it when it gets there
        segs: dict[int, int] = {}
        lv.done = lv_advance(lv.queue.files, self.per_file, HEADER_SIZE, lv.done, lv.send, self.log.segment_bytes, segs)
        self.log.release_counts(segs)

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
        pos, due, state = lv.queue.read(idx)
        if state != PENDING:
            return None
        if idx < lv.restored and self._dangles(n, idx, pos, due):
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
        # reclaim may only drop what this snapshot no longer names, even if done moves on before
        # the checkpoint holding it is durable
        self._snap_done = [lv.done for lv in self.levels]
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

    # -- damage ---------------------------------------------------------------------------------
    def arm(self, head: int, report: Callable[[int, int, str], None] | None = None) -> None:
        """Called by recovery after the replay with the checkpointed log ``head``: the cheap
        structural checks of the restored entries (see the module docstring; O(levels x log
        pending)), and the full check of each restored entry at its first read. Dangling entries,
        found now or later, go to ``report(ref, log_pos, reason)``. A missing queue file inside
        ``[done, write)`` is not a dangling entry but a lost queue: that raises ``StoreError``."""
        self.log_head = head
        if report is not None:
            self.report = report
        for n, lv in enumerate(self.levels):
            q = lv.queue
            per = q.per_file
            first = lv.done - lv.done % per
            while first < lv.restored:
                if first not in q.files:
                    raise StoreError(f"{q.dir}: a queue file holding pending entries is missing")
                first += per
            # Positions grow with the index within a level: the entries at or beyond the head are
            # a suffix of [done, restored). Find its start by bisection.
            lo, hi = lv.done, lv.restored
            while lo < hi:
                mid = (lo + hi) // 2
                if q.read(mid)[0] >= head:
                    hi = mid
                else:
                    lo = mid + 1
            for idx in range(lo, lv.restored):
                pos, _due, state = q.read(idx)
                if state == PENDING:
                    self._drop(n, idx, pos, f"position {pos} is at or beyond the log head {head}")

    def _fault(self, n: int, pos: int, due: int) -> str:
        """Why the restored entry (level ``n``, ``pos``, ``due``) does not match its record; ""
        if it does (``CommitLog.fault``)."""
        return self.log.fault(pos, due, self.log_head, n)

    def _dangles(self, n: int, idx: int, pos: int, due: int) -> bool:
        """Check a pending restored entry before its first use; drop and report it if it dangles."""
        reason = self._fault(n, pos, due)
        if not reason:
            return False
        self._drop(n, idx, pos, reason)
        return True

    def _drop(self, n: int, idx: int, pos: int, reason: str) -> None:
        self.levels[n].queue.drop(idx)
        self.report((n << _IDX_BITS) | idx, pos, reason)

    def _collect(self, ref: int, pos: int, reason: str) -> None:
        self.dropped.append((ref, pos, reason))

    def validate(self, head: int) -> list[tuple[int, int, str]]:
        """The full check of every pending restored entry at once, O(pending): for tests and
        tools (recovery checks each one at its first read instead). Drops and returns the
        dangling ones as ``(ref, log_pos, reason)``; they are not passed to ``report``."""
        self.log_head = head
        dropped: list[tuple[int, int, str]] = []
        for n, lv in enumerate(self.levels):
            q = lv.queue
            bad: list[tuple[int, int, str]] = []
            try:
                for idx, pos, due, state in q.scan(lv.done, lv.restored):
                    if state == PENDING:
                        reason = self._fault(n, pos, due)
                        if reason:
                            bad.append((idx, pos, reason))
            except KeyError:
                raise StoreError(f"{q.dir}: a queue file holding pending entries is missing") from None
            for idx, pos, reason in bad:
                q.drop(idx)
                dropped.append(((n << _IDX_BITS) | idx, pos, reason))
        return dropped

    def reclaim(self) -> None:
        for lv, done in zip(self.levels, self._snap_done, strict=False):
            lv.queue.drop_before(done)
        self._snap_done = []

    def pending(self) -> dict[str, int]:
        return {f"level-{n}": lv.write - lv.done for n, lv in enumerate(self.levels) if lv.write > lv.done}

    def disk_bytes(self) -> int:
        return sum(lv.queue.disk_bytes() for lv in self.levels)

    def close(self) -> None:
        for lv in self.levels:
            lv.queue.close()
