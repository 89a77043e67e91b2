"""Page waits: the loop never waits for the disk for an id-table page.

A new id's duplicate check reads a slot of the id table where the slot's tag matches (1 in 252
occupied slots); at 100M pending the kernel has evicted many of the table's pages, and such a
read waited 50-135 ms for the disk on the loop (run h9a). With ``Common.IDX_RESIDENT`` the C
intake reads a table slot only where its page is in memory (``mincore``), and else stops before
the record with the slot in ``Common.IDX_WAIT``; the store has the page read on the page thread
(``IdIndex.read_page``), and the loop pauses the partition from that record on and consumes it
again once the page is in (``PageWaits.hold``).

The first test evicts a real table's pages from the page cache and checks that the C intake
stops, that the page thread reads the page in, and that the record is then stored. The others
run the real loop on the Kafka twin with the stop simulated at a chosen record: nothing is stored
twice or out of order, nothing is lost, and the partition is held only while it waits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message

from sidecar import contract as c
from sidecar.engine import page_waits as page_waits_mod
from sidecar.engine.stores import StoreKey
from sidecar.store.idindex import IdIndex, id_hash
from sidecar.store.idpages import PageRead
from sidecar.store.mapped import PageWorker, page_worker
from sidecar.store.partition import Counters, IngressRecord, PartitionStore
from tests.infra import needs_native, unavailable
from tests.unit.helpers.store_sim import T0, make_store
from tests.unit.helpers.world import INGRESS, PARTITIONS, World

pytestmark = needs_native

HEADERS: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"target"), (c.DELAY_MS, b"5000")]
TMPFS_MAGIC = 0x01021994


def _msg(offset: int) -> Message:
    return Message(topic="in", partition=0, offset=offset, key=b"k", value=b"v%d" % offset, headers=HEADERS,
                   timestamp=(1, T0))


def _on_tmpfs(path: Path) -> bool:
    """tmpfs pages cannot leave memory: there is nothing to evict (and so nothing to wait for)."""
    import ctypes

    buf = (ctypes.c_long * 16)()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(str(path).encode(), buf) != 0:
        return False
    return bool(buf[0] == TMPFS_MAGIC)


def _evict(store: PartitionStore) -> None:
    """Unmap the table from this process and drop its (clean: synced by the pass) pages from the
    page cache."""
    f = store.ids.f
    f.drop_pages()
    fd = os.open(f.path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _evictable_store(tmp_path: Path) -> tuple[PartitionStore, Counters, PageWorker]:
    """A levels store with a page thread, on a file system whose pages can be evicted."""
    if _on_tmpfs(tmp_path):
        unavailable("a test directory on disk", "tmp_path is on tmpfs, whose pages cannot be evicted "
                    "(point TMPDIR or --basetemp at a disk)")
    pages = page_worker()
    counters = Counters()
    return make_store(tmp_path, "levels", counters, pages=pages), counters, pages


def _read_done(read: PageRead, timeout_s: float = 10) -> bool:
    """Wait for the page thread's read (True), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not read.done and time.monotonic() < deadline:
        time.sleep(0.005)
    return read.done


def test_the_intake_stops_for_a_table_page_out_of_memory_and_stores_the_record_once_it_is_read(
        tmp_path: Path) -> None:
    store, counters, pages = _evictable_store(tmp_path)
    n = 30_000
    msgs = [_msg(i) for i in range(n)]
    i = 0
    while i < n:
        i = store.ingest_many(msgs, i, T0, "in")
        assert store.page_read is None, "nothing is in the table yet"
        if i < n:  # the reference path (the files' first records)
            store.ingest(IngressRecord("in", 0, i, T0, b"k", b"v%d" % i, HEADERS), T0)
            i += 1
    ids = store.ids
    ids.growth.cut(force=True)  # every id into the table, by a pass that builds its tags
    ids.wait()
    assert ids.tags is not None and ids.table_live >= n
    _evict(store)
    stored = counters.ingested
    stops = 0
    offset = n
    while offset < n + 20_000:
        m = [_msg(offset)]
        end = store.ingest_many(m, 0, T0, "in")
        if end == 1:  # no tag matched, or its page was in memory: stored
            assert store.page_read is None
            offset += 1
            continue
        # stopped: this id's tag matched a slot whose page is not in memory
        read = store.page_read
        assert read is not None, "the C intake left the record for another reason"
        assert counters.ingested == stored + offset - n, "nothing of the stopped record was stored"
        assert _read_done(read), "the page thread read the page"
        store.page_read = None
        assert store.ingest_many(m, 0, T0, "in") == 1, "the page is in memory now: the record is stored"
        assert store.page_read is None
        stops += 1
        offset += 1
        if stops == 3:
            break
        _evict(store)
    assert stops == 3, f"the intake never stopped for an evicted page in {offset - n} new ids"
    assert counters.ingested == stored + offset - n and counters.duplicates == 0
    # and with the caller not holding partitions for pages, the intake reads the slot itself
    _evict(store)
    store.page_waits = False
    tail = [_msg(o) for o in range(offset, offset + 3000)]
    j = 0
    while j < len(tail):
        j = store.ingest_many(tail, j, T0, "in")
        assert store.page_read is None, "no stop for a page without page waits"
        if j < len(tail):  # another reason (a segment's end, a new queue file): the reference path
            store.ingest(IngressRecord("in", 0, offset + j, T0, b"k", b"v%d" % (offset + j), HEADERS), T0)
            j += 1
    assert counters.ingested == stored + offset - n + len(tail)
    store.close()
    pages.close()


