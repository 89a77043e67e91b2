"""The id index: ``delay.id`` -> scheduler ref, a hash table on disk with a staged write path.

``delay.id`` deduplication and ``delay.cancel`` need "which pending record has this id?" for
hundreds of millions of pending records. A Python dict would cost ~100 bytes of RAM per record;
the table costs 16 bytes of *file* per slot and no per-record Python object.

Slot layout (sidecar/store/idslot.py; 16 bytes, little-endian): ``u64 hash`` (0 empty, 1
tombstone, else the id's 64-bit BLAKE2b digest forced >= 2), ``u64 ref``. Linear probing, at most
half the slots occupied.

**Why staged.** On the reference VM a random write into a GiB table costs 27-75 us of CPU
(a page fault through the mapping, or ``pwrite``'s block allocation), a probe under 1 us, and a
sequential rewrite about 1.3 us per 4 KiB page (``bench/micro/index_io.c``; docs/benchmarks.md,
"The id index's write path"). A loop that writes its table at random cannot keep 40,000 inserts/s once the
table is GiBs. So the loop never writes the table:

- **table** ``ids.idx``: mapped by the loop for probes only; written only by merge passes.
- **open stage**: a small table in anonymous memory with the same slot layout (the C probes and
  the C intake work on it unchanged). Every insert and remove of the loop goes there, and is
  appended as a 16-byte record to the generation's **journal** (``ids.jnl.<g>``,
  sidecar/store/idjournal.py): ``(hash, ref)`` an insert, a marker then ``(hash, ref)`` a remove
  (sidecar/store/idslot.py).
  The journal reaches the disk in the checkpoint's durability batch, before the checkpoint that
  names it.
- **cut**: when the open stage holds ``cut_ops`` operations (``CUT_SHARE`` of the table's slots,
  at least ``CUT_MIN``), or ``CUT_S`` passed with operations in it, or ``IDLE_PASS_S`` passed at
  all (the sweep below; a cut by age may wait for other indexes' passes, "Turns"), and no pass
  runs: the open generation is sealed and a new one opens. A worker thread (``_Pass`` on
  ``_Workers``: kept between passes, ``SCHED_BATCH``, its native work ``SCHED_IDLE``: it must not
  take the loop's CPU) reads the sealed journal back from its
  file and merges its records into the table in one ascending pass (``idmerge.merge_journal``,
  in C without the GIL): the last operation on each pair wins, the chunks are rewritten in slot
  order with their writeback started as it goes, then synced. The pass counts the table's live
  and tombstone slots exactly, and removes the pre-cancels older than the cancel horizon: expired
  pre-cancels leave within twice ``IDLE_PASS_S`` + a pass of their expiry, probed or not.
- **while the pass runs**, the loop probes three tables: open stage, sealed stage, table. The pass
  leaves the table valid for a concurrent reader at every write (merge.c). When it is done (noticed
  at an index step), the sealed stage is dropped: its entries are in the table.
- **growth**: a cut whose inserts would take the table past half full first rebuilds it
  (``idmerge.rebuild``) into ``ids.idx.next.<n>``, twice the size when it would be a quarter full,
  else the same size (that sheds the tombstones), then merges the generation into it; the loop
  maps it when the pass is done, and it takes the name ``ids.idx`` at the next flush, in the
  durability order (synced, renamed, directory synced, then the checkpoint). No growth pauses the
  loop: it costs the thread a sequential copy.

**Tags.** A probe of the table for an id it does not hold (every new id's duplicate check) reads
the slots of its chain: random pages of a GiB file, which the kernel may have evicted (proactive
reclaim evicts idle file pages with GiBs free), and then the loop waits for the disk, 100-250 ms
behind a pass's writeback. So beside the table the index keeps its *tags*, a byte per slot in
anonymous memory (idslot.tag: empty, tombstone, or the hash's top byte): the C probes walk the
tags and read a slot only where its tag is the id's, 1 in 252 occupied slots for an absent id. Passes
keep them: every pass reads every chunk of the table, and rewrites each chunk's tags once the chunk
is written (merge.c), in place while the loop reads them (a tag is always its slot's state before
or after the pass, as safe as the slot itself), or into fresh ones for a rebuilt table. The tags
are not stored: after an open the table is probed without them until the first pass has built
them. 1 byte per slot: 2-4 bytes of RSS per live entry. Without the accelerator there are none.
Where a tag matches, the C intake reads the slot only if its page is in memory (``mincore``;
``intake_state(resident=True)``): else it stops before the record, ``read_page`` reads the page
on the page thread, and the loop holds the partition until it is in (sidecar/engine/loop.py,
``_page_wait``): the loop never waits for the disk for a duplicate check, only that partition
does, for a moment.

**Turns.** A process's indexes (one per partition) take turns for the passes that a cut by age
starts: while a pass of any index runs (``_Workers.busy``), a generation due only by its age
(``CUT_S`` with operations, ``IDLE_PASS_S`` without) waits, up to twice that age; a full stage
(``cut_ops``) is cut at once. Why: partitions filled at the same rate since the same second cut
by age in the same second, and their passes, each reading its whole table, ran together every
30 s; at 100M pending on six partitions the loop's stalls kept that beat (the ``scale`` bench
scenario). Taking turns spreads the same reads and writes over the 30 s.

**Removes are seen late.** A pair removed while it is in the table or the sealed stage stays
there until the pass of the remove's generation. For scheduler refs that is harmless: every hit
is verified by the caller against the stored record, and a ref no longer pending is ignored. A
pre-cancel is matched on the hash alone, so removed pre-cancels are kept in a small shadow set
that ``find`` subtracts, until the pass that takes them out of the table.

**Checkpoint and recovery.** The checkpoint's ``ids``: the table's capacity and counts (exact as of
the last pass) and the journals still needed, ``journals: [[g, length], ...]`` (the sealed one, if
its pass has not finished, and the open one, at the length the flush made durable). A journal
whose pass has finished is deleted after the next checkpoint, which no longer names it (by the
checkpoint's disposal, off the loop: ``mapped.remove_file``). At open:
every ``ids.idx.next.*`` is deleted (a rebuilt table is named before any checkpoint relies on it),
the journals named are read up to their checkpointed length (verified; what follows was written
after the checkpoint and is replayed from Kafka and journaled again) and the others deleted; the
records are loaded into a stage (C ``idx_apply``) that is sealed at once, and its pass runs again
in the background. A pass is idempotent (the same records applied again leave the same table),
and a pass cut short by the crash left the table valid: the re-run finishes it and counts it.
A checkpoint of the earlier format (no ``journals``: the table written in place, perhaps
mid-migration into ``ids.idx.next.<n>``) is upgraded at open: the migration is finished and the
table counted, once.

The index is a cache over the truth: every hit is verified against the stored record's id (a
64-bit collision costs a verification, never a wrong answer).

The probes (``find``, ``put``, ``remove``) and ``id_hash`` have C twins in ``sidecar._native``
(the same slots written, property-tested against these Python versions); an index opened with
``native=False``, or with ``KDS_PURE_PYTHON=1``, runs the Python ones.

A ref with the top bit set is a *pre-cancel*: a cancel that arrived before its message; the low
bits hold the cancel's time (epoch ms) so it can expire after the cancel horizon.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar import logs
from sidecar.runtime.heap import release_heap
from sidecar.runtime.threads import demote_self
from sidecar.store import idjournal, idmerge
from sidecar.store.codec import NATIVE
from sidecar.store.codec import native as _native
from sidecar.store.idslot import (
    CUT_MIN,
    EMPTY,
    INITIAL_SLOTS,
    PRECANCEL,
    REMOVE_MARK,
    SLOT,
    SLOT_SIZE,
    TOMB,
    journal_ops,
)
from sidecar.store.intake_layout import Common
from sidecar.store.mapped import (
    HEADER,
    HEADER_SIZE,
    MappedFile,
    PageWorker,
    Spare,
    StoreError,
    current_batch,
    fsync_dir,
    header_bytes,
    unborn,
)

__all__ = ["EMPTY", "HEADER_SIZE", "PRECANCEL", "SLOT", "SLOT_SIZE", "TOMB", "IdIndex", "id_hash"]

MAGIC = b"KDSIDX\x00\x01"
VERSION = 2  # 2: a table's header base is the capacity it was migrated from (read, no longer written)
READS = (1, 2)  # a version-1 table is a version-2 one no migration ever wrote
NEXT = "ids.idx.next."
CUT_SHARE = 1 / 128  # else this share of the table's slots: a pass every ~1/128 of the table written
CUT_S = 30.0  # a generation with operations in it is cut after this long (s)
IDLE_PASS_S = 120.0  # and one without, after this long: the pass sweeps expired pre-cancels
PASS_CHUNK = 1 << 16  # slots a pass reads and writes at a time (1 MiB)
RETRY_S = 5.0  # a pass that failed (disk full, I/O error) is run again after this long
_COUNT_CHUNK = 1 << 18  # slots per bytes.count pass (4 MiB copied)
_FF = b"\xff" * _COUNT_CHUNK
_EMPTY_HASH = bytes(8)
_U64 = struct.Struct("<Q")
_TOMB_HASH = _U64.pack(TOMB)
log = logs.get("sidecar.store")


def py_id_hash(rid: bytes | memoryview, _blake2b: Any = hashlib.blake2b, _from_bytes: Any = int.from_bytes) -> int:
    """The 64-bit BLAKE2b digest of ``rid``, little-endian, forced >= 2 (0 and 1 mark slots)."""
    h: int = _from_bytes(_blake2b(rid, digest_size=8).digest(), "little")
    return h if h >= 2 else h + 2


id_hash = _native.id_hash if NATIVE else py_id_hash


# -- the probes on one table, in Python (the C twins: sidecar/native/idindex.c) ----------------------
def _py_find(buf: Any, mask: int, h: int) -> list[int]:
    i = h & mask
    out: list[int] = []
    while True:
        sh, ref = SLOT.unpack_from(buf, HEADER_SIZE + i * SLOT_SIZE)
        if sh == EMPTY:
            return out
        if sh == h:
            out.append(int(ref))
        i = (i + 1) & mask


def _py_put(buf: Any, mask: int, h: int, ref: int) -> int:
    """0 if (h, ref) is there already; else the byte offset written, negated for a tombstone."""
    i = h & mask
    free = -1
    while True:
        off = HEADER_SIZE + i * SLOT_SIZE
        sh, sref = SLOT.unpack_from(buf, off)
        if sh == EMPTY:
            break
        if sh == h and sref == ref:
            return 0
        if sh == TOMB and free < 0:
            free = off
        i = (i + 1) & mask
    if free >= 0:
        SLOT.pack_into(buf, free, h, ref)
        return -free
    SLOT.pack_into(buf, off, h, ref)
    return off


def _py_remove(buf: Any, mask: int, h: int, ref: int) -> tuple[int, int] | None:
    """Remove (h, ref): None if absent, else (its byte offset, the change in tombstones)."""
    i = h & mask
    while True:
        off = HEADER_SIZE + i * SLOT_SIZE
        sh, sref = SLOT.unpack_from(buf, off)
        if sh == EMPTY:
            return None
        if sh == h and sref == ref:
            nxt = HEADER_SIZE + ((i + 1) & mask) * SLOT_SIZE
            if _U64.unpack_from(buf, nxt)[0] != EMPTY:
                _U64.pack_into(buf, off, TOMB)
                return off, 1
            # The chain ends right after this slot: no probe needs it, nor the tombstones just
            # before it. Emptying them keeps deliveries from filling the stage with tombstones,
            # which count toward its half-full limit (a cut, or the stage's growth, early). The
            # merge pass empties the table's the same way (merge.c): there a table full of
            # tombstones is rebuilt by the next growth pass (a same-size one sheds them).
            _U64.pack_into(buf, off, EMPTY)
            tombs = 0
            j = (i - 1) & mask
            while _U64.unpack_from(buf, HEADER_SIZE + j * SLOT_SIZE)[0] == TOMB:
                _U64.pack_into(buf, HEADER_SIZE + j * SLOT_SIZE, EMPTY)
                tombs -= 1
                j = (j - 1) & mask
            return off, tombs
        i = (i + 1) & mask


def _py_copy(old: Any, new: Any, lo: int, hi: int, mask: int) -> tuple[int, int, int]:
    """Insert the live slots ``lo <= k < hi`` of ``old`` into ``new`` (``mask``): (live slots
    seen, inserted, tombstones reused)."""
    seen = inserted = reused = 0
    for k in range(lo, hi):
        h, ref = SLOT.unpack_from(old, HEADER_SIZE + k * SLOT_SIZE)
        if h <= TOMB:
            continue
        seen += 1
        r = _py_put(new, mask, h, ref)
        if r == 0:
            continue
        inserted += 1
        reused += r < 0
    return seen, inserted, reused


def _py_expired(buf: Any, lo: int, hi: int, cutoff: int) -> list[tuple[int, int]]:
    """(hash, ref) of every pre-cancel among slots ``lo <= k < hi`` made before ``cutoff`` (ms)."""
    out = []
    for k in range(lo, hi):
        h, ref = SLOT.unpack_from(buf, HEADER_SIZE + k * SLOT_SIZE)
        if h > TOMB and ref & PRECANCEL and ref & ~PRECANCEL < cutoff:
            out.append((h, ref))
    return out


def _header(path: Path) -> tuple[int, int]:
    """(format version, base) from a table's header, unchecked (MappedFile checks it)."""
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE or head[:8] != MAGIC:
        return VERSION, 0
    _m, ver, _hs, _ga, _gb, base, _r, _crc = HEADER.unpack(head)
    return int(ver), int(base)


