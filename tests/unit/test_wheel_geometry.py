"""The wheel's on-disk geometry is checked on open: a changed precision or window is refused with
an error naming both values, not silently misread."""

from __future__ import annotations

from pathlib import Path

import pytest
from crc32c import crc32c

from sidecar.store import codec
from sidecar.store.log import CommitLog
from sidecar.store.mapped import HEADER, HEADER_SIZE, GeometryMismatch, StoreError
from sidecar.wheel import WheelScheduler
from sidecar.wheel.layout import ENTRY_SIZE, SLOT_SIZE

T0 = 1_700_000_000_000


def _log(root: Path) -> CommitLog:
    log = CommitLog(root, 8192)
    list(log.recover(None, None))
    return log


def _wheel(root: Path, log: CommitLog, precision: int = 10, window: int = 2_000, per_file: int = 16) -> WheelScheduler:
    return WheelScheduler(
        root, log, precision_ms=precision, window_ms=window, bucket_width_ms=500, entries_per_file=per_file
    )


def _add(w: WheelScheduler, log: CommitLog, due: int) -> int:
    pos = log.append(
        codec.head(
            rtype=codec.MESSAGE, due_ms=due, enqueue_ms=T0, src_offset=0, src_partition=0, target_partition=-1,
            retry_count=0, level=0,
        ),
        b"a", b"t", None, None, b"",
    )
    return w.add(due, 0, pos)


def _seed(root: Path) -> dict[str, object]:
    log = _log(root)
    w = _wheel(root, log)
    w.restore(None)
    w.due(T0, 1)
    _add(w, log, T0 + 100)
    w.flush()
    st = w.state()
    w.close()
    log.close()
    return st


def test_the_slot_file_is_sized_by_the_geometry(tmp_path: Path) -> None:
    log = _log(tmp_path)
    w = _wheel(tmp_path, log)
    assert (tmp_path / "wheel" / "slots.whl").stat().st_size == HEADER_SIZE + 200 * SLOT_SIZE
    assert SLOT_SIZE == 32 and ENTRY_SIZE == 32
    w.close()
    log.close()


@pytest.mark.parametrize(
    ("precision", "window", "says"),
    [
        (20, 2_000, ["precision 10 ms", "precision 20 ms"]),
        (10, 4_000, ["window 2000 ms", "window 4000 ms"]),
        (5, 1_000, ["precision 10 ms and window 2000 ms", "precision 5 ms and window 1000 ms"]),
    ],
)
def test_reopening_with_another_geometry_is_refused(
    tmp_path: Path, precision: int, window: int, says: list[str]
) -> None:
    _seed(tmp_path)
    log = _log(tmp_path)
    with pytest.raises(GeometryMismatch) as e:
        _wheel(tmp_path, log, precision=precision, window=window)
    for s in says:
        assert s in str(e.value)
    log.close()


def test_a_checkpoint_from_another_geometry_is_refused(tmp_path: Path) -> None:
    st = _seed(tmp_path)
    log = _log(tmp_path / "other")
    w = _wheel(tmp_path / "other", log, precision=5, window=1_000)
    both = r"precision 10 ms and window 2000 ms.*precision 5 ms and window 1000 ms"
    with pytest.raises(GeometryMismatch, match=both):
        w.restore(st)
    w.close()
    log.close()


def test_the_timer_log_keeps_its_states_apart_and_refuses_a_version_1_file(tmp_path: Path) -> None:
    """Version 2: a file is the header, one state byte per entry, then the 32-byte entries; an ack
    writes the state byte and leaves the entry alone. A version-1 file (states inside the entries)
    is refused, naming both versions, not misread."""
    import struct

    log = _log(tmp_path)
    w = _wheel(tmp_path, log)
    w.restore(None)
    w.due(T0, 1)
    ref = _add(w, log, T0 + 5)
    f = tmp_path / "wheel" / "tl" / f"{0:020d}.tl"
    assert f.stat().st_size == HEADER_SIZE + 16 + 16 * ENTRY_SIZE
    buf, off = w.tl.locate(ref)
    assert off == HEADER_SIZE + 16 + ref * ENTRY_SIZE
    entry = bytes(buf[off : off + ENTRY_SIZE])
    assert [x[0] for x in w.due(T0 + 5, 10)] == [ref]
    w.ack(ref)
    assert buf[HEADER_SIZE + ref] == 2 and w.tl.read(ref)[3] == 2  # done, in the state array
    assert bytes(buf[off : off + ENTRY_SIZE]) == entry  # the entry itself is not written by the ack
    w.flush()
    w.close()
    log.close()
    raw = bytearray(f.read_bytes())
    v1 = bytearray(HEADER.pack(*HEADER.unpack_from(raw, 0)[:1], 1, *HEADER.unpack_from(raw, 0)[2:]))
    v1[60:64] = struct.pack("<I", crc32c(bytes(v1[:60])))
    f.write_bytes(bytes(v1) + bytes(16 * ENTRY_SIZE))  # a version-1 file: header, then 32-byte entries
    log = _log(tmp_path)
    with pytest.raises(GeometryMismatch, match="format version 1, this build reads 2"):
        _wheel(tmp_path, log)
    log.close()


