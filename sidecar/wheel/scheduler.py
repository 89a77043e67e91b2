"""The timer-wheel scheduler (RocketMQ 5.x RIP-43, improved; docs/design.md 4, docs/wheel.md).

Three tiers, each on disk, none holding a Python object per record:

- **slots**: one slot per ``precision`` ms of the near window, a ring of ``window / precision``
  positions, each a chain of timer-log entries in arrival order;
- **late chain**: records that arrive already due for a slot the reader has passed, handed out
  ahead of the slots;
- **buckets**: records due beyond the ring, copied whole into the bucket file of their due time and
  linked into the ring as the ring reaches them.

One module per job: ``ring`` (the slots, the late chain, and the cursors that hand records out and
finish them: ``due``'s walks, ``ack``), ``loading`` (the buckets, and linking them into the ring),
``recovery`` (the checkpoint, restore and crash repair, the damage checks of restored entries),
``layout`` (the file formats and the per-entry walks, in C and in Python). ``WheelScheduler`` puts
them together behind the ``Scheduler`` protocol (``sidecar.scheduling``): it *is* the ring, whose
state the per-record paths read and write (``add``, the C intake's ``intake_begin`` and
``intake_end``, ``due``, ``ack``), and it owns a ``Loader``, a ``Recovery`` and a ``Damage``,
which keep their own state and reach the ring's through their ``ring`` reference.

``add`` routes a record: onto the late chain if its slot is behind the reader, into its bucket if
it is beyond the ring or its bucket is not fully linked in yet (equal due times keep arrival
order), else into its slot. ``due`` loads buckets that fit the ring, then hands out the late chain,
then the slots, then moves the done cursor.

Nothing here reads a clock: time comes in as ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.store import native_layouts as _layouts
from sidecar.store.buckets import BUCKET_BIT
from sidecar.store.codec import Record
from sidecar.store.intake_layout import Wheel, wheel_state
from sidecar.store.log import CommitLog
from sidecar.store.mapped import StoreError, fsync_dir
from sidecar.wheel.layout import CANCELLED, DONE, ENTRY_SIZE, LATE, PENDING
from sidecar.wheel.loading import Loader
from sidecar.wheel.recovery import Damage, Recovery
from sidecar.wheel.ring import _LATE, Ring

MAX_DUE_MS, MIN_DUE_MS = _layouts.WHEEL_MAX_DUE_MS, _layouts.WHEEL_MIN_DUE_MS
MAX_PRECISION_MS = 60_000


def check_settings(precision_ms: int, window_ms: int, bucket_width_ms: int) -> None:
    """Refuse geometries the wheel cannot honour, with the reason."""
    if not 1 <= precision_ms <= MAX_PRECISION_MS:
        raise ValueError(f"wheel precision must be 1 ms .. {MAX_PRECISION_MS} ms, not {precision_ms} ms")
    if window_ms % precision_ms or window_ms // precision_ms < 2:
        raise ValueError(
            f"wheel window ({window_ms} ms) must be a multiple of the precision ({precision_ms} ms), at least 2 slots"
        )
    if not 1 <= bucket_width_ms <= window_ms:
        raise ValueError(
            f"bucket width ({bucket_width_ms} ms) must be between 1 ms and the wheel window ({window_ms} ms): "
            "a bucket is loaded once the whole of it fits in the window"
        )


class WheelScheduler(Ring):
    """The ring, with its bucket tier (``loading``), its checkpoint (``recovery``) and its damage
    checks (``damage``) composed in, behind the ``Scheduler`` protocol (see the module docstring)."""

    name = "wheel"

    def __init__(
        self,
        directory: Path,
        log: CommitLog,
        *,
        precision_ms: int = 10,
        window_ms: int = 3_600_000,
        bucket_width_ms: int = 3_600_000,
        levels_ms: tuple[int, ...] = (),
        entries_per_file: int = 1 << 20,
        load_batch: int = 8_192,
        scan_factor: int = 4,
        done_batch: int = 65_536,
        index_max: int = 1 << 17,
        native: bool = True,
    ) -> None:
        check_settings(precision_ms, window_ms, bucket_width_ms)
        super().__init__(
            directory, log, precision_ms=precision_ms, window_ms=window_ms, entries_per_file=entries_per_file,
            scan_factor=scan_factor, done_batch=done_batch, index_max=index_max, native=native,
        )
        self.levels_ms = levels_ms
        self.width = bucket_width_ms
        self.damage = Damage(self)
        self._dangles = self.damage.dangles
        self.loading = Loader(self, self.damage, width_ms=bucket_width_ms, load_batch=load_batch)
        self.recovery = Recovery(self, self.loading)

    # -- planning -------------------------------------------------------------------------------
    def plan(self, mode: str, level: int, requested_due_ms: int, enqueue_ms: int) -> tuple[int, int] | None:
        """The wheel honours the requested ms exactly (``delay.deliver-at`` = requested time)."""
        if mode == "level":
            if not 1 <= level <= len(self.levels_ms):
                return None
            due = enqueue_ms + self.levels_ms[level - 1]
        else:
            due = requested_due_ms
        if not MIN_DUE_MS <= due <= MAX_DUE_MS:
            return None
        return 0, due

    # -- intake ---------------------------------------------------------------------------------
    def add(self, due_ms: int, level: int, log_pos: int) -> int:
        if not self.inited:
            # No due() call yet (first start, or replay before any checkpoint): start the reader
            # at the earliest of this record's due and enqueue times.
            rec = self.log.read(log_pos)
            self._init_cursor(min(due_ms, rec.enqueue_ms) // self.P)
        # _destination, inlined: this runs once per record
        kd = due_ms // self.P
        s_k = self.s_k
        if kd < self.late_below or kd < s_k or (kd == s_k and 0 <= self.s_o > due_ms - kd * self.P):
            return self._link(due_ms, log_pos, level, _LATE)  # its slot is behind the reader: already due
        g = self.d_k  # _guard()
        fm = self.fm_before
        if fm is not None and fm < g:
            g = fm
        fm = self.fm_after
        if fm is not None and fm < g:
            g = fm
        if kd >= g + self.N:
            return self.loading.add(due_ms, log_pos)  # beyond the ring (see _destination)
        by_range = self.buckets.by_range
        if by_range and (due_ms - due_ms % self.width, self.width) in by_range:
            return self.loading.add(due_ms, log_pos)  # its bucket is not fully linked yet
        return self._append_slot(due_ms, log_pos, level)

    def intake_begin(self) -> tuple[list[int], tuple[Any, ...]] | None:
        """The state ``_native.ingest_run`` needs for ``add``'s plain cases (``_append_slot``, and an
        already due record's ``_link`` to the late chain): the intake state with the wheel's part
        (sidecar/store/intake_layout.py) and the buffers it writes (the head's timer-log file, None
        if not mapped yet; the slot file; the occupancy flags; the buckets not fully linked yet);
        None when the next ``add`` cannot be that case (no cursor yet)."""
        if not self.inited:
            return None

        idx, tl, sf = self.head, self.tl, self.slots
        f0 = idx - idx % self.pf
        mf = tl.files.get(f0)
        st = wheel_state()
        st[Wheel.P] = self.P
        st[Wheel.N] = self.N
        st[Wheel.LATE_BELOW] = self.late_below
        st[Wheel.S_K] = self.s_k
        st[Wheel.S_O] = self.s_o
        st[Wheel.GUARD] = self._guard()
        st[Wheel.HEAD] = idx
        st[Wheel.PER_FILE] = self.pf
        st[Wheel.F0] = -1 if mf is None else f0
        st[Wheel.APP_LO] = tl.app_lo
        st[Wheel.APP_HI] = tl.app_hi
        st[Wheel.SLOT_DIRTY_LO] = sf.dirty_lo
        st[Wheel.SLOT_DIRTY_HI] = sf.dirty_hi
        st[Wheel.MARK_LO] = -1
        st[Wheel.MARK_HI] = -1
        st[Wheel.WIDTH] = self.width
        st[Wheel.LATE_HEAD] = self.l_head
        st[Wheel.LATE_TAIL] = self.l_tail
        bufs = (None if mf is None else mf.buf, sf.buf, self.occ_send, self.occ_done, self.buckets.by_range)
        return st, bufs

    def range_walk(self) -> Any:
        """What ``delay-sidecar list`` reads of this wheel (``sidecar.wheel.listing``)."""
        from sidecar.wheel.listing import WheelWalk

        return WheelWalk(self)

    def intake_end(self, st: list[int], count: int) -> None:
        """Take back what ``ingest_run`` changed: ``count`` entries appended to the timer-log file
        of the head at ``intake_begin`` (the kernel stops at a file boundary)."""

        f0 = self.head - self.head % self.pf
        self.head = st[Wheel.HEAD]
        if self.tl.ahead.near(self.head):
            self.tl.prefault(self.head)
        self.file_live[f0] += count
        self.n_wheel += count
        tl, sf = self.tl, self.slots
        tl.app_lo, tl.app_hi = st[Wheel.APP_LO], st[Wheel.APP_HI]
        self.l_head, self.l_tail = st[Wheel.LATE_HEAD], st[Wheel.LATE_TAIL]  # late entries appended to the late chain
        if st[Wheel.NEW_CHAINS]:  # slot chains started: occ_send flags set
            self._occ_memo = None
        sf.dirty_lo, sf.dirty_hi = st[Wheel.SLOT_DIRTY_LO], st[Wheel.SLOT_DIRTY_HI]
        if st[Wheel.MARK_LO] >= 0:  # old tails patched in place: the range of them, for flush
            tl.mark(f0, st[Wheel.MARK_LO])
            tl.mark(f0, st[Wheel.MARK_HI] - ENTRY_SIZE)

    # -- dequeue --------------------------------------------------------------------------------
    def due(self, now_ms: int, limit: int) -> list[tuple[int, Record]]:
        out: list[tuple[int, Record]] = []
        if limit <= 0:
            return out
        if not self.inited:
            self._init_cursor(now_ms // self.P)
        if now_ms > self.now_last:
            self.now_last = now_ms
        self._budget = limit * self.scan_factor + 1024
        self.loading.load()
        self._drain_late(now_ms, limit, out)
        if len(out) < limit:
            self._drain_slots(now_ms, limit, out)
        self._advance_done()
        return out

    def next_due_ms(self) -> int | None:
        best = self._next_due()
        m = self.buckets.min_due(self.window_ms)
        if m is not None and (best is None or m < best):
            best = m
        return best

    # -- by ref (ack and ack_many: the ring) -----------------------------------------------------
    def cancel(self, ref: int) -> bool:
        if ref >= 0 and ref & BUCKET_BIT:
            at = self.loading.waiting(ref)
            if at is not None:  # still only in the bucket: the bucket entry carries the marker
                h = self.buckets.head(*at)
                if h is None or h[0] != PENDING:
                    return False
                self.buckets.set_state(*at, CANCELLED)
                return True
        ent = self._entry(ref)
        if ent is None:
            return False
        e, due, _loc, state, flags = ent
        if state != PENDING or self._handed(e, due, flags):
            return False
        self.tl.set_state(e, CANCELLED)
        return True

    def record(self, ref: int) -> Record | None:
        try:
            if ref >= 0 and ref & BUCKET_BIT:
                at = self.loading.waiting(ref)
                if at is not None:
                    h = self.buckets.head(*at)
                    return self.buckets.read(*at) if h is not None and h[0] == PENDING else None
            ent = self._entry(ref)
            if ent is None or ent[3] != PENDING:
                return None
            if ent[0] < self._restored_head and self._dangles(ent[0], ent[1], ent[2]):
                return None
            return self._read(ent[2])
        except StoreError:
            return None  # a stale ref from before a restart pointing into rewritten space

    def where(self, ref: int) -> str | None:
        """Which tier holds a not-yet-done ref: "slot", "late" or "bucket" (None when done or
        unknown). For tests and the inspect command; not on the hot path."""
        if ref >= 0 and ref & BUCKET_BIT:
            at = self.loading.waiting(ref)
            if at is not None:
                h = self.buckets.head(*at)
                return "bucket" if h is not None and h[0] != CANCELLED else None
        ent = self._entry(ref)
        if ent is None or ent[3] >= DONE:
            return None
        return "late" if ent[4] & LATE else "slot"

    # -- durability (the checkpoint: sidecar.wheel.recovery) ------------------------------------
    def flush(self) -> None:
        if self._new_dir:
            fsync_dir(self.partition_dir)
            self._new_dir = False
        self.slots.flush()
        self.tl.flush()
        self.buckets.flush()

    def trim(self) -> None:
        """Unmap the slot file's and the timer log's resident pages (the buckets are not mapped)."""
        self.slots.trim()
        self.tl.trim()

    def state(self) -> dict[str, Any]:
        return self.recovery.state()

    def reclaim(self) -> None:
        """After a checkpoint: delete timer-log files and bucket files it no longer needs."""
        self.recovery.reclaim()

    def restore(self, state: dict[str, Any] | None) -> None:
        self.recovery.restore(state)

    def arm(self, head: int, report: Callable[[int, int, str], None] | None = None) -> None:
        """After the partition's replay, with the checkpointed log ``head``: ``recovery.Damage.arm``."""
        self.damage.arm(head, report)

    def validate(self, head: int) -> list[tuple[int, int, str]]:
        """Check every pending restored entry now (``recovery.Damage.validate``): for tests and tools."""
        return self.damage.validate(head)

    # -- introspection --------------------------------------------------------------------------
    def pending(self) -> dict[str, int]:
        return {"wheel": self.n_wheel, "bucket": self.loading.n_bucket}

    def disk_bytes(self) -> int:
        return self.slots.size() + self.tl.disk_bytes() + self.buckets.disk_bytes()

    def close(self) -> None:
        self.slots.close()
        self.tl.close()
        self.buckets.close()
