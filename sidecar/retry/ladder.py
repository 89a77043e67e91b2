"""The consumer retry ladder: RocketMQ ``%RETRY%`` semantics on Kafka.

A consumer that failed to process a delivered record re-sends it to the ingress topic with the
header ``delay.retry-count: n`` (the number of times it has failed so far). In RocketMQ
(seed 001) the broker redelivers a message that failed ``n`` times after delay level ``3 + n - 1``
of its level table — 10s, 30s, 1m, 2m, ... 2h — and after 16 failures moves it to the
``%DLQ%`` topic. Here the ladder is a plain list of durations (``retry-ladder``; the default is
exactly RocketMQ's table from level 3 on, and a team can configure e.g. Alipay's notification
ladder ``4m 10m 10m 1h 2h 6h 15h``) plus a limit (``max-retries``, default 16):

* ``n == 0``: not a retry at all. The record's ordinary delay headers apply; calling
  :meth:`RetryLadder.delay_for` with 0 is a caller bug and raises ``ValueError``.
* ``1 <= n <= max_retries``: the delay is the ladder's n-th step (1-based). A ladder shorter
  than ``max_retries`` repeats its last step, so ``4m 10m 10m 1h 2h 6h 15h`` with 16 retries
  retries every 15h after the seventh failure — the same "keep the last interval" rule RocketMQ
  applies when ``maxReconsumeTimes`` goes past its level table.
* ``n > max_retries``: exhausted (``None``); the caller routes the record to the DLQ with
  reason ``retries-exhausted``.

The ladder gives a *relative* delay; which instant it is added to (the ingress record's
timestamp, like ``delay.ms``) is the caller's business. Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.config import Settings


@dataclass(frozen=True, slots=True)
class RetryLadder:
    """Delays (ms) for consumer retries: step n for ``delay.retry-count: n``, the last repeats."""

    steps_ms: tuple[int, ...]
    max_retries: int

    def __post_init__(self) -> None:
        # Accept any sequence (a YAML list arrives as a list) but store a tuple: hashable, frozen.
        object.__setattr__(self, "steps_ms", tuple(int(s) for s in self.steps_ms))
        if not self.steps_ms:
            raise ValueError("retry-ladder must have at least one step")
        if any(s < 0 for s in self.steps_ms):
            raise ValueError(f"retry-ladder steps must be >= 0 ms, got {self.steps_ms}")
        if self.max_retries < 0:
            raise ValueError(f"max-retries must be >= 0, got {self.max_retries}")

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryLadder:
        """The ladder of ``--retry-ladder`` and ``--max-retries``."""
        return cls(steps_ms=tuple(settings.retry_ladder_ms), max_retries=settings.max_retries)

    def delay_for(self, retry_count: int) -> int | None:
        """The delay in ms for a record that failed ``retry_count`` (>= 1) times, or ``None``
        when ``retry_count > max_retries`` (DLQ ``retries-exhausted``)."""
        if retry_count < 1:
            raise ValueError(
                f"retry-count {retry_count} carries no retry delay (0 means: use the normal delay headers)"
            )
        if retry_count > self.max_retries:
            return None
        return self.steps_ms[min(retry_count, len(self.steps_ms)) - 1]
