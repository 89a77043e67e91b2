"""Slow loop turns: which phase of the event loop held up deliveries, and for how long.

Every due record waits for the loop turn that is running when it falls due, so a turn's length is
a floor under lateness: a 200 ms turn makes records 200 ms late no matter how precise the
scheduler is. The loop takes a ``perf_counter`` reading at each phase boundary (six per turn,
whatever the batch size) and hands them here only when the turn's work took longer than
``SLOW_TURN_S``; the wait inside ``consume`` is not work and is reported apart.

A slow turn is logged as ``loop.slow_turn`` with the time of each phase (consume, ingest,
publish + delivery reports, checkpoint, housekeeping), the checkpoint phase's steps (``reap_ms``:
finishing the flusher's jobs; ``begin_ms``: snapshotting new ones; ``index_ms``: the id indexes'
steps; ``trim_ms``: dropping mapped pages; each 0 when it did not run), the garbage collection that
ran inside it, and the loop thread's own resource use over the turn (``getrusage(RUSAGE_THREAD)``, read at
the start of every turn's work, one system call): user and system CPU time, page faults, and
context switches. They tell the three kinds of stall apart: a turn mostly of CPU time is work
(user) or kernel work such as page faults (system); a turn with little CPU and voluntary switches
waited in the kernel (a page fault blocked on the filesystem, a lock); involuntary switches with
little CPU mean the thread was runnable but another process had the core. A slow turn is logged
at most once per ``LOG_EVERY_S`` (the ones in between are counted in ``suppressed``), so an
overloaded sidecar cannot flood its log. ``stats`` carries the count and the longest turn since
the previous ``stats`` line.

A late wake is the other way the loop holds records up: ``consume`` is asked to wait at most until
the next record falls due, and returns more than ``SLOW_TURN_S`` after that (the thread woke late:
no free core, or another thread held the GIL when it wanted it back). No turn's work is slow
then, but the record due at the timeout waits as long. Logged as ``loop.late_wake`` at info
(``late_ms`` past the timeout, at most once per ``LOG_EVERY_S``); ``stats`` carries
``late_wakes`` and ``latest_wake_ms``.
"""

from __future__ import annotations

import gc
import resource
import time
from typing import Any

from sidecar import logs

log = logs.get("sidecar")

SLOW_TURN_S = 0.05  # a turn longer than this delays every record due during it by as much
LOG_EVERY_S = 1.0


class TurnWatch:
    __slots__ = ("_gc_gen", "_gc_ms", "_gc_start", "_gc_stop", "_last_log", "_last_wake_log", "_ru", "_suppressed",
                 "late_wakes", "max_ms", "max_wake_ms", "parts", "slow_turns", "turns")

    def __init__(self) -> None:
        self.turns = 0
        self.slow_turns = 0
        self.max_ms = 0.0
        self._last_log = -LOG_EVERY_S
        self._last_wake_log = -LOG_EVERY_S
        self.late_wakes = 0
        self.max_wake_ms = 0.0
        self._suppressed = 0
        self._gc_start = 0.0  # perf_counter at the start of the last collection
        self._gc_stop = 0.0
        self._gc_ms = 0.0
        self._gc_gen = -1
        self._ru = resource.getrusage(resource.RUSAGE_THREAD)
        # seconds of the checkpoint phase's steps this turn (reap, begin, index, trim): the loop
        # writes the ones that ran
        self.parts = [0.0, 0.0, 0.0, 0.0]

    def mark(self) -> None:
        """The start of a turn's work: counts the turn, and notes the thread's resource use so far
        for a slow turn's deltas."""
        self.turns += 1
        self._ru = resource.getrusage(resource.RUSAGE_THREAD)
        parts = self.parts
        parts[0] = parts[1] = parts[2] = parts[3] = 0.0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self._gc_stop = time.perf_counter()
            self._gc_ms = (self._gc_stop - self._gc_start) * 1000
            self._gc_gen = int(info.get("generation", -1))

    def slow(self, t0: float, t1: float, t2: float, t3: float, t4: float, t5: float, consumed: int,
             in_flight: int) -> None:
        """A turn whose work (t1 -> t5) took longer than SLOW_TURN_S."""
        ms = (t5 - t1) * 1000
        self.slow_turns += 1
        if ms > self.max_ms:
            self.max_ms = ms
        if t5 - self._last_log < LOG_EVERY_S:
            self._suppressed += 1
            return
        self._last_log = t5
        in_turn = t0 <= self._gc_start <= t5
        a, b = self._ru, resource.getrusage(resource.RUSAGE_THREAD)
        log.warning(
            "loop.slow_turn", turn_ms=round(ms, 1), consume_wait_ms=round((t1 - t0) * 1000, 1),
            ingest_ms=round((t2 - t1) * 1000, 1), publish_ms=round((t3 - t2) * 1000, 1),
            checkpoint_ms=round((t4 - t3) * 1000, 1), housekeeping_ms=round((t5 - t4) * 1000, 1),
            reap_ms=round(self.parts[0] * 1000, 1), begin_ms=round(self.parts[1] * 1000, 1),
            index_ms=round(self.parts[2] * 1000, 1), trim_ms=round(self.parts[3] * 1000, 1),
            gc_ms=round(self._gc_ms, 1) if in_turn else 0.0, gc_generation=self._gc_gen if in_turn else None,
            consumed=consumed, in_flight=in_flight, suppressed=self._suppressed,
            user_ms=round((b.ru_utime - a.ru_utime) * 1000, 1), system_ms=round((b.ru_stime - a.ru_stime) * 1000, 1),
            minor_faults=b.ru_minflt - a.ru_minflt, major_faults=b.ru_majflt - a.ru_majflt,
            waits=b.ru_nvcsw - a.ru_nvcsw, preemptions=b.ru_nivcsw - a.ru_nivcsw,
        )
        self._suppressed = 0

    def woke(self, waited_s: float, timeout_s: float, now: float) -> None:
        """``consume``, asked to wait at most ``timeout_s``, returned after ``waited_s`` (at
        ``now``, perf_counter seconds): note a late wake."""
        late = waited_s - timeout_s
        if late <= SLOW_TURN_S:
            return
        self.late_wakes += 1
        if late * 1000 > self.max_wake_ms:
            self.max_wake_ms = late * 1000
        if now - self._last_wake_log >= LOG_EVERY_S:
            self._last_wake_log = now
            # info, not a warning: the loop did no work late, the machine (or another thread
            # holding the GIL) kept it from running; the operator's signal is ``stats``' count
            log.info("loop.late_wake", late_ms=round(late * 1000, 1), timeout_ms=round(timeout_s * 1000, 1))

    def take_wakes(self) -> tuple[int, float]:
        """(late wakes, the latest one's ms past its timeout) since the previous call."""
        out = (self.late_wakes, round(self.max_wake_ms, 1))
        self.late_wakes = 0
        self.max_wake_ms = 0.0
        return out

    def take(self) -> tuple[int, int, float]:
        """(turns, slow turns, longest turn in ms) since the previous call: for the ``stats`` line."""
        out = (self.turns, self.slow_turns, round(self.max_ms, 1))
        self.turns = 0
        self.slow_turns = 0
        self.max_ms = 0.0
        return out
