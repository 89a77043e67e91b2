"""Preallocated, memory-mapped files with a self-checking header.

Every on-disk file of the store (commit-log segments, level queue files, the id index, the
wheel's slot file and timer log) starts with the same 64-byte header::

    0   8s   magic      file kind, e.g. b"KDSLOG\\0\\1"
    8   u32  version    format version of that kind
    12  u32  header     header size (64): data starts here
    16  u64  geom_a     geometry, meaning per kind (segment bytes; entry size; ...)
    24  u64  geom_b     geometry, meaning per kind (entries per file; capacity; ...)
    32  u64  base       the file's first position (segment base; first entry index)
    40  u8[20] reserved (0)
    60  u32  crc        CRC32C of bytes [0, 60)

Opening a file whose magic, version or geometry differs from what the configuration expects is
refused with ``GeometryMismatch`` naming both values: an operator who changed ``segment-bytes``
gets a clear error instead of a silently misread store (RocketMQ's ``TimerLog.UNIT_SIZE`` is
fixed for the same reason).

Files are created at full size with ``ftruncate`` (sparse until written), so the mapping never
has to grow and a write never fails half-way for lack of space in the file.

Resident pages. Every page of a mapping the process has read or written stays mapped into it
and counts in its RSS (``RssFile``) until it is unmapped, although it is page cache. The owners
of the files call ``drop_pages`` (``PartitionStore.trim``, docs/storage.md 9): ``MADV_DONTNEED``
on a ``MAP_SHARED`` file mapping only removes the pages from this process's page tables; the
data stays in the page cache (dirty pages included: the kernel moves the dirty bit to the page
and writes it back as usual) and the next access faults it back in from there.

Read-around. A fault on a page that is not in the page cache reads a window around it
(``read_ahead_kb`` of the device: 128 KiB by default, 8 MiB on some VMs): for a hole in a sparse
file, the kernel zeroes the whole window in that one fault. A loop appending 300-byte records
into a fresh segment took such a fault every 8 MiB, and one fault zeroed 8 MiB in 50-83 ms of
system time (measured: `perf` on the loop thread, six partitions filling on a fresh VM whose
memory the host had not yet backed). ``MADV_RANDOM`` (``random=True``, ``random_access``) makes a
fault read its own page only (measured: 29 us and one page, against 6.5 ms and 2,048 pages), so
the same zeroing is spread over the appends, a page at a time. The owners open the file they
append to and the id table (probed at random) that way, and set a file back once it is sealed:
reads of a sealed segment, due records in append order, gain from the read-ahead.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Generic, TypeVar

from crc32c import crc32c

from sidecar import logs
from sidecar.runtime.threads import demote_self

HEADER = struct.Struct("<8sIIQQQ20sI")
HEADER_SIZE = 64
assert HEADER.size == HEADER_SIZE
_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)
_RANDOM: int | None = getattr(mmap, "MADV_RANDOM", None)
_NORMAL: int | None = getattr(mmap, "MADV_NORMAL", None)
# A file creation slower than SLOW_CREATE_S is logged at debug (it stalls the loop that asked), one
# slower than SLOW_CREATE_WARN_S as a warning. Why the second threshold: the files created with
# their header synced (the id index and the wheel's slot file, at a partition's open) wait for a
# journal commit, 20-300 ms on a loaded volume (measured), which at a partition's open delays
# nothing that is due; the files created while records flow (segments, timer-log and queue files)
# skip that sync and take ~1 ms. A second is a volume that cannot keep up with the sidecar's syncs
# whatever the file: deliveries wait as long, which the operator can act on.
SLOW_CREATE_S = 0.02
SLOW_CREATE_WARN_S = 1.0
log = logs.get("sidecar.store")


class StoreError(RuntimeError):
    """The store cannot be opened or used as configured."""


class GeometryMismatch(StoreError):
    pass


def header_bytes(magic: bytes, version: int, geom_a: int, geom_b: int, base: int) -> bytes:
    """A file's header: magic, version, header size, geometry, base, CRC32C of the first 60 bytes."""
    head = HEADER.pack(magic, version, HEADER_SIZE, geom_a, geom_b, base, b"", 0)
    return HEADER.pack(magic, version, HEADER_SIZE, geom_a, geom_b, base, b"", crc32c(head[:60]))


