"""The id index grows incrementally: bounded work per insert and per step, both tables probed
while it migrates, a crash mid-migration resumed or undone, the migrated table named in the
durability order, expired pre-cancels swept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.store import idindex, mapped
from sidecar.store.idindex import HEADER_SIZE, MIGRATE_PER_PUT, PRECANCEL, SLOT_SIZE, IdIndex
from sidecar.store.mapped import StoreError, deferred_sync


def _cap_on_disk(path: Path) -> int:
    return (os.path.getsize(path) - HEADER_SIZE) // SLOT_SIZE


def _h(k: int) -> int:
    return 2 + k * 7919


def _fill(ix: IdIndex, lo: int, hi: int) -> None:
    for k in range(lo, hi):
        ix.put(_h(k), k + 1)


def _next_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("ids.idx.next.*"))


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_no_put_or_step_migrates_more_than_its_share(tmp_path: Path, native: bool) -> None:
    """Past eight growth thresholds (16 -> 4096 slots), no put migrates more than
    MIGRATE_PER_PUT slots and no step more than its slots; every id stays findable throughout
    (while migrating: in one table or the other)."""
    ix = IdIndex(tmp_path, initial_capacity=16, native=native)
    ix.restore(None)
    n = 1800
    migrations = 0
    for k in range(n):
        before, cap = ix.migrated, ix.cap
        ix.put(_h(k), k + 1)
        assert ix.migrated - before <= MIGRATE_PER_PUT
        migrations += ix.cap != cap
        if k % 7 == 0:
            before = ix.migrated
            ix.step(0, 1000, slots=5)
            assert ix.migrated - before <= 5
        if k % 97 == 0:
            assert all(ix.find(_h(j)) == [j + 1] for j in range(k + 1))
        assert (ix.live + ix.tombs) * 2 <= ix.cap
    assert ix.cap >= 4096 and migrations >= 8
    while ix.migrating:
        ix.step(0, 1000, slots=64)
    assert ix.live == n and all(ix.find(_h(j)) == [j + 1] for j in range(n))
    ix.close()


def test_removes_while_migrating_shed_tombstones_in_a_same_size_migration(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=256)
    ix.restore(None)

    def h(r: int, i: int) -> int:  # round r's chain: slots 12r .. 12r+9, apart from the others
        return 256 * (r + 1) + 12 * r + i

    # each round: ten ids in one probe chain, the first nine removed while the tenth holds the
    # chain: tombstones pile up, the live ids stay few
    for r in range(20):
        for i in range(10):
            ix.put(h(r, i), r * 10 + i + 1)
        for i in range(9):
            assert ix.remove(h(r, i), r * 10 + i + 1)
        assert (ix.live + ix.tombs) * 2 <= ix.cap
    assert ix.migrated > 0, "no migration shed the tombstones"
    assert ix.cap == 256, "tombstones made it grow instead of shedding them"
    while ix.migrating:
        ix.step(0, 1000)
    assert ix.live == 20 and all(ix.find(h(r, 9)) == [r * 10 + 10] for r in range(20))
    assert ix.find(h(0, 0)) == [] and ix.tombs < 20 * 9
    ix.close()


def test_migrated_table_is_named_by_the_deferred_flush_in_order(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    _fill(ix, 0, 8)
    ix.flush()
    _fill(ix, 8, 9)  # the ninth id passes half of 16 slots: a migration to 32 starts (and ends at once)
    assert not ix.migrating and ix.cap == 32 and _next_files(tmp_path) == ["ids.idx.next.1"]
    assert _cap_on_disk(tmp_path / "ids.idx") == 16  # the old table keeps the name until the flush
    calls: list[tuple[str, str]] = []
    real_fdatasync, real_replace, real_dir = os.fdatasync, os.replace, mapped._fsync_dir_now
    monkeypatch.setattr(mapped.os, "fdatasync", lambda fd: (calls.append(("sync", "")), real_fdatasync(fd))[1])
    monkeypatch.setattr(mapped.os, "replace",
                        lambda a, b: (calls.append(("rename", Path(a).name)), real_replace(a, b))[1])
    monkeypatch.setattr(mapped, "_fsync_dir_now", lambda d: (calls.append(("dir", "")), real_dir(d))[1])
    with deferred_sync() as batch:
        ix.flush()
    assert calls == []  # noted only: the batch does the work
    batch.run()
    assert calls == [("sync", ""), ("rename", "ids.idx.next.1"), ("dir", "")]
    assert _cap_on_disk(tmp_path / "ids.idx") == 32 and _next_files(tmp_path) == []
    assert "next" not in ix.state()
    ix.reclaim()
    ix.close()
    again = IdIndex(tmp_path)
    again.restore(None)
    assert again.cap == 32 and again.live == 9
    assert all(again.find(_h(k)) == [k + 1] for k in range(9))
    again.close()


@pytest.mark.parametrize("count_at_open", [1 << 20, 0], ids=["counted", "background-recount"])
def test_crash_mid_migration_resumes_from_the_checkpointed_cursor(tmp_path: Path, count_at_open: int) -> None:
    ix = IdIndex(tmp_path, initial_capacity=256)
    ix.restore(None)
    _fill(ix, 0, 129)  # a migration to 512 starts
    ix.step(0, 1000, slots=100)
    ix.flush()
    state = ix.state()
    assert state["cursor"] == 16 + 100  # the put that started it, then the step
    ix.step(0, 1000, slots=50)  # after the checkpoint: copied again at the resume
    _fill(ix, 129, 140)  # after the checkpoint: recovery's replay re-inserts them (below)
    ix.close()  # killed
    again = IdIndex(tmp_path, count_at_open=count_at_open)
    again.restore(state)
    assert again.migrating and again.cursor == 116 and again.cap == 512
    _fill(again, 129, 140)  # the replay
    assert all(again.find(_h(k)) == [k + 1] for k in range(140))
    while again.migrating:
        again.step(0, 1000, slots=64)
    while again.counting:
        again.recount_step(64)
    assert again.live == 140 and again.live == again._count_range(0, again.cap)[0]
    again.close()


def test_a_migration_the_checkpoint_does_not_name_is_deleted(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    _fill(ix, 0, 8)
    ix.flush()
    state = ix.state()
    _fill(ix, 8, 10)  # a migration starts after the checkpoint (and ends: 16 slots at the second put)
    assert not ix.migrating and ix.cap == 32 and _next_files(tmp_path) == ["ids.idx.next.1"]
    ix.close()  # killed
    again = IdIndex(tmp_path)
    again.restore(state)
    assert _next_files(tmp_path) == [] and not again.migrating
    assert again.cap == 16 and again.live == 8  # the flushed table; replay re-inserts the rest
    assert all(again.find(_h(k)) == [k + 1] for k in range(8))
    _fill(again, 8, 10)  # the replay: a new migration takes a number the checkpoint never named
    assert _next_files(tmp_path) == ["ids.idx.next.2"]
    again.close()


def test_a_migration_that_ended_after_the_checkpoint_is_whole(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=1024)
    ix.restore(None)
    _fill(ix, 0, 513)
    ix.flush()
    state = ix.state()  # names the migration, cursor 16
    while ix.migrating:
        ix.step(0, 1000)
    ix.flush()  # renamed: ids.idx is the 2048-slot table; killed before the checkpoint
    ix.close()
    again = IdIndex(tmp_path, count_at_open=0)
    again.restore(state)
    assert not again.migrating and again.cap == 2048
    assert again.live == 513, "the estimate counts the old table's entries the checkpoint had not seen migrated"
    assert all(again.find(_h(k)) == [k + 1] for k in range(513))
    again.close()


def test_mismatched_geometry_is_refused(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=64)
    ix.restore(None)
    _fill(ix, 0, 33)
    ix.flush()
    state = ix.state()
    assert state["next"] == "ids.idx.next.1" and state["from"] == 64
    ix.close()
    bad = dict(state, **{"from": 32})
    again = IdIndex(tmp_path)
    with pytest.raises(StoreError, match=r"ids.idx.next.1: the checkpoint names a migration from 32 to 128 slots, "
                                         r"but .*ids.idx holds 64 and ids.idx.next.1 128"):
        again.restore(bad)
    again.close()


def test_flush_without_sync_still_names_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    _fill(ix, 0, 9)
    while ix.migrating:
        ix.step(0, 1000)
    synced: list[int] = []
    monkeypatch.setattr(mapped.os, "fdatasync", synced.append)
    with deferred_sync() as batch:
        ix.flush(sync=False)  # fsync=none: renamed at once, nothing synced
    assert batch.files == {} and batch.renames == [] and synced == []
    assert _cap_on_disk(tmp_path / "ids.idx") == 32 and _next_files(tmp_path) == []
    ix.close()


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_expired_pre_cancels_are_swept_without_a_probe(tmp_path: Path, native: bool) -> None:
    ix = IdIndex(tmp_path, initial_capacity=1024, native=native)
    ix.restore(None)
    _fill(ix, 0, 100)
    for k in range(100, 150):
        ix.put(_h(k), PRECANCEL | (1000 + k))  # cancels at t = 1100..1149
    assert ix.precancels() == 50
    horizon = 500
    visited = 0
    assert ix.step(now_ms=1125 + horizon, horizon_ms=horizon, sweep=False) == 0  # not this turn
    while visited < ix.cap:
        visited += ix.step(now_ms=1125 + horizon, horizon_ms=horizon, sweep_slots=100)
    assert ix.swept == 25
    assert ix.precancels() == 25  # the 25 older than the horizon are gone, the rest kept
    assert all(ix.find(_h(k)) == [] for k in range(100, 125))
    assert all(ix.find(_h(k)) == [PRECANCEL | (1000 + k)] for k in range(125, 150))
    assert ix.live == 125 and all(ix.find(_h(k)) == [k + 1] for k in range(100))
    ix.close()


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_the_sweep_does_not_wait_for_a_migration(tmp_path: Path, native: bool) -> None:
    """While a migration runs (here it never advances), a round of steps removes the expired
    pre-cancels of the old table's part not yet copied, of its copied part and of the primary,
    and keeps the live ids and the pre-cancels still inside the horizon."""
    ix = IdIndex(tmp_path, initial_capacity=1024, native=native)
    ix.restore(None)
    k = 0
    while not ix.migrating:
        ix.put(_h(k), PRECANCEL | 1000 if k % 4 == 0 else k + 1)  # every 4th a pre-cancel made at t=1000
        k += 1
    for j in range(k, k + 40):  # into the primary: half made at t=1000, half at t=9000
        ix.put(_h(j), PRECANCEL | (1000 if j % 2 else 9000))
    n = k + 40
    assert ix.migrating and 0 < ix.cursor < 1024
    expired = ix.precancels(before_ms=2000)
    assert expired >= 100
    for _ in range(ix.cap // 64):  # a round of the primary (two of the old table)
        assert ix.step(now_ms=5000, horizon_ms=1000, slots=0, sweep_slots=64) == 128
    assert ix.migrating and ix.precancels(before_ms=2000) == 0 and ix.swept == expired
    assert ix.precancels() == 20  # the ones made at t=9000
    for j in range(n):
        want = ([] if j % 4 == 0 else [j + 1]) if j < k else ([] if j % 2 else [PRECANCEL | 9000])
        assert ix.find(_h(j)) == want
    while ix.migrating:
        ix.step(0, 1000, slots=256, sweep=False)
    assert ix.precancels() == 20 and ix.live == (k - (k + 3) // 4) + 20
    ix.close()


def test_a_version_1_table_opens(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    _fill(ix, 0, 5)
    ix.flush()
    ix.close()
    raw = bytearray((tmp_path / "ids.idx").read_bytes())
    mapped.HEADER.pack_into(raw, 0, b"KDSIDX\x00\x01", 1, HEADER_SIZE, SLOT_SIZE, 16, 0, b"", 0)
    crc = mapped.crc32c(bytes(raw[:60]))
    mapped.HEADER.pack_into(raw, 0, b"KDSIDX\x00\x01", 1, HEADER_SIZE, SLOT_SIZE, 16, 0, b"", crc)
    (tmp_path / "ids.idx").write_bytes(raw)
    again = IdIndex(tmp_path)
    again.restore(None)
    assert again.live == 5 and all(again.find(_h(k)) == [k + 1] for k in range(5))
    again.close()


def test_inspect_probes_both_tables_of_a_migration(tmp_path: Path) -> None:
    """``inspect --id`` reads the files, not the live object: mid-migration an id is in the old
    table or the new one, and the offline probe finds every id in one of them."""
    from sidecar.inspect import _index_refs

    ix = IdIndex(tmp_path, initial_capacity=256)
    ix.restore(None)
    k = 0
    while not ix.migrating:
        ix.put(_h(k), k + 1)
        k += 1
    ix.put(_h(k), k + 1)  # lands in the new table only
    assert ix.migrating and _next_files(tmp_path)
    assert all(_index_refs(tmp_path, _h(j)) == [j + 1] for j in range(k + 1))
    ix.close()


def _near_growth(ix: IdIndex, k0: int = 0) -> int:
    """Insert until the write-ahead threshold is passed (not the growth); the next key."""
    k = k0
    while ix.live + ix.tombs < ix.cap * idindex.ZERO_AT:
        ix.put(_h(k), k + 1)
        k += 1
    return k


def test_the_next_table_is_written_ahead_and_taken_by_the_growth(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ZERO_AT of the slots a loop step starts writing the next table's file; the growth
    renames that very file (same inode), fully allocated, and every id stays findable."""
    monkeypatch.setattr(idindex, "ZERO_MIN_SLOTS", 0)
    ix = IdIndex(tmp_path, initial_capacity=4096)
    ix.restore(None)
    k = _near_growth(ix)
    assert not (tmp_path / idindex.ZERO).exists()  # only a step starts it, not an insert
    ix.step(0, 1000)
    z = ix._zero
    assert z is not None and z.cap == 8192 and z.done.wait(10) and z.ok
    ino = os.stat(tmp_path / idindex.ZERO).st_ino
    assert os.stat(tmp_path / idindex.ZERO).st_blocks * 512 >= z.size  # allocated, not sparse
    while not ix.migrating:
        ix.put(_h(k), k + 1)
        k += 1
    assert not (tmp_path / idindex.ZERO).exists() and ix._zero is None
    assert ix.cap == 8192 and os.stat(tmp_path / "ids.idx.next.1").st_ino == ino
    while ix.migrating:
        ix.step(0, 1000, slots=512)
    assert ix.live == k and all(ix.find(_h(j)) == [j + 1] for j in range(k))
    ix.flush()
    ix.close()
    again = IdIndex(tmp_path)
    again.restore(ix.state())
    assert again.cap == 8192 and all(again.find(_h(j)) == [j + 1] for j in range(0, k, 13))
    again.close()


