"""Level arithmetic (RocketMQ 4.x delay levels) — pure functions, no clock.

A level table is a strictly increasing tuple of delays in ms, 1-based for users
(``delay.level: 3`` is the third entry; RocketMQ stores level L in queue ``L - 1``). Level 0 is
this project's "immediate" queue: records that are due now.

An arbitrary requested delay is rounded **up** to the next level, never down: delivering late is
allowed, early never. A delay beyond the last level cannot be honoured by this scheduler
(``None``); the caller dead-letters it as ``delay-out-of-range``.
"""

from __future__ import annotations

from bisect import bisect_left


def level_for_delay(levels_ms: tuple[int, ...], delay_ms: int) -> int | None:
    """Smallest 1-based level whose delay is >= ``delay_ms``; 0 for ``delay_ms <= 0``; ``None``
    beyond the last level."""
    if delay_ms <= 0:
        return 0
    i = bisect_left(levels_ms, delay_ms)
    return i + 1 if i < len(levels_ms) else None


def plan(
    levels_ms: tuple[int, ...], mode: str, level: int, requested_due_ms: int, enqueue_ms: int
) -> tuple[int, int] | None:
    """Return ``(level, committed_due_ms)`` for a request, or ``None`` when it is beyond the last
    level. The committed due time is the level's time (``enqueue + levels[L-1]``), which is >= the
    requested one; a request due at or before its enqueue time goes to level 0 at its own time."""
    if mode == "now":
        return 0, requested_due_ms
    if mode == "level":
        return level, enqueue_ms + levels_ms[level - 1]
    lv = level_for_delay(levels_ms, requested_due_ms - enqueue_ms)
    if lv is None:
        return None
    if lv == 0:
        return 0, requested_due_ms
    return lv, enqueue_ms + levels_ms[lv - 1]
