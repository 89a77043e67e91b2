"""The timer-wheel scheduler (RocketMQ 5.x RIP-43, improved; DESIGN.md 4, docs/wheel.md).

Three tiers, each on disk, none holding a Python object per record:

- **slots** (``layout.SlotFile``): one 32-byte slot per ``precision`` ms of the near window, a ring
  of ``window / precision`` positions. Slot ``k`` holds the records due in
  ``[k * precision, (k + 1) * precision)`` as a chain of timer-log entries in arrival order.
- **late chain**: records that arrive already due for a slot the reader has passed go to one
  arrival-ordered chain, handed out ahead of the slots (they are due; everything still in a slot
  is due later than they are).
- **buckets** (``sidecar.store.buckets``): records due beyond the ring, copied whole into the
  bucket file of their due time (their commit-log slot is released at once) and linked into the
  wheel when the ring reaches the bucket's end. While a bucket is not fully linked in, records due
  in its range join it even if the ring could hold them (equal due times keep arrival order), and
  a record already due but beyond the ring (the reader more than a window behind) waits in its
  bucket rather than jump the queue on the late chain.

Reading. The *send* cursor walks the slots in order. Within a slot it makes one pass per distinct
due offset (``due_ms - slot start``), smallest first, each pass walking the chain in arrival order
and handing out the entries with that offset: so a slot comes out ordered by due ms, ties by
arrival, and a pass for offset ``o`` only starts once ``now >= slot start + o`` — every record is
handed out at or after its own due ms, never early, and without waiting for the end of its slot.
Passes cost one chain walk per distinct offset (at most ``precision`` of them); a pass resumes
from its cursor on the next call, so a million-record slot is read in ``limit``-sized chunks with
flat memory. The reader never starts a slot at or beyond the start of a bucket that still holds
records not linked in: loading stays ahead of reading, so bucket records land in their slots.

Finishing. ``ack`` marks an entry done (its state byte, which the timer log keeps in a dense array
apart from the entries: acks come in due order, entries were written in arrival order, and one byte
per entry keeps the scattered ack writes on few pages; see ``layout``). The *done* cursor follows
the send cursor over entries whose state is done (acks arrive out of order; done only crosses a
gap-free prefix, like the levels scheduler) and releases each record's commit-log slot — or its
bucket's live count — as it passes. Only done is checkpointed: after a crash everything from done
on is read again, entries already done are skipped (not redelivered), so duplicates are limited to
records that were in flight. The done cursor names the slot, the pass and the chain position, so a
crash in the middle of a million-record slot resumes there.

Durability and the ring. The slot file and timer log are mmapped and written in place; the
checkpoint names the timer-log head, so entries past it are rewritten by the partition's replay,
and ``restore`` cuts every slot chain back to entries before that head. A ring position is
reused only for slots beyond ``guard + slots``, where ``guard`` is the lowest slot a restore from
the last checkpoint could still need (the checkpointed done slot, or the first non-empty slot
finished since), so a crash never finds a needed slot overwritten.

Damage. Recovery does not read the bodies behind the restored entries (that would be
O(pending) at every start): the durability order is data -> index -> checkpoint, so an entry the
checkpoint covers points at a body that was made durable before the checkpoint was written and
can only dangle if the disk is damaged (or, with ``fsync: none``, after a power loss); entries
after the checkpoint's timer-log head are rewritten by the log replay. Instead each pending
entry restored from the checkpoint (index below the restored head) is checked against its body
on its *first read* — when send reaches it in ``due`` and in ``record`` — below the checkpointed
log head (``arm``), CRC intact, same due time, not a cancel; a dangling one is marked DROPPED
(skipped, never handed out, its body not released: a wrong live count must not delete a segment
that still holds pending records) and reported through ``report``. Bucket records are
CRC-checked as they are loaded; a damaged one is not linked in (its bucket's count is released:
the bucket is known to hold it) and is reported the same way. ``validate`` is the same check of
every restored entry at once, O(pending), for tests and tools.

Nothing here reads a clock: time comes in as ``now_ms``.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_right, insort
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.store.buckets import BUCKET_BIT, BucketStore, make_ref, split_ref
from sidecar.store.codec import Record
from sidecar.store.codec import native as _native
from sidecar.store.log import CommitLog
from sidecar.store.mapped import HEADER_SIZE, GeometryMismatch, StoreError, fsync_dir
from sidecar.wheel.layout import (
    CALLER,
    CANCELLED,
    DONE,
    DROPPED,
    END,
    ENTRY_SIZE,
    LATE,
    OTHER_FILE,
    PENDING,
    SLOT,
    SLOT_SIZE,
    SlotFile,
    TimerLog,
    wl_ack,
    wl_done,
    wl_group,
    wl_link,
    wl_read,
    wl_send,
)

STATE_VERSION = 1
MAX_DUE_MS = (1 << 62) - 1
MIN_DUE_MS = -(1 << 62)
MAX_PRECISION_MS = 60_000
_NEG = -(1 << 62)
_SLOT, _LATE, _BUCKET = 0, 1, 2
_TAG = 0xFFFFFFFF
_walk = struct.Struct("<qqq").unpack_from  # (due, loc, next)


class _SlotIndex:
    """The entries of one slot grouped by due offset, each group in chain (arrival) order.

    Built by one walk of the slot's chain and extended as entries are appended to it, so a pass
    reads only the entries of its own offset: a slot with ``d`` distinct offsets costs one chain
    walk plus one read per entry, not ``d`` chain walks. Entries are plain integers in arrays
    (8 bytes each), and only slots up to ``index_max`` entries get one: beyond that the passes walk
    the chain, which a mass expiry (one due ms, one pass) does anyway.
    """

    __slots__ = ("first", "k", "keys", "last", "offs")

    def __init__(self, k: int, first: int) -> None:
        self.k = k
        self.first = first
        self.last = -1
        self.offs: dict[int, array[int]] = {}
        self.keys: list[int] = []  # the offsets present, ascending

    def tail(self, o: int, after: int) -> tuple[array[int], int]:
        """The entries of offset ``o`` in chain order, and the index of the first one after entry
        ``after`` (-1: from the start of the pass)."""
        lst = self.offs.get(o, _EMPTY)
        return lst, 0 if after == -1 else bisect_right(lst, after)

    def after(self, o: int) -> int:
        """Smallest offset above ``o`` present in the slot (-1: none)."""
        i = bisect_right(self.keys, o)
        return self.keys[i] if i < len(self.keys) else -1


_EMPTY = array("q")


def check_settings(precision_ms: int, window_ms: int, bucket_width_ms: int) -> None:
    """Refuse geometries the wheel cannot honour, with the reason."""
    if not 1 <= precision_ms <= MAX_PRECISION_MS:
        raise ValueError(f"wheel precision must be 1 ms .. {MAX_PRECISION_MS} ms, not {precision_ms} ms")
    if window_ms % precision_ms or window_ms // precision_ms < 2:
        raise ValueError(
            f"wheel window ({window_ms} ms) must be a multiple of the precision ({precision_ms} ms), at least 2 slots"
        )
    if not 1 <= bucket_width_ms <= window_ms:
        raise ValueError(
            f"bucket width ({bucket_width_ms} ms) must be between 1 ms and the wheel window ({window_ms} ms): "
            "a bucket is loaded once the whole of it fits in the window"
        )


class WheelScheduler:
    name = "wheel"

    def __init__(
        self,
        directory: Path,
        log: CommitLog,
        *,
        precision_ms: int = 10,
        window_ms: int = 3_600_000,
        bucket_width_ms: int = 3_600_000,
        levels_ms: tuple[int, ...] = (),
        entries_per_file: int = 1 << 20,
        load_batch: int = 8_192,
        scan_factor: int = 4,
        done_batch: int = 65_536,
        index_max: int = 1 << 17,
        native: bool = True,
    ) -> None:
        check_settings(precision_ms, window_ms, bucket_width_ms)
        self.log = log
        self.levels_ms = levels_ms
        self.P = precision_ms
        self.N = window_ms // precision_ms
        self.window_ms = window_ms
        self.width = bucket_width_ms
        self.dir = directory / "wheel"
        self._new_dir = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.partition_dir = directory
        self.slots = SlotFile(self.dir / "slots.whl", self.P, self.N)
        self.tl = TimerLog(self.dir / "tl", entries_per_file)
        self.pf = entries_per_file
        self.buckets = BucketStore(directory / "buckets")
        self.load_batch = load_batch
        self.scan_factor = scan_factor
        self.done_batch = done_batch
        self.index_max = index_max
        # the C record writes (sidecar._native), or their Python twins in layout.py
        self.native = _native if native else None
        nat = self.native
        self._wl_link = wl_link if nat is None else nat.wl_link
        self._wl_send = wl_send if nat is None else nat.wl_send
        self._wl_done = wl_done if nat is None else nat.wl_done
        self._wl_read = wl_read if nat is None else nat.wl_read
        self._wl_group = wl_group if nat is None else nat.wl_group
        self._wl_ack = wl_ack if nat is None else nat.wl_ack
        self.occ_send = bytearray(self.N)  # 1: slot at this position still to be read by send
        self.occ_done = bytearray(self.N)  # 1: slot at this position still to be passed by done
        self._budget = 0
        self._dbudget = 0
        self.dropped: list[tuple[int, int, str]] = []  # (ref, body locator, reason): what ``report`` collects
        self.report: Callable[[int, int, str], None] = self._collect
        self.log_head: int | None = None  # the checkpointed log head: restored entries point below it
        self._restored_head = 0  # entries below it were restored from the checkpoint: checked on first read
        self._reset()

    def _reset(self) -> None:
        self.head = 0  # next timer-log index
        self.file_live: dict[int, int] = {}  # timer-log file -> entries not yet passed by done
        self.inited = False
        # send cursor: slot, pass offset (-1: slot not started), last examined entry of the pass
        # (-1: pass start), smallest offset above the pass seen so far (-1: none)
        self.s_k = 0
        self.s_o = self.s_after = self.s_nxt = -1
        # done cursor, same shape; done <= send
        self.d_k = 0
        self.d_o = self.d_after = self.d_nxt = -1
        # late chain: first entry not yet passed by done, last entry, last entry examined by send
        self.l_head = self.l_tail = self.l_sent = -1
        # After a restore: the send slot of the checkpoint. Send restarts from done, but records
        # due below this slot were behind the reader already, so new ones go to the late chain.
        self.late_below = _NEG
        self.now_last = _NEG
        # lowest non-empty slot finished by done before / after the last state() snapshot
        self.fm_before: int | None = None
        self.fm_after: int | None = None
        self._d_block = -1  # the entry the done cursor waits on in its slot (-1: none)
        self.n_wheel = 0  # timer-log entries not yet passed by done
        self.n_bucket = 0  # bucket records not yet loaded
        self._snap_files: list[int] = []
        self._snap_buckets: list[int] = []
        self.occ_send[:] = bytes(self.N)
        self.occ_done[:] = bytes(self.N)
        self._occ_memo: tuple[int, int | None] | None = None  # see _next_send
        self._six: _SlotIndex | None = None  # slot index of the send cursor's slot
        self._dix: _SlotIndex | None = None  # ... and of the done cursor's

    # -- planning -------------------------------------------------------------------------------
    def plan(self, mode: str, level: int, requested_due_ms: int, enqueue_ms: int) -> tuple[int, int] | None:
        """The wheel honours the requested ms exactly (``delay.deliver-at`` = requested time)."""
        if mode == "level":
            if not 1 <= level <= len(self.levels_ms):
                return None
            due = enqueue_ms + self.levels_ms[level - 1]
        else:
            due = requested_due_ms
        if not MIN_DUE_MS <= due <= MAX_DUE_MS:
            return None
        return 0, due

    # -- geometry helpers -----------------------------------------------------------------------
    def _slot(self, k: int) -> tuple[int, int, int, int] | None:
        """(first, last, count, min_off) of slot ``k``, or None if its position holds no such slot."""
        t, first, last, count, min_off, _r = SLOT.unpack_from(self.slots.buf, HEADER_SIZE + (k % self.N) * SLOT_SIZE)
        if count == 0 or t != k * self.P:
            return None
        return first, last, count, min_off

    def _next_occ(self, occ: bytearray, k: int) -> int | None:
        """Smallest slot after ``k`` whose position is flagged in ``occ`` (ring search)."""
        n = self.N
        r = k % n
        if r + 1 < n:
            i = occ.find(1, r + 1)
            if i >= 0:
                return k + (i - r)
        i = occ.find(1, 0, r)
        if i >= 0:
            return k + (n - r) + i
        return None

    def _next_send(self, k: int) -> int | None:
        """``_next_occ(occ_send, k)``, remembered. The search scans the ring (360,000 positions by
        default, 8.7 µs measured when it is empty) and is asked at every loop turn and between
        intake slices (``next_due_ms``): with no slot ahead occupied — the throughput scenario's
        backlog, all on the late chain — that is a whole scan each time, ~0.5 % of the loop thread
        at 65k records/s. The answer ``t`` from slot ``k0`` holds for any ``k`` in ``[k0, t)`` until
        a flag changes: every place that sets or clears an ``occ_send`` flag
        drops the memo (the C intake counts the chains it starts, ``intake_end``)."""
        m = self._occ_memo
        if m is not None:
            # From a later k the ring search also covers k0's own position (as k0 + N); with no
            # slot found, the memo only answers for k0 itself, so that position is never skipped.
            k0, t = m
            if k == k0 or (t is not None and k0 < k < t):
                return t
        t = self._next_occ(self.occ_send, k)
        self._occ_memo = (k, t)
        return t

    def _guard(self) -> int:
        g = self.d_k
        if self.fm_before is not None and self.fm_before < g:
            g = self.fm_before
        if self.fm_after is not None and self.fm_after < g:
            g = self.fm_after
        return g

    def _limit_slot(self) -> int:
        """First slot the ring may not hold yet (see the module docstring: ``guard + slots``)."""
        return self._guard() + self.N

    def _resume(
        self, ix: _SlotIndex | None, o: int, after: int, first: int, last: int, nxt: int
    ) -> tuple[array[int] | None, int, int, int, int]:
        """Where a cursor's pass over offset ``o`` resumes after entry ``after`` (-1: from the
        start): ``(lst, i, n, e, nxt)`` — with an index, its list for ``o`` and the position in it
        (``e`` and ``nxt`` unused: -1); without, the chain's next entry ``e`` and the cursor's
        saved next offset ``nxt``."""
        if ix is not None:
            lst, i = ix.tail(o, after)
            return lst, i, len(lst), -1, -1
        return None, 0, 0, first if after == -1 else (-1 if after == last else self.tl.next_of(after)), nxt

    def _index(
        self, ix: _SlotIndex | None, other: _SlotIndex | None, k: int, first: int, last: int, count: int
    ) -> _SlotIndex | None:
        """The index of slot ``k`` brought up to its current ``last`` (None: the slot is too big).
        ``other`` is the other cursor's index: done usually follows send into the same slot, and
        one index serves both (it is a cache of the chain, the same whoever built it)."""
        if count > self.index_max:
            return None
        if ix is None or ix.k != k or ix.first != first:
            if other is not None and other.k == k and other.first == first:
                ix = other
                if ix.last == last:
                    return ix
                e = self.tl.next_of(ix.last)
            else:
                ix = _SlotIndex(k, first)
                e = first
        elif ix.last == last:
            return ix
        else:
            e = self.tl.next_of(ix.last)
        base = k * self.P
        files, pf, group = self.tl.files, self.pf, self._wl_group
        offs, keys = ix.offs, ix.keys
        while e != -1:  # one call per timer-log file the chain crosses
            f0 = e - e % pf
            got, e = group(files[f0].buf, self.tl.hs, f0, pf, e, last, base)
            for eo, raw in got.items():
                lst = offs.get(eo)
                if lst is None:
                    offs[eo] = lst = array("q")
                    insort(keys, eo)
                lst.frombytes(raw)
        ix.last = last
        return ix

    def _init_cursor(self, k: int) -> None:
        self.inited = True
        self.s_k = self.d_k = k
        self.s_o = self.s_after = self.s_nxt = -1
        self.d_o = self.d_after = self.d_nxt = -1

    # -- intake ---------------------------------------------------------------------------------
    def _destination(self, due: int, loading: bool = False) -> int:
        kd = due // self.P
        if kd < self.late_below:
            return _LATE
        if kd > self.s_k or (kd == self.s_k and (self.s_o < 0 or due - kd * self.P >= self.s_o)):
            if kd >= self._limit_slot():
                # Beyond the ring, even if already due (the reader is more than a window behind):
                # its bucket keeps it in due order behind the backlog instead of jumping the queue.
                return _BUCKET
            by_range = self.buckets.by_range
            if not loading and by_range and (due - due % self.width, self.width) in by_range:
                # Its bucket is not fully linked into the wheel yet: join it there, so records of
                # equal due time keep their arrival order (the bucket is linked before anything
                # added to the ring after it).
                return _BUCKET
            return _SLOT
        return _LATE  # its slot is behind the reader: it is already due

    def _new_entry(self, due: int, loc: int, level: int, flags: int) -> int:
        idx = self.head
        first = idx - idx % self.pf
        if self.tl.append(idx, due, loc, flags, level):
            self.file_live[first] = 0
        self.file_live[first] = self.file_live.get(first, 0) + 1
        self.head = idx + 1
        self.n_wheel += 1
        return idx

    def _append_slot(self, due: int, loc: int, level: int) -> int:
        """Append a timer-log entry for ``due`` and link it at the tail of its slot's chain: the
        per-record intake path, so the entry write, the slot read, the link patch and the slot
        write are one ``wl_link`` call (C, or its Python twin)."""
        idx = self.head
        f0 = idx - idx % self.pf
        tl = self.tl
        mf = tl.files.get(f0)
        if mf is None:
            mf = tl.create(f0)
            self.file_live[f0] = 0
        P = self.P
        kd = due // P
        pos = kd % self.N
        soff = HEADER_SIZE + pos * SLOT_SIZE
        last = self._wl_link(mf.buf, tl.hs, f0, self.pf, idx, due, loc, 0, level, self.slots.buf, soff, kd * P)
        lo = tl.app_lo
        if lo < 0:
            tl.app_lo = lo = idx
        tl.app_hi = idx + 1
        if last < 0:
            self.occ_send[pos] = 1
            self.occ_done[pos] = 1
            self._occ_memo = None
        elif last < f0:
            tl.set_next(last, idx)  # the old tail is in an older file
        elif last < lo:
            # patched in place before this flush's appended range: flush must msync it too
            tl.mark(f0, tl.hs + (last - f0) * ENTRY_SIZE)
        sf = self.slots
        if soff < sf.dirty_lo or sf.dirty_lo < 0:
            sf.dirty_lo = soff
        if soff + SLOT_SIZE > sf.dirty_hi:
            sf.dirty_hi = soff + SLOT_SIZE
        self.file_live[f0] += 1
        self.head = idx + 1
        self.n_wheel += 1
        return idx

    def _link_late(self, idx: int) -> None:
        if self.l_tail == -1:
            self.l_head = self.l_tail = idx
        else:
            self.tl.set_next(self.l_tail, idx)
            self.l_tail = idx

    def _link(self, due: int, loc: int, level: int, dest: int) -> int:
        if dest == _LATE:
            idx = self._new_entry(due, loc, level, LATE)
            self._link_late(idx)
            return idx
        return self._append_slot(due, loc, level)

    def add(self, due_ms: int, level: int, log_pos: int) -> int:
        if not self.inited:
            # No due() call yet (first start, or replay before any checkpoint): start the reader
            # at the earliest of this record's due and enqueue times.
            rec = self.log.read(log_pos)
            self._init_cursor(min(due_ms, rec.enqueue_ms) // self.P)
        # _destination, inlined: this runs once per record
        kd = due_ms // self.P
        s_k = self.s_k
        if kd < self.late_below or kd < s_k or (kd == s_k and 0 <= self.s_o > due_ms - kd * self.P):
            return self._link(due_ms, log_pos, level, _LATE)  # its slot is behind the reader: already due
        g = self.d_k  # _guard()
        fm = self.fm_before
        if fm is not None and fm < g:
            g = fm
        fm = self.fm_after
        if fm is not None and fm < g:
            g = fm
        if kd >= g + self.N:
            return self._add_bucket(due_ms, log_pos)  # beyond the ring (see _destination)
        by_range = self.buckets.by_range
        if by_range and (due_ms - due_ms % self.width, self.width) in by_range:
            return self._add_bucket(due_ms, log_pos)  # its bucket is not fully linked yet
        return self._append_slot(due_ms, log_pos, level)

    def intake_begin(self) -> tuple[list[int], tuple[Any, ...]] | None:
        """The state ``_native.ingest_run`` needs for ``add``'s plain cases (``_append_slot``, and an
        already due record's ``_link`` to the late chain): the intake state with the wheel's part
        (sidecar/store/intake_layout.py) and the buffers it writes (the head's timer-log file, None
        if not mapped yet; the slot file; the occupancy flags; the buckets not fully linked yet);
        None when the next ``add`` cannot be that case (no cursor yet)."""
        if not self.inited:
            return None
        from sidecar.store.intake_layout import Wheel, wheel_state

        idx, tl, sf = self.head, self.tl, self.slots
        f0 = idx - idx % self.pf
        mf = tl.files.get(f0)
        st = wheel_state()
        st[Wheel.P] = self.P
        st[Wheel.N] = self.N
        st[Wheel.LATE_BELOW] = self.late_below
        st[Wheel.S_K] = self.s_k
        st[Wheel.S_O] = self.s_o
        st[Wheel.GUARD] = self._guard()
        st[Wheel.HEAD] = idx
        st[Wheel.PER_FILE] = self.pf
        st[Wheel.F0] = -1 if mf is None else f0
        st[Wheel.APP_LO] = tl.app_lo
        st[Wheel.APP_HI] = tl.app_hi
        st[Wheel.SLOT_DIRTY_LO] = sf.dirty_lo
        st[Wheel.SLOT_DIRTY_HI] = sf.dirty_hi
        st[Wheel.MARK_LO] = -1
        st[Wheel.MARK_HI] = -1
        st[Wheel.WIDTH] = self.width
        st[Wheel.LATE_HEAD] = self.l_head
        st[Wheel.LATE_TAIL] = self.l_tail
        bufs = (None if mf is None else mf.buf, sf.buf, self.occ_send, self.occ_done, self.buckets.by_range)
        return st, bufs

    def intake_end(self, st: list[int], count: int) -> None:
        """Take back what ``ingest_run`` changed: ``count`` entries appended to the timer-log file
        of the head at ``intake_begin`` (the kernel stops at a file boundary)."""
        from sidecar.store.intake_layout import Wheel

        f0 = self.head - self.head % self.pf
        self.head = st[Wheel.HEAD]
        self.file_live[f0] += count
        self.n_wheel += count
        tl, sf = self.tl, self.slots
        tl.app_lo, tl.app_hi = st[Wheel.APP_LO], st[Wheel.APP_HI]
        self.l_head, self.l_tail = st[Wheel.LATE_HEAD], st[Wheel.LATE_TAIL]  # late entries appended to the late chain
        if st[Wheel.NEW_CHAINS]:  # slot chains started: occ_send flags set
            self._occ_memo = None
        sf.dirty_lo, sf.dirty_hi = st[Wheel.SLOT_DIRTY_LO], st[Wheel.SLOT_DIRTY_HI]
        if st[Wheel.MARK_LO] >= 0:  # old tails patched in place: the range of them, for flush
            tl.mark(f0, st[Wheel.MARK_LO])
            tl.mark(f0, st[Wheel.MARK_HI] - ENTRY_SIZE)

    def _add_bucket(self, due_ms: int, log_pos: int) -> int:
        rec = self.log.read(log_pos)
        seg = self.log.segments.get(log_pos // self.log.segment_bytes)
        off = log_pos % self.log.segment_bytes
        # the record's bytes exactly as in the log (CRC intact); re-encoded if not addressable
        raw = seg.buf[off : off + rec.length] if seg is not None else BucketStore.encode(rec)
        ref = self.buckets.append(due_ms - due_ms % self.width, self.width, due_ms, raw)
        self.log.release(log_pos)
        self.n_bucket += 1
        return ref

    # -- bucket loading -------------------------------------------------------------------------
    def _load(self) -> None:
        bs = self.buckets
        if not bs.unloaded:
            return
        limit_ms = self._limit_slot() * self.P
        budget = self.load_batch
        while budget > 0 and bs.unloaded:
            end, _start, seq = bs.unloaded[0]
            if end > limit_ms:
                break
            b = bs.buckets[seq]
            items = bs.scan(b, budget)
            if not items:
                bs.mark_loaded(b, b.size, 0)
                continue
            pos = b.loaded
            for off, total, state, due, level in items:
                if state == PENDING:
                    try:
                        bs.read(seq, off)  # CRC check: a damaged copy is dropped here, not on delivery
                    except StoreError as e:
                        bs.release(seq)
                        self.report(make_ref(seq, off), make_ref(seq, off), str(e))
                        pos = off + total
                        continue
                    dest = self._destination(due, loading=True)
                    if dest == _BUCKET:  # cannot happen: due < end <= limit
                        raise StoreError(f"bucket {seq}: record due {due} does not fit the window it was loaded into")
                    idx = self._link(due, make_ref(seq, off), level, dest)
                    bs.set_tl(seq, off, idx)
                else:  # cancelled before it was loaded: finished here
                    bs.release(seq)
                pos = off + total
            bs.mark_loaded(b, pos, len(items))
            self.n_bucket -= len(items)
            budget -= len(items)

    # -- dequeue --------------------------------------------------------------------------------
    def _read(self, loc: int) -> Record:
        if loc & BUCKET_BIT:
            seq, off = split_ref(loc)
            return self.buckets.read(seq, off)
        return self.log.read(loc)

    def _hand_out(self, pend: list[tuple[int, int]], out: list[tuple[int, Record]]) -> None:
        """``(ref, record)`` onto ``out`` for each ``(entry, loc)`` of ``pend``: the commit log's
        records decoded in runs by ``wl_read``; a bucket's record (its ref is its loc), or one
        ``wl_read`` leaves, read here."""
        i, n = 0, len(pend)
        log = self.log
        while i < n:
            i = self._wl_read(log.segments, log.segment_bytes, pend, i, out)
            if i < n:
                x, loc = pend[i]
                out.append((loc if loc & BUCKET_BIT else x, self._read(loc)))
                i += 1

    def _late_next(self) -> int:
        if self.l_sent == -1:
            return self.l_head
        if self.l_sent == self.l_tail:
            return -1
        return self.tl.next_of(self.l_sent)

    def _drain_late(self, now: int, limit: int, out: list[tuple[int, Record]]) -> None:
        """Hand out the late chain from the entry after ``l_sent``: one ``wl_send`` call per
        timer-log file, in its late mode (``o`` -1: every entry is of the pass; it stops at a
        pending entry due after ``now``, which only a clock step back leaves on the chain)."""
        e = self._late_next()
        if e == -1:
            return
        files, pf, last, vlim = self.tl.files, self.pf, self.l_tail, self._restored_head
        send, mark = self._wl_send, self.tl.mark
        sent, budget, room = self.l_sent, self._budget, limit - len(out)
        pend: list[tuple[int, int]] = []
        while e != -1:
            f0 = e - e % pf
            cbuf = files[f0].buf
            why, _i, e, sent, _n, budget, room, lo, hi = send(
                cbuf, self.tl.hs, f0, pf, None, 0, e, last, now, -1, -1, sent, room, budget, vlim, pend
            )
            if hi >= 0:
                mark(f0, lo)
                mark(f0, hi)
            if why == CALLER:  # pending, and restored (its body is checked) or not yet due
                due, loc, nx = _walk(cbuf, self.tl.hs + (e - f0) * ENTRY_SIZE)
                if due > now:
                    break  # never early
                budget -= 1
                if not self._dangles(e, due, loc):
                    pend.append((e, loc))
                    room -= 1
                sent = e
                e = -1 if e == last else nx
            elif why != OTHER_FILE:
                break
        self._budget = budget
        self.l_sent = sent
        self._hand_out(pend, out)

    def _drain_slots(self, now: int, limit: int, out: list[tuple[int, Record]]) -> None:
        P = self.P
        tl = self.tl
        # Never start a slot a bucket still has records for: loading stays ahead of reading, so a
        # bucket's records are linked into their slots, in order, not onto the late chain.
        b0 = self.buckets.first_start(self.window_ms)
        bfloor = (1 << 62) if b0 is None else b0 // P
        while len(out) < limit and self._budget > 0:
            k = self.s_k
            sl = self._slot(k)
            if self.s_o < 0:  # slot k not started
                if k >= bfloor:
                    return
                if sl is not None and self.occ_send[k % self.N]:
                    if now < k * P + sl[3]:
                        return
                    self.s_o, self.s_after, self.s_nxt = sl[3], -1, -1
                    continue
                target = self._next_send(k)
                cap = (now + 1) // P  # never move past a slot that is not wholly due
                nk = cap if target is None or cap < target else target
                if nk > bfloor:
                    nk = bfloor
                if nk <= k:
                    return
                self.s_k = nk
                continue
            if sl is None:
                raise StoreError(f"timer wheel: slot {k} vanished while being read")
            first, last = sl[0], sl[1]
            o = self.s_o
            base = k * P
            after = self.s_after
            budget = self._budget
            room = limit - len(out)
            files, pf = tl.files, self.pf
            vlim = self._restored_head
            ix = self._six = self._index(self._six, self._dix, k, first, last, sl[2])
            lst, i, n, e, nxt = self._resume(ix, o, after, first, last, self.s_nxt)
            send, mark = self._wl_send, tl.mark
            pend: list[tuple[int, int]] = []
            why = END
            while True:  # one call per timer-log file, and one per restored entry to check
                x = e if lst is None else (lst[i] if i < n else -1)
                if x == -1:
                    why = END
                    break
                f0 = x - x % pf
                cbuf = files[f0].buf
                why, i, e, after, nxt, budget, room, lo, hi = send(
                    cbuf, self.tl.hs, f0, pf, lst, i, e, last, base, o, nxt, after, room, budget, vlim, pend
                )
                if hi >= 0:
                    mark(f0, lo)
                    mark(f0, hi)
                if why == CALLER:  # pending, restored: its body is checked before it is handed out
                    x = e if lst is None else lst[i]
                    due, loc, nx = _walk(cbuf, self.tl.hs + (x - f0) * ENTRY_SIZE)
                    budget -= 1
                    if not self._dangles(x, due, loc):
                        pend.append((x, loc))
                        room -= 1
                    after = x
                    if lst is None:
                        e = -1 if x == last else nx
                    else:
                        i += 1
                elif why != OTHER_FILE:
                    break
            self._budget = budget
            self._hand_out(pend, out)
            if ix is not None:
                # the true next offset: a chain walk resuming from here (slot grown past
                # index_max) must not miss the offsets of entries before ``after``
                nxt = self.s_nxt = ix.after(o)
                if why != END:
                    self.s_after = after
                    return  # limit or budget
                self.s_after = last  # every entry of this offset up to the chain's end is examined
            else:
                self.s_after = after
                self.s_nxt = nxt
                if why != END:
                    return  # limit or budget
            if nxt >= 0:  # next pass
                if now < base + nxt:
                    return
                self.s_o, self.s_after, self.s_nxt = nxt, -1, -1
                continue
            if now < base + P - 1:
                return  # all passes done, but records for this slot may still arrive
            self.occ_send[k % self.N] = 0
            self._occ_memo = None
            self.s_k, self.s_o, self.s_after, self.s_nxt = k + 1, -1, -1, -1

    def due(self, now_ms: int, limit: int) -> list[tuple[int, Record]]:
        out: list[tuple[int, Record]] = []
        if limit <= 0:
            return out
        if not self.inited:
            self._init_cursor(now_ms // self.P)
        if now_ms > self.now_last:
            self.now_last = now_ms
        self._budget = limit * self.scan_factor + 1024
        self._load()
        self._drain_late(now_ms, limit, out)
        if len(out) < limit:
            self._drain_slots(now_ms, limit, out)
        self._advance_done()
        return out

    # -- finishing ------------------------------------------------------------------------------
    def _done_late(self, budget: int) -> int:
        """The done cursor's pass over the late chain, from ``l_head`` through ``l_sent``: one
        ``wl_done`` call per timer-log file (late mode, ``o`` -1), the bodies crossed released in
        counts per segment; returns the budget left."""
        e, sent, pf, files = self.l_head, self.l_sent, self.pf, self.tl.files
        walk, file_live = self._wl_done, self.file_live
        segs: dict[int, int] = {}
        blocs: list[int] = []
        why, after = END, -1
        while e != -1:
            f0 = e - e % pf
            why, _i, e, after, _n, budget, passed = walk(
                files[f0].buf, self.tl.hs, f0, pf, None, 0, e, sent, 0, -1, -1, after, budget,
                self.log.segment_bytes, segs, blocs,
            )
            file_live[f0] -= passed
            self.n_wheel -= passed
            if why != OTHER_FILE:
                break
        self.log.release_counts(segs)
        for loc in blocs:
            self.buckets.release(split_ref(loc)[0])
        if why != END:
            self.l_head = e  # the entry done waits on, or where the budget ran out
        elif sent == self.l_tail:
            self.l_head = self.l_tail = self.l_sent = -1
        else:
            self.l_head = self.tl.next_of(sent)
        return budget

    def _advance_done(self) -> None:
        budget = self.done_batch
        files, pf = self.tl.files, self.pf
        # the late chain, through the last entry send examined (``l_sent``): one wl_done call
        # per timer-log file, in its late mode (``o`` -1)
        if self.l_head != -1 and self.l_sent != -1 and self.l_head <= self.l_sent:
            budget = self._done_late(budget)
        # slots
        P = self.P
        self._d_block = -1
        file_live, seg_bytes = self.file_live, self.log.segment_bytes
        while budget > 0:
            k = self.d_k
            if k > self.s_k or (k == self.s_k and self.s_o < 0):
                return  # caught up with send
            sl = self._slot(k)
            if self.d_o < 0:
                if sl is not None and self.occ_done[k % self.N]:
                    self.d_o, self.d_after, self.d_nxt = sl[3], -1, -1
                    continue
                target = self._next_occ(self.occ_done, k)
                self.d_k = self.s_k if target is None or target > self.s_k else target
                continue
            if sl is None:
                raise StoreError(f"timer wheel: slot {k} vanished under the done cursor")
            first, last = sl[0], sl[1]
            o = self.d_o
            base = k * P
            after = self.d_after
            ix = self._dix = self._index(self._dix, self._six, k, first, last, sl[2])
            lst, i, n, e, nxt = self._resume(ix, o, after, first, last, self.d_nxt)
            walk = self._wl_done
            segs: dict[int, int] = {}
            blocs: list[int] = []
            why = END
            while True:  # one call per timer-log file
                x = e if lst is None else (lst[i] if i < n else -1)
                if x == -1:
                    why = END
                    break
                f0 = x - x % pf
                why, i, e, after, nxt, budget, passed = walk(
                    files[f0].buf, self.tl.hs, f0, pf, lst, i, e, last, base, o, nxt, after, budget, seg_bytes,
                    segs, blocs,
                )
                file_live[f0] -= passed
                self.n_wheel -= passed
                if why == CALLER:
                    self._d_block = e if lst is None else lst[i]  # the entry the done cursor waits on
                if why != OTHER_FILE:
                    break
            # log.release and buckets.release of each body crossed, a count per segment
            self.log.release_counts(segs)
            for loc in blocs:
                self.buckets.release(split_ref(loc)[0])
            if ix is not None:
                nxt = self.d_nxt = ix.after(o)  # the true next offset (see _drain_slots)
                if why != END:
                    self.d_after = after
                    return
                self.d_after = last
            else:
                self.d_after = after
                self.d_nxt = nxt
                if why != END:
                    return
            if k == self.s_k and o >= self.s_o:
                return  # send is still in this pass: more entries may be appended to it
            if nxt >= 0:
                self.d_o, self.d_after, self.d_nxt = nxt, -1, -1
                continue
            self.occ_done[k % self.N] = 0
            if self.fm_after is None or k < self.fm_after:
                self.fm_after = k
            self.d_k, self.d_o, self.d_after, self.d_nxt = k + 1, -1, -1, -1

    def _handed(self, e: int, due: int, flags: int) -> bool:
        """Has the send cursor examined entry ``e``?"""
        if flags & LATE:
            return self.l_sent != -1 and e <= self.l_sent
        k = due // self.P
        if k != self.s_k:
            return k < self.s_k
        if self.s_o < 0:
            return False
        eo = due - k * self.P
        if eo != self.s_o:
            return eo < self.s_o
        return self.s_after != -1 and e <= self.s_after

    def _entry(self, ref: int) -> tuple[int, int, int, int, int] | None:
        """(index, due, loc, state, flags) of the timer-log entry behind a ref, if it is there."""
        if ref < 0:
            return None
        if ref & BUCKET_BIT:
            seq, off = split_ref(ref)
            b = self.buckets.get(seq)
            if b is None or off < HEADER_SIZE or off >= b.loaded:
                return None
            h = self.buckets.head(seq, off)
            if h is None or h[1] < 0:
                return None
            e = h[1]
        else:
            e = ref
        if e >= self.head or not self.tl.has(e):
            return None
        due, loc, _nx, state, flags, _lv, tag = self.tl.read(e)
        if tag != e & _TAG:
            return None
        if ref & BUCKET_BIT:
            if loc != ref:
                return None
        elif loc & BUCKET_BIT:
            return None  # a bucket record's ref is the bucket ref, not the entry index
        return e, due, loc, state, flags

    def ack(self, ref: int) -> None:
        if self._ack(ref):
            self._advance_done()

    def ack_many(self, refs: list[int]) -> None:
        """``_ack`` of each ref — the commit-log refs of one timer-log file at a time in one
        ``wl_ack`` call (C, or its Python twin), the rest one by one — then one advance of the
        done cursor if it waited on one of them."""
        wake = False
        head, pf, files = self.head, self.pf, self.tl.files
        ack, mark = self._wl_ack, self.tl.mark
        args = (self.P, self.s_k, self.s_o, self.s_after, self.l_sent, self._d_block, self.l_head)
        j, n = 0, len(refs)
        while j < n:
            ref = refs[j]
            if ref < 0 or ref >= head:
                if ref >= 0 and ref & BUCKET_BIT and self._ack(ref):
                    wake = True
                j += 1
                continue
            f0 = ref - ref % pf
            mf = files.get(f0)
            if mf is None:
                j += 1
                continue
            j, lo, hi, w = ack(mf.buf, self.tl.hs, f0, pf, refs, j, head, *args)
            if hi >= 0:
                mark(f0, lo)
                mark(f0, hi)
            if w:
                wake = True
        if wake:
            self._advance_done()

    def _ack(self, ref: int) -> bool:
        """Mark the entry done; True if the done cursor waits on it (time to advance it)."""
        if ref < 0:
            return False
        if ref & BUCKET_BIT:
            ent = self._entry(ref)
            if ent is None:
                return False
            e = ent[0]
        else:
            e = ref
        if e >= self.head:
            return False
        if not self.tl.has(e):
            return False
        due, loc, _nx, state, flags, _lv, tag = self.tl.read(e)
        if tag != e & _TAG or state != PENDING or (loc != ref if ref & BUCKET_BIT else loc & BUCKET_BIT):
            return False
        if not self._handed(e, due, flags):
            return False
        self.tl.set_state(e, DONE)
        return e == self._d_block or e == self.l_head  # the done cursor waits on this one

    def cancel(self, ref: int) -> bool:
        if ref >= 0 and ref & BUCKET_BIT:
            seq, off = split_ref(ref)
            b = self.buckets.get(seq)
            if b is None or off < HEADER_SIZE or off >= b.size:
                return False
            if off >= b.loaded:  # still only in the bucket: the bucket entry carries the marker
                h = self.buckets.head(seq, off)
                if h is None or h[0] != PENDING:
                    return False
                self.buckets.set_state(seq, off, CANCELLED)
                return True
        ent = self._entry(ref)
        if ent is None:
            return False
        e, due, _loc, state, flags = ent
        if state != PENDING or self._handed(e, due, flags):
            return False
        self.tl.set_state(e, CANCELLED)
        return True

    def record(self, ref: int) -> Record | None:
        try:
            if ref >= 0 and ref & BUCKET_BIT:
                seq, off = split_ref(ref)
                b = self.buckets.get(seq)
                if b is None or off < HEADER_SIZE or off >= b.size:
                    return None
                if off >= b.loaded:
                    h = self.buckets.head(seq, off)
                    return self.buckets.read(seq, off) if h is not None and h[0] == PENDING else None
            ent = self._entry(ref)
            if ent is None or ent[3] != PENDING:
                return None
            if ent[0] < self._restored_head and self._dangles(ent[0], ent[1], ent[2]):
                return None
            return self._read(ent[2])
        except StoreError:
            return None  # a stale ref from before a restart pointing into rewritten space

    def next_due_ms(self) -> int | None:
        best: int | None = None
        e = self._late_next()
        if e != -1:
            best = self.tl.read(e)[0]
        if self.inited:
            c = self._slot_hint()
            if c is not None and (best is None or c < best):
                best = c
        m = self.buckets.min_due(self.window_ms)
        if m is not None and (best is None or m < best):
            best = m
        return best

    def _slot_hint(self) -> int | None:
        k = self.s_k
        sl = self._slot(k)
        if sl is not None:
            if self.s_o < 0:
                if self.occ_send[k % self.N]:
                    return k * self.P + sl[3]
            else:
                if self.s_after != sl[1]:
                    return k * self.P + self.s_o
                if self.s_nxt >= 0:
                    return k * self.P + self.s_nxt
        t = self._next_send(k)
        if t is None:
            return None
        st = self._slot(t)
        return t * self.P + (st[3] if st is not None else 0)

    # -- durability -----------------------------------------------------------------------------
    def flush(self) -> None:
        if self._new_dir:
            fsync_dir(self.partition_dir)
            self._new_dir = False
        self.slots.flush()
        self.tl.flush()
        self.buckets.flush()

    def trim(self) -> None:
        """Unmap the slot file's and the timer log's resident pages (the buckets are not mapped)."""
        self.slots.trim()
        self.tl.trim()

    def state(self) -> dict[str, Any]:
        # Non-empty slots finished so far are covered by this checkpoint once it is written.
        if self.fm_after is not None and (self.fm_before is None or self.fm_after < self.fm_before):
            self.fm_before = self.fm_after
        self.fm_after = None
        floor = self.head
        if self.d_o >= 0:
            sl = self._slot(self.d_k)
            if sl is not None and sl[0] < floor:
                floor = sl[0]
        for e in (self.l_head, self.l_sent):  # send follows l_sent's link: keep its file too
            if e != -1 and e < floor:
                floor = e
        self._snap_files = [f for f, live in self.file_live.items() if live <= 0 and f + self.pf <= floor]
        self._snap_buckets = self.buckets.deletable()
        return {
            "v": STATE_VERSION,
            "precision_ms": self.P,
            "window_ms": self.window_ms,
            "init": self.inited,
            "head": self.head,
            "files": {str(f): n for f, n in self.file_live.items()},
            "done": [self.d_k, self.d_o, self.d_after, self.d_nxt],
            "send": max(self.s_k, self.late_below),  # high-water mark: survives repeated restarts
            "late": [self.l_head, self.l_tail],
            "now": self.now_last,
            "n": [self.n_wheel, self.n_bucket],
            "buckets": self.buckets.state(),
        }

    def reclaim(self) -> None:
        """After a checkpoint: delete timer-log files and bucket files it no longer needs."""
        for f in self._snap_files:
            if self.file_live.get(f, 1) <= 0 and f + self.pf <= self.head:
                self.tl.drop(f)
                del self.file_live[f]
        for seq in self._snap_buckets:
            self.buckets.delete(seq)
        self._snap_files, self._snap_buckets = [], []
        self.fm_before = None

    def restore(self, state: dict[str, Any] | None) -> None:
        if not state:
            self._wipe()
            return
        if int(state.get("v", 0)) != STATE_VERSION:
            raise StoreError(f"unsupported timer-wheel checkpoint version {state.get('v')}")
        p, w = int(state["precision_ms"]), int(state["window_ms"])
        if (p, w) != (self.P, self.window_ms):
            raise GeometryMismatch(
                f"the checkpoint was written with wheel precision {p} ms and window {w} ms, but the configuration "
                f"says precision {self.P} ms and window {self.window_ms} ms"
            )
        self._reset()
        self.inited = bool(state["init"])
        self.head = self._restored_head = int(state["head"])
        files = {int(k): int(v) for k, v in state["files"].items()}
        for f in list(self.tl.files):
            if f not in files:
                self.tl.drop(f)  # created after the checkpoint
        for f, live in files.items():
            if f in self.tl.files:
                self.file_live[f] = live
            elif live > 0 and f < self.head:
                raise StoreError(f"{self.tl.dir}: timer-log file {f} is missing but holds {live} pending entries")
        self.d_k, self.d_o, self.d_after, self.d_nxt = (int(x) for x in state["done"])
        self.s_k, self.s_o, self.s_after, self.s_nxt = self.d_k, self.d_o, self.d_after, self.d_nxt
        if self.inited:
            self.late_below = int(state.get("send", self.d_k))
        self.l_head, self.l_tail = (int(x) for x in state["late"])
        self.l_sent = -1
        self.now_last = int(state["now"])
        self.n_wheel, self.n_bucket = (int(x) for x in state["n"])
        self.buckets.restore(state.get("buckets"))
        if self.slots.created and self.n_wheel > 0:
            raise StoreError(f"{self.slots.path} is missing but the checkpoint names {self.n_wheel} pending entries")
        self._repair()
        if self.d_o >= 0 and self._slot(self.d_k) is None:
            raise StoreError(f"timer wheel: the checkpoint's done cursor is in slot {self.d_k}, which is empty")

    def _repair(self) -> None:
        """Rebuild the occupancy flags for the ring ``[done, done + slots)`` and cut every chain
        back to the entries the checkpoint covers (those before ``head``)."""
        n, p, head, lo = self.N, self.P, self.head, self.d_k
        mv = self.slots.buf[HEADER_SIZE : HEADER_SIZE + n * SLOT_SIZE]
        q = mv.cast("q")
        times, firsts, lasts, cms = q[0::4].tolist(), q[1::4].tolist(), q[2::4].tolist(), q[3::4].tolist()
        q.release()
        mv.release()
        for r in [r for r, v in enumerate(cms) if v & 0xFFFFFFFF]:
            t = times[r]
            if t % p:
                continue
            k = t // p
            if k < lo:
                continue  # a previous lap's slot: its time never comes again, it reads as empty
            if k >= lo + n or k % n != r:
                # Ahead of the restored ring: written after the checkpoint (before it, the ring
                # ended at done + slots). Cleared, or it would look valid once the window got there.
                self.slots.write(r, 0, 0, 0, 0, 0)
                continue
            if lasts[r] >= head:
                if firsts[r] >= head:
                    self.slots.write(r, 0, 0, 0, 0, 0)  # created after the checkpoint
                    continue
                self._cut_chain(r, k, firsts[r])
            self.occ_send[r] = 1
            self.occ_done[r] = 1
        self._occ_memo = None

    def _cut_chain(self, r: int, k: int, first: int) -> None:
        head, base = self.head, k * self.P
        e, count, min_off = first, 0, self.P
        while True:
            due, _loc, nx, _st, _f, _lv, tag = self.tl.read(e)
            if tag != e & _TAG:
                raise StoreError(f"timer wheel: slot {k} links to entry {e}, which holds another entry")
            count += 1
            if due - base < min_off:
                min_off = due - base
            if nx < 0 or nx >= head:
                break
            e = nx
        self.slots.write(r, base, first, e, count, min_off)

    def _wipe(self) -> None:
        """No checkpoint: the commit log replays everything, so start the wheel empty."""
        self._reset()
        for f in list(self.tl.files):
            self.tl.drop(f)
        if not self.slots.created:
            path = self.slots.path
            self.slots.close()
            os.unlink(path)
            self.slots = SlotFile(path, self.P, self.N)
        self.buckets.restore(None)

    # -- damage ---------------------------------------------------------------------------------
    def arm(self, head: int, report: Callable[[int, int, str], None] | None = None) -> None:
        """Called by recovery after the replay with the checkpointed log ``head``: arms the check
        of each restored entry at its first read (see the module docstring); dangling entries and
        damaged bucket records go to ``report(ref, locator, reason)``. O(1): ``restore`` has
        already checked that the files holding restored entries exist."""
        self.log_head = head
        if report is not None:
            self.report = report

    def _collect(self, ref: int, loc: int, reason: str) -> None:
        self.dropped.append((ref, loc, reason))

    def _fault(self, due: int, loc: int) -> str:
        """Why a restored entry (``due``, ``loc``) does not match its body; "" if it does."""
        if loc & BUCKET_BIT:
            seq, off = split_ref(loc)
            b = self.buckets.get(seq)
            if b is None or off >= b.size or self.buckets.head(seq, off) is None:
                return f"bucket entry {seq}:{off} does not exist"
            try:
                rec = self.buckets.read(seq, off)
            except StoreError as ex:
                return str(ex)
            if rec.due_ms != due:
                return f"bucket record due {rec.due_ms} does not match the entry's {due}"
            return ""
        return self.log.fault(loc, due, self.log_head)

    def _dangles(self, e: int, due: int, loc: int) -> bool:
        """Check pending restored entry ``e`` before its first use; drop and report it if it
        dangles."""
        reason = self._fault(due, loc)
        if not reason:
            return False
        self.tl.set_state(e, DROPPED)
        self.report(loc if loc & BUCKET_BIT else e, loc, reason)
        return True

    def validate(self, head: int) -> list[tuple[int, int, str]]:
        """The check of every pending entry restored from the checkpoint at once (recovery checks
        each one at its first read instead); ``head`` is the checkpointed log head. Returns the
        dropped ones as ``(ref, locator, reason)`` (not passed to ``report``). O(pending): for
        tests and tools."""
        self.log_head = head
        found: list[tuple[int, int, str]] = []
        lim = self._restored_head
        e = self.l_head
        while e != -1 and e < lim:
            self._check_entry(e, found)
            e = -1 if e == self.l_tail else self.tl.next_of(e)
        if self.inited:
            k = self.d_k
            while True:
                sl = self._slot(k)
                if sl is not None and self.occ_done[k % self.N]:
                    e, last = sl[0], sl[1]
                    while e != -1 and e < lim:
                        self._check_entry(e, found)
                        e = -1 if e == last else self.tl.next_of(e)
                nk = self._next_occ(self.occ_done, k)
                if nk is None or nk >= self.d_k + self.N:
                    break
                k = nk
        return found

    def _check_entry(self, e: int, found: list[tuple[int, int, str]]) -> None:
        due, loc, _nx, state, _f, _lv, _t = self.tl.read(e)
        if state != PENDING:
            return
        reason = self._fault(due, loc)
        if reason:
            self.tl.set_state(e, DROPPED)
            found.append((loc if loc & BUCKET_BIT else e, loc, reason))

    # -- introspection --------------------------------------------------------------------------
    def where(self, ref: int) -> str | None:
        """Which tier holds a not-yet-done ref: "slot", "late" or "bucket" (None when done or
        unknown). For tests and the inspect command; not on the hot path."""
        if ref >= 0 and ref & BUCKET_BIT:
            seq, off = split_ref(ref)
            b = self.buckets.get(seq)
            if b is None or off < HEADER_SIZE or off >= b.size:
                return None
            if off >= b.loaded:
                h = self.buckets.head(seq, off)
                return "bucket" if h is not None and h[0] != CANCELLED else None
        ent = self._entry(ref)
        if ent is None or ent[3] >= DONE:
            return None
        return "late" if ent[4] & LATE else "slot"

    def pending(self) -> dict[str, int]:
        return {"wheel": self.n_wheel, "bucket": self.n_bucket}

    def disk_bytes(self) -> int:
        return self.slots.size() + self.tl.disk_bytes() + self.buckets.disk_bytes()

    def close(self) -> None:
        self.slots.close()
        self.tl.close()
        self.buckets.close()