def test_a_write_ahead_of_another_geometry_is_discarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written ahead for a doubling, but removes left fewer than a quarter live at the growth: it
    sheds tombstones at the same size instead, in a sparse file; the unused one is deleted."""
    monkeypatch.setattr(idindex, "ZERO_MIN_SLOTS", 0)
    ix = IdIndex(tmp_path, initial_capacity=4096)
    ix.restore(None)
    k = _near_growth(ix)
    ix.step(0, 1000)
    assert ix._zero is not None and ix._zero.done.wait(10) and ix._zero.cap == 8192
    for j in range(k - 500):  # removes: tombstones, fewer live
        ix.remove(_h(j), j + 1)
    while not ix.migrating:
        ix.put(_h(k), k + 1)
        k += 1
    assert ix.cap == 4096 and not (tmp_path / idindex.ZERO).exists()
    while ix.migrating:
        ix.step(0, 1000, slots=512)
    assert all(ix.find(_h(j)) == [j + 1] for j in range(k - 500, k)) and ix.find(_h(0)) == []
    ix.close()


def test_a_write_ahead_left_by_a_crash_or_a_close_is_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idindex, "ZERO_MIN_SLOTS", 0)
    monkeypatch.setattr(idindex, "ZERO_BYTES_PER_S", 1 << 16)  # slow: still running at the close
    ix = IdIndex(tmp_path, initial_capacity=4096)
    ix.restore(None)
    _near_growth(ix)
    ix.step(0, 1000)
    assert ix._zero is not None and ix._zero.is_alive()
    ix.close()  # stops it within a chunk and deletes the file
    assert not (tmp_path / idindex.ZERO).exists()
    (tmp_path / idindex.ZERO).write_bytes(b"\0" * 4096)  # a kill mid-write leaves one
    again = IdIndex(tmp_path)
    assert not (tmp_path / idindex.ZERO).exists()
    again.close()


@pytest.mark.parametrize("gaps", [[50], [120], [170], [50] * 100 + [20_000] + [50]],
                         ids=["50ms", "120ms", "170ms", "a-20s-stall"])
def test_a_sweep_round_takes_its_time_whatever_the_loop_cadence(tmp_path: Path, gaps: list[int]) -> None:
    """The sweep is paced by the index's time, not by its steps: a round takes SWEEP_ROUND_MS
    (within a step; a step's slots are rounded up, so a few % less) whether the steps come every
    50 ms or every 170 ms, and a stall's share is caught up by the steps after it, at most
    SWEEP_MAX_SHARE of the table each. Every pre-cancel that expired before the round began is
    gone at its end, the younger ones are kept."""
    ix = IdIndex(tmp_path, initial_capacity=1 << 16)
    ix.restore(None)
    for k in range(10):
        ix.put(_h(k), PRECANCEL | 1000)
    for k in range(10, 20):
        ix.put(_h(k), PRECANCEL | 200_000)
    now, visited, steps, biggest = 10_000, 0, 0, 0
    ix.step(now_ms=now, horizon_ms=500, sweep_slots=16)  # the first step: no time owed yet
    start = now
    while visited < ix.cap:
        now += gaps[min(steps, len(gaps) - 1)]
        v = ix.step(now_ms=now, horizon_ms=500, sweep_slots=16)
        biggest, visited, steps = max(biggest, v), visited + v, steps + 1
    took, gap = now - start, max(gaps)
    if gap > 1000:  # the stall: caught up at 1/512 of the table a step, 50 ms apart
        assert biggest == ix.cap // 512
        gap = 50
    assert idindex.SWEEP_ROUND_MS * 0.95 - gap <= took <= idindex.SWEEP_ROUND_MS + gap
    assert ix.swept == 10 and ix.precancels() == 10
    ix.close()


def test_a_clock_that_goes_back_owes_the_sweep_nothing(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=1 << 16)
    ix.restore(None)
    assert ix.step(now_ms=100_000, horizon_ms=500, sweep_slots=16) == 16
    assert ix.step(now_ms=50_000, horizon_ms=500, sweep_slots=16) == 16  # back 50 s: the floor only
    assert ix.step(now_ms=50_000 + idindex.SWEEP_ROUND_MS * 10, horizon_ms=500, sweep_slots=16) == ix.cap // 512
    ix.close()
