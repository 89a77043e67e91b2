"""The bench's scenario options, each declared once: its flag, the key ``Bench.options`` holds its
value under (the key the scenarios read, e.g. ``bench.options.get("max_delay_ms")``), its parser,
metavar and help text.

``delay-sidecar bench``'s parser gets these flags from :func:`add_arguments` and ``Bench.options``
is built from the parsed namespace by :func:`bench_options`, both from the one declaration, so the
two cannot drift apart: no flag parsed and then not passed on, no key passed on without its flag.
The parsers (:func:`count`, :func:`max_delay`, ...) name the bad value and what is accepted;
argparse exits 2 with ``argument FLAG: 'VALUE': ...``. ``--transaction-interval``'s parser
(:func:`interval`) is here too, though its value is passed to ``Bench`` on its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bench import shape
from bench.mass_expiry import EXPIRY_DELAYS_MS
from sidecar.durations import parse_duration_ms


def count(text: str) -> int:
    """A positive count: digits, optionally with a k or M suffix (``2500000``, ``500k``, ``20M``)."""
    t = text.strip()
    scale = {"k": 1000, "M": 1_000_000}.get(t[-1:], 1)
    digits = t[:-1] if scale != 1 else t
    if not digits.isdigit() or int(digits) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive count such as 2500000, 500k or 20M")
    return int(digits) * scale


def counts(text: str) -> list[int]:
    """Comma-separated positive counts, each as ``count`` takes it (``1M,10M``)."""
    return [count(t) for t in text.split(",")]


def duration_in(text: str, lo_ms: float, hi_ms: float, accepted: str) -> int:
    """A duration with its unit (``parse_duration_ms``) from ``lo_ms`` to ``hi_ms``; else the error
    names the value and ``accepted``."""
    try:
        ms = parse_duration_ms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    if not lo_ms <= ms <= hi_ms:
        raise argparse.ArgumentTypeError(f"{text!r}: {accepted}")
    return ms


def period(text: str) -> int:
    """A recurring schedule's period: at least 1s (``delay.every``'s least)."""
    return duration_in(text, 1000, float("inf"), "give a period of at least 1s, such as 10s or 1m")


def max_delay(text: str) -> int:
    """The lateness and steady scenarios' longest delay: 1s (the first level) to 10s."""
    return duration_in(text, 1_000, 10_000, "give a duration from 1s to 10s, such as 2s")


def expiry_delay(text: str) -> int:
    """The mass expiry's one delay: one of the sidecar's level times up to 4m."""
    accepted = "give a level time: 1s, 5s, 10s, 30s, 1m, 2m, 3m or 4m"
    ms = duration_in(text, 1_000, 240_000, accepted)
    if ms not in EXPIRY_DELAYS_MS:
        raise argparse.ArgumentTypeError(f"{text!r}: {accepted}")
    return ms


def dwell(text: str) -> int:
    """The failover and exactly-once scenarios' load after each change: 0s to 10m."""
    return duration_in(text, 0, 600_000, "give a duration from 0s to 10m, such as 1s")


def interval(text: str) -> int:
    """A transaction interval: 1ms to 5s (the sidecar refuses more than half its 10 s transaction
    timeout)."""
    return duration_in(text, 1, 5_000, "give a duration from 1ms to 5s, such as 50ms, 500ms or 1s")


