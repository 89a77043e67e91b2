"""A recurring record's headers -> a ``Schedule``, or a ``Rejection`` with a stable reason.

``parse_schedule`` reads the control headers of one ingress record (name -> raw value, as
``sidecar.headers`` collects them) and answers:

- None: the record carries none of the recurring headers (``contract.RECURRING_HEADERS``),
- ``Schedule``: a valid recurring schedule (frozen; times in epoch ms UTC),
- ``Rejection(reason, error)``: bad input, bound for the DLQ.

It never raises on user input. The check order is fixed, so that a record with several faults
always gets the same reason:

1. ``bad-header``: an empty or non-UTF-8 value, a number that is not a strict decimal integer
   (``sidecar.headers`` rules), a ``delay.misfire`` other than ``fire-once`` / ``skip``;
2. ``conflicting-delay``: a one-shot delay header (``delay.ms``, ``delay.deliver-at``,
   ``delay.level``) beside ``delay.cron`` / ``delay.every``;
3. ``bad-schedule``: both or neither of ``delay.cron`` and ``delay.every``, no ``delay.id``,
   ``delay.tz`` with ``delay.every``;
4. ``bad-cron``: an expression that does not parse or never matches (sidecar/recurring/cronexpr.py);
5. ``unknown-time-zone``: a ``delay.tz`` that is not a zone of the pinned tzdata;
6. ``bad-schedule``: ``delay.every`` < 1000, a start or end outside 0..9999-12-31, an end before
   the start, a ``delay.max-count`` < 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sidecar import contract as c
from sidecar.headers import MAX_EPOCH_MS, Rejection, _Bad, _int, _text
from sidecar.recurring import cronexpr, zones

_ONE_SHOT = (c.DELAY_MS, c.DELIVER_AT, c.LEVEL)
_INTEGERS = (c.EVERY, c.START, c.END, c.MAX_COUNT)


@dataclass(frozen=True, slots=True)
class Schedule:
    """Exactly one of ``cron`` and ``every_ms`` is set. Firings are at or after ``start_ms`` and
    at or before ``end_ms`` (inclusive), at most ``max_count`` of them."""

    cron: cronexpr.CronExpr | None
    every_ms: int | None
    tz: str  # IANA name; "UTC" for delay.every
    start_ms: int
    end_ms: int | None
    max_count: int | None
    misfire: str  # contract.MISFIRE_VALUES


def parse_schedule(control: Mapping[str, bytes | None], record_ts_ms: int) -> Schedule | Rejection | None:
    """Classify a record's recurring headers; ``record_ts_ms`` (its Kafka timestamp) is the
    default start."""
    if not any(name in control for name in c.RECURRING_HEADERS):
        return None
    try:
        return _parse(control, record_ts_ms)
    except _Bad as bad:
        return Rejection(bad.reason, bad.error)


def _parse(control: Mapping[str, bytes | None], ts: int) -> Schedule:
    text = {name: _text(name, control[name]) for name in c.RECURRING_HEADERS if name in control}
    num = {name: _int(name, control[name]) for name in _INTEGERS if name in control}
    misfire = text.get(c.MISFIRE, c.MISFIRE_FIRE_ONCE)
    if misfire not in c.MISFIRE_VALUES:
        raise _Bad(c.BAD_HEADER, f"header {c.MISFIRE} is {misfire[:40]!r}; accepted: {', '.join(c.MISFIRE_VALUES)}")

    one_shot = [name for name in _ONE_SHOT if name in control]
    if one_shot:
        kind = c.CRON if c.CRON in text else c.EVERY if c.EVERY in text else "a recurring header"
        raise _Bad(c.CONFLICTING_DELAY, f"{', '.join(one_shot)} beside {kind}: a record is one-shot or recurring")

    if (c.CRON in text) == (c.EVERY in text):
        given = [name for name in c.RECURRING_HEADERS if name in text]
        raise _Bad(c.BAD_SCHEDULE, f"a recurring record needs exactly one of {c.CRON} and {c.EVERY}; "
                                   f"it has {', '.join(given)}")
    if c.ID not in control:
        raise _Bad(c.BAD_SCHEDULE, f"a recurring record needs {c.ID} (the schedule's id)")
    if c.EVERY in text and c.TZ in text:
        raise _Bad(c.BAD_SCHEDULE, f"{c.TZ} applies to {c.CRON} only ({c.EVERY} counts absolute time)")

    cron = None
    if c.CRON in text:
        try:
            cron = cronexpr.parse(text[c.CRON])
        except cronexpr.BadCron as e:
            raise _Bad(c.BAD_CRON, f"header {c.CRON}: {e}") from None
    tz = text.get(c.TZ, "UTC")
    try:
        zones.zone(tz)
    except zones.UnknownZone as e:
        raise _Bad(c.UNKNOWN_TIME_ZONE, f"header {c.TZ}: {e}") from None

    every = num.get(c.EVERY)
    if every is not None and every < c.MIN_EVERY_MS:
        raise _Bad(c.BAD_SCHEDULE, f"{c.EVERY} is {every} ms; the least is {c.MIN_EVERY_MS}")
    start = num.get(c.START, max(ts, 0))  # a record without a timestamp has -1
    end = num.get(c.END)
    for name, value in ((c.START, start), (c.END, end)):
        if value is not None and not 0 <= value <= MAX_EPOCH_MS:
            raise _Bad(c.BAD_SCHEDULE, f"{name} {value} is outside 0..{MAX_EPOCH_MS} (epoch ms)")
    if end is not None and end < start:
        raise _Bad(c.BAD_SCHEDULE, f"{c.END} {end} is before the start {start}")
    max_count = num.get(c.MAX_COUNT)
    if max_count is not None and max_count < 1:
        raise _Bad(c.BAD_SCHEDULE, f"{c.MAX_COUNT} is {max_count}; the least is 1")
    return Schedule(cron, every, tz, start, end, max_count, misfire)
