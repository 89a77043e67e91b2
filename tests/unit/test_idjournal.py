"""The id index's journal (``sidecar.store.idjournal``): blocks written, read back up to a
checkpointed length, damage within that length refused, damage past it ignored, the durability
hooks (``note_sync`` with and without a batch), the inspector's ``scan`` and the file names."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.store import idjournal
from sidecar.store.idjournal import BLOCK, MAGIC, VERSION, JournalWriter, generations, path_of, read, scan
from sidecar.store.idslot import SLOT
from sidecar.store.mapped import (
    HEADER_SIZE,
    GeometryMismatch,
    StoreError,
    deferred_disposal,
    deferred_sync,
    header_bytes,
)


def _records(*pairs: tuple[int, int]) -> bytes:
    return b"".join(SLOT.pack(h, ref) for h, ref in pairs)


PAYLOADS = [
    _records((2, 10)),
    _records((3, 11), (4, 12), (5, 13)),
    _records((6, 14), (7, 15)),
]


def _write(directory: Path, g: int, payloads: list[bytes]) -> tuple[JournalWriter, list[int]]:
    """A journal of ``payloads``; the lengths after each append (the first: the bare header)."""
    w = JournalWriter(directory, g)
    lengths = [w.length]
    for p in payloads:
        lengths.append(w.append(p))
    return w, lengths


def _flip(path: Path, offset: int, mask: int = 0x40) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(data)


def test_round_trip_of_several_appends(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 5, PAYLOADS)
    assert lengths[0] == HEADER_SIZE
    assert lengths[1:] == [
        HEADER_SIZE + sum(BLOCK.size + len(p) for p in PAYLOADS[:k]) for k in range(1, len(PAYLOADS) + 1)
    ]
    assert w.length == lengths[-1] == os.path.getsize(path_of(tmp_path, 5))
    w.note_sync()
    w.close()
    assert read(tmp_path, 5, lengths[-1]) == b"".join(PAYLOADS)
    assert path_of(tmp_path, 5).read_bytes()[:HEADER_SIZE] == header_bytes(MAGIC, VERSION, 16, 5, 0)


def test_empty_payload_writes_nothing_and_partial_records_are_refused(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 0, PAYLOADS[:1])
    assert w.append(b"") == lengths[-1]
    assert w.append(memoryview(bytearray())) == lengths[-1]
    with pytest.raises(ValueError, match="16-byte records"):
        w.append(b"x" * 24)
    assert os.path.getsize(w.path) == w.length == lengths[-1]
    # a memoryview of another format counts bytes, not items
    assert w.append(memoryview(PAYLOADS[1]).cast("Q")) == lengths[-1] + BLOCK.size + len(PAYLOADS[1])
    w.close()
    assert read(tmp_path, 0, w.length) == PAYLOADS[0] + PAYLOADS[1]


def test_read_stops_at_the_checkpointed_length_and_truncate_cuts_the_rest(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 1, PAYLOADS)
    w.close()
    path = path_of(tmp_path, 1)
    assert read(tmp_path, 1, lengths[1]) == PAYLOADS[0]
    assert read(tmp_path, 1, lengths[0]) == b"", "the bare header: a generation with nothing journaled"
    assert os.path.getsize(path) == lengths[-1], "read leaves the file alone"
    idjournal.truncate(tmp_path, 1, lengths[2])
    assert os.path.getsize(path) == lengths[2]
    assert read(tmp_path, 1, lengths[2]) == PAYLOADS[0] + PAYLOADS[1]
    with pytest.raises(StoreError, match="cannot cut"):
        idjournal.truncate(tmp_path, 1, lengths[-1])  # longer than the file


def test_resume_cuts_past_the_checkpoint_then_appends(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 2, PAYLOADS)
    w.close()
    extra = _records((99, 1))
    r = JournalWriter.resume(tmp_path, 2, lengths[1])
    assert r.length == lengths[1]
    end = r.append(extra)
    r.note_sync()
    r.close()
    assert os.path.getsize(path_of(tmp_path, 2)) == end
    # the blocks after the checkpoint are gone, not replayed behind the new one
    assert read(tmp_path, 2, end) == PAYLOADS[0] + extra
    assert scan(tmp_path, 2) == (PAYLOADS[0] + extra, end)


def test_a_torn_block_past_the_checkpointed_length_is_ignored(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 3, PAYLOADS)
    w.close()
    path = path_of(tmp_path, 3)
    os.truncate(path, lengths[-1] - 5)  # the crash tore the last block
    assert read(tmp_path, 3, lengths[2]) == PAYLOADS[0] + PAYLOADS[1]
    # garbage after the checkpointed length is not looked at either
    with open(path, "r+b") as f:
        f.seek(lengths[2])
        f.write(b"\xff" * 40)
    assert read(tmp_path, 3, lengths[2]) == PAYLOADS[0] + PAYLOADS[1]


@pytest.mark.parametrize(
    ("where", "mask", "what"),
    [
        (BLOCK.size + 3, 0x40, r"corrupt block \(CRC mismatch\)"),  # the payload
        (5, 0x01, r"corrupt block \(CRC mismatch\)"),  # the CRC
        (0, 0x01, "invalid block length 49"),  # the length: 48 -> 49, not whole records
        (0, 0x20, r"corrupt block \(CRC mismatch\)"),  # 48 -> 16: whole records, the wrong ones
        (0, 0x40, r"torn block \(112 bytes, 88 present\)"),  # 48 -> 112: past the checkpointed length
    ],
    ids=["payload", "crc", "length-odd", "length-shorter", "length-longer"],
)
def test_a_flipped_byte_within_the_checkpointed_length_is_corruption(
    tmp_path: Path, where: int, mask: int, what: str
) -> None:
    w, lengths = _write(tmp_path, 4, PAYLOADS)
    w.close()
    path = path_of(tmp_path, 4)
    assert len(PAYLOADS[1]) == 48
    _flip(path, lengths[1] + where, mask)  # in the second block
    with pytest.raises(StoreError, match=rf"{path}: {what} at offset {lengths[1]}, within the checkpointed length"):
        read(tmp_path, 4, lengths[-1])
    # before the damage, the journal still reads
    assert read(tmp_path, 4, lengths[1]) == PAYLOADS[0]


def test_blocks_must_end_exactly_at_the_checkpointed_length(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 4, PAYLOADS)
    w.close()
    with pytest.raises(StoreError, match=rf"torn block .* at offset {lengths[1]}\b"):
        read(tmp_path, 4, lengths[2] - 16)
    with pytest.raises(StoreError, match=rf"torn block header at offset {lengths[1]}\b"):
        read(tmp_path, 4, lengths[1] + 4)
    with pytest.raises(StoreError, match="less than the 64-byte header"):
        read(tmp_path, 4, HEADER_SIZE - 1)


def test_a_file_shorter_than_the_checkpointed_length_or_missing_is_corruption(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 6, PAYLOADS)
    w.close()
    path = path_of(tmp_path, 6)
    os.truncate(path, lengths[-1] - 1)
    with pytest.raises(StoreError, match=rf"{path}: {lengths[-1] - 1} bytes, but the checkpoint names {lengths[-1]}"):
        read(tmp_path, 6, lengths[-1])
    path.unlink()
    with pytest.raises(StoreError, match=rf"{path}: missing"):
        read(tmp_path, 6, lengths[1])


def _with_header(directory: Path, g: int, header: bytes) -> int:
    """Generation ``g``'s journal with one block, its header replaced; returns its length."""
    w, lengths = _write(directory, g, PAYLOADS[:1])
    w.close()
    with open(w.path, "r+b") as f:
        f.write(header)
    return lengths[-1]


