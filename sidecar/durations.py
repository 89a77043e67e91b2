"""Human durations and sizes: ``"1s"``, ``"1m"``, ``"2h"``, ``"400d"``, ``"250ms"``; ``"64MiB"``.

Every configurable time in the project is written this way (the RocketMQ level table
``1s 5s 10s 30s 1m ... 2h`` is the model). Parsing is strict: a bad value raises ``ValueError``
with the value in the message, so the CLI can name the flag and the value.
"""

from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$")
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
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_duration_ms(text: str | int) -> int:
    """``"5s"`` -> 5000. A bare integer is milliseconds."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"negative duration: {text}")
        return text
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 250ms, 5s, 1m, 2h, 400d)")
    return int(m.group(1)) * _UNITS_MS[m.group(2) or "ms"]


def format_duration_ms(ms: int) -> str:
    """The shortest exact spelling: 60000 -> ``"1m"``, 1500 -> ``"1500ms"``."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def parse_duration_list(text: str | list[str] | list[int]) -> list[int]:
    """``"1s 5s 10s"`` (spaces or commas) or a YAML list -> milliseconds."""
    items = text if isinstance(text, list) else re.split(r"[\s,]+", str(text).strip())
    out = [parse_duration_ms(i) for i in items if str(i).strip()]
    if not out:
        raise ValueError(f"empty duration list: {text!r}")
    return out


def parse_size(text: str | int) -> int:
    """``"64MiB"`` -> 67108864; a bare integer is bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"negative size: {text}")
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (expected e.g. 1048576, 64MiB, 10GB)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
