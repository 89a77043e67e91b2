"""When a schedule fires next: ``next_fire(schedule, after_ms, fired)``, a pure function.

It returns the schedule's first *nominal* firing time (epoch ms UTC) strictly after ``after_ms``,
at or after the start, or None when there is none: past ``end_ms`` (inclusive), ``max_count``
firings already made (``fired``), or beyond 9999-01-01. Stepping ``t = next_fire(s, t, n)`` from
``after_ms = start - 1`` lists every firing exactly once, in order: no two firings share a
nominal time, by construction (each is strictly after the one before).

``delay.every``: ``start + k * every`` for k = 0, 1, ...: absolute time, no zone.

``delay.cron``: firings are whole seconds. Time is cut into *segments*, stretches in which the
zone's UTC offset is constant (sidecar/recurring/zones.py); inside one, wall time = instant +
offset is monotonic, so the first match (cronsim, on naive wall time) maps straight back to an
instant. If that instant falls past the segment's end, the search resumes at the next segment,
whose offset differs. The two DST classes (sidecar/recurring/cronexpr.py) differ only at a
segment's start, where the offset changed:

- **interval** expressions follow absolute time: they fire at every instant whose local wall time
  matches, on either side of a transition. Wall times skipped by a spring-forward gap do not
  exist, so nothing fires for them (``*/15 * * * *`` fires every absolute quarter hour, 4 times
  an hour, through both DST changes); the wall times repeated after a fall-back fire again
  (``0 */2 * * *`` fires at 02:00 twice in Paris on the last Sunday of October), as in cronie.
- **fixed-time** expressions fire once per matching wall time: a match inside a spring-forward
  gap fires once, at the end of the gap (the transition instant: ``30 2 * * *`` in Paris fires at
  03:00 CEST); matches in a repeated hour fire on the first occurrence only (the second pass, the
  first ``before - after`` seconds of the new segment, is skipped).
"""

from __future__ import annotations

import calendar
import functools
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sidecar.headers import MAX_EPOCH_MS
from sidecar.recurring import cronexpr, zones
from sidecar.recurring.spec import Schedule

_EPOCH = datetime(1970, 1, 1)
# zone name -> zone, for names a Schedule holds (checked when it was parsed): ``zones.zone`` checks
# the name against the tzdata list at each call, a cost per firing this look-up avoids
_ZONES: dict[str, ZoneInfo] = {}


def next_fire(schedule: Schedule, after_ms: int, fired: int = 0) -> int | None:
    """The first nominal firing time > ``after_ms`` (and >= the start); None past the end, after
    ``max_count`` firings (``fired`` of them made so far), or beyond the horizon."""
    if schedule.max_count is not None and fired >= schedule.max_count:
        return None
    after = max(after_ms, schedule.start_ms - 1)
    if schedule.every_ms is not None:
        t: int | None = schedule.start_ms + ((after - schedule.start_ms) // schedule.every_ms + 1) * schedule.every_ms
    else:
        assert schedule.cron is not None
        tz = _ZONES.get(schedule.tz)
        if tz is None:
            tz = _ZONES[schedule.tz] = zones.zone(schedule.tz)
        s = cron_fire_s(schedule.cron, tz, after // 1000 + 1)
        t = None if s is None else s * 1000
    if t is None or t > MAX_EPOCH_MS or (schedule.end_ms is not None and t > schedule.end_ms):
        return None
    return t


def _wall(at_s: int, offset_s: int) -> datetime:
    return _EPOCH + timedelta(seconds=at_s + offset_s)


def _instant(wall: datetime, offset_s: int) -> int:
    return calendar.timegm(wall.timetuple()) - offset_s


# Pure, so cached: schedules sharing an expression and zone (a fleet firing every minute) ask for
# the same next firing after the same nominal time, and then cost one look-up instead of ~100 µs.
@functools.lru_cache(maxsize=65536)
def cron_fire_s(expr: cronexpr.CronExpr, tz: ZoneInfo, from_s: int) -> int | None:
    """The first firing instant (epoch s) >= ``from_s`` of ``expr`` in zone ``tz``."""
    s = from_s
    while s < zones.HORIZON_S:
        seg = zones.segment_at(tz, s)
        lo = s
        tr = seg.entered
        if tr is not None and expr.wall_fixed:
            if tr.after_s > tr.before_s and s == tr.at_s:
                # a match in the gap's wall times [at + before, at + after) fires at the gap's end
                gap = cronexpr.first_match(expr, _wall(tr.at_s, tr.before_s))
                if gap is not None and gap < _wall(tr.at_s, tr.after_s):
                    return tr.at_s
            elif tr.after_s < tr.before_s:
                lo = max(s, tr.at_s + tr.before_s - tr.after_s)  # the repeat of walls seen before
        if lo < seg.end_s:
            match = cronexpr.first_match(expr, _wall(lo, seg.offset_s))
            if match is None:
                return None  # nothing within 50 years
            at = _instant(match, seg.offset_s)
            if at < seg.end_s:
                return at
        s = seg.end_s
    return None