def layouts(text: str) -> list[int]:
    """Comma-separated partition counts, each 1-64 (``1,6``)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and 1 <= int(p) <= 64 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give partition counts 1-64, comma-separated, such as 1,6")
    return [int(p) for p in parts]


def shapes(text: str) -> list[str]:
    """Comma-separated record shapes of ``bench.shape.SHAPES``, each at most once (``plain,common``)."""
    got = [m.strip() for m in text.split(",") if m.strip()]
    if not got or any(m not in shape.SHAPES for m in got) or len(set(got)) != len(got):
        raise argparse.ArgumentTypeError(f"{text!r}: give plain, common or plain,common")
    return got


@dataclass(frozen=True)
class Option:
    """One scenario option: ``flag`` parsed by ``parse`` into ``Bench.options[key]`` (None when not
    given). With ``after_parsing`` argparse keeps the text (under the flag's name) and
    :func:`check_after_parsing` parses it once every argument is read, its error reading ``FLAG
    'VALUE': ...`` (``--shape``'s, as it always has), and keeps the value under ``key``."""

    flag: str
    key: str
    parse: Callable[[str], Any]
    metavar: str
    help: str
    after_parsing: bool = False

    @property
    def dest(self) -> str:
        """The namespace attribute argparse stores the flag under (``--max-delay``: ``max_delay``)."""
        return self.flag.removeprefix("--").replace("-", "_")

    def value(self, ns: argparse.Namespace) -> Any:
        """The parsed value in ``ns`` (after :func:`check_after_parsing`)."""
        return getattr(ns, self.key if self.after_parsing else self.dest)


SHAPE = Option("--shape", "shapes", shapes, "SHAPES",
               "comma-separated record shapes throughput and lateness send: plain (one ingress "
               "partition, schedule headers only), common (explicit delay.id, a user header, "
               f"{shape.COMMON_PARTITIONS} ingress partitions); default: plain,common at --size full, "
               "plain at --size small", after_parsing=True)

# the scenarios' sizes, rates and times, last in --help
TUNING: tuple[Option, ...] = (
    Option("--scale-pending", "scale_pending", count, "N",
           "scale: records pending per layout (default 30000 small, 100000000 full)"),
    Option("--scale-rate", "scale_rate", count, "R",
           "scale: the fill's paced rate, records/s (default 20000 small, 40000 full)"),
    Option("--lateness-rate", "lateness_rate", count, "R",
           "lateness: measure at R records/s instead of 50 %% of the measured maximum (a "
           "point of the rate/lateness curve; no goal applies), e.g. 27000 or 27k"),
    Option("--throughput-records", "throughput_records", count, "N",
           "throughput: records pre-loaded per record size (default 20000 small, 300000 full)"),
    Option("--restore-pending", "restore_pending", count, "N",
           "restore: changelog records pending (default 200000 small, 10000000 full)"),
    Option("--lateness-seconds", "lateness_seconds", count, "S",
           "lateness: seconds of paced load per variant (default 5 small, 60 full)"),
    Option("--max-delay", "max_delay_ms", max_delay, "DURATION",
           "lateness, steady, failover, exactly-once: the longest delay sent, 1s to 10s (default "
           "10s; 5s failover, exactly-once): levels then gets the level times up to it, wheel uniform "
           "delays up to it; mass-expiry, tenants: their one delay, the longest level time up to it "
           "(default 10s small); the smoke tests' 2s (mass-expiry, tenants 5s)"),
    Option("--expiry-delay", "expiry_delay_ms", expiry_delay, "DURATION",
           "mass-expiry, tenants: the mass expiry's one delay, a level time: 1s, 5s, 10s, 30s, 1m, "
           "2m, 3m or 4m (default 4m full, 10s small; --max-delay still cuts it): the 1M records "
           "take ~15 s to store, so 30s is the shortest full-size run"),
    Option("--dwell", "dwell_ms", dwell, "DURATION",
           "failover, exactly-once: the load after each membership change or phase, 0s to 10m "
           "(default 0.5s failover, 3s exactly-once small; 30s, 20s full)"),
    Option("--crashes", "crashes", count, "K",
           "failover, exactly-once: the crash loop's SIGKILLs (default 4, 3 small; 10 full)"),
    Option("--list-pending", "list_pending", count, "N",
           "list: records pending in the store (default 100000 small, 10000000 full)"),
    Option("--recurring-schedules", "recurring_schedules", count, "N",
           "recurring: schedules (default 3000 small, 1000000 full)"),
    Option("--recurring-period", "recurring_period_ms", period, "DURATION",
           "recurring: each schedule's delay.every (default 10s small, 1m full)"),
    Option("--recurring-kills", "recurring_kills", int, "K",
           "recurring: SIGKILL the sidecar K times while the schedules fire, restarting it at once "
           "(default 0 small, 10 full)"),
    Option("--peer-pending", "peer_pending", counts, "N,N",
           "pg-poll, redis-zset, rabbit-ttl, streams-punctuator: the pending counts each peer's "
           "memory and disk are measured at, the first also its restart's (default 1M,10M full; "
           "100k, 50k small), e.g. 1M or 1M,10M"),
    Option("--scale-layouts", "scale_layouts", layouts, "P,P",
           "scale: the fill's ingress partitions, one layout each (default 1,6)"),
)

OPTIONS: tuple[Option, ...] = (SHAPE, *TUNING)  # every scenario option: Bench.options has one key each


def add_arguments(ap: argparse.ArgumentParser, options: Iterable[Option] = OPTIONS) -> None:
    """Add ``options`` to ``ap`` in their order, each defaulting to None."""
    for o in options:
        ap.add_argument(o.flag, type=str if o.after_parsing else o.parse, default=None, metavar=o.metavar,
                        help=o.help)


def check_after_parsing(ap: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Parse the ``after_parsing`` options' texts in ``ns`` into ``ns.<key>`` (None when not given);
    a bad one exits 2 through ``ap.error``."""
    for o in OPTIONS:
        if not o.after_parsing:
            continue
        text = getattr(ns, o.dest)
        value = None
        if text is not None:
            try:
                value = o.parse(text)
            except argparse.ArgumentTypeError as e:
                ap.error(f"{o.flag} {e}")
        setattr(ns, o.key, value)


def bench_options(ns: argparse.Namespace) -> dict[str, Any]:
    """``Bench.options``: every declared option's parsed value (None when not given) under its key."""
    return {o.key: o.value(ns) for o in OPTIONS}
