"""CommitLog: append/read, segments, recovery from a checkpoint, torn tails, edge cases, reclaim."""

from __future__ import annotations

import os
import random
import shutil
import threading
from pathlib import Path

import pytest

from sidecar.store import codec
from sidecar.store.log import CommitLog, CorruptSegment
from sidecar.store.mapped import HEADER_SIZE, GeometryMismatch, StoreError, deferred_disposal
from tests.infra import needs, unavailable
from tests.unit.helpers.pages import needs_populate, resident

SEG = 4096
DATA = SEG - HEADER_SIZE  # 4032 = 7 * 576


def append(log: CommitLog, n: int, value_len: int = 100, rtype: int = codec.MESSAGE) -> int:
    return log.append(
        codec.head(
            rtype=rtype, due_ms=1000 + n, enqueue_ms=n, src_offset=n, src_partition=0, target_partition=-1,
            retry_count=0, level=1,
        ),
        b"r", b"t", None, bytes([n % 251 + 1]) * value_len, b"",
    )


def size_of(value_len: int) -> int:
    return codec.encoded_size(1, 1, 0, value_len, 0)


def reopen(d: Path, state: dict[str, object] | None = None, seg: int = SEG) -> tuple[CommitLog, list[int]]:
    log = CommitLog(d, seg)
    head = int(state["head"]) if state else None  # type: ignore[call-overload]
    live = {int(k): int(v) for k, v in state["live"].items()} if state else None  # type: ignore[attr-defined]
    got = [pos for pos, _rec in log.recover(head, live)]
    return log, got


