"""The id index's merge pass and rebuild in Python: the twins of ``sidecar/native/merge.c``.

The staged index (``bench/micro/index_io.c``, docs/benchmarks.md "The id index's write path") writes its
table only in ascending passes: a random write into a GiB table costs tens of microseconds of CPU
on the reference VM, a sequential rewrite about a microsecond per 4 KiB page. ``merge_pass``
applies a batch of removes and inserts to a table file; ``rebuild`` copies a table's live entries
into a new, empty file of the same size or twice it (the growth). The algorithm, and why a reader
probing the file through a mapping meanwhile never misses an entry the pass keeps, is in
merge.c's header; these twins follow it step for step (chunks, the order of operations within a
chunk, where a remove's walk back stops, which chunks are written) so both write the same bytes
and return the same counts. The C functions release the GIL; ``merge_pass`` and ``rebuild`` here
call them when the accelerator is built, the twins otherwise (and in the tests, as the reference).

Slots are the id index's: 16 bytes (u64 hash, u64 ref), hash 0 empty, 1 tombstone, home slot
``hash & mask``, linear probing; a ref with the top bit set is a pre-cancel whose low bits are its
time (ms), removed once made before ``cutoff_ms``.
"""

from __future__ import annotations

import errno
import os
import struct
from typing import Any

from sidecar.store.codec import NATIVE
from sidecar.store.codec import native as _native
from sidecar.store.idslot import EMPTY, PRECANCEL, TOMB, journal_ops, tags_of
from sidecar.store.idslot import SLOT as _SLOT


class _Table:
    """A table file held whole in memory, with the pass's bookkeeping: which slots it changed
    since their chunk was last written, and how many chunk writes it made."""

    def __init__(self, fd: int, hs: int, cap: int) -> None:
        self.fd, self.hs, self.cap, self.mask = fd, hs, cap, cap - 1
        raw = os.pread(fd, cap * 16, hs)
        if len(raw) != cap * 16:
            raise OSError(errno.EIO, "id index pass: short read of the table")
        words = struct.unpack_from(f"<{2 * cap}Q", raw)
        self.h, self.ref = list(words[0::2]), list(words[1::2])
        self.mod = [False] * cap
        self.written = 0

    def write(self, lo: int, hi: int) -> None:
        """Write slots [lo, hi) if the pass changed one of them (as chunk_end and pass_end do)."""
        if not any(self.mod[lo:hi]):
            return
        out = bytearray((hi - lo) * 16)
        for k in range(lo, hi):
            _SLOT.pack_into(out, (k - lo) * 16, self.h[k], self.ref[k])
            self.mod[k] = False
        os.pwrite(self.fd, out, self.hs + lo * 16)
        self.written += 1


def _expired(ref: int, cutoff: int) -> bool:
    return bool(ref & PRECANCEL) and ref & ~PRECANCEL < cutoff


def _remove_at(t: _Table, v: int, v0: int) -> None:
    """merge.c's remove_at: a tombstone, or, where the chain ends right after it, an empty slot
    together with the tombstones before it, back to the buffer's first slot ``v0`` (virtual)."""
    m = t.mask
    s = v & m
    t.mod[s] = True
    if t.h[(v + 1) & m] != EMPTY:
        t.h[s] = TOMB
        return
    t.h[s] = EMPTY
    j = v if v < v0 + t.cap else v - t.cap  # merge.c's vmap: the buffer holds a slot once
    while j > v0 and t.h[(j - 1) & m] == TOMB:
        t.h[(j - 1) & m] = EMPTY
        t.mod[(j - 1) & m] = True
        j -= 1


def _remove_op(t: _Table, v0: int, h: int, ref: int) -> int:
    m = t.mask
    home = h & m
    for v in range(home, home + t.cap):
        sh = t.h[v & m]
        if sh == EMPTY:
            return 0
        if sh == h and t.ref[v & m] == ref:
            _remove_at(t, v, v0)
            return 1
    raise OSError(errno.ENOSPC, "id index pass: no empty slot")


