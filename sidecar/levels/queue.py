"""An append-only queue of fixed-size entries in rolling mmapped files (one queue per level).

Entry layout (24 bytes, little-endian)::

    0   u64  log_pos   position of the record in the commit log
    8   i64  due_ms    committed due time (epoch ms)
    16  u8   state     0 pending, 1 delivered, 2 cancelled, 3 dropped (dangling: its record failed the check)
    17  u8[7] padding (0)

An entry is addressed by its index, which grows for the life of the queue. Index ``i`` lives in
file ``<dir>/<first>.q`` with ``first = i - i % entries_per_file``. Files wholly below the
scanner's done cursor are deleted, so a queue's disk use is bounded by what is pending in it.
This is RocketMQ's consume queue for ``SCHEDULE_TOPIC_XXXX`` (seed 003: the delivery time is kept
in the entry, so the scanner never reads the big log to decide whether a record is due).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, MutableSequence
from pathlib import Path
from typing import Any

from sidecar.store import codec
from sidecar.store import native_layouts as _layouts
from sidecar.store.mapped import (
    ENTRIES_AHEAD,
    ENTRIES_AHEAD_LOW,
    HEADER_SIZE,
    Ahead,
    MappedFile,
    PageWorker,
    Spare,
    discard_mapped,
    fsync_dir,
    headerless,
)
from sidecar.store.native_args import LvDue

MAGIC = b"KDSLVQ\x00\x01"
VERSION = 1
ENTRY = _layouts.LEVEL_ENTRY
PENDING, DELIVERED = _layouts.LEVEL_PENDING, _layouts.LEVEL_DELIVERED
CANCELLED, DROPPED = _layouts.LEVEL_CANCELLED, _layouts.LEVEL_DROPPED
IDX_BITS = _layouts.LEVEL_IDX_BITS  # a scheduler ref is ``level << IDX_BITS | index``
ENTRY_SIZE = ENTRY.size
_STATE = struct.Struct("<B")
NO_POS = 0  # inside the first segment's file header: never a record's position
IDX_MASK = (1 << IDX_BITS) - 1


# -- the scheduler's per-entry walks -------------------------------------------------------------
# The dequeue's walk over one queue file (``lv_due``) and the batch ack with the done cursor's
# advance (``lv_ack``, ``lv_advance``). Each level's done cursor crosses the contiguous run of
# finished entries above it; an entry in ``[done, send)`` (handed out) is finished exactly when
# its state byte is no longer PENDING (delivered, cancelled before it was due, dropped), so the
# state bytes are the record of out-of-order acks: no set of acked indexes is kept in memory.
# Each record the done cursor passes is released in its commit-log segment: the walks count the
# releases per segment (``pos // seg_bytes``) in ``segs`` for ``CommitLog.release_counts``; a
# dropped entry (``NO_POS``) releases nothing. These functions are the reference for their C
# twins in ``sidecar._native``. ``lv_due`` returns why it stopped: 0 ``stop`` reached, 1 out of
# room, 2 a pending entry not yet due, 3 the next entry needs the caller.
END, FULL, BLOCKED, CALLER = 0, 1, 2, 3


def lv_due(
    buf: memoryview, segments: dict[int, Any], segs: dict[int, int], out: list[tuple[int, Any]], a: LvDue
) -> int:
    """The dequeue of one level over the entries ``a.idx .. a.stop - 1`` of the queue file whose
    first index is ``a.f0`` (mapped at ``buf``): append ``(a.ref_hi | index, record)`` for each
    pending entry (at most ``a.room``), the record decoded from its commit-log segment
    (``segments``: the log's ``{segment index: MappedFile}``, unverified like ``CommitLog.read``); a
    finished entry (cancelled, or delivered before a restart) is passed, and crossed by the done
    cursor when it is at ``a.done``. Stops (why 2) at a pending entry due after ``a.now``, and
    (why 3) at a pending entry below ``a.restored`` (restored from the checkpoint: checked before
    its first use) or whose record cannot be decoded here (segment missing, record corrupt: the
    caller's ``read`` raises the error). Returns why; moves ``a.idx``, ``a.done``, ``a.room``: the
    entries before ``a.idx`` are examined."""
    hs, f0, idx, stop, now, restored = a.hs, a.f0, a.idx, a.stop, a.now, a.restored
    done, room, ref_hi, seg_bytes = a.done, a.room, a.ref_hi, a.seg_bytes
    why = END
    while idx < stop:
        if room <= 0:
            why = FULL
            break
        pos, due, state = ENTRY.unpack_from(buf, hs + (idx - f0) * ENTRY_SIZE)
        if state == PENDING:
            if due > now:
                why = BLOCKED
                break
            if idx < restored:
                why = CALLER
                break
            g, off = divmod(pos, seg_bytes)
            seg = segments.get(g)
            if seg is None:
                why = CALLER
                break
            try:
                rec = codec.decode(seg.buf, off, None, False)
            except codec.CorruptRecord:
                why = CALLER
                break
            out.append((ref_hi | idx, rec))
            room -= 1
        elif idx == done:
            if pos != NO_POS:
                g = pos // seg_bytes
                segs[g] = segs.get(g, 0) + 1
            done += 1
        idx += 1
    a.idx, a.done, a.room = idx, done, room
    return why


def _entry_at(files: dict[int, MappedFile], per_file: int, hs: int, idx: int) -> tuple[memoryview, int]:
    f = files.get(idx - idx % per_file)
    if f is None:
        raise KeyError(f"queue entry {idx} is not on disk")
    return f.buf, hs + (idx % per_file) * ENTRY_SIZE


def lv_advance(
    files: dict[int, MappedFile], per_file: int, hs: int, done: int, send: int, seg_bytes: int, segs: dict[int, int]
) -> int:
    """The done cursor of one level (its queue files ``files``): cross the finished entries from
    ``done`` up to ``send``, counting their releases in ``segs``; return the new ``done``. Raises
    ``KeyError`` for an entry whose file is missing."""
    while done < send:
        buf, off = _entry_at(files, per_file, hs, done)
        pos, _due, state = ENTRY.unpack_from(buf, off)
        if state == PENDING:
            break
        if pos != NO_POS:
            g = pos // seg_bytes
            segs[g] = segs.get(g, 0) + 1
        done += 1
    return done


def lv_ack(
    refs: list[int], files: list[dict[int, MappedFile]], per_file: int, hs: int, cur: MutableSequence[int],
    seg_bytes: int, segs: dict[int, int],
) -> None:
    """The batch ack: each ref (``level << IDX_BITS | index``) handed out and not yet passed by
    its level's done cursor becomes DELIVERED, and the done cursor advances when it was the entry
    it waited on (``lv_advance``); other refs are ignored. ``files[n]`` are level ``n``'s queue
    files; ``cur[4n : 4n + 4]`` is the level's ``[done, send, dirty_lo, dirty_hi]``, updated in
    place: ``done``, and the range of entries whose state was written (``dirty_lo`` -1: none;
    ``dirty_hi`` exclusive). Raises ``IndexError`` for a ref of no level, ``KeyError`` for an
    entry whose file is missing."""
    nlv = len(files)
    for ref in refs:
        n = ref >> IDX_BITS
        if not 0 <= n < nlv:
            raise IndexError(f"ref {ref} names no level")
        idx = ref & IDX_MASK
        c = 4 * n
        done, send = cur[c], cur[c + 1]
        if idx < done or idx >= send:
            continue
        buf, off = _entry_at(files[n], per_file, hs, idx)
        buf[off + 16] = DELIVERED
        if cur[c + 2] < 0 or idx < cur[c + 2]:
            cur[c + 2] = idx
        if idx + 1 > cur[c + 3]:
            cur[c + 3] = idx + 1
        if idx == done:
            cur[c] = lv_advance(files[n], per_file, hs, done, send, seg_bytes, segs)


class LevelQueue:
    def __init__(self, directory: Path, entries_per_file: int, pages: PageWorker | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.per_file = entries_per_file
        self.files: dict[int, MappedFile] = {}
        self.ahead = Ahead(pages, ENTRIES_AHEAD, ENTRIES_AHEAD_LOW)
        self.spare = Spare(pages, self._create, discard_mapped)  # the next file, created on the page thread
        self.dirty_from: int | None = None
        self.dirty_to = 0
        self.created = False  # a file was created since the last flush (fsync the directory)
        for path in self.dir.glob("*.q"):
            if headerless(path):  # created after the last checkpoint, its header never synced
                path.unlink()
                continue
            first = int(path.stem)
            self.files[first] = self._map(first, create=False)

    def _map(self, first: int, create: bool) -> MappedFile:
        if not create:
            return self._file(first, False)
        self.created = True
        f = self.spare.take(first) or self._create(first)
        f.appended_after(self.files.get(first - self.per_file))
        return f

    def _create(self, first: int) -> MappedFile:
        """A new file, mapped (on the loop, or ahead on the page thread: ``Spare``)."""
        return self._file(first, True)

    def _file(self, first: int, create: bool) -> MappedFile:
        # A new file's header is not msynced on creation (on the loop thread that msync waited for
        # the journal commit of all pending writes: up to 301 ms measured under load): ``flush``
        # covers it with the file's first entries, before a checkpoint can name them, and a file
        # whose header never reached the disk is deleted at open (``headerless``).
        return MappedFile(
            self.dir / f"{first:020d}.q", magic=MAGIC, version=VERSION,
            size=HEADER_SIZE + self.per_file * ENTRY_SIZE, geom_a=ENTRY_SIZE, geom_b=self.per_file,
            base=first, create=create, sync_header=False, random=create,
        )

    def _locate(self, idx: int, create: bool = False) -> tuple[MappedFile, int]:
        first = idx - idx % self.per_file
        f = self.files.get(first)
        if f is None:
            if not create:
                raise KeyError(f"queue entry {idx} is not on disk")
            f = self.files[first] = self._map(first, create=True)
        return f, HEADER_SIZE + (idx - first) * ENTRY_SIZE

    def write(self, idx: int, log_pos: int, due_ms: int) -> None:
        f, off = self._locate(idx, create=True)
        ENTRY.pack_into(f.buf, off, log_pos, due_ms, PENDING)
        self._dirty(idx)
        if self.ahead.near(idx + 1):
            self.prefault(idx + 1)

    def prefault(self, idx: int) -> None:
        """Ask the page thread for the pages of the entries from ``idx`` (the next write) on, up to
        ``ENTRIES_AHEAD`` past it within its file (``mapped.Ahead``); the C intake's appends are
        asked for after each run (``LevelsScheduler.intake_end``)."""
        first = idx - idx % self.per_file
        self.ahead.ask(self.files.get(first), idx, first, first + self.per_file, HEADER_SIZE, ENTRY_SIZE)
        if 2 * (idx - first) >= self.per_file and first + self.per_file not in self.files:
            self.spare.ask(first + self.per_file)  # half-way: the next file, ahead (mapped.Spare)

    def drop(self, idx: int) -> None:
        """Mark a dangling entry DROPPED and set its log position to ``NO_POS``, so finishing it
        releases nothing: whether its record was ever counted live is unknowable (a damaged entry
        may point anywhere), and a live count that is too low could delete a segment that still
        holds pending records, while one that is too high only keeps a damaged segment on disk —
        where ``delay-sidecar salvage`` can still read it."""
        f, off = self._locate(idx)
        ENTRY.pack_into(f.buf, off, NO_POS, ENTRY.unpack_from(f.buf, off)[1], DROPPED)
        self._dirty(idx)

    def read(self, idx: int) -> tuple[int, int, int]:
        f, off = self._locate(idx)
        pos, due, state = ENTRY.unpack_from(f.buf, off)
        return int(pos), int(due), int(state)

    def scan(self, lo: int, hi: int) -> Iterator[tuple[int, int, int, int]]:
        """``(idx, log_pos, due_ms, state)`` for entries ``lo <= idx < hi``, file by file. Raises
        ``KeyError`` for an entry whose file is missing."""
        idx = lo
        while idx < hi:
            f, off = self._locate(idx)
            first = idx - idx % self.per_file
            stop = min(hi, first + self.per_file)
            for i, (pos, due, state) in enumerate(ENTRY.iter_unpack(f.buf[off : off + (stop - idx) * ENTRY_SIZE])):
                yield idx + i, int(pos), int(due), int(state)
            idx = stop

    def due_of(self, idx: int) -> int:
        f, off = self._locate(idx)
        return int(ENTRY.unpack_from(f.buf, off)[1])

    def set_state(self, idx: int, state: int) -> None:
        f, off = self._locate(idx)
        _STATE.pack_into(f.buf, off + 16, state)
        self._dirty(idx)

    def _dirty(self, idx: int) -> None:
        if self.dirty_from is None or idx < self.dirty_from:
            self.dirty_from = idx
        if idx + 1 > self.dirty_to:
            self.dirty_to = idx + 1

    def flush(self) -> None:
        if self.created:
            fsync_dir(self.dir)
            self.created = False
        if self.dirty_from is None:
            return
        lo, hi = self.dirty_from, self.dirty_to
        first = lo - lo % self.per_file
        while first < hi:
            f = self.files.get(first)
            if f is not None:
                a = HEADER_SIZE + (max(lo, first) - first) * ENTRY_SIZE
                b = HEADER_SIZE + (min(hi, first + self.per_file) - first) * ENTRY_SIZE
                f.flush(a, b)
            first += self.per_file
        self.dirty_from, self.dirty_to = None, 0

    def trim(self) -> None:
        """Unmap every file's resident pages from this process (``MappedFile.drop_pages``)."""
        for f in self.files.values():
            f.drop_pages()

    def drop_before(self, idx: int) -> None:
        """Delete files whose every entry is below ``idx``."""
        for first in [k for k in self.files if k + self.per_file <= idx]:
            self.files.pop(first).dispose(unlink=True)

    def disk_bytes(self) -> int:
        return len(self.files) * (HEADER_SIZE + self.per_file * ENTRY_SIZE)

    def close(self) -> None:
        self.spare.close()
        for f in self.files.values():
            f.close()
        self.files.clear()
