"""Streaming accuracy job: a rolling per-minute lateness table, published to a Kafka topic.

Reads the delivered topics (a subscribe pattern) with Structured Streaming through Spark's Kafka
connector with headers, and for every delivered record computes

    lateness_ms = record timestamp - delay.deliver-at header      (early: lateness_ms < 0)

Event time is the delivered record's Kafka timestamp. Records are grouped into one-minute
tumbling windows per topic and tenant, with a watermark (default 2 minutes) that bounds the state: a window
is final once the watermark passes its end, and records later than that are dropped. Per window
and topic: ``deliveries`` (every copy counts), ``duplicates`` (copies beyond the first of a
``delay.id`` within the window and topic: deliveries with an id - distinct ids, exact; a copy of
the same id delivered in another minute is not seen as one, the batch job counts those too),
``early``, ``missing_deliver_at`` (records without a usable header, not in the percentiles),
lateness p50 / p90 / p99 / p99.9 (``percentile_approx``) / max / min / mean. The distinct ids of
each open window are held in the query's state until the watermark closes it.

Isolation level: the delivered topics are read with ``isolation.level=read_committed`` when asked
(``--read-committed``: aborted transactions are skipped, as a ``read_committed`` consumer skips
them), else ``read_uncommitted`` (the Kafka Java client's default, which Spark's connector keeps:
aborted records are counted); every row carries it as ``isolation_level``.

Tenant: the delivered record's ``delay.source`` header names its ingress topic, and the tenant is
that topic's name in ``tenants`` (from the sidecar's configuration: ``--config``), else the topic
itself (spark/tenancy.py); a record without the header has no tenant (null).

Each row is written as JSON to a Kafka topic (default ``delay.accuracy``) with key
``<topic>@<minute start ms>@<tenant>`` (``<topic>@<minute start ms>`` for no tenant). In the
default ``update`` output mode a row is re-emitted whenever its window changes (a rolling table:
the last record per key wins, so the topic can be compacted); in ``append`` mode each window is
written once, when the watermark closes it. The output topic, the ingress and DLQ topics and
``__``-prefixed topics are never read, even if the pattern matches them.

Bounded runs (tests, cron): ``available_now=True`` processes what is in the topics and stops;
``run_for_seconds=N`` runs with a processing-time trigger for N seconds and stops.

Run: ``python -m spark.accuracy_stream --bootstrap-servers B --targets PATTERN`` or
``spark-submit --jars "$(python -m spark.jars --csv)" spark/accuracy_stream.py ...``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file by spark-submit: make the `spark` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

DEFAULT_OUTPUT_TOPIC = "delay.accuracy"
PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))
PERCENTILE_ACCURACY = 10_000


def lateness_table(
    delivered: DataFrame,
    *,
    window: str = "1 minute",
    watermark: str = "2 minutes",
    exclude_topics: Sequence[str] = (),
    tenants: Mapping[str, str] | None = None,
) -> DataFrame:
    """Per (window, topic, tenant) lateness aggregates over a Kafka source DataFrame (with headers);
    ``tenants``: ingress topic -> tenant name (spark/tenancy.py)."""
    from pyspark.sql import functions as F

    from spark.accuracy import H_DELIVER_AT, H_ID, header
    from spark.tenancy import H_SOURCE, source_topic, tenant_column

    d = delivered.where(~F.col("topic").isin(*exclude_topics) & ~F.col("topic").startswith("__")).select(
        "topic",
        "timestamp",
        header(H_ID).alias("id"),
        (F.expr("unix_millis(timestamp)") - header(H_DELIVER_AT).try_cast("bigint")).alias("lateness_ms"),
        tenant_column(source_topic(header(H_SOURCE)), tenants).alias("tenant"),
    )
    lat = F.col("lateness_ms")
    # a streaming aggregation cannot count distinct values; the size of the set of ids can
    duplicates = F.count("id") - F.size(F.collect_set("id"))
    return (
        d.withWatermark("timestamp", watermark)
        .groupBy(F.window("timestamp", window).alias("w"), "topic", "tenant")
        .agg(
            F.count(F.lit(1)).alias("deliveries"),
            duplicates.alias("duplicates"),
            F.sum(F.when(lat < 0, 1).otherwise(0)).alias("early"),
            F.sum(F.when(lat.isNull(), 1).otherwise(0)).alias("missing_deliver_at"),
            F.percentile_approx(lat, [p for _, p in PERCENTILES], PERCENTILE_ACCURACY).alias("pct"),
            F.max(lat).alias("max"),
            F.min(lat).alias("min"),
            F.avg(lat).alias("mean"),
        )
    )


def to_kafka_rows(table: DataFrame, *, isolation_level: str) -> DataFrame:
    """``key`` = ``<topic>@<minute ms>@<tenant>`` (no ``@<tenant>`` without one), ``value`` = the
    row as JSON, with the isolation level the delivered topics were read with."""
    from pyspark.sql import functions as F

    start = F.expr("unix_millis(w.start)")
    lateness = F.struct(
        *[F.col("pct")[i].alias(name) for i, (name, _) in enumerate(PERCENTILES)],
        F.col("max").alias("max"),
        F.col("min").alias("min"),
        F.round("mean", 3).alias("mean"),
    )
    value = F.struct(
        F.col("topic"),
        F.col("tenant"),
        start.alias("minute_ms"),
        F.date_format("w.start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("minute"),
        F.expr("unix_millis(w.end)").alias("window_end_ms"),
        F.col("deliveries"),
        F.col("duplicates"),
        F.col("early"),
        F.col("missing_deliver_at"),
        lateness.alias("lateness_ms"),
        F.lit(isolation_level).alias("isolation_level"),
        F.expr("unix_millis(current_timestamp())").alias("updated_at_ms"),
    )
    return table.select(
        F.concat_ws("@", F.col("topic"), start.cast("string"), F.col("tenant")).alias("key"),
        F.to_json(value).alias("value"),
    )


def ensure_output_topic(
    bootstrap: str, topic: str, *, partitions: int = 1, kafka_options: Mapping[str, str] | None = None
) -> bool:
    """Create the output topic (``cleanup.policy=compact,delete``: the latest row per key is kept)
    if it does not exist. Best effort: returns False when it could not be checked or created
    (then the query fails with the broker's own error if the topic is really missing)."""
    try:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
    except ImportError:
        return False
    conf: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap}
    conf.update({k.removeprefix("kafka."): v for k, v in (kafka_options or {}).items()})
    try:
        admin = AdminClient(conf)
        if topic in admin.list_topics(timeout=15).topics:
            return True
        new = NewTopic(topic, num_partitions=partitions, replication_factor=-1,
                       config={"cleanup.policy": "compact,delete"})
        for future in admin.create_topics([new]).values():
            try:
                future.result(timeout=30)
            except Exception as exc:  # created concurrently by another run
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        return True
    except Exception as exc:
        print(f"accuracy stream: could not create output topic {topic}: {exc}", file=sys.stderr)
        return False