@pytest.mark.parametrize(
    ("header", "error", "message"),
    [
        (header_bytes(b"KDSIDX\x00\x01", VERSION, 16, 7, 0), StoreError, "not a"),
        (header_bytes(MAGIC, VERSION + 1, 16, 7, 0), GeometryMismatch, "format version 2"),
        (header_bytes(MAGIC, VERSION, 32, 7, 0), GeometryMismatch, "record size 32"),
        (header_bytes(MAGIC, VERSION, 16, 8, 0), StoreError, r"generation 8 does not match its name \(7\)"),
        (header_bytes(MAGIC, VERSION, 16, 7, 3), StoreError, "base 3"),
        (header_bytes(MAGIC, VERSION, 16, 7, 0)[:-1] + b"\x00", StoreError, "header is corrupt"),
        (bytes(HEADER_SIZE), StoreError, "header is corrupt"),
    ],
    ids=["magic", "version", "record-size", "generation", "base", "crc", "zeros"],
)
def test_a_wrong_header_is_refused(tmp_path: Path, header: bytes, error: type[StoreError], message: str) -> None:
    length = _with_header(tmp_path, 7, header)
    path = path_of(tmp_path, 7)
    with pytest.raises(error, match=rf"{path}: .*{message}"):
        read(tmp_path, 7, length)
    with pytest.raises(error, match=message):
        scan(tmp_path, 7)


