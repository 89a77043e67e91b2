"""The id index's stage: a generation's inserts and removes, in anonymous memory.

A stage is a table with the on-disk slot layout (a zero header first, so every probe takes the
same arguments as on a file), sized for its generation at a quarter full
(sidecar/store/idindex.py, "Why staged"). One that fills while a merge pass still runs is
doubled in memory (``doubled``): the entries are copied into a stage twice its size, the one
before is unmapped. The decision to double is the cut schedule's (``Growth.room``,
sidecar/store/idgrowth.py).
"""

from __future__ import annotations

import contextlib
import mmap

from sidecar.store.codec import native as _native
from sidecar.store.idprobe import py_copy
from sidecar.store.idslot import SLOT_SIZE
from sidecar.store.mapped import HEADER_SIZE, PageWorker


class Stage:
    """A table in anonymous memory with the on-disk slot layout. Pages are allocated as they are
    written, or ahead of that by the page thread (``IdIndex._new_gen``)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.mask = cap, cap - 1
        self.mm = mmap.mmap(-1, HEADER_SIZE + cap * SLOT_SIZE)
        self.buf = memoryview(self.mm)
        self.live = self.tombs = 0

    def close(self, pages: PageWorker | None = None) -> None:
        self.buf.release()
        unmap(self.mm, pages)
        del self.mm  # the page thread's request holds the last reference: unmapped there


def doubled(st: Stage, native: bool) -> Stage:
    """A stage twice the size of ``st`` holding its entries (its tombstones dropped); ``st`` is
    closed. ``native``: the C copy (``sidecar._native``), else its twin."""
    big = Stage(st.cap * 2)
    if native:
        _native.idx_copy(st.buf, big.buf, HEADER_SIZE, 0, st.cap, big.mask)
    else:
        py_copy(st.buf, big.buf, 0, st.cap, big.mask)
    big.live = st.live
    st.close()
    return big


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