def _count_range(buf: Any, lo: int, hi: int) -> tuple[int, int]:
    """(live, tombstone) slots among ``lo <= slot < hi`` of a table in ``buf``, at C speed: in a
    copy of each chunk, bytes 8 and 15 of every slot (the ref's first and last) become 0xFF, so an
    8-byte run without 0xFF can only be a whole hash field, and ``count`` finds exactly the empty
    and the tombstone hashes."""
    live = tombs = 0
    while lo < hi:
        n = min(_COUNT_CHUNK, hi - lo)
        raw = bytearray(buf[HEADER_SIZE + lo * SLOT_SIZE : HEADER_SIZE + (lo + n) * SLOT_SIZE])
        raw[8::SLOT_SIZE] = _FF[:n]
        raw[15::SLOT_SIZE] = _FF[:n]
        t = raw.count(_TOMB_HASH)
        live += n - raw.count(_EMPTY_HASH) - t
        tombs += t
        lo += n
    return live, tombs


def _py_apply(buf: Any, mask: int, records: Any) -> tuple[int, int]:
    """A journal's records applied in order to a table (``_native.idx_apply``'s twin): (change in
    live slots, change in tombstones)."""
    live = tombs = 0
    for h, ref, gone in list(journal_ops(records)):  # every record checked before the first write
        if gone:
            was = _py_remove(buf, mask, h, ref)
            if was is not None:
                live -= 1
                tombs += was[1]
        else:
            r = _py_put(buf, mask, h, ref)
            if r:
                live += 1
                tombs -= r < 0
    return live, tombs


