"""Helper threads that cannot preempt the event loop: ``SCHED_BATCH``.

Why: every due record waits for the loop thread (only it calls ``produce``), so the loop must get
a core back as soon as it is runnable. It shares the process with helper threads: librdkafka's
(one per broker connection of the consumer and of the producer, a main thread, a background
thread) and the flusher (syncs, checkpoints). Each ``produce`` batch, fetch response and finished
sync wakes one of them, and under Linux's fair scheduler a woken thread preempts the thread that
is running when its virtual deadline is earlier, which for a thread that just slept is the usual
case.

What: ``SCHED_BATCH`` (``sched(7)``) keeps a thread's share of the CPU (same weight as
``SCHED_OTHER`` at the same nice value) but a waking batch thread never preempts the running one:
it waits for the running thread's slice to end, or for another core.

Measured on the 2-core bench machine (``perf record -e sched:sched_switch`` on the loop thread,
levels lateness runs): with every helper ``SCHED_OTHER`` the loop was switched out while runnable
345 times a second, 57 % of them for the sidecar's own helpers (2 131 times in 15 s for one
librdkafka broker thread, 592 for the flusher); with every helper ``SCHED_BATCH``, 93 times a
second, mostly for the broker's threads. What that does to the end-to-end figures was lost in
this machine's run-to-run noise (lateness p99 22-230 ms either way at ~27k records/s), and for
librdkafka's threads the trade is real: a delayed fetch or produce request stalls the pipeline
when the loop is busy, so a drain's throughput can suffer. Hence the setting
``helper-threads``:

* ``flusher`` (default): only the flusher. Nothing waits for it (the offset commit follows its
  checkpoint whenever it is done), so its wake-up latency costs nothing; it sets its own policy
  when its thread starts (``demote_self``, the executor's initializer).
* ``all``: the flusher and every librdkafka thread, for deployments where lateness matters more
  than peak throughput.
* ``none``: leave every thread alone.

**Idle threads.** Work that nothing waits for soon and that keeps a core busy for seconds (the id
index's merge pass, ``sidecar/store/idpass.py``) goes further down: ``SCHED_IDLE``. Besides its
lower weight (3, against 15 at nice 19), the scheduler treats a core that runs only ``SCHED_IDLE``
threads as idle when another thread wakes up: the loop is placed there and preempts it at once. A
batch thread at nice 19 is preempted only when its slice ends or when load balancing moves the
loop: in a 40M scale run (perf sched_switch on every core), the pass threads at ``SCHED_BATCH`` and
nice 19 still ran 3.6 s of the loop's runnable-but-waiting spells longer than 20 ms, second only to
the bench's own producer thread. But a thread that takes the GIL must never be ``SCHED_IDLE``:
CPython hands the GIL to a thread that asks for it and makes the holder (the loop) wait until the
taker runs, which for an idle thread on a busy machine is whenever nothing else wants the core
(with the pass's Python thread idle, the loop once waited 712 ms for the GIL in a consume, and
turns of 50-529 ms followed the id tables' growths, in the 100M ``scale`` bench scenario). So only
native code that never touches the GIL runs idle: the pass's Python thread is ``SCHED_BATCH`` and
its native calls run their work on an idle native thread of their own
(``sidecar/native/merge.c``, ``idx_pass_idle``). The pass threads are kept between passes: a
thread started per pass made the loop wait for it to start (``idpass.Workers``).

How: the threads are listed from ``/proc/self/task`` (librdkafka starts broker threads whenever
it connects to another broker, so the loop calls :meth:`HelperThreads.demote` once a second and
only new thread ids are touched). ``sched_setscheduler`` on a thread id is per-thread on Linux and
needs no privilege to go from ``SCHED_OTHER`` to ``SCHED_BATCH``. Elsewhere (no ``/proc``, no
``SCHED_BATCH``) this does nothing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sidecar import logs

log = logs.get("sidecar")

TASKS = Path("/proc/self/task")


def supported() -> bool:
    """Whether this platform can demote a single thread (Linux with ``SCHED_BATCH``)."""
    return hasattr(os, "SCHED_BATCH") and hasattr(os, "sched_setscheduler") and TASKS.is_dir()


def demote_self() -> bool:
    """Make the calling thread ``SCHED_BATCH`` (a thread pool's initializer); False if refused."""
    return supported() and _set_own_policy(os.SCHED_BATCH)


def _set_own_policy(policy: int) -> bool:
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError as e:
        log.warning("threads.demote_failed", tid=threading.get_native_id(), error=str(e))
        return False
    return True


class HelperThreads:
    """Demotes every thread of the process but ``keep`` (the loop's native thread id) to
    ``SCHED_BATCH``, each once."""

    __slots__ = ("_enabled", "_failed", "_seen", "demoted", "keep")

    def __init__(self, enabled: bool = True, keep: int | None = None) -> None:
        self._enabled = enabled and supported()
        self.keep = threading.get_native_id() if keep is None else keep
        self._seen: set[int] = {self.keep}  # a few dozen ids at most, one per thread ever started
        self._failed = False
        self.demoted = 0

    def demote(self) -> int:
        """Demote the threads started since the previous call; return how many were demoted."""
        if not self._enabled:
            return 0
        try:
            tids = [int(name) for name in os.listdir(TASKS)]
        except OSError:
            return 0
        self._seen.intersection_update(tids)  # ids of exited threads can be reused
        self._seen.add(self.keep)
        n = 0
        for tid in tids:
            if tid in self._seen:
                continue
            self._seen.add(tid)
            try:
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            except ProcessLookupError:
                continue  # exited meanwhile
            except OSError as e:
                if not self._failed:  # e.g. a seccomp profile refusing the call: say so once
                    self._failed = True
                    log.warning("threads.demote_failed", tid=tid, error=str(e))
                continue
            n += 1
        if n:
            self.demoted += n
            log.debug("threads.demoted", threads=n, total=self.demoted)
        return n
