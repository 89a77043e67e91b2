"""The warm-up thread (``sidecar.engine.warmup``): its window policy against a simple model, and its
effect on real files: appends into warmed pages take no major fault, data and holes unchanged."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.engine import warmup
from sidecar.engine.warmup import PAGE, AppendWarmer, window
from sidecar.store import codec
from sidecar.store.log import CommitLog

SEG = 4 << 20


def model(head: int, sb: int, warmed: int, ahead: int) -> set[int]:
    """The pages the next call should cover, page by page: from the head's page (not those warmed
    already) to the page holding byte head + ahead - 1, inside the segment."""
    off = head % sb
    pages = {p for p in range(off // PAGE, -(-(off + ahead) // PAGE)) if p * PAGE < sb and p * PAGE >= warmed}
    return pages


@given(
    st.integers(min_value=1, max_value=64).map(lambda n: n * PAGE),
    st.integers(min_value=0, max_value=1 << 30),
    st.integers(min_value=0, max_value=80 * PAGE),
    st.integers(min_value=1, max_value=32).map(lambda n: n * PAGE),
)
def test_window_agrees_with_the_model(sb: int, head: int, warmed: int, ahead: int) -> None:
    warmed = min(warmed - warmed % PAGE, sb)
    got = window(head, sb, warmed, ahead)
    want = model(head, sb, warmed, ahead)
    if got is None:
        # skipped only when there is little to gain and the segment's end is not reached
        assert len(want) * PAGE < ahead // 4 or not want
        return
    start, end = got
    assert start % PAGE == 0 and (end % PAGE == 0 or end == sb)
    assert {p for p in range(start // PAGE, -(-end // PAGE))} == want
    assert start >= warmed and end <= sb


def test_window_examples() -> None:
    assert window(0, SEG, 0, 8 * PAGE) == (0, 8 * PAGE)
    assert window(100, SEG, 8 * PAGE, 8 * PAGE) is None  # all warm
    assert window(3 * PAGE + 5, SEG, 8 * PAGE, 8 * PAGE) == (8 * PAGE, 12 * PAGE)  # half the window: worth it
    assert window(SEG - 10, SEG, SEG, 8 * PAGE) is None  # warm to the end
    assert window(SEG - 10, SEG, SEG - PAGE, 8 * PAGE) == (SEG - PAGE, SEG)  # the rest, however short
    assert window(SEG + 10, SEG, 0, 8 * PAGE) == (0, 9 * PAGE)  # the next segment, from its start


def append(log: CommitLog, i: int) -> int:
    return log.append(
        rtype=codec.MESSAGE, due_ms=1, enqueue_ms=1, src_offset=i, src_partition=0, target_partition=-1,
        retry_count=0, level=0, rid=b"id-%d" % i, topic=b"t", key=None, value=bytes([i % 251 + 1]) * 200,
        headers_blob=b"",
    )


def majors_appending(log: CommitLog, first: int, n: int) -> int:
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
    for i in range(first, first + n):
        append(log, i)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - before


pytestmark = pytest.mark.skipif(not warmup.supported() or not hasattr(resource, "RUSAGE_THREAD"),
                                reason="needs posix_fadvise and per-thread rusage (Linux)")


def test_appends_into_warmed_pages_take_no_major_fault(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, SEG)
    list(log.recover(None, None))
    n = 2000  # ~450 KiB: ~110 pages
    cold = majors_appending(log, 0, n)
    if cold < 50:
        pytest.skip(f"this file system fills a hole without a major fault ({cold} for ~110 pages)")
    w = AppendWarmer(ahead=1 << 20)
    w.track([log])
    assert w.tick() > 0
    warm = majors_appending(log, n, n)
    assert warm <= 2, f"{warm} major faults appending into warmed pages (cold: {cold})"
    w.stop()
    log.close()


def test_warming_changes_no_byte_and_leaves_holes_on_disk(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, SEG)
    list(log.recover(None, None))
    positions = [append(log, i) for i in range(100)]
    w = AppendWarmer(ahead=2 << 20)
    w.track([log])
    assert w.tick() >= (2 << 20) - PAGE
    assert w.tick() == 0, "what is warm is not asked for again"
    positions += [append(log, i) for i in range(100, 200)]
    log.flush()
    for i, pos in enumerate(positions):
        rec = log.read(pos, verify=True)
        assert rec.src_offset == i and bytes(rec.value or b"") == bytes([i % 251 + 1]) * 200
    path = log.path_of(0)
    fd = os.open(path, os.O_RDONLY)
    try:
        data_end = os.lseek(fd, 0, os.SEEK_HOLE)  # the warmed pages past the data are not written
    finally:
        os.close(fd)
    assert data_end < 1 << 20, f"data up to {data_end}: warmed pages reached the disk"
    w.stop()
    log.close()


def test_the_thread_follows_the_head_into_new_segments_and_stops(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, 256 << 10)
    list(log.recover(None, None))
    w = AppendWarmer(ahead=64 << 10, period_s=0.005)
    w.track([log])
    w.start()
    try:
        for i in range(3000):  # ~660 KiB: three segments
            append(log, i)
            if i % 100 == 0:
                time.sleep(0.002)
        deadline = time.monotonic() + 5
        while w.warmed_bytes < 3 * (64 << 10) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.warmed_bytes >= 3 * (64 << 10)
        assert not w.failed
    finally:
        w.stop()
    assert w._thread is None and not w._cursors, "stopped: the thread joined, every descriptor closed"
    w.track([])
    log.close()
