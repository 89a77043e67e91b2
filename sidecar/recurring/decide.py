"""The firing decision in one pass: ``decide``, what ``catch_up`` and ``next_fire`` answer together.

At each firing the publishing path needs what fires now (``misfire.catch_up``) and the firing
after it (``timeline.next_fire``, for ``delay.next-at`` and the re-arm). Asked separately they
walk the due times twice: ``catch_up`` steps ``next_fire`` past ``now`` to find the latest due
time, and its last step (the first time after ``now``) is the next firing, which the caller then
computed again. ``decide`` keeps that last step, and for ``delay.every`` replaces every step by
arithmetic on the grid ``start + k * every``: a firing costs a few integer operations instead of
three calls. A cron expression's steps stay ``next_fire``'s (its zone walk is cached per
expression, zone and second: schedules sharing an expression ask the same question).

The answer equals the reference functions' for every input (a property test compares them):

- None when ``catch_up`` says nothing is due;
- else ``Decision(fire_ms, latest_ms, due, missed, next_ms)``: the first four ``catch_up``'s
  fields; ``next_ms`` is ``next_fire(schedule, latest_ms, n)`` with ``n`` the firings made once
  this one is counted (``fired + 1`` when one fires, ``fired`` when ``skip`` fires none).
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar import contract as c
from sidecar.headers import MAX_EPOCH_MS
from sidecar.recurring.misfire import DEFAULT_GRACE_MS
from sidecar.recurring.spec import Schedule
from sidecar.recurring.timeline import next_fire


@dataclass(frozen=True, slots=True)
class Decision:
    fire_ms: int | None  # the nominal time to fire now; None: nothing fires now (skip)
    latest_ms: int  # the latest due nominal time
    due: int  # how many nominal times were due (>= 1)
    missed: int  # how many of them are not fired
    next_ms: int | None  # the firing after latest_ms (None: the schedule ends)


def decide(
    schedule: Schedule, last_ms: int | None, fired: int, now_ms: int, grace_ms: int = DEFAULT_GRACE_MS
) -> Decision | None:
    """What fires at ``now_ms`` and the firing after it (module docstring). None: nothing is due."""
    every = schedule.every_ms
    if every is None:
        return _decide_cron(schedule, last_ms, fired, now_ms, grace_ms)
    max_count = schedule.max_count
    if max_count is not None and fired >= max_count:
        return None
    start = schedule.start_ms
    after = start - 1 if last_ms is None or last_ms < start - 1 else last_ms
    first = start + ((after - start) // every + 1) * every
    end = schedule.end_ms
    if first > now_ms or first > MAX_EPOCH_MS or (end is not None and first > end):
        return None
    stop = now_ms if end is None or now_ms < end else end
    due = (stop - first) // every + 1
    latest = first + (due - 1) * every
    fires = not (schedule.misfire == c.MISFIRE_SKIP and now_ms - latest > grace_ms)
    made = fired + 1 if fires else fired
    after_latest = latest + every
    nxt = None if ((max_count is not None and made >= max_count) or after_latest > MAX_EPOCH_MS
                   or (end is not None and after_latest > end)) else after_latest
    if fires:
        return Decision(latest, latest, due, due - 1, nxt)
    return Decision(None, latest, due, due, nxt)


def _decide_cron(schedule: Schedule, last_ms: int | None, fired: int, now_ms: int, grace_ms: int) -> Decision | None:
    after = schedule.start_ms - 1 if last_ms is None else last_ms
    first = next_fire(schedule, after, fired)
    if first is None or first > now_ms:
        return None
    latest, due = first, 1
    while (t := next_fire(schedule, latest, fired)) is not None and t <= now_ms:
        latest, due = t, due + 1
    # t: the first firing after latest counting ``fired`` made; with one more made, max_count may end it
    if schedule.misfire == c.MISFIRE_SKIP and now_ms - latest > grace_ms:
        return Decision(None, latest, due, due, t)
    max_count = schedule.max_count
    if max_count is not None and fired + 1 >= max_count:
        t = None
    return Decision(latest, latest, due, due - 1, t)
