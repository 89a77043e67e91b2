"""The id index's merge pass, on worker threads kept from one pass to the next.

A pass (``Pass``) takes a sealed generation of the index (sidecar/store/idindex.py, "Why staged")
into the table file: it reads the generation's journal records back from their files and merges them
into the table in one ascending pass (``idmerge.merge_journal``, in C without the GIL: the last
operation on each pair wins, the chunks are rewritten in slot order with their writeback started as
it goes, then synced; the table stays valid for a concurrent reader at every write). It counts the
table's live and tombstone slots exactly, removes the pre-cancels made before its cutoff, and
rewrites the table's tags as it goes. For a growth it first rebuilds the table (``idmerge.rebuild``)
into a new file, twice the size or the same size, doubling at most once per file (a larger growth
goes through intermediate files), and merges into that. The index starts a pass and takes its result
at a loop step (sidecar/store/idgrowth.py); the loop only polls ``Pass.is_alive``.

The passes run on ``WORKERS``, threads kept between passes (``Workers``: why), ``SCHED_BATCH``, their
native work ``SCHED_IDLE``.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
import time
from pathlib import Path

from sidecar.runtime.heap import release_heap
from sidecar.runtime.threads import demote_self
from sidecar.store import idjournal, idmerge
from sidecar.store.codec import NATIVE
from sidecar.store.codec import native as _native
from sidecar.store.idslot import MAGIC, SLOT_SIZE, VERSION
from sidecar.store.mapped import HEADER_SIZE, StoreError, header_bytes

PASS_CHUNK = 1 << 16  # slots a pass reads and writes at a time (1 MiB)


class Workers:
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
        self._jobs: queue.SimpleQueue[Pass] = queue.SimpleQueue()
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

    def submit(self, job: Pass) -> None:
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
        """Passes submitted and not finished, of every index in the process (idgrowth.py, "Turns"): queued, or
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


WORKERS = Workers()


class Pass:
    """A sealed generation merged into the table (and, for a growth, the table rebuilt first into
    a new file): file I/O and C, the GIL released, on a worker thread (``Workers``); the loop only
    polls ``is_alive``. ``tags``: the final table's tags, which the merge rewrites (None: none
    kept)."""

    def __init__(self, table: Path, cap: int, journals: list[tuple[int, int]], cutoff: int, grow: int,
                 new: Path | None, native: bool, tags: mmap.mmap | None = None, final: Path | None = None) -> None:
        """``table``: the file the index maps, by its name at the cut; ``final``: the name it takes
        at the rename a checkpoint's sync batch may run meanwhile (``IdIndex.flush``)."""
        self.table, self.cap, self.journals, self.cutoff = table, cap, journals, cutoff
        self.final = final
        self.grow, self.new, self.native, self.tags = grow, new, native, tags
        self.result: tuple[int, ...] = ()
        self.error: OSError | StoreError | None = None
        self.seconds = 0.0
        self.started = False
        self.finished = threading.Event()

    def start(self) -> None:
        self.started = True
        WORKERS.submit(self)

    def is_alive(self) -> bool:
        return self.started and not self.finished.is_set()

    def join(self) -> None:
        self.finished.wait()

    def run(self) -> None:
        # Background work that keeps a core busy for seconds: it must neither preempt the loop nor
        # share a saturated machine's CPU with it, and it must leave a core the moment the loop
        # wakes: its native work runs SCHED_IDLE, the rest SCHED_BATCH (``Workers``). In the 40M
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
            try:
                fd = os.open(self.table, os.O_RDWR)
            except FileNotFoundError:
                if self.final is None or self.final == self.table:
                    raise
                # a grown table renamed to its final name since the cut: the same file
                fd = os.open(self.final, os.O_RDWR)
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

