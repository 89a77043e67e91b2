"""``catch_up``: what fires after downtime or a backlog, for ``fire-once`` and ``skip``; and a
property: stepping a schedule through random downtimes never fires early, twice for one nominal
time, or past the end, and loses no nominal time it does not count as missed."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.recurring import cronexpr
from sidecar.recurring.misfire import CatchUp, catch_up
from sidecar.recurring.spec import Schedule
from sidecar.recurring.timeline import next_fire

MIN = 60_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00Z
EVERY_MIN = Schedule(None, MIN, "UTC", T0, None, None, "fire-once")
CRON_MIN = Schedule(cronexpr.parse("* * * * *"), None, "UTC", T0, None, None, "fire-once")


def test_nothing_due_before_the_first_firing() -> None:
    assert catch_up(EVERY_MIN, None, 0, T0 - 1) is None
    assert catch_up(EVERY_MIN, T0, 1, T0 + MIN - 1) is None


def test_on_time_firing_is_not_a_misfire() -> None:
    for s in (EVERY_MIN, CRON_MIN):
        assert catch_up(s, None, 0, T0) == CatchUp(T0, T0, 1, 0)
        assert catch_up(s, T0, 1, T0 + MIN + 30) == CatchUp(T0 + MIN, T0 + MIN, 1, 0)


def test_fire_once_fires_the_latest_missed_time_with_the_count() -> None:
    for s in (EVERY_MIN, CRON_MIN):  # down from 00:00:30 to 00:10:30: 00:01 .. 00:10 were due
        got = catch_up(s, T0, 1, T0 + 10 * MIN + 30_000)
        assert got == CatchUp(T0 + 10 * MIN, T0 + 10 * MIN, 10, 9)
        assert next_fire(s, got.latest_ms, 2) == T0 + 11 * MIN


def test_skip_fires_nothing_until_the_next_time() -> None:
    for s in (EVERY_MIN, CRON_MIN):
        skip = dataclasses.replace(s, misfire="skip")
        got = catch_up(skip, T0, 1, T0 + 10 * MIN + 30_000)
        assert got == CatchUp(None, T0 + 10 * MIN, 10, 10)
        assert next_fire(skip, got.latest_ms, 1) == T0 + 11 * MIN


def test_skip_still_fires_a_firing_that_is_only_late() -> None:
    skip = dataclasses.replace(EVERY_MIN, misfire="skip")
    assert catch_up(skip, T0, 1, T0 + 3 * MIN + 800, grace_ms=1000) == CatchUp(T0 + 3 * MIN, T0 + 3 * MIN, 3, 2)
    assert catch_up(skip, T0, 1, T0 + MIN + 1001, grace_ms=1000) == CatchUp(None, T0 + MIN, 1, 1)


def test_catch_up_stops_at_the_end_and_the_count() -> None:
    ended = dataclasses.replace(CRON_MIN, end_ms=T0 + 5 * MIN)
    assert catch_up(ended, T0, 1, T0 + 60 * MIN) == CatchUp(T0 + 5 * MIN, T0 + 5 * MIN, 5, 4)
    assert catch_up(ended, T0 + 5 * MIN, 2, T0 + 60 * MIN) is None
    counted = dataclasses.replace(EVERY_MIN, max_count=3)
    assert catch_up(counted, T0 + MIN, 2, T0 + 60 * MIN) == CatchUp(T0 + 60 * MIN, T0 + 60 * MIN, 59, 58)
    assert catch_up(counted, T0 + 60 * MIN, 3, T0 + 90 * MIN) is None


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["every", "*/7 * * * * *", "*/5 * * * *", "30 2 * * *"]),
    st.sampled_from(["fire-once", "skip"]),
    st.sampled_from(["UTC", "Europe/Paris"]),
    st.lists(st.integers(0, 3 * 3600 * 1000), min_size=1, max_size=25),
    st.one_of(st.none(), st.integers(1, 30)),
)
def test_stepping_through_downtimes(kind: str, misfire: str, tz: str, gaps: list[int], max_count: int | None) -> None:
    """Wake-ups at random times over the Paris autumn change: every nominal time in (start, last
    wake-up] is fired or counted missed, exactly once; fired ones are in order, never early."""
    start = 1_729_983_600_000  # 2024-10-26T23:00Z, two hours before Paris falls back
    if kind == "every":
        s = Schedule(None, 7000, "UTC", start, None, max_count, misfire)
    else:
        s = Schedule(cronexpr.parse(kind), None, tz, start, None, max_count, misfire)
    last: int | None = None
    fired: list[int] = []
    accounted = 0
    now = start
    for gap in gaps:
        now += gap
        got = catch_up(s, last, len(fired), now)
        if got is None:
            nxt = next_fire(s, start - 1 if last is None else last, len(fired))
            assert nxt is None or nxt > now
            continue
        assert got.latest_ms <= now and (last is None or got.latest_ms > last)
        accounted += got.due
        if got.fire_ms is not None:
            assert got.fire_ms == got.latest_ms and got.missed == got.due - 1
            fired.append(got.fire_ms)
        else:
            assert misfire == "skip" and got.missed == got.due
        last = got.latest_ms
    assert fired == sorted(set(fired))
    if max_count is not None:
        assert len(fired) <= max_count
    # every nominal time up to the last one accounted for was due exactly once
    if last is not None and max_count is None:
        n, t = 0, next_fire(s, start - 1)
        while t is not None and t <= last:
            n, t = n + 1, next_fire(s, t)
        assert n == accounted
