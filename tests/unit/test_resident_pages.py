"""Dropping the resident pages of the store's mappings (``MappedFile.drop_pages`` and the
``trim()`` of every owner): RSS really falls, and nothing is lost — not even writes that were
never msynced. Real files, real mappings, real ``/proc/self/status`` figures, no mocks."""

from __future__ import annotations

import mmap
import os
import random
from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.store import codec
from sidecar.store.log import CommitLog
from sidecar.store.mapped import HEADER_SIZE, MappedFile, PageWorker, page_worker
from sidecar.store.partition import (
    TRIM_ALL_EVERY,
    TRIM_DRAIN_RECORDS,
    Counters,
    IngressRecord,
)
from tests.infra import needs, needs_native
from tests.unit.helpers.pages import needs_populate, resident
from tests.unit.helpers.store_sim import T0, make_store

pytestmark = needs(os.path.exists("/proc/self/status") and hasattr(mmap, "MADV_DONTNEED"),
                   "Linux: /proc/self/status and MADV_DONTNEED")

MiB = 1 << 20
MAGIC = b"KDSTST\x00\x01"


def rss_file() -> int:
    """This process's RssFile in bytes: the mapped file pages it has in its page tables."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile line in /proc/self/status")


def mapped(path: Path, size: int) -> MappedFile:
    return MappedFile(path, magic=MAGIC, version=1, size=size, geom_a=0, geom_b=0, base=0, create=True)


def fill(f: MappedFile, seed: int) -> bytes:
    data = random.Random(seed).randbytes(f.size - HEADER_SIZE)
    f.buf[HEADER_SIZE:] = data
    return data


def test_drop_pages_keeps_writes_that_were_never_msynced(tmp_path: Path) -> None:
    """The claim the whole approach rests on: MADV_DONTNEED on a MAP_SHARED file mapping keeps
    dirty pages (they stay in the page cache, dirty, and are written back). Written through the
    mapping, dropped without any msync, then read with plain reads: the bytes are there; after an
    fsync and an attempt to evict the file's clean pages, read from disk: still there."""
    path = tmp_path / "f"
    f = mapped(path, 8 * MiB)
    data = fill(f, 1)
    f.drop_pages()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, len(data), HEADER_SIZE) == data, "plain read after the drop"
        os.fsync(fd)  # writes back the dirty pages: only possible if they were still marked dirty
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # evict the (now clean, unmapped) pages
        assert os.pread(fd, len(data), HEADER_SIZE) == data, "read back from the disk"
    finally:
        os.close(fd)
    assert bytes(f.buf[HEADER_SIZE:]) == data, "the mapping faults the same bytes back in"
    f.close()
    g = MappedFile(path, magic=MAGIC, version=1, size=8 * MiB, geom_a=0, geom_b=0, base=0, create=False)
    assert bytes(g.buf[HEADER_SIZE:]) == data
    g.close()


