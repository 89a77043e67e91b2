"""Timer wheel: exact behaviour on small, hand-written cases (virtual time, real files)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import contract as c
from sidecar.config import Settings
from sidecar.store import codec
from sidecar.store.log import CommitLog
from sidecar.store.mapped import HEADER_SIZE
from sidecar.store.partition import Counters, IngressRecord, PartitionStore, compile_rules
from sidecar.wheel import WheelScheduler, make_wheel
from sidecar.wheel.layout import DROPPED, SLOT_SIZE
from sidecar.wheel.recovery import occupied
from tests.unit.helpers.wheel_env import T0, Env, P


@pytest.fixture
def env(tmp_path: Path) -> Any:
    e = Env(tmp_path)
    e.w.due(T0, 1)  # start the reader at T0, as the event loop does
    yield e
    e.close()


def test_plan_keeps_the_requested_ms(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, 8192)
    list(log.recover(None, None))
    w = WheelScheduler(tmp_path, log, levels_ms=(1000, 5000))
    assert w.plan("at", 0, T0 + 12_345, T0) == (0, T0 + 12_345)
    assert w.plan("ms", 0, T0 + 7, T0) == (0, T0 + 7)
    assert w.plan("now", 0, T0, T0) == (0, T0)
    assert w.plan("retry", 0, T0 + 5, T0) == (0, T0 + 5)
    assert w.plan("level", 2, 0, T0) == (0, T0 + 5000)
    assert w.plan("level", 3, 0, T0) is None
    assert w.plan("at", 0, 1 << 62, T0) is None
    w.close()
    log.close()


def test_each_record_leaves_at_its_own_ms_never_early(env: Env) -> None:
    a = env.add(T0 + 23)
    b = env.add(T0 + 27)
    assert env.w.where(a) == env.w.where(b) == "slot"
    assert env.w.next_due_ms() == T0 + 23
    assert env.take(T0 + 22) == []
    assert env.take(T0 + 23) == [0]
    assert env.w.next_due_ms() == T0 + 27
    assert env.take(T0 + 26) == []
    assert env.take(T0 + 27) == [1]
    assert env.w.next_due_ms() is None


def test_a_slot_comes_out_by_due_ms_then_arrival(env: Env) -> None:
    for off in (5, 3, 5, 3, 9, 0, 5):
        env.add(T0 + 100 + off)
    assert env.take(T0 + 109, limit=2) == [5, 1]  # chunked: the pass resumes where it stopped
    assert env.take(T0 + 109, limit=3) == [3, 0, 2]
    assert env.take(T0 + 109) == [6, 4]


def test_limit_is_respected_and_the_pass_resumes(env: Env) -> None:
    for _ in range(25):
        env.add(T0 + 50)
    got = []
    while len(got) < 25:
        chunk = env.take(T0 + 50, limit=4)
        assert 0 < len(chunk) <= 4
        got += chunk
    assert got == list(range(25))


def test_late_arrivals_go_out_at_once_in_arrival_order(env: Env) -> None:
    env.add(T0 + 100)
    env.add(T0 + 100)
    assert env.take(T0 + 110, limit=1) == [0]  # the reader is inside slot 10 now
    late1 = env.add(T0 + 50)  # slot 5 is behind the reader
    late2 = env.add(T0 + 40)
    assert env.w.where(late1) == env.w.where(late2) == "late"
    assert env.w.next_due_ms() == T0 + 50
    assert env.take(T0 + 110) == [2, 3, 1]  # late chain first (arrival order), then the rest of slot 10


def test_a_late_chain_across_timer_log_files_is_read_in_chunks_and_never_early(env: Env) -> None:
    """The late chain is walked one timer-log file per call (8 entries per file here): a cancel
    inside it is skipped, ``limit`` cuts it anywhere and the pass resumes, and a clock stepped
    back stops it before the first entry not yet due; once all are acked the done cursor crosses
    the chain, releasing every body, and its emptied files go at the next checkpoint."""
    env.add(T0 + 100)
    assert env.take(T0 + 110, limit=1) == [0]
    refs = [env.add(T0 + 60 + i) for i in range(20)]  # ids 1..20, due T0+60 .. T0+79: all late
    assert {env.w.where(r) for r in refs} == {"late"}
    assert env.w.cancel(refs[4]) is True  # id 5
    got = []
    for _ in range(3):
        got += env.take(T0 + 70, limit=3)  # the clock stepped back below ids 12..20's due times
    assert got == [1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert env.take(T0 + 70) == [11]
    assert env.take(T0 + 70) == []
    assert env.take(T0 + 110, limit=4) == [12, 13, 14, 15]
    assert env.take(T0 + 110) == [16, 17, 18, 19, 20]
    assert env.w.pending() == {"wheel": 0, "bucket": 0}
    assert all(v == 0 for v in env.log.live.values())
    env.checkpoint()
    assert len(env.w.tl.files) <= 1


def test_same_slot_earlier_offset_after_its_pass_is_late(env: Env) -> None:
    env.add(T0 + 205)
    assert env.take(T0 + 206) == [0]
    r = env.add(T0 + 203)  # the pass for offset 5 already ran
    assert env.w.where(r) == "late"
    s = env.add(T0 + 208)  # offset 8: still ahead of the reader in this slot
    assert env.w.where(s) == "slot"
    assert env.take(T0 + 206) == [1]
    assert env.take(T0 + 207) == []
    assert env.take(T0 + 208) == [2]


def test_cancel_and_record(env: Env) -> None:
    a = env.add(T0 + 300)
    b = env.add(T0 + 300)
    rec = env.w.record(a)
    assert rec is not None and bytes(rec.id) == b"r0"
    assert env.w.cancel(a) is True
    assert env.w.cancel(a) is False
    assert env.w.record(a) is None
    assert env.w.where(a) == "slot"  # cancelled, not yet passed by the reader
    out = env.w.due(T0 + 300, 10)
    assert [ref for ref, _ in out] == [b]
    assert env.w.cancel(b) is False  # handed out
    assert env.w.record(b) is not None  # still needed for retries until acked
    env.w.ack(b)
    assert env.w.record(b) is None
    assert env.w.pending() == {"wheel": 0, "bucket": 0}
    assert all(v == 0 for v in env.log.live.values())


def test_out_of_order_acks_release_only_the_gap_free_prefix(env: Env) -> None:
    for _ in range(3):
        env.add(T0 + 400)
    out = env.w.due(T0 + 400, 10)
    refs = [r for r, _ in out]
    env.w.ack(refs[2])
    env.w.ack(refs[1])
    assert env.w.pending()["wheel"] == 3  # done waits for the first
    env.w.ack(refs[0])
    assert env.w.pending()["wheel"] == 0
    assert all(v == 0 for v in env.log.live.values())


def test_crash_cuts_chains_back_to_the_checkpoint_and_replays(env: Env) -> None:
    env.add(T0 + 500)
    env.add(T0 + 505)
    env.checkpoint()
    env.add(T0 + 500)  # after the checkpoint: in the slot file, but not covered
    env.add(T0 + 501)
    assert env.take(T0 + 500, limit=1) == [0]  # acked after the checkpoint
    refs = env.crash()
    assert len(refs) == 2  # the two records appended after the checkpoint come back by replay
    assert env.w.pending()["wheel"] == 4
    # record 0's ack survived in the file: not redelivered; everything else exactly once, in order
    assert env.take(T0 + 510) == [2, 3, 1]
    assert env.w.pending()["wheel"] == 0
    assert all(v == 0 for v in env.log.live.values())


def test_in_flight_records_are_redelivered_after_a_crash(env: Env) -> None:
    for _ in range(4):
        env.add(T0 + 600)
    out = env.w.due(T0 + 600, 10)
    env.w.ack(out[0][0])
    env.w.ack(out[2][0])
    env.checkpoint()
    env.crash()
    assert env.take(T0 + 600) == [1, 3]


def test_the_reader_position_survives_repeated_restarts(env: Env) -> None:
    """After a restart the reader starts again at the done cursor, behind where it was; records
    due in slots it had already passed must still go to the late chain after a second restart."""
    a = env.add(T0 + 100)
    env.add(T0 + 300)
    out = env.w.due(T0 + 400, 10)
    env.w.ack(out[1][0])  # the first one stays in flight: done stays in slot 10, the reader is at 40
    env.checkpoint()
    env.crash()
    assert env.ckpt is not None and env.w.state()["send"] == (T0 + 400) // P
    env.checkpoint()  # taken while the reader is back at slot 10
    assert env.ckpt["sched"]["send"] == (T0 + 400) // P
    late = env.add(T0 + 250)
    assert env.w.where(late) == "late"
    refs = env.crash()
    assert [env.w.where(r) for r in refs] == ["late"]
    assert env.take(T0 + 400) == [2, 0]  # the late chain first, then the in-flight one again (its slot)
    assert env.w.where(a) is None


def test_timer_log_files_are_deleted_once_consumed(env: Env) -> None:
    for i in range(40):
        env.add(T0 + 700 + i)
    assert len(env.w.tl.files) == 5
    env.take(T0 + 760)
    env.take(T0 + 800)
    env.checkpoint()
    assert len(env.w.tl.files) == 0  # head is on a file boundary: no file is needed
    assert env.w.disk_bytes() < 40 * 32 + env.w.slots.size() + 1024


def test_validate_drops_dangling_entries(env: Env) -> None:
    env.add(T0 + 900)
    env.add(T0 + 900)
    env.checkpoint()
    head = int(env.ckpt["log"]["head"])  # type: ignore[index]
    seg = next(iter(env.log.segments.values()))
    second = 64 + codec.peek_length(seg.buf, 64)
    env.w.close()
    env.log.close()
    with open(seg.path, "r+b") as f:  # disk damage inside the second record
        f.seek(second + 73)
        byte = f.read(1)
        f.seek(second + 73)
        f.write(bytes([byte[0] ^ 0xFF]))
    env.log = CommitLog(env.root, env.seg)
    env.w = WheelScheduler(env.root, env.log, **env.kw)
    env.w.restore(env.ckpt["sched"])  # type: ignore[index]
    live = {int(k): int(v) for k, v in env.ckpt["log"]["live"].items()}  # type: ignore[index]
    assert list(env.log.recover(head, live)) == []
    dropped = env.w.validate(head)
    assert [r for r, _pos, _why in dropped] == [1]
    assert "does not verify" in dropped[0][2]
    assert env.w.tl.read(1)[3] == DROPPED
    assert env.take(T0 + 900) == [0]
    assert env.w.pending()["wheel"] == 0
    assert env.log.live[0] == 1  # the damaged record's slot is not released: its segment stays for salvage


def test_a_damaged_restored_entry_is_dropped_at_its_first_read(env: Env) -> None:
    """Recovery does not read restored bodies; send checks each restored entry when it reaches
    it (late chain and slot) and drops a dangling one instead of handing it out."""
    env.take(T0 + 500)
    for due in (T0 + 100, T0 + 100, T0 + 900, T0 + 900):
        env.add(due)
    assert [env.w.where(r) for r in range(4)] == ["late", "late", "slot", "slot"]
    env.checkpoint()
    head = int(env.ckpt["log"]["head"])  # type: ignore[index]
    seg = next(iter(env.log.segments.values()))
    starts = [64]
    for _ in range(3):
        starts.append(starts[-1] + codec.peek_length(seg.buf, starts[-1]))
    env.w.close()
    env.log.close()
    with open(seg.path, "r+b") as f:  # disk damage inside records 1 (late) and 3 (slot)
        for off in (starts[1], starts[3]):
            f.seek(off + codec.HEAD_SIZE + 1)
            byte = f.read(1)
            f.seek(off + codec.HEAD_SIZE + 1)
            f.write(bytes([byte[0] ^ 0xFF]))
    env.log = CommitLog(env.root, env.seg)
    env.w = WheelScheduler(env.root, env.log, **env.kw)
    env.w.restore(env.ckpt["sched"])  # type: ignore[index]
    live = {int(k): int(v) for k, v in env.ckpt["log"]["live"].items()}  # type: ignore[index]
    assert list(env.log.recover(head, live)) == []
    reported: list[tuple[int, int, str]] = []
    env.w.arm(head, lambda ref, loc, why: reported.append((ref, loc, why)))
    assert reported == [] and env.w.tl.read(1)[3] == env.w.tl.read(3)[3] == 0, "open reads no restored body"
    assert env.take(T0 + 1000) == [0, 2]
    assert [(r, loc) for r, loc, _why in reported] == [(1, starts[1]), (3, starts[3])]
    assert all("does not verify" in why for _r, _loc, why in reported)
    assert env.w.tl.read(1)[3] == env.w.tl.read(3)[3] == DROPPED
    assert env.w.pending()["wheel"] == 0
    assert env.log.live[0] == 2  # the damaged records' slots are not released: the segment stays for salvage


def test_next_due_is_none_when_empty_and_the_reader_follows_the_clock(env: Env) -> None:
    assert env.w.next_due_ms() is None
    assert env.take(T0 + 3_600_000) == []
    r = env.add(T0 + 3_600_000 + 1_500)  # within the window of the new reader position
    assert env.w.where(r) == "slot"
    assert env.take(T0 + 3_601_500) == [0]


def test_make_wheel_from_settings(tmp_path: Path) -> None:
    s = Settings()
    f = make_wheel(s)
    log = CommitLog(tmp_path, 1 << 20)
    list(log.recover(None, None))
    w = f(tmp_path, log)
    assert (w.P, w.N, w.width) == (s.wheel_precision_ms, s.wheel_window_ms // s.wheel_precision_ms, s.bucket_width_ms)
    assert w.N == 360_000 and w.slots.size() == 64 + 360_000 * 32
    w.close()
    log.close()
    with pytest.raises(ValueError, match="bucket width"):
        make_wheel(Settings(bucket_width_ms=2 * s.wheel_window_ms))
    with pytest.raises(ValueError, match="multiple of the precision"):
        make_wheel(Settings(wheel_window_ms=1005))


# -- the wheel inside a PartitionStore --------------------------------------------------------------
def _store(root: Path, counters: Counters) -> PartitionStore:
    rules = compile_rules(
        "in", "dlq", (1000, 5000), max_delay_ms=400 * 86_400_000, retry_ladder_ms=(1000,), max_retries=3,
        max_record_bytes=4000, allowlist=(),
    )

    def factory(d: Path, lg: CommitLog) -> WheelScheduler:
        return WheelScheduler(d, lg, precision_ms=10, window_ms=60_000, bucket_width_ms=30_000, levels_ms=(1000, 5000))

    st = PartitionStore(
        root, "in", 0, rules=rules, scheduler_name="wheel", make_scheduler=factory, segment_bytes=8192,
        cancel_horizon_ms=60_000, counters=counters,
    )
    st.open()
    return st


def _ingress(offset: int, headers: list[tuple[str, bytes | None]], ts: int = T0) -> IngressRecord:
    return IngressRecord("in", 0, offset, ts, b"k", b"v%d" % offset, [(c.TARGET_TOPIC, b"out"), *headers])


def test_partition_store_with_the_wheel(tmp_path: Path) -> None:
    counters = Counters()
    st = _store(tmp_path, counters)
    st.ingest(_ingress(0, [(c.DELAY_MS, b"1234"), (c.ID, b"a")]), T0)
    st.ingest(_ingress(1, [(c.DELIVER_AT, str(T0 + 86_400_000 * 365).encode()), (c.ID, b"far")]), T0)
    st.ingest(_ingress(2, [(c.LEVEL, b"2"), (c.ID, b"b")]), T0)
    st.ingest(_ingress(3, [(c.DELAY_MS, b"100"), (c.ID, b"gone")]), T0)
    st.ingest(_ingress(4, [(c.CANCEL, b"gone")]), T0)
    assert counters.cancelled == 1
    assert st.pending() == {"wheel": 3, "bucket": 1}
    st.checkpoint()
    st.close()
    st = _store(tmp_path, counters)  # graceful restart
    assert st.pending() == {"wheel": 3, "bucket": 1}
    got = []
    for now in (T0 + 1233, T0 + 1234, T0 + 5000):
        for ref, rec in st.sched.due(now, 100):
            assert rec.due_ms <= now
            got.append((bytes(rec.id), rec.due_ms - T0))
            from sidecar.store.idindex import id_hash

            st.delivered(ref, id_hash(rec.id))
    assert got == [(b"a", 1234), (b"b", 5000)]
    assert st.sched.next_due_ms() is not None
    st.checkpoint()
    st.close()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3000), st.data())
def test_occupied_finds_exactly_the_slots_with_a_count(n: int, data: st.DataObject) -> None:
    """Recovery's strided scan against the plain loop it replaced: every slot whose u32 count
    (any of its four bytes) is not zero, whatever the other fields hold."""
    buf = bytearray(HEADER_SIZE + n * SLOT_SIZE)
    counts = data.draw(st.dictionaries(st.integers(0, n - 1), st.integers(0, 2**32 - 1), max_size=50))
    noise = data.draw(st.dictionaries(st.integers(0, n - 1), st.integers(-(2**63), 2**63 - 1), max_size=50))
    for r, v in noise.items():
        struct.pack_into("<qqq", buf, HEADER_SIZE + r * SLOT_SIZE, v, v, v)
        struct.pack_into("<HH", buf, HEADER_SIZE + r * SLOT_SIZE + 28, v & 0xFFFF, 0xFFFF)
    for r, v in counts.items():
        struct.pack_into("<I", buf, HEADER_SIZE + r * SLOT_SIZE + 24, v)
    assert occupied(buf, n) == sorted(r for r, v in counts.items() if v)
