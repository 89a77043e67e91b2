"""Time zones from the pinned ``tzdata`` package, and their offset transitions.

Zone rules never come from the host. ``zoneinfo.ZoneInfo(name)`` searches the host's TZPATH
(``/usr/share/zoneinfo``) before the ``tzdata`` package, and ``zoneinfo.reset_tzpath`` would change
that for the whole process. So ``zone`` builds each zone with ``ZoneInfo.from_file`` from the
package's own TZif file, once (cached); the names it accepts are the package's list of zones
(``tzdata/zones``, links such as ``US/Eastern`` included).

``transitions(tz, year)`` lists the instants in a UTC year at which the zone's UTC offset
changes, with the offsets before and after. ``zoneinfo`` answers "offset at instant t" but does
not list its transitions, so they are found by probing the offset every ``_PROBE_S`` (3 hours)
and bisecting each change to the second (transitions fall on whole seconds). The assumption: two
transitions are never less than 3 hours apart (DST changes are months apart; tests compare the
result with an hourly scan for the zones they use). A year costs ~3,000 offset look-ups (a few
ms), cached per zone and year.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

_PROBE_S = 3 * 3600
_NAME = re.compile(r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*\Z")
# datetime holds years 1..9999, and a wall time is up to 26 hours past its instant: firings are
# computed up to HORIZON_S (9999-01-01T00:00Z), a year short of the end of datetime
MIN_YEAR, MAX_YEAR = 1970, 9998


class UnknownZone(ValueError):
    """The name is not a zone of the pinned tzdata package."""


@dataclass(frozen=True, slots=True)
class Transition:
    at_s: int  # the first instant (epoch s) with the new offset
    before_s: int  # UTC offset before it (seconds east of UTC)
    after_s: int  # UTC offset from it on


@functools.cache
def zone_names() -> frozenset[str]:
    """Every zone name the pinned tzdata package holds."""
    listing = importlib.resources.files("tzdata").joinpath("zones").read_text("utf-8")
    return frozenset(listing.split())


@functools.cache
def _load(name: str) -> ZoneInfo:
    parts = name.split("/")
    resource = importlib.resources.files("tzdata.zoneinfo").joinpath(*parts)
    with resource.open("rb") as f:
        return ZoneInfo.from_file(f, key=name)


def zone(name: str) -> ZoneInfo:
    """The zone ``name`` (an IANA name, case-sensitive) from the pinned tzdata package."""
    if not _NAME.match(name) or name not in zone_names():
        raise UnknownZone(f"{name[:60]!r} is not an IANA time zone name (tzdata)")
    return _load(name)


def offset_s(tz: ZoneInfo, at_s: int) -> int:
    """The UTC offset in force at instant ``at_s`` (epoch seconds), in seconds east of UTC."""
    off = datetime.fromtimestamp(at_s, tz).utcoffset()
    assert off is not None  # a ZoneInfo always has an offset for an aware datetime
    return int(off.total_seconds())


def _year_start_s(year: int) -> int:
    return int(datetime(year, 1, 1, tzinfo=UTC).timestamp())


@functools.lru_cache(maxsize=4096)
def transitions(tz: ZoneInfo, year: int) -> tuple[Transition, ...]:
    """The offset changes of ``tz`` at instants in the UTC year ``year``, in order."""
    lo, hi = _year_start_s(year), _year_start_s(year + 1)
    found: list[Transition] = []
    prev_t, prev_off = lo - 1, offset_s(tz, lo - 1)
    t = lo
    while prev_t < hi - 1:
        t = min(prev_t + _PROBE_S, hi - 1)
        off = offset_s(tz, t)
        if off != prev_off:
            a, b = prev_t, t  # offset(a) == prev_off, offset(b) != prev_off: bisect to the first second
            while b - a > 1:
                mid = (a + b) // 2
                if offset_s(tz, mid) == prev_off:
                    a = mid
                else:
                    b = mid
            found.append(Transition(b, prev_off, offset_s(tz, b)))
        prev_t, prev_off = t, off
    return tuple(found)


HORIZON_S = _year_start_s(MAX_YEAR + 1)


def year_of(at_s: int) -> int:
    """The UTC year of instant ``at_s``."""
    return datetime.fromtimestamp(at_s, UTC).year


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of time ``[start_s, end_s)`` in which the zone's offset is ``offset_s``.
    ``entered``: the transition at ``start_s`` (None when the segment starts at an artificial
    boundary rather than at an offset change)."""

    start_s: int
    end_s: int
    offset_s: int
    entered: Transition | None


def segment_at(tz: ZoneInfo, at_s: int) -> Segment:
    """The segment holding instant ``at_s``. Its start is the last transition at or before
    ``at_s`` in this or the previous UTC year (else the start of the previous year, an artificial
    boundary); its end the next transition in this or the next UTC year (else the end of the next
    year, artificial too). Callers walk segment after segment, so an artificial boundary only
    makes one more step, and a zone without transitions costs one step per two years."""
    year = year_of(at_s)
    before = [tr for y in (year - 1, year) if y >= MIN_YEAR for tr in transitions(tz, y) if tr.at_s <= at_s]
    after = [tr for y in (year, year + 1) if y <= MAX_YEAR for tr in transitions(tz, y) if tr.at_s > at_s]
    entered = before[-1] if before else None
    start = entered.at_s if entered else _year_start_s(max(year - 1, MIN_YEAR))
    end = after[0].at_s if after else _year_start_s(min(year + 2, MAX_YEAR + 1))
    return Segment(start, end, offset_s(tz, at_s), entered)