def test_a_journal_under_another_generations_name_is_refused(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 3, PAYLOADS)
    w.close()
    os.rename(path_of(tmp_path, 3), path_of(tmp_path, 4))
    with pytest.raises(StoreError, match=r"generation 3 does not match its name \(4\)"):
        read(tmp_path, 4, lengths[-1])


def test_note_sync_inside_a_batch_adds_the_file_and_the_directory_once(tmp_path: Path) -> None:
    w, _ = _write(tmp_path, 8, PAYLOADS[:2])
    with deferred_sync() as batch:
        w.note_sync()
    assert list(batch.files) == [str(w.path)]
    assert batch.dirs == [str(tmp_path)], "a new file: its directory entry must be synced too"
    batch.run()
    assert batch.files == {}
    w.append(PAYLOADS[2])
    with deferred_sync() as batch2:
        w.note_sync()
    assert list(batch2.files) == [str(w.path)]
    assert batch2.dirs == [], "the name is durable since the first batch"
    w.close()  # before the batch runs: the batch syncs through a descriptor of its own
    batch2.run()
    assert read(tmp_path, 8, w.length) == b"".join(PAYLOADS)


def test_note_sync_outside_a_batch_syncs_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    dirs: list[Path] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fdatasync(fd)

    monkeypatch.setattr(idjournal.os, "fdatasync", fdatasync)
    monkeypatch.setattr(idjournal, "fsync_dir", dirs.append)
    w, _ = _write(tmp_path, 9, PAYLOADS[:1])
    inode = os.stat(w.path).st_ino
    w.note_sync()
    assert (synced, dirs) == ([inode], [tmp_path])
    w.append(PAYLOADS[1])
    w.note_sync()
    assert (synced, dirs) == ([inode, inode], [tmp_path]), "the directory only with the first sync"
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.note_sync()
    with pytest.raises(ValueError, match="closed"):
        w.append(PAYLOADS[0])


def test_a_leftover_file_is_rewritten_and_unlink_deletes(tmp_path: Path) -> None:
    w, _ = _write(tmp_path, 10, PAYLOADS)
    w.close()
    w2 = JournalWriter(tmp_path, 10)
    assert w2.length == HEADER_SIZE == os.path.getsize(w2.path)
    end = w2.append(PAYLOADS[2])
    assert read(tmp_path, 10, end) == PAYLOADS[2]
    assert scan(tmp_path, 10) == (PAYLOADS[2], end)
    w2.unlink()
    assert not w2.path.exists()
    w2.unlink()  # twice is harmless
    w2.close()


