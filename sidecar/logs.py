"""structlog set up the way its performance guide recommends.

A filtering bound logger (disabled levels cost one method call that returns ``None``), the
orjson renderer writing bytes through ``BytesLoggerFactory``, contextvars for per-partition
context, and ``cache_logger_on_first_use``. Event names are stable identifiers
(``sidecar.started``, ``partitions.assigned``, ``stats``, ...): dashboards and alerts key on them.
There are no per-message lines at info level: the loop logs per batch and per interval.

**Who writes.** By default each line is written to stdout by the thread that logs it. The long-running
``run`` hands its lines to a writer thread instead (``setup(threaded=True)``, :class:`LineWriter`):
a ``write`` to stdout can block, on a pipe whose reader lags (a container runtime's log driver) or on
a file whose next block waits for the file system's journal (the bench's sidecar logs to a file on
the store's disk: a loop turn of 146 ms, 141 of them blocked in its housekeeping phase, where the
``stats`` line is written, at 100M pending in the ``scale`` bench scenario), and every due record
waits for the loop. The writer keeps the order of the lines; at most ``LINES_QUEUED`` wait for it,
past that a line is dropped and counted, and the count is written as a ``logs.dropped`` line once
the writer has caught up. It is drained at interpreter exit (``atexit``) and by ``flush``.
"""

from __future__ import annotations

import atexit
import logging
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LINES_QUEUED = 100_000


class LineWriter:
    """A file-like sink for ``BytesLoggerFactory``: ``write`` queues, a thread writes and flushes.
    One per process (``setup``)."""

    def __init__(self, out: BinaryIO, cap: int = LINES_QUEUED, on_start: Callable[[], object] | None = None) -> None:
        self.out = out
        self.cap = cap
        # run first on the writer's thread: ``run`` passes ``runtime.threads.demote_self`` (SCHED_BATCH:
        # a finished write must not preempt the loop) unless ``helper-threads = none``. Injected, as
        # the thread policy logs through this module.
        self._on_start = on_start
        self.dropped = 0
        self._reported = 0  # of ``dropped``, written as logs.dropped lines so far
        # a line; an Event: set once every line before it is written (``drain``); None: stop
        self._queue: queue.SimpleQueue[bytes | threading.Event | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kds-log", daemon=True)
        self._thread.start()

    def write(self, line: bytes) -> None:
        if self._queue.qsize() >= self.cap:
            self.dropped += 1
            return
        self._queue.put(line)

    def flush(self) -> None:
        """Nothing to do here: the thread flushes after each write. (``BytesLogger`` calls it per line.)"""

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until every line queued so far is written; False if that took over ``timeout``."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self) -> None:
        if self._thread.is_alive():
            self.drain()
            self._queue.put(None)
            self._thread.join(5.0)

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        q = self._queue
        stop = False
        while not stop:
            lines: list[bytes] = []
            marks: list[threading.Event] = []
            item = q.get()
            while True:  # what queued meanwhile goes in the same write
                if item is None:
                    stop = True
                    break
                if isinstance(item, threading.Event):
                    marks.append(item)
                else:
                    lines.append(item)
                if len(lines) >= 1024:
                    break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
            if self.dropped != self._reported:
                n, self._reported = self.dropped - self._reported, self.dropped
                lines.append(orjson.dumps({"dropped": n, "queued_max": self.cap, "event": "logs.dropped",
                                           "level": "warning"}) + b"\n")
            if lines:
                try:
                    self.out.write(b"".join(lines))
                    self.out.flush()
                except (OSError, ValueError):  # stdout closed or gone: nothing else to write to
                    pass
            for m in marks:
                m.set()


_writer: LineWriter | None = None


def setup(level: str = "info", stream: Any = None, threaded: bool = False,
          on_start: Callable[[], object] | None = None) -> None:
    """Configure structlog. ``threaded``: lines go through one :class:`LineWriter` (``run``), whose
    thread first calls ``on_start``."""
    global _writer
    out = stream or sys.stdout.buffer
    if threaded:
        if _writer is None or _writer.out is not out:
            if _writer is not None:
                _writer.close()
            _writer = LineWriter(out, on_start=on_start)
            atexit.register(_writer.close)
        out = _writer
    structlog.configure(
        cache_logger_on_first_use=True,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        logger_factory=structlog.BytesLoggerFactory(file=out),
    )


def flush(timeout: float = 5.0) -> bool:
    """Wait for the writer thread (if any) to write every line logged so far."""
    return _writer.drain(timeout) if _writer is not None else True


def get(name: str) -> Any:
    return structlog.get_logger(name)