def cut_ops(cap: int) -> int:
    """Operations that cut a generation for a table of ``cap`` slots."""
    return max(CUT_MIN, int(cap * CUT_SHARE))


class Stage:
    """A table in anonymous memory with the on-disk slot layout (a zero header first, so every
    probe takes the same arguments as on a file). Pages are allocated as they are written, or
    ahead of that by the page thread (``IdIndex._new_gen``)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.mask = cap, cap - 1
        self.mm = mmap.mmap(-1, HEADER_SIZE + cap * SLOT_SIZE)
        self.buf = memoryview(self.mm)
        self.live = self.tombs = 0

    def close(self, pages: PageWorker | None = None) -> None:
        self.buf.release()
        unmap(self.mm, pages)
        del self.mm  # the page thread's request holds the last reference: unmapped there


def unmap(mm: mmap.mmap, pages: PageWorker | None) -> None:
    """Unmap anonymous memory (a stage, a table's tags): on the page thread where there is one.
    On the loop, the munmap of a stage of tens of MiB waited for the process's mmap_lock and freed
    the pages there: index steps of 9-45 ms in the 100M ``scale`` bench scenario. The page thread's
    request holds the last reference: it unmaps it once done (``PageWorker.drop``)."""
    if pages is not None and pages.drops:
        pages.drop([(mm, 0, len(mm))])
        return
    with contextlib.suppress(BufferError):  # the page thread faulting it in: unmapped when done
        mm.close()


@dataclass
class _Gen:
    """A generation: its stage and its journal (the pass reads its records from the file)."""

    g: int
    stage: Stage
    writer: idjournal.JournalWriter | None  # None: records loaded at recovery, journals already on disk
    opened: int  # the index's clock (ms) when it opened (0: before the first step)
    pending: bytearray = field(default_factory=bytearray)  # records not yet written to the journal
    ops: int = 0
    inserts: int = 0  # insert records among them (the growth's estimate)
    unsynced: bool = True  # written (or created) since its last sync
    durable: int = 0  # the journal's length as of the last flush (what a checkpoint names)
    named: list[tuple[int, int]] = field(default_factory=list)  # loaded at recovery: (g, length) of each

    def journals(self) -> list[tuple[int, int]]:
        """(g, length) of the journal files holding its records, whole once it is sealed."""
        return self.named if self.writer is None else [(self.g, self.writer.length)]

    @property
    def files(self) -> list[int]:
        """The journal generations it covers."""
        return [g for g, _n in self.journals()]


class _Workers:
    """The threads that run the passes, kept from one pass to the next. ``Thread.start`` waits
    until the new thread first runs, and a new thread on a busy machine waits for a core: in the
    100M ``scale`` bench scenario that had the loop wait 11-108 ms in an index step.
    So an index, when opened (a store's open, never a loop turn), makes sure that there is a
    thread for each open index (at most ``CAP``); a pass finds one waiting and the loop only hands
    it over. A pass that finds none (more indexes than ``CAP``, or a test's) starts one.

    Each thread is ``SCHED_BATCH``: a waking worker never preempts the loop. The merge's native
    calls run their GIL-free work at ``SCHED_IDLE`` on a thread of their own
    (``idx_pass_idle``): a thread that takes the GIL must never be idle, or the loop, handing it
    the GIL at a switch interval, waits until nothing else wants the core (sidecar/runtime/threads.py,
    "Idle threads")."""

    CAP = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Pass] = queue.SimpleQueue()
        self._threads = self._idle = self._queued = self._open = 0

    def opened(self) -> None:
        """An index opened: a thread for it, started here if none is spare."""
        with self._lock:
            self._open += 1
            start = self._threads < min(self._open, self.CAP)
            if start:
                self._counted()
        if start:
            self._spawn()

    def closed(self) -> None:
        with self._lock:
            self._open -= 1

    def submit(self, job: _Pass) -> None:
        with self._lock:
            self._queued += 1
            start = self._queued > self._idle  # a pass never waits for another one
            if start:
                self._counted()
        self._jobs.put(job)
        if start:
            self._spawn()

    @property
    def busy(self) -> int:
        """Passes submitted and not finished, of every index in the process ("Turns"): queued, or
        on a thread that is not idle."""
        with self._lock:
            return self._queued + self._threads - self._idle

    def _counted(self) -> None:
        """A new thread, counted (and idle) before it starts: under the lock."""
        self._threads += 1
        self._idle += 1

    def _spawn(self) -> None:
        threading.Thread(target=self._run, name="kds-ids-pass", daemon=True).start()

    def _run(self) -> None:
        demote_self()
        if NATIVE:
            _native.idx_pass_idle(True)
        while True:
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            try:
                job.run()
            except Exception as e:  # a bug, not the disk: the pass failed (retried), the worker lives on
                job.error = StoreError(f"id index pass: {e!r}")
            finally:
                with self._lock:
                    self._idle += 1
                job.finished.set()


_WORKERS = _Workers()


class _Pass:
    """A sealed generation merged into the table (and, for a growth, the table rebuilt first into
    a new file): file I/O and C, the GIL released, on a worker thread (``_Workers``); the loop only
    polls ``is_alive``. ``tags``: the final table's tags, which the merge rewrites (None: none
    kept)."""

    def __init__(self, table: Path, cap: int, journals: list[tuple[int, int]], cutoff: int, grow: int,
                 new: Path | None, native: bool, tags: mmap.mmap | None = None) -> None:
        self.table, self.cap, self.journals, self.cutoff = table, cap, journals, cutoff
        self.grow, self.new, self.native, self.tags = grow, new, native, tags
        self.result: tuple[int, ...] = ()
        self.error: OSError | StoreError | None = None
        self.seconds = 0.0
        self.started = False
        self.finished = threading.Event()

    def start(self) -> None:
        self.started = True
        _WORKERS.submit(self)

    def is_alive(self) -> bool:
        return self.started and not self.finished.is_set()

    def join(self) -> None:
        self.finished.wait()

    def run(self) -> None:
        # Background work that keeps a core busy for seconds: it must neither preempt the loop nor
        # share a saturated machine's CPU with it, and it must leave a core the moment the loop
        # wakes: its native work runs SCHED_IDLE, the rest SCHED_BATCH (``_Workers``). In the 40M
        # scale run as an equal, the stream's lateness rose to seconds whenever a pass or a rebuild
        # ran beside the broker and the clients on the 2-core VM. A pass that waits only delays
        # when the table has its entries: the stages answer meanwhile.
        self.merge()
        # The pass's buffers (the generation's records, the merge's sorted operations: ~50 MB at
        # 40M pending) were freed into this thread's malloc arena, which glibc keeps resident
        # (sidecar/runtime/heap.py): give the whole free pages back, here, off the loop.
        release_heap()

    def merge(self) -> None:
        """The pass itself (on whichever thread calls it)."""
        t0 = time.perf_counter()
        fds: list[int] = []
        try:
            fd = os.open(self.table, os.O_RDWR)
            fds.append(fd)
            mask = self.cap - 1
            if self.new is not None:
                # a rebuild doubles at most: a larger growth (a recovery's journals) goes through
                # intermediate files, each the next one's source
                rebuild = idmerge.rebuild if self.native else idmerge.py_rebuild
                cap = self.cap if self.grow == self.cap else self.cap * 2
                while True:
                    last = cap >= self.grow
                    path = self.new if last else self.new.with_name(f"{self.new.name}.{cap}")
                    nfd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                    fds.append(nfd)
                    os.ftruncate(nfd, HEADER_SIZE + cap * SLOT_SIZE)
                    os.pwrite(nfd, header_bytes(MAGIC, VERSION, SLOT_SIZE, cap, 0), 0)
                    rebuild(fd, nfd, HEADER_SIZE, mask, cap - 1, self.cutoff, PASS_CHUNK, last)
                    if fd != fds[0]:
                        os.unlink(self.new.with_name(f"{self.new.name}.{mask + 1}"))
                    fd, mask = nfd, cap - 1
                    if last:
                        break
                    cap *= 2
            # the records from the journal files, not from memory: a generation's records would
            # otherwise stay in the heap from its first operation to the end of its pass
            records = b"".join(idjournal.read(self.table.parent, g, n) for g, n in self.journals)
            merge = idmerge.merge_journal if self.native else idmerge.py_merge_journal
            self.result = merge(fd, HEADER_SIZE, mask, records, self.cutoff, PASS_CHUNK, True, self.tags)
        except (OSError, StoreError) as e:
            self.error = e
        finally:
            for f in fds:
                os.close(f)
            self.seconds = time.perf_counter() - t0


class PageRead:
    """A read of one table page on the page thread (``IdIndex.read_page``): ``done`` once the page
    is in the page cache (or the read failed: the intake then reads the slot itself)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


class IdIndex:
    pass_class = _Pass  # what runs a pass (tests substitute one they run by hand)

    def __init__(self, directory: Path, initial_capacity: int = INITIAL_SLOTS, native: bool = True,
                 pages: PageWorker | None = None) -> None:
        self.dir = directory
        self.pages = pages  # faults in each new stage's pages off the loop (_new_gen)
        self.path = directory / "ids.idx"
        self.native = native and NATIVE  # the C probes (sidecar._native), or their twins here
        if self.path.exists() and unborn(self.path):  # killed while creating it: nothing in it
            self.path.unlink()
        self._created = not self.path.exists()
        if self._created:
            self.cap = initial_capacity
            self.f = self._map(self.path, self.cap, create=True)
        else:
            self.cap = (os.path.getsize(self.path) - HEADER_SIZE) // SLOT_SIZE
            ver, base = _header(self.path)
            self.f = self._map(self.path, self.cap, create=False, base=base, version=ver if ver in READS else VERSION)
        self.mask = self.cap - 1
        self.table_live = self.table_tombs = 0  # exact as of the last pass (or the checkpoint's)
        self._seq = 0  # the last ids.idx.next.<n> number used
        self._open: _Gen | None = None
        self._sealed: _Gen | None = None
        self._pass: _Pass | None = None
        self._failed_at = 0  # the index's clock (ms) at the last failed pass
        self._merged: list[int] = []  # journals whose pass finished, deleted once no checkpoint names them
        self._named: set[int] = set()  # the journals the last ``state`` named
        self._ever_named: set[int] = set()  # every journal a ``state`` named (a checkpoint on disk may name it)
        self._shadow: dict[tuple[int, int], int] = {}  # removed pre-cancels -> the generation of the remove
        self._swap: MappedFile | None = None  # a rebuilt table, named ids.idx at the next flush
        self.tags: mmap.mmap | None = None  # the table's tags, once a pass built them ("Tags")
        self._retired: list[tuple[MappedFile, bool]] = []  # old tables' mappings (and unlink?), for ``reclaim``
        self._now_ms = 0  # the clock of the last step (epoch ms): steps drive the cuts, nothing else reads time
        self._horizon_ms = -1  # unknown until the first step: a pass sweeps nothing before it
        self._jbuf = bytearray()
        self.swept = 0  # expired pre-cancels the passes removed
        self.passes = 0
        self.grown = 0
        self._worker = True  # a pass thread waits for this index (_Workers), until close
        # the next generation's journal, made ahead; one a crash leaves is named by no checkpoint
        # and deleted by the next restore
        self._spare_journal: Spare[idjournal.JournalWriter] = Spare(
            pages, lambda g: idjournal.JournalWriter(self.dir, g), idjournal.JournalWriter.unlink)
        _WORKERS.opened()

    # -- open -------------------------------------------------------------------------------------
    def restore(self, state: dict[str, Any] | None) -> None:
        """Open the journals the checkpoint (``state``) names and merge them again; delete what
        it does not name (module docstring, "Checkpoint and recovery")."""
        for p in self.dir.glob(NEXT + "*"):
            tail = p.name[len(NEXT):]
            if tail.isdigit():
                self._seq = max(self._seq, int(tail))
        if state is not None and "journals" not in state and not self._created:
            self._upgrade(state)  # the earlier format: finish its migration, count
        for p in self.dir.glob(NEXT + "*"):
            p.unlink()  # a rebuilt table takes its name before any checkpoint names its contents
        named = [(int(g), int(n)) for g, n in state.get("journals", [])] if state else []
        if state is not None and "journals" in state:
            if int(state.get("cap", -1)) == self.cap:
                self.table_live, self.table_tombs = int(state["live"]), int(state["tombs"])
            else:  # renamed after the checkpoint: counted by the pass below
                self.table_live, self.table_tombs = int(state["live"]), 0
        elif state is None and not self._created:
            with self.f.scanning():
                self.table_live, self.table_tombs = _count_range(self.f.buf, 0, self.cap)
        keep = {g for g, _n in named}
        self._named, self._ever_named = set(keep), set(keep)  # the checkpoint on disk names them
        for g in idjournal.generations(self.dir):
            if g not in keep:
                idjournal.remove(self.dir, g)
        last = max([g for g, _n in named] + [int(state.get("gen", 0)) if state else 0])
        if named:
            records = b"".join(idjournal.read(self.dir, g, n) for g, n in named)
            gen = self._new_gen(-1, max(len(records) // SLOT_SIZE, 1), writer=False)
            for g, n in named:  # what follows was written after the checkpoint: replayed, journaled again
                idjournal.truncate(self.dir, g, n)
            gen.named = named
            gen.ops = len(records) // SLOT_SIZE
            gen.inserts = gen.ops
            self._load(gen.stage, records)
            gen.unsynced = False
            self._open = gen
            self._cut(force=True)
        self._open = self._new_gen(last + 1, cut_ops(self.cap))
        log.debug("ids.opened", capacity=self.cap, live=self.table_live, journals=len(named))

    def _upgrade(self, state: dict[str, Any]) -> None:
        """A checkpoint of the earlier format: the table was written in place, perhaps migrating into
        ``ids.idx.next.<n>``; finish that migration, then count the table (once)."""
        named = state.get("next")
        nxt = self.dir / named if named else None
        if nxt is not None and nxt.exists() and not unborn(nxt):
            cap = (os.path.getsize(nxt) - HEADER_SIZE) // SLOT_SIZE
            if (int(state.get("from", -1)), int(state.get("cap", -1))) != (self.cap, cap):
                raise StoreError(
                    f"{nxt}: the checkpoint names a migration from {state.get('from')} to {state.get('cap')} slots, "
                    f"but {self.path} holds {self.cap} and {nxt.name} {cap}"
                )
            new = self._map(nxt, cap, create=False, base=self.cap)
            lo = int(state.get("cursor", 0))
            with self.f.scanning():
                if self.native:
                    _native.idx_copy(self.f.buf, new.buf, HEADER_SIZE, lo, self.cap, cap - 1)
                else:
                    _py_copy(self.f.buf, new.buf, lo, self.cap, cap - 1)
            new.mm.flush()
            os.replace(nxt, self.path)
            fsync_dir(self.dir)
            self.f.close()
            new.path = self.path
            self.f, self.cap, self.mask = new, cap, cap - 1
        with self.f.scanning():
            self.table_live, self.table_tombs = _count_range(self.f.buf, 0, self.cap)
        log.info("ids.upgraded", capacity=self.cap, live=self.table_live)

    def _load(self, stage: Stage, records: bytes) -> None:
        live, tombs = (_native.idx_apply(stage.buf, HEADER_SIZE, stage.mask, records) if self.native
                       else _py_apply(stage.buf, stage.mask, records))
        stage.live += live
        stage.tombs += tombs

    def _new_gen(self, g: int, ops: int, writer: bool = True, busy: bool = False) -> _Gen:
        """A generation with a stage for ``ops`` operations (a quarter full at most); ``busy``: the
        one before it filled (its stage's pages are faulted in ahead)."""
        cap = 1 << max(12, (4 * ops - 1).bit_length())
        jw = None
        if writer:
            # The journal's file is created on the page thread one generation ahead (mapped.Spare):
            # created here, at a cut, an index step waited 200 ms once for the file system's
            # journal (open(O_CREAT) and the header's write; the 100M ``scale`` bench scenario).
            jw = self._spare_journal.take(g) or idjournal.JournalWriter(self.dir, g)
            self._spare_journal.ask(g + 1)
        stage = Stage(cap)
        if busy and self.pages is not None:
            # Its first stores would each fault a zeroed page on the loop (the C intake's inserts
            # land at random: the first ~4,000 of a 16 MiB stage each take a new page): 1.2 % of
            # the loop's CPU samples in the 100M ``scale`` bench scenario, in the turns after each cut.
            # A generation that fills touches every page (a quarter full: 64 entries a page); one
            # cut by age may touch few, so only a busy index's stages are faulted in (RSS).
            self.pages.populate(stage.mm, 0, len(stage.mm))
        return _Gen(g, stage, jw, self._now_ms)

    @staticmethod
    def _map(path: Path, cap: int, create: bool, base: int = 0, version: int = VERSION) -> MappedFile:
        if cap & (cap - 1):
            raise ValueError(f"{path}: capacity {cap} is not a power of two")
        return MappedFile(
            path, magic=MAGIC, version=version, size=HEADER_SIZE + cap * SLOT_SIZE,
            geom_a=SLOT_SIZE, geom_b=cap, base=base, create=create, sync_header=True,
            # probed at random: a fault on a page the cache lost must not read the device's
            # read-ahead window (MiBs) on the loop (MappedFile.random_access)
            random=True,
        )

    # -- counts -----------------------------------------------------------------------------------
    @property
    def live(self) -> int:
        """Live entries: the table's (as of its last pass) and the stages' (an upper bound: an
        entry staged may already be in the table)."""
        n = self.table_live
        for gen in (self._open, self._sealed):
            if gen is not None:
                n += gen.stage.live
        return n

    @property
    def tombs(self) -> int:
        return self.table_tombs

    @property
    def merging(self) -> bool:
        """True while a pass runs."""
        return self._pass is not None

    def state(self) -> dict[str, Any]:
        """The checkpoint's ``ids``: the table's capacity and counts, the journals still needed
        (at the length the last flush made durable) and the open generation's number."""
        journals: list[list[int]] = []
        for gen in (self._sealed, self._open):
            if gen is None:
                continue
            if gen.writer is None:  # loaded at recovery: its files, whole as read
                journals.extend([g, n] for g, n in gen.named)
            else:
                journals.append([gen.g, gen.durable])
        self._named = {g for g, _n in journals}
        self._ever_named |= self._named
        assert self._open is not None
        return {"cap": self.cap, "live": self.table_live, "tombs": self.table_tombs, "gen": self._open.g,
                "journals": journals}

    # -- probes -----------------------------------------------------------------------------------
    def _tables(self) -> Iterator[tuple[Any, int, mmap.mmap | None]]:
        """(buffer, mask, tags) of the open stage, the sealed stage and the table."""
        for gen in (self._open, self._sealed):
            if gen is not None:
                yield gen.stage.buf, gen.stage.mask, None
        yield self.f.buf, self.mask, self.tags

    def find(self, h: int) -> list[int]:
        """Every ref stored under hash ``h`` (usually zero or one) in the stages and the table,
        once each, without the pre-cancels removed since."""
        nat = self.native
        found: list[int] = []
        for buf, mask, tags in self._tables():
            for r in (_native.idx_find(buf, HEADER_SIZE, mask, h, tags) if nat else _py_find(buf, mask, h)):
                if r not in found:
                    found.append(r)
        if self._shadow and found:
            found = [r for r in found if (h, r) not in self._shadow]
        return found

    def put(self, h: int, ref: int) -> None:
        """Insert (h, ref) into the open stage and its journal (a pair already staged: nothing)."""
        gen = self._room()
        st = gen.stage
        r = (_native.idx_put(st.buf, HEADER_SIZE, st.mask, h, ref) if self.native
             else _py_put(st.buf, st.mask, h, ref))
        if r == 0:
            return
        st.live += 1
        if r < 0:
            st.tombs -= 1
        gen.pending += SLOT.pack(h, ref)
        gen.ops += 1
        gen.inserts += 1
        if self._shadow:
            self._shadow.pop((h, ref), None)

    def _room(self) -> _Gen:
        """The open generation, with room in its stage for one more entry: cut if it is full and
        no pass runs, else (the pass is slower than the inserts) grow the stage in memory."""
        gen = self._open
        assert gen is not None
        st = gen.stage
        if (st.live + st.tombs + 1) * 2 <= st.cap:
            return gen
        self._poll()
        if self._pass is None and self._cut(force=True):
            gen = self._open
            assert gen is not None
            return gen
        big = Stage(st.cap * 2)
        if self.native:
            _native.idx_copy(st.buf, big.buf, HEADER_SIZE, 0, st.cap, big.mask)
        else:
            _py_copy(st.buf, big.buf, 0, st.cap, big.mask)
        big.live = st.live
        st.close()
        gen.stage = big
        log.warning("ids.stage_grown", capacity=big.cap, live=big.live,
                    detail="the id index's merge pass is slower than the inserts")
        return gen

    def remove(self, h: int, ref: int) -> None:
        """Remove (h, ref): from the open stage at once, from the sealed stage and the table by a
        later pass (journaled); a pre-cancel is hidden from ``find`` meanwhile."""
        gen = self._open
        assert gen is not None
        st = gen.stage
        was = (_native.idx_remove(st.buf, HEADER_SIZE, st.mask, h, ref) if self.native
               else _py_remove(st.buf, st.mask, h, ref))
        if was is not None:
            st.live -= 1
            st.tombs += was[1]
        gen.pending += REMOVE_MARK + SLOT.pack(h, ref)
        gen.ops += 1
        if ref & PRECANCEL:
            self._shadow[(h, ref)] = gen.g

    def remove_delivered(self, pairs: list[tuple[int, Any]]) -> int:
        """``remove(id_hash(rec.id), ref)`` for every ``(ref, rec)`` of a settled batch (scheduler
        refs: no shadow needed); return how many were in the open stage."""
        gen = self._open
        assert gen is not None
        st = gen.stage
        if not self.native:
            removed = 0
            for ref, rec in pairs:
                h = id_hash(rec.id)
                was = _py_remove(st.buf, st.mask, h, ref)
                if was is not None:
                    removed += 1
                    st.live -= 1
                    st.tombs += was[1]
                gen.pending += REMOVE_MARK + SLOT.pack(h, ref)
        else:
            removed, tombs = _native.idx_remove_delivered(st.buf, HEADER_SIZE, st.mask, pairs)
            st.live -= removed
            st.tombs += tombs
            gen.pending += _native.idx_delivered_records(pairs)
        gen.ops += len(pairs)
        return int(removed)

    def precancels(self, before_ms: int = 1 << 62) -> int:
        """Pre-cancels made before ``before_ms`` in the index and not removed, copies counted once
        (a pass over every slot: for the bench and tests only)."""
        found: set[tuple[int, int]] = set()
        with self.f.scanning():
            for buf, mask, _tags in self._tables():
                found.update(_native.idx_expired(buf, HEADER_SIZE, 0, mask + 1, before_ms)
                             if self.native else _py_expired(buf, 0, mask + 1, before_ms))
        return len(found - self._shadow.keys())

    # -- the cycle --------------------------------------------------------------------------------
    def step(self, now_ms: int, horizon_ms: int) -> int:
        """A loop turn's share: notice a finished pass, cut when due. Returns the operations cut (0:
        none)."""
        self._now_ms, self._horizon_ms = now_ms, horizon_ms
        if self._open is not None and self._open.opened <= 0:
            self._open.opened = now_ms
        self._poll()
        return self._cut()

    def wait(self) -> None:
        """Wait for the running pass and take its result (tests, the bench)."""
        if self._pass is not None and self._pass.started:
            self._pass.join()
        self._poll()

    def _poll(self) -> None:
        p = self._pass
        if p is None or p.is_alive():
            return
        self._pass = None
        sealed = self._sealed
        assert sealed is not None
        if p.error is not None:
            self._failed_at = self._now_ms
            if p.new is not None:
                p.new.unlink(missing_ok=True)
            if p.tags is not None and p.tags is not self.tags:  # fresh ones, half built
                p.tags.close()
            log.warning("ids.pass_failed", error=str(p.error), retry_s=RETRY_S)
            return
        if p.new is not None:
            new = self._map(p.new, p.grow, create=False)
            # a grown table no flush named (a store checkpointed rarely: a restoring standby) is
            # nobody's: deleted with its mapping
            self._retired.append((self.f, self._swap is not None))
            self.f, self.cap, self.mask = new, p.grow, p.grow - 1
            self._swap = new
            self.grown += 1
            log.info("ids.grown", capacity=self.cap, live=p.result[0], s=round(p.seconds, 1))
        if p.tags is not self.tags:  # built by the pass: the table's (the grown one's) from now on
            if self.tags is not None:
                unmap(self.tags, self.pages)
            self.tags = p.tags
        self.table_live, self.table_tombs = int(p.result[0]), int(p.result[1])
        self.swept += int(p.result[4])
        self.passes += 1
        self._sealed = None
        sealed.stage.close(self.pages)
        for g in sealed.files:  # one no checkpoint ever named can go now (a restoring standby's)
            if g in self._ever_named:
                self._merged.append(g)
            else:
                idjournal.remove(self.dir, g)
        if sealed.writer is not None:
            sealed.writer.close()
        if self._shadow:
            self._shadow = {k: g for k, g in self._shadow.items() if g > sealed.g}
        log.debug("ids.merged", ops=sealed.ops, live=self.table_live, tombs=self.table_tombs, expired=int(p.result[4]),
                  s=round(p.seconds, 2))

    def _cut(self, force: bool = False) -> int:
        """Seal the open generation and start its pass, if one is due (or ``force``) and none runs."""
        gen = self._open
        assert gen is not None
        if self._pass is not None:
            return 0
        if self._sealed is not None:  # its pass failed: run it again, not too often
            if self._now_ms - self._failed_at < RETRY_S * 1000:
                return 0
            self._start(self._sealed, self._growth(self._sealed))
            return 0
        age = (self._now_ms - gen.opened) / 1000 if gen.opened > 0 else 0.0
        full = force or gen.ops >= cut_ops(self.cap)
        limit = CUT_S if gen.ops else IDLE_PASS_S
        if not (full or age >= limit):
            return 0
        if not full and _WORKERS.busy and age < 2 * limit:
            return 0  # another index's pass runs: a cut by age waits its turn ("Turns")
        if gen.writer is not None and gen.pending:
            gen.writer.append(gen.pending)
            gen.pending.clear()
            gen.unsynced = True
        self._sealed = gen
        grow = self._growth(gen)
        # A growth's pass copies the whole table first: a stage for four generations then, so that
        # the open one does not fill before it ends (a stage that fills is doubled on the loop:
        # ~100 ms at a million entries)
        ops = cut_ops(self.cap) * (4 if grow else 1)
        self._open = self._new_gen(gen.g + 1, ops, busy=gen.ops >= cut_ops(self.cap)) if gen.g >= 0 else None
        self._start(gen, grow)
        return gen.ops

    def _growth(self, gen: _Gen) -> int:
        """The capacity the table is rebuilt at before ``gen`` is merged into it (0: merged in
        place): once it would be over half full (its tombstones counted), twice the size when a
        quarter would be live (a quarter full after it), else the same size (the tombstones shed);
        more only for what one doubling cannot hold at a third full (a recovery's journals)."""
        live = self.table_live + gen.inserts
        if (live + self.table_tombs) * 2 <= self.cap:
            return 0
        grow = self.cap * 2 if live * 4 >= self.cap else self.cap
        while live * 3 > grow:
            grow *= 2
        return grow

    def _start(self, gen: _Gen, grow: int) -> None:
        cutoff = max(0, self._now_ms - self._horizon_ms) if self._horizon_ms >= 0 else 0
        new = None
        if grow:
            self._seq += 1
            new = self.dir / f"{NEXT}{self._seq}"
        tags = None
        if self.native:
            # the pass rewrites the tags as it goes: the table's own when it stays, fresh ones for
            # a rebuilt table or a table that has none yet (the first pass after the open)
            tags = self.tags if not grow and self.tags is not None else mmap.mmap(-1, grow or self.cap)
        # self.f: ids.idx's file, or a grown one the next flush names so
        self._pass = self.pass_class(self.f.path, self.cap, gen.journals(), cutoff, grow, new, self.native,
                                     tags)
        self._pass.start()

    # -- the C intake (PartitionStore.ingest_many; sidecar/store/intake_layout.py) ---------------
    def intake_state(self, st: list[int], room: int, resident: bool = False) -> memoryview:
        """Hand the C intake the open stage (it probes and inserts there in place; it leaves to
        ``put`` a record whose insert would fill it past half), the tables it only probes (an
        entry under the id there: the record goes to ``put``), and a journal buffer with room for
        ``room`` records. ``resident``: the intake reads a table slot only where its page is in
        memory, and else stops before the record with the slot in ``Common.IDX_WAIT``
        (``read_page``; the loop's "Page waits")."""
        st[Common.IDX_RESIDENT] = int(resident and self.pages is not None and self.pages.enabled)
        st[Common.IDX_WAIT] = -1
        gen = self._open
        assert gen is not None
        st[Common.IDX_MASK] = gen.stage.mask
        st[Common.IDX_LIVE] = gen.stage.live
        st[Common.IDX_TOMBS] = gen.stage.tombs
        sealed = self._sealed
        st[Common.IDX_OLD_MASK] = sealed.stage.mask if sealed is not None else self.mask
        st[Common.IDX_OLD2_MASK] = self.mask if sealed is not None else -1
        st[Common.IDX_JNL_AT] = 0
        if len(self._jbuf) < room * SLOT_SIZE:
            self._jbuf = bytearray(max(room * SLOT_SIZE, 2 * len(self._jbuf)))
        return gen.stage.buf

    def intake_bufs(self) -> tuple[Any, Any, bytearray, mmap.mmap | None]:
        """The intake's last arguments: the probed tables (sealed stage or table; table or None),
        the journal buffer and the table's tags (of the table probed last)."""
        sealed = self._sealed
        if sealed is None:
            return self.f.buf, None, self._jbuf, self.tags
        return sealed.stage.buf, self.f.buf, self._jbuf, self.tags

    def evicted(self, h: int) -> int:
        """The first table slot ``find(h)`` would read whose page the kernel evicted, or -1 (also
        without tags or a page thread: then nothing is read off the loop). The stages are in memory."""
        tags = self.tags
        if not self.native or tags is None or self.pages is None or not self.pages.enabled:
            return -1
        slot: int = _native.idx_wait(self.f.buf, HEADER_SIZE, self.mask, h, tags)
        return slot

    def read_page(self, slot: int) -> PageRead:
        """Read the table's page holding ``slot`` into the page cache on the page thread (with
        ``os.pread``, the GIL released), so the loop does not wait for the disk there."""
        read = PageRead()
        path, off = self.f.path, HEADER_SIZE + slot * SLOT_SIZE

        def run() -> None:
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.pread(fd, SLOT_SIZE, off)
                finally:
                    os.close(fd)
            except OSError:
                pass  # the intake reads the slot itself (the table was replaced meanwhile: a growth)
            read.done = True

        assert self.pages is not None
        self.pages.call(run)
        return read

    def intake_restore(self, st: list[int]) -> None:
        """Take back the open stage's counts and the journal records the intake wrote."""
        gen = self._open
        assert gen is not None
        gen.stage.live = st[Common.IDX_LIVE]
        gen.stage.tombs = st[Common.IDX_TOMBS]
        n = st[Common.IDX_JNL_AT]
        if n > 0:
            gen.pending += memoryview(self._jbuf)[:n]
            gen.ops += n // SLOT_SIZE
            gen.inserts += n // SLOT_SIZE

    # -- durability ------------------------------------------------------------------------------
    def flush(self, sync: bool = True) -> None:
        """Write the open generation's records to its journal; with ``sync`` (inside
        ``deferred_sync``: for the batch) make every journal a checkpoint will name durable. A
        rebuilt table takes the name ``ids.idx`` (synced by its pass; renamed, directory synced),
        with or without ``sync``."""
        if self._swap is not None:
            swap, self._swap = self._swap, None
            batch = current_batch()
            if batch is not None and sync:
                batch.add_file(swap)
                batch.add_rename(swap.path, self.path)
                batch.add_dir(self.dir)
            else:
                os.replace(swap.path, self.path)
                if sync:
                    fsync_dir(self.dir)
            swap.path = self.path
        for gen in (self._sealed, self._open):
            if gen is None or gen.writer is None:
                continue
            if gen.pending:
                gen.writer.append(gen.pending)
                gen.pending.clear()
                gen.unsynced = True
            if sync and gen.unsynced:
                gen.writer.note_sync()
                gen.unsynced = False
            gen.durable = gen.writer.length

    def reclaim(self) -> None:
        """After a checkpoint: delete the journals merged and not named by it; release the mappings
        of tables a growth replaced (inside ``deferred_disposal``: on the disposal's thread)."""
        keep = [g for g in self._merged if g in self._named]
        for g in self._merged:
            if g not in self._named:
                self._ever_named.discard(g)
                idjournal.remove(self.dir, g)
        self._merged = keep
        keep_t: list[tuple[MappedFile, bool]] = []
        for f, unlink in self._retired:
            if unlink:  # never named: nothing refers to it
                f.dispose(unlink=True)
            elif self._swap is None:  # its successor has the name ids.idx now
                f.dispose()
            else:
                keep_t.append((f, unlink))
        self._retired = keep_t

    def trim(self) -> None:
        """Unmap the table's resident pages from this process (``MappedFile.drop_pages``): probes
        land on random pages, so none is more likely than another to be needed next. The stages
        are anonymous memory and stay."""
        self.f.drop_pages()

    def disk_bytes(self) -> int:
        n = self.f.size
        for gen in (self._open, self._sealed):
            if gen is not None and gen.writer is not None:
                n += gen.writer.length
        return n

    def close(self) -> None:
        """Wait for a running pass (it writes the table), then close everything."""
        if self._pass is not None and self._pass.started:  # (a test's pass may never start)
            self._pass.join()
            self._poll()
        if self._worker:
            self._worker = False
            _WORKERS.closed()
        self._spare_journal.close()
        for gen in (self._open, self._sealed):
            if gen is not None:
                gen.stage.close()
                if gen.writer is not None:
                    gen.writer.close()
        self._open = self._sealed = None
        if self.tags is not None:
            self.tags.close()
            self.tags = None
        self.f.close()
        for f, _unlink in self._retired:  # a grown table never named is deleted by the next open
            f.close()
        self._retired = []
