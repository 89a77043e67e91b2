"""The id index's C slot writes go to the file with pwrite (``_native.idx_write_through``), not
through the shared mapping: a store into a mapped page that is clean write-faults, and the next
sync write-protects the page again with a TLB shootdown; a table of GiBs takes each insert on
another page (docs/benchmarks.md, runs n-p)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from sidecar.store.codec import native
from sidecar.store.idindex import HEADER_SIZE, SLOT, SLOT_SIZE, IdIndex

pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built (or KDS_PURE_PYTHON=1)")

CAP = 1 << 20  # 16 MiB: 4096 pages


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _inserts_fault(d: Path, native_on: bool) -> tuple[int, IdIndex]:
    d.mkdir()
    ix = IdIndex(d, initial_capacity=CAP, native=native_on)
    ix.restore(None)
    bytes(ix.f.buf)  # every page mapped (read): what a probe leaves behind
    before = _faults()
    for k in range(3000):  # ~3000 distinct pages of 4096
        ix.put(2 + k * 0x9E3779B97F4A7C15 % (1 << 60), k + 1)
    return _faults() - before, ix


def test_native_slot_writes_do_not_fault_mapped_pages(tmp_path: Path) -> None:
    """3000 inserts into pages mapped for reading: through the mapping each is a write fault
    (the Python twin shows it), written through, next to none."""
    via_map, py = _inserts_fault(tmp_path / "py", native_on=False)
    py.close()
    through, ix = _inserts_fault(tmp_path / "c", native_on=True)
    assert via_map > 2000  # the fault the write-through avoids, measured
    assert through < 300
    # and the bytes are where a probe (through the mapping) and the file both see them
    assert all(ix.find(2 + k * 0x9E3779B97F4A7C15 % (1 << 60)) == [k + 1] for k in range(0, 3000, 7))
    with open(ix.f.path, "rb") as f:
        raw = f.read()
    assert raw[HEADER_SIZE:] == bytes(ix.f.buf[HEADER_SIZE:])
    assert sum(1 for i in range(CAP) if SLOT.unpack_from(raw, HEADER_SIZE + i * SLOT_SIZE)[0] > 1) == 3000
    ix.close()


def test_a_closed_table_is_released_and_its_descriptor_closed(tmp_path: Path) -> None:
    """The registration holds the mapping's buffer, so close must end it first: the mapping is
    unmapped (its buffer released) and the descriptor closed, also for a migrated table's old one."""
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    fds_before = len(os.listdir("/proc/self/fd"))
    for k in range(40):  # two growths: 16 -> 32 -> 64 -> 128 slots
        ix.put(2 + k * 7919, k + 1)
    while ix.migrating:
        ix.step(0, 1000)
    ix.flush()
    ix.reclaim()
    f = ix.f
    ix.close()
    assert f.mm.closed
    assert len(os.listdir("/proc/self/fd")) <= fds_before - 1  # the first table's descriptor too
