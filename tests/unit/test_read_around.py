"""No read-around on the faults of the files the loop appends to (``MappedFile.random_access``).

A write fault on a hole of a sparse mapped file reads (zeroes) the device's read-ahead window in
that one fault: 8 MiB on the VM the benches run on, 50-83 ms of the loop's system time. The files
appended to (the commit log's head segment, the level queue's and the timer log's newest file)
and the id table (probed at random) carry ``MADV_RANDOM``; a sealed file gets the read-ahead back.
Checked on real mappings: the kernel's own record of the advice (``rr`` in ``/proc/self/smaps``'
``VmFlags``) and its effect (which pages the fault brought into the page cache: ``mincore``)."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

from sidecar.levels.queue import LevelQueue
from sidecar.store import codec
from sidecar.store.idindex import IdIndex
from sidecar.store.log import CommitLog
from sidecar.store.mapped import HEADER_SIZE, MappedFile
from sidecar.wheel.layout import TimerLog
from tests.infra import needs, unavailable

pytestmark = needs(os.path.exists("/proc/self/smaps") and hasattr(mmap, "MADV_RANDOM"),
                   "Linux: /proc/self/smaps and MADV_RANDOM")

SEG = 1 << 16


def vm_flags(path: Path) -> set[str]:
    """The ``VmFlags`` of this process's mapping of ``path`` (exactly one expected)."""
    found: list[set[str]] = []
    target = str(path.resolve())
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and not line.startswith("VmFlags"):
                inside = len(head) >= 6 and head[5] == target
            elif inside and line.startswith("VmFlags:"):
                found.append(set(head[1:]))
    assert len(found) == 1, f"{len(found)} mappings of {target}"
    return found[0]


def random_read(path: Path) -> bool:
    return "rr" in vm_flags(path)


def append(log: CommitLog, n: int) -> int:
    return log.append(
        codec.head(
            rtype=codec.MESSAGE, due_ms=1000 + n, enqueue_ms=n, src_offset=n, src_partition=0, target_partition=-1,
            retry_count=0, level=1,
        ),
        b"r", b"t", None, b"v" * 300, b"",
    )


def test_commit_log_head_segment_only_is_random(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, SEG)
    list(log.recover(None, None))
    n = 0
    while len(log.segments) < 3:
        append(log, n)
        n += 1
    first, second, head = sorted(log.segments)
    assert [random_read(log.path_of(i)) for i in (first, second, head)] == [False, False, True]
    state = log.state()
    log.flush()
    log.close()
    # reopened: recovery reads with the read-ahead, then the head segment is appended to again
    again = CommitLog(tmp_path, SEG)
    list(again.recover(int(state["head"]), {int(k): int(v) for k, v in state["live"].items()}))  # type: ignore[attr-defined]
    assert [random_read(again.path_of(i)) for i in (first, second, head)] == [False, False, True]
    again.close()


def test_level_queue_and_timer_log_newest_file_only_is_random(tmp_path: Path) -> None:
    q = LevelQueue(tmp_path / "q", entries_per_file=8)
    for i in range(20):  # three files
        q.write(i, 64 + i, 1000 + i)
    paths = [q.files[k].path for k in sorted(q.files)]
    assert [random_read(p) for p in paths] == [False, False, True]
    q.close()
    tl = TimerLog(tmp_path / "tl", entries_per_file=8)
    for i in range(20):
        tl.append(i, 1000 + i, 64 + i, 0, 1)
    paths = [tl.files[k].path for k in sorted(tl.files)]
    assert [random_read(p) for p in paths] == [False, False, True]
    tl.close()


def test_id_table_is_random_but_scans_read_ahead(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=1 << 12)
    ix.restore(None)
    assert random_read(ix.f.path)
    with ix.f.scanning():
        assert not random_read(ix.f.path)
    assert random_read(ix.f.path)
    assert ix.precancels() == 0
    assert random_read(ix.f.path)
    ix.close()


def resident(path: Path, offsets: list[int]) -> list[bool]:
    """Whether the page at each offset of ``path`` is in the page cache: ``mincore(2)`` on a
    mapping of our own, which asks without faulting anything in."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        vec = (ctypes.c_ubyte * (size // mmap.PAGESIZE))()
        if libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return [bool(vec[off // mmap.PAGESIZE] & 1) for off in offsets]
    finally:
        del anchor
        mm.close()


def test_a_write_fault_in_random_mode_brings_in_its_own_page_only(tmp_path: Path) -> None:
    size, probe = 64 << 20, 12 * mmap.PAGESIZE  # inside even the default 128 KiB read-around window
    around: dict[bool, list[bool]] = {}
    for random_mode in (False, True):
        path = tmp_path / f"f{int(random_mode)}"
        f = MappedFile(path, magic=b"KDSTST\x00\x01", version=1, size=size, geom_a=0, geom_b=0, base=0,
                       create=True, sync_header=False, random=random_mode)
        off = 48 << 20  # a hole, beyond the window the header's write read (8 MiB here)
        f.buf[off] = 1
        f.close()
        here, *near = resident(path, [off, mmap.PAGESIZE, off + probe])
        assert here
        around[random_mode] = near  # the page after the header's, the page near the write's
    if around[False] == [False, False]:
        unavailable("read-around", "this file system or kernel reads no window around a fault: nothing to compare")
    assert around == {False: [True, True], True: [False, False]}


def test_opening_a_file_reads_its_header_and_no_window_around_it(tmp_path: Path) -> None:
    """A restart opens every segment; its header is read with ``pread``, not through a fault on the
    mapping, which would read the device's read-around window with it (8 MiB a segment here)."""
    size, probe = 64 << 20, 12 * mmap.PAGESIZE  # inside even the default 128 KiB window
    path = tmp_path / "sealed"
    f = MappedFile(path, magic=b"KDSTST\x00\x01", version=1, size=size, geom_a=7, geom_b=0, base=0,
                   create=True, sync_header=True)
    f.buf[HEADER_SIZE:] = b"\x01" * (size - HEADER_SIZE)  # written all through, as a sealed segment
    f.flush()
    f.close()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a restart long after: the cache let it go
    finally:
        os.close(fd)
    if any(resident(path, [0, probe])):
        unavailable("a test directory on disk", "this file system keeps the pages cached (tmpfs?): nothing to measure")
    g = MappedFile(path, magic=b"KDSTST\x00\x01", version=1, size=size, geom_a=7, geom_b=0, base=0, create=False)
    try:
        assert resident(path, [0, probe]) == [True, False]
        assert bytes(g.buf[HEADER_SIZE : HEADER_SIZE + 4]) == b"\x01" * 4  # the mapping reads as before
    finally:
        g.close()