class MappedFile:
    __slots__ = ("base", "buf", "geom_a", "geom_b", "magic", "mm", "path", "size")

    def __init__(
        self,
        path: Path,
        *,
        magic: bytes,
        version: int,
        size: int,
        geom_a: int,
        geom_b: int,
        base: int,
        create: bool,
        sync_header: bool = True,
        random: bool = False,
    ) -> None:
        self.path = path
        self.magic = magic
        self.size = size
        self.geom_a = geom_a
        self.geom_b = geom_b
        self.base = base
        started = time.perf_counter()
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o644)
        head = b""
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                # The header is read with pread, not through the mapping: a fault on a page the
                # cache no longer holds reads the device's read-around window with it (8 MiB on
                # the reference VM), and a restart opens every segment: 0.55-0.85 s per partition
                # at 100M pending on six, 7.6 s for one (the ``scale`` bench scenario's restart).
                # pread reads the page and the few after it.
                head = os.pread(fd, HEADER_SIZE, 0)
                actual = os.fstat(fd).st_size
                if actual != size:
                    # a file of another format version is sized differently: say which version
                    if len(head) == HEADER_SIZE and head[:8] == magic:
                        ver = HEADER.unpack_from(head, 0)[1]
                        if ver != version:
                            raise GeometryMismatch(f"{path}: format version {ver}, this build reads {version}")
                    raise GeometryMismatch(
                        f"{path}: file size {actual} differs from the configured {size}"
                    )
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.buf = memoryview(self.mm)
        if random:  # before the header's write: its fault would read the window around it
            self.random_access()
        if create:
            self.buf[:HEADER_SIZE] = header_bytes(magic, version, geom_a, geom_b, base)
            if sync_header:  # False: the caller syncs the whole file before anything names it
                self.mm.flush(0, min(mmap.PAGESIZE, size))
            took = time.perf_counter() - started
            if took > SLOW_CREATE_WARN_S:
                log.warning("store.slow_file_create", path=str(path), size=size, ms=round(took * 1000, 1),
                            synced_header=sync_header,
                            action="the data directory's volume is slow to sync (deliveries wait as long): check its "
                                   "latency and IOPS limits, or move data-dir to a faster volume")
            elif took > SLOW_CREATE_S:
                log.debug("store.slow_file_create", path=str(path), size=size, ms=round(took * 1000, 1),
                          synced_header=sync_header)
        else:
            self._check(version, head)

    def _check(self, version: int, head: bytes) -> None:
        if len(head) < HEADER_SIZE:
            self.close()
            raise StoreError(f"{self.path}: file header is corrupt (only {len(head)} bytes)")
        magic, ver, hsize, ga, gb, base, _r, crc = HEADER.unpack_from(head, 0)
        if crc32c(head[:60]) != crc:
            self.close()
            raise StoreError(f"{self.path}: file header is corrupt (CRC mismatch)")
        if magic != self.magic:
            self.close()
            raise StoreError(f"{self.path}: not a {self.magic!r} file (magic {magic!r})")
        if ver != version or hsize != HEADER_SIZE:
            self.close()
            raise GeometryMismatch(f"{self.path}: format version {ver}, this build reads {version}")
        if (ga, gb) != (self.geom_a, self.geom_b):
            self.close()
            raise GeometryMismatch(
                f"{self.path}: file geometry ({ga}, {gb}) differs from the configured ({self.geom_a}, {self.geom_b})"
            )
        if base != self.base:
            self.close()
            raise StoreError(f"{self.path}: base {base} does not match its name ({self.base})")

    def flush(self, start: int = 0, end: int | None = None) -> None:
        """msync the byte range (page-aligned outward) to disk (inside ``deferred_sync``: note
        the file for the batch instead)."""
        sink = _deferred.batch
        if sink is not None:
            sink.add_file(self)
            return
        end = self.size if end is None else min(end, self.size)
        start = start - start % mmap.PAGESIZE
        if end > start:
            self.mm.flush(start, end - start)

    def drop_pages(self, start: int = 0, end: int | None = None) -> None:
        """Unmap the resident pages of the byte range (page-aligned outward) from this process:
        ``MADV_DONTNEED``, see the module docstring. Costs a few µs for a range with nothing
        resident, plus the unmapping of each resident page (at 100M pending, 55-78 ms for six
        stores' files); nothing is lost, not even data never msynced. Inside ``deferred_drops`` the
        range goes to the page thread instead (``PageWorker``). A no-op where the platform lacks the
        advice, on a closed mapping, or if the kernel refuses it (e.g. locked memory)."""
        end = self.size if end is None else min(end, self.size)
        start = max(start - start % mmap.PAGESIZE, 0)
        if _DONTNEED is None or end <= start or self.mm.closed:
            return
        sink = _deferred.drops
        if sink is not None:  # inside deferred_drops: the page thread does it
            sink.append((self.mm, start, end - start))
            return
        with contextlib.suppress(OSError):
            self.mm.madvise(_DONTNEED, start, end - start)

    def random_access(self, on: bool = True) -> None:
        """``MADV_RANDOM`` on the whole mapping (``on``), or back to ``MADV_NORMAL``: a fault then
        reads only its own page, not a read-ahead window (see the module docstring). A no-op where
        the platform lacks the advice or on a closed mapping; advice the kernel refuses is ignored
        (it changes timing, never data)."""
        advice = _RANDOM if on else _NORMAL
        if advice is None or self.mm.closed:
            return
        with contextlib.suppress(OSError):
            self.mm.madvise(advice)

    def appended_after(self, sealed: MappedFile | None) -> None:
        """This file is the one appended to from now on and ``sealed`` (if any) the one before it:
        no read-around on this file's faults, read-ahead back on the sealed one, which is only
        read in order from now on (see the module docstring)."""
        self.random_access()
        if sealed is not None:
            sealed.random_access(False)

    @contextmanager
    def scanning(self) -> Iterator[None]:
        """Read-ahead on for a sequential scan of a file kept ``random_access`` otherwise."""
        self.random_access(False)
        try:
            yield
        finally:
            self.random_access()

    def close(self) -> None:
        try:
            self.buf.release()
            self.mm.close()
        except (BufferError, ValueError):
            pass  # views into the mapping are still alive: the last one's release unmaps

    def dispose(self, unlink: bool = False) -> None:
        """``close`` (and delete the file, ``unlink``) for good: the store drops the file. Inside
        ``deferred_disposal`` this only notes it for the disposal, run later on another thread;
        the caller must not touch the file again either way."""
        sink = _deferred.disposal
        if sink is not None:
            sink.files.append((self, unlink))
            return
        self._drop(unlink)

    def _drop(self, unlink: bool) -> None:
        self.close()
        if unlink:
            _unlink(self.path)


