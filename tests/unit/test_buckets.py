"""BucketStore: append-only bucket data files holding whole commit-log records."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.store import codec
from sidecar.store.buckets import (
    BUCKET_BIT,
    CANCELLED,
    ENTRY_HEAD_SIZE,
    PENDING,
    BucketStore,
    is_bucket_ref,
    make_ref,
    split_ref,
)
from sidecar.store.log import CommitLog
from sidecar.store.mapped import HEADER_SIZE, StoreError

T0 = 1_700_000_000_000
H = 3_600_000


def _record(log: CommitLog, due: int, value: bytes = b"v", i: int = 0) -> codec.Record:
    pos = log.append(
        codec.head(
            rtype=codec.MESSAGE, due_ms=due, enqueue_ms=T0, src_offset=i, src_partition=1, target_partition=2,
            retry_count=0, level=0,
        ),
        b"id%d" % i, b"topic", None, value, codec.encode_headers([("a", b"1")]),
    )
    return log.read(pos)


@pytest.fixture
def log(tmp_path: Path) -> CommitLog:
    lg = CommitLog(tmp_path / "log-home", 4 << 20)
    list(lg.recover(None, None))
    return lg


def test_refs_round_trip() -> None:
    for seq, off in [(1, 64), (5, 1 << 30), ((1 << 26) - 1, ((1 << 36) - 1) << 3)]:
        ref = make_ref(seq, off)
        assert is_bucket_ref(ref) and ref < 1 << 63 and ref & BUCKET_BIT
        assert split_ref(ref) == (seq, off)
    assert not is_bucket_ref(12345)


def test_append_and_read_back_byte_for_byte(tmp_path: Path, log: CommitLog) -> None:
    bs = BucketStore(tmp_path / "buckets")
    bs.restore(None)
    rec = _record(log, T0 + 5 * H + 7, b"x" * 100)
    raw = bytes(log.segments[0].buf[HEADER_SIZE : HEADER_SIZE + rec.length])
    assert bytes(BucketStore.encode(rec)) == raw, "re-encoding gives the commit-log bytes, CRC included"
    ref = bs.append(T0 + 5 * H, H, rec.due_ms, raw)
    seq, off = split_ref(ref)
    assert off == HEADER_SIZE
    got = bs.read(seq, off)
    assert (bytes(got.id), bytes(got.value or b""), got.due_ms, got.target_partition) == (
        b"id0", b"x" * 100, rec.due_ms, 2,
    )
    assert bs.head(seq, off) == (PENDING, -1)
    assert bs.head(seq, off + 8) is None, "a ref into the middle of a record is recognised"
    bs.set_state(seq, off, CANCELLED)
    bs.set_tl(seq, off, 42)
    assert bs.head(seq, off) == (CANCELLED, 42)
    path = tmp_path / "buckets" / f"{T0 + 5 * H:020d}-{H}.bkt"
    assert path.exists()
    bs.close()


def test_damage_is_detected_on_read(tmp_path: Path, log: CommitLog) -> None:
    bs = BucketStore(tmp_path / "b")
    bs.restore(None)
    rec = _record(log, T0 + H, b"y" * 50)
    seq, off = split_ref(bs.append(T0, H, rec.due_ms, BucketStore.encode(rec)))
    bs.flush()
    b = bs.get(seq)
    assert b is not None
    fd = os.open(bs.path(b), os.O_RDWR)
    os.pwrite(fd, b"Z", off + ENTRY_HEAD_SIZE + 100)
    os.close(fd)
    with pytest.raises(StoreError, match="corrupt"):
        bs.read(seq, off)
    bs.close()


def test_scan_crosses_read_chunks(tmp_path: Path, log: CommitLog) -> None:
    bs = BucketStore(tmp_path / "b")
    bs.restore(None)
    sizes = [10, 1_500_000, 20, 700_000, 5]
    refs = []
    for i, n in enumerate(sizes):
        rec = _record(log, T0 + H + i, b"z" * n, i)
        refs.append(bs.append(T0 + H, H, rec.due_ms, BucketStore.encode(rec)))
    b = bs.get(split_ref(refs[0])[0])
    assert b is not None
    items = bs.scan(b, 100)
    assert [off for off, *_ in items] == [split_ref(r)[1] for r in refs]
    assert [due for _o, _t, _s, due, _l in items] == [T0 + H + i for i in range(5)]
    assert sum(total for _o, total, *_ in items) == b.size - HEADER_SIZE
    assert bs.scan(b, 2) == items[:2]
    bs.mark_loaded(b, items[1][0] + items[1][1], 2)
    assert bs.scan(b, 100) == items[2:]
    bs.close()


def test_restore_truncates_forgets_and_refuses(tmp_path: Path, log: CommitLog) -> None:
    d = tmp_path / "b"
    bs = BucketStore(d)
    bs.restore(None)
    r1 = _record(log, T0 + H + 1, i=1)
    bs.append(T0 + H, H, r1.due_ms, BucketStore.encode(r1))
    bs.flush()
    st = bs.state()
    size = bs.buckets[1].size
    # after the checkpoint: one more record in the same bucket and a new bucket
    r2 = _record(log, T0 + H + 2, i=2)
    bs.append(T0 + H, H, r2.due_ms, BucketStore.encode(r2))
    r3 = _record(log, T0 + 3 * H, i=3)
    bs.append(T0 + 3 * H, H, r3.due_ms, BucketStore.encode(r3))
    bs.close()
    assert len(list(d.glob("*.bkt"))) == 2

    bs = BucketStore(d)
    bs.restore(st)
    assert [b.seq for b in bs.buckets.values()] == [1]
    assert (d / f"{T0 + H:020d}-{H}.bkt").stat().st_size == size, "post-checkpoint appends are cut off"
    assert len(list(d.glob("*.bkt"))) == 1, "files the checkpoint does not know are deleted"
    assert bs.next_seq == 2
    assert bs.min_due(H) == r1.due_ms and bs.first_start(H) == T0 + H
    bs.close()

    (d / f"{T0 + H:020d}-{H}.bkt").unlink()
    with pytest.raises(StoreError, match="missing"):
        BucketStore(d).restore(st)
    done = {"next": 2, "list": [[1, T0 + H, H, size, 1, size, 1, 0, r1.due_ms]]}
    bs = BucketStore(d)
    bs.restore(done)  # delivered and deleted by the reclaim after that checkpoint: fine
    assert bs.buckets == {}
    bs.close()


def test_a_header_that_does_not_match_is_refused(tmp_path: Path, log: CommitLog) -> None:
    d = tmp_path / "b"
    bs = BucketStore(d)
    bs.restore(None)
    r = _record(log, T0 + H)
    bs.append(T0 + H, H, r.due_ms, BucketStore.encode(r))
    st = bs.state()
    bs.close()
    st["list"][0][0] = 9  # another sequence number
    with pytest.raises(StoreError, match="header says bucket 1"):
        BucketStore(d).restore(st)


def test_many_buckets_with_few_open_files(tmp_path: Path, log: CommitLog) -> None:
    bs = BucketStore(tmp_path / "b", max_open=2)
    bs.restore(None)
    refs = []
    for i in range(12):
        r = _record(log, T0 + (i % 6) * H + i, i=i)
        refs.append(bs.append(T0 + (i % 6) * H, H, r.due_ms, BucketStore.encode(r)))
        assert len(bs._fds) <= 2
    bs.flush()
    for i, ref in enumerate(refs):
        assert bytes(bs.read(*split_ref(ref)).id) == b"id%d" % i
    assert len(bs.buckets) == 6
    for b in list(bs.buckets.values()):
        b.live = 0
        bs.mark_loaded(b, b.size, b.count)
    assert sorted(bs.deletable()) == sorted(bs.buckets)
    for seq in bs.deletable():
        bs.delete(seq)
    assert list((tmp_path / "b").glob("*.bkt")) == []
    bs.close()


def test_flush_inside_a_checkpoint_leaves_the_syncs_to_the_batch(
    tmp_path: Path, log: CommitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar.store import buckets as buckets_mod
    from sidecar.store import mapped
    from sidecar.store.mapped import deferred_sync

    bs = BucketStore(tmp_path / "b")
    for k in range(10):  # ten files: more than the syncfs threshold
        rec = _record(log, T0 + k * H, i=k)
        bs.append(T0 + k * H, H, rec.due_ms, BucketStore.encode(rec))
    now: list[str] = []
    monkeypatch.setattr(buckets_mod.os, "fsync", lambda fd: now.append("fsync"))
    monkeypatch.setattr(buckets_mod, "_syncfs", lambda fd: now.append("syncfs") or 0)
    later: list[int] = []
    monkeypatch.setattr(mapped.os, "fdatasync", later.append)
    with deferred_sync() as batch:
        bs.flush()
    assert now == []  # nothing synced on the calling thread
    assert sorted(Path(p).name for p in batch.files) == sorted(p.name for p in (tmp_path / "b").glob("*.bkt"))
    assert len(batch.files) == 10
    assert batch.dirs  # the new files' directories, synced by the batch too
    batch.run()
    assert len(later) == 10
    assert now == ["fsync"] * len(batch.dirs)  # the batch's directory syncs
    now.clear()
    bs.flush()  # nothing dirty any more
    assert now == []
    rec = _record(log, T0, i=99)
    bs.append(T0, H, rec.due_ms, BucketStore.encode(rec))
    bs.flush()  # outside a checkpoint: synced here
    assert now == ["fsync"]
    bs.close()
