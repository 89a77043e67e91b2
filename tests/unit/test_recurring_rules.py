"""Each rule of ``next_fire`` (sidecar/recurring/timeline.py) by name, on known transitions.

Paris: 2024-03-31 02:00 CET -> 03:00 CEST (01:00Z), 2024-10-27 03:00 CEST -> 02:00 CET (01:00Z).
Lord Howe: 2024-04-07 02:00 -> 01:30 (15:00Z the day before), 2024-10-06 02:00 -> 02:30 (15:30Z).
Santiago: 2024-09-08 00:00 -> 01:00 (04:00Z), 2024-04-07 00:00 -> 2024-04-06 23:00 (03:00Z).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sidecar.recurring import cronexpr
from sidecar.recurring.spec import Schedule
from sidecar.recurring.timeline import next_fire


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp() * 1000)


def cron(text: str, tz: str = "UTC", start: str = "2020-01-01T00:00", end: str | None = None,
         max_count: int | None = None) -> Schedule:
    return Schedule(cronexpr.parse(text), None, tz, ms(start), None if end is None else ms(end), max_count, "fire-once")


def firings(s: Schedule, after: str, until: str) -> list[str]:
    out, t = [], next_fire(s, ms(after))
    while t is not None and t <= ms(until):
        out.append(datetime.fromtimestamp(t / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
        t = next_fire(s, t)
    return out


def test_fixed_time_in_a_spring_forward_gap_fires_once_at_the_end_of_the_gap() -> None:
    s = cron("30 2 * * *", "Europe/Paris")  # 02:30 does not exist on 2024-03-31
    assert firings(s, "2024-03-30T00:00", "2024-04-01T23:00") == [
        "2024-03-30T01:30:00", "2024-03-31T01:00:00", "2024-04-01T00:30:00"]  # 02:30 CET, 03:00 CEST, 02:30 CEST


def test_several_gap_matches_fire_once_at_the_end_of_the_gap() -> None:
    s = cron("0,20,40 2 * * *", "Europe/Paris")
    assert firings(s, "2024-03-31T00:00", "2024-03-31T12:00") == ["2024-03-31T01:00:00"]


def test_fixed_time_in_a_repeated_hour_fires_once_on_its_first_occurrence() -> None:
    s = cron("30 2 * * *", "Europe/Paris")  # 02:30 happens at 00:30Z (CEST) and 01:30Z (CET)
    assert firings(s, "2024-10-26T12:00", "2024-10-28T12:00") == ["2024-10-27T00:30:00", "2024-10-28T01:30:00"]


def test_after_a_first_occurrence_the_second_pass_is_not_a_firing() -> None:
    s = cron("30 2 * * *", "Europe/Paris")
    assert next_fire(s, ms("2024-10-27T01:00")) == ms("2024-10-28T01:30")  # asked from inside the 2nd pass


def test_interval_expression_follows_absolute_time_over_the_autumn_hour() -> None:
    s = cron("*/15 * * * *", "Europe/Paris")  # 02:00-02:59 twice: 8 quarter hours, every absolute one
    got = firings(s, "2024-10-26T23:59", "2024-10-27T02:00")
    assert got == [f"2024-10-27T{h:02}:{m:02}:00" for h in (0, 1) for m in (0, 15, 30, 45)] + ["2024-10-27T02:00:00"]


def test_interval_expression_skips_the_wall_times_a_spring_gap_removes() -> None:
    s = cron("*/30 * * * *", "Europe/Paris")  # 02:00 and 02:30 do not exist: 01:30 CET, then 03:00 CEST
    assert firings(s, "2024-03-31T00:15", "2024-03-31T01:45") == [
        "2024-03-31T00:30:00", "2024-03-31T01:00:00", "2024-03-31T01:30:00"]


def test_hour_star_is_an_interval_expression_and_fires_in_both_passes() -> None:
    s = cron("0 */2 * * *", "Europe/Paris")  # cronie: HR_STAR; 02:00 CEST (00:00Z) and 02:00 CET (01:00Z)
    assert firings(s, "2024-10-26T21:30", "2024-10-27T03:30") == [
        "2024-10-26T22:00:00", "2024-10-27T00:00:00", "2024-10-27T01:00:00", "2024-10-27T03:00:00"]


def test_hourly_alias_follows_absolute_time() -> None:
    s = cron("@hourly", "Europe/Paris")
    assert len(firings(s, "2024-10-26T22:30", "2024-10-27T02:30")) == 4  # 23, 00, 01, 02 UTC


@pytest.mark.parametrize(("tz", "text", "after", "want"), [
    ("Australia/Lord_Howe", "0 2 * * *", "2024-10-05T00:00", "2024-10-05T15:30:00"),  # 30-min gap: at 02:30
    ("Australia/Lord_Howe", "45 1 * * *", "2024-04-06T00:00", "2024-04-06T14:45:00"),  # first of two 01:45s
    ("America/Santiago", "0 0 * * *", "2024-09-07T12:00", "2024-09-08T04:00:00"),  # midnight in the gap: 01:00
    ("America/Santiago", "30 23 * * *", "2024-04-06T12:00", "2024-04-07T02:30:00"),  # first 23:30 (-03)
    ("Pacific/Chatham", "50 2 * * *", "2024-09-28T00:00", "2024-09-28T14:00:00"),  # 02:45 -> 03:45 gap
    ("Asia/Kolkata", "30 9 * * *", "2024-03-30T00:00", "2024-03-30T04:00:00"),  # +05:30, no DST
])
def test_other_zones(tz: str, text: str, after: str, want: str) -> None:
    assert firings(cron(text, tz), after, want)[-1:] == [want]
    assert len(firings(cron(text, tz), after, want)) == 1


def test_second_pass_of_a_30_minute_fold_is_skipped() -> None:
    s = cron("45 1 * * *", "Australia/Lord_Howe")
    assert next_fire(s, ms("2024-04-06T14:45")) == ms("2024-04-07T15:15")


def test_six_field_fixed_time_in_a_gap_fires_at_the_end_of_the_gap() -> None:
    s = cron("10 30 2 * * *", "Europe/Paris")
    assert firings(s, "2024-03-30T12:00", "2024-04-01T12:00") == ["2024-03-31T01:00:00", "2024-04-01T00:30:10"]


def test_vixie_day_rule() -> None:
    either = cron("0 0 1 * MON")  # the 1st, and every Monday
    assert firings(either, "2024-06-29T00:00", "2024-07-15T00:00") == [
        "2024-07-01T00:00:00", "2024-07-08T00:00:00", "2024-07-15T00:00:00"]
    both = cron("0 0 */2 * MON")  # a star-led day field: odd days that are Mondays
    assert firings(both, "2024-07-01T00:00", "2024-07-31T00:00") == ["2024-07-15T00:00:00", "2024-07-29T00:00:00"]
    first_monday = cron("0 9 * * MON#1")
    assert firings(first_monday, "2024-07-01T10:00", "2024-09-30T00:00") == [
        "2024-08-05T09:00:00", "2024-09-02T09:00:00"]


def test_start_is_inclusive_end_is_inclusive_and_max_count_bounds() -> None:
    s = cron("0 * * * *", start="2024-01-01T05:00", end="2024-01-01T07:00")
    assert firings(s, "2024-01-01T00:00", "2024-01-02T00:00") == [
        "2024-01-01T05:00:00", "2024-01-01T06:00:00", "2024-01-01T07:00:00"]
    counted = cron("0 * * * *", start="2024-01-01T05:00", max_count=2)
    assert next_fire(counted, ms("2024-01-01T05:30"), fired=1) == ms("2024-01-01T06:00")
    assert next_fire(counted, ms("2024-01-01T06:00"), fired=2) is None


def test_every_starts_at_its_start() -> None:
    s = Schedule(None, 60_000, "UTC", 1_000_500, 1_180_500, None, "fire-once")
    assert next_fire(s, 0) == 1_000_500
    assert next_fire(s, 1_000_500) == 1_060_500
    assert next_fire(s, 1_120_500) == 1_180_500 and next_fire(s, 1_180_500) is None  # end is inclusive


def test_one_value_range_with_a_step_is_that_value() -> None:
    # cronsim 2.8 alone reads 0-0/1 as 0/1 (every second): cronexpr rewrites it
    assert cronexpr.parse("0-0/1 * * * * *").text == "0 * * * * *"
    assert firings(cron("0-0/1 * * * * *"), "2024-01-01T00:00:30", "2024-01-01T00:02:00") == [
        "2024-01-01T00:01:00", "2024-01-01T00:02:00"]


def test_horizon() -> None:
    s = cron("0 0 1 1 *")
    assert next_fire(s, ms("9998-06-01T00:00")) is None  # 9999-01-01 is past the horizon
