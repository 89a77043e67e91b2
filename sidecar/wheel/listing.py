"""The timer wheel's range walk for listing (``sidecar.store.listing``): the pending entries due
in ``[after, before)``, in ``(due, ref)`` order, reading only what covers the range.

Three sources, merged:

- **slots**: the ring's slots from ``after // precision`` up to the last one the ring holds
  (``guard + slots``) or the one holding ``before - 1``, whichever comes first, taken lazily one
  slot at a time (the slots are disjoint and in due order, so a page that fills early stops
  there). The occupancy flags of the done cursor (``occ_done``) skip the empty positions with a
  ``bytearray.find``; an occupied slot's chain is walked and its entries sorted (a chain is in
  arrival order).
- **buckets** not yet fully linked into the ring whose time range meets ``[after, before)``: their
  entries from the load point on (the ones before it are in the slots), heads only, read with
  ``BucketStore.scan``. A bucket is read whole (its width, one hour by default), the rest of the
  pending set is not.
- **the late chain** (records that arrived already due): only for a range that starts at or
  before now, since every entry on it was due when it was linked. It is in arrival order and
  walked whole: it holds the backlog of overdue records, empty in a sidecar that keeps up.

Read-only: nothing here moves a cursor, flips a state or loads a bucket.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from sidecar.store.buckets import BUCKET_BIT, Bucket
from sidecar.store.buckets import PENDING as BUCKET_PENDING
from sidecar.store.codec import Record
from sidecar.store.listing import Budget, Candidate
from sidecar.store.mapped import HEADER_SIZE
from sidecar.wheel.layout import _WALK, ENTRY_SIZE, PENDING
from sidecar.wheel.scheduler import WheelScheduler


class WheelWalk:
    def __init__(self, sched: WheelScheduler) -> None:
        self.w = sched

    def walk(self, after_ms: int, before_ms: int, now_ms: int, budget: Budget) -> Iterator[Candidate]:
        w = self.w
        sources = [self._slots(after_ms, before_ms, budget), self._buckets(after_ms, before_ms, budget)]
        late_hi = max(now_ms + 1, w.late_below * w.P, (w.s_k + 1) * w.P)
        if after_ms < late_hi and w.l_head != -1:
            sources.append(iter(self._late(after_ms, before_ms, budget)))
        return heapq.merge(*sources)

    def read(self, due_ms: int, ref: int, loc: int) -> Record | None:
        w = self.w
        if not loc & BUCKET_BIT and ref < w._restored_head:
            # restored from the checkpoint and not checked yet: verify before believing it
            rec = w.log.read(loc, verify=True)
            return rec if rec.due_ms == due_ms else None
        return w._read(loc)

    # -- the sources -----------------------------------------------------------------------------
    def _chain(self, e: int, last: int, lo: int, hi: int, budget: Budget, out: list[Candidate]) -> None:
        """The pending entries due in ``[lo, hi)`` of the chain from ``e`` through ``last``."""
        tl = self.w.tl
        files, pf, hs = tl.files, tl.per_file, tl.hs
        while e != -1:
            budget.spend()
            f0 = e - e % pf
            buf = files[f0].buf
            due, loc, nx = _WALK(buf, hs + (e - f0) * ENTRY_SIZE)
            if buf[HEADER_SIZE + e - f0] == PENDING and lo <= due < hi:
                out.append((due, loc if loc & BUCKET_BIT else e, loc))
            e = -1 if e == last else nx

    def _late(self, lo: int, hi: int, budget: Budget) -> list[Candidate]:
        w = self.w
        out: list[Candidate] = []
        self._chain(w.l_head, w.l_tail, lo, hi, budget, out)
        out.sort()
        return out

    def _slots(self, lo: int, hi: int, budget: Budget) -> Iterator[Candidate]:
        w = self.w
        if not w.inited:
            return
        n, p, occ = w.N, w.P, w.occ_done
        k = max(lo // p, w.d_k)  # the slots below the done cursor hold nothing pending
        end = min((hi - 1) // p, w._limit_slot() - 1)
        while k <= end:
            pos = k % n
            stop = min(n, pos + end - k + 1)
            i = occ.find(1, pos, stop)
            budget.spend(1 + (stop - pos) // 4096)  # a find costs little per position
            if i < 0:
                k += stop - pos
                continue
            k += i - pos
            sl = w._slot(k)
            if sl is not None:
                got: list[Candidate] = []
                self._chain(sl[0], sl[1], lo, hi, budget, got)
                got.sort()
                yield from got
            k += 1

    def _buckets(self, lo: int, hi: int, budget: Budget) -> Iterator[Candidate]:
        bs = self.w.buckets
        meeting = sorted((b for b in bs.buckets.values() if b.loaded < b.size and b.start < hi and lo < b.end),
                         key=lambda b: b.start)
        return heapq.merge(*(self._bucket(b, lo, hi, budget) for b in meeting))

    def _bucket(self, b: Bucket, lo: int, hi: int, budget: Budget) -> Iterator[Candidate]:
        from sidecar.store.buckets import make_ref

        heads = self.w.buckets.scan(b, b.count)  # from the load point: the records only the bucket holds
        budget.spend(len(heads))
        got = [(due, ref, ref) for off, _n, state, due, _lv in heads
               if state == BUCKET_PENDING and lo <= due < hi for ref in (make_ref(b.seq, off),)]
        got.sort()
        yield from got
