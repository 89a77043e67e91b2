"""Giving freed heap back to the OS (``sidecar.runtime.heap``): the pages a burst left in a malloc
arena really leave RSS, and the releaser fires once per burst, at its end, not on the hot path.
The RSS test uses real allocations and ``/proc/self/status``, no mocks."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sidecar.runtime import heap
from sidecar.runtime.heap import HeapReleaser
from tests.infra import needs

MiB = 1 << 20


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@needs(heap.available() and os.path.exists("/proc/self/status"), "glibc's malloc_trim and /proc/self/status")
def test_release_drops_free_pages_pinned_inside_a_thread_arena() -> None:
    """The sidecar's case: a burst of buffers allocated on another thread (librdkafka's broker
    thread, hence a per-thread arena), freed except a few that stay live above the rest, so that
    free() alone cannot shrink the arena from its top."""
    chunk = 32 * 1024  # below the mmap threshold: from the arena, like fetch buffer segments
    count = 2048  # 64 MiB
    kept: list[bytes] = []
    freed: list[bytes] = []

    def burst() -> None:
        for i in range(count):
            (kept if i % 64 == 63 else freed).append(b"\x01" * chunk)

    t = threading.Thread(target=burst)
    t.start()
    t.join()
    heap.release_heap()  # start from a trimmed heap: only this test's pages are in question
    freed.clear()
    before = rss_anon()
    assert heap.release_heap()
    after = rss_anon()
    freed_bytes = (count - len(kept)) * chunk
    # Without the release those pages stay resident (free() returns only an arena's top); with it
    # all but the pages shared with live chunks' headers go.
    assert before - after >= freed_bytes // 2, (before, after, freed_bytes)
    assert all(len(b) == chunk and b[0] == 1 and b[-1] == 1 for b in kept)  # live data untouched


def test_release_without_malloc_trim_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_MALLOC_TRIM", None)
    assert not heap.release_heap()


def test_releaser_fires_once_at_the_end_of_each_burst() -> None:
    calls: list[float] = []
    now = 0.0
    r = HeapReleaser(min_gap_s=1.0, release=lambda: calls.append(now) is None)

    def tick(work: int, t: float) -> bool:
        nonlocal now
        now = t
        return r.tick(work, t)

    assert not tick(0, 0.0)  # first sight: start-up counts as work
    assert tick(0, 0.2)  # idle after it: released
    assert not tick(0, 0.4) and not tick(0, 5.0)  # still idle, nothing new: not again
    for i, t in enumerate((5.2, 5.4, 5.6, 5.8)):  # a burst: never while work goes on
        assert not tick(100 * (i + 1), t)
    assert tick(400, 6.0)  # the interval after the burst
    assert calls == [0.2, 6.0]


def test_releaser_spaces_releases_by_min_gap() -> None:
    calls: list[int] = []
    r = HeapReleaser(min_gap_s=1.0, release=lambda: calls.append(1) is None)
    r.tick(0, 0.0)
    assert r.tick(0, 0.2)
    r.tick(10, 0.4)  # a short burst right after
    assert not r.tick(10, 0.6)  # over, but within the gap: waits ...
    assert not r.tick(10, 1.0)
    assert r.tick(10, 1.2)  # ... for the gap, not for the next burst
    assert len(calls) == 2 and r.releases == 2


def test_releaser_runs_the_release_on_the_executor() -> None:
    threads: list[str] = []
    done = threading.Event()

    def release() -> bool:
        threads.append(threading.current_thread().name)
        done.set()
        return True

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-heap") as ex:
        r = HeapReleaser(executor=ex, release=release)
        r.tick(1, 0.0)
        assert r.tick(1, 0.2)
        assert done.wait(10)
    assert threads and threads[0].startswith("test-heap")
