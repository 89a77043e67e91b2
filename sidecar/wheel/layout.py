"""On-disk layout of the timer wheel: the slot file and the timer log (RIP-43 ``TimerWheel`` and
``TimerLog``, seeds 000 and 002). Both are preallocated ``MappedFile``s with the store's
self-checking 64-byte header, all integers little-endian.

Slot file ``<partition-dir>/wheel/slots.whl`` — one 32-byte slot per ``precision`` ms of the near
window (``window / precision`` slots; 10 ms x 1 h = 360,000 slots = 11.5 MB, sparse)::

    header  magic b"KDSWHL\\0\\1", version 1, geom_a = precision_ms, geom_b = slot count, base 0
    slot    0   i64  time_ms   start of the slot (k * precision); the slot holds due times
                               [time_ms, time_ms + precision). Slot k lives at ring position
                               k % slots; a position whose time_ms is not the expected one is a
                               previous lap's slot and reads as empty
            8   i64  first     first timer-log entry of the slot's chain (oldest)
            16  i64  last      last timer-log entry of the chain (newest): appends link here
            24  u32  count     entries appended to the chain (0: empty)
            28  u16  min_off   smallest ``due_ms - time_ms`` in the chain (where the first pass starts)
            30  u16  reserved (0)

Timer log ``<partition-dir>/wheel/tl/<first-index>.tl`` — fixed 32-byte entries addressed by a
64-bit index that grows for the life of the store; index ``i`` lives in the file whose first
index is ``i - i % entries_per_file``. Each entry's *state* is kept apart from the entry, one byte
per entry in a dense array ahead of the entries::

    header  magic b"KDSWTL\\0\\1", version 2, geom_a = 32 (entry size), geom_b = entries per file,
            base = first index
    states  at HEADER_SIZE: entries_per_file bytes, byte ``i - first`` the state of entry ``i``:
            0 pending, 1 cancelled (RIP-43 ``MAGIC_DELETE``), 2 done, 3 dropped (dangling: its
            body failed the check)
    entries at HEADER_SIZE + entries_per_file (``TimerLog.hs``), entry ``i`` at
            ``hs + (i - first) * 32``:
    entry   0   i64  due_ms    the committed (requested) due time, exact to the ms
            8   i64  loc       where the body is: a commit-log position, or a bucket ref (bit 62
                               set: bucket sequence number and offset, see ``sidecar.store.buckets``)
            16  i64  next      next entry of the same chain (-1: none yet). RIP-43 links
                               backwards (``prev_pos``); a forward link, patched into the previous
                               tail on append, lets a million-entry slot be read in arrival order
                               in bounded chunks without walking it backwards
            24  u8   reserved (0; version 1 kept the state here)
            25  u8   flags     bit 0: the entry is on the late chain, not in a slot
            26  u16  level     the record's level (0 in wheel mode; kept for the record)
            28  u32  tag       low 32 bits of the entry's own index: a cheap check that a link
                               led to the entry it meant

Why the states are apart (version 2). Entries are written in arrival order, but acks come in due
order: with delays spread over seconds, the entries acked in one checkpoint interval are scattered
over every page of the last seconds of log. Each checkpoint's sync write-protects the pages it
wrote back, so every ack into an entry took a page fault (one per record, measured) and the sync
wrote those pages again. One state byte per entry packs the same acks into 1/32 of the pages. A
version-1 file is refused at open (``GeometryMismatch``): let the old build drain its store, then
start this one on an empty data directory.
"""

from __future__ import annotations

import os
import struct
from array import array
from pathlib import Path
from typing import Any

from sidecar.store import codec
from sidecar.store import native_layouts as _layouts
from sidecar.store.buckets import BUCKET_BIT
from sidecar.store.codec import Record
from sidecar.store.mapped import (
    ENTRIES_AHEAD,
    ENTRIES_AHEAD_LOW,
    HEADER,
    HEADER_SIZE,
    Ahead,
    GeometryMismatch,
    MappedFile,
    PageWorker,
    Spare,
    StoreError,
    discard_mapped,
    fsync_dir,
    headerless,
    unborn,
)
from sidecar.store.native_args import WlAck, WlDone, WlLink, WlSend

SLOT_MAGIC = b"KDSWHL\x00\x01"
TL_MAGIC = b"KDSWTL\x00\x01"
VERSION = 1  # the slot file's
TL_VERSION = 2  # the timer log's: states apart from the entries

SLOT = _layouts.WHEEL_SLOT
SLOT_SIZE = SLOT.size
assert SLOT_SIZE == 32

