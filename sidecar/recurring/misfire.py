"""What a schedule fires now, after downtime or a backlog: ``catch_up``, a pure function.

Given the nominal time of the last firing made (``last_ms``; None before the first), the number
of firings made (``fired``) and ``now_ms``, the *due* nominal times are the firings in
``(last_ms, now_ms]`` (``next_fire`` stepped from ``last_ms``: never before the start, never past
the end or ``max_count``). With none due, nothing fires. Otherwise, with D the latest due time
and n the number due:

- ``fire-once`` (the default): one firing, stamped D, with ``missed = n - 1`` (the earlier due
  times it stands for; 0 when the schedule is merely late, not behind);
- ``skip``: the same one firing if D is on time, that is ``now - D <= grace_ms`` (a firing a
  moment late because of a backlog is not a misfire); else no firing, and all n count as missed.

Either way the next firing is ``next_fire(schedule, D, fired')``, strictly after now: never two
firings of one nominal time, never a firing before its time (every due time is <= now).

Counting the due times walks them one by one (``every`` is arithmetic): the cost is linear in
the number missed, e.g. ~60 µs each for a cron (a day of a per-second cron: ~5 s).
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar import contract as c
from sidecar.recurring.spec import Schedule
from sidecar.recurring.timeline import next_fire

DEFAULT_GRACE_MS = 1000


@dataclass(frozen=True, slots=True)
class CatchUp:
    fire_ms: int | None  # the nominal time to fire now; None: nothing fires now
    latest_ms: int  # the latest due nominal time: the next firing is searched after it
    due: int  # how many nominal times were due (>= 1)
    missed: int  # how many of them are not fired (due - 1 when one fires, else due)


def catch_up(
    schedule: Schedule, last_ms: int | None, fired: int, now_ms: int, grace_ms: int = DEFAULT_GRACE_MS
) -> CatchUp | None:
    """The firing due at ``now_ms``, if any (module docstring). None: nothing is due."""
    after = schedule.start_ms - 1 if last_ms is None else last_ms
    first = next_fire(schedule, after, fired)
    if first is None or first > now_ms:
        return None
    latest, due = _latest_due(schedule, first, fired, now_ms)
    if schedule.misfire == c.MISFIRE_SKIP and now_ms - latest > grace_ms:
        return CatchUp(None, latest, due, due)
    return CatchUp(latest, latest, due, due - 1)


def _latest_due(schedule: Schedule, first: int, fired: int, now_ms: int) -> tuple[int, int]:
    """The latest firing <= ``now_ms`` from ``first`` on, and how many there are from ``first``.
    ``fired`` stays as given: catching up makes one firing, so ``max_count`` bounds nothing more."""
    every = schedule.every_ms
    if every is not None:
        end = now_ms if schedule.end_ms is None else min(now_ms, schedule.end_ms)
        n = (end - first) // every + 1
        return first + (n - 1) * every, n
    latest, due = first, 1
    while (t := next_fire(schedule, latest, fired)) is not None and t <= now_ms:
        latest, due = t, due + 1
    return latest, due