def start_stream(
    spark: SparkSession,
    bootstrap: str,
    target_pattern: str,
    *,
    output_topic: str = DEFAULT_OUTPUT_TOPIC,
    checkpoint_dir: str | Path,
    starting_offsets: str = "latest",
    since_ms: int | None = None,
    window: str = "1 minute",
    watermark: str = "2 minutes",
    output_mode: str = "update",
    available_now: bool = False,
    trigger_interval: str = "10 seconds",
    exclude_topics: Sequence[str] = ("delay.ingress", "delay.dlq"),
    kafka_options: Mapping[str, str] | None = None,
    create_topic: bool = True,
    read_committed: bool = False,
    tenants: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Start the streaming query (the caller waits on it / stops it). ``read_committed``: read the
    delivered topics with ``isolation.level=read_committed`` (else the level of ``kafka_options``,
    else ``read_uncommitted``)."""
    from spark.accuracy import isolation_level

    level = isolation_level(kafka_options, read_committed)
    # the output producer gets the other options (TLS, SASL); isolation.level is a consumer setting
    kafka_options = {k: v for k, v in (kafka_options or {}).items() if k.removeprefix("kafka.") != "isolation.level"}
    if create_topic:
        ensure_output_topic(bootstrap, output_topic, kafka_options=kafka_options)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribePattern", target_pattern)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "false")
    )
    if since_ms is not None:
        reader = reader.option("startingTimestamp", str(since_ms)).option(
            "startingOffsetsByTimestampStrategy", "latest"
        )
    else:
        reader = reader.option("startingOffsets", starting_offsets)
    extra = {k if k.startswith("kafka.") else f"kafka.{k}": v for k, v in kafka_options.items()}
    for key, value in extra.items():
        reader = reader.option(key, value)
    reader = reader.option("kafka.isolation.level", level)
    table = lateness_table(
        reader.load(), window=window, watermark=watermark, exclude_topics=[output_topic, *exclude_topics],
        tenants=tenants,
    )
    writer = (
        to_kafka_rows(table, isolation_level=level)
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", output_topic)
        .option("checkpointLocation", str(checkpoint_dir))
        .outputMode(output_mode)
        .queryName(f"kds-accuracy-{output_topic}")
    )
    for key, value in extra.items():
        writer = writer.option(key, value)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=trigger_interval)
    return writer.start()


def run_stream(
    spark: SparkSession,
    bootstrap: str,
    target_pattern: str,
    *,
    run_for_seconds: float | None = None,
    available_now: bool = False,
    stop_grace_seconds: float = 120.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run the stream until it ends (``available_now``), for ``run_for_seconds``, or forever.

    After ``run_for_seconds`` the query is stopped between micro-batches: a batch in progress
    (and, if none has completed yet, the first one) may finish within ``stop_grace_seconds``, so
    a short run on a cold JVM still publishes its rows. Returns the last progress report of the
    query (batch id, rows in/out, watermark).
    """
    query = start_stream(spark, bootstrap, target_pattern, available_now=available_now, **kwargs)
    try:
        if available_now or run_for_seconds is None:
            query.awaitTermination()
        elif not query.awaitTermination(max(1, math.ceil(run_for_seconds))):
            _finish_batch(query, stop_grace_seconds)
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"accuracy stream failed: {query.exception()}")
    return dict(query.lastProgress or {})


