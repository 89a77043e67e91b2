"""Warming the page cache ahead of the appends: a helper thread fills the next pages of each head
segment before the loop writes them.

**Why.** A segment is a sparse file (``MappedFile``): every page the loop appends to is a hole
until then, and the first write to it is a fault that allocates a page-cache page, zero-fills it
and has the file system reserve its block, all on the loop thread (a "major" fault: it goes
through the file system's read path). At 40,000 records/s that is ~64 faults per 1,000 records,
and under memory pressure each allocation can enter direct reclaim in the faulting thread. In the
100M-pending scale runs (docs/benchmarks.md) most slow loop turns were ingest turns with ~60 such
faults and far less CPU time than wall time. RocketMQ warms each new mapped file from a helper
service (``AllocateMappedFileService``) for the same reason.

**What.** ``AppendWarmer``, a daemon thread, wakes every ``PERIOD_S`` and for each tracked log
asks the kernel to bring the next ``AHEAD`` bytes after the log's head into the page cache:
``posix_fadvise(WILLNEED)`` on its own read-only descriptor of the head segment (a hole is
filled with zeros by the file system, without I/O). The loop's write then finds the page cached:
a minor fault, no allocation. The call runs without the GIL; the thread is ``SCHED_BATCH``
(``sidecar/engine/threads.py``): its wake-ups do not preempt the loop, and if it falls behind the
loop takes the faults itself, as it did before.

**Safe by construction.** The thread never writes and never maps: a hint about clean pages cannot
change data, a page warmed and never written stays a hole on disk (never dirtied, never written
back: recovery's ``SEEK_DATA`` scan is unchanged), and warmed pages are page cache, not this
process's RSS. It reads ``head`` and the segment geometry of the logs the loop hands it (ints,
read under the GIL); a segment deleted meanwhile is harmless to advise.

The level queues' and the timer log's files are appended to as well, at 16-32 bytes a record
against the log's ~200: they are left to the loop.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sidecar import logs
from sidecar.engine.threads import demote_self

log = logs.get("sidecar")

AHEAD = 8 << 20  # bytes kept warm after the head: ~1 s of appends at 40 MB/s
PERIOD_S = 0.02
PAGE = 4096
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)


def supported() -> bool:
    """Whether this platform can be asked to fill a file's pages (``posix_fadvise``)."""
    return _WILLNEED is not None and hasattr(os, "posix_fadvise")


class Appended(Protocol):
    """What the warmer reads of a log (``CommitLog``)."""

    head: int
    segment_bytes: int

    def path_of(self, index: int) -> Path: ...


def window(head: int, segment_bytes: int, warmed: int, ahead: int) -> tuple[int, int] | None:
    """The byte range of the head's segment to warm next, or None (nothing worth a call).

    ``warmed``: how far the segment of ``head`` is warmed already (an offset in it; 0 for none).
    The range starts at the head's page or at ``warmed``, whichever is later, and ends ``ahead``
    bytes after the head (page-aligned up) or at the segment's end; it is asked for once at least a
    quarter of ``ahead`` (or the rest of the segment) can be gained, so calls stay few."""
    off = head % segment_bytes
    start = max(off - off % PAGE, warmed)
    end = min(-(-(off + ahead) // PAGE) * PAGE, segment_bytes)
    if end <= start:
        return None
    if end - start < ahead // 4 and end < segment_bytes:
        return None
    return start, end


@dataclass
class _Cursor:
    index: int
    fd: int
    warmed: int


class AppendWarmer:
    """Keeps ``ahead`` bytes after each tracked log's head in the page cache (module docstring).
    ``track`` is called by the loop; ``tick`` by the thread (or by a test, synchronously)."""

    def __init__(self, ahead: int = AHEAD, period_s: float = PERIOD_S) -> None:
        self.ahead, self.period_s = ahead, period_s
        self._logs: tuple[Appended, ...] = ()
        self._cursors: dict[int, tuple[Appended, _Cursor]] = {}  # id(log) -> (log, cursor)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.warmed_bytes = 0
        self.failed = False

    def track(self, logs: Iterable[Appended]) -> None:
        """The logs to keep warm from now on (the loop's owned stores'); replaces the previous set."""
        self._logs = tuple(logs)

    def start(self) -> None:
        if not supported() or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="kds-warmup", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self._close_all()

    def _run(self) -> None:
        demote_self()
        while not self._stop.wait(self.period_s):
            try:
                self.tick()
            except Exception as e:  # a hint that failed costs the loop faults, never data
                if not self.failed:
                    self.failed = True
                    log.warning("warmup.failed", error=repr(e),
                                action="none needed: appends take their own page faults meanwhile")

    def tick(self) -> int:
        """One round over the tracked logs; return the bytes asked for."""
        logs = self._logs
        keep = {id(lg) for lg in logs}
        for key in [k for k in self._cursors if k not in keep]:
            os.close(self._cursors.pop(key)[1].fd)
        asked = 0
        for lg in logs:
            asked += self._warm(lg)
        self.warmed_bytes += asked
        return asked

    def _warm(self, lg: Appended) -> int:
        head, sb = lg.head, lg.segment_bytes
        index = head // sb
        entry = self._cursors.get(id(lg))
        cur = entry[1] if entry is not None else None
        if cur is None or cur.index != index:
            try:
                fd = os.open(lg.path_of(index), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # the loop creates it with its first append
                return 0
            if cur is not None:
                os.close(cur.fd)
            cur = _Cursor(index, fd, 0)
            self._cursors[id(lg)] = (lg, cur)
        span = window(head, sb, cur.warmed, self.ahead)
        if span is None:
            return 0
        start, end = span
        assert _WILLNEED is not None
        os.posix_fadvise(cur.fd, start, end - start, _WILLNEED)
        cur.warmed = end
        return end - start

    def _close_all(self) -> None:
        for _lg, cur in self._cursors.values():
            with contextlib.suppress(OSError):
                os.close(cur.fd)
        self._cursors.clear()
