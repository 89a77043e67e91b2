"""``delay-sidecar accuracy``: run the batch accuracy job (spark/accuracy.py) and print a table.

    delay-sidecar accuracy --bootstrap-servers 127.0.0.1:9092 --ingress-topic delay.ingress \\
        --targets 'orders\\..*' --since 2025-01-01T10:00:00Z --until 2025-01-01T11:00:00Z --out out/acc

TIME is ISO-8601 (``2025-01-01T10:00:00Z``; no zone means UTC), epoch milliseconds, ``now`` or
``now-15m`` / ``-15m`` (write ``--since=-15m``: argparse reads a lone ``-15m`` as a flag).
Durations (``--grace``, ``--levels``, the offset after ``now-``) follow sidecar/durations.py: an
integer directly followed by ms, s, m, h or d. Defaults: since = one hour ago, until = now. The
same flags drive ``spark-submit spark/accuracy.py`` and ``python -m spark.accuracy``. Exit status:
0, or 1 with ``--check`` when any record was lost or delivered early, 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.durations import DURATION_FORMS, parse_duration_list, parse_duration_ms

_RELATIVE = re.compile(r"^(?:now)?\s*-\s*(.*)$", re.I)
TIME_FORMS = "a time is ISO-8601 (2025-01-01T10:00:00Z; no zone means UTC), epoch ms, now, or now-DURATION / -DURATION"


def parse_time_ms(text: str, *, now_ms: int | None = None) -> int:
    """ISO-8601, epoch ms, ``now`` or ``now-1h`` / ``-1h`` -> epoch ms. The offset is a duration
    of ``sidecar.durations`` (a unit is required: ``now-15`` is refused)."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    value = text.strip()
    if value.lower() == "now":
        return now
    if re.fullmatch(r"[0-9]+", value):
        return int(value)
    rel = _RELATIVE.match(value)
    if rel:
        try:
            return now - parse_duration_ms(rel.group(1))
        except ValueError as exc:
            raise ValueError(f"bad offset in {text!r}: {exc}") from None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a time; {TIME_FORMS}, e.g. now-1h") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def _arg_type(fn: Any, what: str) -> Any:
    def convert(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = what
    return convert


def _levels(text: str) -> list[int]:
    levels = parse_duration_list(text)
    if any(b <= a for a, b in itertools.pairwise(levels)) or levels[0] <= 0:
        raise ValueError(f"levels must be positive and strictly increasing: {text!r}")
    return levels


def _local_dir(text: str) -> str:
    """``--out``: a directory path; the driver writes summary.json and chart.png there with plain
    file I/O, so a URI (hdfs://, s3a://, file://) would become a local directory named after it."""
    if not text.strip():
        raise ValueError("empty path")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:/", text):  # scheme:/... (a one-letter scheme is a drive)
        raise ValueError(
            f"expected a directory path (on a cluster: one that the driver and every executor see at "
            f"the same path, e.g. an NFS mount), not a URI: {text!r}"
        )
    return text


def _kv(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def read_committed_help(topics: str, report: str) -> str:
    """``--read-committed``'s help, shared by both jobs."""
    return (
        f"read {topics} with the Kafka consumer setting isolation.level=read_committed (connector option "
        "kafka.isolation.level): records of aborted transactions are skipped, and nothing past a still-open "
        "transaction is read before it ends (the last stable offset). Default: read_uncommitted, every record "
        "written is read, aborted transactions included: Spark's Kafka connector sets no isolation.level, so "
        "the Kafka Java client's default read_uncommitted applies (librdkafka clients default to read_committed). "
        f"The level used is {report}'s isolation_level"
    )


def build_parser(prog: str = "delay-sidecar accuracy") -> argparse.ArgumentParser:
    from spark.accuracy import DEFAULT_LEVELS_MS

    p = argparse.ArgumentParser(
        prog=prog,
        description="Measure end-to-end delay accuracy: join the ingress topic and the delivered topics "
        "by delay.id through Spark's Kafka connector (lateness percentiles, early, lost, duplicates).",
        epilog=f"TIME: {TIME_FORMS}. DURATION: {DURATION_FORMS}.",
    )
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                   help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--ingress-topic", default=None, metavar="TOPIC[,TOPIC...]",
                   help="ingress topic, or several comma-separated (tenants) (default: every tenant's of --config, "
                        "else delay.ingress)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="the sidecar's YAML configuration: its tenants name the ingress topics in the per-tenant "
                        "breakdown (without, each ingress topic is its own tenant)")
    p.add_argument("--history-topic", default=None, metavar="TOPIC",
                   help="read the sidecar's history topic (its history-topic setting) instead of the ingress "
                        "topic: no payloads, the committed due times")
    p.add_argument("--targets", required=True, metavar="PATTERN",
                   help="delivered topics: a Java regex matched against whole topic names, e.g. 'orders\\..*'")
    p.add_argument("--since", type=_arg_type(parse_time_ms, "time"), default=None, metavar="TIME",
                   help="range start: ISO-8601, epoch ms, now or now-DURATION, e.g. now-1h (default: one hour ago)")
    p.add_argument("--until", type=_arg_type(parse_time_ms, "time"), default=None, metavar="TIME",
                   help="range end, exclusive (default: now)")
    p.add_argument("--out", type=_arg_type(_local_dir, "directory"), default="out/accuracy", metavar="DIR",
                   help="output directory for summary.json, details.parquet, chart.png (default out/accuracy); "
                   "on a cluster the driver and every executor must see it at the same path")
    p.add_argument("--levels", type=_arg_type(_levels, "levels"), default=list(DEFAULT_LEVELS_MS),
                   metavar="DURATIONS",
                   help="delay level table, durations separated by spaces or commas, e.g. '1s 5s 10s 30s 1m' "
                   "(default: RocketMQ's 18 levels)")
    p.add_argument("--grace", type=_arg_type(parse_duration_ms, "duration"), default="0ms", metavar="DURATION",
                   help="records due within this long before --until and not yet delivered are pending, "
                   "not lost (default 0ms)")
    p.add_argument("--starting-offsets", metavar="JSON",
                   help="ingress offset range start instead of --since (Spark JSON or earliest)")
    p.add_argument("--ending-offsets", metavar="JSON", help="ingress offset range end (Spark JSON or latest)")
    p.add_argument("--kafka", type=_arg_type(_kv, "KEY=VALUE"), action="append", default=[], metavar="KEY=VALUE",
                   help="extra Kafka client property, e.g. security.protocol=SSL (repeatable)")
    p.add_argument("--timeout", type=_arg_type(parse_duration_ms, "duration"), default="10s", metavar="DURATION",
                   help="before the job starts, Kafka is checked with the --kafka properties (spark/kafka_check.py): "
                        "give up when it has not answered within this (default 10s)")
    p.add_argument("--read-committed", action="store_true",
                   help=read_committed_help("the ingress (or history) and the delivered topics", "the summary"))
    p.add_argument("--master", default=None, help="Spark master (default local[2], or spark-submit's)")
    p.add_argument("--no-chart", action="store_true", help="do not write chart.png")
    p.add_argument("--no-details", action="store_true", help="do not write details.parquet")
    p.add_argument("--json", action="store_true", help="print the summary JSON instead of the table")
    p.add_argument("--check", action="store_true", help="exit 1 when a record was lost or delivered early")
    return p


def _fmt(v: Any) -> str:
    return "-" if v is None else str(v)


def format_table(summary: dict[str, Any]) -> str:
    """The summary as text: totals, per topic and level, per topic, level and minute."""
    t = summary["totals"]
    lat = t["lateness_ms"]
    rng = summary["range"]
    lines = [
        f"accuracy: {summary['ingress_topic']} -> /{summary['targets']}/  {rng['since']} .. {rng['until']}"
        f"  ({summary['isolation_level']})",
        f"  sent {t['sent']}  delivered {t['delivered']}  lost {t['lost']}  pending {t['pending']}  "
        f"duplicates {t['duplicates']}  early {t['early']}  unmatched {t.get('unmatched', 0)}",
        f"  lateness ms: p50 {_fmt(lat['p50'])}  p90 {_fmt(lat['p90'])}  p99 {_fmt(lat['p99'])}  "
        f"p99.9 {_fmt(lat['p999'])}  max {_fmt(lat['max'])}",
    ]
    fired = t.get("firings") or {}
    if fired.get("fired") or fired.get("lost"):
        flat = fired["lateness_ms"]
        lines.append(
            f"  recurring firings {fired['fired']}  lost {fired['lost']}  missed {fired['missed']}  "
            f"duplicates {fired['duplicates']}  early {fired['early']}  lateness ms: p50 {_fmt(flat['p50'])}  "
            f"p99 {_fmt(flat['p99'])}  max {_fmt(flat['max'])}")
    ignored = t.get("ignored") or {}
    if any(ignored.values()):
        lines.append("  not counted: " + "  ".join(f"{k} {v}" for k, v in ignored.items() if v))
    by_tenant = summary.get("by_tenant") or []
    if len(by_tenant) > 1:
        for r in by_tenant:
            tl = r["lateness_ms"]
            lines.append(f"  tenant {r['tenant']}: sent {r['sent']}  delivered {r['delivered']}  lost {r['lost']}  "
                         f"pending {r['pending']}  duplicates {r['duplicates']}  early {r['early']}  "
                         f"lateness ms p99 {_fmt(tl['p99'])}  max {_fmt(tl['max'])}")
    header = ("topic", "level", "minute", "sent", "deliv", "lost", "pend", "dup", "early",
              "p50", "p90", "p99", "p99.9", "max")
    rows: list[tuple[str, ...]] = []
    for r in summary["by_topic_level"]:
        rows.append(_row(r, "all"))
    for r in summary["by_minute"]:
        rows.append(_row(r, (r["minute"] or "-")[:16].replace("T", " ")))
    if rows:
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

        def line(cells: Sequence[str]) -> str:
            # name columns left-aligned, numbers right-aligned
            return "  ".join(
                c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        lines.append("")
        lines.append(line(header))
        lines.extend(line(row) for row in rows)
    return "\n".join(lines)


def _row(r: dict[str, Any], minute: str) -> tuple[str, ...]:
    lat = r["lateness_ms"]
    return (
        str(r["topic"]), _fmt(r["level"]), minute,
        *(str(r[k]) for k in ("sent", "delivered", "lost", "pending", "duplicates", "early")),
        *(_fmt(lat[k]) for k in ("p50", "p90", "p99", "p999", "max")),
    )


def accuracy_main(argv: Sequence[str] | None = None, *, prog: str = "delay-sidecar accuracy") -> int:
    """Parse flags, run the batch job in a (local or spark-submit) SparkSession, print the summary."""
    from spark.accuracy import isolation_level

    parser = build_parser(prog)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
        now = int(time.time() * 1000)
        until = args.until if args.until is not None else now
        since = args.since if args.since is not None else until - 3_600_000
        if not args.bootstrap_servers:
            parser.error("--bootstrap-servers is required (or set KAFKA_BOOTSTRAP_SERVERS)")
        if until <= since:
            parser.error(f"--until ({until}) must be after --since ({since})")
        if not args.targets.strip():
            parser.error("--targets: empty pattern")
        try:
            re.compile(args.targets)
        except re.error as exc:
            parser.error(f"--targets: not a regular expression: {exc}")
        try:
            isolation_level(dict(args.kafka), args.read_committed)
        except ValueError as exc:
            parser.error(f"--read-committed / --kafka: {exc}")
        tenants = None
        if args.config is not None:
            from sidecar.config import ConfigError
            from spark.tenancy import tenants_from_config

            try:
                tenants = tenants_from_config(args.config)
            except (ConfigError, OSError) as exc:
                parser.error(f"--config: {exc}")
        if args.ingress_topic is None:
            args.ingress_topic = ",".join(tenants) if tenants else "delay.ingress"
    except SystemExit as exc:  # argparse: --help (0) or a bad flag (2, message already printed)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2

    from sidecar.connectivity import probe
    from spark.kafka_check import librdkafka_conf

    with tempfile.TemporaryDirectory(prefix="kds-accuracy-") as pem_dir:
        cause = probe(librdkafka_conf(args.bootstrap_servers, dict(args.kafka), Path(pem_dir)), args.timeout / 1000)
    if cause is not None:  # one line now, not a Java stack trace from an executor later
        print(f"{prog}: error: Kafka at {args.bootstrap_servers}: {cause.message()}", file=sys.stderr)
        return 2 if cause.code == "bad-config" else 1

    import orjson

    from spark.accuracy import run_accuracy
    from spark.jars import ConnectorJarsError
    from spark.session import get_session

    try:
        session = get_session("kds-accuracy", master=args.master)
    except ConnectorJarsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    summary = run_accuracy(
        session,
        args.bootstrap_servers,
        args.ingress_topic,
        args.targets,
        since,
        until,
        args.out,
        levels_ms=args.levels,
        grace_ms=args.grace,
        ingress_starting_offsets=args.starting_offsets,
        ingress_ending_offsets=args.ending_offsets,
        kafka_options=dict(args.kafka),
        chart=not args.no_chart,
        details=not args.no_details,
        history_topic=args.history_topic,
        read_committed=args.read_committed,
        tenants=tenants,
    )
    if args.json:
        print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    else:
        print(format_table(summary))
        print(f"\noutputs: {', '.join(summary['outputs'].values())}")
    totals = summary["totals"]
    firings = totals.get("firings") or {}
    if args.check and (totals["lost"] or totals["early"] or firings.get("lost") or firings.get("early")):
        return 1
    return 0