def test_scan_stops_at_the_first_torn_or_invalid_block(tmp_path: Path) -> None:
    w, lengths = _write(tmp_path, 11, PAYLOADS)
    w.close()
    path = path_of(tmp_path, 11)
    assert scan(tmp_path, 11) == (b"".join(PAYLOADS), lengths[-1])
    os.truncate(path, lengths[-1] - 3)
    assert scan(tmp_path, 11) == (PAYLOADS[0] + PAYLOADS[1], lengths[2])
    assert os.path.getsize(path) == lengths[-1] - 3, "scan leaves the file alone"
    _flip(path, lengths[1] + BLOCK.size)  # the second block's payload
    assert scan(tmp_path, 11) == (PAYLOADS[0], lengths[1])
    os.truncate(path, lengths[1] + 5)  # a torn block header
    assert scan(tmp_path, 11) == (PAYLOADS[0], lengths[1])


def test_generations_lists_sorts_and_ignores_junk(tmp_path: Path) -> None:
    for g in (10, 3, 2, 0):
        JournalWriter(tmp_path, g).close()
    for junk in ("ids.jnl.", "ids.jnl.x", "ids.jnl.3.tmp", "ids.jnl.-1", "ids.jnl.007", "ids.jnl.²", "ids.idx",
                 "checkpoint.json", "xids.jnl.4"):
        (tmp_path / junk).write_bytes(b"")
    (tmp_path / "ids.jnl.12").mkdir()
    assert generations(tmp_path) == [0, 2, 3, 10]
    assert path_of(tmp_path, 3) == tmp_path / "ids.jnl.3"
    with pytest.raises(ValueError):
        path_of(tmp_path, -1)
    idjournal.remove(tmp_path, 3)
    idjournal.remove(tmp_path, 3)  # missing is fine
    assert generations(tmp_path) == [0, 2, 10]


_record = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)).map(lambda p: SLOT.pack(*p))
_payload = st.lists(_record, min_size=0, max_size=6).map(b"".join)


@settings(max_examples=150, deadline=None)
@given(payloads=st.lists(_payload, max_size=8), data=st.data())
def test_property_read_returns_exactly_the_payloads_before_the_cut(payloads: list[bytes], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        w, lengths = _write(directory, 42, payloads)
        w.close()
        cut = data.draw(st.integers(0, len(payloads)), label="blocks before the checkpoint")
        # what the crash left past the checkpoint: anything from nothing to all of it
        size = data.draw(st.integers(lengths[cut], lengths[-1]), label="file size after the crash")
        os.truncate(path_of(directory, 42), size)
        assert read(directory, 42, lengths[cut]) == b"".join(payloads[:cut])
        payloads_scanned, end = scan(directory, 42)
        whole = max(k for k in range(len(lengths)) if lengths[k] <= size)
        assert (payloads_scanned, end) == (b"".join(payloads[:whole]), lengths[whole])


def test_block_layout_is_length_crc_payload(tmp_path: Path) -> None:
    """The on-disk layout the docstring promises, decoded without the module's reader."""
    from crc32c import crc32c

    w, _ = _write(tmp_path, 1, PAYLOADS[:1])
    w.close()
    raw = w.path.read_bytes()
    n, crc = struct.unpack_from("<II", raw, HEADER_SIZE)
    assert n == len(PAYLOADS[0])
    assert crc == crc32c(PAYLOADS[0])
    assert raw[HEADER_SIZE + 8:] == PAYLOADS[0]


def test_a_merged_journal_is_deleted_by_the_disposal_not_by_the_loop(tmp_path: Path) -> None:
    """Inside ``deferred_disposal`` (a checkpoint's finish on the loop) ``remove`` only notes the
    journal: the disposal deletes it, on the flusher (an ``unlink`` may wait for the device's
    discards). Outside one, and for a journal gone already, it deletes at once."""
    w, _ = _write(tmp_path, 7, [_records((5, 6))])
    w.close()
    with deferred_disposal() as gone:
        idjournal.remove(tmp_path, 7)
        idjournal.remove(tmp_path, 8)  # never written
    assert path_of(tmp_path, 7).exists() and gone
    gone.run()
    assert not path_of(tmp_path, 7).exists() and not gone
    w, _ = _write(tmp_path, 9, [_records((5, 6))])
    w.close()
    idjournal.remove(tmp_path, 9)
    assert generations(tmp_path) == []
