"""Recovery of the timer wheel: the checkpoint it writes (``Recovery.state``, ``reclaim``), the
restore from it with the repair of what a crash left behind (``Recovery.restore``), and the check
of restored entries against their bodies (``Damage``).

Durability. The slot file and the timer log are mmapped and written in place between checkpoints;
the checkpoint names the timer-log head and the done cursor (``sidecar.wheel.ring``). The partition
calls the wheel's ``flush``, writes the checkpoint (``state``), then ``reclaim``: timer-log files
wholly passed by done below the snapshot's floor, and bucket files with nothing live, are deleted.
``state`` also moves the ring's guard along (``fm_after`` to ``fm_before``; ``reclaim`` drops it):
once the checkpoint is durable, slots finished before it are no longer needed by a restore.

Restore. Entries past the checkpoint's head are rewritten by the partition's replay of the commit
log (``add`` in the original order), so ``restore`` drops timer-log files created after the
checkpoint and cuts every slot chain back to entries before that head (appends after the
checkpoint patched links and slot fields in place); slots created after it, and slots written
ahead of the restored ring ``[done, done + slots)``, are cleared; the occupancy flags are rebuilt
from the slot file in one vectorised pass. The reader restarts at the done cursor: entries already
done (acked after the checkpoint: their state byte survived in the file) are skipped, not
redelivered. Records due below the checkpoint's send slot that are linked after the restart go to
the late chain, as they would have before. No checkpoint: the wheel starts empty and the replay
adds everything.

Damage. Recovery does not read the bodies behind the restored entries (that would be
O(pending) at every start): the durability order is data -> index -> checkpoint, so an entry the
checkpoint covers points at a body that was made durable before the checkpoint was written and
can only dangle if the disk is damaged (or, with ``fsync: none``, after a power loss); entries
after the checkpoint's timer-log head are rewritten by the log replay. Instead each pending
entry restored from the checkpoint (index below the restored head) is checked against its body
on its *first read* — when send reaches it in ``due`` and in ``record`` — below the checkpointed
log head (``arm``), CRC intact, same due time, not a cancel; a dangling one is marked DROPPED
(skipped, never handed out, its body not released: a wrong live count must not delete a segment
that still holds pending records) and reported through ``report``. Bucket records are
CRC-checked as they are loaded (``sidecar.wheel.loading``); a damaged one is not linked in and is
reported the same way. ``validate`` is the same check of every restored entry at once,
O(pending), for tests and tools.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sidecar.store.buckets import BUCKET_BIT, split_ref
from sidecar.store.mapped import HEADER_SIZE, GeometryMismatch, StoreError
from sidecar.wheel.layout import DROPPED, PENDING, SLOT, SLOT_SIZE, SlotFile
from sidecar.wheel.ring import _TAG, Ring

if TYPE_CHECKING:
    from sidecar.wheel.loading import Loader

STATE_VERSION = 1
_COUNT_AT = struct.calcsize("<qqq")  # where a slot's u32 count starts (layout.SLOT: time_ms, first, last, count)
_NONZERO = bytes([0] + [1] * 255)  # bytes.translate: every non-zero byte to 1


def occupied(data: Any, n: int) -> list[int]:
    """The positions of the ``n`` slots after the header of ``data`` (the slot file's mmap, or
    any bytes-like object that takes strided slices) whose count is not zero, at C speed: the four
    bytes of each slot's count are gathered by strided slices and OR-ed as big integers, so Python
    visits only the occupied slots (a few thousand of the 360,000 of an hour's ring: a loop over
    all of them took ~50 ms per partition at every start; this, ~12 ms for 5,000 occupied)."""
    end = HEADER_SIZE + n * SLOT_SIZE
    acc = 0
    for i in range(4):
        acc |= int.from_bytes(data[HEADER_SIZE + _COUNT_AT + i : end : SLOT_SIZE], "little")
    flags = acc.to_bytes(n, "little").translate(_NONZERO)
    out: list[int] = []
    r = flags.find(1)
    while r >= 0:
        out.append(r)
        r = flags.find(1, r + 1)
    return out


class Damage:
    """The check of restored entries against their bodies, and where what fails it goes."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.dropped: list[tuple[int, int, str]] = []  # (ref, body locator, reason): what ``report`` collects
        self.report: Callable[[int, int, str], None] = self._collect
        self.log_head: int | None = None  # the checkpointed log head: restored entries point below it

    def arm(self, head: int, report: Callable[[int, int, str], None] | None = None) -> None:
        """Called by the partition (``PartitionStore.open``) after the replay with the checkpointed
        log ``head``: arms the check of each restored entry at its first read (see the module
        docstring, "Damage"); dangling entries and damaged bucket records go to
        ``report(ref, locator, reason)``. O(1): ``restore`` has already checked that the files
        holding restored entries exist."""
        self.log_head = head
        if report is not None:
            self.report = report

    def _collect(self, ref: int, loc: int, reason: str) -> None:
        self.dropped.append((ref, loc, reason))

    def _fault(self, due: int, loc: int) -> str:
        """Why a restored entry (``due``, ``loc``) does not match its body; "" if it does."""
        ring = self.ring
        if loc & BUCKET_BIT:
            seq, off = split_ref(loc)
            b = ring.buckets.get(seq)
            if b is None or off >= b.size or ring.buckets.head(seq, off) is None:
                return f"bucket entry {seq}:{off} does not exist"
            try:
                rec = ring.buckets.read(seq, off)
            except StoreError as ex:
                return str(ex)
            if rec.due_ms != due:
                return f"bucket record due {rec.due_ms} does not match the entry's {due}"
            return ""
        return ring.log.fault(loc, due, self.log_head)

    def dangles(self, e: int, due: int, loc: int) -> bool:
        """Check pending restored entry ``e`` before its first use; drop and report it if it
        dangles."""
        ring = self.ring
        reason = self._fault(due, loc)
        if not reason:
            return False
        ring.tl.set_state(e, DROPPED)
        self.report(loc if loc & BUCKET_BIT else e, loc, reason)
        return True

    def validate(self, head: int) -> list[tuple[int, int, str]]:
        """The check of every pending entry restored from the checkpoint at once (recovery checks
        each one at its first read instead); ``head`` is the checkpointed log head. Returns the
        dropped ones as ``(ref, locator, reason)`` (not passed to ``report``). O(pending): for
        tests and tools."""
        ring = self.ring
        self.log_head = head
        found: list[tuple[int, int, str]] = []
        lim = ring._restored_head
        e = ring.l_head
        while e != -1 and e < lim:
            self._check_entry(e, found)
            e = -1 if e == ring.l_tail else ring.tl.next_of(e)
        if ring.inited:
            k = ring.d_k
            while True:
                sl = ring._slot(k)
                if sl is not None and ring.occ_done[k % ring.N]:
                    e, last = sl[0], sl[1]
                    while e != -1 and e < lim:
                        self._check_entry(e, found)
                        e = -1 if e == last else ring.tl.next_of(e)
                nk = ring._next_occ(ring.occ_done, k)
                if nk is None or nk >= ring.d_k + ring.N:
                    break
                k = nk
        return found

    def _check_entry(self, e: int, found: list[tuple[int, int, str]]) -> None:
        ring = self.ring
        due, loc, _nx, state, _f, _lv, _t = ring.tl.read(e)
        if state != PENDING:
            return
        reason = self._fault(due, loc)
        if reason:
            ring.tl.set_state(e, DROPPED)
            found.append((loc if loc & BUCKET_BIT else e, loc, reason))


