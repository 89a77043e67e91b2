"""Property test of the timer wheel against a reference model, on virtual time.

Any interleaving of inserts (due in the past, now, the same slot, near, beyond the window, far
future, ties), cancels, clock advances with ``due(now, limit)``, acks (some held in flight for a
while), checkpoints and crashes is driven through a ``WheelScheduler`` over a real ``CommitLog`` in
a temporary directory. A crash closes everything without flushing and reopens it the way
``PartitionStore.open`` does: restore the scheduler from the last checkpoint, recover the log from
the checkpointed head and replay what follows through ``add`` (MESSAGE) and ``cancel`` (CANCEL).

Checked against the model:

- never early: no record handed out with ``due_ms > now``;
- exactly the right set: every record not cancelled is delivered; a cancelled one never after its
  cancel; redeliveries only of records that were in flight at a crash or acked after the last
  checkpoint (at-least-once); nothing left pending at the end, every live count back to zero;
- order: within one process lifetime, first deliveries come out by (due ms, arrival), except a
  record added after the other was handed out, or two records that both went through the late
  chain (already due for a slot the reader had passed: handed out in arrival order);
- promptness: when ``due`` returns fewer than ``limit``, no due record is left in a slot or the
  late chain (except behind a bucket not yet linked in: reading waits for the bucket);
- ``cancel`` returns True exactly for pending records not yet handed out, ``record`` returns the
  stored record while it is not done.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.store import codec
from sidecar.store.log import CommitLog
from sidecar.wheel import WheelScheduler

T0 = 1_700_000_000_000
P, WINDOW, WIDTH = 10, 2_000, 1_000
SEG = 16 * 1024


class MockClock:
    """Virtual time that refuses to go backwards."""

    def __init__(self, t: int) -> None:
        self.t = t

    def advance(self, dt: int) -> int:
        if dt < 0:
            raise AssertionError("the clock must not go backwards")
        self.t += dt
        return self.t

    def set(self, t: int) -> int:
        return self.advance(t - self.t)


@dataclass
class M:
    id: int
    due: int
    arrival: int
    add_op: int
    ref: int
    state: str = "pending"  # pending | cancelled | acked
    cancel_op: int = 1 << 60
    held: bool = False  # handed out in this lifetime, not acked
    handed_op: int = -1
    deliveries: int = 0
    dup_ok: bool = False  # may be delivered again (in flight at a crash, or acked after the checkpoint)
    acked_in_ckpt: bool = False
    ever_handed: bool = False
    late: bool = False


@dataclass
class Rig:
    root: Path
    kw: dict[str, Any]
    p: int = P
    window: int = WINDOW
    width: int = WIDTH
    clock: MockClock = field(default_factory=lambda: MockClock(T0))
    ckpt: dict[str, Any] | None = None
    op: int = 0
    life: int = 0

    def __post_init__(self) -> None:
        self.log = CommitLog(self.root, SEG)
        list(self.log.recover(None, None))
        self.sched = self._new_sched()
        self.sched.restore(None)
        self.recs: dict[int, M] = {}
        self.by_ref: dict[int, int] = {}
        self.order: list[M] = []  # first deliveries in this lifetime
        self.next_id = 0
        self.max_limit_seen = 0

    def _new_sched(self) -> WheelScheduler:
        return WheelScheduler(
            self.root, self.log, precision_ms=self.p, window_ms=self.window, bucket_width_ms=self.width, **self.kw
        )

    # -- operations ---------------------------------------------------------------------------
    def _append(self, rtype: int, due: int, rid: bytes) -> int:
        return self.log.append(
            codec.head(
                rtype=rtype, due_ms=due, enqueue_ms=self.clock.t, src_offset=self.next_id, src_partition=0,
                target_partition=-1, retry_count=0, level=0,
            ),
            rid, b"t" if rtype == codec.MESSAGE else b"", None,
            b"v" * (self.next_id % 7) if rtype == codec.MESSAGE else None, b"",
        )

    def add(self, due: int) -> None:
        self.op += 1
        i = self.next_id
        plan = self.sched.plan("at", 0, due, self.clock.t)
        assert plan == (0, due)
        pos = self._append(codec.MESSAGE, due, str(i).encode())
        self.next_id += 1
        ref = self.sched.add(due, 0, pos)
        m = M(i, due, i, self.op, ref)
        self.recs[i] = m
        self.by_ref[ref] = i
        assert self.sched.where(ref) in ("slot", "late", "bucket")

    def cancel(self, i: int) -> None:
        self.op += 1
        m = self.recs[i]
        self.log.release(self._append(codec.CANCEL, self.clock.t, str(i).encode()))
        got = self.sched.cancel(m.ref)
        if m.state == "pending" and not m.held:
            assert got, f"cancel of pending record {i} refused"
        elif m.state == "acked" and m.dup_ok:
            pass  # acked after the last checkpoint and then a crash: either answer is right
        else:
            assert not got, f"cancel of record {i} in state {m.state} (held={m.held}) accepted"
        if got:
            m.state, m.cancel_op = "cancelled", self.op
            assert self.sched.record(m.ref) is None

    def check_record(self, m: M) -> None:
        rec = self.sched.record(m.ref)
        if m.state == "pending":
            assert rec is not None and bytes(rec.id) == str(m.id).encode() and rec.due_ms == m.due
        elif m.state == "cancelled" or (m.state == "acked" and not m.dup_ok):
            assert rec is None or bytes(rec.id) != str(m.id).encode()

    def tick(self, dt: int, limit: int, hold_mask: int, auto_ckpt: bool) -> None:
        if auto_ckpt:
            self.checkpoint()
        now = self.clock.advance(dt)
        self.op += 1
        out = self.sched.due(now, limit)
        assert len(out) <= limit
        for n, (ref, rec) in enumerate(out):
            i = int(bytes(rec.id))
            m = self.recs[i]
            assert rec.due_ms == m.due and rec.due_ms <= now, f"record {i} due {rec.due_ms} handed out at {now}"
            assert m.ref == ref, f"record {i} handed out under ref {ref}, expected {m.ref}"
            assert not m.held, f"record {i} handed out twice in one lifetime"
            assert m.state != "cancelled", f"cancelled record {i} delivered"
            if m.state == "acked":
                assert m.dup_ok, f"record {i} delivered again although its ack was checkpointed"
            m.late = self.sched.where(ref) == "late"
            m.deliveries += 1
            m.state, m.held, m.handed_op = "pending", True, self.op
            if not m.ever_handed:
                self._check_order(m)
                self.order.append(m)
            m.ever_handed = True
            if not (hold_mask >> n) & 1:
                self.ack(m)
        if len(out) < limit:
            # reading never starts a slot a bucket still has records for (they would come out late)
            blocked = min(
                (b.start for b in self.sched.buckets.buckets.values() if b.loaded < b.size), default=1 << 62
            )
            for m in self.recs.values():
                if m.state == "pending" and not m.held and m.due <= now and m.due // self.p < blocked // self.p:
                    assert self.sched.where(m.ref) == "bucket", (
                        f"record {m.id} (due {m.due - T0}, in {self.sched.where(m.ref)}) not handed out at "
                        f"{now - T0} although due() returned {len(out)} < {limit}"
                    )

    def _check_order(self, b: M) -> None:
        for a in self.order:
            if (b.due, b.arrival) < (a.due, a.arrival) and b.add_op < a.handed_op and not (a.late and b.late):
                raise AssertionError(
                    f"record {b.id} (due {b.due - T0}) delivered after record {a.id} (due {a.due - T0}) "
                    f"although it was added before that one was handed out (late: {a.late}, {b.late})"
                )

    def ack(self, m: M) -> None:
        self.sched.ack(m.ref)
        m.held = False
        m.state = "acked"

    def ack_held(self, k: int) -> None:
        held = [m for m in self.recs.values() if m.held]
        if held:
            self.ack(held[k % len(held)])

    def checkpoint(self) -> None:
        self.log.flush()
        self.sched.flush()
        doc = {"log": self.log.state(), "sched": self.sched.state()}
        self.ckpt = orjson.loads(orjson.dumps(doc))  # must be JSON-able
        self.log.reclaim()
        self.sched.reclaim()
        for m in self.recs.values():
            if m.state == "acked":
                m.acked_in_ckpt = True
                m.dup_ok = False

    def crash(self) -> None:
        self.sched.close()
        self.log.close()
        self.life += 1
        self.order = []
        for m in self.recs.values():
            if m.held:  # in flight: delivered again
                m.held = False
                m.dup_ok = True
            elif m.state == "acked" and not m.acked_in_ckpt:
                m.dup_ok = True
        self.log = CommitLog(self.root, SEG)
        self.sched = self._new_sched()
        ck = self.ckpt
        self.sched.restore(ck["sched"] if ck else None)
        head = int(ck["log"]["head"]) if ck else None
        live = {int(k): int(v) for k, v in ck["log"]["live"].items()} if ck else None
        for pos, rec in self.log.recover(head, live):
            i = int(bytes(rec.id))
            m = self.recs[i]
            if rec.rtype == codec.CANCEL:
                if self.sched.cancel(m.ref):
                    assert m.state != "acked" or m.dup_ok
                    m.state = "cancelled"
                self.log.release(pos)
                continue
            ref = self.sched.add(rec.due_ms, rec.level, pos)
            self.by_ref[ref] = i
            m.ref = ref
            m.add_op = self.op
            if m.state == "acked":  # re-added: pending again (a duplicate, allowed)
                assert m.dup_ok
                m.state = "pending"
        if head is not None:
            assert self.sched.validate(head) == []
        # records whose ack was lost stay pending; ones whose ack survived in the file stay done
        for m in self.recs.values():
            rec = self.sched.record(m.ref) if m.state == "acked" and m.dup_ok else None
            if rec is not None and bytes(rec.id) == str(m.id).encode():
                m.state = "pending"

    def drain(self) -> None:
        for m in list(self.recs.values()):
            if m.held:
                self.ack(m)
        for _ in range(100_000):
            self.checkpoint()
            nxt = self.sched.next_due_ms()
            if nxt is None:
                break
            self.clock.set(max(self.clock.t, nxt))
            self.tick(0, 1000, 0, False)
        else:
            raise AssertionError("did not drain")
        self.tick(self.p, 1000, 0, True)  # past the end of the last slot: the reader leaves it
        self.checkpoint()
        self.checkpoint()

    def final_checks(self) -> None:
        for m in self.recs.values():
            if m.state == "cancelled":
                continue
            assert m.state == "acked", f"record {m.id} (due {m.due - T0}) never delivered: {m.state}"
            assert m.deliveries >= 1
        assert self.sched.pending() == {"wheel": 0, "bucket": 0}
        assert all(v == 0 for v in self.log.live.values()), self.log.live
        assert all(b.live == 0 for b in self.sched.buckets.buckets.values())
        assert not self.sched.buckets.buckets, "fully delivered buckets must be deleted"
        assert len(self.sched.tl.files) <= 1, "consumed timer-log files must be deleted"

    def close(self) -> None:
        self.sched.close()
        self.log.close()


# -- strategies -----------------------------------------------------------------------------------
KINDS = ["past", "now", "slot", "near", "edge", "beyond", "far", "tie"]


def _delta(kind: str, x: int, rig: Rig) -> int:
    if kind == "past":
        return -1 - x % 5_000
    if kind == "now":
        return 0
    if kind == "slot":
        return x % rig.p
    if kind == "near":
        return x % rig.window
    if kind == "edge":
        return rig.window - 3 + x % 6
    if kind == "beyond":
        return rig.window + x % 20_000
    if kind == "far":
        return 10**6 + (x % 1000) * 10**6
    if rig.recs:  # tie: the due time of an earlier record
        return rig.recs[x % len(rig.recs)].due - rig.clock.t
    return 0


ops = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(KINDS), st.integers(0, 10**9)),
    st.tuples(st.just("add"), st.sampled_from(KINDS), st.integers(0, 10**9)),
    st.tuples(st.just("add"), st.sampled_from(["slot", "near", "tie"]), st.integers(0, 10**9)),
    st.tuples(st.just("cancel"), st.integers(0, 10**6)),
    st.tuples(
        st.just("tick"), st.sampled_from([0, 1, 3, 7, 10, 11, 50, 500, 999, 1999, 5_000, 60_000]),
        st.sampled_from([1, 2, 5, 1000]), st.integers(0, 255),
    ),
    st.tuples(
        st.just("tick"), st.sampled_from([1, 4, 10]), st.sampled_from([1, 3, 1000]), st.integers(0, 255),
    ),
    st.tuples(st.just("ack"), st.integers(0, 10**6)),
    st.tuples(st.just("ckpt")),
    st.tuples(st.just("crash")),
)


def run(
    script: list[tuple[Any, ...]],
    auto_ckpt: bool,
    kw: dict[str, Any],
    geometry: tuple[int, int, int] = (P, WINDOW, WIDTH),
) -> None:
    root = Path(tempfile.mkdtemp(prefix="wheel-prop-"))
    rig = Rig(root, kw, *geometry)
    try:
        rig.sched.due(rig.clock.t, 1)  # the loop calls due() from the start
        for op in script:
            kind = op[0]
            if kind == "add":
                rig.add(rig.clock.t + _delta(op[1], op[2], rig))
            elif kind == "cancel" and rig.recs:
                rig.cancel(op[1] % len(rig.recs))
            elif kind == "tick":
                rig.tick(op[1], op[2], op[3], auto_ckpt)
            elif kind == "ack":
                rig.ack_held(op[1])
            elif kind == "ckpt":
                rig.checkpoint()
            elif kind == "crash":
                rig.crash()
            for m in list(rig.recs.values())[-3:]:
                rig.check_record(m)
        rig.drain()
        rig.final_checks()
    finally:
        rig.close()
        shutil.rmtree(root, ignore_errors=True)


SMALL = {"entries_per_file": 16, "load_batch": 7, "scan_factor": 100_000}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=80), st.booleans())
def test_wheel_matches_model(script: list[tuple[Any, ...]], auto_ckpt: bool) -> None:
    run(script, auto_ckpt, SMALL)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=100, max_size=250))
def test_wheel_matches_model_long_runs(script: list[tuple[Any, ...]]) -> None:
    run(script, True, SMALL)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=80), st.booleans())
def test_wheel_matches_model_bucket_as_wide_as_the_window(script: list[tuple[Any, ...]], auto_ckpt: bool) -> None:
    """The default ratio (bucket width = window): a bucket loads only when the reader reaches it."""
    run(script, auto_ckpt, SMALL, (10, 1_000, 1_000))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=80), st.booleans())
def test_wheel_matches_model_coarse_slots(script: list[tuple[Any, ...]], auto_ckpt: bool) -> None:
    """250 ms slots: many distinct due ms per slot, one pass each."""
    run(script, auto_ckpt, SMALL, (250, 5_000, 2_500))


def test_many_records_one_slot_mixed_offsets_and_crash() -> None:
    """A fixed script: 300 records over all ten ms of one slot, interleaved with ties, handed out
    in small chunks with a crash in the middle of the slot."""
    script: list[tuple[Any, ...]] = [("add", "slot", x * 7919) for x in range(300)]
    script += [("tick", 11, 17, 0b101), ("ckpt",), ("tick", 0, 23, 0b11), ("crash",), ("tick", 1, 40, 0)]
    run(script, False, SMALL)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=80), st.booleans())
def test_wheel_matches_model_chain_walk_only(script: list[tuple[Any, ...]], auto_ckpt: bool) -> None:
    """No slot index (as for slots over ``index_max``): every pass walks the slot's chain."""
    run(script, auto_ckpt, {**SMALL, "index_max": 0}, (250, 5_000, 2_500))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=80), st.booleans())
def test_wheel_matches_model_index_outgrown(script: list[tuple[Any, ...]], auto_ckpt: bool) -> None:
    """A tiny ``index_max``: slots start indexed and switch to chain walks mid-pass as they grow."""
    run(script, auto_ckpt, {**SMALL, "index_max": 3}, (250, 5_000, 2_500))