@pytest.mark.parametrize("msync", [True, False], ids=["flushed", "not-flushed"])
def test_drop_pages_lowers_rss(tmp_path: Path, msync: bool) -> None:
    size = 64 * MiB
    f = mapped(tmp_path / "f", size)
    before = rss_file()
    data = fill(f, 2)
    if msync:
        f.flush()
    touched = rss_file()
    assert touched - before >= size * 0.9, "writing 64 MiB through the mapping makes it resident"
    f.drop_pages()
    dropped = rss_file()
    assert touched - dropped >= size * 0.9, f"RssFile fell by {(touched - dropped) / MiB:.1f} MiB only"
    # A part of the range: only those pages go, and a drop of nothing resident is harmless.
    assert bytes(f.buf[HEADER_SIZE:]) == data
    assert rss_file() - dropped >= size * 0.9
    f.drop_pages(0, size // 2)
    assert rss_file() - dropped == pytest.approx(size / 2, rel=0.1)
    f.drop_pages(0, size // 2)
    f.drop_pages(size - 100)  # unaligned start, up to the end
    f.drop_pages(5, 5)  # empty range
    assert bytes(f.buf[HEADER_SIZE : HEADER_SIZE + 4096]) == data[:4096]
    f.close()
    f.drop_pages()  # a closed mapping: no-op


def append(log: CommitLog, n: int, value: bytes) -> int:
    return log.append(
        codec.head(
            rtype=codec.MESSAGE, due_ms=1000 + n, enqueue_ms=n, src_offset=n, src_partition=0, target_partition=-1,
            retry_count=0, level=1,
        ),
        b"r%d" % n, b"t", None, value, b"",
    )


def test_commit_log_trim(tmp_path: Path) -> None:
    """Sealed segments and the active one below the append page go; records read back; appends
    continue where they were."""
    log = CommitLog(tmp_path, 4 * MiB)
    list(log.recover(None, None))
    before = rss_file()
    value = bytes(range(256)) * 4
    positions = [append(log, i, value) for i in range(12_000)]  # ~12.7 MiB: 4 segments
    log.flush()
    touched = rss_file()
    assert touched - before >= 12 * MiB
    log.trim()
    assert touched - rss_file() >= 11 * MiB
    positions += [append(log, i, value) for i in range(12_000, 12_100)]
    for i, pos in enumerate(positions):
        rec = log.read(pos, verify=True)
        assert rec.src_offset == i and bytes(rec.value or b"") == value
    log.close()
    before = rss_file()
    log = CommitLog(tmp_path, 4 * MiB)
    assert [p for p, _r in log.recover(None, None)] == positions  # reads all, and the tail to the end
    assert rss_file() - before >= 12 * MiB
    log.trim()
    assert rss_file() - before <= 64 * 1024
    log.close()


@pytest.mark.parametrize("scheduler", ["levels", "wheel"])
@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "no-fsync"])
def test_store_trim_then_deliver_everything(tmp_path: Path, scheduler: str, fsync: bool) -> None:
    """A whole store: ingest, checkpoint (with or without msync), trim: RssFile falls back to
    about nothing; a crash-like reopen (no further checkpoint) and then every record is delivered
    with its own bytes."""
    n = 10_000
    before = rss_file()
    counters = Counters()
    store = make_store(tmp_path, scheduler, counters)
    for i in range(n):
        headers: list[tuple[str, bytes | None]] = [
            (c.TARGET_TOPIC, b"target"), (c.DELAY_MS, str(1000 + i % 3000).encode()), (c.ID, b"id-%d" % i),
        ]
        store.ingest(IngressRecord("in", 0, i, T0, b"k", b"v%d-" % i * 100, headers), T0)
    store.checkpoint(fsync=fsync)
    touched = rss_file()
    assert touched - before >= 5 * MiB
    store.trim()  # just written: only the commit log goes
    busy = rss_file()
    assert touched - busy >= 2 * MiB and busy - before >= 1 * MiB
    store.trim()  # nothing written since: the id index and the scheduler's files go too
    assert rss_file() - before <= 256 * 1024, f"{(rss_file() - before) / 1024:.0f} KiB still mapped after trim"
    store.close()  # a crash after the checkpoint: no flush, no further checkpoint
    store = make_store(tmp_path, scheduler, Counters())
    store.trim()
    got: dict[bytes, bytes] = {}
    now = T0
    while len(got) < n and now < T0 + 10_000:
        now += 500
        for ref, rec in store.sched.due(now, 100_000):
            got[bytes(rec.id)] = bytes(rec.value or b"")
            store.sched.ack(ref)
        store.trim()
    assert got == {b"id-%d" % i: b"v%d-" % i * 100 for i in range(n)}
    store.close()


def test_trim_policy_busy_idle(tmp_path: Path) -> None:
    """The id index and the scheduler's files go at every ``TRIM_ALL_EVERY``-th trim while the
    store is written between trims, and once more when it goes idle; not at the other calls."""
    store = make_store(tmp_path, "wheel", Counters())
    full = []
    for i in range(2 * TRIM_ALL_EVERY + 4):
        if i < TRIM_ALL_EVERY + 4:  # busy: a write and a checkpoint between two trims
            headers: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"target"), (c.DELAY_MS, b"5000")]
            store.ingest(IngressRecord("in", 0, i, T0, b"k", b"v", headers), T0)
            store.checkpoint(fsync=False)
        assert store.ids.f.buf[HEADER_SIZE] == 0  # a probe: the id index's first page is mapped
        before = rss_file()
        store.trim()
        full.append(before - rss_file() >= 4096)
    calls = [i + 1 for i, dropped in enumerate(full) if dropped]
    assert calls == [TRIM_ALL_EVERY, TRIM_ALL_EVERY + 5, 2 * TRIM_ALL_EVERY]
    store.close()


