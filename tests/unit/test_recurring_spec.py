"""``parse_schedule``: recurring headers -> ``Schedule`` or a rejection with a stable reason, and
the zones it accepts (from the pinned tzdata, never the host)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.headers import Rejection
from sidecar.recurring import zones
from sidecar.recurring.spec import Schedule, parse_schedule

TS = 1_700_000_000_000


def parse(**headers: str | bytes | None) -> Schedule | Rejection | None:
    control: dict[str, bytes | None] = {c.ID: b"job-1"}
    for key, value in headers.items():
        name = "delay." + key.replace("_", "-")
        if value is None:
            control.pop(name, None)
        else:
            control[name] = value.encode() if isinstance(value, str) else value
    return parse_schedule(control, TS)


def reason(**headers: str | bytes | None) -> str:
    got = parse(**headers)
    assert isinstance(got, Rejection), got
    assert got.error
    return got.reason


def test_no_recurring_header_is_not_a_schedule() -> None:
    assert parse_schedule({c.ID: b"x", c.DELAY_MS: b"5"}, TS) is None


def test_cron_with_defaults() -> None:
    s = parse(cron="*/5 * * * *")
    assert isinstance(s, Schedule)
    assert s.cron is not None and s.cron.text == "*/5 * * * *" and not s.cron.wall_fixed
    assert (s.every_ms, s.tz, s.start_ms, s.end_ms, s.max_count) == (None, "UTC", TS, None, None)
    assert s.misfire == "fire-once"


def test_every_with_every_option() -> None:
    s = parse(every="60000", start="1000", end="2000000", max_count="3", misfire="skip")
    assert s == Schedule(None, 60_000, "UTC", 1000, 2_000_000, 3, "skip")


@pytest.mark.parametrize(("text", "norm", "seconds", "fixed"), [
    ("@hourly", "0 * * * *", False, False),
    ("@DAILY", "0 0 * * *", False, True),
    ("@midnight", "0 0 * * *", False, True),
    ("@weekly", "0 0 * * 0", False, True),
    ("@monthly", "0 0 1 * *", False, True),
    ("@yearly", "0 0 1 1 *", False, True),
    ("@annually", "0 0 1 1 *", False, True),
    (" 30   2 * *  mon-fri ", "30 2 * * MON-FRI", False, True),
    ("0 30 2 * * *", "0 30 2 * * *", True, True),
    ("*/10 30 2 * * *", "*/10 30 2 * * *", True, False),
    ("0 0-59 2 * * *", "0 0-59 2 * * *", True, True),
])
def test_cron_forms(text: str, norm: str, seconds: bool, fixed: bool) -> None:
    s = parse(cron=text, tz="Europe/Paris")
    assert isinstance(s, Schedule) and s.cron is not None
    assert (s.cron.text, s.cron.has_seconds, s.cron.wall_fixed, s.tz) == (norm, seconds, fixed, "Europe/Paris")


@pytest.mark.parametrize("text", [
    "* * * *", "* * * * * * *", "61 * * * *", "* 24 * * *", "* * 32 * *", "* * * 13 *", "* * * * 8",
    "5-1 * * * *", "*/0 * * * *", "@reboot", "@every 5m", "0 0 31 2 *", "x * * * *", "1L/2 * * * *",
    "0 0 * * MON#6", "é * * * *", "1," * 150 + "1 * * * *",
])
def test_bad_cron(text: str) -> None:
    assert reason(cron=text) == c.BAD_CRON


@pytest.mark.parametrize(("headers", "want"), [
    ({"cron": b""}, c.BAD_HEADER),
    ({"cron": b"\xff"}, c.BAD_HEADER),
    ({"every": "1e3"}, c.BAD_HEADER),
    ({"every": " 1000"}, c.BAD_HEADER),
    ({"every": "+1000"}, c.BAD_HEADER),
    ({"every": "1000", "start": "soon"}, c.BAD_HEADER),
    ({"every": "1000", "max_count": "1.5"}, c.BAD_HEADER),
    ({"every": "1000", "misfire": "catch-up"}, c.BAD_HEADER),
    ({"every": "1000", "ms": "5"}, c.CONFLICTING_DELAY),
    ({"cron": "@daily", "deliver_at": "5"}, c.CONFLICTING_DELAY),
    ({"cron": "@daily", "level": "1"}, c.CONFLICTING_DELAY),
    ({"cron": "@daily", "every": "1000"}, c.BAD_SCHEDULE),
    ({"tz": "Europe/Paris"}, c.BAD_SCHEDULE),
    ({"start": "5"}, c.BAD_SCHEDULE),
    ({"every": "1000", "id": None}, c.BAD_SCHEDULE),
    ({"every": "1000", "tz": "UTC"}, c.BAD_SCHEDULE),
    ({"every": "999"}, c.BAD_SCHEDULE),
    ({"every": "1000", "start": "-1"}, c.BAD_SCHEDULE),
    ({"every": "1000", "end": "253402300800000"}, c.BAD_SCHEDULE),
    ({"every": "1000", "start": "2000", "end": "1999"}, c.BAD_SCHEDULE),
    ({"every": "1000", "max_count": "0"}, c.BAD_SCHEDULE),
    ({"cron": "@daily", "tz": "Mars/Olympus_Mons"}, c.UNKNOWN_TIME_ZONE),
    ({"cron": "@daily", "tz": "europe/paris"}, c.UNKNOWN_TIME_ZONE),
    ({"cron": "@daily", "tz": "../../etc/passwd"}, c.UNKNOWN_TIME_ZONE),
    ({"cron": "@daily", "tz": "Europe"}, c.UNKNOWN_TIME_ZONE),
    ({"cron": "bad", "tz": "Nowhere/Else"}, c.BAD_CRON),  # the check order: cron before zone
    ({"cron": "bad", "every": "1000", "ms": "1"}, c.CONFLICTING_DELAY),
])
def test_rejections(headers: dict[str, str | bytes | None], want: str) -> None:
    assert reason(**headers) == want


def test_end_equal_to_start_and_default_start_without_timestamp() -> None:
    assert isinstance(parse(every="1000", start="5000", end="5000"), Schedule)
    s = parse_schedule({c.ID: b"x", c.EVERY: b"1000"}, -1)
    assert isinstance(s, Schedule) and s.start_ms == 0


def test_new_reasons_and_headers_are_distinct_from_the_others() -> None:
    assert set(c.RECURRING_REASONS) <= set(c.REASONS) and not set(c.RECURRING_REASONS) & set(c.ONE_SHOT_REASONS)
    assert len(set(c.RECURRING_REASONS)) == 3
    assert not set(c.RECURRING_HEADERS) & set(c.CONTROL_HEADERS)


def test_zones_come_from_the_tzdata_package_not_the_host() -> None:
    import tzdata

    paris = zones.zone("Europe/Paris")
    assert paris.key == "Europe/Paris" and zones.zone("Europe/Paris") is paris
    assert "US/Eastern" in zones.zone_names() and "UTC" in zones.zone_names()
    assert len(zones.zone_names()) > 400
    # from_file: the zone was read from the package, whatever TZPATH holds
    assert (Path(tzdata.__file__).parent / "zoneinfo" / "Europe" / "Paris").is_file()
    assert zones.offset_s(paris, int(datetime(2024, 7, 1, tzinfo=UTC).timestamp())) == 7200


def test_a_host_zone_file_is_never_read(tmp_path: Path) -> None:
    """A host TZPATH whose Europe/Paris is really UTC fools ``ZoneInfo(name)``, not ``zones.zone``."""
    import tzdata

    fake = tmp_path / "Europe" / "Paris"
    fake.parent.mkdir()
    fake.write_bytes((Path(tzdata.__file__).parent / "zoneinfo" / "UTC").read_bytes())
    code = ("from zoneinfo import ZoneInfo; from datetime import datetime; from sidecar.recurring import zones; "
            "t = 1719792000; print(zones.offset_s(zones.zone('Europe/Paris'), t), "
            "int(datetime.fromtimestamp(t, ZoneInfo('Europe/Paris')).utcoffset().total_seconds()))")
    env = {**os.environ, "PYTHONTZPATH": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["7200", "0"]  # ours: CEST; the host lookup: the fake file


@pytest.mark.parametrize("tz", ["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago",
                                "Pacific/Chatham", "Asia/Kolkata", "UTC"])
def test_transitions_match_an_hourly_scan(tz: str) -> None:
    """The 3-hour probes find every offset change an hourly scan finds, to the second (2020-2030)."""
    z = zones.zone(tz)
    for year in range(2020, 2031):
        lo = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
        hi = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
        hourly = [zones.offset_s(z, t) for t in range(lo - 3600, hi, 3600)]
        changes = []
        for i in (i for i in range(1, len(hourly)) if hourly[i] != hourly[i - 1]):
            a, b = lo - 3600 + (i - 1) * 3600, lo - 3600 + i * 3600  # the change is in (a, b]
            while b - a > 1:
                a, b = (a, (a + b) // 2) if zones.offset_s(z, (a + b) // 2) != hourly[i - 1] else ((a + b) // 2, b)
            if b >= lo:
                changes.append(b)
        assert [tr.at_s for tr in zones.transitions(z, year)] == changes
        for tr in zones.transitions(z, year):
            assert zones.offset_s(z, tr.at_s - 1) == tr.before_s and zones.offset_s(z, tr.at_s) == tr.after_s
