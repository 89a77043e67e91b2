"""Human durations and sizes: ``"1s"``, ``"1m"``, ``"2h"``, ``"400d"``, ``"250ms"``; ``"64MiB"``.

Every configurable time in the project is written this way (the RocketMQ level table
``1s 5s 10s 30s 1m ... 2h`` is the model), wherever a person writes it: command-line flags, the
YAML config file, environment variables, the ``delay`` string of the client helpers.

One rule for a duration: an integer directly followed by its unit (``ms``, ``s``, ``m``, ``h``,
``d``). Refused, each with a message that says why and shows the accepted forms:

- no unit (``"5"``): five milliseconds or five seconds? Guessing made ``--delay 5`` a 5 ms delay;
- a space inside (``"5 s"``): in a list (``levels: 1s 5s``) a space separates items, so a single
  duration has none either;
- a sign or a fraction (``"-5s"``, ``"1.5s"``): no delay or period here can be negative; write
  ``1500ms``.

Leading and trailing blanks are ignored. A size is an integer of bytes, optionally directly
followed by a unit (``64MiB``, ``10GB``); the same no-space rule applies. A bare size is bytes
(there is no other sensible unit). Python code that passes milliseconds as an ``int`` does so to
the client helpers (``sidecar.client``), not to these parsers: here an ``int`` (a YAML ``1000``)
is a duration without a unit and is refused like ``"1000"``.
"""

from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_SPACED = re.compile(r"[+-]?[0-9.]+\s+[a-zA-Z]+")
_FRACTION = re.compile(r"[0-9]*\.[0-9]+\s*[a-zA-Z]*")
MAX_MS = 2**63 - 1  # the store and the C extension keep times as signed 64-bit milliseconds

DURATION_FORMS = "a duration is an integer directly followed by ms, s, m, h or d, e.g. 250ms, 5s, 10m, 2h, 400d"
SIZE_FORMS = (
    "a size is an integer of bytes, optionally directly followed by a unit: k/KB, M/MB, G/GB, T/TB "
    "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 1048576, 64MiB, 10GB"
)

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"([0-9]+)([a-zA-Z]*)")


def _why_not(text: str, shown: str, what: str) -> str:
    """Why ``text`` (blanks stripped) is not a duration/size: the first half of the message."""
    if text.startswith("-"):
        return f"{shown} is negative"
    if _SPACED.fullmatch(text):
        return f"{shown} has a space between the number and the unit"
    if _FRACTION.fullmatch(text):
        return f"{shown} is not a whole number"
    if not text:
        return f"{shown} is empty"
    return f"{shown} is not a {what}"


def parse_duration_ms(text: str | int) -> int:
    """``"5s"`` -> 5000. Only the written form is accepted (see the module docstring): ``"5"``,
    ``5``, ``"5 s"``, ``"-5s"`` raise ``ValueError`` with the value and the accepted forms."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ValueError(f"{text!r} is not a duration; {DURATION_FORMS}")
    s = str(text).strip()
    m = _DURATION.fullmatch(s)
    if m is None:
        if re.fullmatch(r"\+?[0-9]+", s):
            n = int(s)
            why = f"{text!r} has no unit (write {n}ms or {n}s)"
        else:
            why = _why_not(s, repr(text), "duration")
        raise ValueError(f"{why}; {DURATION_FORMS}")
    ms = int(m.group(1)) * _UNITS_MS[m.group(2)]
    if ms > MAX_MS:
        raise ValueError(f"{text!r} is too long (at most {MAX_MS} ms); {DURATION_FORMS}")
    return ms


def format_duration_ms(ms: int) -> str:
    """The shortest exact spelling: 60000 -> ``"1m"``, 1500 -> ``"1500ms"``, 0 -> ``"0ms"``;
    ``parse_duration_ms`` reads it back."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def parse_duration_list(text: str | list[str] | list[int]) -> list[int]:
    """``"1s 5s 10s"`` (spaces or commas) or a YAML list -> milliseconds."""
    items = text if isinstance(text, list) else re.split(r"[\s,]+", str(text).strip())
    out: list[int] = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        try:
            out.append(parse_duration_ms(item))
        except ValueError as e:
            raise ValueError(f"in {text!r}: {e}") from None
    if not out:
        raise ValueError(f"empty duration list: {text!r}; give one or more, e.g. 1s 5s 10s")
    return out


def parse_size(text: str | int) -> int:
    """``"64MiB"`` -> 67108864; a bare integer is bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{text!r} is negative; {SIZE_FORMS}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a size; {SIZE_FORMS}")
    s = text.strip()
    m = _SIZE.fullmatch(s)
    if m is None or m.group(2).lower() not in _SIZE_UNITS:
        why = f"{text!r} has an unknown unit" if m is not None else _why_not(s, repr(text), "size")
        raise ValueError(f"{why}; {SIZE_FORMS}")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def format_size(n: int) -> str:
    """The spelling a person writes: 67108864 -> ``"64MiB"``; anything not a whole number of
    KiB/MiB/GiB/TiB stays in bytes (1000000 -> ``"1000000"``)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = _SIZE_UNITS[unit.lower()]
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)