@pytest.mark.parametrize("scheduler", ["levels", "wheel"])
def test_trim_while_draining_a_backlog(tmp_path: Path, scheduler: str) -> None:
    """A store that delivers a backlog (thousands settled since the previous trim, few ingested)
    drops the commit log and scheduler pages the publisher read at that trim, not only at every
    ``TRIM_ALL_EVERY``-th: RSS falls back to about where it was before the reads (the id index's
    pages, touched by the removals, stay). One that ingests as much as it delivers drops only
    what was appended."""
    n = 7 * TRIM_DRAIN_RECORDS
    store = make_store(tmp_path, scheduler, Counters())
    for i in range(n):
        headers: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"target"), (c.DELAY_MS, b"1000")]
        store.ingest(IngressRecord("in", 0, i, T0, b"k", b"v" * 200, headers), T0)
    store.checkpoint(fsync=False)
    store.trim()
    store.trim()  # idle: everything goes
    base = rss_file()
    batch = store.sched.due(T0 + 2000, 3 * TRIM_DRAIN_RECORDS)  # ~3.6 MB of records read
    assert len(batch) == 3 * TRIM_DRAIN_RECORDS
    store.acked.extend(batch)
    store.settle()
    store.checkpoint(fsync=False)  # busy: not the idle trim
    before = rss_file()
    store.trim()
    after = rss_file()
    assert before - after >= 3 * MiB, f"draining: only {(before - after) / 1024:.0f} KiB dropped"
    assert after - base <= 1.5 * MiB, f"draining: {(after - base) / 1024:.0f} KiB still mapped"

    calls: list[str] = []
    log_trim, sched_trim = store.log.trim, store.sched.trim
    store.log.trim = lambda sealed=True: (calls.append(f"log sealed={sealed}"), log_trim(sealed))[1]  # type: ignore[method-assign]
    store.sched.trim = lambda: (calls.append("sched"), sched_trim())[1]  # type: ignore[method-assign]
    batch = store.sched.due(T0 + 2000, 3 * TRIM_DRAIN_RECORDS)
    store.acked.extend(batch)
    store.settle()
    for k in range(len(batch)):  # steady state, not a drain: as many ingested as delivered
        headers = [(c.TARGET_TOPIC, b"target"), (c.DELAY_MS, b"100000")]
        store.ingest(IngressRecord("in", 0, n + k, T0, b"k", b"v", headers), T0)
    store.checkpoint(fsync=False)
    store.trim()
    assert calls == ["log sealed=False"]
    store.close()


def test_a_merge_pass_leaves_no_index_pages_resident(tmp_path: Path) -> None:
    """The id index's table is written by merge passes with ``pread``/``pwrite`` on a thread, not
    through the loop's mapping: a pass over a 16 MiB table adds nothing to the process's RSS."""
    from sidecar.store.idindex import IdIndex

    ix = IdIndex(tmp_path, initial_capacity=1 << 20)  # 16 MiB of slots
    ix.restore(None)
    ix.trim()
    for k in range(2000):
        ix.put(2 + k * 7919, k + 1)
    before = rss_file()
    ix.growth.cut(force=True)
    ix.wait()
    grew = rss_file() - before
    assert ix.table_live == 2000 and ix.find(2 + 5 * 7919) == [6]
    assert grew < 2 * (1 << 20), f"the pass left {grew / (1 << 20):.1f} MiB of the index resident"
    ix.close()


@needs_native
def test_native_drop_unmaps_the_ranges_and_keeps_every_byte(tmp_path: Path) -> None:
    """``drop`` (pages.c): MADV_DONTNEED on a list of ranges in one call, the GIL released, each
    clipped to its mapping, a closed mapping skipped; writes never msynced survive it (the same
    claim as ``drop_pages``)."""
    assert codec.native is not None
    f, g = mapped(tmp_path / "f", HEADER_SIZE + 12 * MiB), mapped(tmp_path / "g", HEADER_SIZE + 4 * MiB)
    data, data_g = fill(f, 7), fill(g, 8)
    closed = mapped(tmp_path / "c", HEADER_SIZE + MiB)
    closed.close()
    assert resident(tmp_path / "f") >= 12 * MiB and resident(tmp_path / "g") >= 4 * MiB
    # f: from page 1 (aligned outward), 5 MiB; g: past its end (nothing), then all of it (clipped)
    ranges = [(f.mm, 4096 + 100, 5 * MiB), (closed.mm, 0, MiB), (g.mm, g.size + 4096, 1 << 40), (g.mm, -5, 1 << 40)]
    assert codec.native.drop(ranges) == 0
    left = resident(tmp_path / "f")
    assert 12 * MiB - 5 * MiB - 8192 <= left <= 12 * MiB - 5 * MiB + 8192, left
    assert resident(tmp_path / "g") <= 4096
    assert codec.native.drop([]) == 0
    with pytest.raises(TypeError, match="each range is"):
        codec.native.drop([(f.mm, 0)])
    assert bytes(f.buf[HEADER_SIZE:]) == data and bytes(g.buf[HEADER_SIZE:]) == data_g
    f.close()
    f = MappedFile(tmp_path / "f", magic=MAGIC, version=1, size=HEADER_SIZE + 12 * MiB, geom_a=0, geom_b=0, base=0,
                   create=False)
    assert bytes(f.buf[HEADER_SIZE:]) == data, "the page cache kept the dirty pages"
    f.close()
    g.close()


