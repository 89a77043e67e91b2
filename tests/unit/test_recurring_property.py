"""Property test of ``next_fire`` for cron schedules against a brute-force reference model.

The reference knows nothing of segments or cronsim: it walks every second (every minute for a
5-field expression: all the zones here have whole-minute offsets, so wall minutes are UTC
minutes) of a window, takes each instant's wall time from ``zoneinfo``, and matches it with its own
small cron matcher (sets of values per field, Vixie's day rule). Its firing rules, stated
per instant t with wall time w:

- interval expressions: t fires iff w matches;
- fixed-time expressions: t fires iff w matches and t is w's first occurrence (``fold=0``), or t
  is the end of a spring-forward gap (the offset rises at t) and some wall time in the gap
  matches.

The implementation must list exactly the same instants in the window, stepping
``t = next_fire(schedule, t)``. Windows: a few hours around DST transitions of 2020-2030 in zones
with 1-hour (Paris, New York, Santiago at midnight), 30-minute (Lord Howe) and 45-minute offsets
(Chatham), zones without DST (Kolkata, UTC), plus random windows.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.recurring import cronexpr, zones
from sidecar.recurring.spec import Schedule
from sidecar.recurring.timeline import next_fire

ZONES = ("Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata",
         "Pacific/Chatham", "UTC")
Y2020 = calendar.timegm((2020, 1, 1, 0, 0, 0))
Y2030 = calendar.timegm((2030, 12, 31, 0, 0, 0))

# -- the reference matcher -------------------------------------------------------------------------
RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))  # second minute hour dom month dow


def _field(text: str, lo: int, hi: int) -> set[int]:
    out: set[int] = set()
    for term in text.split(","):
        rng, _, step = term.partition("/")
        a, b = (lo, hi) if rng == "*" else (int(rng.split("-")[0]), int(rng.split("-")[-1]))
        out.update(range(a, b + 1, int(step) if step else 1))
    return out


@dataclass(frozen=True)
class RefCron:
    fields: tuple[set[int], ...]  # 6 sets, seconds first
    dom_star: bool
    dow_star: bool
    fixed: bool
    step_s: int  # 1 with a seconds field, else 60

    @classmethod
    def of(cls, text: str) -> RefCron:
        parts = text.split()
        six = len(parts) == 6
        parts = parts if six else ["0", *parts]
        sets = tuple(_field(p, lo, hi) for p, (lo, hi) in zip(parts, RANGES, strict=True))
        sets[5].update({0} if 7 in sets[5] else set())
        timed = parts[:3] if six else parts[1:3]
        return cls(sets, parts[3].startswith("*"), parts[5].startswith("*"),
                   not any(p.startswith("*") for p in timed), 1 if six else 60)

    def matches(self, w: datetime) -> bool:
        s, mi, h, dom, mon, dow = self.fields
        if w.second not in s or w.minute not in mi or w.hour not in h or w.month not in mon:
            return False
        dom_ok, dow_ok = w.day in dom, (w.weekday() + 1) % 7 in dow
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok


def _wall(t: int, tz: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(t, tz).replace(tzinfo=None)


def _off(t: int, tz: ZoneInfo) -> int:
    off = datetime.fromtimestamp(t, tz).utcoffset()
    assert off is not None
    return int(off.total_seconds())


def reference(ref: RefCron, tz: ZoneInfo, lo: int, hi: int) -> list[int]:
    """Every firing instant (epoch s) in [lo, hi], by walking it."""
    out = []
    t = lo - lo % ref.step_s
    while t <= hi:
        w = _wall(t, tz)
        fires = ref.matches(w)
        if fires and ref.fixed:
            fires = int(w.replace(tzinfo=tz, fold=0).timestamp()) == t  # first occurrence only
        if not fires and ref.fixed and _off(t, tz) > _off(t - 1, tz):  # t ends a gap
            g, g_end = _wall(t - 1, tz) + timedelta(seconds=1), w
            while g < g_end and not fires:
                fires = ref.matches(g)
                g += timedelta(seconds=ref.step_s)
        if fires and t >= lo:
            out.append(t)
        t += ref.step_s
    return out


def implementation(text: str, tz: str, lo: int, hi: int) -> list[int]:
    sched = Schedule(cronexpr.parse(text), None, tz, 0, None, None, "fire-once")
    out = []
    t = next_fire(sched, lo * 1000 - 1)
    while t is not None and t <= hi * 1000:
        assert t % 1000 == 0
        out.append(t // 1000)
        t = next_fire(sched, t)
    return out


# -- random expressions ----------------------------------------------------------------------------
def _term(lo: int, hi: int) -> st.SearchStrategy[str]:
    value = st.integers(lo, hi)
    pair = st.tuples(value, value).map(lambda p: (min(p), max(p)))
    return st.one_of(
        value.map(str),
        pair.map(lambda p: f"{p[0]}-{p[1]}"),
        st.tuples(pair, st.integers(1, max(1, (hi - lo) // 2))).map(lambda x: f"{x[0][0]}-{x[0][1]}/{x[1]}"),
        st.lists(value, min_size=2, max_size=4, unique=True).map(lambda v: ",".join(map(str, sorted(v)))),
    )


def _field_st(lo: int, hi: int, star_weight: int) -> st.SearchStrategy[str]:
    star = st.one_of(st.just("*"), st.integers(2, max(2, (hi - lo) // 2)).map(lambda k: f"*/{k}"))
    return st.one_of(*([star] * star_weight), _term(lo, hi))


SECONDS = st.one_of(st.sampled_from(["0", "30", "0,30", "*/20", "15-17", "*/7"]), _term(0, 59))
def _transitions(tz: str) -> list[int]:
    z = zones.zone(tz)
    return [tr.at_s for y in range(2020, 2031) for tr in zones.transitions(z, y)]


TRANSITIONS = {tz: _transitions(tz) for tz in ZONES}
# the local hours on either side of each transition: an hour field drawn from them often meets a
# gap or a repeated hour, where the fixed-time rules bite
NEAR_HOURS = {tz: sorted({_wall(at + d, zones.zone(tz)).hour for at in ats for d in (-1, 0)}) for tz, ats in
              TRANSITIONS.items()}


def cron_st(near_hours: list[int]) -> st.SearchStrategy[str]:
    hours = _field_st(0, 23, 1)
    if near_hours:
        near = st.lists(st.sampled_from(near_hours), min_size=1, max_size=2, unique=True)
        hours = st.one_of(hours, near.map(lambda v: ",".join(map(str, sorted(v)))))
    return st.tuples(
        st.booleans(),  # with a seconds field
        SECONDS,
        _field_st(0, 59, 1),
        hours,
        _field_st(1, 31, 3),
        _field_st(1, 12, 4),
        _field_st(0, 7, 3),
    ).map(lambda f: " ".join(f[1:] if f[0] else f[2:]))


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(text: str, tz: str, lo: int, hi: int) -> None:
    ref = RefCron.of(text)
    got = implementation(text, tz, lo, hi)
    want = reference(ref, zones.zone(tz), lo, hi)
    assert got == want, (text, tz, [datetime.fromtimestamp(t, UTC).isoformat() for t in sorted(set(got) ^ set(want))])


@SETTINGS
@given(st.sampled_from(ZONES), st.data())
def test_cron_matches_the_reference_around_transitions(tz: str, data: st.DataObject) -> None:
    """Random expressions, windows around up to three transitions of 2020-2030 (or random ones in
    a zone without DST), +-6 hours for a 5-field expression, +-40 minutes with seconds (enough for
    both passes of a repeated hour to be in the window), and one random window."""
    text = data.draw(cron_st(NEAR_HOURS[tz]), label="cron")
    half = 6 * 3600 if len(text.split()) == 5 else 40 * 60
    trans = TRANSITIONS[tz] or [data.draw(st.integers(Y2020, Y2030)) for _ in range(3)]
    for at in data.draw(st.lists(st.sampled_from(trans), min_size=1, max_size=3, unique=True)):
        _check(text, tz, at - half, at + half)
    start = data.draw(st.integers(Y2020, Y2030))
    _check(text, tz, start, start + half)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([z for z in ZONES if TRANSITIONS[z]]), st.data())
def test_daily_fixed_times_over_every_transition(tz: str, data: st.DataObject) -> None:
    """A daily fixed time near the transition hour (where the rules bite), over every transition of
    2020-2030 in the zone: 0 differences."""
    minute = data.draw(st.sampled_from([0, 15, 30, 45, 59]))
    trans = TRANSITIONS[tz]
    text = f"{minute} {data.draw(st.sampled_from(NEAR_HOURS[tz]))} * * *"
    for at in trans:
        _check(text, tz, at - 3 * 3600, at + 3 * 3600)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4_000_000_000_000), st.integers(1000, 10**9), st.integers(-10**12, 10**12))
def test_every_fires_on_its_grid(start: int, every: int, after_delta: int) -> None:
    sched = Schedule(None, every, "UTC", start, None, None, "fire-once")
    after = start + after_delta
    t = next_fire(sched, after)
    assert t is not None and t > after and t >= start and (t - start) % every == 0
    assert t - every <= max(after, start - 1)  # the previous grid point is not a missed firing
