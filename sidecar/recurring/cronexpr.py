"""Cron expressions: parsing, validation, the DST class, and matching on wall-clock time.

Syntax: 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds field
(the Quartz/Spring order), or an alias: ``@yearly``/``@annually``, ``@monthly``, ``@weekly``,
``@daily``/``@midnight``, ``@hourly``. Fields take ``*``, values, ``a-b`` ranges, ``/step``,
lists, month and day names (``JAN``, ``MON``; any case), day-of-week 0-7 (0 and 7: Sunday), and
cronsim's extensions ``L`` (last day of the month), ``LW``, ``5L`` (last Friday), ``MON#1``
(first Monday). A range of one value with a step (``5-5/2``) is that one value, as in Vixie cron
(cronsim 2.8 would read it as ``5/2``, 5 to the end of the field: ``_one_value_ranges``). When
both day fields are restricted, a day matches if either matches; when
either day field starts with ``*``, both must match (Vixie cron's rule, which cronsim follows:
``0 0 1 * MON`` is "the 1st and every Monday"; ``0 0 */2 * MON`` is "odd days that are Mondays").

Calendar matching is cronsim's, run on *naive* wall-clock datetimes (no zone): cronsim never sees
a time zone, so all DST handling is ours (sidecar/recurring/timeline.py), with one rule per class:

- **fixed-time** (``wall_fixed``): no seconds, minute or hour field starts with ``*``. cronie's
  rule (its ``MIN_STAR``/``HR_STAR`` flags, extended to the seconds field): ``30 2 * * *``,
  ``0 9-17 * * MON-FRI``, ``0-59 2 * * *``, ``@daily``.
- **interval** (the rest): ``*/15 * * * *``, ``0 * * * *`` (``@hourly``), ``0 */2 * * *``,
  ``*/10 30 2 * * *``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta

from cronsim import CronSim, CronSimError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MAX_TEXT = 200  # bytes: longer than any sensible expression; bounds the parse work
_ONE_S = timedelta(seconds=1)
_PROBE_FROM = datetime(2000, 1, 1)  # a valid expression matches within 50 years of it
_NAMES = {name: str(i) for names in ("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC", "SUN MON TUE WED THU FRI SAT")
          for i, name in enumerate(names.split(), start=1 if names.startswith("JAN") else 0)}


class BadCron(ValueError):
    """The expression is not one this module accepts; the message says why."""


@dataclass(frozen=True, slots=True)
class CronExpr:
    text: str  # normalised: fields joined by one space, aliases expanded, upper case
    has_seconds: bool  # 6 fields (else a firing is on a whole minute)
    wall_fixed: bool  # the fixed-time DST class (module docstring)


@functools.lru_cache(maxsize=1024)
def parse(raw: str) -> CronExpr:
    """Parse and validate ``raw``; raise ``BadCron`` naming the fault."""
    if len(raw) > MAX_TEXT or not raw.isascii():
        raise BadCron(f"cron expression is not ASCII or is over {MAX_TEXT} characters")
    fields = raw.split()
    if len(fields) == 1 and fields[0].startswith("@"):
        alias = fields[0].lower()
        if alias not in ALIASES:
            raise BadCron(f"unknown cron alias {fields[0][:20]!r}; accepted: {', '.join(ALIASES)}")
        fields = ALIASES[alias].split()
    if len(fields) not in (5, 6):
        raise BadCron(f"cron expression has {len(fields)} fields; accepted: 5 (minute hour day month weekday) "
                      "or 6 (second first), or an @alias")
    text = " ".join(_one_value_ranges(f) for f in fields).upper()
    try:
        probe = CronSim(text, _PROBE_FROM)
    except CronSimError as e:
        raise BadCron(f"cron expression {text!r}: {e}") from None
    except Exception:  # cronsim fails an assertion on some malformed terms (e.g. "1L/2")
        raise BadCron(f"cron expression {text!r} is malformed") from None
    try:
        next(probe)
    except StopIteration:
        raise BadCron(f"cron expression {text!r} matches no date within 50 years") from None
    timed = fields[:3] if len(fields) == 6 else fields[:2]
    return CronExpr(text, len(fields) == 6, not any(f.startswith("*") for f in timed))


def _one_value_ranges(field: str) -> str:
    """Rewrite each ``a-a/step`` term of a field as ``a``. cronsim expands ``a-b/step`` by taking
    the range's values, and when there is only one it reads the term as ``a/step`` (from a to the
    end of the field), so ``0-0/1`` in the seconds field would fire every second."""
    terms = field.split(",")
    for i, term in enumerate(terms):
        rng, slash, _step = term.partition("/")
        lo, dash, hi = rng.partition("-")
        if slash and dash and _value(lo) == _value(hi):
            terms[i] = lo
    return ",".join(terms)


def _value(token: str) -> str:
    token = token.upper()
    return str(int(token)) if token.isdigit() else _NAMES.get(token, token)


def first_match(expr: CronExpr, wall: datetime) -> datetime | None:
    """The first naive wall-clock time >= ``wall`` (whole seconds) that ``expr`` matches, or None
    if there is none within 50 years (or before the end of ``datetime``)."""
    try:
        return next(CronSim(expr.text, wall.replace(microsecond=0) - _ONE_S))
    except (StopIteration, OverflowError):
        return None