@needs_native
def test_trim_hands_the_unmapping_to_the_page_thread(tmp_path: Path) -> None:
    """With a page thread the loop only collects the ranges (its RSS is what it was after trim()
    returns, with a drop that does nothing); the thread unmaps them (RSS falls as with the inline
    trim, once the thread is done)."""
    assert codec.native is not None
    asked: list[list[tuple[mmap.mmap, int, int]]] = []

    def record(ranges: list[tuple[mmap.mmap, int, int]]) -> int:
        asked.append(ranges)
        return 0

    headers: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"target"), (c.DELAY_MS, b"5000")]
    for real in (False, True):
        pages = page_worker() if real else PageWorker(None, record)
        store = make_store(tmp_path / str(real), "levels", Counters(), pages=pages)
        for i in range(20_000):
            store.ingest(IngressRecord("in", 0, i, T0, b"k", b"v" * 200, headers), T0)
        store.checkpoint(fsync=False)
        store.trim()
        pages.close()  # that busy call's drops done (the next request starts the thread again)
        asked.clear()
        before = rss_file()
        store.trim()  # idle after a busy call: everything goes
        if not real:
            assert rss_file() >= before - 64 * 1024, "nothing unmapped on the calling thread"
            pages.close()
            assert len(asked) == 1, "one call for the whole trim"
            mms = {id(mm) for mm, _s, _n in asked[0]}
            assert id(store.ids.f.mm) in mms and id(store.log.segments[0].mm) in mms
            assert rss_file() >= before - 64 * 1024
        else:
            pages.close()
            assert pages.dropped > 0
            # left after the busy call: the id table's pages (1 MiB, all probed) and the level
            # queue's (20,000 entries of 24 bytes)
            assert before - rss_file() >= MiB, "the page thread unmapped the store's pages"
        store.close()


def test_the_stores_full_trims_fall_on_different_calls(tmp_path: Path) -> None:
    """Each store's full trim (the id index and the scheduler's files) comes every
    ``TRIM_ALL_EVERY``-th call at its own phase (its partition): a process's stores do not all
    unmap their tables in one loop turn."""
    headers: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"target"), (c.DELAY_MS, b"5000")]
    seen: dict[int, list[int]] = {}
    for p in (0, 1, 5):
        store = make_store(tmp_path / str(p), "levels", Counters(), partition=p)
        calls: list[int] = []
        for n in range(1, 2 * TRIM_ALL_EVERY + 1):
            store.ingest(IngressRecord("in", p, n, T0, b"k", b"v", headers), T0)  # busy between calls
            ids_before = store.ids.f.buf[HEADER_SIZE]  # a probe: the table's first page is mapped
            mapped_before = resident(store.ids.path)
            store.trim()
            if resident(store.ids.path) < mapped_before:
                calls.append(n)
            assert store.ids.f.buf[HEADER_SIZE] == ids_before
        seen[p] = calls
        store.close()
    assert seen == {p: [n for n in range(1, 2 * TRIM_ALL_EVERY + 1) if (n + p) % TRIM_ALL_EVERY == 0]
                    for p in (0, 1, 5)}