def _finish_batch(query: StreamingQuery, grace_seconds: float) -> None:
    """Wait (bounded) until no trigger is running and at least one batch has completed."""
    deadline = time.monotonic() + grace_seconds
    while query.isActive and time.monotonic() < deadline:
        if query.lastProgress is not None and not query.status.get("isTriggerActive", False):
            return
        time.sleep(0.2)


def build_parser(prog: str = "accuracy_stream.py") -> argparse.ArgumentParser:
    from spark.cli import read_committed_help

    p = argparse.ArgumentParser(
        prog=prog,
        description="Rolling per-minute lateness of delivered records, written as JSON to a Kafka topic.",
    )
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                   help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--targets", required=True, metavar="PATTERN", help="delivered topics (Java regex)")
    p.add_argument("--output-topic", default=DEFAULT_OUTPUT_TOPIC, help="default delay.accuracy")
    p.add_argument("--checkpoint", default="out/accuracy-stream-checkpoint", metavar="DIR",
                   help="Structured Streaming checkpoint directory (default out/accuracy-stream-checkpoint)")
    p.add_argument("--starting-offsets", default="latest", help="earliest, latest or Spark JSON (default latest)")
    p.add_argument("--window", default="1 minute", help="window length (default '1 minute')")
    p.add_argument("--watermark", default="2 minutes", help="allowed lateness of events (default '2 minutes')")
    p.add_argument("--output-mode", choices=("update", "append"), default="update")
    p.add_argument("--trigger", default="10 seconds", help="processing-time trigger interval")
    p.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    p.add_argument("--run-for-seconds", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--read-committed", action="store_true",
                   help=read_committed_help("the delivered topics", "every output row"))
    p.add_argument("--config", default=None, metavar="FILE",
                   help="the sidecar's YAML configuration: its tenants name the ingress topics (without, a row's "
                        "tenant is the ingress topic its delay.source header names)")
    p.add_argument("--master", default=None, help="Spark master (default local[2], or spark-submit's)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.bootstrap_servers:
        parser.error("--bootstrap-servers is required (or set KAFKA_BOOTSTRAP_SERVERS)")
    if args.run_for_seconds is not None and args.run_for_seconds <= 0:
        parser.error("--run-for-seconds must be positive")
    tenants = None
    if args.config is not None:
        from spark.tenancy import tenants_from_config

        tenants = tenants_from_config(args.config)
    from spark.session import get_session

    session = get_session("kds-accuracy-stream", master=args.master)
    progress = run_stream(
        session,
        args.bootstrap_servers,
        args.targets,
        output_topic=args.output_topic,
        checkpoint_dir=args.checkpoint,
        starting_offsets=args.starting_offsets,
        window=args.window,
        watermark=args.watermark,
        output_mode=args.output_mode,
        trigger_interval=args.trigger,
        available_now=args.available_now,
        run_for_seconds=args.run_for_seconds,
        read_committed=args.read_committed,
        tenants=tenants,
    )
    print(f"accuracy stream stopped: batch {progress.get('batchId')}, "
          f"{progress.get('numInputRows')} input rows in the last batch "
          f"({'read_committed' if args.read_committed else 'read_uncommitted'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
