"""The clock the engine runs on, injected (Kafka's ``Time``, trio's ``MockClock``).

Every decision of the engine reads time through a :class:`Clock` it is given: the wall clock in
epoch milliseconds (due times, lateness, retry backoff), a monotonic clock in seconds (intervals:
commits, trims, stats, transactions, deadlines) and ``sleep`` (the paused loop's wait).
Production passes :class:`SystemClock`; unit tests pass a virtual clock (``tests/kafka_twin.py``)
that advances only when the code under test waits, so the run, rebalance, outage and shutdown
paths run in milliseconds of real time and deterministically.

What reads the process's clocks directly measures or bounds real work, which virtual time would
not: the durations reported in logs and metrics (``turns.py``, the loop's turn phases, a store's
open, a transaction's commit, the rebalance callbacks' time in ``kafka_io.py``), the real-time
budget of a restore slice per turn (``changelog.py``), the waits for the broker outside the loop
(``kafka_io.py``: topics and metadata at start-up), the look-up thread's hand-over of the
store lock (``lookup.py``) and the time a listing held and waited for it (``listing.py``), and
how long a TLS diagnosis is kept (``refusals.py``: it asks the broker, not the engine).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Epoch milliseconds."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The process's clocks."""

    __slots__ = ()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
