"""A level queue's new file: its header is synced by the flush, not on creation; a file whose header
never reached the disk is deleted at open."""

from __future__ import annotations

import mmap as mmap_mod
from pathlib import Path

import pytest

from sidecar.levels.queue import LevelQueue
from sidecar.store import mapped
from sidecar.store.mapped import HEADER_SIZE


def test_new_queue_file_header_is_synced_by_the_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = mmap_mod.mmap.flush

    class Spy(mmap_mod.mmap):
        def flush(self, *a: int) -> None:  # type: ignore[override]
            synced.append(a[0] if a else 0)
            real(self, *a)

    monkeypatch.setattr(mapped.mmap, "mmap", Spy)
    q = LevelQueue(tmp_path / "q", entries_per_file=8)
    for i in range(10):  # two files
        q.write(i, 64 + i, 1000 + i)
    assert sorted(q.files) == [0, 8]
    assert synced == []  # no msync when the files were created
    q.flush()
    assert sorted(synced) == [0, 0]  # each file synced from its first page: the header with it
    q.close()


def test_headerless_queue_file_is_deleted_at_open(tmp_path: Path) -> None:
    q = LevelQueue(tmp_path / "q", entries_per_file=8)
    for i in range(10):
        q.write(i, 64 + i, 1000 + i)
    q.flush()
    q.close()
    second = tmp_path / "q" / f"{8:020d}.q"
    with open(second, "r+b") as f:  # a power loss kept the entries but not the header
        f.write(bytes(HEADER_SIZE))
    again = LevelQueue(tmp_path / "q", entries_per_file=8)
    assert sorted(again.files) == [0]
    assert not second.exists()
    assert again.read(3)[:2] == (67, 1003)
    again.close()
