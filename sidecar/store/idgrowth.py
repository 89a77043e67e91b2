"""The id index's cut schedule: when a generation is sealed for a merge pass, at what table size.

The index (sidecar/store/idindex.py) stages every insert and remove in its open generation and
never writes its table on the loop ("Why staged" there). ``Growth`` decides, at each loop step
of the index, when that generation is sealed and merged into the table by a pass
(sidecar/store/idpass.py, on a kept worker thread), whether the table is rebuilt larger first,
and notices the pass's end; the table then takes in what the pass wrote (``IdIndex.merged``).

**Cut.** A generation is cut when no pass runs and either its stage holds ``cut_ops`` operations
(``CUT_SHARE`` of the table's slots, at least ``CUT_MIN``), or ``CUT_S`` passed with operations in
it, or ``IDLE_PASS_S`` passed at all: that pass sweeps the expired pre-cancels (those made before
the cancel horizon), so they leave within twice ``IDLE_PASS_S`` + a pass of their expiry, probed or
not. A pass that failed (disk full, I/O error) is run again on the same sealed generation after
``RETRY_S``, and no cut happens meanwhile.

**Growth.** A cut whose inserts would take the table past half full (its tombstones counted)
first rebuilds it into ``ids.idx.next.<n>``: twice the size when a quarter of it would be live,
else the same size (that sheds the tombstones); more only for what one doubling cannot hold at a
third full (a recovery's journals). The generation is merged into the new file; the table maps it
when the pass is done, and it takes the name ``ids.idx`` at the next flush. No growth pauses the
loop: it costs the worker a sequential copy. The stage after a growth's cut is sized for four
generations, so that it does not fill before the longer pass ends.

**Turns.** A process's indexes (one per partition) take turns for the passes that a cut by age
starts: while a pass of any index runs (``WORKERS.busy``), a generation due only by its age
(``CUT_S`` with operations, ``IDLE_PASS_S`` without) waits, up to twice that age; a full stage
(``cut_ops``) is cut at once. Why: partitions filled at the same rate since the same second cut
by age in the same second, and their passes, each reading its whole table, ran together every
30 s; at 100M pending on six partitions the loop's stalls kept that beat (the ``scale`` bench
scenario). Taking turns spreads the same reads and writes over the 30 s.

Steps drive the cuts: the index's clock is the time of its last step, and nothing here reads
time itself.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING

from sidecar import logs
from sidecar.store.idpass import WORKERS, Pass
from sidecar.store.idslot import CUT_MIN
from sidecar.store.idstage import doubled

if TYPE_CHECKING:
    from sidecar.store.idindex import Gen, IdIndex

NEXT = "ids.idx.next."  # a rebuilt table's file, until a flush names it ids.idx
CUT_SHARE = 1 / 128  # else this share of the table's slots: a pass every ~1/128 of the table written
CUT_S = 30.0  # a generation with operations in it is cut after this long (s)
IDLE_PASS_S = 120.0  # and one without, after this long: the pass sweeps expired pre-cancels
RETRY_S = 5.0  # a pass that failed (disk full, I/O error) is run again after this long
log = logs.get("sidecar.store")


def cut_ops(cap: int) -> int:
    """Operations that cut a generation for a table of ``cap`` slots."""
    return max(CUT_MIN, int(cap * CUT_SHARE))


class Growth:
    """The cut schedule and the running pass of one index (module docstring)."""

    pass_class: type[Pass] = Pass  # what runs a pass (tests substitute one they run by hand)

    def __init__(self, ix: IdIndex) -> None:
        self.ix = ix
        self.running: Pass | None = None
        self.now_ms = 0  # the clock of the last step (epoch ms): steps drive the cuts, nothing else reads time
        self.horizon_ms = -1  # unknown until the first step: a pass sweeps nothing before it
        self.seq = 0  # the last ids.idx.next.<n> number used
        self._failed_at = 0  # the clock (ms) at the last failed pass
        self._worker = True  # a pass thread waits for this index (idpass.Workers), until close
        WORKERS.opened()

    def step(self, now_ms: int, horizon_ms: int) -> int:
        """A loop turn's share: notice a finished pass, cut when due. Returns the operations cut (0:
        none)."""
        self.now_ms, self.horizon_ms = now_ms, horizon_ms
        gen = self.ix.gen
        if gen is not None and gen.opened <= 0:
            gen.opened = now_ms
        self.poll()
        return self.cut()

    def wait(self) -> None:
        """Wait for the running pass and take its result (tests, the bench)."""
        if self.running is not None and self.running.started:
            self.running.join()
        self.poll()

    def poll(self) -> None:
        """Take the result of a pass that has finished: the table's, or a failure retried later."""
        p = self.running
        if p is None or p.is_alive():
            return
        self.running = None
        if p.error is not None:
            self._failed_at = self.now_ms
            if p.new is not None:
                p.new.unlink(missing_ok=True)
            if p.tags is not None and p.tags is not self.ix.tags:  # fresh ones, half built
                p.tags.close()
            log.warning("ids.pass_failed", error=str(p.error), retry_s=RETRY_S)
            return
        self.ix.merged(p)

    def cut(self, force: bool = False) -> int:
        """Seal the open generation and start its pass, if one is due (or ``force``) and none runs."""
        ix = self.ix
        gen = ix.gen
        assert gen is not None
        if self.running is not None:
            return 0
        if ix.sealed is not None:  # its pass failed: run it again, not too often
            if self.now_ms - self._failed_at < RETRY_S * 1000:
                return 0
            self._start(ix.sealed, self._size(ix.sealed))
            return 0
        age = (self.now_ms - gen.opened) / 1000 if gen.opened > 0 else 0.0
        full = force or gen.ops >= cut_ops(ix.cap)
        limit = CUT_S if gen.ops else IDLE_PASS_S
        if not (full or age >= limit):
            return 0
        if not full and WORKERS.busy and age < 2 * limit:
            return 0  # another index's pass runs: a cut by age waits its turn ("Turns")
        grow = self._size(gen)
        # A growth's pass copies the whole table first: a stage for four generations then, so that
        # the open one does not fill before it ends (a stage that fills is doubled on the loop:
        # ~100 ms at a million entries)
        ix.seal(cut_ops(ix.cap) * (4 if grow else 1), gen.ops >= cut_ops(ix.cap), self.now_ms)
        self._start(gen, grow)
        return gen.ops

    def room(self, gen: Gen) -> Gen:
        """The open generation with room in its stage, ``gen``'s being full: cut it if no pass
        runs, else (the pass is slower than the inserts) double its stage in memory."""
        ix = self.ix
        self.poll()
        if self.running is None and self.cut(force=True):
            assert ix.gen is not None
            return ix.gen
        gen.stage = big = doubled(gen.stage, ix.native)
        # A burst of inserts outruns a pass now and then (a 1M-record fill at 150k/s doubled a
        # stage 7 times): routine, and the memory is small beside the table's. A stage as large as
        # the table doubles the index's memory: the passes fall behind for long (a slow volume).
        behind = big.cap >= ix.cap
        (log.warning if behind else log.info)(
            "ids.stage_grown", capacity=big.cap, live=big.live, table_capacity=ix.cap,
            detail="the id index's merge passes fall behind the inserts" + (
                ": its in-memory stage is as large as its table; check the volume's latency" if behind else ""),
        )
        return gen

    def _size(self, gen: Gen) -> int:
        """The capacity the table is rebuilt at before ``gen`` is merged into it (0: merged in
        place): module docstring, "Growth"."""
        ix = self.ix
        live = ix.table_live + gen.inserts
        if (live + ix.table_tombs) * 2 <= ix.cap:
            return 0
        grow = ix.cap * 2 if live * 4 >= ix.cap else ix.cap
        while live * 3 > grow:
            grow *= 2
        return grow

    def _start(self, gen: Gen, grow: int) -> None:
        ix = self.ix
        cutoff = max(0, self.now_ms - self.horizon_ms) if self.horizon_ms >= 0 else 0
        new = None
        if grow:
            self.seq += 1
            new = ix.dir / f"{NEXT}{self.seq}"
        tags = None
        if ix.native:
            # the pass rewrites the tags as it goes: the table's own when it stays, fresh ones for
            # a rebuilt table or a table that has none yet (the first pass after the open)
            tags = ix.tags if not grow and ix.tags is not None else mmap.mmap(-1, grow or ix.cap)
        # ix.f: ids.idx's file, or a grown one that a checkpoint's sync batch renames to ids.idx
        # (``final``: the name the pass opens when the rename came first)
        self.running = self.pass_class(ix.f.path, ix.cap, gen.journals(), cutoff, grow, new, ix.native, tags,
                                       final=ix.path)
        self.running.start()

    def close(self) -> None:
        """Wait for a running pass (it writes the table) and take its result; give up the index's
        worker thread."""
        if self.running is not None and self.running.started:  # (a test's pass may never start)
            self.running.join()
            self.poll()
        if self._worker:
            self._worker = False
            WORKERS.closed()