ENTRY = _layouts.WHEEL_ENTRY
ENTRY_SIZE = ENTRY.size
assert ENTRY_SIZE == 32
_NEXT = struct.Struct("<q")
_DUE = struct.Struct("<q").unpack_from
_WALK = struct.Struct("<qqq").unpack_from  # (due, loc, next)
_ACK = struct.Struct("<qq9xBxxI").unpack_from  # (due, loc, flags, tag)

PENDING, CANCELLED = _layouts.WHEEL_PENDING, _layouts.WHEEL_CANCELLED
DONE, DROPPED = _layouts.WHEEL_DONE, _layouts.WHEEL_DROPPED
LATE = _layouts.WHEEL_LATE



def wl_link(tl_buf: memoryview, slot_buf: memoryview, a: WlLink) -> int:
    """Write entry ``a.idx`` (pending, no next, tagged) into the timer-log file whose first index is
    ``a.f0`` (``a.nent`` entries, the first at byte ``a.hs``) and append it to the chain
    of the slot at byte ``a.slot_off`` of ``slot_buf`` starting at ``a.slot_time``. Returns -1
    if the slot held no such chain (it now holds ``idx`` alone), else the chain's previous tail,
    whose link is patched here when it lives in the same file (``tail >= f0``): the caller
    patches one in an older file and records what is dirty.

    The reference for ``sidecar._native.wl_link`` (the intake's writes in one call)."""
    hs, tl_first, nent, idx, due, loc = a.hs, a.f0, a.nent, a.idx, a.due, a.loc
    flags, level, slot_off, slot_time = a.flags, a.level, a.slot_off, a.slot_time
    off = due - slot_time
    if not 0 <= off <= 0xFFFF or not tl_first <= idx < tl_first + nent or hs < nent:
        raise ValueError("wl_link: entry or slot out of range")
    ENTRY.pack_into(
        tl_buf, hs + (idx - tl_first) * ENTRY_SIZE, due, loc, -1, 0, flags, level & 0xFFFF, idx & 0xFFFFFFFF
    )
    tl_buf[hs - nent + idx - tl_first] = PENDING
    t, first, last, count, min_off, _r = SLOT.unpack_from(slot_buf, slot_off)
    if count and t == slot_time:
        if tl_first <= last < idx:
            _NEXT.pack_into(tl_buf, hs + (last - tl_first) * ENTRY_SIZE + 16, idx)
        SLOT.pack_into(slot_buf, slot_off, t, first, idx, count + 1, off if off < min_off else min_off, 0)
        return int(last)
    SLOT.pack_into(slot_buf, slot_off, slot_time, idx, idx, 1, off, 0)
    return -1


# -- the wheel's per-entry walks -----------------------------------------------------------------
# The reader's and the done cursor's passes, the slot index's build and the batch ack, each over
# the entries of ONE timer-log file (``f0 .. f0 + nent - 1``, mapped at ``buf``, the first entry at
# byte ``hs``, the state of entry ``x`` at byte ``hs - nent + x - f0``): the caller
# switches files between calls, and handles the rare entries that need Python (a restored entry
# whose body must be checked, a bucket ref). A pass is either *indexed* (``lst``: the slot
# index's entries of the pass's offset, read from position ``i``) or a *chain walk* (``lst`` is
# None: from entry ``e``, -1 when nothing is left, through the slot's ``last``; entries of other
# offsets are skipped, noting the smallest one above ``o`` in ``nxt``; with ``o`` < 0 the walk
# is of the late chain, whose entries all belong to its one pass whatever their due times). Each
# returns ``why`` it stopped: 0 the pass's end, 1 out of room or budget, 2 the next entry is in
# another file, 3 the next entry needs the caller (see each function). These functions are the
# reference for their C twins in ``sidecar._native``.
END, EXHAUSTED, OTHER_FILE, CALLER = 0, 1, 2, 3


