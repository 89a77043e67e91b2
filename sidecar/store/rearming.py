"""The C re-arm run: settled firings' next records stored in one call (``_native.rearm_run``).

``Firings.settle_many`` (store/firings.py) arms the next firing of each delivered firing of a
batch. One by one (``Firings._rearm``, the reference) each costs a header blob, a commit-log
append, a scheduler add, an id-index put and a changelog put in Python. ``rearm_run``
(sidecar/native/firing.c) does the first four for a run of them in C, on the intake's state and
buffers (sidecar/store/intake_layout.py: the scheduler's ``intake_begin`` / ``intake_end``, the
log's and the id index's ``intake_state`` / ``intake_restore``, as ``Intake.ingest_many`` hands
them over), and the changelog puts of the run follow as the C intake's do (``report_run``). It
stops at the first record it leaves to the reference (the levels scheduler, a segment's end, an
id-index stage to grow, a scheduler case other than the plain append): the caller runs that one
through ``_rearm`` and calls again after it. Both leave the same bytes and state (a test compares
them on random schedules, tests/unit/test_recurring_firing_native.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.store.codec import NATIVE, Record, native
from sidecar.store.intake_layout import Common
from sidecar.store.mapped import HEADER_SIZE
from sidecar.store.mirroring import report_run

if TYPE_CHECKING:
    from sidecar.store.partition import PartitionStore

_run = native.rearm_run if NATIVE else None


def runs(store: PartitionStore) -> bool:
    """May the C run re-arm ``store``'s firings? On the wheel only (the levels plan a level per
    record: the reference does), and without a history topic (``report_run`` would write an
    ``accepted`` event of each re-arm; the reference writes none)."""
    return _run is not None and store.history is None and store.sched.name == "wheel"


def rearm_run(
    store: PartitionStore, items: list[tuple[Record, int | None, int, int | None]], start: int, now_ms: int,
) -> int:
    """Re-arm ``items[start:]`` ((record, last fire ms, fired, next ms) each) while the C run
    takes them; the index of the first it did not (``start`` when it cannot run)."""
    assert _run is not None
    sched = store.sched.intake_begin()
    if sched is None:
        return start
    st, bufs = sched
    st[Common.HEADER_SIZE] = HEADER_SIZE
    seg = store.log.intake_state(st)
    idx = store.ids.intake_state(st, len(items) - start)
    first = store.log.head
    old, old2, jnl, tags = store.ids.intake_bufs()
    end: int = _run(items, start, native.RunBufs(
        seg_buf=seg, idx_buf=idx, st=st, sched_bufs=bufs, idx_old_buf=old, idx_old2_buf=old2, idx_jnl_buf=jnl,
        idx_tags_buf=tags,
    ))
    count = end - start
    if count:  # (the store is marked dirty by the settle this runs in, Outcomes.settle)
        store.log.intake_restore(st, count)
        store.ids.intake_restore(st)
        store.sched.intake_end(st, count)
        if store.mirror is not None:
            report_run(store, first, count, now_ms, fresh=False)
    return end