class Recovery:
    """The wheel's checkpoint (``state``, ``reclaim``) and the way back from it (``restore``)."""

    def __init__(self, ring: Ring, loading: Loader) -> None:
        self.ring = ring
        self.loading = loading
        # what the last state() snapshot found deletable, deleted by reclaim() once it is durable
        self._snap_files: list[int] = []
        self._snap_buckets: list[int] = []

    def _reset(self) -> None:
        self.ring._reset()
        self.loading.n_bucket = 0
        self._snap_files, self._snap_buckets = [], []

    def state(self) -> dict[str, Any]:
        ring = self.ring
        # Non-empty slots finished so far are covered by this checkpoint once it is written.
        if ring.fm_after is not None and (ring.fm_before is None or ring.fm_after < ring.fm_before):
            ring.fm_before = ring.fm_after
        ring.fm_after = None
        floor = ring.head
        if ring.d_o >= 0:
            sl = ring._slot(ring.d_k)
            if sl is not None and sl[0] < floor:
                floor = sl[0]
        for e in (ring.l_head, ring.l_sent):  # send follows l_sent's link: keep its file too
            if e != -1 and e < floor:
                floor = e
        self._snap_files = [f for f, live in ring.file_live.items() if live <= 0 and f + ring.pf <= floor]
        self._snap_buckets = ring.buckets.deletable()
        return {
            "v": STATE_VERSION,
            "precision_ms": ring.P,
            "window_ms": ring.window_ms,
            "init": ring.inited,
            "head": ring.head,
            "files": {str(f): n for f, n in ring.file_live.items()},
            "done": [ring.d_k, ring.d_o, ring.d_after, ring.d_nxt],
            "send": max(ring.s_k, ring.late_below),  # high-water mark: survives repeated restarts
            "late": [ring.l_head, ring.l_tail],
            "now": ring.now_last,
            "n": [ring.n_wheel, self.loading.n_bucket],
            "buckets": ring.buckets.state(),
        }

    def reclaim(self) -> None:
        """After a checkpoint: delete timer-log files and bucket files it no longer needs."""
        ring = self.ring
        for f in self._snap_files:
            if ring.file_live.get(f, 1) <= 0 and f + ring.pf <= ring.head:
                ring.tl.drop(f)
                del ring.file_live[f]
        for seq in self._snap_buckets:
            ring.buckets.delete(seq)
        self._snap_files, self._snap_buckets = [], []
        ring.fm_before = None

    def restore(self, state: dict[str, Any] | None) -> None:
        ring = self.ring
        if not state:
            self._wipe()
            return
        if int(state.get("v", 0)) != STATE_VERSION:
            raise StoreError(f"unsupported timer-wheel checkpoint version {state.get('v')}")
        p, w = int(state["precision_ms"]), int(state["window_ms"])
        if (p, w) != (ring.P, ring.window_ms):
            raise GeometryMismatch(
                f"the checkpoint was written with wheel precision {p} ms and window {w} ms, but the configuration "
                f"says precision {ring.P} ms and window {ring.window_ms} ms"
            )
        self._reset()
        ring.inited = bool(state["init"])
        ring.head = ring._restored_head = int(state["head"])
        files = {int(k): int(v) for k, v in state["files"].items()}
        for f in list(ring.tl.files):
            if f not in files:
                ring.tl.drop(f)  # created after the checkpoint
        for f, live in files.items():
            if f in ring.tl.files:
                ring.file_live[f] = live
            elif live > 0 and f < ring.head:
                raise StoreError(f"{ring.tl.dir}: timer-log file {f} is missing but holds {live} pending entries")
        ring.d_k, ring.d_o, ring.d_after, ring.d_nxt = (int(x) for x in state["done"])
        ring.s_k, ring.s_o, ring.s_after, ring.s_nxt = ring.d_k, ring.d_o, ring.d_after, ring.d_nxt
        if ring.inited:
            ring.late_below = int(state.get("send", ring.d_k))
        ring.l_head, ring.l_tail = (int(x) for x in state["late"])
        ring.l_sent = -1
        ring.now_last = int(state["now"])
        ring.n_wheel, self.loading.n_bucket = (int(x) for x in state["n"])
        ring.buckets.restore(state.get("buckets"))
        if ring.slots.created and ring.n_wheel > 0:
            raise StoreError(f"{ring.slots.path} is missing but the checkpoint names {ring.n_wheel} pending entries")
        self._repair()
        if ring.d_o >= 0 and ring._slot(ring.d_k) is None:
            raise StoreError(f"timer wheel: the checkpoint's done cursor is in slot {ring.d_k}, which is empty")

    def _repair(self) -> None:
        """Rebuild the occupancy flags for the ring ``[done, done + slots)`` and cut every chain
        back to the entries the checkpoint covers (those before ``head``)."""
        ring = self.ring
        n, p, head, lo = ring.N, ring.P, ring.head, ring.d_k
        buf = ring.slots.buf
        for r in occupied(ring.slots.f.mm, n):
            t, first, last, *_ = SLOT.unpack_from(buf, HEADER_SIZE + r * SLOT_SIZE)
            if t % p:
                continue
            k = t // p
            if k < lo:
                continue  # a previous lap's slot: its time never comes again, it reads as empty
            if k >= lo + n or k % n != r:
                # Ahead of the restored ring: written after the checkpoint (before it, the ring
                # ended at done + slots). Cleared, or it would look valid once the window got there.
                ring.slots.write(r, 0, 0, 0, 0, 0)
                continue
            if last >= head:
                if first >= head:
                    ring.slots.write(r, 0, 0, 0, 0, 0)  # created after the checkpoint
                    continue
                self._cut_chain(r, k, first)
            ring.occ_send[r] = 1
            ring.occ_done[r] = 1
        ring._occ_memo = None

    def _cut_chain(self, r: int, k: int, first: int) -> None:
        ring = self.ring
        head, base = ring.head, k * ring.P
        e, count, min_off = first, 0, ring.P
        while True:
            due, _loc, nx, _st, _f, _lv, tag = ring.tl.read(e)
            if tag != e & _TAG:
                raise StoreError(f"timer wheel: slot {k} links to entry {e}, which holds another entry")
            count += 1
            if due - base < min_off:
                min_off = due - base
            if nx < 0 or nx >= head:
                break
            e = nx
        ring.slots.write(r, base, first, e, count, min_off)

    def _wipe(self) -> None:
        """No checkpoint: the commit log replays everything, so start the wheel empty."""
        ring = self.ring
        self._reset()
        for f in list(ring.tl.files):
            ring.tl.drop(f)
        if not ring.slots.created:
            path = ring.slots.path
            ring.slots.close()
            os.unlink(path)
            ring.slots = SlotFile(path, ring.P, ring.N)
        ring.buckets.restore(None)