def _put_op(t: _Table, h: int, ref: int) -> int:
    m = t.mask
    home = h & m
    free = -1
    for v in range(home, home + t.cap):
        sh = t.h[v & m]
        if sh == EMPTY:
            break
        if sh == h and t.ref[v & m] == ref:
            return 0
        if sh == TOMB and free < 0:
            free = v
    else:
        raise OSError(errno.ENOSPC, "id index pass: no empty slot")
    s = (free if free >= 0 else v) & m
    t.h[s], t.ref[s] = h, ref
    t.mod[s] = True
    return 1


def _pairs(data: Any) -> list[tuple[int, int]]:
    raw = bytes(data)
    if len(raw) % 16:
        raise ValueError("idx_merge_pass: operations are 16-byte (hash, ref) pairs")
    return [_SLOT.unpack_from(raw, k) for k in range(0, len(raw), 16)]


def _chunk_end(t: _Table, lo: int, hi: int, cutoff: int, out: list[int]) -> None:
    """merge.c's chunk_end: the expired pre-cancels of [lo, hi), then the chunk's write."""
    for v in range(lo, hi):
        if t.h[v] > TOMB and _expired(t.ref[v], cutoff):
            _remove_at(t, v, lo)
            out[4] += 1
    t.write(lo, hi)


def _finish(t: _Table, out: list[int], sync: bool) -> None:
    """merge.c's pass_end: slots changed after their chunk was written (chains that wrapped past
    the last slot) in one more write, the counts, the sync."""
    changed = [k for k in range(t.cap) if t.mod[k]]
    if changed:
        t.write(0, changed[-1] + 1)
    out[0] = sum(1 for x in t.h if x > TOMB)
    out[1] = sum(1 for x in t.h if x == TOMB)
    out[5] = t.written
    if sync:
        os.fdatasync(t.fd)


def py_merge_pass(fd: int, header_size: int, mask: int, removes: Any, inserts: Any, cutoff_ms: int,
                  chunk_slots: int, sync: bool) -> tuple[int, int, int, int, int, int]:
    """The twin of ``_native.idx_merge_pass``: (live, tombs, inserted, removed, expired, chunks
    written)."""
    cap = mask + 1
    if header_size < 0 or cap & mask or chunk_slots <= 0:
        raise ValueError("idx_merge_pass: a power-of-two table and a chunk of slots")
    chunk = min(chunk_slots, cap)
    order = lambda p: (p[0] & mask, p[0], p[1])  # noqa: E731 -- merge.c's by_home
    rm = sorted(_pairs(removes), key=order)
    put = sorted(_pairs(inserts), key=order)
    t = _Table(fd, header_size, cap)
    out = [0, 0, 0, 0, 0, 0]  # live, tombs, inserted, removed, expired, written
    ir = ip = 0
    for lo in range(0, cap, chunk):
        hi = min(lo + chunk, cap)
        while ir < len(rm) and rm[ir][0] & mask < hi:
            out[3] += _remove_op(t, lo, *rm[ir])
            ir += 1
        while ip < len(put) and put[ip][0] & mask < hi:
            h, ref = put[ip]
            if _expired(ref, cutoff_ms):
                out[4] += _remove_op(t, lo, h, ref)
            else:
                out[2] += _put_op(t, h, ref)
            ip += 1
        _chunk_end(t, lo, hi, cutoff_ms, out)
    _finish(t, out, sync)
    return out[0], out[1], out[2], out[3], out[4], out[5]


def net_ops(records: Any, mask: int) -> tuple[bytes, bytes]:
    """A journal's records (in order; ``idslot.journal_ops``) as the pass's operations: the last one
    on each (hash, ref) pair, (removes, inserts) -- merge.c's net_ops."""
    last: dict[tuple[int, int], bool] = {}
    for h, ref, gone in journal_ops(records):
        key = (h, ref)
        last.pop(key, None)  # a later operation on a pair replaces the earlier one
        last[key] = gone
    rm = b"".join(_SLOT.pack(h, ref) for (h, ref), gone in last.items() if gone)
    put = b"".join(_SLOT.pack(h, ref) for (h, ref), gone in last.items() if not gone)
    return rm, put