def unborn(path: Path) -> bool:
    """True if ``path`` is an interrupted creation: empty, or nothing but zeros. A process killed
    between ``open(O_CREAT)``, ``ftruncate`` and the header write leaves such a file; it holds no
    data (everything is written after the header), so its owner may delete it and carry on."""
    with open(path, "rb") as f:
        chunk = f.read(HEADER_SIZE)
        while chunk:
            if chunk.count(0) != len(chunk):
                return False
            chunk = f.read(1 << 20)
    return True


def headerless(path: Path) -> bool:
    """True if ``path``'s header is all zeros (or the file is shorter than one): a file created
    with ``sync_header=False`` whose header never reached the disk. Its owner syncs the header with
    the first flush that covers anything in the file, before any checkpoint can name the file, so
    such a file holds nothing a checkpoint needs (only after a power loss can one exist at all)."""
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
    return len(head) < HEADER_SIZE or head.count(0) == HEADER_SIZE


def fsync_dir(path: Path) -> None:
    sink = _deferred.batch
    if sink is not None:
        sink.add_dir(path)
        return
    _fsync_dir_now(str(path))


def _fsync_dir_now(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SyncBatch:
    """The syncs the store asked for inside ``deferred_sync``, to be done later, on any thread.

    Each file is synced whole with ``fdatasync`` on its own descriptor (opened now, so a file
    renamed or deleted meanwhile is still the one synced). On Linux that writes back the pages
    dirtied through a shared mapping exactly as ``msync`` does (both are the page cache's
    writeback of the file), and unlike ``mmap.flush`` it releases the GIL: the event loop keeps
    running while the disk works. Syncing more than the dirty ranges costs nothing extra (clean
    pages are not written)."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}
        self.renames: list[tuple[str, str, Callable[[], None] | None]] = []
        self.dirs: list[str] = []

    def add_file(self, mf: MappedFile) -> None:
        self.add_path(mf.path)

    def add_path(self, path: Path) -> None:
        """A file written with ``write`` or through a mapping, synced whole (``fdatasync``)."""
        key = str(path)
        if key not in self.files:
            self.files[key] = os.open(key, os.O_RDONLY)

    def add_rename(self, src: Path, dst: Path, done: Callable[[], None] | None = None) -> None:
        """``os.replace(src, dst)`` after every file is synced and before the directories are:
        a file (added before) takes its name only once its contents are on the disk. ``done``
        runs right after the rename (on the thread that runs the batch)."""
        self.renames.append((str(src), str(dst), done))

    def add_dir(self, path: Path) -> None:
        if str(path) not in self.dirs:
            self.dirs.append(str(path))

    def run(self) -> None:
        """Sync every file, then rename, then sync every directory; close the descriptors either
        way."""
        try:
            for fd in self.files.values():
                os.fdatasync(fd)
            for src, dst, done in self.renames:
                os.replace(src, dst)
                if done is not None:
                    done()
            for d in self.dirs:
                _fsync_dir_now(d)
        finally:
            self.close()

    def close(self) -> None:
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()


class Disposal:
    """Store files dropped inside ``deferred_disposal``: closed (and deleted) later, on any thread.

    Why not on the loop thread: whoever drops the last reference to a file that is no longer
    linked frees its blocks then and there, in the ``munmap`` of its mapping or the ``unlink`` of
    its name, whichever comes last. For a 64 MiB log segment on ext4 that took 52-58 ms
    (measured: ``mmap.close`` of an unlinked segment; 5 ms when the file is still linked), a stall
    of every delivery at each segment roll. Both calls release the GIL. Files that are not mapped
    (the id index's merged journals, ``remove_file``) go the same way: on a file system mounted
    with ``discard`` the ``unlink`` of a 4 MiB journal waits for the device's discards, 25-77 ms
    of the loop's wall time in a 100M-pending run (``perf`` on the loop: ``blkdev_issue_discard``
    under ``unlink``, 11 a minute on six partitions)."""

    def __init__(self) -> None:
        self.files: list[tuple[MappedFile, bool]] = []
        self.paths: list[Path] = []

    def __bool__(self) -> bool:
        return bool(self.files) or bool(self.paths)

    def run(self) -> None:
        """Close (and delete) every file; a failure is logged, not raised: nothing names these
        files any more, and one left behind is deleted after the next start (recovery, reclaim)."""
        for f, unlink in self.files:
            try:
                f._drop(unlink)
            except OSError as e:
                log.warning("store.delete_failed", path=str(f.path), error=str(e))
        self.files.clear()
        for path in self.paths:
            try:
                _unlink(path)
            except OSError as e:
                log.warning("store.delete_failed", path=str(path), error=str(e))
        self.paths.clear()


def remove_file(path: Path) -> None:
    """Delete a store file nothing names any more (gone already is fine). Inside
    ``deferred_disposal`` only noted, for the disposal's thread (see ``Disposal``)."""
    sink = _deferred.disposal
    if sink is not None:
        sink.paths.append(path)
        return
    _unlink(path)


def _unlink(path: Path) -> None:
    """Delete a file that nothing names any more: one already gone (deleted by an earlier run
    whose checkpoint did not get written, or by recovery) is what was wanted."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


_Item = tuple[mmap.mmap, int, int] | list[tuple[mmap.mmap, int, int]] | Callable[[], None]


class PageWorker:
    """One thread that works on mapped pages for the loop: faults pages in before the loop writes
    them (``populate``), and unmaps pages the loop no longer needs (``drop``).

    **Populate.** The first store into each page of a sparse mapped file faults (a page-cache page
    allocated and zeroed, its block reserved): ~7 us a page on the reference VM when the host has
    the memory at hand, 0.15 us a page once faulted in (measured, 64 MiB written a byte a page).
    The commit log appends 260-byte records, 64 faults per 1,000 records on the loop thread, and
    where the host has to back a fresh page first those turns took 50-99 ms (``pages.c``). The log
    asks for the pages a few MiB ahead of its head (``CommitLog.prefault``); this thread faults them
    in with ``MADV_POPULATE_WRITE``, the GIL released, without changing a byte (so the loop may
    append to the same pages meanwhile: whichever faults first, the other finds the page mapped).

    **Drop.** ``PartitionStore.trim`` unmaps the pages of the store's files every few seconds
    (``MADV_DONTNEED``: RSS follows what was touched lately, docs/storage.md 9). At 100M pending
    on six partitions that took the loop 55-78 ms of system time every 3.2 s (the id tables'
    random pages: each 512 MiB table had tens of thousands mapped). Inside ``deferred_drops`` the
    ranges are handed here instead and unmapped with the GIL released, in steps, so the process's
    mmap_lock is never held long. Dropping a page the loop touches meanwhile only costs it a fault
    from the page cache; nothing is lost (the kernel keeps the dirty bit on the page).

    **Create.** The next commit-log segment, level-queue or timer-log file and id-index journal is
    created here ahead of the loop that needs it (``Spare``, ``call``): a creation on the loop took
    43-66 ms twice, and 200 ms once for a journal, in the 100M ``scale`` bench scenario:
    ``open(O_CREAT)`` and the first write wait for the file system's journal under load.

    Requests run in order and are never waited for: a populate the thread has not reached when the
    loop gets there only costs the loop its own faults, a drop not done yet only leaves RSS higher
    for a moment, a file not created yet is created by the loop (``Spare.take``). Populates and
    drops are off where the C extension is not built (nothing else works on pages without the
    GIL): the loop then drops its own pages and faults its own. A kernel without
    ``MADV_POPULATE_WRITE`` (before Linux 5.14: EINVAL) stops the populating, once, not the drops.
    One per process (the loop's: ``Sidecar.pages``), handed to each store."""

    def __init__(self, populate: Callable[[mmap.mmap, int, int], int] | None,
                 drop: Callable[[list[tuple[mmap.mmap, int, int]]], int] | None = None, demote: bool = True) -> None:
        self._populate = populate
        self._drop = drop
        self._demote = demote  # the ``helper-threads`` setting: "none" keeps every thread as it starts
        # (mapping, start, length): a populate; a list of them: a trim's drops, done in one C call;
        # a callable: ``call``
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.enabled = populate is not None  # populate requests are taken
        self.drops = drop is not None  # drop requests are taken
        self.pages = 0  # faulted in so far (counted in bytes / PAGESIZE of the ranges asked)
        self.dropped = 0  # ranges handed to drop so far

    def populate(self, mf: MappedFile | mmap.mmap, start: int, end: int) -> None:
        """Fault in ``[start, end)`` of ``mf`` (a mapped file, or anonymous memory; bytes, aligned
        outward to pages) soon, off this thread."""
        mm = mf if isinstance(mf, mmap.mmap) else mf.mm
        if self.enabled and end > start and not mm.closed:
            self._put((mm, start, end - start))

    def drop(self, ranges: list[tuple[mmap.mmap, int, int]]) -> None:
        """Unmap each ``(mapping, start, length)`` from this process soon, off this thread, all in
        one C call (``MappedFile.drop_pages`` inside ``deferred_drops``): the thread takes the GIL
        once for a whole trim, not once per file (a store has a range for each of its segments)."""
        if self.drops and ranges:
            self._put(ranges)

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on this thread soon, in order with the other requests (``Spare``): it must
        catch its own errors (one that escapes is logged and the thread goes on)."""
        self._put(fn)

    def _put(self, item: _Item) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="kds-pages", daemon=True)
                    self._thread.start()
        self._queue.put(item)

    def _run(self) -> None:
        if self._demote:
            demote_self()  # SCHED_BATCH: a finished request must not preempt the loop (runtime/threads.py)
        while True:
            item = self._queue.get()
            if item is None:
                return
            if callable(item):
                try:
                    item()
                except Exception as e:  # a bug: the requests behind it must still run
                    log.error("store.page_thread_error", error=repr(e))
                del item
                continue
            if isinstance(item, list):
                assert self._drop is not None
                self._drop(item)  # a refused drop (locked memory) only leaves pages mapped
                self.dropped += len(item)
                del item  # the last reference to a disposed file's mapping unmaps it here, not later
                continue
            mm, start, length = item
            del item
            self._populate_here(mm, start, length)
            del mm

    def _populate_here(self, mm: mmap.mmap, start: int, length: int) -> None:
        """A populate, on this (the page) thread."""
        try:
            assert self._populate is not None
            err = self._populate(mm, start, length)
        except (ValueError, BufferError):  # closed meanwhile: nothing left to fault
            err = 0
        if err:
            self.enabled = False
            log.info("store.prefault_off", errno=err, error=os.strerror(err))
        else:
            self.pages += -(-length // mmap.PAGESIZE)

    def populate_now(self, mf: MappedFile, start: int, end: int) -> None:
        """``populate``, done before returning: only on the page thread itself (inside a ``call``,
        as ``Spare`` makes a file), where a request queued instead would wait behind the others."""
        assert threading.current_thread() is self._thread
        if self.enabled and end > start and not mf.mm.closed:
            self._populate_here(mf.mm, start, end - start)

    def close(self) -> None:
        """Stop the thread once the requests before this call are done (they never wait long)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


# The pages of a file of fixed-size entries (a level queue, the timer log) asked ahead of its
# appends (``Ahead``): the first store into each page of the sparse file is a major fault (the
# page allocated in the page cache), one per 170 level-queue entries; on the loop, in the C
# intake, those were 96 % of the loop's major faults at 20M pending on six partitions
# (the ``scale`` bench scenario). 8,192 entries are 48-64 pages: over a second of appends at the bench's
# 40,000 records/s on six partitions.
ENTRIES_AHEAD = 8192
ENTRIES_AHEAD_LOW = 4096


class Ahead:
    """The pages an append-only run of files writes next, asked of the page thread
    (``PageWorker.populate``) before the appends get there: the commit log's segments (positions
    in bytes), a level queue's and the timer log's files (positions in entries). Whenever the
    next append's position ``pos`` comes within ``low`` of what was asked so far, ``ask`` asks for
    the rest up to ``span`` past it, never past the end of the file holding ``pos`` (the next file
    is asked for from its first append). Without a page thread (``pages`` None) it does nothing."""

    __slots__ = ("asked", "low", "pages", "span")

    def __init__(self, pages: PageWorker | None, span: int, low: int, asked: int = 0) -> None:
        self.pages = pages
        self.span = span
        self.low = low
        self.asked = asked  # positions before this were asked for

    def near(self, pos: int) -> bool:
        """Whether an append at ``pos`` should ``ask`` (the caller's cheap test, once per append)."""
        return pos + self.low > self.asked

    def ask(self, mf: MappedFile | None, pos: int, first: int, end: int, base: int, unit: int) -> None:
        """Ask for ``[max(asked, pos), min(pos + span, end))`` of ``mf``, the file holding the
        positions ``[first, end)`` from its byte ``base`` on, ``unit`` bytes each."""
        start, stop = max(self.asked, pos), min(pos + self.span, end)
        if mf is None or self.pages is None or start >= stop:
            return
        self.pages.populate(mf, base + (start - first) * unit, base + (stop - first) * unit)
        self.asked = stop


T = TypeVar("T")


def discard_mapped(f: MappedFile) -> None:
    """A ``Spare``'s ``discard`` for a mapped file: close it and delete it."""
    f.close()
    _unlink(f.path)


class Spare(Generic[T]):
    """The next file of a run of files (a commit log's segments, a level queue's or the timer
    log's files, the id index's journals), created on the page thread before the appends reach it,
    so the loop only takes it (``PageWorker``, "Create").

    The owner ``ask``s for the file starting at entry ``first`` once its appends are half-way
    through the file before it, and ``take``s it when an append needs it: the file the page thread
    made, or None when it is not there (never asked, asked for another ``first``, or the creation
    failed), and the owner creates it itself as before. A request the page thread has not started
    is cancelled by a ``take`` (the thread then skips it, so the two never create the same file);
    one it is working on is waited for (a creation: milliseconds). ``make(first)`` creates (and
    maps) the file and nothing else: the owner's bookkeeping for a new file (its directory to be
    synced, read-ahead off the sealed file) happens when it takes it, on the loop. A file made and
    never taken is deleted at ``close`` (``discard``: ``discard_mapped`` for a mapped file);
    a crash leaves it as an empty file of the run, which the owners open as any other or delete as
    one no checkpoint names (a mapped file's header is not synced: a power loss may leave it
    headerless, and then it is deleted at open). Without a page thread (``pages`` None) nothing is
    asked."""

    __slots__ = ("_cond", "_discard", "_file", "_first", "_state", "made", "make", "pages")
    ASKED, MAKING, READY = 1, 2, 3

    def __init__(self, pages: PageWorker | None, make: Callable[[int], T], discard: Callable[[T], None]) -> None:
        self.pages = pages
        self.make = make
        self._discard = discard
        self._cond = threading.Condition()
        self._first = -1
        self._state = 0  # 0: nothing asked (or taken); else ASKED, MAKING, READY
        self._file: T | None = None
        self.made = 0  # files the page thread created

    def ask(self, first: int) -> None:
        """Have the file for entries from ``first`` on created ahead (idempotent). A file made for
        another ``first`` and not taken (the owner moved on: a restore) is deleted."""
        if self.pages is None or (self._state and self._first == first):
            return
        self.close()
        with self._cond:
            self._first, self._state = first, self.ASKED
        self.pages.call(self._run)

    def _run(self) -> None:
        with self._cond:
            if self._state != self.ASKED:  # taken (cancelled) before this thread got to it
                return
            self._state = self.MAKING
            first = self._first
        f: T | None = None
        try:
            f = self.make(first)
        except (OSError, StoreError) as e:  # the loop creates it itself, and meets the error there
            log.debug("store.spare_failed", first=first, error=str(e))
        with self._cond:
            self._file = f
            self._state = self.READY
            if f is not None:
                self.made += 1
            self._cond.notify_all()

    def _reset(self) -> T | None:
        """Cancel or finish what was asked; the file made for it, if any."""
        with self._cond:
            while self._state == self.MAKING:
                self._cond.wait()
            f, self._file, self._state, self._first = self._file, None, 0, -1
        return f

    def take(self, first: int) -> T | None:
        """The file for entries from ``first`` on, if the page thread made it (else None)."""
        if not self._state or self._first != first:
            return None
        return self._reset()

    def close(self) -> None:
        """Delete a file made and never taken."""
        f = self._reset()
        if f is not None:
            self._discard(f)


def page_worker(demote: bool = True) -> PageWorker:
    """A PageWorker with the C extension's ``populate`` and ``drop`` (disabled where it is not
    built); ``demote`` False leaves its thread at the process's policy (``helper-threads = none``)."""
    from sidecar.store.codec import NATIVE, native

    if not NATIVE:
        return PageWorker(None, None, demote)
    return PageWorker(getattr(native, "populate", None), getattr(native, "drop", None), demote)


class _Deferred(threading.local):
    batch: SyncBatch | None = None
    disposal: Disposal | None = None
    drops: list[tuple[mmap.mmap, int, int]] | None = None


_deferred = _Deferred()


def current_batch() -> SyncBatch | None:
    """The batch collecting this thread's syncs (inside ``deferred_sync``), else None."""
    return _deferred.batch


@contextmanager
def deferred_sync() -> Iterator[SyncBatch]:
    """Collect, instead of doing, every ``MappedFile.flush`` and ``fsync_dir`` of this thread
    inside the block; the caller runs (or closes) the returned batch."""
    prev, batch = _deferred.batch, SyncBatch()
    _deferred.batch = batch
    try:
        yield batch
    except BaseException:
        batch.close()
        raise
    finally:
        _deferred.batch = prev


@contextmanager
def deferred_disposal() -> Iterator[Disposal]:
    """Collect, instead of doing, every ``MappedFile.dispose`` of this thread inside the block;
    the caller runs the returned disposal (on another thread, once nothing uses those files)."""
    prev, sink = _deferred.disposal, Disposal()
    _deferred.disposal = sink
    try:
        yield sink
    finally:
        _deferred.disposal = prev


@contextmanager
def deferred_drops(worker: PageWorker | None) -> Iterator[None]:
    """Hand every ``MappedFile.drop_pages`` of this thread inside the block to ``worker``'s thread
    (in one go, at the end) instead of doing it; without a worker taking drops, they run inline."""
    if worker is None or not worker.drops or _deferred.drops is not None:
        yield
        return
    sink: list[tuple[mmap.mmap, int, int]] = []
    _deferred.drops = sink
    try:
        yield
    finally:
        _deferred.drops = None
        worker.drop(sink)


def atomic_write(path: Path, data: bytes) -> None:
    """temp file, fsync, rename, fsync of the directory: the file is either old or new."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
