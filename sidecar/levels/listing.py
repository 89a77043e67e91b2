"""The levels scheduler's range walk for listing (``sidecar.store.listing``): the pending entries
due in ``[after, before)``, in ``(due, ref)`` order, reading only what covers the range.

Within a level every record waits the same delay, so its queue is in due order as far as the
ingress timestamps are (a producer's clock may put a later record a little earlier: the
scheduler then delivers it late, with its predecessor). Each level's stretch that can hold the
range is found by binary search over its pending entries ``[done, write)`` for the first due time
at or after ``after - SKEW_MS``; the walk then reads entries until one is due at or after
``before + SKEW_MS``, keeping those due in the range. A record whose timestamp is more than
``SKEW_MS`` out of order with its neighbours can be missed by a listing (never by delivery).

Level 0 ("due now": records whose requested time had passed when they arrived) is not ordered by
due time; it holds only overdue records, so it is walked whole, and only for a range that starts
at or before now (plus ``SKEW_MS``): empty in a sidecar that keeps up.

Read-only: nothing here moves a cursor or changes a state byte.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from sidecar.levels.queue import IDX_BITS, PENDING, LevelQueue

if TYPE_CHECKING:
    from sidecar.levels.scheduler import LevelsScheduler
from sidecar.store.codec import Record
from sidecar.store.listing import Budget, Candidate

SKEW_MS = 5_000  # how far out of order a level's due times are looked for (ingress timestamps)


class LevelsWalk:
    def __init__(self, sched: LevelsScheduler) -> None:
        self.s = sched

    def prepare(self, after_ms: int, before_ms: int) -> Callable[[Budget], list[Candidate]] | None:
        """Nothing to read without the store lock: a level's stretch is found by binary search."""
        return None

    def walk(self, after_ms: int, before_ms: int, now_ms: int, budget: Budget, early: list[Candidate]
             ) -> Iterator[Candidate]:
        sources = []
        for n, lv in enumerate(self.s.levels):
            if lv.done >= lv.write:
                continue
            if n == 0:
                if after_ms <= now_ms + SKEW_MS:
                    sources.append(self._level(n, lv.queue, lv.done, lv.write, after_ms, before_ms, None, budget))
                continue
            lo = self._first_at(lv.queue, lv.done, lv.write, after_ms - SKEW_MS, budget)
            sources.append(self._level(n, lv.queue, lo, lv.write, after_ms, before_ms, before_ms + SKEW_MS, budget))
        return heapq.merge(*sources)

    def read(self, due_ms: int, ref: int, loc: int) -> Record | None:
        s = self.s
        lv = s.levels[ref >> IDX_BITS]
        if (ref & ((1 << IDX_BITS) - 1)) < lv.restored:
            # restored from the checkpoint and not checked yet: verify before believing it
            rec = s.log.read(loc, verify=True)
            return rec if rec.due_ms == due_ms else None
        return s.log.read(loc)

    @staticmethod
    def _first_at(q: LevelQueue, lo: int, hi: int, due_ms: int, budget: Budget) -> int:
        """The first index in ``[lo, hi)`` whose due time is >= ``due_ms`` (the queue taken as
        sorted), or ``hi``."""
        while lo < hi:
            mid = (lo + hi) // 2
            budget.spend()
            if q.due_of(mid) < due_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @staticmethod
    def _level(n: int, q: LevelQueue, idx: int, write: int, lo: int, hi: int, stop: int | None,
               budget: Budget) -> Iterator[Candidate]:
        """Level ``n``'s pending entries due in ``[lo, hi)`` from ``idx``, sorted: read until an
        entry due at or after ``stop`` (None: up to ``write``)."""
        got: list[Candidate] = []
        hi_ref = n << IDX_BITS
        seen = 0
        for i, pos, due, state in q.scan(idx, write):
            if stop is not None and due >= stop:
                break
            seen += 1
            if seen == 256:  # the budget in steps: a call per entry would cost as much as the read
                budget.spend(seen)
                seen = 0
            if state == PENDING and lo <= due < hi:
                got.append((due, hi_ref | i, pos))
        budget.spend(seen)
        got.sort()
        yield from got