@needs_populate
@pytest.mark.parametrize("scheduler", ["levels", "wheel"])
def test_the_schedulers_entry_files_are_faulted_in_ahead_of_the_intake(tmp_path: Path, scheduler: str) -> None:
    """mapped.Ahead: the C intake's and the Python path's appends to a level queue or the timer
    log are followed by a request for the next ENTRIES_AHEAD entries' pages, which the page thread
    maps in without changing a byte; every record is still delivered with its own bytes."""
    from confluent_kafka import Message

    from sidecar.store.mapped import ENTRIES_AHEAD, ENTRIES_AHEAD_LOW

    pages = page_worker()
    store = make_store(tmp_path, scheduler, Counters(), pages=pages, entries_per_file=65536)
    headers: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"target"), (c.DELAY_MS, b"5000")]
    n = 5000
    msgs = [Message(topic="in", partition=0, offset=i, key=b"k", value=b"v%d" % i, headers=headers,
                    timestamp=(1, T0)) for i in range(n)]
    i = by_python = 0
    while i < n:  # as the loop does: the C intake, and the reference path for what it leaves
        i = store.ingest_many(msgs, i, T0, "in")
        if i < n:
            store.ingest(IngressRecord("in", 0, i, T0, b"k", b"v%d" % i, headers), T0)
            i, by_python = i + 1, by_python + 1
    assert by_python <= 2, "the C intake took all but the first records (files created)"
    if scheduler == "levels":
        lv = store.sched.levels[2]  # type: ignore[attr-defined]  # 5000 ms: level 2
        ahead, write, files, hs, size = lv.queue.ahead, lv.write, lv.queue.files, HEADER_SIZE, 24
    else:
        tl = store.sched.tl  # type: ignore[attr-defined]
        ahead, write, files, hs, size = tl.ahead, store.sched.head, tl.files, tl.hs, 32  # type: ignore[attr-defined]
    assert write == n
    assert n + ENTRIES_AHEAD_LOW < ahead.asked <= n + ENTRIES_AHEAD, "asked after the C runs"
    pages.close()
    f = files[0]
    assert resident(f.path) >= (ahead.asked - n) * size, "the pages ahead are mapped in"
    assert bytes(f.buf[hs + n * size: hs + ahead.asked * size]) == bytes((ahead.asked - n) * size), "none written"
    # the Python path (one record at a time) asks again once within ENTRIES_AHEAD_LOW
    asked = ahead.asked
    while write + ENTRIES_AHEAD_LOW <= asked:
        store.ingest(IngressRecord("in", 0, i, T0, b"k", b"v%d" % i, headers), T0)
        i += 1
        write = lv.write if scheduler == "levels" else store.sched.head  # type: ignore[attr-defined]
    assert ahead.asked == write + ENTRIES_AHEAD > asked
    pages.close()
    got: dict[int, bytes] = {}
    for ref, rec in store.sched.due(T0 + 5000, 100_000):
        got[rec.src_offset] = bytes(rec.value or b"")
        store.sched.ack(ref)
    assert got == {n: b"v%d" % n for n in range(i)}
    store.close()


def _address(mm: mmap.mmap) -> int:
    import ctypes

    view = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # the export ends: the mapping can be closed


def _resident_at(start: int) -> int | None:
    """Bytes resident of the mapping that starts at ``start`` (its smaps entry's Rss); None: no
    mapping starts there."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = int(head[0].split("-")[0], 16) == start
            elif inside and line.startswith("Rss:"):
                return int(head[1]) * 1024
    return None


@needs_populate
def test_a_busy_id_index_has_its_next_stage_faulted_in_ahead(tmp_path: Path) -> None:
    """IdIndex._new_gen: when a generation is cut because it filled, the next stage's pages are
    asked of the page thread, which maps them in without writing a byte; after a generation cut by
    its age (a quiet index) they are left to the inserts (RSS). A stage whose pass is done is
    unmapped by the page thread (idindex.unmap), not by the loop."""
    from sidecar.store import idgrowth, idindex

    pages = page_worker()
    ix = idindex.IdIndex(tmp_path, pages=pages)
    ix.restore(None)
    now = 1
    ix.step(now, 1 << 40)
    n = idgrowth.cut_ops(ix.cap)
    for k in range(n):
        ix.put(1_000_003 * k + 2, k)
    ix.step(now, 1 << 40)  # full: cut
    assert ix.passes == 0 and ix.sealed is not None
    sealed_at = _address(ix.sealed.stage.mm)
    stage = ix.gen.stage  # type: ignore[union-attr]
    pages.close()  # its requests done
    size = len(stage.mm)
    assert size >= 1 << 20 and (_resident_at(_address(stage.mm)) or 0) >= size - mmap.PAGESIZE
    assert stage.mm[:] == bytes(size), "nothing written"
    ix.wait()  # the pass noticed: the sealed stage handed to the page thread
    assert ix.sealed is None and ix.passes == 1
    pages.close()
    assert _resident_at(sealed_at) is None, "unmapped"
    ix.put(7, 7)
    now += int(idgrowth.CUT_S * 1000) + 1
    ix.step(now, 1 << 40)  # cut by age, one operation in it
    stage = ix.gen.stage  # type: ignore[union-attr]
    pages.close()
    assert (_resident_at(_address(stage.mm)) or 0) < len(stage.mm) // 4
    ix.wait()
    assert ix.find(7) == [7] and ix.find(2) == [0]
    ix.close()
