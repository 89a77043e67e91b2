"""The id index: ``delay.id`` -> scheduler ref, as an mmapped open-addressing hash table.

``delay.id`` deduplication and ``delay.cancel`` need "which pending record has this id?" for
millions of pending records. A Python dict would cost ~100 bytes of RAM per record; this table
costs 16 bytes of *file* per slot and no per-record Python object.

Slot layout (16 bytes, little-endian): ``u64 hash`` (0 empty, 1 tombstone, else the id's 64-bit
BLAKE2b digest forced >= 2), ``u64 ref``. Linear probing, at most half the slots occupied (short
probe chains keep Python-level probing cheap).

**Growth is incremental** (Redis' dict is the model). When live + tombstone slots pass half the
capacity, a new table is created (twice the size when a quarter of the slots are live, else the
same size: that sheds the tombstones) in a file of its own, ``ids.idx.next.<n>``, and becomes the
*primary*: every insert goes there. The old table (``ids.idx``) is migrated into it a bounded
number of slots at a time: ``MIGRATE_PER_PUT`` slots after every insert (the C intake makes the
same step after each record it stores: both paths write the same slots) and ``step`` slots at
each index step of the loop, from the slot ``cursor`` up. No call touches more than that,
whatever the table's size: there is no pause proportional to the pending set. While it runs,
lookups and removes look in both tables; the counts ``live``/``tombs`` are the primary's, and
``old_left`` estimates the live slots of the old table the cursor has not reached. The growth
thresholds guarantee the migration ends long before the primary itself is half full (it starts
at most a quarter full of old entries, and one insert migrates ``MIGRATE_PER_PUT`` slots); if it
ever did not (an estimate after a crash far off), the rest is migrated at once before the next
growth.

**Written ahead.** A table's file is not left sparse for the migration to fill: once live +
tombstone slots pass ``ZERO_AT`` (7/16) of the capacity, a thread of its own (``ZeroFill``)
writes the next table's file, ``ids.idx.zero`` (the size the growth would choose then, its header,
zeros), at a bounded pace (``ZERO_BYTES_PER_S``), and ``fdatasync``s it; the growth renames it
``ids.idx.next.<n>`` and maps it. The reason is the file system: in a sparse file the writeback of
the first random writes allocates the disk blocks, one small extent per page, under the inode's
block-map lock, and every page fault of the loop on that file waits for it. Measured at 40,000
records/s on ext4, that stopped the loop for 3.1 s when a 2^26-slot table began and 5.5 s at
2^27: a pause proportional to the table. The write-ahead allocates the blocks in long extents,
off the loop, before the growth; the growth's share of the threshold (the last 1/16 of the
capacity, 16.8 M inserts at 2^28) leaves it minutes to finish. One that is not complete or not of
the growth's size (removes changed the choice) is discarded and the table created sparse, as
before; at open a leftover ``ids.idx.zero`` (nothing names it) is deleted.

The migration *copies*: an old slot keeps its entry after the cursor passed it, and only removes
change the old table (in both tables at once). So the old table holds, at all times, every entry
it held when the migration started minus the removed ones: it stays authoritative for all its
slots until the migration ends, and the primary holds copies of the slots below the cursor plus
everything inserted since. That is what makes a crash mid-migration simple. The checkpoint names
the migration (the primary's file, the old capacity, the cursor: ``state``); the new file's header
``base`` is the capacity of the table it migrates from, and an open refuses a pair whose
geometries disagree. At open: a ``ids.idx.next.<n>`` that the checkpoint does not name was
started after it and is deleted (the old table, whole as of the checkpoint, plus the records
replayed after it, is the index again: recovery re-inserts what it replays); the one it names is
resumed from the checkpointed cursor (the copies made after it are made again: an insert of an
entry already present is a no-op). When the cursor reaches the end, the primary takes the name
``ids.idx`` at the next flush, in the durability order (synced, renamed, directory synced, then
the checkpoint that describes it); the old mapping is released with the checkpoint's disposal
(``reclaim``), off the loop thread.

The index is a cache over the truth: every hit is verified by the caller against the stored
record's id (a 64-bit collision costs a verification, never a wrong answer), and entries whose
ref is no longer pending are simply ignored and removed lazily. So the index never needs to be
exact after a crash: recovery re-inserts what it replays, and stale entries are harmless.

Its *occupancy counts* must be exact, though: probing relies on empty slots, and growth is
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
interval's inserts and deletes), which only moves the next growth by that much. The exact count
then runs in the background, ``recount_step`` slots at a time (the store makes a step at each
checkpoint, before writing it, and ``step`` makes one in place of a sweep step): ``put`` and
``remove`` keep the partial counts of the slots already counted exact, so when the pass ends the
counts are exact and replace the estimate.

The probes (``find``, ``put``, ``remove``), the migration step (``idx_copy``), the pre-cancel sweep
(``idx_expired``) and ``id_hash`` have C twins in ``sidecar._native`` (the same slots written,
property-tested against these Python versions); an index opened with ``native=False``, or with
``KDS_PURE_PYTHON=1``, runs the Python ones.

A ref with the top bit set is a *pre-cancel*: a cancel that arrived before its message; the low
bits hold the cancel's time (epoch ms) so it can expire after the cancel horizon. Pre-cancels are
matched on the 64-bit hash alone (there is no record to verify against). Expired ones are swept
by ``step``, round the table at a pace set by the index's own time (the ``now_ms`` each step is
given), not by the number of steps: each step covers the share of a ``SWEEP_ROUND_MS`` round that
the time since the previous step owes (at least ``SWEEP_SLOTS`` slots, at most
``SWEEP_MAX_SHARE`` of the table, the rest owed to the next steps). So an expired pre-cancel
leaves the index within one round of its expiry however slow the loop's turns are, as long as
they come at least every ``SWEEP_ROUND_MS * SWEEP_MAX_SHARE`` ms on average (175 ms). While a
migration runs, the old table is swept at the same pace, with a cursor of its own.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sidecar import logs
from sidecar.store.codec import native as _native
from sidecar.store.idslot import EMPTY, PRECANCEL, SLOT, SLOT_SIZE, TOMB
from sidecar.store.intake_layout import Common
from sidecar.store.mapped import (
    HEADER,
    HEADER_SIZE,
    MappedFile,
    StoreError,
    current_batch,
    fsync_dir,
    header_bytes,
    headerless,
    unborn,
)

MAGIC = b"KDSIDX\x00\x01"
VERSION = 2  # 2: a table's header base is the capacity it was migrated from; ids.idx.next.<n>
READS = (1, 2)  # a version-1 table is a version-2 one no migration ever wrote
MIGRATE_PER_PUT = 16  # old slots migrated per insert: see the module docstring
STEP_SLOTS = 1 << 12  # old slots migrated per index step
SWEEP_SLOTS = 1 << 16  # slots the pre-cancel sweep reads per index step at least (1 MiB, ~0.3 ms)
# A round of the sweep takes this long (the 100M scale run's 2^28 slots: ~48 MB/s read). Counted in
# steps (2048 of them), a round took 2-3 min once the loop's turns ran over 50 ms, and expired
# pre-cancels stayed in the index that long (the 40M runs s and s2 left ~50 past 2 min).
SWEEP_ROUND_MS = 90_000
# What a step may cover at most, however late it is (1/512: 8 MiB of a 2^28-slot table, ~5 ms):
# what a late step owes beyond it is caught up by the next steps.
SWEEP_MAX_SHARE = 1 / 512
RECOUNT_ROUND_STEPS = 1 << 11  # the background recount's slice: at least 1/2048 of the table a step
NEXT = "ids.idx.next."
ZERO = "ids.idx.zero"  # the next table's file while it is written ahead (ZeroFill)
ZERO_AT = 7 / 16  # live + tombstones over this share of the slots: the next table's file is written ahead
ZERO_MIN_SLOTS = 1 << 18  # below this (4 MiB) a new table is created sparse: its allocation is short
ZERO_CHUNK = 1 << 20
ZERO_BYTES_PER_S = 256 << 20  # the write-ahead's pace, so the store's own syncs keep the volume
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


def _py_remove(buf: Any, mask: int, h: int, ref: int, scan_off: int) -> tuple[int, int, int] | None:
    """Remove (h, ref): None if absent, else (its byte offset, the change in tombstones, the
    change in tombstones below ``scan_off``)."""
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
                return off, 1, int(off < scan_off)
            # The chain ends right after this slot: no probe needs it, nor the tombstones just
            # before it. Emptying them keeps deliveries from filling the table with tombstones
            # (which would make growth, a same-size migration, run all the time).
            _U64.pack_into(buf, off, EMPTY)
            tombs = scan_tombs = 0
            j = (i - 1) & mask
            while _U64.unpack_from(buf, HEADER_SIZE + j * SLOT_SIZE)[0] == TOMB:
                _U64.pack_into(buf, HEADER_SIZE + j * SLOT_SIZE, EMPTY)
                tombs -= 1
                if HEADER_SIZE + j * SLOT_SIZE < scan_off:
                    scan_tombs -= 1
                j = (j - 1) & mask
            return off, tombs, scan_tombs
        i = (i + 1) & mask


def _py_copy(old: Any, new: Any, lo: int, hi: int, mask: int, scan_off: int) -> tuple[int, int, int, int, int]:
    """Insert the live slots ``lo <= k < hi`` of ``old`` into ``new`` (``mask``): (live slots
    seen, inserted, tombstones reused, inserted below ``scan_off``, reused tombstones below it)."""
    seen = inserted = reused = scan_live = scan_tombs = 0
    for k in range(lo, hi):
        h, ref = SLOT.unpack_from(old, HEADER_SIZE + k * SLOT_SIZE)
        if h <= TOMB:
            continue
        seen += 1
        r = _py_put(new, mask, h, ref)
        if r == 0:
            continue
        inserted += 1
        if r < 0:
            r = -r
            reused += 1
            scan_tombs += r < scan_off
        scan_live += r < scan_off
    return seen, inserted, reused, scan_live, scan_tombs


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


class ZeroFill(threading.Thread):
    """Writes the next table's file ahead of the growth that needs it: header and zeros, then
    ``fdatasync``, on a thread of its own (module docstring, "written ahead").

    Why: a table created sparse gets its disk blocks allocated by the writeback of its first
    random writes, one small extent per page, and ext4 holds the inode's block-map lock while it
    allocates; the loop's page faults on the same file wait for that lock. Measured at 40,000
    records/s: the loop stalled 3.1 s when a 2^26-slot table began, 5.5 s at 2^27, growing with
    the table. Blocks written here are allocated in long extents once, before any of that."""

    def __init__(self, path: Path, cap: int, base: int) -> None:
        super().__init__(name="kds-ids-zero", daemon=True)
        self.path, self.cap, self.base = path, cap, base
        self.size = HEADER_SIZE + cap * SLOT_SIZE
        self.done = threading.Event()
        self.ok = False
        self.error = ""
        self._stop_evt = threading.Event()

    def run(self) -> None:
        t0 = time.perf_counter()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                zeros = bytes(ZERO_CHUNK)
                os.pwrite(fd, header_bytes(MAGIC, VERSION, SLOT_SIZE, self.cap, self.base), 0)
                off = HEADER_SIZE
                while off < self.size:
                    if self._stop_evt.is_set():
                        return
                    n = min(ZERO_CHUNK, self.size - off)
                    off += os.pwrite(fd, zeros[:n], off)  # a whole-length slice is the same object
                    ahead = off / ZERO_BYTES_PER_S - (time.perf_counter() - t0)
                    if ahead > 0:
                        self._stop_evt.wait(ahead)
                os.fdatasync(fd)
                self.ok = True
            finally:
                os.close(fd)
        except OSError as e:
            self.error = str(e)
        finally:
            self.done.set()
        log.debug("ids.written_ahead", capacity=self.cap, s=round(time.perf_counter() - t0, 1))

    def discard(self) -> None:
        """Stop (within one chunk) and delete the file."""
        self._stop_evt.set()
        if self.is_alive():
            self.join()
        self.path.unlink(missing_ok=True)


class IdIndex:
    _counted: bool

    def __init__(
        self, directory: Path, initial_capacity: int = 1 << 16, count_at_open: int = 1 << 20, native: bool = True,
    ) -> None:
        self.dir = directory
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
        # The migration (module docstring): the old table, its mask, the next slot to migrate and
        # the estimated live slots from there on. None/-1/0/0 when none runs.
        self.old: MappedFile | None = None
        self.old_mask = -1
        self.cursor = 0
        self.old_left = 0
        self._started = 0.0
        self.migrated = 0  # old slots migrated so far (tests and the bench read it)
        self._sweep = 0  # the pre-cancel sweep's next slot
        self._sweep_old = 0  # and its next slot in the old table, while a migration runs
        self._sweep_ms = -1  # the now_ms of the last sweep step (-1: none yet)
        self._sweep_owed = 0.0  # the share of a round the sweep owes (the time since, not yet swept)
        self.swept = 0  # expired pre-cancels the sweep removed
        for tmp in directory.glob("ids.idx.new*"):  # version 1's unnamed rebuilds: the old file is whole
            tmp.unlink()
        (directory / ZERO).unlink(missing_ok=True)  # a write-ahead never named: nothing refers to it
        self._zero: ZeroFill | None = None
        if self.path.exists() and unborn(self.path):  # killed while creating it: nothing in it
            self.path.unlink()
        self._seq = 0
        if self.path.exists():
            cap = (os.path.getsize(self.path) - HEADER_SIZE) // SLOT_SIZE
            ver, base = _header(self.path)
            self.f = self._map(self.path, cap, create=False, base=base, version=ver if ver in READS else VERSION)
            self.cap = cap
            self._counted = False
        else:
            self.cap = initial_capacity
            self.f = self._map(self.path, self.cap, create=True)
            self._counted = True
        self.mask = self.cap - 1
        self.dirty = False
        # A migrated table not yet named ids.idx: it takes the name at the next flush; and the old
        # table's mapping, released by ``reclaim`` once that flush's checkpoint ran.
        self._swap: MappedFile | None = None
        self._retired: list[MappedFile] = []

    def restore(self, state: dict[str, Any] | None) -> None:
        """Resume the migration the checkpoint (``state``) names, delete one it does not; count
        the occupied slots, or start from the checkpointed counts and count them in the
        background: see the module docstring."""
        named = state.get("next") if state else None
        for p in sorted(self.dir.glob(NEXT + "*")):
            # the numbers go on from the highest named or present: the checkpoint on disk must
            # never name a file a later migration made
            self._seq = max(self._seq, int(p.name[len(NEXT):]) if p.name[len(NEXT):].isdigit() else 0)
            if p.name != named or unborn(p) or headerless(p) or self._counted:
                p.unlink()  # started after the checkpoint: the old table plus the replay suffice
        if named and named[len(NEXT):].isdigit():
            self._seq = max(self._seq, int(named[len(NEXT):]))
        nxt = self.dir / named if named else None
        if state and nxt is not None and nxt.exists() and not self._counted:
            cap = (os.path.getsize(nxt) - HEADER_SIZE) // SLOT_SIZE
            if (int(state.get("from", -1)), int(state.get("cap", -1))) != (self.cap, cap):
                raise StoreError(
                    f"{nxt}: the checkpoint names a migration from {state.get('from')} to {state.get('cap')} slots, "
                    f"but {self.path} holds {self.cap} and {nxt.name} {cap}"
                )
            try:
                new = self._map(nxt, cap, create=False, base=self.cap)
            except StoreError as e:
                raise StoreError(f"{e} (it must migrate from {self.path}, {self.cap} slots)") from None
            self.old, self.old_mask = self.f, self.mask
            self.f, self.cap, self.mask = new, cap, cap - 1
            self.cursor, self.old_left = int(state["cursor"]), int(state.get("left", 0))
            self._started = time.perf_counter()
        if not self._counted:
            if state and int(state.get("cap", -1)) == self.cap and self.cap > self.count_at_open:
                self.live, self.tombs = int(state["live"]), int(state["tombs"])
                if named and self.old is None:  # it ended and took the name after the checkpoint
                    self.live += int(state.get("left", 0))
                self._scan_off, self._scan_live, self._scan_tombs = HEADER_SIZE, 0, 0
            else:
                self.live, self.tombs = self._count_range(0, self.cap)
        self._counted = True

    @property
    def counting(self) -> bool:
        """True while the background recount runs (``live`` and ``tombs`` are estimates)."""
        return self._scan_off >= 0

    @property
    def migrating(self) -> bool:
        return self.old is not None

    def recount_step(self, slots: int = 1 << 18) -> bool:
        """Count up to ``slots`` more slots of the background recount; True once the counts are
        exact."""
        if self._scan_off < 0:
            return True
        lo = (self._scan_off - HEADER_SIZE) // SLOT_SIZE
        hi = min(self.cap, lo + max(slots, 1))
        live, tombs = self._count_range(lo, hi)
        # the pass only reads: drop what it read from this process, as the pre-cancel sweep does
        # (an idle store's trim leaves the index alone, and a pass over a 10M-record index read
        # ~20 MiB/s into RSS: +21 MB two seconds after a restart)
        self.f.drop_pages(HEADER_SIZE + lo * SLOT_SIZE, HEADER_SIZE + hi * SLOT_SIZE)
        self._scan_live += live
        self._scan_tombs += tombs
        if hi < self.cap:
            self._scan_off = HEADER_SIZE + hi * SLOT_SIZE
            return False
        self.live, self.tombs, self._scan_off = self._scan_live, self._scan_tombs, -1
        return True

    def _count_range(self, lo: int, hi: int, buf: Any = None) -> tuple[int, int]:
        """(live, tombstone) slots among ``lo <= slot < hi``, at C speed: in a copy of each chunk,
        bytes 8 and 15 of every slot (the ref's first and last) become 0xFF, so an 8-byte run
        without 0xFF can only be a whole hash field, and ``count`` finds exactly the empty and the
        tombstone hashes. ``buf``: another table's (the old one's) than the primary's."""
        live = tombs = 0
        if buf is None:
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

    def state(self) -> dict[str, Any]:
        """The checkpoint's ``ids``: the primary's capacity and counts, and the migration if one
        runs (its file, the old capacity, the cursor, the old table's live slots left)."""
        out: dict[str, Any] = {"cap": self.cap, "live": self.live, "tombs": self.tombs}
        if self.old is not None:
            out.update(next=self.f.path.name, cursor=self.cursor, left=self.old_left)
            out["from"] = self.old_mask + 1
        return out

    @staticmethod
    def _map(path: Path, cap: int, create: bool, base: int = 0, version: int = VERSION) -> MappedFile:
        if cap & (cap - 1):
            raise ValueError(f"{path}: capacity {cap} is not a power of two")
        return MappedFile(
            path, magic=MAGIC, version=version, size=HEADER_SIZE + cap * SLOT_SIZE,
            geom_a=SLOT_SIZE, geom_b=cap, base=base, create=create, sync_header=not create or base == 0,
        )

    def _slots(self) -> Iterator[tuple[int, int]]:
        """The primary's slots, (hash, ref)."""
        buf = self.f.buf
        for i in range(self.cap):
            yield SLOT.unpack_from(buf, HEADER_SIZE + i * SLOT_SIZE)

    def find(self, h: int) -> list[int]:
        """Every ref stored under hash ``h`` (usually zero or one), in both tables while a
        migration runs (a slot the cursor passed is in both: once in the answer)."""
        nat = self.native
        found: list[int] = (nat.idx_find(self.f.buf, HEADER_SIZE, self.mask, h) if nat is not None
                            else _py_find(self.f.buf, self.mask, h))
        if self.old is not None:
            more = (nat.idx_find(self.old.buf, HEADER_SIZE, self.old_mask, h) if nat is not None
                    else _py_find(self.old.buf, self.old_mask, h))
            found.extend(r for r in more if r not in found)
        return found

    def put(self, h: int, ref: int) -> None:
        """Insert (h, ref) unless it is there; then the migration's step this insert owes (after
        it, as the C intake makes it: both paths write the same slots)."""
        if (self.live + self.tombs + 1) * 2 > self.cap:
            self._grow()
        self._put(h, ref)
        if self.old is not None:
            self._migrate(MIGRATE_PER_PUT)

    def _put(self, h: int, ref: int) -> None:
        if self.old is not None:
            nat = self.native
            old = (nat.idx_find(self.old.buf, HEADER_SIZE, self.old_mask, h) if nat is not None
                   else _py_find(self.old.buf, self.old_mask, h))
            if ref in old:  # the migration copies it (or did: then the primary has it too)
                if self._scan_off >= 0:
                    self.old_left += 1  # a replayed insert made after the checkpoint
                return
        r = (self.native.idx_put(self.f.buf, HEADER_SIZE, self.mask, h, ref) if self.native is not None
             else _py_put(self.f.buf, self.mask, h, ref))
        if r == 0:
            if self._scan_off >= 0:
                self.live += 1  # a replayed insert made after the checkpoint: the estimate missed it
            return
        self._counted_put(r)

    def _counted_put(self, r: int) -> None:
        if r < 0:  # a tombstone reused
            r = -r
            self.tombs -= 1
            if r < self._scan_off:
                self._scan_tombs -= 1
        if r < self._scan_off:
            self._scan_live += 1
        self.live += 1
        self.dirty = True

    def remove(self, h: int, ref: int) -> bool:
        nat = self.native
        done = (nat.idx_remove(self.f.buf, HEADER_SIZE, self.mask, h, ref, self._scan_off) if nat is not None
                else _py_remove(self.f.buf, self.mask, h, ref, self._scan_off))
        if done is not None:
            off, tombs, scan_tombs = done
            self.live -= 1
            self.dirty = True
            if off < self._scan_off:
                self._scan_live -= 1
            self.tombs += tombs
            self._scan_tombs += scan_tombs
        if self.old is None:
            return done is not None
        at = HEADER_SIZE + self.cursor * SLOT_SIZE  # the copies are below it
        was = (nat.idx_remove(self.old.buf, HEADER_SIZE, self.old_mask, h, ref, at) if nat is not None
               else _py_remove(self.old.buf, self.old_mask, h, ref, at))
        if was is None:
            return done is not None
        self.dirty = True
        if was[0] >= at:
            self.old_left -= 1
        return True

    def remove_delivered(self, pairs: list[tuple[int, Any]]) -> int:
        """``remove(id_hash(rec.id), ref)`` for every ``(ref, rec)`` of a settled batch, in
        order (the C twin does the batch in one call per table); return how many were found in
        the primary."""
        if self.native is None:
            remove = self.remove
            before = self.live
            for ref, rec in pairs:
                remove(id_hash(rec.id), ref)
            return before - self.live
        removed, tombs, scan_live, scan_tombs = self.native.idx_remove_delivered(
            self.f.buf, HEADER_SIZE, self.mask, pairs, self._scan_off
        )
        if removed:
            self.live -= removed
            self.tombs += tombs
            self._scan_live += scan_live
            self._scan_tombs += scan_tombs
            self.dirty = True
        if self.old is not None:
            at = HEADER_SIZE + self.cursor * SLOT_SIZE
            gone, _t, below, _st = self.native.idx_remove_delivered(self.old.buf, HEADER_SIZE, self.old_mask, pairs, at)
            if gone:
                self.old_left -= gone + below  # ``below`` is minus the removed copies
                self.dirty = True
        return int(removed)

    # -- the migration (module docstring) --------------------------------------------------------
    def _grow(self) -> None:
        """Start migrating into a new table: twice the size when a quarter of the slots are live,
        else the same size (without the tombstones)."""
        if self.old is not None:  # not expected (the thresholds): finish the running one first
            self._migrate(self.old_mask + 1 - self.cursor)
        if self._swap is not None:  # the last migration ended within this checkpoint interval
            self._name_swap(sync=True)
        live = self.live
        cap = self._next_cap()
        self._seq += 1
        path = self.dir / f"{NEXT}{self._seq}"
        new = self._written_ahead(path, cap)
        if new is None:
            new = self._map(path, cap, create=True, base=self.cap)
        self.old, self.old_mask, self.cursor, self.old_left = self.f, self.mask, 0, live
        self._sweep_old = self._sweep  # the old table's round goes on where it was
        self._sweep = 0
        self.f, self.cap, self.mask = new, cap, cap - 1
        self.live = self.tombs = 0
        self._scan_off = -1  # the primary starts empty: its counts are exact
        self.dirty = True
        self._started = time.perf_counter()
        log.info("ids.migration_started", capacity=cap, old_capacity=self.old_mask + 1, live=live)

    def _next_cap(self) -> int:
        """The next table's capacity: twice this one when a quarter of the slots are live, else
        the same (a migration that sheds the tombstones)."""
        return self.cap * 2 if self.live * 4 >= self.cap else self.cap

    def _write_ahead(self) -> None:
        """Start writing the next table's file once the growth nears (``ZERO_AT``): the size the
        growth would choose now."""
        if (self._zero is not None or self.old is not None or self.cap < ZERO_MIN_SLOTS
                or (self.live + self.tombs) < self.cap * ZERO_AT):
            return
        self._zero = ZeroFill(self.dir / ZERO, self._next_cap(), self.cap)
        self._zero.start()

    def _written_ahead(self, path: Path, cap: int) -> MappedFile | None:
        """The file written ahead, renamed ``path``, if it is complete and has this growth's
        geometry; else None (it is discarded, and the caller creates the table sparse)."""
        z, self._zero = self._zero, None
        if z is None:
            return None
        if not (z.done.is_set() and z.ok and z.cap == cap and z.base == self.cap):
            log.info("ids.written_ahead_unused", capacity=cap, prepared=z.cap, complete=z.done.is_set(),
                     error=z.error or None)
            z.discard()
            return None
        os.replace(z.path, path)
        return self._map(path, cap, create=False, base=self.cap)

    def _migrate(self, slots: int) -> int:
        """Migrate up to ``slots`` old slots from the cursor on; return how many."""
        old = self.old
        assert old is not None
        lo = self.cursor
        hi = min(self.old_mask + 1, lo + slots)
        if self.native is not None:
            seen, inserted, reused, scan_live, scan_tombs = self.native.idx_copy(
                old.buf, self.f.buf, HEADER_SIZE, lo, hi, self.mask, self._scan_off
            )
        else:
            seen, inserted, reused, scan_live, scan_tombs = _py_copy(old.buf, self.f.buf, lo, hi, self.mask,
                                                                     self._scan_off)
        self.old_left -= seen
        self.live += inserted
        if self._scan_off >= 0:
            self.live += seen - inserted  # copied before a crash, after the checkpoint
        self.tombs -= reused
        self._scan_live += scan_live
        self._scan_tombs -= scan_tombs
        self.cursor = hi
        self.migrated += hi - lo
        if inserted:
            self.dirty = True
        if hi > self.old_mask:
            self._finish()
        return hi - lo

    def _finish(self) -> None:
        old = self.old
        assert old is not None
        self.old, self.old_mask, self.cursor, self.old_left = None, -1, 0, 0
        self._retired.append(old)
        self._swap = self.f
        self.dirty = True
        log.info("ids.migrated", capacity=self.cap, live=self.live,
                 s=round(time.perf_counter() - self._started, 1))

    def step(self, now_ms: int, horizon_ms: int, slots: int = STEP_SLOTS, sweep: bool = True,
             sweep_slots: int = SWEEP_SLOTS) -> int:
        """A loop turn's share of maintenance: ``slots`` slots of the migration, if one runs; and,
        if ``sweep``, a slice of the sweep of expired pre-cancels (older than ``horizon_ms`` at
        ``now_ms``): the share of a ``SWEEP_ROUND_MS`` round owed since the last sweep step
        (``_sweep_share``; at least ``sweep_slots`` slots) of the primary and, while a migration
        runs, the same share of the old table. Return the slots visited.

        The sweep does not wait for a migration to end: one takes about as long as a round (97-144 s
        at 2^27 slots in the 40M scale runs), and an expired pre-cancel in the old table's part not
        yet copied would wait for both. The old table keeps every entry it had (the migration
        copies), so its own round finds each old pre-cancel wherever the cursor is, and ``remove``
        takes it out of both tables.

        The sweep only reads, and drops the pages it read from this process afterwards
        (``MappedFile.drop_pages``: nothing is lost), so going round the table does not bring
        it into RSS; the few pages its removes write are faulted in again by them."""
        visited = 0
        if self.old is not None:
            visited = self._migrate(slots)
        else:
            self._write_ahead()
        if not sweep:
            return visited
        if self._scan_off >= 0:  # after a restart: the background recount first
            before = self._scan_off
            self.recount_step(max(sweep_slots, self.cap // RECOUNT_ROUND_STEPS))
            return visited + ((self._scan_off if self._scan_off >= 0 else HEADER_SIZE + self.cap * SLOT_SIZE)
                              - before) // SLOT_SIZE
        cutoff = now_ms - horizon_ms
        share = self._sweep_share(now_ms)
        hi = self._sweep_slice(self.f, self.cap, self._sweep, share, sweep_slots, cutoff)
        visited += hi - self._sweep
        self._sweep = hi % self.cap
        if self.old is not None:
            cap = self.old_mask + 1
            hi = self._sweep_slice(self.old, cap, self._sweep_old, share, sweep_slots, cutoff)
            visited += hi - self._sweep_old
            self._sweep_old = hi % cap
        return visited

    def _sweep_share(self, now_ms: int) -> float:
        """The share of a table this sweep step covers: what the time since the last one owes of a
        ``SWEEP_ROUND_MS`` round, plus what earlier steps left owed, at most ``SWEEP_MAX_SHARE``
        (a clock that went back owes nothing; at most one round is ever owed)."""
        if self._sweep_ms >= 0:
            self._sweep_owed = min(1.0, self._sweep_owed + max(0, now_ms - self._sweep_ms) / SWEEP_ROUND_MS)
        self._sweep_ms = now_ms
        share = min(self._sweep_owed, SWEEP_MAX_SHARE)
        self._sweep_owed -= share
        return share

    def _sweep_slice(self, table: MappedFile, cap: int, lo: int, share: float, sweep_slots: int, cutoff: int) -> int:
        """Remove the pre-cancels made before ``cutoff`` among ``table``'s slots from ``lo`` on:
        ``share`` of the table, at least ``sweep_slots`` slots, up to its end. Return the slot
        after the slice (``cap``: the round is complete)."""
        hi = min(cap, lo + max(sweep_slots, math.ceil(cap * share)))
        expired = (self.native.idx_expired(table.buf, HEADER_SIZE, lo, hi, cutoff) if self.native is not None
                   else _py_expired(table.buf, lo, hi, cutoff))
        table.drop_pages(HEADER_SIZE + lo * SLOT_SIZE, HEADER_SIZE + hi * SLOT_SIZE)
        for h, ref in expired:
            self.swept += self.remove(h, ref)
        return hi

    def precancels(self, before_ms: int = 1 << 62) -> int:
        """Pre-cancels made before ``before_ms`` in the index, copies counted once (a pass over
        every slot: for the bench and tests only)."""
        found: set[tuple[int, int]] = set()
        for table, cap in ((self.f, self.cap), (self.old, self.old_mask + 1)):
            if table is not None:
                found.update(self.native.idx_expired(table.buf, HEADER_SIZE, 0, cap, before_ms)
                             if self.native is not None else _py_expired(table.buf, 0, cap, before_ms))
        return len(found)

    # -- the C intake (PartitionStore.ingest_many; sidecar/store/intake_layout.py) ---------------
    def intake_state(self, st: list[int]) -> memoryview:
        """Hand the C intake the table: its mask and counts into ``st``, and the buffer it probes
        and inserts into in place (it leaves to ``put`` a record whose insert would grow the
        table). While a migration runs the old table's mask goes too (``intake_old`` its buffer):
        the intake leaves to ``put`` an id with an entry in either table."""
        st[Common.IDX_MASK] = self.mask
        st[Common.IDX_LIVE] = self.live
        st[Common.IDX_TOMBS] = self.tombs
        st[Common.IDX_SCAN_OFF] = self._scan_off
        st[Common.IDX_SCAN_LIVE] = self._scan_live
        st[Common.IDX_SCAN_TOMBS] = self._scan_tombs
        st[Common.IDX_OLD_MASK] = self.old_mask
        st[Common.IDX_CURSOR] = self.cursor
        st[Common.IDX_STEP] = MIGRATE_PER_PUT
        return self.f.buf

    def intake_old(self) -> memoryview | None:
        return None if self.old is None else self.old.buf

    def intake_restore(self, st: list[int]) -> None:
        """Take back the counts the C intake moved by inserting entries, and the migration it
        stepped (each insert migrated ``MIGRATE_PER_PUT`` old slots, as ``put`` does; it stops
        after the insert that migrated the last one, and the migration ends here)."""
        self.live = st[Common.IDX_LIVE]
        self.tombs = st[Common.IDX_TOMBS]
        self._scan_live = st[Common.IDX_SCAN_LIVE]
        self._scan_tombs = st[Common.IDX_SCAN_TOMBS]
        self.dirty = True
        old = self.old
        if old is not None:
            lo, hi = self.cursor, st[Common.IDX_CURSOR]
            self.old_left -= self._count_range(lo, hi, old.buf)[0]  # nothing removed them since
            self.migrated += hi - lo
            self.cursor = hi
            if hi > self.old_mask:
                self._finish()

    # -- durability ------------------------------------------------------------------------------
    def _name_swap(self, sync: bool) -> None:
        """Give the migrated table the name ``ids.idx``: synced first (``sync``), renamed, the
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
        """Make the tables durable (``sync``; inside ``deferred_sync``: note them for the batch).
        With ``sync=False`` (``fsync=none``) only a migrated table's rename happens."""
        if self._swap is not None:
            self._name_swap(sync)
            self.dirty = False
        elif self.dirty and sync:
            self.f.flush()
            if self.old is not None:
                self.old.flush()
            self.dirty = False

    def reclaim(self) -> None:
        """Release the old tables of the migrations that ended (inside ``deferred_disposal``: on
        the disposal's thread). Only after the flush that renamed their successor: until then the
        name ``ids.idx`` is theirs."""
        if self._swap is None:
            retired, self._retired = self._retired, []
            for f in retired:
                f.dispose()

    def trim(self) -> None:
        """Unmap the tables' resident pages from this process (``MappedFile.drop_pages``): probes
        land on random pages, so none is more likely than another to be needed next."""
        self.f.drop_pages()
        if self.old is not None:
            self.old.drop_pages()

    def disk_bytes(self) -> int:
        return (self.f.size + (0 if self.old is None else self.old.size)
                + (0 if self._zero is None else self._zero.size))

    def close(self) -> None:
        if self._zero is not None:
            self._zero.discard()
            self._zero = None
        self.f.close()
        if self.old is not None:
            self.old.close()
        for f in self._retired:
            f.close()
        self._retired = []
