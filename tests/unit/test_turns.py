"""The slow-turn watch: what it counts, what it logs, and that it cannot flood the log."""

from __future__ import annotations

import gc

from structlog.testing import capture_logs

from sidecar.engine.turns import LOG_EVERY_S, SLOW_TURN_S, TurnWatch


def _turn(start: float, phases_ms: tuple[float, float, float, float, float]) -> tuple[float, ...]:
    """perf_counter readings t0..t5 for a turn that starts at ``start`` with these phase lengths."""
    ts = [start]
    for ms in phases_ms:
        ts.append(ts[-1] + ms / 1000)
    return tuple(ts)


def test_slow_turn_is_logged_with_its_phases() -> None:
    w = TurnWatch()
    t = _turn(100.0, (30.0, 5.0, 80.0, 1.0, 2.0))  # publish took 80 ms
    w.parts[1], w.parts[3] = 0.0004, 0.0005  # the loop's begin and trim steps ran
    with capture_logs() as logs:
        w.slow(*t, consumed=250, in_flight=17)
    (ev,) = logs
    assert ev["event"] == "loop.slow_turn"
    assert ev["log_level"] == "warning"
    assert ev["turn_ms"] == 88.0  # the consume wait is not part of the turn's work
    assert ev["consume_wait_ms"] == 30.0
    assert (ev["ingest_ms"], ev["publish_ms"], ev["checkpoint_ms"], ev["housekeeping_ms"]) == (5.0, 80.0, 1.0, 2.0)
    assert (ev["reap_ms"], ev["begin_ms"], ev["index_ms"], ev["trim_ms"]) == (0.0, 0.4, 0.0, 0.5)
    assert (ev["consumed"], ev["in_flight"], ev["suppressed"]) == (250, 17, 0)
    w.mark()
    assert w.parts == [0.0, 0.0, 0.0, 0.0], "each turn's steps start from nothing"
    assert w.take() == (1, 1, 88.0)  # slow() does not count turns: mark() does
    assert w.take() == (0, 0, 0.0)  # reset by take()


def test_log_is_rate_limited_but_every_slow_turn_counted() -> None:
    w = TurnWatch()
    start = 50.0
    with capture_logs() as logs:
        for i in range(10):  # ten slow turns within much less than LOG_EVERY_S
            w.slow(*_turn(start + i * 0.1 * LOG_EVERY_S, (0.0, 60.0 + i, 0.0, 0.0, 0.0)), consumed=1, in_flight=0)
        w.slow(*_turn(start + 2 * LOG_EVERY_S, (0.0, 70.0, 0.0, 0.0, 0.0)), consumed=1, in_flight=0)
    assert [ev["suppressed"] for ev in logs] == [0, 9]
    _, count, longest = w.take()
    assert count == 11
    assert longest == 70.0


def test_gc_inside_the_turn_is_reported() -> None:
    w = TurnWatch()
    w.install()
    try:
        import time

        t0 = time.perf_counter()
        gc.collect(1)
        t1 = time.perf_counter()
        with capture_logs() as logs:
            w.slow(t0, t0, t0, t0, t0, t1 + SLOW_TURN_S + 0.001, consumed=0, in_flight=0)
        (ev,) = logs
        assert ev["gc_generation"] == 1
        assert ev["gc_ms"] >= 0.0
        # a turn that started after the collection does not claim it
        with capture_logs() as logs:
            later = t1 + 10 * LOG_EVERY_S
            w.slow(later, later, later, later, later, later + 1.0, consumed=0, in_flight=0)
        assert logs[0]["gc_generation"] is None
    finally:
        w.uninstall()
    assert w._on_gc not in gc.callbacks


def test_thread_resource_use_over_the_turn_is_reported() -> None:
    import mmap
    import time

    w = TurnWatch()
    t0 = time.perf_counter()
    w.mark()
    # CPU work, and first touches of fresh anonymous pages (minor faults), between mark and slow;
    # the spin counts this thread's CPU time, not the wall clock, so a loaded machine that
    # preempts the thread cannot shorten the work the assertion below expects
    c0 = time.thread_time()
    x = 0
    while time.thread_time() - c0 < 0.06:
        x += 1
    m = mmap.mmap(-1, 256 * mmap.PAGESIZE)
    for i in range(0, len(m), mmap.PAGESIZE):
        m[i] = 1
    m.close()
    t1 = time.perf_counter()
    with capture_logs() as logs:
        w.slow(t0, t0, t1, t1, t1, t1, consumed=0, in_flight=0)
    (ev,) = logs
    assert ev["user_ms"] + ev["system_ms"] >= 50.0  # the 60 ms of this thread's CPU spent spinning
    assert ev["minor_faults"] >= 256
    for key in ("major_faults", "waits", "preemptions"):
        assert ev[key] >= 0


def test_a_wait_that_outlasts_its_timeout_is_a_late_wake() -> None:
    w = TurnWatch()
    with capture_logs() as logs:
        w.woke(0.030, 0.020, 10.0)  # 10 ms late: within SLOW_TURN_S
        w.woke(0.0, 0.005, 10.1)  # records were there: returned at once
        w.woke(0.020 + SLOW_TURN_S + 0.030, 0.020, 10.2)  # 80 ms past the timeout
        w.woke(0.200, 0.0, 10.3)  # rate limited, counted
        w.woke(0.100, 0.0, 10.3 + LOG_EVERY_S)
    assert [(ev["event"], ev["late_ms"], ev["timeout_ms"]) for ev in logs] == [
        ("loop.late_wake", 80.0, 20.0), ("loop.late_wake", 100.0, 0.0)]
    # the machine's doing, not the sidecar's (a quiet run on a loaded CI host must stay quiet)
    assert {ev["log_level"] for ev in logs} == {"info"}
    assert w.take_wakes() == (3, 200.0)
    assert w.take_wakes() == (0, 0.0)
    assert w.take() == (0, 0, 0.0)  # not slow turns
