"""Exponential backoff with full jitter and a cap, as a pure function of (attempt, rng).

When a publish to a target topic fails with a retriable error (a leader moved, the cluster is
under-replicated, a broker is down), the sidecar keeps the record and tries again later
(docs/design.md 5: "nothing is dropped"). *How much* later is this module.

Algorithm ("full jitter", Marc Brooker, AWS Architecture Blog, "Exponential Backoff And
Jitter", 2015)::

    ceiling(n) = min(cap, base * factor ** (n - 1))     # n = 1, 2, 3, ... (1-based attempt)
    delay(n)   = uniform integer in [0, ceiling(n)]

Why full jitter: when a broker goes away, thousands of records fail in the same
millisecond. Plain exponential backoff retries them all in the same millisecond again — a
synchronised thundering herd that hits the recovering broker in waves. "Equal jitter" (half the
ceiling fixed plus half random — what dramatiq's ``compute_backoff`` does) still sends
everything after ``ceiling/2``. Full jitter spreads the retries evenly over the whole window,
which in AWS's simulation gives the least total work and the shortest completion time among the
simple schemes. The expected delay is ``ceiling/2``, so the retry rate still halves with every
failed attempt, and the cap keeps a long outage from pushing a retry hours away: once the cap
is reached a record is retried on average every ``cap/2``.

Overflow: ``factor ** (n - 1)`` grows without bound; dramatiq clamps the exponent
(``max_exponent=32``). Here the float power is attempted and an ``OverflowError`` (or an
infinite product) simply means "past the cap", so ``ceiling(10**100)`` is O(1) and exact.

Purity: no clock and no module-global random state. The caller passes the attempt number and a
random generator (``random.Random(seed)`` in tests, one long-lived ``random.Random()`` in the
event loop), so a run is reproducible from its seed and the property tests in
``tests/unit/test_backoff.py`` can compare against a reference model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class RandomSource(Protocol):
    """What the backoff needs from a random generator; ``random.Random`` satisfies it."""

    def randint(self, a: int, b: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with full jitter (all times in milliseconds).

    ``base_ms`` is the ceiling of the first attempt, ``factor`` (>= 1) the growth per attempt,
    ``cap_ms`` the largest delay ever returned.
    """

    base_ms: int = 100
    cap_ms: int = 30_000
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.base_ms < 0:
            raise ValueError(f"backoff base_ms must be >= 0, got {self.base_ms}")
        if self.cap_ms < 0:
            raise ValueError(f"backoff cap_ms must be >= 0, got {self.cap_ms}")
        if not self.factor >= 1.0:  # also rejects NaN
            raise ValueError(f"backoff factor must be >= 1, got {self.factor}")

    def ceiling_ms(self, attempt: int) -> int:
        """``min(cap, floor(base * factor ** (attempt - 1)))``; ``attempt`` is 1-based.

        Non-decreasing in ``attempt``; equal to ``cap_ms`` from some attempt on (if factor > 1).
        """
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        if self.base_ms == 0 or self.cap_ms == 0:
            return 0
        try:
            raw = self.base_ms * self.factor ** (attempt - 1)
        except OverflowError:  # factor ** n past float range, or n itself past float range
            return self.cap_ms
        if raw >= self.cap_ms:  # includes inf
            return self.cap_ms
        return int(raw)

    def delay_ms(self, attempt: int, rng: RandomSource) -> int:
        """A delay drawn uniformly from ``[0, ceiling_ms(attempt)]`` (both ends included)."""
        return rng.randint(0, self.ceiling_ms(attempt))