def _stop_once(monkeypatch: pytest.MonkeyPatch, partition: int, at_offset: int) -> PageRead:
    """The C intake of ``partition`` stops once before the record at ``at_offset``, as it does for
    a table page out of memory (the page read handed back, not done until the test says so)."""
    real = PartitionStore.ingest_many
    read = PageRead()
    state = {"stopped": False}

    def ingest_many(self: PartitionStore, msgs: list[Any], start: int, now_ms: int, topic: str,
                    direct: Any = None) -> int:
        if state["stopped"] or self.partition != partition:
            return real(self, msgs, start, now_ms, topic, direct)
        k = start
        while k < len(msgs) and msgs[k].partition() == partition and msgs[k].offset() < at_offset:
            k += 1
        if k == len(msgs) or msgs[k].partition() != partition or msgs[k].offset() != at_offset:
            return real(self, msgs, start, now_ms, topic, direct)
        j = real(self, msgs[:k], start, now_ms, topic, direct)
        if j < k:
            return j  # the reference path first, as the C intake would stop there
        state["stopped"] = True
        self.page_read = read
        return k

    monkeypatch.setattr(PartitionStore, "ingest_many", ingest_many)
    return read


def _paused(w: World) -> set[int]:
    return {p for cons in w.clients.consumers for _topic, p in cons.paused}


def test_a_partition_waits_for_its_page_and_then_is_consumed_again_from_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read = _stop_once(monkeypatch, partition=1, at_offset=10)
    w = World(tmp_path)
    sc = w.sidecar("a", scheduler="levels")
    w.send(200, lambda i: 1000)
    w.run([sc], lambda: StoreKey(INGRESS, 1) in sc.page_waits.held)
    assert sc.page_waits.count == 1
    # held: its records from offset 10 are not stored while the page is read; the others go on
    w.run([sc], lambda: all(sc.stores[StoreKey(INGRESS, p)].next_offset == 50 for p in (0, 2, 3)))
    for _ in range(20):
        sc.turn()
    assert sc.stores[StoreKey(INGRESS, 1)].next_offset == 10 and 1 in _paused(w) and 0 not in _paused(w)
    read.done = True
    end = w.clock.now_ms + 3000
    w.run([sc], lambda: w.clock.now_ms >= end and len(w.delivered()) == 200)
    assert not sc.page_waits.held and 1 not in _paused(w)
    w.check(set(w.sent))  # each once, none early
    assert sc.stores[StoreKey(INGRESS, 1)].next_offset == 50
    counters = sc.stores[StoreKey(INGRESS, 0)].counters  # the loop's, shared by its stores
    assert all(st.counters is counters for st in sc.stores.values())
    assert counters.ingested == 200 and counters.duplicates == 0
    sc.shutdown()


