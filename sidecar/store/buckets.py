"""Time buckets: where records due beyond the timer wheel's near window wait (docs/design.md 3.2).

A record due further out than the wheel can hold is copied — its whole encoded commit-log record,
CRC included — into the data file of its due time's bucket, and its commit-log slot is released at
once, so a one-year delay never pins a log segment. When the wheel's window reaches the end of a
bucket, the scheduler reads the bucket sequentially and links every record into the wheel (the
timer-log entry points at the bucket copy). A body is therefore written at most twice (log and
bucket), instead of RIP-43's re-append to the commit log every window. A bucket file is deleted
whole once every record in it is delivered or cancelled and a checkpoint covers that.

File ``<partition-dir>/buckets/<start_ms:020d>-<width_ms>.bkt``, append-only, written with
``pwrite`` and read with ``pread`` (records handed out are ``bytes`` copies, so deleting a file
never invalidates a record still in flight)::

    header  64 bytes, the store's self-checking header (``sidecar.store.mapped``):
            magic b"KDSBKT\\0\\1", version 1, geom_a = width_ms, geom_b = seq (the bucket's
            sequence number, part of every ref into it), base = start_ms, CRC32C
    entry   0   u8   state    0 pending, 1 cancelled (before it was loaded into the wheel)
            1   u8   magic    0xB7
            2   u16  reserved
            4   u32  check    low 32 bits of ``offset >> 3``: a ref from before a restart that
                               points into rewritten space is recognised, not misread
            8   i64  tl_idx   timer-log entry the record was loaded into (-1: not loaded)
            16  the commit-log record, byte for byte (``sidecar.store.codec``; 8-aligned length)

A bucket covers due times ``[start, start + width)``. The width is stored per file, so changing
``--bucket-width`` only affects buckets created afterwards.

A ref to a bucket record is ``1 << 62 | seq << 36 | offset >> 3`` (offset of the entry in the
file; 26 bits of sequence numbers, 512 GiB per bucket file).

Crash safety: the bucket list in the scheduler's checkpoint names each bucket's size, record
count, load progress and live count. ``restore`` truncates each file to its checkpointed size
(records appended after the checkpoint are replayed from the commit log and appended again),
deletes files the checkpoint does not know, and refuses to start if a file it needs is missing.
``flush`` makes every file written since the last flush durable (and the directory when files
were created), before the checkpoint is written. Inside a checkpoint (``deferred_sync``) it only
names the files for the batch, which the flusher thread syncs, so the loop never waits on the
disk for them. Called directly, with far-future records spread over many buckets that is many
files, so beyond a handful it is one ``syncfs(2)`` of the data volume instead of one ``fsync`` per
file (Linux; elsewhere, or if it fails, per-file ``fsync``); a file whose descriptor was evicted
from the small cache of open files is reopened for its ``fsync``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from bisect import insort
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crc32c import crc32c

from sidecar.store import codec
from sidecar.store import native_layouts as _layouts
from sidecar.store.mapped import HEADER, HEADER_SIZE, StoreError, current_batch, fsync_dir

MAGIC = b"KDSBKT\x00\x01"
VERSION = 1
ENTRY_HEAD = struct.Struct("<BBHIq")
ENTRY_HEAD_SIZE = ENTRY_HEAD.size
assert ENTRY_HEAD_SIZE == 16
ENTRY_MAGIC = 0xB7
PENDING, CANCELLED = 0, 1
_STATE = struct.Struct("<B")
_TL = struct.Struct("<q")
_REC_LEN = struct.Struct("<I")
_REC_DUE = struct.Struct("<q")
_REC_LEVEL = struct.Struct("<H")

BUCKET_BIT = _layouts.BUCKET_BIT
_SEQ_SHIFT = 36
_SEQ_MASK = (1 << 26) - 1
_OFF_MASK = (1 << _SEQ_SHIFT) - 1
_READ_CHUNK = 1 << 20
_SYNCFS_FROM = 8  # dirty files from which one syncfs beats an fsync each


def _load_syncfs() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_syncfs = _load_syncfs()


def make_ref(seq: int, offset: int) -> int:
    return BUCKET_BIT | (seq << _SEQ_SHIFT) | (offset >> 3)


def split_ref(ref: int) -> tuple[int, int]:
    return (ref >> _SEQ_SHIFT) & _SEQ_MASK, (ref & _OFF_MASK) << 3


def is_bucket_ref(ref: int) -> bool:
    return bool(ref & BUCKET_BIT)


def heads(fd: int, path: Path, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """The entries of the bucket file open at ``fd`` from offset ``pos`` (an entry's start) to
    ``end``: (offset, total_len, state, due_ms, level), read in 1 MiB chunks, only the heads
    decoded. Raises ``StoreError`` (naming ``path``) at a damaged entry."""
    buf = b""
    buf_at = pos
    need = ENTRY_HEAD_SIZE + codec.HEAD_SIZE
    while pos < end:
        rel = pos - buf_at
        if rel + need > len(buf):
            buf = os.pread(fd, max(_READ_CHUNK, need), pos)
            buf_at = pos
            rel = 0
            if len(buf) < need:
                raise StoreError(f"{path}: truncated entry at offset {pos}")
        state, magic, _r1, check, _tl = ENTRY_HEAD.unpack_from(buf, rel)
        if magic != ENTRY_MAGIC or check != (pos >> 3) & 0xFFFFFFFF:
            raise StoreError(f"{path}: no bucket entry at offset {pos}")
        (length,) = _REC_LEN.unpack_from(buf, rel + ENTRY_HEAD_SIZE)
        (due,) = _REC_DUE.unpack_from(buf, rel + ENTRY_HEAD_SIZE + 16)
        (level,) = _REC_LEVEL.unpack_from(buf, rel + ENTRY_HEAD_SIZE + 50)
        total = ENTRY_HEAD_SIZE + length
        if length < codec.HEAD_SIZE or length % codec.ALIGN or pos + total > end:
            raise StoreError(f"{path}: bad record length {length} at offset {pos}")
        yield pos, total, int(state), int(due), int(level)
        pos += total


@dataclass(slots=True)
class Bucket:
    seq: int
    start: int
    width: int
    size: int  # file end: next append offset
    count: int  # records appended
    loaded: int  # offset up to which records are linked into the wheel
    loaded_n: int
    live: int  # records not yet released (delivered / cancelled and passed)
    min_due: int

    @property
    def end(self) -> int:
        return self.start + self.width

    def to_list(self) -> list[int]:
        return [self.seq, self.start, self.width, self.size, self.count, self.loaded, self.loaded_n, self.live,
                self.min_due]

    @classmethod
    def from_list(cls, v: list[int]) -> Bucket:
        return cls(*(int(x) for x in v))


class BucketStore:
    def __init__(self, directory: Path, max_open: int = 256) -> None:
        self.dir = directory
        self.buckets: dict[int, Bucket] = {}
        self.by_range: dict[tuple[int, int], int] = {}  # (start, width) -> seq, for appends
        self.unloaded: list[tuple[int, int, int]] = []  # sorted (end, start, seq) not fully loaded
        self.next_seq = 1
        self.max_open = max_open
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._dirty: set[int] = set()
        self._dir_dirty = False
        self._parent_dirty = False
        self._min_due_cache: int | None = None
        self._floor_cache: int | None = None
        self._min_due_stale = True

    # -- files ----------------------------------------------------------------------------------
    def path(self, b: Bucket) -> Path:
        return self.dir / f"{b.start:020d}-{b.width}.bkt"

    def _fd(self, seq: int) -> int:
        fd = self._fds.get(seq)
        if fd is not None:
            self._fds.move_to_end(seq)
            return fd
        b = self.buckets[seq]
        fd = os.open(self.path(b), os.O_RDWR)
        self._fds[seq] = fd
        self._evict()
        return fd

    def _evict(self) -> None:
        while len(self._fds) > self.max_open:
            _old, ofd = self._fds.popitem(last=False)
            os.close(ofd)  # still in _dirty if written: flush() reopens it (or syncfs covers it)

    def _close_fd(self, seq: int) -> None:
        fd = self._fds.pop(seq, None)
        if fd is not None:
            os.close(fd)
        self._dirty.discard(seq)

    @staticmethod
    def _header(b: Bucket) -> bytes:
        head = HEADER.pack(MAGIC, VERSION, HEADER_SIZE, b.width, b.seq, b.start, b"", 0)
        return HEADER.pack(MAGIC, VERSION, HEADER_SIZE, b.width, b.seq, b.start, b"", crc32c(head[:60]))

    def _check_header(self, b: Bucket, fd: int) -> None:
        raw = os.pread(fd, HEADER_SIZE, 0)
        p = self.path(b)
        if len(raw) < HEADER_SIZE:
            raise StoreError(f"{p}: truncated bucket header")
        magic, ver, _h, width, seq, start, _r, crc = HEADER.unpack_from(raw, 0)
        if crc32c(raw[:60]) != crc:
            raise StoreError(f"{p}: bucket header is corrupt (CRC mismatch)")
        if magic != MAGIC or ver != VERSION:
            raise StoreError(f"{p}: not a version-{VERSION} bucket file (magic {magic!r}, version {ver})")
        if (width, seq, start) != (b.width, b.seq, b.start):
            raise StoreError(
                f"{p}: header says bucket {seq} [{start}, +{width}) but the checkpoint expects "
                f"bucket {b.seq} [{b.start}, +{b.width})"
            )

    def _create(self, start: int, width: int) -> Bucket:
        seq = self.next_seq
        if seq > _SEQ_MASK:
            raise StoreError("bucket sequence numbers exhausted")
        self.next_seq += 1
        b = Bucket(seq, start, width, HEADER_SIZE, 0, HEADER_SIZE, 0, 0, 1 << 62)
        if not self.dir.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            self._parent_dirty = True
        p = self.path(b)
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(fd, self._header(b), 0)
        self.buckets[seq] = b
        self.by_range[(start, width)] = seq
        insort(self.unloaded, (b.end, start, seq))
        self._min_due_stale = True
        self._fds[seq] = fd
        self._dirty.add(seq)
        self._dir_dirty = True
        self._evict()
        return b

    # -- records --------------------------------------------------------------------------------
    def append(self, start: int, width: int, due_ms: int, record: bytes | bytearray | memoryview) -> int:
        """Append one whole encoded commit-log record (its bytes exactly as in the log, CRC
        included) to the bucket ``[start, start + width)``; return its ref."""
        seq = self.by_range.get((start, width))
        b = self.buckets[seq] if seq is not None else self._create(start, width)
        off = b.size
        head = ENTRY_HEAD.pack(PENDING, ENTRY_MAGIC, 0, (off >> 3) & 0xFFFFFFFF, -1)
        n = os.pwritev(self._fd(b.seq), [head, record], off)
        if n != ENTRY_HEAD_SIZE + len(record):
            raise StoreError(f"{self.path(b)}: short write ({n} bytes) at offset {off}")
        b.size += n
        b.count += 1
        b.live += 1
        if due_ms < b.min_due:
            b.min_due = due_ms
            self._min_due_stale = True
        self._dirty.add(b.seq)
        return make_ref(b.seq, off)

    @staticmethod
    def encode(rec: codec.Record) -> bytearray:
        """Re-encode a decoded record: the same bytes as the commit log's (the codec is
        deterministic, so the CRC is the same too). For callers without the raw bytes."""
        buf = bytearray(rec.length)
        n = codec.encode_into(buf, 0, codec.head_of(rec), rec.id, rec.topic, rec.key, rec.value, rec.headers)
        if n != rec.length:
            raise StoreError(f"re-encoded record is {n} bytes, the commit log's is {rec.length}")
        return buf

    def get(self, seq: int) -> Bucket | None:
        return self.buckets.get(seq)

    def head(self, seq: int, off: int) -> tuple[int, int] | None:
        """(state, tl_idx) of the entry at ``off``; None if no entry starts there."""
        raw = os.pread(self._fd(seq), ENTRY_HEAD_SIZE, off)
        if len(raw) < ENTRY_HEAD_SIZE:
            return None
        state, magic, _r1, check, tl_idx = ENTRY_HEAD.unpack(raw)
        if magic != ENTRY_MAGIC or check != (off >> 3) & 0xFFFFFFFF:
            return None
        return int(state), int(tl_idx)

    def set_state(self, seq: int, off: int, state: int) -> None:
        os.pwrite(self._fd(seq), _STATE.pack(state), off)
        self._dirty.add(seq)

    def set_tl(self, seq: int, off: int, tl_idx: int) -> None:
        os.pwrite(self._fd(seq), _TL.pack(tl_idx), off + 8)
        self._dirty.add(seq)

    def read(self, seq: int, off: int) -> codec.Record:
        """The record of the entry at ``off``, CRC-checked (a bucket is the only copy)."""
        fd = self._fd(seq)
        first = os.pread(fd, ENTRY_HEAD_SIZE + codec.HEAD_SIZE, off)
        (length,) = _REC_LEN.unpack_from(first, ENTRY_HEAD_SIZE)
        data = first[ENTRY_HEAD_SIZE:] if length <= codec.HEAD_SIZE else os.pread(fd, length, off + ENTRY_HEAD_SIZE)
        try:
            return codec.decode(memoryview(data), 0, verify=True)
        except codec.CorruptRecord as e:
            raise StoreError(f"{self.path(self.buckets[seq])}: record at offset {off} is corrupt ({e})") from None

    def scan(self, b: Bucket, max_records: int) -> list[tuple[int, int, int, int, int]]:
        """Up to ``max_records`` entries from ``b.loaded``: (offset, total_len, state, due_ms,
        level). Reads the file in 1 MiB chunks; only the heads are decoded."""
        out: list[tuple[int, int, int, int, int]] = []
        for head in heads(self._fd(b.seq), self.path(b), b.loaded, b.size):
            out.append(head)
            if len(out) >= max_records:
                break
        return out

    def release(self, seq: int) -> None:
        b = self.buckets.get(seq)
        if b is not None:
            b.live -= 1

    def mark_loaded(self, b: Bucket, offset: int, n: int) -> None:
        b.loaded = offset
        b.loaded_n += n
        if b.loaded >= b.size:
            key = (b.end, b.start, b.seq)
            with contextlib.suppress(ValueError):
                self.unloaded.remove(key)
            self.by_range.pop((b.start, b.width), None)
            self._min_due_stale = True

    def _summarise(self, window_ms: int) -> None:
        hint: int | None = None
        floor: int | None = None
        for end, start, seq in self.unloaded:
            b = self.buckets[seq]
            if b.loaded >= b.size:
                continue
            h = max(b.min_due, end - window_ms)
            if hint is None or h < hint:
                hint = h
            if floor is None or start < floor:
                floor = start
        self._min_due_cache, self._floor_cache = hint, floor
        self._min_due_stale = False

    def min_due(self, window_ms: int) -> int | None:
        """Lower bound of the earliest delivery out of a bucket not yet (fully) loaded: its
        earliest record, and never before the window can hold the whole bucket (``end - window``)."""
        if self._min_due_stale:
            self._summarise(window_ms)
        return self._min_due_cache

    def first_start(self, window_ms: int) -> int | None:
        """Start of the earliest bucket that still holds records not loaded into the wheel."""
        if self._min_due_stale:
            self._summarise(window_ms)
        return self._floor_cache

    def unloaded_records(self) -> int:
        return sum(self.buckets[s].count - self.buckets[s].loaded_n for _e, _st, s in self.unloaded)

    # -- durability -----------------------------------------------------------------------------
    def flush(self) -> None:
        dirty = [seq for seq in self._dirty if seq in self.buckets]
        batch = current_batch()
        if batch is not None:
            # Inside a checkpoint: the flusher thread syncs them (the loop must not wait on the
            # disk; with many files, one syncfs would not be cheaper there than fdatasync each).
            for seq in dirty:
                batch.add_path(self.path(self.buckets[seq]))
            dirty = []
        synced = False
        if len(dirty) >= _SYNCFS_FROM and _syncfs is not None:
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                synced = _syncfs(dfd) == 0
            finally:
                os.close(dfd)
        if not synced:
            for seq in dirty:
                fd = self._fds.get(seq)
                if fd is not None:
                    os.fsync(fd)
                else:
                    fd = os.open(self.path(self.buckets[seq]), os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
        self._dirty.clear()
        if self._parent_dirty:
            fsync_dir(self.dir.parent)
            self._parent_dirty = False
        if self._dir_dirty and self.dir.exists():
            fsync_dir(self.dir)
            self._dir_dirty = False

    def state(self) -> dict[str, Any]:
        return {"next": self.next_seq, "list": [b.to_list() for b in self.buckets.values()]}

    def deletable(self) -> list[int]:
        return [b.seq for b in self.buckets.values() if b.live <= 0 and b.loaded >= b.size]

    def delete(self, seq: int) -> None:
        b = self.buckets.pop(seq, None)
        if b is None:
            return
        self._close_fd(seq)
        self.by_range.pop((b.start, b.width), None)
        key = (b.end, b.start, b.seq)
        if key in self.unloaded:
            self.unloaded.remove(key)
            self._min_due_stale = True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(b))
        self._dir_dirty = True

    def restore(self, state: dict[str, Any] | None) -> None:
        """Reopen the buckets named by a checkpoint; delete every other bucket file."""
        self.close()
        self.buckets.clear()
        self.by_range.clear()
        self.unloaded.clear()
        self._min_due_stale = True
        known: set[Path] = set()
        if state:
            self.next_seq = int(state.get("next", 1))
            for v in state.get("list", []):
                b = Bucket.from_list(v)
                p = self.path(b)
                if not p.exists():
                    if b.live <= 0 and b.loaded >= b.size:
                        continue  # deleted by the reclaim that followed the checkpoint
                    raise StoreError(f"{p}: bucket file is missing but the checkpoint says it holds "
                                     f"{b.live} live records")
                fd = os.open(p, os.O_RDWR)
                self._fds[b.seq] = fd
                self.buckets[b.seq] = b
                self._check_header(b, fd)
                if os.fstat(fd).st_size != b.size:
                    os.ftruncate(fd, b.size)  # records appended after the checkpoint are replayed
                    self._dirty.add(b.seq)
                known.add(p)
                if b.loaded < b.size:
                    insort(self.unloaded, (b.end, b.start, b.seq))
                    self.by_range[(b.start, b.width)] = b.seq
                self._evict()
        else:
            self.next_seq = 1
        if self.dir.exists():
            for p in self.dir.glob("*.bkt"):
                if p not in known:
                    p.unlink()
                    self._dir_dirty = True

    def disk_bytes(self) -> int:
        return sum(b.size for b in self.buckets.values())

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._dirty.clear()
