"""The id index: ``delay.id`` -> scheduler ref, a hash table on disk with a staged write path.

``delay.id`` deduplication and ``delay.cancel`` need "which pending record has this id?" for
hundreds of millions of pending records. A Python dict would cost ~100 bytes of RAM per record;
the table costs 16 bytes of *file* per slot and no per-record Python object.

This module is the table (``IdIndex``): its files, stages and generations, the probes, the C
intake's state, durability and recovery. The work that grows it runs apart, off the loop: when a
generation is merged and the table grown (``Growth``, sidecar/store/idgrowth.py), the merge pass
on its worker threads (sidecar/store/idpass.py), a table page read on the page thread
(sidecar/store/idpages.py). The Python twins of the C probes are in sidecar/store/idprobe.py.

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
- **cut**: when the open stage is full enough or old enough and no pass runs, the open generation
  is sealed and a new one opens (when: sidecar/store/idgrowth.py). A worker thread merges the
  sealed generation's journal into the table in one ascending pass (sidecar/store/idpass.py), off
  the loop's CPU; the pass counts the table's live and tombstone slots exactly and removes the
  pre-cancels older than the cancel horizon.
- **while the pass runs**, the loop probes three tables: open stage, sealed stage, table. The pass
  leaves the table valid for a concurrent reader at every write (merge.c). When it is done (noticed
  at an index step), the sealed stage is dropped: its entries are in the table (``merged``).
- **growth**: a cut whose inserts would take the table past half full first rebuilds it into
  ``ids.idx.next.<n>`` (twice the size, or the same size to shed the tombstones; idgrowth.py),
  then merges the generation into it; the loop maps it when the pass is done, and it takes the
  name ``ids.idx`` at the next flush, in the durability order (synced, renamed, directory synced,
  then the checkpoint). No growth pauses the loop.

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
on the page thread (sidecar/store/idpages.py), and the loop holds the partition until it is in
(sidecar/engine/page_waits.py): the loop never waits for the disk for a duplicate check, only
that partition does, for a moment.

**Turns.** The indexes of a process take turns for the passes a cut by age starts (idgrowth.py).

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
``native=False``, or with ``KDS_PURE_PYTHON=1``, runs the Python ones (idprobe.py).

A ref with the top bit set is a *pre-cancel*: a cancel that arrived before its message; the low
bits hold the cancel's time (epoch ms) so it can expire after the cancel horizon.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from sidecar import logs
from sidecar.store import idjournal
from sidecar.store.codec import NATIVE
from sidecar.store.codec import native as _native
from sidecar.store.idgrowth import NEXT, Growth, cut_ops
from sidecar.store.idpages import PageRead, read_page
from sidecar.store.idpass import Pass
from sidecar.store.idprobe import (
    count_range,
    id_hash,
    py_apply,
    py_copy,
    py_expired,
    py_find,
    py_put,
    py_remove,
)
from sidecar.store.idslot import (
    EMPTY,
    INITIAL_SLOTS,
    MAGIC,
    PRECANCEL,
    REMOVE_MARK,
    SLOT,
    SLOT_SIZE,
    TOMB,
    VERSION,
)
from sidecar.store.idstage import Stage, unmap
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
    unborn,
)

__all__ = ["EMPTY", "HEADER_SIZE", "NEXT", "PRECANCEL", "SLOT", "SLOT_SIZE", "TOMB", "IdIndex", "id_hash"]

READS = (1, 2)  # a version-1 table is a version-2 one no migration ever wrote
log = logs.get("sidecar.store")


def _header(path: Path) -> tuple[int, int]:
    """(format version, base) from a table's header, unchecked (MappedFile checks it)."""
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE or head[:8] != MAGIC:
        return VERSION, 0
    _m, ver, _hs, _ga, _gb, base, _r, _crc = HEADER.unpack(head)
    return int(ver), int(base)



@dataclass
class Gen:
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



