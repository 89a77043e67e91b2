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

import functools
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


# -- a stored schedule, cheaply --------------------------------------------------------------------
_TIMES = frozenset((c.START, c.END, c.MAX_COUNT))
_ANY_ID = {c.ID: b"-"}  # parse_schedule asks only that an id is there


def stored_schedule(spec: tuple[tuple[str, bytes | None], ...], record_ts_ms: int) -> Schedule | Rejection | None:
    """``parse_schedule`` of a stored schedule's headers ``spec`` (with its ``delay.id``), the same
    answer at a firing's cost. Schedules differ mostly in their times (``delay.start``, ``end``,
    ``max-count``: a fleet of a few expressions with a start each), so the rest, the *shape*, is
    parsed once per distinct shape (cached) and the times are checked here with the same rules;
    anything out of the common case (a time that is not plain digits or is out of range, a shape
    that does not parse) is parsed in full, so a bad spec gets ``parse_schedule``'s reason."""
    shape: list[tuple[str, bytes | None]] = []
    start, end, max_count = max(record_ts_ms, 0), None, None
    common = True
    for h in spec:
        name, value = h
        if name not in _TIMES:
            shape.append(h)
        elif value is None or not value.isdigit() or len(value) > 18:
            common = False  # parse in full: its rules say which reason
        elif name == c.START:
            start = int(value)
        elif name == c.END:
            end = int(value)
        else:
            max_count = int(value)
    template = _shape(tuple(shape))
    if (common and isinstance(template, Schedule) and start <= MAX_EPOCH_MS
            and (end is None or start <= end <= MAX_EPOCH_MS) and (max_count is None or max_count >= 1)):
        return Schedule(template.cron, template.every_ms, template.tz, start, end, max_count, template.misfire)
    return parse_schedule({**dict(spec), **_ANY_ID}, record_ts_ms)


@functools.lru_cache(maxsize=4096)
def _shape(shape: tuple[tuple[str, bytes | None], ...]) -> Schedule | Rejection | None:
    return parse_schedule({**dict(shape), **_ANY_ID}, 0)
