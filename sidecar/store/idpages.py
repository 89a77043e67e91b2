"""A page of the id index's table read into the page cache on the page thread, off the loop.

A duplicate check whose id's chain runs through a table page the kernel evicted would make the
loop wait for the disk (sidecar/store/idindex.py, "Tags"). The C intake stops before that record
instead, and ``read_page`` has the page thread (``mapped.PageWorker``) ``pread`` one slot of that
page from the table's file, the GIL released; the loop holds the partition until ``done``
(sidecar/engine/page_waits.py) and its next intake finds the page in memory.
"""

from __future__ import annotations

import os
from pathlib import Path

from sidecar.store.idslot import SLOT_SIZE
from sidecar.store.mapped import HEADER_SIZE, PageWorker


class PageRead:
    """A read of one table page on the page thread (``read_page``): ``done`` once the page is in
    the page cache (or the read failed: the intake then reads the slot itself)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


def read_page(pages: PageWorker, path: Path, slot: int) -> PageRead:
    """Read the page of the table file ``path`` holding ``slot`` on the page thread ``pages``."""
    read = PageRead()
    off = HEADER_SIZE + slot * SLOT_SIZE

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

    pages.call(run)
    return read
