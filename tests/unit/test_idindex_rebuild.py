"""A rebuilt id index takes its name only at the next flush, after its contents are synced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.store import mapped
from sidecar.store.idindex import HEADER_SIZE, SLOT_SIZE, IdIndex
from sidecar.store.mapped import deferred_sync


def _cap_on_disk(path: Path) -> int:
    return (os.path.getsize(path) - HEADER_SIZE) // SLOT_SIZE


def _fill(ix: IdIndex, lo: int, hi: int) -> None:
    for k in range(lo, hi):
        ix.put(2 + k * 7919, k + 1)


def _unnamed(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("ids.idx.new*"))


def test_rebuilt_table_is_named_by_the_deferred_flush_in_order(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    _fill(ix, 0, 8)
    ix.flush()
    _fill(ix, 8, 9)  # the ninth id passes half of 16 slots: rebuilt at 32
    assert ix.cap == 32
    assert _cap_on_disk(tmp_path / "ids.idx") == 16  # the old table keeps the name
    assert _unnamed(tmp_path) == ["ids.idx.new.1"]
    calls: list[tuple[str, str]] = []
    real_fdatasync, real_replace, real_dir = os.fdatasync, os.replace, mapped._fsync_dir_now
    monkeypatch.setattr(mapped.os, "fdatasync", lambda fd: (calls.append(("sync", "")), real_fdatasync(fd))[1])
    monkeypatch.setattr(mapped.os, "replace",
                        lambda a, b: (calls.append(("rename", Path(a).name)), real_replace(a, b))[1])
    monkeypatch.setattr(mapped, "_fsync_dir_now", lambda d: (calls.append(("dir", "")), real_dir(d))[1])
    with deferred_sync() as batch:
        ix.flush()
    assert calls == []  # noted only: the batch does the work
    assert _cap_on_disk(tmp_path / "ids.idx") == 16
    batch.run()
    assert calls == [("sync", ""), ("rename", "ids.idx.new.1"), ("dir", "")]
    assert _cap_on_disk(tmp_path / "ids.idx") == 32
    assert _unnamed(tmp_path) == []
    ix.close()
    again = IdIndex(tmp_path)
    again.restore(None)
    assert again.cap == 32 and again.live == 9
    assert all(again.find(2 + k * 7919) == [k + 1] for k in range(9))
    again.close()


def test_crash_before_the_flush_leaves_the_old_table(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    _fill(ix, 0, 8)
    ix.flush()
    _fill(ix, 8, 12)
    assert ix.cap == 32 and _unnamed(tmp_path) == ["ids.idx.new.1"]
    ix.close()  # killed before the checkpoint: nothing named the new table
    again = IdIndex(tmp_path)
    assert _unnamed(tmp_path) == []  # deleted at open
    again.restore(None)
    assert again.cap == 16 and again.live == 8  # the flushed table; replay re-inserts the rest
    assert all(again.find(2 + k * 7919) == [k + 1] for k in range(8))
    again.close()


def test_two_rebuilds_before_a_flush(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    _fill(ix, 0, 17)  # 16 -> 32 at the ninth, 32 -> 64 at the seventeenth: the first is named then
    assert ix.cap == 64
    assert _cap_on_disk(tmp_path / "ids.idx") == 32
    assert _unnamed(tmp_path) == ["ids.idx.new.2"]
    ix.flush()  # outside a batch: synced and renamed now
    assert _cap_on_disk(tmp_path / "ids.idx") == 64 and _unnamed(tmp_path) == []
    _fill(ix, 17, 20)
    ix.flush()
    ix.close()
    again = IdIndex(tmp_path)
    again.restore(None)
    assert again.live == 20
    again.close()


def test_flush_without_sync_still_names_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    _fill(ix, 0, 9)
    synced: list[int] = []
    monkeypatch.setattr(mapped.os, "fdatasync", synced.append)
    with deferred_sync() as batch:
        ix.flush(sync=False)  # fsync=none: renamed at once, nothing synced
    assert batch.files == {} and batch.renames == [] and synced == []
    assert _cap_on_disk(tmp_path / "ids.idx") == 32 and _unnamed(tmp_path) == []
    ix.close()
