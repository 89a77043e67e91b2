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
  entries from the load point on (the ones before it are in the slots), heads only. A bucket is
  read whole (its width, one hour by default: it has no index inside), the rest of the pending
  set is not. Being read whole, it is read without the store lock (``prepare``): under the lock
  each bucket meeting the range is opened on a descriptor of the listing's own, with its load
  point and end; the heads are read after the lock is let go (the file is append-only, written
  with ``pwrite``, and an unlinked file stays readable through an open descriptor; an entry's
  state byte read then may be stale, so each candidate is checked again when it is decoded,
  under the lock: still only in its bucket and pending, or linked into the ring since and pending
  there). A record linked in between the two reads appears in both with the same ref (a bucket
  record keeps its bucket ref for life): ``list_store`` drops the repeat.
- **the late chain** (records that arrived already due): only for a range that starts at or
  before now, since every entry on it was due when it was linked. It is in arrival order and
  walked whole: it holds the backlog of overdue records, empty in a sidecar that keeps up.

Read-only: nothing here moves a cursor, flips a state or loads a bucket.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.store.buckets import BUCKET_BIT, heads, make_ref
from sidecar.store.buckets import PENDING as BUCKET_PENDING
from sidecar.store.codec import Record
from sidecar.store.listing import Budget, Candidate
from sidecar.store.mapped import HEADER_SIZE, StoreError
from sidecar.wheel.layout import _WALK, ENTRY_SIZE, PENDING

if TYPE_CHECKING:
    from sidecar.wheel.scheduler import WheelScheduler


class WheelWalk:
    def __init__(self, sched: WheelScheduler) -> None:
        self.w = sched

    def walk(self, after_ms: int, before_ms: int, now_ms: int, budget: Budget, early: list[Candidate]
             ) -> Iterator[Candidate]:
        w = self.w
        sources = [self._slots(after_ms, before_ms, budget), iter(early)]
        late_hi = max(now_ms + 1, w.late_below * w.P, (w.s_k + 1) * w.P)
        if after_ms < late_hi and w.l_head != -1:
            sources.append(iter(self._late(after_ms, before_ms, budget)))
        return heapq.merge(*sources)

    def read(self, due_ms: int, ref: int, loc: int) -> Record | None:
        w = self.w
        if loc & BUCKET_BIT:  # its body is in a bucket: still only there, or linked in; pending now?
            at = w.loading.waiting(ref)
            if at is not None:
                h = w.buckets.head(*at)
                return w.buckets.read(*at) if h is not None and h[0] == BUCKET_PENDING else None
            ent = w._entry(ref)  # linked into the ring since
            if ent is None or ent[3] != PENDING:
                return None
            loc = ent[2]
        elif ref < w._restored_head:
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
            budget.spend(1 + ((stop if i < 0 else i) - pos) // 4096)  # a find costs little per position
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

    def prepare(self, after_ms: int, before_ms: int) -> Callable[[Budget], list[Candidate]] | None:
        """Under the store lock: the buckets meeting the range, each opened on a descriptor of its
        own. The returned read runs without the lock (see the module docstring) and closes them."""
        bs = self.w.buckets
        snap: list[tuple[int, Path, int, int, int]] = []
        try:
            for b in bs.buckets.values():
                if b.loaded < b.size and b.start < before_ms and after_ms < b.end:
                    path = bs.path(b)
                    snap.append((os.open(path, os.O_RDONLY), path, b.seq, b.loaded, b.size))
        except OSError as e:
            for fd, *_rest in snap:
                os.close(fd)
            raise StoreError(f"a bucket file could not be opened for listing: {e}") from None
        if not snap:
            return None

        def read(budget: Budget) -> list[Candidate]:
            got: list[Candidate] = []
            try:
                for fd, path, seq, pos, end in snap:
                    seen = 0
                    for off, _n, state, due, _lv in heads(fd, path, pos, end):
                        seen += 1
                        if state == BUCKET_PENDING and after_ms <= due < before_ms:
                            ref = make_ref(seq, off)
                            got.append((due, ref, ref))
                    budget.spend(seen)
            finally:
                for fd, *_rest in snap:
                    os.close(fd)
            got.sort()
            return got

        return read