def test_append_read_roll_and_positions(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    positions = [append(log, i, value_len=300) for i in range(40)]
    assert positions == sorted(positions)
    for i, pos in enumerate(positions):
        rec = log.read(pos, verify=True)
        assert rec.src_offset == i and bytes(rec.value or b"") == bytes([i % 251 + 1]) * 300
        off = pos % SEG
        assert off >= HEADER_SIZE and off + rec.length <= SEG, "a record never straddles segments"
    assert len(log.segments) == len({p // SEG for p in positions}) > 1
    assert log.pending_records() == 40
    log.close()
    log, replayed = reopen(tmp_path)
    assert replayed == positions, "no checkpoint: recovery replays every segment"
    log.close()


def test_record_too_big_for_a_segment(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    with pytest.raises(StoreError, match="does not fit"):
        append(log, 0, value_len=SEG)


def test_recovery_starts_at_the_checkpoint_and_never_reads_behind_it(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    before = [append(log, i) for i in range(30)]
    state = log.state()
    after = [append(log, i) for i in range(30, 45)]
    log.close()
    # Damage a record behind the checkpointed head: recovery does not scan history, so it neither
    # notices nor pays for it (the scheduler's validation of pending entries does; see the
    # partition store tests).
    seg = tmp_path / "log" / f"{(before[3] // SEG) * SEG:020d}.log"
    raw = bytearray(seg.read_bytes())
    raw[before[3] % SEG + 40] ^= 0xFF
    seg.write_bytes(raw)
    log, replayed = reopen(tmp_path, state)
    assert replayed == after
    assert log.head == after[-1] + size_of(100)
    assert log.pending_records() == 45
    log.close()


@pytest.mark.parametrize("fill", ["zeros", "garbage"])
def test_torn_tail_at_every_byte_of_the_last_records(tmp_path: Path, fill: str) -> None:
    """Cut the active segment at every byte offset of its last three records (the bytes after the
    cut never reached the file: zeros in a preallocated file, or stale garbage); recovery keeps
    exactly the records that are whole, zeroes the rest and reports it, and appends continue there."""
    src = tmp_path / "src"
    rng = random.Random(7)
    log, _ = reopen(src, seg=1 << 16)
    recs = [(append(log, i, value_len=rng.randint(0, 150)), 0) for i in range(25)]
    recs = [(pos, log.read(pos).length) for pos, _ in recs]
    ck = {"head": recs[10][0], "live": {"0": 10}}  # a checkpoint in the middle: replay from there
    log.close()
    seg_name = f"{0:020d}.log"
    pristine = (src / "log" / seg_name).read_bytes()
    first_cut = recs[-3][0]
    end = recs[-1][0] + recs[-1][1]
    for cut in range(first_cut, end):
        d = tmp_path / f"cut-{fill}"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        torn = bytearray(pristine)
        if fill == "zeros":
            torn[cut:] = bytes(len(torn) - cut)
        else:
            torn[cut:end] = rng.randbytes(end - cut)
        (d / "log" / seg_name).write_bytes(torn)
        whole = [pos for pos, n in recs[10:] if torn[pos : pos + n] == pristine[pos : pos + n]]
        log, replayed = reopen(d, ck, seg=1 << 16)
        assert replayed == whole, f"cut at {cut}"
        first_bad = next((pos for pos, _ in recs[10:] if pos not in whole), None)
        if first_bad is None:
            assert log.truncations == [] and log.head == end
        else:
            assert log.head == first_bad
            last_nonzero = len(torn.rstrip(b"\x00"))
            if last_nonzero > first_bad:
                assert [(t.position, t.dropped_bytes) for t in log.truncations] == [
                    (first_bad, last_nonzero - first_bad)
                ], f"cut at {cut}: reports what it dropped"
            assert (d / "log" / seg_name).read_bytes()[first_bad:] == bytes(len(torn) - first_bad), "zeroed"
        assert log.pending_records() == 10 + len(whole)
        pos = append(log, 999)
        assert pos == log.head - size_of(100) and pos == (first_bad if first_bad is not None else end)
        log.close()
        log, replayed = reopen(d, ck, seg=1 << 16)
        assert replayed == [*whole, pos] and log.truncations == []
        log.close()


def test_torn_tail_finds_stale_records_beyond_a_hole_and_reads_no_hole(tmp_path: Path) -> None:
    """The search for non-zero bytes behind the last record reads only the ranges the file system
    says were written: stale records far behind a hole are still found and zeroed, and the
    unwritten rest of a big segment is neither read nor allocated."""
    seg_bytes = 4 << 20
    log, _ = reopen(tmp_path, seg=seg_bytes)
    positions = [append(log, i) for i in range(20)]
    ck = {"head": positions[5], "live": {"0": 5}}
    stale_at = 3 << 20  # a whole, valid record (CRC and all) far behind the end, behind a hole
    stale = bytes(log.segments[0].buf[positions[1] : positions[2]])
    log.close()
    path = tmp_path / "log" / f"{0:020d}.log"
    with open(path, "r+b") as f:
        f.seek(stale_at)
        f.write(stale)
    blocks = os.stat(path).st_blocks
    log, replayed = reopen(tmp_path, ck, seg=seg_bytes)
    assert replayed == positions[5:]
    end = positions[-1] + size_of(100)
    dropped = stale_at + len(stale.rstrip(b"\0")) - end
    assert [(t.position, t.dropped_bytes) for t in log.truncations] == [(end, dropped)]
    log.close()
    assert path.read_bytes()[end:] == bytes(seg_bytes - end), "the stale record is zeroed"
    if os.stat(path).st_blocks > blocks:
        pytest.fail("the hole between the end and the stale record was filled in")
    # A clean tail: nothing to drop, and the megabytes of hole behind it are not read.
    log, replayed = reopen(tmp_path, ck, seg=seg_bytes)
    assert replayed == positions[5:] and log.truncations == []
    log.close()
    assert os.stat(path).st_blocks <= blocks


def test_record_ending_exactly_at_the_segment_end(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    value_len = 576 - 74  # 7 records of 576 bytes fill the 4032 data bytes of a segment exactly
    assert size_of(value_len) * 7 == DATA
    positions = [append(log, i, value_len) for i in range(7)]
    assert log.head == SEG, "the head sits exactly at the end of segment 0; segment 1 does not exist yet"
    assert set(log.segments) == {0}
    state = log.state()
    log.flush()
    log.close()
    # 1. a checkpoint names that head (a graceful stop or a kill right after the checkpoint)
    log, replayed = reopen(tmp_path, state)
    assert replayed == []
    pos = append(log, 7)
    assert pos == SEG + HEADER_SIZE
    log.close()
    # 2. recovery without a checkpoint walks over the exact end into the next segment
    log, replayed = reopen(tmp_path)
    assert replayed == [*positions, pos]
    log.close()


def test_head_at_segment_end_after_everything_was_reclaimed(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    positions = [append(log, i, 576 - 74) for i in range(7)]
    for p in positions:
        log.release(p)
    state = log.state()
    assert log.reclaim() == 1, "segment 0 is sealed (the head is past it) and empty"
    assert not list((tmp_path / "log").glob("*.log"))
    log.close()
    log, replayed = reopen(tmp_path, state)
    assert replayed == []
    assert append(log, 7) == SEG + HEADER_SIZE, "positions keep growing; they are never reused"
    log.close()


def test_roll_right_before_a_crash(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    positions = [append(log, i, 300) for i in range(11)]  # 10 * 376 fill segment 0; the 11th rolls
    last = positions[-1]
    assert last // SEG == 1 and (last - SEG) == HEADER_SIZE, "the last record opened segment 1"
    state0 = {"head": HEADER_SIZE, "live": {}}
    log.close()
    seg1 = tmp_path / "log" / f"{SEG:020d}.log"
    pristine = seg1.read_bytes()
    # a) killed after creating segment 1 and before writing the record into it (or segment 1 was
    # created ahead and never appended to): it holds nothing and goes; the next append rolls again
    end0 = positions[-2] + size_of(300)
    seg1.write_bytes(pristine[:HEADER_SIZE] + bytes(SEG - HEADER_SIZE))
    log, replayed = reopen(tmp_path, state0)
    assert replayed == positions[:-1] and log.head == end0 and log.truncations == []
    assert sorted(log.segments) == [0] and not seg1.exists()
    assert append(log, 99, 300) == last
    log.close()
    # b) killed between ftruncate and the header write: an all-zero file
    # (the file is discarded; the head stays in segment 0 and the next append rolls again)
    seg1.write_bytes(bytes(SEG))
    log, replayed = reopen(tmp_path, state0)
    assert replayed == positions[:-1] and log.head == end0 and sorted(log.segments) == [0]
    assert append(log, 99, 300) == last
    log.close()
    # c) killed between open(O_CREAT) and ftruncate: an empty file
    seg1.write_bytes(b"")
    log, replayed = reopen(tmp_path, state0)
    assert replayed == positions[:-1] and log.head == end0
    assert append(log, 99, 300) == last
    log.close()


def test_checkpoint_head_in_a_deleted_segment(tmp_path: Path) -> None:
    """With fsync=none and a power loss the file system can be ahead of the checkpoint: the segment
    the checkpoint's head points into may be gone. Recovery continues at the next one."""
    log, _ = reopen(tmp_path)
    positions = [append(log, i, 300) for i in range(30)]
    state = {"head": positions[2], "live": {"0": 2}}
    log.close()
    (tmp_path / "log" / f"{0:020d}.log").unlink()
    log, replayed = reopen(tmp_path, state)
    assert replayed == [p for p in positions if p >= SEG]
    log.close()


def test_corruption_inside_a_sealed_segment_refuses_to_start(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    positions = [append(log, i, 300) for i in range(30)]
    log.close()
    seg0 = tmp_path / "log" / f"{0:020d}.log"
    raw = bytearray(seg0.read_bytes())
    raw[positions[5] % SEG + 100] ^= 0x01
    seg0.write_bytes(raw)
    log = CommitLog(tmp_path, SEG)
    with pytest.raises(CorruptSegment, match=r"sealed segment.*salvage"):
        list(log.recover(None, None))
    log.close()
    # a stray non-zero byte in the unused tail of a sealed segment is corruption too
    raw = bytearray(seg0.read_bytes())
    raw[positions[5] % SEG + 100] ^= 0x01
    raw[-1] = 7
    seg0.write_bytes(raw)
    log = CommitLog(tmp_path, SEG)
    with pytest.raises(CorruptSegment):
        list(log.recover(None, None))
    log.close()


def test_geometry_mismatch_names_both_values(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    append(log, 0)
    log.close()
    with pytest.raises(StoreError, match=r"4096.*8192|8192.*4096"):
        CommitLog(tmp_path, 8192)
    # same size, different recorded geometry (a file copied in from another store)
    seg0 = tmp_path / "log" / f"{0:020d}.log"
    other = tmp_path / "other"
    olog, _ = reopen(other, seg=SEG * 2)
    olog.close()
    (tmp_path / "log" / f"{SEG * 2 * 0:020d}.log").write_bytes(
        (other / "log" / f"{0:020d}.log").read_bytes()[:SEG]
    )
    with pytest.raises(GeometryMismatch, match=r"\(8192, 0\).*\(4096, 0\)"):
        CommitLog(tmp_path, SEG)
    seg0.write_bytes(b"X" * SEG)
    with pytest.raises(StoreError, match="header is corrupt"):
        CommitLog(tmp_path, SEG)


def test_live_counts_and_reclaim(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    positions = [append(log, i, 300) for i in range(25)]  # segments 0, 1, 2
    by_seg: dict[int, list[int]] = {}
    for p in positions:
        by_seg.setdefault(p // SEG, []).append(p)
    assert sorted(by_seg) == [0, 1, 2]
    for p in by_seg[1]:
        log.release(p)
    for p in by_seg[0][:-1]:
        log.release(p)
    assert log.reclaim() == 1 and sorted(log.segments) == [0, 2], "only the empty sealed segment goes"
    log.release(by_seg[0][-1])
    for p in by_seg[2]:
        log.release(p)
    assert log.reclaim() == 1 and sorted(log.segments) == [2], "the active segment stays"
    assert log.pending_records() == 0
    state = log.state()
    log.close()
    log, replayed = reopen(tmp_path, state)
    assert replayed == [] and sorted(log.segments) == [2] and log.pending_records() == 0
    log.close()
    # Releasing a position whose segment is gone (a dangling scheduler entry) is a no-op.
    log, _ = reopen(tmp_path, state)
    log.release(0)
    assert 0 not in log.live
    log.close()


def test_recovery_deletes_segments_the_checkpoint_says_are_empty(tmp_path: Path) -> None:
    """A kill between the checkpoint write and reclaim leaves empty sealed segments behind."""
    log, _ = reopen(tmp_path)
    positions = [append(log, i, 300) for i in range(25)]
    for p in positions:
        if p // SEG == 0:
            log.release(p)
    state = log.state()
    log.close()
    log, _ = reopen(tmp_path, state)
    assert sorted(log.segments) == [1, 2]
    assert not (tmp_path / "log" / f"{0:020d}.log").exists()
    log.close()


def test_sparse_preallocation(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path, seg=64 << 20)
    append(log, 0)
    log.flush()
    st = os.stat(tmp_path / "log" / f"{0:020d}.log")
    assert st.st_size == 64 << 20
    assert st.st_blocks * 512 <= 1 << 20, "preallocated with ftruncate: sparse until written"
    log.close()


def _zero_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(bytes(HEADER_SIZE))


def test_a_new_segment_is_not_msynced_when_created_but_by_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mmap as mmap_mod

    from sidecar.store import mapped

    log, _ = reopen(tmp_path)
    synced: list[tuple[int, ...]] = []
    real = mmap_mod.mmap.flush

    class Spy(mmap_mod.mmap):
        def flush(self, *a: int) -> None:  # type: ignore[override]
            synced.append(a)
            real(self, *a)

    monkeypatch.setattr(mapped.mmap, "mmap", Spy)
    n = 0
    while 1 not in log.segments and n < 100:  # until a record opens segment 1
        append(log, n)
        n += 1
    assert 1 in log.segments
    assert synced == []  # created without an msync on the caller's thread
    log.flush()
    # only segment 1 was mapped through the spy: the flush syncs it from its first byte (its header)
    assert [a[0] for a in synced] == [0]
    log.close()


def test_a_headerless_newest_segment_after_the_checkpoint_is_deleted(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    for n in range(3):
        append(log, n)
    log.flush()
    state = log.state()
    n = 3
    while 1 not in log.segments:  # on into segment 1, after the checkpoint
        append(log, n)
        n += 1
    in_seg0 = n - 1 - 3  # records 3 .. n-2 went into segment 0, n-1 opened segment 1
    append(log, n)
    log.close()
    _zero_header(tmp_path / "log" / f"{SEG:020d}.log")  # a power loss kept its records, not its header
    log, got = reopen(tmp_path, state)
    assert all(pos < SEG for pos in got)  # segment 1's records are consumed again, not replayed
    assert len(got) == in_seg0  # the rest of segment 0 replays
    assert not (tmp_path / "log" / f"{SEG:020d}.log").exists()
    assert list(log.segments) == [0] and log.head < SEG  # appends go on after segment 0's last record
    log.close()


def test_a_headerless_segment_the_checkpoint_names_is_refused(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    n = 0
    while 1 not in log.segments:
        append(log, n)
        n += 1
    log.flush()
    state = log.state()  # head in segment 1
    log.close()
    _zero_header(tmp_path / "log" / f"{SEG:020d}.log")
    with pytest.raises(CorruptSegment, match="header is zeros"):
        reopen(tmp_path, state)


def test_reclaim_inside_a_deferred_disposal_leaves_closing_and_deleting_to_it(tmp_path: Path) -> None:
    """Inside ``deferred_disposal`` (a checkpoint's finish) a dead segment leaves the log at once
    but its mapping is closed, and its file deleted, only when the disposal runs: on the flusher
    thread, where freeing a 64 MiB segment's blocks (~55 ms) stalls nothing."""
    log, _ = reopen(tmp_path)
    positions = [append(log, i, 300) for i in range(25)]
    seg0 = log.segments[0]
    path0 = tmp_path / "log" / f"{0:020d}.log"
    for p in positions:
        if p // SEG == 0:
            log.release(p)
    with deferred_disposal() as gone:
        assert log.reclaim() == 1
    assert 0 not in log.segments and log.reclaimable() == []
    assert gone and not seg0.mm.closed and path0.exists(), "nothing closed or deleted yet"
    done = threading.Thread(target=gone.run)
    done.start()
    done.join()
    assert seg0.mm.closed and not path0.exists()
    assert not gone
    # outside a disposal: at once, as before
    for p in positions:
        if p // SEG == 1:
            log.release(p)
    seg1 = log.segments[1]
    assert log.reclaim() == 1
    assert seg1.mm.closed and not (tmp_path / "log" / f"{1:020d}.log").exists()
    log.close()


@needs_populate
def test_the_pages_ahead_of_the_head_are_faulted_in_off_the_loop_and_stay_mapped(tmp_path: Path) -> None:
    """mapped.PageWorker: the log asks for AHEAD_BYTES past its head; the thread maps them in
    (the loop's appends then take no fault) without changing a byte; trim keeps them mapped."""
    from sidecar.store.log import AHEAD_BYTES, AHEAD_LOW
    from sidecar.store.mapped import page_worker

    pf = page_worker()
    seg_bytes = 64 << 20
    log = CommitLog(tmp_path, seg_bytes, pf)
    path = tmp_path / "log" / f"{0:020d}.log"
    positions = [append(log, i) for i in range(10)]
    first_ask = positions[0] + size_of(100)  # the first append asked: everything from there on
    assert log.ahead == first_ask + AHEAD_BYTES
    pf.close()  # the requests so far are done
    assert pf.enabled and pf.pages >= AHEAD_BYTES // 4096
    assert resident(path) >= AHEAD_BYTES, "the pages ahead are mapped in"
    assert bytes(log.segments[0].buf[log.head : log.ahead]) == bytes(log.ahead - log.head), "not a byte written"
    assert [log.read(p, verify=True).src_offset for p in positions] == list(range(10))
    log.trim()
    assert resident(path) >= AHEAD_BYTES - 4096, "trim leaves the pages faulted in ahead mapped"
    # appends that come within AHEAD_LOW of what was asked ask for the next pages
    asked = log.ahead
    n = 10
    while log.head + AHEAD_LOW <= asked:
        append(log, n, value_len=4000)
        n += 1
    assert log.ahead == min(log.head + AHEAD_BYTES, seg_bytes) > asked
    pf.close()
    log.close()


def test_a_page_worker_without_the_extension_or_the_advice_does_not_populate(tmp_path: Path) -> None:
    """No ``populate`` (the C extension not built): no thread, nothing asked. A kernel that refuses
    the advice (EINVAL before Linux 5.14): the thread says so once and stops asking."""
    import errno
    import mmap as mmap_mod

    from structlog.testing import capture_logs

    from sidecar.store.mapped import PageWorker

    off = PageWorker(None)
    log = CommitLog(tmp_path / "a", SEG, off)
    append(log, 0)
    assert not off.enabled and off._thread is None
    log.close()

    calls: list[tuple[int, int]] = []

    def refuse(mm: mmap_mod.mmap, start: int, length: int) -> int:
        calls.append((start, length))
        return errno.EINVAL

    pf = PageWorker(refuse)
    log = CommitLog(tmp_path / "b", 1 << 20, pf)
    with capture_logs() as logs:
        append(log, 0)
        pf.close()
    assert len(calls) == 1 and not pf.enabled
    assert [e["event"] for e in logs] == ["store.prefault_off"] and logs[0]["errno"] == errno.EINVAL
    for i in range(1, 200):
        append(log, i, value_len=3000)  # past AHEAD_LOW: nothing asked any more
    pf.close()
    assert len(calls) == 1
    assert [log.read(p).src_offset for p in [HEADER_SIZE]] == [0]
    log.close()


@needs(hasattr(os, "SCHED_BATCH"), "Linux scheduling policies")
@pytest.mark.parametrize("demote", [True, False])
def test_the_page_thread_is_demoted_unless_helper_threads_is_none(tmp_path: Path, demote: bool) -> None:
    """``helper-threads = none`` keeps every helper at the process's policy; otherwise the page
    thread runs SCHED_BATCH like the flusher (runtime/threads.py)."""
    from sidecar.runtime.threads import supported
    from sidecar.store.mapped import PageWorker

    if demote and not supported():
        unavailable("SCHED_BATCH for one thread", "this platform cannot demote a single thread")
    seen: list[int] = []

    def record_policy(mm: object, start: int, length: int) -> int:
        seen.append(os.sched_getscheduler(0))  # 0: the calling thread on Linux
        return 0

    pf = PageWorker(record_policy, demote=demote)
    log = CommitLog(tmp_path, SEG, pf)
    append(log, 0)
    pf.close()
    log.close()
    assert seen == [os.SCHED_BATCH if demote else os.sched_getscheduler(0)]
