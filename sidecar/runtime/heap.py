"""Giving freed heap back to the OS once a burst of work is over (docs/storage.md 9).

Why: the heap of a sidecar that has just ingested (or published) a burst keeps its high-water
mark. Most of it is librdkafka's: the consumer pre-fetches up to ``queued.max.messages.kbytes``
(64 MiB by default) of fetch responses, allocated on its broker thread and so in a glibc
per-thread arena, and frees them on the loop thread once the records are consumed. Freed
chunks are returned to the OS only from the top of an arena; one live chunk above them (the
current fetch buffer) pins the rest. Measured after loading one million pending records: 47 MiB
of such free-but-resident pages in one arena (levels; the amount depends on where the last live
chunks happen to sit, 9-51 MiB across runs), i.e. up to 50 B of RSS per pending record that no
record owns.

What: glibc's ``malloc_trim(0)`` walks every arena and ``madvise(MADV_DONTNEED)``s the whole
free pages inside it, not only the top. It costs ~0.25 ms per MiB released (page-table work) and
~1 ms when there is nothing to release, so it is not for the hot path: :class:`HeapReleaser`
calls it once a burst is over — after a trim interval (``TRIM_INTERVAL_S``, 200 ms) in which
nothing was consumed or delivered, following one in which something was — and at most once per
``min_gap_s``. The call runs on a worker thread (ctypes releases the GIL), so the loop does not
wait for it (only a checkpoint job queued behind it on that thread does, and the release only
happens when idle).

Where there is no ``malloc_trim`` (musl, macOS) :func:`release_heap` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        fn: Any = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_MALLOC_TRIM = _load_malloc_trim()


def available() -> bool:
    """Whether this C library has ``malloc_trim`` (glibc)."""
    return _MALLOC_TRIM is not None


def release_heap() -> bool:
    """Return the free pages of every malloc arena to the OS; True if some were released."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))


class HeapReleaser:
    """Decides when to call :func:`release_heap`: at the end of a burst of work.

    ``tick(work, now)`` is called once per commit interval with a counter of the work done so far
    (records consumed + delivered) and a monotonic time in seconds. The heap is released when the
    counter did not move since the previous tick, it did move since the previous release, and
    the previous release is at least ``min_gap_s`` old (a burst pattern shorter than that waits
    for the gap, not for the next burst). ``executor`` runs the call off the caller's thread;
    without one it runs inline."""

    def __init__(self, min_gap_s: float = 1.0, executor: Executor | None = None,
                 release: Callable[[], bool] = release_heap) -> None:
        self.min_gap_s = min_gap_s
        self.executor = executor
        self._release = release
        self._seen: int | None = None
        self._grown = False  # work was done since the last release (or start-up)
        self._released_at: float | None = None
        self.releases = 0

    def tick(self, work: int, now: float) -> bool:
        """Returns True if a release was started."""
        if work != self._seen:
            self._grown = True  # the first tick too: start-up and recovery leave freed heap as well
            self._seen = work
            return False
        if not self._grown or (self._released_at is not None and now - self._released_at < self.min_gap_s):
            return False
        self._grown = False
        self._released_at = now
        self.releases += 1
        if self.executor is not None:
            self.executor.submit(self._release)
        else:
            self._release()
        return True
