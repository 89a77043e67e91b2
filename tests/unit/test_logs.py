"""The log lines of ``run`` go through a writer thread (``logs.LineWriter``): a sink that blocks
never blocks the thread that logs, the lines keep their order, what overflows the queue is
counted and said, and everything queued is written by a drain or at close."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest

from sidecar import logs


class Sink:
    """A binary file whose writes block while ``gate`` is clear."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.chunks: list[bytes] = []
        self.writing = threading.Event()  # a write has started (and may be blocked)

    def write(self, b: bytes) -> int:
        self.writing.set()
        self.gate.wait()
        self.chunks.append(bytes(b))
        return len(b)

    def flush(self) -> None:
        pass

    def lines(self) -> list[dict[str, Any]]:
        return [orjson.loads(x) for x in b"".join(self.chunks).splitlines()]


@pytest.fixture
def restore_logging() -> Any:
    yield
    logs.setup("info")  # back to plain stdout for the other tests


def test_a_blocked_sink_does_not_block_the_logger_and_the_order_holds(restore_logging: Any) -> None:
    sink = Sink()
    logs.setup("info", stream=sink, threaded=True)
    log = logs.get("t")
    done = threading.Event()

    def emit() -> None:
        for i in range(200):
            log.info("tick", i=i)
        done.set()

    t = threading.Thread(target=emit, daemon=True)
    t.start()
    assert done.wait(10), "logging waited for the sink"
    assert sink.writing.wait(5)  # the writer thread is stuck in the sink's write
    assert sink.chunks == []
    sink.gate.set()
    assert logs.flush(10)
    got = sink.lines()
    assert [e["i"] for e in got] == list(range(200)) and {e["event"] for e in got} == {"tick"}


def test_what_overflows_the_queue_is_dropped_counted_and_said(restore_logging: Any) -> None:
    sink = Sink()
    w = logs.LineWriter(sink, cap=5)  # type: ignore[arg-type]
    w.write(b'{"event":"first"}\n')
    assert sink.writing.wait(5)  # taken by the thread, blocked in the sink
    for i in range(20):
        w.write(orjson.dumps({"event": "n", "i": i}) + b"\n")
    assert w.dropped == 15  # five wait for the writer, the rest are dropped
    sink.gate.set()
    assert w.drain(10)
    got = sink.lines()
    assert [e["event"] for e in got] == ["first", "n", "n", "n", "n", "n", "logs.dropped"]
    assert [e.get("i") for e in got[1:6]] == [0, 1, 2, 3, 4]
    assert got[-1]["dropped"] == 15 and got[-1]["level"] == "warning"
    w.write(b'{"event":"later"}\n')
    assert w.drain(10) and sink.lines()[-1]["event"] == "later"  # said once
    w.close()


def test_close_writes_everything_queued(restore_logging: Any) -> None:
    sink = Sink()
    sink.gate.set()
    w = logs.LineWriter(sink)  # type: ignore[arg-type]
    for i in range(1000):
        w.write(orjson.dumps({"event": "n", "i": i}) + b"\n")
    w.close()
    assert [e["i"] for e in sink.lines()] == list(range(1000))
    assert not w._thread.is_alive()


def test_without_the_writer_lines_are_written_by_the_caller(restore_logging: Any) -> None:
    sink = Sink()
    sink.gate.set()
    logs.setup("info", stream=sink)
    logs.get("t").info("direct", n=1)
    assert sink.lines() == [{"n": 1, "event": "direct", "level": "info", "timestamp": sink.lines()[0]["timestamp"]}]


def test_the_start_hook_runs_first_on_the_writer_thread() -> None:
    """``run`` passes the thread policy's ``demote_self`` (logs cannot import it: it logs)."""
    sink = Sink()
    sink.gate.set()
    started: list[str] = []
    w = logs.LineWriter(sink, on_start=lambda: started.append(threading.current_thread().name))  # type: ignore[arg-type]
    w.write(b'{"event":"n"}\n')
    w.close()
    assert started == ["kds-log"] and sink.lines() == [{"event": "n"}]