def wl_send(buf: memoryview, lst: Any, pend: list[tuple[int, int]], a: WlSend) -> int:
    """The send cursor's pass over offset ``o`` of the slot starting at ``base`` (``a``'s fields
    here and below): append
    ``(entry, loc)`` of each pending entry to ``pend`` (at most ``room``), flip cancelled ones to
    done (the done cursor releases them), skip done and dropped ones; one ``budget`` unit per entry
    examined. Stops (why 3) before a pending entry below ``vlim``: restored from the checkpoint,
    its body is checked first. On the late chain (``o`` < 0, ``base`` the current time) it also
    stops (why 3) before a pending entry due after ``base``: only after the clock stepped back,
    and never handed out early. Returns why; moves ``i, e, after, nxt, budget, room, lo, hi``:
    the position reached, the last entry examined, and the byte range of the states flipped here
    (``hi`` -1: none)."""
    hs, f0, nent, i, e, last, base, o = a.hs, a.f0, a.nent, a.i, a.e, a.last, a.base, a.o
    nxt, after, room, budget, vlim = a.nxt, a.after, a.room, a.budget, a.vlim
    lo = hi = -1
    end = f0 + nent
    n = -1 if lst is None else len(lst)
    while True:
        if lst is not None:
            if i >= n:
                why = END
                break
            x = lst[i]
        else:
            if e == -1:
                why = END
                break
            x = e
        if room <= 0 or budget <= 0:
            why = EXHAUSTED
            break
        if not f0 <= x < end:
            why = OTHER_FILE
            break
        due, loc, nx = _WALK(buf, hs + (x - f0) * ENTRY_SIZE)
        soff = hs - nent + x - f0
        state = buf[soff]
        eo = due - base
        if lst is None and o >= 0 and eo != o:
            if eo > o and (nxt < 0 or eo < nxt):
                nxt = eo
        elif state == PENDING:
            if x < vlim or (o < 0 and due > base):
                why = CALLER
                break
            pend.append((x, loc))
            room -= 1
        elif state == CANCELLED:
            buf[soff] = DONE
            if lo < 0 or soff < lo:
                lo = soff
            if soff > hi:
                hi = soff
        budget -= 1
        after = x
        if lst is not None:
            i += 1
        else:
            e = -1 if x == last else nx
    a.i, a.e, a.after, a.nxt, a.budget, a.room, a.lo, a.hi = i, e, after, nxt, budget, room, lo, hi
    return why