class IdIndex:
    """The id table of one partition's store (module docstring); ``growth`` merges and grows it.

    One job although it is long: the table, its tags and its two stages answer as one table, and
    every method (a probe, an insert or remove, the C intake's hand-over, a flush, a checkpoint's
    state, a recovery) reads or changes the same generations, journals and counts together. What
    runs off the loop, the growth and the passes and the page reads, is apart, and so are the Python
    twins of the probes."""

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
        self.gen: Gen | None = None  # the open generation
        self.sealed: Gen | None = None  # the generation a pass merges (or failed to: run again)
        self._merged: list[int] = []  # journals whose pass finished, deleted once no checkpoint names them
        self._named: set[int] = set()  # the journals the last ``state`` named
        self._ever_named: set[int] = set()  # every journal a ``state`` named (a checkpoint on disk may name it)
        self._shadow: dict[tuple[int, int], int] = {}  # removed pre-cancels -> the generation of the remove
        self._swap: MappedFile | None = None  # a rebuilt table, named ids.idx at the next flush
        self.tags: mmap.mmap | None = None  # the table's tags, once a pass built them ("Tags")
        self._retired: list[tuple[MappedFile, bool]] = []  # old tables' mappings (and unlink?), for ``reclaim``
        self._jbuf = bytearray()
        self.swept = 0  # expired pre-cancels the passes removed
        self.passes = 0
        self.grown = 0
        # the next generation's journal, made ahead; one a crash leaves is named by no checkpoint
        # and deleted by the next restore
        self._spare_journal: Spare[idjournal.JournalWriter] = Spare(
            pages, lambda g: idjournal.JournalWriter(self.dir, g), idjournal.JournalWriter.unlink)
        self.growth = Growth(self)  # when the open generation is merged into the table, and how

    # -- open -------------------------------------------------------------------------------------
    def restore(self, state: dict[str, Any] | None) -> None:
        """Open the journals the checkpoint (``state``) names and merge them again; delete what
        it does not name (module docstring, "Checkpoint and recovery")."""
        for p in self.dir.glob(NEXT + "*"):
            tail = p.name[len(NEXT):]
            if tail.isdigit():
                self.growth.seq = max(self.growth.seq, int(tail))
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
                self.table_live, self.table_tombs = count_range(self.f.buf, 0, self.cap)
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
            self.gen = gen
            self.growth.cut(force=True)
        self.gen = self._new_gen(last + 1, cut_ops(self.cap), opened=self.growth.now_ms)
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
                    py_copy(self.f.buf, new.buf, lo, self.cap, cap - 1)
            new.mm.flush()
            os.replace(nxt, self.path)
            fsync_dir(self.dir)
            self.f.close()
            new.path = self.path
            self.f, self.cap, self.mask = new, cap, cap - 1
        with self.f.scanning():
            self.table_live, self.table_tombs = count_range(self.f.buf, 0, self.cap)
        log.info("ids.upgraded", capacity=self.cap, live=self.table_live)

    def _load(self, stage: Stage, records: bytes) -> None:
        live, tombs = (_native.idx_apply(stage.buf, HEADER_SIZE, stage.mask, records) if self.native
                       else py_apply(stage.buf, stage.mask, records))
        stage.live += live
        stage.tombs += tombs

    def _new_gen(self, g: int, ops: int, writer: bool = True, busy: bool = False, opened: int = 0) -> Gen:
        """A generation with a stage for ``ops`` operations (a quarter full at most); ``busy``: the
        one before it filled (its stage's pages are faulted in ahead); ``opened``: the clock (ms)."""
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
        return Gen(g, stage, jw, opened)

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
        for gen in (self.gen, self.sealed):
            if gen is not None:
                n += gen.stage.live
        return n

    @property
    def tombs(self) -> int:
        return self.table_tombs

    @property
    def merging(self) -> bool:
        """True while a pass runs."""
        return self.growth.running is not None

    def state(self) -> dict[str, Any]:
        """The checkpoint's ``ids``: the table's capacity and counts, the journals still needed
        (at the length the last flush made durable) and the open generation's number."""
        journals: list[list[int]] = []
        for gen in (self.sealed, self.gen):
            if gen is None:
                continue
            if gen.writer is None:  # loaded at recovery: its files, whole as read
                journals.extend([g, n] for g, n in gen.named)
            else:
                journals.append([gen.g, gen.durable])
        self._named = {g for g, _n in journals}
        self._ever_named |= self._named
        assert self.gen is not None
        return {"cap": self.cap, "live": self.table_live, "tombs": self.table_tombs, "gen": self.gen.g,
                "journals": journals}

    # -- probes -----------------------------------------------------------------------------------
    def _tables(self) -> Iterator[tuple[Any, int, mmap.mmap | None]]:
        """(buffer, mask, tags) of the open stage, the sealed stage and the table."""
        for gen in (self.gen, self.sealed):
            if gen is not None:
                yield gen.stage.buf, gen.stage.mask, None
        yield self.f.buf, self.mask, self.tags

    def find(self, h: int) -> list[int]:
        """Every ref stored under hash ``h`` (usually zero or one) in the stages and the table,
        once each, without the pre-cancels removed since."""
        nat = self.native
        found: list[int] = []
        for buf, mask, tags in self._tables():
            for r in (_native.idx_find(buf, HEADER_SIZE, mask, h, tags) if nat else py_find(buf, mask, h)):
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
             else py_put(st.buf, st.mask, h, ref))
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

    def _room(self) -> Gen:
        """The open generation, with room in its stage for one more entry (``Growth.room`` when
        the stage is full)."""
        gen = self.gen
        assert gen is not None
        st = gen.stage
        if (st.live + st.tombs + 1) * 2 <= st.cap:
            return gen
        return self.growth.room(gen)

    def remove(self, h: int, ref: int) -> None:
        """Remove (h, ref): from the open stage at once, from the sealed stage and the table by a
        later pass (journaled); a pre-cancel is hidden from ``find`` meanwhile."""
        gen = self.gen
        assert gen is not None
        st = gen.stage
        was = (_native.idx_remove(st.buf, HEADER_SIZE, st.mask, h, ref) if self.native
               else py_remove(st.buf, st.mask, h, ref))
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
        gen = self.gen
        assert gen is not None
        st = gen.stage
        if not self.native:
            removed = 0
            for ref, rec in pairs:
                h = id_hash(rec.id)
                was = py_remove(st.buf, st.mask, h, ref)
                if was is not None:
                    removed += 1
                    st.live -= 1
                    st.tombs += was[1]
                gen.pending += REMOVE_MARK + SLOT.pack(h, ref)
        else:
            removed, tombs, journal = _native.idx_remove_delivered(st.buf, HEADER_SIZE, st.mask, pairs)
            st.live -= removed
            st.tombs += tombs
            gen.pending += journal
        gen.ops += len(pairs)
        return int(removed)

    def precancels(self, before_ms: int = 1 << 62) -> int:
        """Pre-cancels made before ``before_ms`` in the index and not removed, copies counted once
        (a pass over every slot: for the bench and tests only)."""
        found: set[tuple[int, int]] = set()
        with self.f.scanning():
            for buf, mask, _tags in self._tables():
                found.update(_native.idx_expired(buf, HEADER_SIZE, 0, mask + 1, before_ms)
                             if self.native else py_expired(buf, 0, mask + 1, before_ms))
        return len(found - self._shadow.keys())

    # -- the cycle (sidecar/store/idgrowth.py) -----------------------------------------------------
    def step(self, now_ms: int, horizon_ms: int) -> int:
        """A loop turn's share: notice a finished pass, cut when due. Returns the operations cut (0:
        none)."""
        return self.growth.step(now_ms, horizon_ms)

    def wait(self) -> None:
        """Wait for the running pass and take its result (tests, the bench)."""
        self.growth.wait()

    def seal(self, ops: int, busy: bool, now_ms: int) -> None:
        """Seal the open generation, its records written to its journal, for a pass to merge; open
        the next one with a stage for ``ops`` operations (``busy``: ``_new_gen``) at ``now_ms``.
        A generation loaded at recovery has no successor here: ``restore`` opens it."""
        gen = self.gen
        assert gen is not None
        if gen.writer is not None and gen.pending:
            gen.writer.append(gen.pending)
            gen.pending.clear()
            gen.unsynced = True
        self.sealed = gen
        self.gen = self._new_gen(gen.g + 1, ops, busy=busy, opened=now_ms) if gen.g >= 0 else None

    def merged(self, p: Pass) -> None:
        """Take in the pass that merged the sealed generation: the table it wrote (a grown one from
        now on), its tags and counts; the sealed stage is dropped, its journals deleted once no
        checkpoint names them."""
        sealed = self.sealed
        assert sealed is not None
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
        self.sealed = None
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
        gen = self.gen
        assert gen is not None
        st[Common.IDX_MASK] = gen.stage.mask
        st[Common.IDX_LIVE] = gen.stage.live
        st[Common.IDX_TOMBS] = gen.stage.tombs
        sealed = self.sealed
        st[Common.IDX_OLD_MASK] = sealed.stage.mask if sealed is not None else self.mask
        st[Common.IDX_OLD2_MASK] = self.mask if sealed is not None else -1
        st[Common.IDX_JNL_AT] = 0
        if len(self._jbuf) < room * SLOT_SIZE:
            self._jbuf = bytearray(max(room * SLOT_SIZE, 2 * len(self._jbuf)))
        return gen.stage.buf

    def intake_bufs(self) -> tuple[Any, Any, bytearray, mmap.mmap | None]:
        """The intake's last arguments: the probed tables (sealed stage or table; table or None),
        the journal buffer and the table's tags (of the table probed last)."""
        sealed = self.sealed
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
        """Read the table's page holding ``slot`` into the page cache on the page thread
        (sidecar/store/idpages.py), so the loop does not wait for the disk there."""
        assert self.pages is not None
        return read_page(self.pages, self.f.path, slot)

    def intake_restore(self, st: list[int]) -> None:
        """Take back the open stage's counts and the journal records the intake wrote."""
        gen = self.gen
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
                # the table keeps its name until the batch renames it: a pass cut meanwhile opens
                # the file by name (idpass.Pass.merge), and ids.idx is the old table until then
                batch.add_file(swap)
                batch.add_rename(swap.path, self.path, partial(setattr, swap, "path", self.path))
                batch.add_dir(self.dir)
            else:
                os.replace(swap.path, self.path)
                if sync:
                    fsync_dir(self.dir)
                swap.path = self.path
        for gen in (self.sealed, self.gen):
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
        for gen in (self.gen, self.sealed):
            if gen is not None and gen.writer is not None:
                n += gen.writer.length
        return n

    def close(self) -> None:
        """Wait for a running pass (it writes the table), then close everything."""
        self.growth.close()
        self._spare_journal.close()
        for gen in (self.gen, self.sealed):
            if gen is not None:
                gen.stage.close()
                if gen.writer is not None:
                    gen.writer.close()
        self.gen = self.sealed = None
        if self.tags is not None:
            self.tags.close()
            self.tags = None
        self.f.close()
        for f, _unlink in self._retired:  # a grown table never named is deleted by the next open
            f.close()
        self._retired = []
