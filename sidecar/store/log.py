"""The commit log: the write-ahead log of one ingress partition.

Every accepted ingress record (and every cancel command and every record bound for the DLQ) is
appended once, in arrival order, to preallocated mmapped segment files
``<partition-dir>/log/<base>.log`` of ``segment-bytes`` each. A position is a 64-bit integer,
``segment_index * segment_bytes + offset_in_file``, so the segment of a position is one division
away and positions grow monotonically for the life of the store.

Lifecycle of a record: appended (live) -> released by its scheduler once delivered, cancelled,
dead-lettered or copied into a time bucket. Each segment keeps a live count (a handful of
integers in memory, not one object per record); a sealed segment whose count reaches zero is
deleted at the next checkpoint, so disk use follows pending bytes, not history.

Crash safety. The checkpoint stores ``head`` (the append position covered by it) and the live
counts, consistent with the schedulers' checkpointed state. Recovery opens every segment
(checking each header's magic, version and geometry), then replays records forward from the
checkpointed head, validating each CRC; the caller re-schedules them. The first record that does
not validate in the *last* segment is a torn tail: it and everything after it are zeroed (so a
stale record left behind can never be read as valid later) and reported. A bad record inside a
*sealed* segment is corruption the log cannot explain: recovery refuses to start
(``CorruptSegment``) rather than silently lose the rest of that segment. Segments after the
checkpointed head's whose first record was never written (the next segment, created ahead by the
page thread: ``mapped.Spare``) are deleted first, so the last segment is the one appended to.

Looking for non-zero bytes behind the last record costs what was written there, not the segment
size: segments are sparse files, and ``SEEK_DATA``/``SEEK_HOLE`` name the ranges that were ever
written (pages dirtied through the mapping count, before any writeback), so only those are read;
holes read as zeros by definition and are not touched. (Reading a 64 MiB hole through the mapping
costs ~0.4 s of page faults.) Where the file system does not report holes, the whole range is
data and is read, as before.

Durability: appends go to the page cache through the mapping (they survive a process kill);
``flush()`` msyncs the dirty range, which is what makes them survive power loss.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sidecar.store import codec
from sidecar.store.intake_layout import Common
from sidecar.store.mapped import (
    HEADER_SIZE,
    Ahead,
    MappedFile,
    PageWorker,
    Spare,
    StoreError,
    discard_mapped,
    fsync_dir,
    headerless,
    unborn,
)
from sidecar.store.native_args import RecordHead

MAGIC = b"KDSLOG\x00\x01"
VERSION = 1
_ZERO_CHUNK = bytes(1 << 20)
# The pages ahead of the head that the page thread faults in (mapped.PageWorker): asked for up
# to AHEAD_BYTES past the head whenever fewer than AHEAD_LOW bytes past it were asked for. At the
# bench's 40,000 records/s on six partitions a partition appends ~1.7 MB/s: the thread has a
# second to answer, and a partition keeps 2-4 MiB of unwritten pages mapped (its RSS).
AHEAD_BYTES = 4 << 20
AHEAD_LOW = 2 << 20


class CorruptSegment(StoreError):
    pass


def _data_ranges(seg: MappedFile, start: int) -> list[tuple[int, int]]:
    """The ranges of ``[start, seg.size)`` that may hold non-zero bytes: the file's data ranges
    (``SEEK_DATA``/``SEEK_HOLE``); the whole range if the platform or file system cannot tell."""
    end = seg.size
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if start >= end:
        return []
    if seek_data is None or seek_hole is None:
        return [(start, end)]
    out: list[tuple[int, int]] = []
    try:
        fd = os.open(seg.path, os.O_RDONLY)
    except OSError:
        return [(start, end)]
    try:
        pos = start
        while pos < end:
            try:
                a = os.lseek(fd, pos, seek_data)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data at or after pos
                    break
                return [(start, end)]
            if a >= end:
                break
            b = min(os.lseek(fd, a, seek_hole), end)
            out.append((max(a, start), b))
            pos = b
    finally:
        os.close(fd)
    return out


@dataclass(slots=True)
class Truncation:
    position: int
    dropped_bytes: int
    reason: str


class CommitLog:
    """One partition's commit log (module docstring): its segments, appends, reads and releases.

    One job although it is long: every method reads or moves the same segment map, live counts
    and head together (an append, a release, a recovery's replay, a trim and a reclaim all keep
    ``head``, ``flushed`` and the live counts consistent with one another). What can live apart
    does: the record format (codec.py), the segments' mapping and read-ahead (mapped.py), the
    C appends (native/intake.c)."""

    def __init__(self, directory: Path, segment_bytes: int, pages: PageWorker | None = None) -> None:
        self.dir = directory / "log"
        self.pages = pages  # None: the loop faults its own pages in (so do the scheduler's files)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.segments: dict[int, MappedFile] = {}
        self.live: dict[int, int] = {}
        self.head = HEADER_SIZE  # next append position
        self._ahead = Ahead(pages, AHEAD_BYTES, AHEAD_LOW, HEADER_SIZE)
        self.spare = Spare(pages, self._create_ahead, discard_mapped)  # the next segment, made on the page thread
        self.flushed = HEADER_SIZE  # everything before this is msynced
        self.truncations: list[Truncation] = []
        self.appended = 0
        self._created = False  # a segment file was created since the last flush (fsync the directory)
        paths = sorted(self.dir.glob("*.log"))
        # The newest segment, if its header never reached the disk (``_map``): recover() deletes it,
        # unless the checkpoint's head is in it (then it is damage, and refused).
        self._headerless: Path | None = None
        if paths and unborn(paths[-1]):
            # Killed while creating the newest segment (before its header was written): it holds
            # nothing; recovery recreates it if the head needs it.
            paths.pop().unlink()
        elif paths and headerless(paths[-1]):
            self._headerless = paths.pop()
        for path in paths:
            base = int(path.stem)
            if base % segment_bytes:
                raise StoreError(
                    f"{path}: base {base} is not a multiple of the configured segment-bytes {segment_bytes}"
                )
            self.segments[base // segment_bytes] = self._map(base // segment_bytes, create=False)

    # -- files ----------------------------------------------------------------------------------
    def _path(self, index: int) -> Path:
        return self.dir / f"{index * self.segment_bytes:020d}.log"

    def path_of(self, index: int) -> Path:
        """The file of segment ``index``."""
        return self._path(index)

    def _map(self, index: int, create: bool) -> MappedFile:
        if not create:
            return self._file(index, False)
        self._created = True
        seg = self.spare.take(index) or self._create(index)
        self._appending(seg, index)
        return seg

    def _create(self, index: int) -> MappedFile:
        """A new segment, mapped (on the loop, or ahead on the page thread: ``Spare``)."""
        return self._file(index, True)

    def _create_ahead(self, index: int) -> MappedFile:
        """A new segment made on the page thread (``Spare``), its first ``AHEAD_BYTES`` faulted in
        there and then: otherwise ``prefault`` asks for them only at the segment's first append,
        and the first appends fault on the loop before the thread gets there (a write into a
        fresh page of the new file: 50-135 ms a major fault under the merge passes' writeback at
        100M pending on six partitions, the ``scale`` bench scenario)."""
        seg = self._create(index)
        if self.spare.pages is not None:
            self.spare.pages.populate_now(seg, HEADER_SIZE, min(AHEAD_BYTES, self.segment_bytes))
        return seg

    def _file(self, index: int, create: bool) -> MappedFile:
        # A new segment's header is not msynced on creation: on the loop thread that msync waited
        # for the journal commit of all the machine's pending writes (141 ms measured under load).
        # ``flush`` covers it (a segment created since the last flush is synced from its first
        # byte) before a checkpoint can name anything in it; one whose header a power loss kept
        # from the disk holds only records after the last checkpoint, which are consumed again.
        return MappedFile(
            self._path(index), magic=MAGIC, version=VERSION, size=self.segment_bytes,
            geom_a=self.segment_bytes, geom_b=0, base=index * self.segment_bytes, create=create,
            sync_header=False, random=create,
        )

    def _appending(self, seg: MappedFile, index: int) -> None:
        """``seg`` (segment ``index``) is the one appended to now, the one before it sealed."""
        seg.appended_after(self.segments.get(index - 1))

    def _segment(self, pos: int) -> tuple[MappedFile, int]:
        index, off = divmod(pos, self.segment_bytes)
        seg = self.segments.get(index)
        if seg is None:
            raise StoreError(f"position {pos} is in segment {index}, which does not exist")
        return seg, off

    # -- recovery -------------------------------------------------------------------------------
    def recover(self, head: int | None, live: dict[int, int] | None) -> Iterator[tuple[int, codec.Record]]:
        """Restore the checkpointed state and yield ``(position, record)`` for every whole record
        after it, in order. Must be fully consumed before appending.

        Edge cases: a checkpointed head exactly at the end of a segment (the next segment was never
        created) or in a segment that no longer exists moves to the first data byte of the next
        existing segment, or of a newly created one; the head's segment always exists afterwards."""
        if head is not None:
            head = self._data_start(head)
        if self._headerless is not None:
            base = int(self._headerless.stem)
            if head is not None and head >= base:
                raise CorruptSegment(
                    f"{self._headerless}: the segment's header is zeros, but the checkpoint's head ({head}) is in it; "
                    "run `delay-sidecar salvage` to copy out what is readable"
                )
            self._headerless.unlink()  # created after the checkpoint; its records are consumed again
            self._headerless = None
        if not self.segments:
            # A fresh store, or every segment reclaimed: keep positions growing from the head.
            start = head if head is not None else HEADER_SIZE
            index = start // self.segment_bytes
            self.segments[index] = self._map(index, create=True)
            self.head = self.flushed = start
            self.live = {index: 0}
            return
        # Segments past the head's segment whose first record was never written: one the page
        # thread made ahead and nothing was appended to (``Spare``), or one a crash cut before its
        # first record. They hold nothing the checkpoint covers (what follows its head is consumed
        # again), and left in place the newest of them would pass for the last segment, so that a
        # torn tail before it would look like damage inside a sealed one.
        start_index = (head if head is not None else min(self.segments) * self.segment_bytes) // self.segment_bytes
        while len(self.segments) > 1:
            top = max(self.segments)
            if top <= start_index or codec.peek_length(self.segments[top].buf, HEADER_SIZE) != 0:
                break
            self._delete(top)
        indexes = sorted(self.segments)
        self.live = {i: 0 for i in indexes}
        if head is None:
            pos = indexes[0] * self.segment_bytes + HEADER_SIZE
        else:
            pos = head
            for k, v in (live or {}).items():
                if int(k) in self.live:
                    self.live[int(k)] = int(v)
        last = indexes[-1]
        while True:
            index, off = divmod(pos, self.segment_bytes)
            if off < HEADER_SIZE:  # a record ended exactly at the end of the previous segment
                pos = index * self.segment_bytes + HEADER_SIZE
                continue
            seg = self.segments.get(index)
            if seg is None:  # checkpoint head at the very end of a deleted/unknown segment
                nxt = [i for i in indexes if i > index]
                if not nxt:
                    break
                pos = nxt[0] * self.segment_bytes + HEADER_SIZE
                continue
            try:
                rec = codec.decode(seg.buf, off)
            except codec.CorruptRecord as e:
                length = codec.peek_length(seg.buf, off) if off + 4 <= self.segment_bytes else 0
                if index != last:
                    if length == 0 and self._zero_from(seg, off):
                        pos = (index + 1) * self.segment_bytes + HEADER_SIZE
                        if index + 1 not in self.segments:
                            raise CorruptSegment(
                                f"segment {index + 1} is missing after sealed segment {index}"
                            ) from None
                        continue
                    raise CorruptSegment(
                        f"{seg.path}: corrupt record at offset {off} inside a sealed segment ({e}); "
                        "run `delay-sidecar salvage` to copy out what is readable"
                    ) from None
                dropped = self._truncate(seg, off)
                if dropped:
                    self.truncations.append(Truncation(pos, dropped, str(e)))
                break
            yield pos, rec
            self.live[index] = self.live.get(index, 0) + 1
            pos += rec.length
        self.head = self.flushed = pos = self._data_start(pos)
        if pos // self.segment_bytes not in self.segments:
            self.segments[pos // self.segment_bytes] = self._map(pos // self.segment_bytes, create=True)
            self.live[pos // self.segment_bytes] = 0
        else:
            self._appending(self.segments[pos // self.segment_bytes], pos // self.segment_bytes)
        # Segments before the checkpointed head that no live record needs anymore.
        for i in list(self.segments):
            if i < pos // self.segment_bytes and self.live.get(i, 0) <= 0:
                self._delete(i)

    def _data_start(self, pos: int) -> int:
        """``pos``, or the first data byte of its segment if it points into the file header (a
        position exactly at the end of the previous segment)."""
        index, off = divmod(pos, self.segment_bytes)
        return pos if off >= HEADER_SIZE else index * self.segment_bytes + HEADER_SIZE

    @staticmethod
    def _zero_from(seg: MappedFile, off: int) -> bool:
        """True if the rest of the segment is zeros (the unused tail of a sealed segment)."""
        for a, b in _data_ranges(seg, off):
            pos = a
            while pos < b:
                n = min(len(_ZERO_CHUNK), b - pos)
                if seg.buf[pos : pos + n] != _ZERO_CHUNK[:n]:
                    return False
                pos += n
        return True

    @staticmethod
    def _truncate(seg: MappedFile, off: int) -> int:
        """Zero everything from ``off`` to the last non-zero byte; return how many bytes that was."""
        ranges = _data_ranges(seg, off)
        last_nonzero = off
        for a, b in ranges:
            pos = a
            while pos < b:
                n = min(len(_ZERO_CHUNK), b - pos)
                if seg.buf[pos : pos + n] != _ZERO_CHUNK[:n]:
                    last_nonzero = pos + len(bytes(seg.buf[pos : pos + n]).rstrip(b"\x00"))
                pos += n
        if last_nonzero > off:
            for a, b in ranges:  # holes stay holes
                pos, b = a, min(b, last_nonzero)
                while pos < b:
                    n = min(len(_ZERO_CHUNK), b - pos)
                    seg.buf[pos : pos + n] = _ZERO_CHUNK[:n]
                    pos += n
            seg.flush(off, last_nonzero)
        return last_nonzero - off

    # -- append / read --------------------------------------------------------------------------
    def append(
        self, h: RecordHead, rid: bytes, topic: bytes, key: bytes | None, value: bytes | None, headers_blob: bytes
    ) -> int:
        """Append one record (``codec`` layout; ``h`` its integer fields: ``codec.head``); return its
        position. The record is encoded straight into the mapped segment (``codec.append``),
        rolling to a new segment when it does not fit the rest of this one."""
        sb = self.segment_bytes
        index, off = divmod(self.head, sb)
        if off < HEADER_SIZE:  # a new segment starts after its header
            off = HEADER_SIZE
            self.head = index * sb + off
        while True:
            seg = self.segments.get(index)
            if seg is None:
                seg = self.segments[index] = self._map(index, create=True)
                self.live[index] = 0
            size = codec.append(seg.buf, off, sb, h, rid, topic, key, value, headers_blob)
            if size >= 0:
                break
            if off == HEADER_SIZE or HEADER_SIZE - size > sb:
                raise StoreError(f"record of {-size} bytes does not fit a segment of {sb}")
            # roll: the rest of the old segment stays zero (its sealed tail)
            index, off = index + 1, HEADER_SIZE
            self.head = index * sb + off
        pos = self.head
        self.head += size
        self.live[index] += 1
        self.appended += 1
        if self._ahead.near(self.head):
            self.prefault()
        return pos

    def read(self, pos: int, verify: bool = False) -> codec.Record:
        seg, off = self._segment(pos)
        return codec.decode(seg.buf, off, verify=verify)

    def raw(self, pos: int) -> bytes:
        """The record at ``pos`` as its bytes (for the changelog: the same layout, CRC included)."""
        seg, off = self._segment(pos)
        return bytes(seg.buf[off : off + codec.peek_length(seg.buf, off)])

    def check(self, pos: int) -> tuple[int, int, int]:
        """Verify the record at ``pos`` (CRC included); return ``(rtype, due_ms, level)``. Raises
        ``CorruptRecord``, or ``StoreError`` if its segment does not exist."""
        seg, off = self._segment(pos)
        return codec.check(seg.buf, off)

    def fault(self, pos: int, due: int, head: int | None, level: int | None = None) -> str:
        """Why a scheduler entry (``pos``, ``due``, and ``level`` when the scheduler keeps one)
        does not match the record it names; "" if it does. The full check: below the checkpointed
        ``head``, segment present, CRC, due time, level, not a cancel command."""
        if head is not None and pos >= head:
            return f"position {pos} is at or beyond the log head {head}"
        try:
            rtype, rdue, rlevel = self.check(pos)
        except (codec.CorruptRecord, StoreError) as e:
            return f"record does not verify: {e}"
        if level is None:
            if rdue != due or rtype == codec.CANCEL:
                return f"record at {pos} (type {rtype}, due {rdue}) does not match the entry (due {due})"
        elif rdue != due or rlevel != level or rtype == codec.CANCEL:
            return (f"record at {pos} (type {rtype}, level {rlevel}, due {rdue}) "
                    f"does not match the entry (level {level}, due {due})")
        return ""

    def release(self, pos: int) -> None:
        """The record at ``pos`` is no longer needed (delivered, cancelled, dead-lettered, moved)."""
        index = pos // self.segment_bytes
        if index in self.live:  # a dangling scheduler entry (segment gone) has nothing to release
            self.live[index] -= 1

    def release_counts(self, counts: dict[int, int]) -> None:
        """``release`` for many records at once: ``counts`` maps a segment index to how many of
        its records are no longer needed."""
        live = self.live
        for index, n in counts.items():
            if index in live:
                live[index] -= n

    # -- the C intake (PartitionStore.ingest_many; sidecar/store/intake_layout.py) ---------------
    def intake_state(self, st: list[int]) -> memoryview | None:
        """Hand the C intake the log: the head and the segment size into ``st``, and the buffer of
        the head's segment (None before the first append maps it), which it appends to in place
        while a record fits the rest of it."""
        sb = self.segment_bytes
        st[Common.HEAD] = self.head
        st[Common.SEG_BYTES] = sb
        seg = self.segments.get(self.head // sb)
        return None if seg is None else seg.buf

    def intake_restore(self, st: list[int], count: int) -> None:
        """Take back the head the C intake moved by appending ``count`` records to the head's
        segment."""
        self.live[self.head // self.segment_bytes] += count
        self.head = st[Common.HEAD]
        self.appended += count
        if self._ahead.near(self.head):
            self.prefault()

    @property
    def ahead(self) -> int:
        """Pages before this position were asked of the page thread."""
        return self._ahead.asked

    def prefault(self) -> None:
        """Ask the page thread (``mapped.PageWorker``) for the pages of the head's segment up to
        ``AHEAD_BYTES`` past the head, those not asked for yet: the next appends then find them
        mapped instead of faulting on the loop. A new segment is asked for from its first append."""
        sb = self.segment_bytes
        index = self.head // sb
        self._ahead.ask(self.segments.get(index), self.head, index * sb, (index + 1) * sb, 0, 1)
        if 2 * (self.head - index * sb) >= sb and index + 1 not in self.segments:
            self.spare.ask(index + 1)  # half-way: the next segment, ahead (mapped.Spare)

    # -- durability -----------------------------------------------------------------------------
    def flush(self) -> None:
        """msync everything appended since the last flush (and the directory, if a segment was
        created: the new file's name must survive a power loss too)."""
        if self._created:
            fsync_dir(self.dir)
            self._created = False
        if self.head == self.flushed:
            return
        first, last = self.flushed // self.segment_bytes, self.head // self.segment_bytes
        for index in range(first, last + 1):
            seg = self.segments.get(index)
            if seg is None:
                continue
            start = self.flushed - index * self.segment_bytes if index == first else 0
            end = self.head - index * self.segment_bytes if index == last else self.segment_bytes
            seg.flush(max(start, 0), end)
        self.flushed = self.head

    _trimmed: int | None = None  # the active segment at the last trim()

    def trim(self, sealed: bool = True) -> None:
        """Unmap the resident pages of the segments from this process (``MappedFile.drop_pages``),
        all but the page the next append writes to: records are appended once and read back when
        due, which faults them in again from the page cache. ``sealed=False``: only the segments
        appended to since the last trim (a few madvise calls, not one per segment)."""
        active, off = divmod(self.head, self.segment_bytes)
        if sealed or self._trimmed is None:
            indexes: Iterable[int] = list(self.segments)
        else:
            indexes = range(min(self._trimmed, active), active + 1)
        page = off - off % mmap.PAGESIZE
        for index in indexes:
            seg = self.segments.get(index)
            if seg is None:
                continue
            if index == active:
                seg.drop_pages(0, page)
                # the unwritten rest (read by recovery's tail check) but the pages faulted in ahead
                ahead = min(max(self.ahead - active * self.segment_bytes, 0), self.segment_bytes)
                seg.drop_pages(max(page + mmap.PAGESIZE, ahead))
            else:
                seg.drop_pages()
        self._trimmed = active

    def state(self) -> dict[str, object]:
        return {"head": self.head, "live": {str(k): v for k, v in self.live.items()}}

    def reclaimable(self) -> list[int]:
        """Sealed segments with no live record now (a checkpoint taken now covers their deletion)."""
        active = self.head // self.segment_bytes
        return [i for i, n in self.live.items() if i < active and n <= 0 and i in self.segments]

    def reclaim(self, dead: list[int] | None = None, unlink: bool = True) -> int:
        """Delete sealed segments with no live record; call only after a checkpoint that covers
        the releases (``dead``: the ``reclaimable()`` of that checkpoint's snapshot). With
        ``unlink=False`` the caller has deleted the files (the checkpoint job does, off the loop
        thread): only the mappings are closed. Returns the number of segments reclaimed."""
        deleted = 0
        for i in self.reclaimable() if dead is None else dead:
            if i in self.segments and self.live.get(i, 0) <= 0:
                self._delete(i, unlink)
                deleted += 1
        return deleted

    def _delete(self, index: int, unlink: bool = True) -> None:
        seg = self.segments.pop(index, None)
        self.live.pop(index, None)
        if seg is not None:
            seg.dispose(unlink)  # inside a checkpoint's finish: on the flusher thread (mapped.Disposal)

    def disk_bytes(self) -> int:
        return len(self.segments) * self.segment_bytes

    def pending_records(self) -> int:
        return sum(max(n, 0) for n in self.live.values())

    def close(self) -> None:
        self.spare.close()
        for seg in self.segments.values():
            seg.close()
        self.segments.clear()