def test_a_page_read_that_takes_too_long_lets_the_partition_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page thread never answers (stuck behind a slow request): after PAGE_WAIT_S the
    partition is consumed again anyway and its next intake reads the slot wherever it is."""
    _stop_once(monkeypatch, partition=2, at_offset=5)
    w = World(tmp_path)
    sc = w.sidecar("a", scheduler="levels")
    w.send(100, lambda i: 1000)
    w.run([sc], lambda: StoreKey(INGRESS, 2) in sc.page_waits.held)
    since = w.clock.monotonic()
    w.run([sc], lambda: StoreKey(INGRESS, 2) not in sc.page_waits.held)
    assert w.clock.monotonic() - since >= page_waits_mod.PAGE_WAIT_S
    end = w.clock.now_ms + 3000
    w.run([sc], lambda: w.clock.now_ms >= end and len(w.delivered()) == 100)
    w.check(set(w.sent))
    assert sc.stores[StoreKey(INGRESS, 2)].next_offset == 100 // PARTITIONS
    sc.shutdown()


def _cancel(offset: int, rid: bytes) -> IngressRecord:
    return IngressRecord("in", 0, offset, T0, b"k", None, [(c.CANCEL, rid)])


def test_a_cancel_whose_look_up_needs_a_page_out_of_memory_is_left_until_the_page_is_read(
        tmp_path: Path) -> None:
    """A cancel never takes the C intake: its look-up (``IdIndex.find``) reads every slot whose tag
    matches, in place. With the table's pages evicted, the store leaves the cancel untouched (no
    counter, no offset, nothing in the log) with the page's read under way, and takes it once the
    page is in memory: the record is cancelled."""
    store, counters, pages = _evictable_store(tmp_path)
    n = 20_000
    for i in range(n):
        store.ingest(IngressRecord("in", 0, i, T0, b"k", b"v%d" % i, [*HEADERS, (c.ID, b"r%d" % i)]), T0)
    ids = store.ids
    ids.growth.cut(force=True)
    ids.wait()
    assert ids.tags is not None and ids.table_live >= n
    offset, waited = n, 0
    for k in range(0, 5000, 1000):
        rid = b"r%d" % k
        _evict(store)
        assert ids.evicted(id_hash(rid)) >= 0, "evicted: the page of the id's slot is out"
        head, before = store.log.head, (counters.ingested, counters.cancelled, store.next_offset)
        store.ingest(_cancel(offset, rid), T0)
        assert store.page_read is not None, "the id's own slot is in the table: its tag matched, its page is out"
        for _ in range(3):  # another matched slot of the probe, on the next page: waited for too
            read = store.page_read
            if read is None:
                break
            assert (counters.ingested, counters.cancelled, store.next_offset) == before and store.log.head == head
            assert _read_done(read)
            store.page_read = None
            store.ingest(_cancel(offset, rid), T0)
        assert store.page_read is None and counters.cancelled == before[1] + 1
        assert store.next_offset == offset + 1
        offset += 1
        waited += 1
    assert waited == 5
    # without page waits the look-up reads the page itself
    _evict(store)
    store.page_waits = False
    store.ingest(_cancel(offset, b"r7000"), T0)
    assert store.page_read is None and counters.cancelled == waited + 1
    store.close()
    pages.close()


def _cancel_waits(monkeypatch: pytest.MonkeyPatch, rid: bytes, once: bool) -> PageRead:
    """The look-up under ``rid`` finds its page out of memory (once, or every time it is asked);
    the page read handed back is done when the test says so."""
    read = PageRead()
    real_evicted = IdIndex.evicted
    state = {"asked": 0}

    def evicted(self: IdIndex, h: int) -> int:
        if h == id_hash(rid) and not (once and state["asked"]):
            state["asked"] += 1
            return 0
        return real_evicted(self, h)

    monkeypatch.setattr(IdIndex, "evicted", evicted)
    monkeypatch.setattr(IdIndex, "read_page", lambda self, slot: read)
    return read


def _send_cancels(w: World) -> None:
    """200 records r0..r199 due in 5 s, then cancels of r1 and r5 (partition 1, offsets 50 and 51),
    then 40 more records s0..s39."""
    w.send(200, lambda i: 5000)
    for rid in (b"r1", b"r5"):
        w.cluster.append(INGRESS, 1, b"k", None, [(c.CANCEL, rid)])
    w.send(40, lambda i: 5000, prefix="s")
    for rid in (b"r1", b"r5"):
        del w.sent[rid]


def test_a_cancel_waits_for_its_page_with_its_partition_held_and_then_cancels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read = _cancel_waits(monkeypatch, b"r1", once=True)
    w = World(tmp_path)
    sc = w.sidecar("a", scheduler="levels")
    _send_cancels(w)
    w.run([sc], lambda: StoreKey(INGRESS, 1) in sc.page_waits.held)
    w.run([sc], lambda: all(sc.stores[StoreKey(INGRESS, p)].next_offset == 60 for p in (0, 2, 3)))
    for _ in range(20):
        sc.turn()
    # held at the cancel: neither it nor what follows it on partition 1 is stored meanwhile
    assert sc.stores[StoreKey(INGRESS, 1)].next_offset == 50 and 1 in _paused(w) and 0 not in _paused(w)
    counters = sc.stores[StoreKey(INGRESS, 0)].counters
    assert counters.cancelled == 0
    read.done = True
    end = w.clock.now_ms + 8000
    w.run([sc], lambda: w.clock.now_ms >= end and len(w.delivered()) == 238)
    assert not sc.page_waits.held and 1 not in _paused(w) and sc.page_waits.count == 1
    assert counters.cancelled == 2 and counters.ingested == 242 and counters.duplicates == 0
    assert sc.stores[StoreKey(INGRESS, 1)].next_offset == 62
    w.check(set(w.sent))  # the 238 not cancelled, each once, none early; r1 and r5 never
    sc.shutdown()


def test_a_cancel_whose_page_read_takes_too_long_is_taken_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page never comes in (asked each time, the read never done): after PAGE_WAIT_S the
    partition is consumed again and the cancel does its look-up in place; one wait, not a loop."""
    _cancel_waits(monkeypatch, b"r1", once=False)
    w = World(tmp_path)
    sc = w.sidecar("a", scheduler="levels")
    _send_cancels(w)
    w.run([sc], lambda: StoreKey(INGRESS, 1) in sc.page_waits.held)
    since = w.clock.monotonic()
    w.run([sc], lambda: StoreKey(INGRESS, 1) not in sc.page_waits.held)
    assert w.clock.monotonic() - since >= page_waits_mod.PAGE_WAIT_S
    end = w.clock.now_ms + 8000
    w.run([sc], lambda: w.clock.now_ms >= end and len(w.delivered()) == 238)
    counters = sc.stores[StoreKey(INGRESS, 0)].counters
    assert counters.cancelled == 2 and sc.page_waits.count == 1
    w.check(set(w.sent))
    sc.shutdown()