def wl_read(
    segments: dict[int, Any], seg_bytes: int, pend: list[tuple[int, int]], i: int, out: list[tuple[int, Record]]
) -> int:
    """Append ``(entry, record)`` to ``out`` for ``pend[i]``, ``pend[i + 1]``, ... (the pairs
    ``wl_send`` collected), each record decoded from its commit-log segment (``segments`` maps a
    segment number to its mapped file); stop at the first pair the caller must read itself (a
    bucket ref, a missing segment, a record that does not decode) and return its position, or
    ``len(pend)``."""
    n = len(pend)
    while i < n:
        x, loc = pend[i]
        if loc < 0 or loc & BUCKET_BIT:
            break
        seg = segments.get(loc // seg_bytes)
        if seg is None:
            break
        try:
            rec = codec.decode(seg.buf, loc % seg_bytes, verify=False)
        except codec.CorruptRecord:
            break
        out.append((x, rec))
        i += 1
    return i


def wl_done(buf: memoryview, lst: Any, segs: dict[int, int], blocs: list[int], a: WlDone) -> int:
    """The done cursor's pass over offset ``o`` (``a``'s fields here and below): cross the entries
    whose state is done or dropped, one ``budget`` unit each, and collect what to release — per
    commit-log segment (``loc // seg_bytes``) a count in ``segs``, bucket refs in ``blocs``; a
    dropped entry's body is not released. Stops (why 3) at an entry of the pass still pending or
    cancelled: the one done waits on. Returns why; moves ``i, e, after, nxt, budget, passed``."""
    hs, f0, nent, i, e, last, base, o = a.hs, a.f0, a.nent, a.i, a.e, a.last, a.base, a.o
    nxt, after, budget, seg_bytes = a.nxt, a.after, a.budget, a.seg_bytes
    end = f0 + nent
    n = -1 if lst is None else len(lst)
    passed = 0
    while True:
        if lst is not None:
            if i >= n:
                why = END
                break
            x = lst[i]
        else:
            if e == -1:
                why = END
                break
            x = e
        if budget <= 0:
            why = EXHAUSTED
            break
        if not f0 <= x < end:
            why = OTHER_FILE
            break
        due, loc, nx = _WALK(buf, hs + (x - f0) * ENTRY_SIZE)
        state = buf[hs - nent + x - f0]
        eo = due - base
        if lst is None and o >= 0 and eo != o:
            if eo > o and (nxt < 0 or eo < nxt):
                nxt = eo
        else:
            if state < DONE:
                why = CALLER
                break
            budget -= 1
            passed += 1
            if state == DROPPED:
                pass
            elif loc & BUCKET_BIT:
                blocs.append(loc)
            else:
                g = loc // seg_bytes
                segs[g] = segs.get(g, 0) + 1
        after = x
        if lst is not None:
            i += 1
        else:
            e = -1 if x == last else nx
    a.i, a.e, a.after, a.nxt, a.budget, a.passed = i, e, after, nxt, budget, passed
    return why


def wl_group(
    buf: memoryview, hs: int, f0: int, nent: int, e: int, last: int, base: int
) -> tuple[dict[int, bytes], int]:
    """Walk the chain from entry ``e`` through ``last`` while it stays in this file, grouping the
    entries by offset (``due - base``), in chain order: the slot index's build. Returns
    ``({offset: entries as native int64 bytes}, the next entry to walk)`` (-1: ``last`` reached)."""
    end = f0 + nent
    groups: dict[int, array[int]] = {}
    while e != -1 and f0 <= e < end:
        off = hs + (e - f0) * ENTRY_SIZE
        due, nx = _DUE(buf, off)[0], _NEXT.unpack_from(buf, off + 16)[0]
        g = groups.get(due - base)
        if g is None:
            groups[due - base] = array("q", (e,))
        else:
            g.append(e)
        e = -1 if e == last else nx
    return {k: v.tobytes() for k, v in groups.items()}, e


def wl_ack(buf: memoryview, refs: list[int], a: WlAck) -> bool:
    """``ack`` of ``refs[j:]`` (``a``'s fields here and below) while they are commit-log refs of this
    file below ``head``: an entry whose tag matches, still pending, not a bucket body, and
    already examined by the send cursor (``s_k, s_o, s_after``; ``l_sent`` for the late chain)
    becomes done; the others are ignored. Stops at the first ref it does not cover (another
    file, a bucket ref, out of range): the caller deals with that one. Returns whether one of
    the entries flipped was ``wait_a`` or ``wait_b`` (the entries the done cursor waits on);
    moves ``j`` (the position reached) and ``lo, hi`` (the byte range of the states flipped;
    ``hi`` -1: none)."""
    hs, f0, nent, j, head, P = a.hs, a.f0, a.nent, a.j, a.head, a.P
    s_k, s_o, s_after, l_sent, wait_a, wait_b = a.s_k, a.s_o, a.s_after, a.l_sent, a.wait_a, a.wait_b
    lo = hi = -1
    wake = False
    end = min(f0 + nent, head)
    n = len(refs)
    while j < n:
        e = refs[j]
        if not f0 <= e < end or e < 0:
            break
        j += 1
        due, loc, flags, tag = _ACK(buf, hs + (e - f0) * ENTRY_SIZE)
        soff = hs - nent + e - f0
        state = buf[soff]
        if tag != e & 0xFFFFFFFF or state != PENDING or loc & BUCKET_BIT:
            continue
        if flags & LATE:
            if l_sent == -1 or e > l_sent:
                continue
        else:
            k = due // P
            if k == s_k:
                if s_o < 0:
                    continue
                eo = due - k * P
                if eo > s_o or (eo == s_o and (s_after == -1 or e > s_after)):
                    continue  # not handed out yet
            elif k > s_k:
                continue
        buf[soff] = DONE
        if lo < 0 or soff < lo:
            lo = soff
        if soff > hi:
            hi = soff
        if e in (wait_a, wait_b):
            wake = True
    a.j, a.lo, a.hi = j, lo, hi
    return wake


class SlotFile:
    """The ring of slots. Refuses a file written with another precision or window."""

    def __init__(self, path: Path, precision_ms: int, slots: int) -> None:
        self.path = path
        self.precision = precision_ms
        self.n = slots
        size = HEADER_SIZE + slots * SLOT_SIZE
        if path.exists() and unborn(path):
            path.unlink()
        self.created = not path.exists()
        if not self.created:
            self._check_geometry(path, precision_ms, slots)
        self.f = MappedFile(
            path, magic=SLOT_MAGIC, version=VERSION, size=size, geom_a=precision_ms, geom_b=slots, base=0,
            create=self.created,
        )
        self.buf = self.f.buf
        self.dirty_lo = -1
        self.dirty_hi = -1
        self.dir_dirty = self.created

    @staticmethod
    def _check_geometry(path: Path, precision_ms: int, slots: int) -> None:
        """A clearer error than MappedFile's size check: name both precisions and windows."""
        fd = os.open(path, os.O_RDONLY)
        try:
            raw = os.pread(fd, HEADER_SIZE, 0)
        finally:
            os.close(fd)
        if len(raw) < HEADER_SIZE:
            raise StoreError(f"{path}: truncated slot file header")
        magic, _ver, _h, ga, gb, _base, _r, _crc = HEADER.unpack_from(raw, 0)
        if magic != SLOT_MAGIC:
            raise StoreError(f"{path}: not a timer-wheel slot file (magic {magic!r})")
        if (ga, gb) != (precision_ms, slots):
            raise GeometryMismatch(
                f"{path}: the timer wheel on disk has precision {ga} ms and window {ga * gb} ms ({gb} slots), "
                f"but the configuration says precision {precision_ms} ms and window {precision_ms * slots} ms "
                f"({slots} slots); pending records would land in the wrong slots. Keep the old "
                "--wheel-precision/--wheel-window until the partition drains, or move the data directory away"
            )

    def offset(self, pos: int) -> int:
        return HEADER_SIZE + pos * SLOT_SIZE

    def write(self, pos: int, time_ms: int, first: int, last: int, count: int, min_off: int) -> None:
        off = HEADER_SIZE + pos * SLOT_SIZE
        SLOT.pack_into(self.buf, off, time_ms, first, last, count, min_off, 0)
        if self.dirty_lo < 0 or off < self.dirty_lo:
            self.dirty_lo = off
        if off + SLOT_SIZE > self.dirty_hi:
            self.dirty_hi = off + SLOT_SIZE

    def flush(self) -> None:
        if self.dir_dirty:
            fsync_dir(self.path.parent)
            self.dir_dirty = False
        if self.dirty_lo >= 0:
            self.f.flush(self.dirty_lo, self.dirty_hi)
            self.dirty_lo = self.dirty_hi = -1

    def trim(self) -> None:
        """Unmap the resident pages from this process (``MappedFile.drop_pages``)."""
        self.f.drop_pages()

    def size(self) -> int:
        return self.f.size

    def close(self) -> None:
        self.buf = memoryview(b"")
        self.f.close()


class TimerLog:
    """Rolling files of fixed-size entries. A file is deleted (by the scheduler, after a
    checkpoint) once every entry in it has been passed by the done cursor."""

    def __init__(self, directory: Path, entries_per_file: int, pages: PageWorker | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.per_file = entries_per_file
        self.hs = HEADER_SIZE + entries_per_file  # the first entry's byte offset, after the states
        # the entries' pages ahead of the head faulted in by the page thread (a first store into a
        # page of the sparse file is a major fault); as a level queue does (sidecar/levels/queue.py)
        self.ahead = Ahead(pages, ENTRIES_AHEAD, ENTRIES_AHEAD_LOW)
        self.spare = Spare(pages, self._create, discard_mapped)  # the next file, created on the page thread
        self.file_size = self.hs + entries_per_file * ENTRY_SIZE
        self.files: dict[int, MappedFile] = {}
        self.dirty: dict[int, list[int]] = {}  # entries patched in place (links, states)
        self.app_lo = -1  # appended since the last flush: [app_lo, app_hi)
        self.app_hi = -1
        self.dir_dirty = False
        for path in self.dir.glob("*.tl"):
            if headerless(path):  # created after the last checkpoint, its header never synced
                path.unlink()
                continue
            first = int(path.stem)
            self.files[first] = self._map(first, create=False)

    def _map(self, first: int, create: bool) -> MappedFile:
        # A new file's header is not msynced on creation: that msync, on the loop thread, waited
        # for the journal commit of everything the machine had written (229 ms measured under the
        # lateness benchmark's load). ``flush`` covers it with the file's first entries, before any
        # checkpoint can name the file; a file whose header never reached the disk is deleted at
        # open (``headerless``).
        return MappedFile(
            self.dir / f"{first:020d}.tl", magic=TL_MAGIC, version=TL_VERSION, size=self.file_size,
            geom_a=ENTRY_SIZE, geom_b=self.per_file, base=first, create=create, sync_header=False,
            random=create,
        )

    def _create(self, first: int) -> MappedFile:
        """A new file, mapped (on the loop, or ahead on the page thread: ``Spare``)."""
        return self._map(first, create=True)

    def mark(self, first: int, off: int) -> None:
        d = self.dirty.get(first)
        if d is None:
            self.dirty[first] = [off, off + ENTRY_SIZE]
        else:
            if off < d[0]:
                d[0] = off
            if off + ENTRY_SIZE > d[1]:
                d[1] = off + ENTRY_SIZE

    def has(self, idx: int) -> bool:
        return idx >= 0 and (idx - idx % self.per_file) in self.files

    def locate(self, idx: int) -> tuple[memoryview, int]:
        first = idx - idx % self.per_file
        f = self.files.get(first)
        if f is None:
            raise StoreError(f"timer-log entry {idx} is not on disk (file {first} is missing)")
        return f.buf, self.hs + (idx - first) * ENTRY_SIZE

    def create(self, first: int) -> MappedFile:
        """Open a new file for entries from ``first`` on (the log head has reached it)."""
        f = self.spare.take(first)
        if f is None:
            path = self.dir / f"{first:020d}.tl"
            if path.exists():  # a file left from before a restore's head: reuse its space
                path.unlink()
            f = self._create(first)
        self.files[first] = f
        self.dir_dirty = True
        f.appended_after(self.files.get(first - self.per_file))
        return f

    def prefault(self, idx: int) -> None:
        """Ask the page thread for the entries' pages from ``idx`` (the next append) on, up to
        ``ENTRIES_AHEAD`` past it within its file (``mapped.Ahead``). The state bytes before the
        entries take a page per 4,096 entries and are left to fault."""
        first = idx - idx % self.per_file
        self.ahead.ask(self.files.get(first), idx, first, first + self.per_file, self.hs, ENTRY_SIZE)
        nxt = first + self.per_file
        if 2 * (idx - first) >= self.per_file and nxt not in self.files:
            self.spare.ask(nxt)  # half-way: the next file, ahead (mapped.Spare)

    def append(self, idx: int, due_ms: int, loc: int, flags: int, level: int) -> bool:
        """Write entry ``idx`` (the log head); return True if this opened a new file."""
        first = idx - idx % self.per_file
        f = self.files.get(first)
        created = False
        if f is None:
            f = self.create(first)
            created = True
        ENTRY.pack_into(
            f.buf, self.hs + (idx - first) * ENTRY_SIZE, due_ms, loc, -1, 0, flags, level & 0xFFFF, idx & 0xFFFFFFFF
        )
        f.buf[HEADER_SIZE + idx - first] = PENDING
        if self.app_lo < 0:
            self.app_lo = idx
        self.app_hi = idx + 1
        return created

    def read(self, idx: int) -> tuple[int, int, int, int, int, int, int]:
        """``(due, loc, next, state, flags, level, tag)`` of entry ``idx``."""
        buf, off = self.locate(idx)
        due, loc, nx, _r, flags, level, tag = ENTRY.unpack_from(buf, off)
        return due, loc, nx, buf[HEADER_SIZE + idx % self.per_file], flags, level, tag

    def next_of(self, idx: int) -> int:
        buf, off = self.locate(idx)
        return int(_NEXT.unpack_from(buf, off + 16)[0])

    def set_next(self, idx: int, nxt: int) -> None:
        first = idx - idx % self.per_file
        buf, off = self.locate(idx)
        _NEXT.pack_into(buf, off + 16, nxt)
        self.mark(first, off)

    def set_state(self, idx: int, state: int) -> None:
        first = idx - idx % self.per_file
        buf, _off = self.locate(idx)
        buf[HEADER_SIZE + idx - first] = state
        self.mark(first, HEADER_SIZE + idx - first)

    def drop(self, first: int) -> None:
        f = self.files.pop(first, None)
        self.dirty.pop(first, None)
        if f is not None:
            f.dispose(unlink=True)

    def flush(self) -> None:
        if self.dir_dirty:
            fsync_dir(self.dir)
            self.dir_dirty = False
        if self.app_lo >= 0:
            idx = self.app_lo
            while idx < self.app_hi:
                first = idx - idx % self.per_file
                end = min(self.app_hi, first + self.per_file)
                self.mark(first, HEADER_SIZE + idx - first)  # their states
                self.mark(first, self.hs + (end - 1 - first) * ENTRY_SIZE)
                idx = end
            self.app_lo = self.app_hi = -1
        for first, (lo, hi) in self.dirty.items():
            f = self.files.get(first)
            if f is not None:
                f.flush(lo, hi)
        self.dirty.clear()

    def trim(self) -> None:
        """Unmap every file's resident pages from this process (``MappedFile.drop_pages``)."""
        for f in self.files.values():
            f.drop_pages()

    def disk_bytes(self) -> int:
        return len(self.files) * self.file_size

    def close(self) -> None:
        self.spare.close()
        for f in self.files.values():
            f.close()
        self.files.clear()
        self.dirty.clear()
