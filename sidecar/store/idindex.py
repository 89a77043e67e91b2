"""The id index: ``delay.id`` -> scheduler ref, as an mmapped open-addressing hash table.

``delay.id`` deduplication and ``delay.cancel`` need "which pending record has this id?" for
millions of pending records. A Python dict would cost ~100 bytes of RAM per record; this table
costs 16 bytes of *file* per slot and no per-record Python object.

Slot layout (16 bytes, little-endian): ``u64 hash`` (0 empty, 1 tombstone, else the id's 64-bit
BLAKE2b digest forced >= 2), ``u64 ref``. Linear probing; the table is rebuilt at twice the size
when live + tombstone slots pass half the capacity (short probe chains keep Python-level probing
cheap), and at the same size when tombstones dominate.

The index is a cache over the truth: every hit is verified by the caller against the stored
record's id (a 64-bit collision costs a verification, never a wrong answer), and entries whose
ref is no longer pending are simply ignored and removed lazily. So the index never needs to be
exact after a crash: recovery re-inserts what it replays, and stale entries are harmless.

Its *occupancy counts* must be exact, though: probing relies on empty slots, and the rebuild is
triggered by ``live + tombs``. Counts taken from the checkpoint miss the slots filled after it
(they survive a kill in the page cache; recovery's re-inserts find them present), and that error
would accumulate over crashes until the table is full and probing never ends. So the slots are
recounted after every restart: a pass at C speed over the file (``_count_range``: the bytes that
cannot be part of a hash are overwritten in a copy, so ``bytes.count`` finds exactly the empty and
the tombstone hashes), about 35 ns per slot. A small table (``count_at_open`` slots, 16 MiB) is
counted by ``restore``. A large one would cost O(capacity) at every start (~1.2 s for the 2^25
slots of 10 M pending records), so ``restore`` starts from the checkpointed counts instead, raised
by every replayed insert that finds itself already present (it was inserted after the
checkpoint): an estimate off by what changed between the checkpoint and the crash (one commit
interval's inserts and deletes), which only moves the next rebuild by that much. The exact count
then runs in the background, ``recount_step`` slots at a time (the store makes a step at each
checkpoint, before writing it): ``put`` and ``remove`` keep the partial counts of the slots
already counted exact, so when the pass ends the counts are exact and replace the estimate.

The probes (``find``, ``put``, ``remove``), the growth pass and ``id_hash`` have C twins in
``sidecar._native`` (the same slots written, property-tested against these Python versions); an
index opened with ``native=False``, or with ``KDS_PURE_PYTHON=1``, runs the Python ones.

A ref with the top bit set is a *pre-cancel*: a cancel that arrived before its message; the low
bits hold the cancel's time (epoch ms) so it can expire after the cancel horizon. Pre-cancels are
matched on the 64-bit hash alone (there is no record to verify against).
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sidecar import logs
from sidecar.store.codec import native as _native
from sidecar.store.intake_layout import Common
from sidecar.store.mapped import HEADER_SIZE, MappedFile, current_batch, fsync_dir, unborn

MAGIC = b"KDSIDX\x00\x01"
VERSION = 1
SLOT = struct.Struct("<QQ")
SLOT_SIZE = SLOT.size
EMPTY, TOMB = 0, 1
PRECANCEL = 1 << 63
_U64 = struct.Struct("<Q")
_COUNT_CHUNK = 1 << 18  # slots per bytes.count pass (4 MiB copied)
_FF = b"\xff" * _COUNT_CHUNK
_EMPTY_HASH = bytes(8)
_TOMB_HASH = _U64.pack(TOMB)
log = logs.get("sidecar.store")


def py_id_hash(rid: bytes | memoryview, _blake2b: Any = hashlib.blake2b, _from_bytes: Any = int.from_bytes) -> int:
    """The 64-bit BLAKE2b digest of ``rid``, little-endian, forced >= 2 (0 and 1 mark slots)."""
    h: int = _from_bytes(_blake2b(rid, digest_size=8).digest(), "little")
    return h if h >= 2 else h + 2


id_hash = py_id_hash if _native is None else _native.id_hash


class IdIndex:
    _counted: bool

    def __init__(
        self, directory: Path, initial_capacity: int = 1 << 16, count_at_open: int = 1 << 20, native: bool = True,
    ) -> None:
        self.path = directory / "ids.idx"
        self.native = _native if native else None
        self.live = 0
        self.tombs = 0
        self.count_at_open = count_at_open
        # Background recount (see the module docstring): slots below _scan_off are counted, and
        # _scan_live/_scan_tombs are their exact counts; -1 when the counts are exact.
        self._scan_off = -1
        self._scan_live = 0
        self._scan_tombs = 0
        for tmp in directory.glob("ids.idx.new*"):  # a rebuild not yet named: the old file is whole
            tmp.unlink()
        if self.path.exists() and unborn(self.path):  # killed while creating it: nothing in it
            self.path.unlink()
        if self.path.exists():
            cap = (os.path.getsize(self.path) - HEADER_SIZE) // SLOT_SIZE
            self.f = self._map(self.path, cap, create=False)
            self.cap = cap
            self._counted = False
        else:
            self.cap = initial_capacity
            self.f = self._map(self.path, self.cap, create=True)
            self._counted = True
        self.mask = self.cap - 1
        self.dirty = False
        # A rebuilt table not yet named ids.idx: it takes the name at the next flush (``_rebuild``).
        self._swap: MappedFile | None = None
        self._rebuilds = 0

    def restore(self, state: dict[str, int] | None) -> None:
        """Count the occupied slots, or start from the checkpointed counts (``state``) and count
        them in the background: see the module docstring."""
        if not self._counted:
            if state and int(state.get("cap", -1)) == self.cap and self.cap > self.count_at_open:
                self.live, self.tombs = int(state["live"]), int(state["tombs"])
                self._scan_off, self._scan_live, self._scan_tombs = HEADER_SIZE, 0, 0
            else:
                self.live, self.tombs = self._count_range(0, self.cap)
        self._counted = True

    @property
    def counting(self) -> bool:
        """True while the background recount runs (``live`` and ``tombs`` are estimates)."""
        return self._scan_off >= 0

    def recount_step(self, slots: int = 1 << 18) -> bool:
        """Count up to ``slots`` more slots of the background recount; True once the counts are
        exact."""
        if self._scan_off < 0:
            return True
        lo = (self._scan_off - HEADER_SIZE) // SLOT_SIZE
        hi = min(self.cap, lo + max(slots, 1))
        live, tombs = self._count_range(lo, hi)
        self._scan_live += live
        self._scan_tombs += tombs
        if hi < self.cap:
            self._scan_off = HEADER_SIZE + hi * SLOT_SIZE
            return False
        self.live, self.tombs, self._scan_off = self._scan_live, self._scan_tombs, -1
        return True

    def _count_range(self, lo: int, hi: int) -> tuple[int, int]:
        """(live, tombstone) slots among ``lo <= slot < hi``, at C speed: in a copy of each chunk,
        bytes 8 and 15 of every slot (the ref's first and last) become 0xFF, so an 8-byte run
        without 0xFF can only be a whole hash field, and ``count`` finds exactly the empty and the
        tombstone hashes."""
        live = tombs = 0
        buf = self.f.buf
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

    def state(self) -> dict[str, int]:
        return {"cap": self.cap, "live": self.live, "tombs": self.tombs}

    @staticmethod
    def _map(path: Path, cap: int, create: bool, sync_header: bool = True) -> MappedFile:
        if cap & (cap - 1):
            raise ValueError(f"{path}: capacity {cap} is not a power of two")
        return MappedFile(
            path, magic=MAGIC, version=VERSION, size=HEADER_SIZE + cap * SLOT_SIZE,
            geom_a=SLOT_SIZE, geom_b=cap, base=0, create=create, sync_header=sync_header,
        )

    def _slots(self) -> Iterator[tuple[int, int]]:
        buf = self.f.buf
        for i in range(self.cap):
            yield SLOT.unpack_from(buf, HEADER_SIZE + i * SLOT_SIZE)

    def find(self, h: int) -> list[int]:
        """Every ref stored under hash ``h`` (usually zero or one)."""
        if self.native is not None:
            found: list[int] = self.native.idx_find(self.f.buf, HEADER_SIZE, self.mask, h)
            return found
        buf, mask = self.f.buf, self.mask
        i = h & mask
        out: list[int] = []
        while True:
            sh, ref = SLOT.unpack_from(buf, HEADER_SIZE + i * SLOT_SIZE)
            if sh == EMPTY:
                return out
            if sh == h:
                out.append(int(ref))
            i = (i + 1) & mask

    def put(self, h: int, ref: int) -> None:
        if (self.live + self.tombs + 1) * 2 > self.cap:
            self._rebuild()
        if self.native is not None:
            r = self.native.idx_put(self.f.buf, HEADER_SIZE, self.mask, h, ref)
            if r == 0:
                if self._scan_off >= 0:
                    self.live += 1  # a replayed insert made after the checkpoint: the estimate missed it
                return
            if r < 0:  # a tombstone reused
                r = -r
                self.tombs -= 1
                if r < self._scan_off:
                    self._scan_tombs -= 1
            if r < self._scan_off:
                self._scan_live += 1
            self.live += 1
            self.dirty = True
            return
        buf, mask = self.f.buf, self.mask
        i = h & mask
        free = -1
        while True:
            off = HEADER_SIZE + i * SLOT_SIZE
            sh, sref = SLOT.unpack_from(buf, off)
            if sh == EMPTY:
                break
            if sh == h and sref == ref:
                if self._scan_off >= 0:
                    self.live += 1  # a replayed insert made after the checkpoint: the estimate missed it
                return  # already there (recovery replays inserts)
            if sh == TOMB and free < 0:
                free = off
            i = (i + 1) & mask
        if free >= 0:
            off = free
            self.tombs -= 1
            if off < self._scan_off:
                self._scan_tombs -= 1
        if off < self._scan_off:
            self._scan_live += 1
        SLOT.pack_into(buf, off, h, ref)
        self.live += 1
        self.dirty = True

    def remove(self, h: int, ref: int) -> bool:
        if self.native is not None:
            done = self.native.idx_remove(self.f.buf, HEADER_SIZE, self.mask, h, ref, self._scan_off)
            if done is None:
                return False
            off, tombs, scan_tombs = done
            self.live -= 1
            self.dirty = True
            if off < self._scan_off:
                self._scan_live -= 1
            self.tombs += tombs
            self._scan_tombs += scan_tombs
            return True
        buf, mask = self.f.buf, self.mask
        i = h & mask
        while True:
            off = HEADER_SIZE + i * SLOT_SIZE
            sh, sref = SLOT.unpack_from(buf, off)
            if sh == EMPTY:
                return False
            if sh == h and sref == ref:
                self.live -= 1
                self.dirty = True
                counted = off < self._scan_off
                if counted:
                    self._scan_live -= 1
                nxt = HEADER_SIZE + ((i + 1) & mask) * SLOT_SIZE
                if _U64.unpack_from(buf, nxt)[0] != EMPTY:
                    _U64.pack_into(buf, off, TOMB)
                    self.tombs += 1
                    if counted:
                        self._scan_tombs += 1
                    return True
                # The chain ends right after this slot: no probe needs it, nor the tombstones
                # just before it. Emptying them keeps deliveries from filling the table with
                # tombstones (which forced a stop-the-loop rebuild every few seconds).
                _U64.pack_into(buf, off, EMPTY)
                j = (i - 1) & mask
                while _U64.unpack_from(buf, HEADER_SIZE + j * SLOT_SIZE)[0] == TOMB:
                    _U64.pack_into(buf, HEADER_SIZE + j * SLOT_SIZE, EMPTY)
                    self.tombs -= 1
                    if HEADER_SIZE + j * SLOT_SIZE < self._scan_off:
                        self._scan_tombs -= 1
                    j = (j - 1) & mask
                return True
            i = (i + 1) & mask

    def remove_delivered(self, pairs: list[tuple[int, Any]]) -> int:
        """``remove(id_hash(rec.id), ref)`` for every ``(ref, rec)`` of a settled batch, in
        order (the C twin does the batch in one call); return how many were found."""
        if self.native is not None:
            removed, tombs, scan_live, scan_tombs = self.native.idx_remove_delivered(
                self.f.buf, HEADER_SIZE, self.mask, pairs, self._scan_off
            )
            if removed:
                self.live -= removed
                self.tombs += tombs
                self._scan_live += scan_live
                self._scan_tombs += scan_tombs
                self.dirty = True
            return int(removed)
        remove = self.remove
        return sum(remove(id_hash(rec.id), ref) for ref, rec in pairs)

    # -- the C intake (PartitionStore.ingest_many; sidecar/store/intake_layout.py) ---------------
    def intake_state(self, st: list[int]) -> memoryview:
        """Hand the C intake the table: its mask and counts into ``st``, and the buffer it probes
        and inserts into in place (it leaves to ``put`` a record whose insert would grow the
        table)."""
        st[Common.IDX_MASK] = self.mask
        st[Common.IDX_LIVE] = self.live
        st[Common.IDX_TOMBS] = self.tombs
        st[Common.IDX_SCAN_OFF] = self._scan_off
        st[Common.IDX_SCAN_LIVE] = self._scan_live
        st[Common.IDX_SCAN_TOMBS] = self._scan_tombs
        return self.f.buf

    def intake_restore(self, st: list[int]) -> None:
        """Take back the counts the C intake moved by inserting entries."""
        self.live = st[Common.IDX_LIVE]
        self.tombs = st[Common.IDX_TOMBS]
        self._scan_live = st[Common.IDX_SCAN_LIVE]
        self._scan_tombs = st[Common.IDX_SCAN_TOMBS]
        self.dirty = True

    def _rebuild(self) -> None:
        """Rehash every live slot into a new table (twice the size when a quarter of the slots
        are live, else the same size without the tombstones), in a file of its own.

        The new table is not synced here: an msync of the whole file on the loop thread stalled
        every delivery for 50-80 ms at 2^20 slots (the rehash itself, most of it first-touch page
        faults, is 25-40 ms). It stays named ``ids.idx.new.<n>`` and takes the name ``ids.idx`` at the
        next ``flush``, which the checkpoint runs on its flusher thread in the durability order:
        new table synced, renamed, directory synced, then the checkpoint that describes it. Until
        then ``ids.idx`` on disk is the old table the previous checkpoint describes, whole; a crash
        in between leaves that pair (plus the log records after it, replayed), and the unnamed
        table is deleted at the next open."""
        started = time.perf_counter()
        if self._swap is not None:  # two rebuilds within one checkpoint interval: name the first
            self._name_swap(sync=True)
        cap = self.cap * 2 if self.live * 4 >= self.cap else self.cap
        # A name of its own: the previous rebuild's rename may still be queued on the flusher.
        self._rebuilds += 1
        tmp = self.path.with_name(f"ids.idx.new.{self._rebuilds}")
        new = self._map(tmp, cap, create=True, sync_header=False)
        mask = cap - 1
        live = 0
        if self.native is not None:  # ~1 s for 10 M ids, against ~15 s in Python
            live = self.native.idx_rehash(self.f.buf, new.buf, HEADER_SIZE, self.cap, mask)
        else:
            for h, ref in self._slots():
                if h <= TOMB:
                    continue
                live += 1
                i = h & mask
                while SLOT.unpack_from(new.buf, HEADER_SIZE + i * SLOT_SIZE)[0] != EMPTY:
                    i = (i + 1) & mask
                SLOT.pack_into(new.buf, HEADER_SIZE + i * SLOT_SIZE, h, ref)
        self.f.close()
        self.f = self._swap = new
        self.dirty = True
        # Recounted here: counts restored from a checkpoint can miss inserts made after it.
        self.cap, self.mask, self.tombs, self.live = cap, mask, 0, live
        self._scan_off = -1  # exact now: a background recount has nothing left to do
        log.info("ids.rebuilt", capacity=cap, live=live, ms=round((time.perf_counter() - started) * 1000, 1))

    def _name_swap(self, sync: bool) -> None:
        """Give the rebuilt table the name ``ids.idx``: synced first (``sync``), renamed, the
        directory synced — inside ``deferred_sync`` all three go to the batch, in that order."""
        swap, self._swap = self._swap, None
        assert swap is not None
        batch = current_batch()
        if not sync:
            os.replace(swap.path, self.path)
        elif batch is not None:
            batch.add_file(swap)
            batch.add_rename(swap.path, self.path)
            batch.add_dir(self.path.parent)
        else:
            swap.mm.flush()
            os.replace(swap.path, self.path)
            fsync_dir(self.path.parent)
        swap.path = self.path

    def flush(self, sync: bool = True) -> None:
        """Make the table durable (``sync``; inside ``deferred_sync``: note it for the batch). With
        ``sync=False`` (``fsync=none``) only a rebuilt table's rename happens."""
        if self._swap is not None:
            self._name_swap(sync)
            self.dirty = False
        elif self.dirty and sync:
            self.f.flush()
            self.dirty = False

    def trim(self) -> None:
        """Unmap the table's resident pages from this process (``MappedFile.drop_pages``): probes
        land on random pages, so none is more likely than another to be needed next."""
        self.f.drop_pages()

    def disk_bytes(self) -> int:
        return self.f.size

    def close(self) -> None:
        self.f.close()