def test_another_timer_log_file_size_is_refused(tmp_path: Path) -> None:
    _seed(tmp_path)
    log = _log(tmp_path)
    with pytest.raises(GeometryMismatch, match="differs from the configured"):
        _wheel(tmp_path, log, per_file=32)
    log.close()


def test_a_slot_file_killed_while_being_created_is_recreated(tmp_path: Path) -> None:
    (tmp_path / "wheel").mkdir()
    (tmp_path / "wheel" / "slots.whl").write_bytes(bytes(4096))  # open(O_CREAT) + ftruncate, no header
    (tmp_path / "wheel" / "tl").mkdir()
    (tmp_path / "wheel" / "tl" / f"{0:020d}.tl").write_bytes(b"")
    log = _log(tmp_path)
    w = _wheel(tmp_path, log)
    w.restore(None)
    assert w.slots.created and w.tl.files == {}
    w.close()
    log.close()


def test_a_missing_slot_file_with_pending_entries_is_an_error(tmp_path: Path) -> None:
    st = _seed(tmp_path)
    (tmp_path / "wheel" / "slots.whl").unlink()
    log = _log(tmp_path)
    w = _wheel(tmp_path, log)
    with pytest.raises(StoreError, match="missing"):
        w.restore(st)
    w.close()
    log.close()


def test_settings_the_wheel_cannot_honour(tmp_path: Path) -> None:
    log = _log(tmp_path)
    with pytest.raises(ValueError, match="precision"):
        WheelScheduler(tmp_path, log, precision_ms=120_000, window_ms=240_000, bucket_width_ms=1000)
    with pytest.raises(ValueError, match="multiple"):
        WheelScheduler(tmp_path, log, precision_ms=10, window_ms=2_005, bucket_width_ms=1000)
    with pytest.raises(ValueError, match="bucket width"):
        WheelScheduler(tmp_path, log, precision_ms=10, window_ms=2_000, bucket_width_ms=3000)
    log.close()


def test_a_new_timer_log_file_gets_its_header_synced_by_the_flush_not_on_creation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mmap as mmap_mod

    from sidecar.store import mapped

    synced: list[tuple[int, int]] = []
    real = mmap_mod.mmap.flush

    class Spy(mmap_mod.mmap):
        def flush(self, *a: int) -> None:  # type: ignore[override]
            synced.append((a[0], a[1]) if a else (0, len(self)))
            real(self, *a)

    log = _log(tmp_path)
    w = _wheel(tmp_path, log)
    w.restore(None)
    w.due(T0, 1)
    monkeypatch.setattr(mapped.mmap, "mmap", Spy)
    _add(w, log, T0 + 100)  # opens timer-log file 0
    assert 0 in w.tl.files
    assert synced == []  # nothing msynced on the loop when the file was created
    w.flush()
    assert any(start == 0 for start, _n in synced)  # the flush covers the header's page
    w.close()
    log.close()


def test_a_timer_log_file_whose_header_never_reached_the_disk_is_deleted_at_open(tmp_path: Path) -> None:
    _seed(tmp_path)
    tl = tmp_path / "wheel" / "tl"
    stray = tl / f"{16:020d}.tl"
    body = bytearray((tl / f"{0:020d}.tl").read_bytes())
    body[:HEADER_SIZE] = bytes(HEADER_SIZE)  # a power loss kept entries but not the header
    body[HEADER_SIZE : HEADER_SIZE + 8] = (T0).to_bytes(8, "little")
    stray.write_bytes(bytes(body))
    log = _log(tmp_path)
    w = _wheel(tmp_path, log)
    assert not stray.exists()
    assert sorted(w.tl.files) == [0]
    w.close()
    log.close()
