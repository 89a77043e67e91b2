"""The far tier of the timer wheel: time buckets (``sidecar.store.buckets``), and their loading into
the ring (``sidecar.wheel.ring``) as the ring's window reaches them.

Storing. A record due beyond the ring is copied whole into the bucket file of its due time
(``due - due % width``), CRC intact, and its commit-log slot is released at once: old log segments
are deleted and a one-year delay pins nothing. While a bucket is not fully linked into the ring,
records due in its range join it even if the ring could hold them (equal due times keep arrival
order: the bucket is linked before anything added to the ring after it), and a record already due
but beyond the ring (the reader more than a window behind) waits in its bucket rather than jump
the queue on the late chain. The scheduler's ``add`` makes that choice (it runs per record);
``Loader.add`` stores.

Loading. At each ``due`` call, every bucket whose end fits in the ring (``end <= guard + window``,
the ring's limit) is read sequentially, oldest first, at most ``load_batch`` records per call; each
pending record is CRC-checked and linked into its slot, or onto the late chain if the reader has
passed its slot, with a timer-log entry whose locator is the bucket ref (the record keeps that ref
from ``add`` until it is done). A damaged copy is not linked in: its bucket's count is released
(the bucket is known to hold it) and it goes to the damage report (``recovery.Damage``). A record
cancelled before it was loaded is finished here. The ring's reader never starts a slot at or
beyond the start of a bucket that still holds records not linked in, so loading stays ahead of
reading and bucket records land in their slots in due order.

A record still only in its bucket carries its own state (pending or cancelled) in its bucket
entry: ``waiting`` tells the scheduler's ``cancel``, ``record`` and ``where`` that a ref is one.
"""

from __future__ import annotations

from sidecar.store.buckets import BucketStore, make_ref, split_ref
from sidecar.store.mapped import HEADER_SIZE, StoreError
from sidecar.wheel.layout import PENDING
from sidecar.wheel.recovery import Damage
from sidecar.wheel.ring import _BUCKET, Ring


class Loader:
    """The ring's bucket tier: stores records due beyond it and links buckets in as they fit."""

    def __init__(self, ring: Ring, damage: Damage, *, width_ms: int, load_batch: int) -> None:
        self.ring = ring
        self.damage = damage
        self.buckets = ring.buckets
        self.width = width_ms
        self.load_batch = load_batch
        self.n_bucket = 0  # bucket records not yet loaded

    def add(self, due_ms: int, log_pos: int) -> int:
        """Copy the commit-log record at ``log_pos`` into its bucket and release its log slot;
        returns its bucket ref."""
        log = self.ring.log
        rec = log.read(log_pos)
        seg = log.segments.get(log_pos // log.segment_bytes)
        off = log_pos % log.segment_bytes
        # the record's bytes exactly as in the log (CRC intact); re-encoded if not addressable
        raw = seg.buf[off : off + rec.length] if seg is not None else BucketStore.encode(rec)
        ref = self.buckets.append(due_ms - due_ms % self.width, self.width, due_ms, raw)
        log.release(log_pos)
        self.n_bucket += 1
        return ref

    def load(self) -> None:
        """Link up to ``load_batch`` bucket records into the ring, from the buckets that fit it."""
        bs = self.buckets
        if not bs.unloaded:
            return
        ring = self.ring
        limit_ms = ring._limit_slot() * ring.P
        budget = self.load_batch
        while budget > 0 and bs.unloaded:
            end, _start, seq = bs.unloaded[0]
            if end > limit_ms:
                break
            b = bs.buckets[seq]
            items = bs.scan(b, budget)
            if not items:
                bs.mark_loaded(b, b.size, 0)
                continue
            pos = b.loaded
            for off, total, state, due, level in items:
                if state == PENDING:
                    try:
                        bs.read(seq, off)  # CRC check: a damaged copy is dropped here, not on delivery
                    except StoreError as e:
                        bs.release(seq)
                        self.damage.report(make_ref(seq, off), make_ref(seq, off), str(e))
                        pos = off + total
                        continue
                    dest = ring._destination(due)
                    if dest == _BUCKET:  # cannot happen: due < end <= limit
                        raise StoreError(f"bucket {seq}: record due {due} does not fit the window it was loaded into")
                    idx = ring._link(due, make_ref(seq, off), level, dest)
                    bs.set_tl(seq, off, idx)
                else:  # cancelled before it was loaded: finished here
                    bs.release(seq)
                pos = off + total
            bs.mark_loaded(b, pos, len(items))
            self.n_bucket -= len(items)
            budget -= len(items)

    def waiting(self, ref: int) -> tuple[int, int] | None:
        """``(seq, offset)`` of bucket ref ``ref`` if its record is still only in its bucket (not
        linked into the ring yet); None if it is linked in or names no record of a bucket (the
        ring's ``_entry`` then says whether it is linked)."""
        seq, off = split_ref(ref)
        b = self.buckets.get(seq)
        if b is None or off < HEADER_SIZE or off >= b.size or off < b.loaded:
            return None
        return seq, off
