"""The near window of the timer wheel: the slot ring, the late chain, and the two cursors that
walk them (``due`` hands records out, ``ack`` finishes them). The ring holds no Python object per
record: its entries are in the slot file and the timer log (``layout``).

- **slots** (``layout.SlotFile``): one 32-byte slot per ``precision`` ms of the near window, a ring
  of ``window / precision`` positions. Slot ``k`` holds the records due in
  ``[k * precision, (k + 1) * precision)`` as a chain of timer-log entries in arrival order.
- **late chain**: records that arrive already due for a slot the reader has passed go to one
  arrival-ordered chain, handed out ahead of the slots (they are due; everything still in a slot
  is due later than they are).

Reading. The *send* cursor walks the slots in order. Within a slot it makes one pass per distinct
due offset (``due_ms - slot start``), smallest first, each pass walking the chain in arrival order
and handing out the entries with that offset: so a slot comes out ordered by due ms, ties by
arrival, and a pass for offset ``o`` only starts once ``now >= slot start + o`` — every record is
handed out at or after its own due ms, never early, and without waiting for the end of its slot.
Passes cost one chain walk per distinct offset (at most ``precision`` of them); a pass resumes
from its cursor on the next call, so a million-record slot is read in ``limit``-sized chunks with
flat memory. The reader never starts a slot at or beyond the start of a bucket that still holds
records not linked in: loading (``sidecar.wheel.loading``) stays ahead of reading, so bucket
records land in their slots.

Finishing. ``ack`` marks an entry done (its state byte, which the timer log keeps in a dense array
apart from the entries: acks come in due order, entries were written in arrival order, and one byte
per entry keeps the scattered ack writes on few pages; see ``layout``). The *done* cursor follows
the send cursor over entries whose state is done (acks arrive out of order; done only crosses a
gap-free prefix, like the levels scheduler) and releases each record's commit-log slot — or its
bucket's live count — as it passes. Only done is checkpointed: after a crash everything from done
on is read again, entries already done are skipped (not redelivered), so duplicates are limited to
records that were in flight. The done cursor names the slot, the pass and the chain position, so a
crash in the middle of a million-record slot resumes there.

The ring's guard. A ring position is reused only for slots beyond ``guard + slots``, where
``guard`` is the lowest slot a restore from the last checkpoint could still need (the checkpointed
done slot, or the first non-empty slot finished since: ``fm_after`` here, moved to ``fm_before`` by
the checkpoint's snapshot and dropped by its reclaim, ``sidecar.wheel.recovery``), so a crash never
finds a needed slot overwritten.

The per-entry loops (a pass, the done cursor's pass, a slot index's build, the batch ack, the
intake's link) are ``layout``'s ``wl_*`` functions, run in C (``sidecar._native``) one timer-log
file per call; this module keeps the cursors, the rare cases and every decision about them. Its
underscore names are the wheel package's own interface: ``loading`` and ``recovery`` use them,
nothing outside ``sidecar.wheel`` does.

Nothing here reads a clock: time comes in as ``now_ms``.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right, insort
from collections.abc import Callable
from pathlib import Path

from sidecar.store import native_args
from sidecar.store.buckets import BUCKET_BIT, BucketStore, split_ref
from sidecar.store.codec import NATIVE, Record
from sidecar.store.codec import native as _native
from sidecar.store.log import CommitLog
from sidecar.store.mapped import HEADER_SIZE, StoreError
from sidecar.store.native_args import WlAck, WlDone, WlLink, WlSend
from sidecar.wheel.layout import (
    CALLER,
    DONE,
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

_NEG = -(1 << 62)
_SLOT, _LATE, _BUCKET = 0, 1, 2  # where a record goes (_destination): its slot, the late chain, beyond the ring
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


class Ring:
    """The slot file, the timer log and the cursors over them (see the module docstring), and the
    bucket store the ring reads and releases bodies from. The scheduler is a ``Ring`` rather than
    holding one: this state is read and written per record (``add``, the C intake's
    ``intake_begin`` and ``intake_end``, ``due``, ``ack``), and a ring one hop away behind
    delegating methods cost ``add`` ~0.1 µs (~8 %) more per record, measured. It is one job
    although it is long: the appends and the send and done cursors are one walk over the same
    slots and timer-log entries, and every method reads or moves the cursors, the occupancy maps
    and the guard together (a restore, ``recovery``, resets them as one); the per-entry loops are
    already apart, in C (``layout``'s ``wl_*``), and so are loading and recovery."""

    # The check of a pending entry restored from the checkpoint (index below ``_restored_head``)
    # at its first read, ``(entry, due, loc)`` -> True if its body dangles (the entry is then
    # dropped, not handed out): set by the owner (``recovery.Damage.dangles``).
    _dangles: Callable[[int, int, int], bool]

    def __init__(
        self,
        directory: Path,
        log: CommitLog,
        *,
        precision_ms: int,
        window_ms: int,
        entries_per_file: int,
        scan_factor: int,
        done_batch: int,
        index_max: int,
        native: bool,
    ) -> None:
        self.log = log
        self.P = precision_ms
        self.N = window_ms // precision_ms
        self.window_ms = window_ms
        self.dir = directory / "wheel"
        self._new_dir = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.partition_dir = directory
        self.slots = SlotFile(self.dir / "slots.whl", self.P, self.N)
        self.tl = TimerLog(self.dir / "tl", entries_per_file, log.pages)
        self.pf = entries_per_file
        self.buckets = BucketStore(directory / "buckets")
        self.scan_factor = scan_factor
        self.done_batch = done_batch
        self.index_max = index_max
        # the C record writes (sidecar._native), or their Python twins in layout.py
        nat = self.native = native and NATIVE
        self._wl_link = _native.wl_link if nat else wl_link
        self._wl_send = _native.wl_send if nat else wl_send
        self._wl_done = _native.wl_done if nat else wl_done
        self._wl_read = _native.wl_read if nat else wl_read
        self._wl_group = _native.wl_group if nat else wl_group
        self._wl_ack = _native.wl_ack if nat else wl_ack
        # their argument objects, kept: a call sets only the fields that changed (native_args.py)
        impl = _native if nat else None
        self._link_a: WlLink = native_args.make(WlLink, impl)
        self._send_a: WlSend = native_args.make(WlSend, impl)
        self._done_a: WlDone = native_args.make(WlDone, impl)
        self._ack_a: WlAck = native_args.make(WlAck, impl)
        for a in (self._link_a, self._send_a, self._done_a, self._ack_a):
            a.hs, a.nent = self.tl.hs, self.pf  # the timer-log files' geometry
        self.occ_send = bytearray(self.N)  # 1: slot at this position still to be read by send
        self.occ_done = bytearray(self.N)  # 1: slot at this position still to be passed by done
        self._budget = 0
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
        self.occ_send[:] = bytes(self.N)
        self.occ_done[:] = bytes(self.N)
        self._occ_memo: tuple[int, int | None] | None = None  # see _next_send
        self._six: _SlotIndex | None = None  # slot index of the send cursor's slot
        self._dix: _SlotIndex | None = None  # ... and of the done cursor's

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

    # -- linking entries ------------------------------------------------------------------------
    def _destination(self, due: int) -> int:
        """Where the ring puts a record due at ``due``: its slot, the late chain, or nowhere
        (``_BUCKET``: beyond the ring, it waits in its bucket)."""
        kd = due // self.P
        if kd < self.late_below:
            return _LATE
        if kd > self.s_k or (kd == self.s_k and (self.s_o < 0 or due - kd * self.P >= self.s_o)):
            if kd >= self._limit_slot():
                # Beyond the ring, even if already due (the reader is more than a window behind):
                # its bucket keeps it in due order behind the backlog instead of jumping the queue.
                return _BUCKET
            return _SLOT
        return _LATE  # its slot is behind the reader: it is already due

    def _new_entry(self, due: int, loc: int, level: int, flags: int) -> int:
        idx = self.head
        first = idx - idx % self.pf
        if self.tl.append(idx, due, loc, flags, level):
            self.file_live[first] = 0
        self.file_live[first] = self.file_live.get(first, 0) + 1
        self._appended(idx)
        return idx

    def _appended(self, idx: int) -> None:
        """Entry ``idx`` was appended at the head: move past it, and ask for the pages ahead."""
        self.head = idx + 1
        self.n_wheel += 1
        if self.tl.ahead.near(idx + 1):
            self.tl.prefault(idx + 1)

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
        a = self._link_a
        a.f0, a.idx, a.due, a.loc, a.level, a.slot_off, a.slot_time = f0, idx, due, loc, level, soff, kd * P
        last = self._wl_link(mf.buf, self.slots.buf, a)
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
        self._appended(idx)
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
        a = self._send_a
        a.last, a.base, a.o, a.vlim = last, now, -1, vlim
        while e != -1:
            f0 = e - e % pf
            cbuf = files[f0].buf
            a.f0, a.i, a.e, a.nxt, a.after, a.room, a.budget = f0, 0, e, -1, sent, room, budget
            why = send(cbuf, None, pend, a)
            e, sent, budget, room = a.e, a.after, a.budget, a.room
            if a.hi >= 0:
                mark(f0, a.lo)
                mark(f0, a.hi)
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
            a = self._send_a
            a.last, a.base, a.o, a.vlim = last, base, o, vlim
            why = END
            while True:  # one call per timer-log file, and one per restored entry to check
                x = e if lst is None else (lst[i] if i < n else -1)
                if x == -1:
                    why = END
                    break
                f0 = x - x % pf
                cbuf = files[f0].buf
                a.f0, a.i, a.e, a.nxt, a.after, a.room, a.budget = f0, i, e, nxt, after, room, budget
                why = send(cbuf, lst, pend, a)
                i, e, after, nxt, budget, room = a.i, a.e, a.after, a.nxt, a.budget, a.room
                if a.hi >= 0:
                    mark(f0, a.lo)
                    mark(f0, a.hi)
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
        a = self._done_a
        a.last, a.base, a.o, a.seg_bytes = sent, 0, -1, self.log.segment_bytes
        while e != -1:
            f0 = e - e % pf
            a.f0, a.i, a.e, a.nxt, a.after, a.budget = f0, 0, e, -1, after, budget
            why = walk(files[f0].buf, None, segs, blocs, a)
            e, after, budget, passed = a.e, a.after, a.budget, a.passed
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
            a = self._done_a
            a.last, a.base, a.o, a.seg_bytes = last, base, o, seg_bytes
            why = END
            while True:  # one call per timer-log file
                x = e if lst is None else (lst[i] if i < n else -1)
                if x == -1:
                    why = END
                    break
                f0 = x - x % pf
                a.f0, a.i, a.e, a.nxt, a.after, a.budget = f0, i, e, nxt, after, budget
                why = walk(files[f0].buf, lst, segs, blocs, a)
                i, e, after, nxt, budget, passed = a.i, a.e, a.after, a.nxt, a.budget, a.passed
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
        a = self._ack_a
        a.head, a.P, a.s_k, a.s_o, a.s_after = head, self.P, self.s_k, self.s_o, self.s_after
        a.l_sent, a.wait_a, a.wait_b = self.l_sent, self._d_block, self.l_head
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
            a.f0, a.j = f0, j
            if ack(mf.buf, refs, a):
                wake = True
            j = a.j
            if a.hi >= 0:
                mark(f0, a.lo)
                mark(f0, a.hi)
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

    # -- hints ----------------------------------------------------------------------------------
    def _next_due(self) -> int | None:
        """The earliest due time not yet handed out on the late chain or in the slots."""
        best: int | None = None
        e = self._late_next()
        if e != -1:
            best = self.tl.read(e)[0]
        if self.inited:
            c = self._slot_hint()
            if c is not None and (best is None or c < best):
                best = c
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
