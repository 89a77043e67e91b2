"""The id index's probes on one table, in Python: the twins of ``sidecar/native/idindex.c``.

A table here is a buffer with the id index's layout (a header of ``HEADER_SIZE`` bytes, then
16-byte slots, sidecar/store/idslot.py): a hash's home slot is ``hash & mask``, and its chain runs
by linear probing to the first empty slot. ``py_find`` walks a chain, ``py_put`` inserts into the
first tombstone or the empty slot ending it, ``py_remove`` leaves a tombstone (or, where the chain
ends right after it, empties it and the tombstones before it), ``py_copy`` and ``py_apply`` insert
a table's live slots or a journal's records, ``py_expired`` lists pre-cancels made before a time.
The C functions write the same slots (property-tested against these); an index opened with
``native=False``, or with ``KDS_PURE_PYTHON=1``, runs these. ``count_range`` counts a table's live
and tombstone slots at C speed with ``bytes.count`` (no C twin needed).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from sidecar.store.codec import NATIVE
from sidecar.store.codec import native as _native
from sidecar.store.idslot import EMPTY, PRECANCEL, SLOT, SLOT_SIZE, TOMB, journal_ops
from sidecar.store.mapped import HEADER_SIZE

_COUNT_CHUNK = 1 << 18  # slots per bytes.count pass (4 MiB copied)
_FF = b"\xff" * _COUNT_CHUNK
_EMPTY_HASH = bytes(8)
_U64 = struct.Struct("<Q")
_TOMB_HASH = _U64.pack(TOMB)


def py_id_hash(rid: bytes | memoryview, _blake2b: Any = hashlib.blake2b, _from_bytes: Any = int.from_bytes) -> int:
    """The 64-bit BLAKE2b digest of ``rid``, little-endian, forced >= 2 (0 and 1 mark slots)."""
    h: int = _from_bytes(_blake2b(rid, digest_size=8).digest(), "little")
    return h if h >= 2 else h + 2


id_hash = _native.id_hash if NATIVE else py_id_hash


def py_find(buf: Any, mask: int, h: int) -> list[int]:
    i = h & mask
    out: list[int] = []
    while True:
        sh, ref = SLOT.unpack_from(buf, HEADER_SIZE + i * SLOT_SIZE)
        if sh == EMPTY:
            return out
        if sh == h:
            out.append(int(ref))
        i = (i + 1) & mask


def py_put(buf: Any, mask: int, h: int, ref: int) -> int:
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


def py_remove(buf: Any, mask: int, h: int, ref: int) -> tuple[int, int] | None:
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


def py_copy(old: Any, new: Any, lo: int, hi: int, mask: int) -> tuple[int, int, int]:
    """Insert the live slots ``lo <= k < hi`` of ``old`` into ``new`` (``mask``): (live slots
    seen, inserted, tombstones reused)."""
    seen = inserted = reused = 0
    for k in range(lo, hi):
        h, ref = SLOT.unpack_from(old, HEADER_SIZE + k * SLOT_SIZE)
        if h <= TOMB:
            continue
        seen += 1
        r = py_put(new, mask, h, ref)
        if r == 0:
            continue
        inserted += 1
        reused += r < 0
    return seen, inserted, reused


def py_expired(buf: Any, lo: int, hi: int, cutoff: int) -> list[tuple[int, int]]:
    """(hash, ref) of every pre-cancel among slots ``lo <= k < hi`` made before ``cutoff`` (ms)."""
    out = []
    for k in range(lo, hi):
        h, ref = SLOT.unpack_from(buf, HEADER_SIZE + k * SLOT_SIZE)
        if h > TOMB and ref & PRECANCEL and ref & ~PRECANCEL < cutoff:
            out.append((h, ref))
    return out


def count_range(buf: Any, lo: int, hi: int) -> tuple[int, int]:
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


def py_apply(buf: Any, mask: int, records: Any) -> tuple[int, int]:
    """A journal's records applied in order to a table (``_native.idx_apply``'s twin): (change in
    live slots, change in tombstones)."""
    live = tombs = 0
    for h, ref, gone in list(journal_ops(records)):  # every record checked before the first write
        if gone:
            was = py_remove(buf, mask, h, ref)
            if was is not None:
                live -= 1
                tombs += was[1]
        else:
            r = py_put(buf, mask, h, ref)
            if r:
                live += 1
                tombs -= r < 0
    return live, tombs