def py_merge_journal(fd: int, header_size: int, mask: int, records: Any, cutoff_ms: int, chunk_slots: int,
                     sync: bool, tags: Any = None) -> tuple[int, int, int, int, int, int]:
    """The twin of ``_native.idx_merge_journal``: the pass of a journal's records (and, with
    ``tags``, the table's tags rewritten: here at the end, all at once; merge.c chunk by chunk)."""
    cap = mask + 1
    if tags is not None and len(tags) < cap:
        raise ValueError("idx_merge_journal: the tags hold fewer bytes than the table slots")
    rm, put = net_ops(records, mask)
    out = py_merge_pass(fd, header_size, mask, rm, put, cutoff_ms, chunk_slots, sync)
    if tags is not None:
        tags[:cap] = tags_of(_Table(fd, header_size, cap).h)
    return out


def py_rebuild(old_fd: int, new_fd: int, header_size: int, old_mask: int, new_mask: int, cutoff_ms: int,
               chunk_slots: int, sync: bool) -> tuple[int, int, int, int, int]:
    """The twin of ``_native.idx_rebuild``: (live, tombs, inserted, expired, chunks written)."""
    ocap, cap = old_mask + 1, new_mask + 1
    if header_size < 0 or ocap & old_mask or chunk_slots <= 0 or cap not in (ocap, 2 * ocap):
        raise ValueError("idx_rebuild: power-of-two tables, the new one the same size or twice the old")
    chunk = min(chunk_slots, ocap)
    old = _Table(old_fd, header_size, ocap)
    t = _Table(new_fd, header_size, cap)
    out = [0, 0, 0, 0, 0, 0]  # live, tombs, inserted, (removed), expired, written
    lo = 0
    while lo < cap:
        hi = min(lo + chunk, ocap if lo < ocap else cap)  # a chunk stays in one half
        a = lo & old_mask
        b = a + (hi - lo)
        bit = lo & ocap if cap > ocap else 0
        got = []
        for v in range(a, a + ocap):  # every slot seen once at most
            s = v & old_mask
            sh, ref = old.h[s], old.ref[s]
            if sh == EMPTY and v >= b:
                break
            if sh <= TOMB or not a <= sh & old_mask < b or (cap > ocap and sh & ocap != bit):
                continue
            if _expired(ref, cutoff_ms):
                out[4] += 1
                continue
            got.append((sh, ref))
        got.sort(key=lambda p: (p[0] & new_mask, p[0], p[1]))
        for h, ref in got:
            out[2] += _put_op(t, h, ref)
        _chunk_end(t, lo, hi, cutoff_ms, out)
        lo = hi
    _finish(t, out, sync)
    return out[0], out[1], out[2], out[4], out[5]


def merge_pass(fd: int, header_size: int, mask: int, removes: bytes, inserts: bytes, cutoff_ms: int,
               chunk_slots: int, sync: bool) -> tuple[int, int, int, int, int, int]:
    """``_native.idx_merge_pass`` (the GIL released), or its twin without the accelerator."""
    if NATIVE:
        out: tuple[int, int, int, int, int, int] = _native.idx_merge_pass(
            fd, header_size, mask, removes, inserts, cutoff_ms, chunk_slots, sync
        )
        return out
    return py_merge_pass(fd, header_size, mask, removes, inserts, cutoff_ms, chunk_slots, sync)


def rebuild(old_fd: int, new_fd: int, header_size: int, old_mask: int, new_mask: int, cutoff_ms: int,
            chunk_slots: int, sync: bool) -> tuple[int, int, int, int, int]:
    """``_native.idx_rebuild`` (the GIL released), or its twin without the accelerator."""
    if NATIVE:
        out: tuple[int, int, int, int, int] = _native.idx_rebuild(
            old_fd, new_fd, header_size, old_mask, new_mask, cutoff_ms, chunk_slots, sync
        )
        return out
    return py_rebuild(old_fd, new_fd, header_size, old_mask, new_mask, cutoff_ms, chunk_slots, sync)


def merge_journal(fd: int, header_size: int, mask: int, records: bytes, cutoff_ms: int, chunk_slots: int,
                  sync: bool, tags: Any = None) -> tuple[int, int, int, int, int, int]:
    """``_native.idx_merge_journal`` (the GIL released), or its twin without the accelerator."""
    if NATIVE:
        out: tuple[int, int, int, int, int, int] = _native.idx_merge_journal(
            fd, header_size, mask, records, cutoff_ms, chunk_slots, sync, tags
        )
        return out
    return py_merge_journal(fd, header_size, mask, records, cutoff_ms, chunk_slots, sync, tags)
