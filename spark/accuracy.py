"""Batch accuracy job: how on time, complete and duplicate-free was delayed delivery?

Reads, through Spark's Kafka connector with ``includeHeaders=true``:

* the **ingress topic** (what producers asked for) from ``since`` to the end of the topic — or,
  with ``history_topic`` (``--history-topic``), the sidecar's **history topic** instead: what it
  accepted, cancelled and dead-lettered, with the committed due times and no payloads
  (``history_frame``) — and
* the **delivered topics** (a subscribe pattern, e.g. ``orders\\..*``) from ``since`` to the end,

joins them by ``delay.id`` and reports per target topic, per level and per minute, and per tenant.

Method (the wire contract of docs/design.md 1 is what is measured here):

* **ingress id**: the ``delay.id`` header, else ``<topic>:<partition>:<offset>`` of the ingress
  record (the sidecar's default). Delivered records always carry ``delay.id``.
* **sent**: ingress records with a timestamp in ``[since, until)`` (or, with an explicit offset
  range, the records in that range) whose ``delay.target-topic`` matches the target pattern.
  Not counted (reported under ``ignored``): cancel commands (records carrying ``delay.cancel``),
  records whose id a cancel command names, records the sidecar dead-letters (no target, a
  non-integer or negative delay, more than one of ``delay.ms`` / ``delay.deliver-at`` /
  ``delay.level``, an unknown level, an empty or over-long id) and a second pending record with
  an id already seen (the sidecar drops it as a duplicate).
* **due time** of an ingress record: ``delay.deliver-at``; else record timestamp + ``delay.ms``;
  else timestamp + the level's duration (default table ``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m
  9m 10m 20m 30m 1h 2h``, configurable); else the timestamp (due now).
* **lateness** of a delivered record = its Kafka record timestamp - its ``delay.deliver-at``
  header, in ms (the ingress due time if the header is missing). Every delivered copy counts,
  duplicates included: that is what a consumer observes. **early** = lateness < 0, must be 0.
* **delivered**: sent ids with at least one delivered copy; **duplicates**: the extra copies
  (copies - 1 per id); **lost**: sent ids due before ``until - grace`` with no delivered copy;
  **pending**: sent ids with no copy yet that are due later than that.
* **recurring schedules** (``delay.cron`` / ``delay.every``): not in ``sent`` (reported under
  ``ignored.recurring``); their firings are measured from the delivered topics in
  ``totals.firings`` (``firings_stats``: fired, duplicates on (id, fire-time), early, lateness
  against ``delay.fire-time``, missed as the sidecar reported them, and lost: a firing's
  ``delay.next-at`` that never came).
* **unmatched**: delivered records (timestamp >= ``since``) whose id matches no ingress record
  read — typically records sent before ``since``; a hint to widen the range.
* **minute**: the due minute of the ingress record (UTC), so a record, its copies and its loss
  all fall in the same row, and ``sent = delivered + lost + pending`` holds in every row.
* **tenant** (``by_tenant``): a deployment with tenants has one ingress topic per tenant; the
  job reads them all (``ingress_topic``: a comma-separated list) and a sent record's tenant is
  its ingress topic's, named by ``tenants`` (ingress topic -> tenant, from the sidecar's
  configuration), else the topic itself (spark/tenancy.py).
* percentiles are ``percentile_approx`` (nearest rank; exact while a group holds fewer values than
  its accuracy, 10 000).
* **isolation level** (``isolation_level`` in the summary): every topic is read with the Kafka
  consumer's ``isolation.level``, by default ``read_uncommitted`` (what Spark's connector reads
  with anyway: it sets none, so the Kafka Java client's default applies): records of aborted and
  still-open transactions are read and counted. With ``read_committed`` (``--read-committed``)
  aborted records are skipped and each partition is read up to its last stable offset, which is
  what a ``read_committed`` consumer of the delivered topics sees; an exactly-once claim
  (0 lost, 0 duplicates, 0 early) needs a report made that way.

Outputs in ``out_dir``: ``summary.json`` (orjson: totals, per topic, per topic and level, per
topic, level and minute), ``details.parquet`` (one row per sent record and delivered copy, with
its status), ``chart.png`` (lateness histogram and per-minute lateness over time, drawn by
spark/chart.py from numbers aggregated here).

Run: ``python -m spark.accuracy ...``, ``delay-sidecar accuracy ...`` or
``spark-submit --jars "$(python -m spark.jars --csv)" spark/accuracy.py ...`` (docs/spark.md).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file by spark-submit: make the `spark` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from spark.chart import ChartData

# The wire contract's header names (docs/design.md 1) (kept literal so this file runs on a driver with only pyspark).
H_ID = "delay.id"
H_CANCEL = "delay.cancel"
H_TARGET = "delay.target-topic"
H_DELAY_MS = "delay.ms"
H_DELIVER_AT = "delay.deliver-at"
H_LEVEL = "delay.level"
H_CRON = "delay.cron"
H_EVERY = "delay.every"
H_FIRE_TIME = "delay.fire-time"
H_NEXT_AT = "delay.next-at"
H_MISSED = "delay.missed"
MAX_ID_BYTES = 255

DEFAULT_LEVELS_MS: tuple[int, ...] = tuple(
    s * 1000
    for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))
PERCENTILE_ACCURACY = 10_000
MINUTE_MS = 60_000
COUNTS = ("sent", "delivered", "lost", "pending", "duplicates", "early")

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
# Spark's connector passes no isolation.level of its own (its offset lookups fall back to the
# Kafka Java client's default too), so without a setting the jobs read read_uncommitted.
DEFAULT_ISOLATION_LEVEL = READ_UNCOMMITTED
_ISOLATION_KEYS = ("isolation.level", "kafka.isolation.level")


def header(name: str, column: str = "headers") -> Column:
    """The last value of Kafka header ``name`` as a string (null when absent)."""
    from pyspark.sql import functions as F

    return F.expr(f"CAST(try_element_at(filter({column}, h -> h.key = '{name}'), -1).value AS STRING)")


def try_long(col: Column) -> Column:
    """A decimal integer header as bigint; null when it is not one."""
    return col.try_cast("bigint")


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def isolation_level(kafka_options: Mapping[str, str] | None, read_committed: bool) -> str:
    """The isolation level a job reads with: ``read_committed`` when asked, else the
    ``isolation.level`` among the Kafka options, else the Kafka Java client's default
    (``read_uncommitted``). ValueError for an unknown level, or for ``read_committed`` asked while
    the options say ``read_uncommitted``."""
    given = {k: v for k, v in (kafka_options or {}).items() if k in _ISOLATION_KEYS}
    for key, value in given.items():
        if value not in ISOLATION_LEVELS:
            raise ValueError(f"{key}={value!r} is not an isolation level; expected {' or '.join(ISOLATION_LEVELS)}")
    if len(set(given.values())) > 1:
        raise ValueError(f"isolation.level is given twice with different values: {given}")
    if read_committed and READ_UNCOMMITTED in given.values():
        raise ValueError(f"read_committed was asked for, but the Kafka options say isolation.level={READ_UNCOMMITTED}")
    if read_committed:
        return READ_COMMITTED
    return next(iter(given.values()), DEFAULT_ISOLATION_LEVEL)


def with_isolation_level(kafka_options: Mapping[str, str] | None, level: str) -> dict[str, str]:
    """The Kafka options with ``isolation.level`` set to ``level`` (replacing any given)."""
    options = {k: v for k, v in (kafka_options or {}).items() if k not in _ISOLATION_KEYS}
    options["isolation.level"] = level
    return options


def read_kafka(
    spark: SparkSession,
    bootstrap: str,
    *,
    subscribe: str | None = None,
    pattern: str | None = None,
    since_ms: int | None = None,
    starting_offsets: str | None = None,
    ending_offsets: str | None = None,
    kafka_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """A batch read of Kafka with headers: from an offset spec or the first offset at ``since_ms``."""
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "false")
    )
    reader = reader.option("subscribe", subscribe) if subscribe else reader.option("subscribePattern", pattern)
    if starting_offsets:
        reader = reader.option("startingOffsets", starting_offsets)
    elif since_ms is not None:
        # earliest offset whose timestamp >= since; a partition with nothing that new reads nothing
        reader = reader.option("startingTimestamp", str(since_ms)).option(
            "startingOffsetsByTimestampStrategy", "latest"
        )
    if ending_offsets:
        reader = reader.option("endingOffsets", ending_offsets)
    for key, value in (kafka_options or {}).items():
        reader = reader.option(key if key.startswith("kafka.") else f"kafka.{key}", value)
    return reader.load()


def ingress_frame(
    raw: DataFrame, levels_ms: Sequence[int], since_ms: int, until_ms: int, target_pattern: str,
    *, offset_range: bool = False,
) -> DataFrame:
    """Ingress records with their id, due time and classification flags."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    levels = F.array(*[F.lit(int(v)).cast("bigint") for v in levels_ms])
    df = raw.select(
        F.col("topic").alias("ingress_topic"),
        F.col("partition").alias("ingress_partition"),
        F.col("offset").alias("ingress_offset"),
        F.expr("unix_millis(timestamp)").alias("sent_ms"),
        header(H_ID).alias("h_id"),
        header(H_CANCEL).alias("cancel_of"),
        header(H_TARGET).alias("topic"),
        header(H_LEVEL).alias("h_level"),
        header(H_DELAY_MS).alias("h_ms"),
        header(H_DELIVER_AT).alias("h_at"),
        (header(H_CRON).isNotNull() | header(H_EVERY).isNotNull()).alias("is_recurring"),
    )
    level = try_long(F.col("h_level"))
    delay_ms = try_long(F.col("h_ms"))
    deliver_at = try_long(F.col("h_at"))
    n_delays = sum(F.col(c).isNotNull().cast("int") for c in ("h_level", "h_ms", "h_at"))
    valid = (
        F.col("topic").isNotNull()
        & (F.length("topic") > 0)
        & (F.col("h_id").isNull() | ((F.octet_length("h_id") > 0) & (F.octet_length("h_id") <= MAX_ID_BYTES)))
        & (n_delays <= 1)
        & (F.col("h_ms").isNull() | (delay_ms.isNotNull() & (delay_ms >= 0)))
        & (F.col("h_at").isNull() | deliver_at.isNotNull())
        & (F.col("h_level").isNull() | (level.isNotNull() & level.between(1, len(levels_ms))))
    )
    due = (
        F.when(deliver_at.isNotNull(), deliver_at)
        .when(delay_ms.isNotNull(), F.col("sent_ms") + delay_ms)
        .when(level.between(1, len(levels_ms)), F.col("sent_ms") + F.try_element_at(levels, level.cast("int")))
        .otherwise(F.col("sent_ms"))
    )
    in_range = F.lit(True) if offset_range else F.col("sent_ms").between(since_ms, until_ms - 1)
    df = df.select(
        "*",
        F.coalesce(
            F.col("h_id"), F.concat_ws(":", "ingress_topic", "ingress_partition", "ingress_offset")
        ).alias("id"),
        F.col("cancel_of").isNotNull().alias("is_command"),
        valid.alias("is_valid"),
        in_range.alias("in_range"),
        F.coalesce(F.col("topic").rlike(f"^(?:{target_pattern})$"), F.lit(False)).alias("is_target"),
        level.cast("int").alias("level"),
        due.alias("due_ms"),
    )
    cancelled = df.where("is_command").select(F.col("cancel_of").alias("id")).distinct()
    cancelled = cancelled.withColumn("is_cancelled", F.lit(True))
    df = df.join(cancelled, on="id", how="left").fillna({"is_cancelled": False})
    # the first valid record of an id in the range is the one the sidecar keeps; candidates first
    candidate = F.col("in_range") & ~F.col("is_command") & F.col("is_valid")
    order = Window.partitionBy("id").orderBy(
        F.when(candidate, 0).otherwise(1), "sent_ms", "ingress_partition", "ingress_offset"
    )
    df = df.withColumn("id_rank", F.when(candidate, F.row_number().over(order)))
    return df


HISTORY_SCHEMA = (
    "v INT, event STRING, id STRING, at_ms BIGINT, enqueued_ms BIGINT, due_ms BIGINT, target STRING, "
    "target_partition INT, level INT, source STRING, reason STRING"
)


def history_frame(
    raw: DataFrame, since_ms: int, until_ms: int, target_pattern: str, *, offset_range: bool = False,
) -> DataFrame:
    """``ingress_frame``'s columns from the sidecar's history topic (sidecar/engine/history.py,
    format ``v`` 1) instead of the ingress topic: no payloads are read, and the due time is the
    committed one the sidecar wrote. One row per schedule the sidecar saw: an ``accepted`` event
    (replays of the same ingress record, after a crash, collapse into one), a ``dead-lettered``
    event with no due time (bad input: ``invalid``), or a ``cancelled`` event of a record that
    was never accepted (its cancel came first). ``is_cancelled``: the id has a ``cancelled``
    event (a cancel that came too late has none: that record counts as sent). There are no
    command rows (``ignored.commands`` is 0), and ``level`` is the scheduler's level (null for
    0: the wheel, or due now), which the levels scheduler also assigns to ``delay.ms`` requests."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ev = raw.select(F.from_json(F.col("value").cast("string"), HISTORY_SCHEMA).alias("h")).select("h.*")
    ev = ev.where((F.col("v") == 1) & F.col("id").isNotNull())
    src = r"^(.*):([0-9]+):([0-9]+)$"
    accepted_ids = ev.where(F.col("event") == "accepted").select("id").distinct()
    cancelled_ids = ev.where(F.col("event") == "cancelled").select("id").distinct()
    rows = ev.where(
        (F.col("event") == "accepted")
        | ((F.col("event") == "dead-lettered") & F.col("due_ms").isNull())
        | (F.col("event") == "cancelled")
    )
    # a cancelled event is a row only for a record never accepted (cancelled before it arrived)
    rows = rows.join(accepted_ids.withColumn("was_accepted", F.lit(True)), on="id", how="left").where(
        (F.col("event") != "cancelled") | F.col("was_accepted").isNull()
    )
    rows = rows.dropDuplicates(["id", "event", "source"])  # the same change written again after a replay
    df = rows.select(
        "id",
        F.regexp_extract("source", src, 1).alias("ingress_topic"),
        F.regexp_extract("source", src, 2).cast("int").alias("ingress_partition"),
        F.regexp_extract("source", src, 3).cast("bigint").alias("ingress_offset"),
        F.col("enqueued_ms").alias("sent_ms"),
        F.col("target").alias("topic"),
        F.when(F.col("level") > 0, F.col("level")).alias("level"),
        F.coalesce(F.col("due_ms"), F.col("enqueued_ms")).alias("due_ms"),
        F.lit(False).alias("is_command"),
        F.lit(False).alias("is_recurring"),  # (the history does not say; its firings are measured apart)
        (F.col("event") != "dead-lettered").alias("is_valid"),
        (F.lit(True) if offset_range else F.col("enqueued_ms").between(since_ms, until_ms - 1)).alias("in_range"),
        F.coalesce(F.col("target").rlike(f"^(?:{target_pattern})$"), F.lit(False)).alias("is_target"),
    )
    df = df.join(cancelled_ids.withColumn("is_cancelled", F.lit(True)), on="id", how="left").fillna(
        {"is_cancelled": False})
    candidate = F.col("in_range") & F.col("is_valid")
    order = Window.partitionBy("id").orderBy(
        F.when(candidate, 0).otherwise(1), "sent_ms", "ingress_partition", "ingress_offset"
    )
    return df.withColumn("id_rank", F.when(candidate, F.row_number().over(order)))


def delivered_frame(raw: DataFrame, since_ms: int, exclude_topics: Sequence[str]) -> DataFrame:
    from pyspark.sql import functions as F

    return raw.where(~F.col("topic").isin(*exclude_topics)).select(
        F.col("topic").alias("delivered_topic"),
        F.col("partition").alias("delivered_partition"),
        F.col("offset").alias("delivered_offset"),
        F.expr("unix_millis(timestamp)").alias("delivered_ms"),
        header(H_ID).alias("delivered_id"),
        try_long(header(H_DELIVER_AT)).alias("deliver_at_ms"),
        try_long(header(H_FIRE_TIME)).alias("fire_ms"),
        try_long(header(H_NEXT_AT)).alias("next_at_ms"),
        try_long(header(H_MISSED)).alias("missed"),
    ).where(F.col("delivered_ms") >= since_ms)


def firings_stats(fired: DataFrame, cancelled_ids: DataFrame, until_ms: int, grace_ms: int) -> dict[str, Any]:
    """Recurring schedules' firings (delivered records with ``delay.fire-time``), measured from
    the delivered topics alone: each firing names its nominal time and the next one's, so

    * **fired**: distinct (``delay.id``, ``delay.fire-time``); **duplicates**: the extra copies;
    * **lateness** = timestamp - ``delay.fire-time`` (= ``delay.deliver-at``); **early** < 0;
    * **missed**: the nominal times the sidecar reported as misfires (``delay.missed``: a firing
      after downtime stands for them);
    * **lost**: firings whose ``delay.next-at`` is due before ``until - grace`` while no firing of
      that schedule at or after it arrived (a cancelled schedule excepted: its last firing names a
      next one that never comes).
    """
    from pyspark.sql import functions as F

    lat = F.col("delivered_ms") - F.col("fire_ms")
    agg = fired.agg(
        F.count(F.lit(1)).alias("copies"),
        F.countDistinct("delivered_id", "fire_ms").alias("fired"),
        F.sum(F.when(lat < 0, 1).otherwise(0)).alias("early"),
        F.percentile_approx(lat, [p for _, p in PERCENTILES], PERCENTILE_ACCURACY).alias("pct"),
        F.max(lat).alias("max"), F.min(lat).alias("min"), F.avg(lat).alias("mean"),
    ).collect()[0]
    missed = fired.dropDuplicates(["delivered_id", "fire_ms"]).agg(F.sum("missed").alias("m")).collect()[0]["m"]
    last = fired.groupBy("delivered_id").agg(F.max("fire_ms").alias("last_ms"))
    expected = (
        fired.where(F.col("next_at_ms").isNotNull() & (F.col("next_at_ms") < until_ms - grace_ms))
        .select("delivered_id", "next_at_ms").distinct()
        .join(last, on="delivered_id")
        .where(F.col("last_ms") < F.col("next_at_ms"))
        .join(cancelled_ids, on="delivered_id", how="left_anti")
    )
    copies, distinct = int(agg["copies"] or 0), int(agg["fired"] or 0)
    return {"fired": distinct, "duplicates": copies - distinct, "early": int(agg["early"] or 0),
            "missed": int(missed or 0), "lost": expected.count(), "lateness_ms": _lateness_dict(agg)}


def _stats_columns() -> list[Column]:
    from pyspark.sql import functions as F

    def count(cond: Column) -> Column:
        return F.sum(F.when(cond, 1).otherwise(0))

    status = F.col("status")
    lat = F.col("lateness_ms")
    return [
        count(status.isin("delivered", "lost", "pending")).alias("sent"),
        count(status == "delivered").alias("delivered"),
        count(status == "lost").alias("lost"),
        count(status == "pending").alias("pending"),
        count(status == "duplicate").alias("duplicates"),
        count(lat < 0).alias("early"),
        F.percentile_approx(lat, [p for _, p in PERCENTILES], PERCENTILE_ACCURACY).alias("pct"),
        F.max(lat).alias("max"),
        F.min(lat).alias("min"),
        F.avg(lat).alias("mean"),
    ]


def _lateness_dict(row: Any) -> dict[str, Any]:
    """The lateness figures of an aggregation row with ``pct``, ``max``, ``min`` and ``mean``."""
    pct = row["pct"] or [None] * len(PERCENTILES)
    lateness: dict[str, Any] = {
        name: (int(v) if v is not None else None) for (name, _), v in zip(PERCENTILES, pct, strict=True)
    }
    lateness["max"] = row["max"]
    lateness["min"] = row["min"]
    lateness["mean"] = round(row["mean"], 3) if row["mean"] is not None else None
    return lateness


def _stats_dict(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = {k: int(row[k] or 0) for k in COUNTS}
    out["lateness_ms"] = _lateness_dict(row)
    return out


def run_accuracy(
    spark: SparkSession,
    bootstrap: str,
    ingress_topic: str,
    target_pattern: str,
    since_ms: int,
    until_ms: int,
    out_dir: str | Path,
    *,
    levels_ms: Sequence[int] = DEFAULT_LEVELS_MS,
    grace_ms: int = 0,
    ingress_starting_offsets: str | None = None,
    ingress_ending_offsets: str | None = None,
    exclude_topics: Sequence[str] = ("delay.dlq", "delay.accuracy"),
    kafka_options: Mapping[str, str] | None = None,
    chart: bool = True,
    details: bool = True,
    history_topic: str | None = None,
    read_committed: bool = False,
    tenants: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run the batch job (see the module docstring) and return the summary (also written as JSON).

    ``read_committed``: read every topic with ``isolation.level=read_committed`` (else the level
    of ``kafka_options``, else ``read_uncommitted``); the summary's ``isolation_level`` says which.
    ``ingress_topic``: one topic or several, comma-separated (tenants); ``tenants``: ingress topic
    -> tenant name (``by_tenant``; a topic it does not name is its own tenant).
    """
    import orjson
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark.tenancy import tenant_column

    if until_ms <= since_ms:
        raise ValueError(f"until ({until_ms}) must be after since ({since_ms})")
    level = isolation_level(kafka_options, read_committed)
    kafka_options = with_isolation_level(kafka_options, level)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    offset_range = bool(ingress_starting_offsets or ingress_ending_offsets)

    raw_ingress = read_kafka(
        spark, bootstrap, subscribe=history_topic or ingress_topic, since_ms=since_ms,
        starting_offsets=ingress_starting_offsets, ending_offsets=ingress_ending_offsets,
        kafka_options=kafka_options,
    )
    if history_topic is not None:  # what the sidecar recorded, no payloads (history_frame)
        ing = history_frame(raw_ingress, since_ms, until_ms, target_pattern, offset_range=offset_range)
    else:
        ing = ingress_frame(raw_ingress, levels_ms, since_ms, until_ms, target_pattern, offset_range=offset_range)
    ing = ing.persist(StorageLevel.MEMORY_AND_DISK)

    raw_delivered = read_kafka(spark, bootstrap, pattern=target_pattern, since_ms=since_ms, kafka_options=kafka_options)
    ingress_topics = [t.strip() for t in ingress_topic.split(",") if t.strip()]
    dl = delivered_frame(raw_delivered, since_ms, [*ingress_topics, *exclude_topics, *filter(None, [history_topic])])
    dl = dl.persist(StorageLevel.MEMORY_AND_DISK)  # joined, unmatched and details read it

    # a recurring schedule's firings are measured apart (firings_stats), one-shot records here
    firings = firings_stats(
        dl.where(F.col("fire_ms").isNotNull()),
        ing.where("is_command").select(F.col("cancel_of").alias("delivered_id")).distinct()
        if history_topic is None else ing.where("is_cancelled").select(F.col("id").alias("delivered_id")).distinct(),
        until_ms, grace_ms,
    )
    dl_all, dl = dl, dl.where(F.col("fire_ms").isNull())
    sent = ing.where(
        F.col("in_range") & ~F.col("is_command") & F.col("is_valid") & ~F.col("is_cancelled")
        & F.col("is_target") & (F.col("id_rank") == 1) & ~F.col("is_recurring")
    ).select("id", "topic", "level", "ingress_topic", "ingress_partition", "ingress_offset", "sent_ms", "due_ms",
             tenant_column(F.col("ingress_topic"), tenants).alias("tenant"))

    from pyspark.sql import Window

    joined = sent.join(dl, sent["id"] == dl["delivered_id"], "left").drop("delivered_id")
    copy_order = Window.partitionBy("id").orderBy("delivered_ms", "delivered_partition", "delivered_offset")
    has_copy = F.col("delivered_ms").isNotNull()
    joined = joined.withColumn("copy", F.when(has_copy, F.row_number().over(copy_order)))
    lateness = F.col("delivered_ms") - F.coalesce(F.col("deliver_at_ms"), F.col("due_ms"))
    status = (
        F.when(~has_copy & (F.col("due_ms") < until_ms - grace_ms), "lost")
        .when(~has_copy, "pending")
        .when(F.col("copy") == 1, "delivered")
        .otherwise("duplicate")
    )
    joined = joined.select(
        "*",
        F.when(has_copy, lateness).alias("lateness_ms"),
        status.alias("status"),
        (F.floor(F.col("due_ms") / MINUTE_MS) * MINUTE_MS).cast("bigint").alias("minute_ms"),
    ).persist(StorageLevel.MEMORY_AND_DISK)

    # -- per topic / level / minute, with rollups (one aggregation) -----------------------------
    rows = (
        joined.rollup("topic", "level", "minute_ms")
        .agg(F.grouping_id().alias("gid"), *_stats_columns())
        .collect()
    )
    totals: dict[str, Any] = {k: 0 for k in COUNTS}
    totals["lateness_ms"] = {name: None for name, _ in PERCENTILES} | {"max": None, "min": None, "mean": None}
    by_topic: list[dict[str, Any]] = []
    by_level: list[dict[str, Any]] = []
    by_minute: list[dict[str, Any]] = []
    for row in rows:
        stats = _stats_dict(row)
        gid = row["gid"]
        if gid == 7:
            totals = stats
        elif gid == 3:
            by_topic.append({"topic": row["topic"], **stats})
        elif gid == 1:
            by_level.append({"topic": row["topic"], "level": row["level"], **stats})
        elif gid == 0:
            minute = row["minute_ms"]
            by_minute.append({"topic": row["topic"], "level": row["level"], "minute_ms": minute,
                              "minute": iso(minute), **stats})

    def level_key(level: int | None) -> int:
        return -1 if level is None else level

    by_topic.sort(key=lambda r: r["topic"])
    by_tenant = sorted(({"tenant": row["tenant"], **_stats_dict(row)}
                        for row in joined.groupBy("tenant").agg(*_stats_columns()).collect()),
                       key=lambda r: r["tenant"])
    by_level.sort(key=lambda r: (r["topic"], level_key(r["level"])))
    by_minute.sort(key=lambda r: (r["topic"], level_key(r["level"]), r["minute_ms"]))

    # -- what was not counted, and deliveries we cannot attribute --------------------------------
    in_window = ing.where("in_range")
    ign = in_window.agg(
        F.sum(F.col("is_command").cast("int")).alias("commands"),
        F.sum((~F.col("is_command") & ~F.col("is_valid")).cast("int")).alias("invalid"),
        F.sum((~F.col("is_command") & F.col("is_valid") & F.col("is_cancelled")).cast("int")).alias("cancelled"),
        F.sum((~F.col("is_command") & F.col("is_valid") & (F.col("id_rank") > 1)).cast("int")).alias("duplicate_ids"),
        F.sum((~F.col("is_command") & F.col("is_valid") & ~F.col("is_target")).cast("int")).alias("other_targets"),
        F.sum((~F.col("is_command") & F.col("is_recurring")).cast("int")).alias("recurring"),
    ).collect()[0]
    ignored = {k: int(ign[k] or 0)
               for k in ("commands", "cancelled", "invalid", "duplicate_ids", "other_targets", "recurring")}
    known_ids = ing.where(~F.col("is_command")).select(F.col("id").alias("delivered_id")).distinct()
    unmatched_df = dl.join(known_ids, on="delivered_id", how="left_anti")
    unmatched = unmatched_df.count()
    totals["unmatched"] = unmatched
    totals["ignored"] = ignored
    totals["firings"] = firings

    outputs: dict[str, str] = {}
    if details:
        details_path = out / "details.parquet"
        detail_cols = [
            "id", "topic", "level", "status", "minute_ms", "tenant", "ingress_topic", "ingress_partition",
            "ingress_offset", "sent_ms", "due_ms", "delivered_topic", "delivered_partition",
            "delivered_offset", "delivered_ms", "deliver_at_ms", "lateness_ms", "copy",
        ]
        unmatched_rows = unmatched_df.select(
            F.col("delivered_id").alias("id"),
            F.col("delivered_topic").alias("topic"),
            F.lit("unmatched").alias("status"),
            "delivered_topic", "delivered_partition", "delivered_offset", "delivered_ms", "deliver_at_ms",
            (F.col("delivered_ms") - F.col("deliver_at_ms")).alias("lateness_ms"),
        )
        (
            joined.select(*detail_cols)
            .unionByName(unmatched_rows, allowMissingColumns=True)
            .write.mode("overwrite")
            .parquet(str(details_path))
        )
        outputs["details"] = str(details_path)

    if chart:
        chart_path = out / "chart.png"
        from spark.chart import write_chart

        write_chart(chart_data(joined, totals, title=f"{ingress_topic} -> {target_pattern}"), chart_path)
        outputs["chart"] = str(chart_path)

    joined.unpersist()
    dl_all.unpersist()
    ing.unpersist()

    summary: dict[str, Any] = {
        "ingress_topic": ingress_topic,
        "source": {"history": history_topic} if history_topic else {"ingress": ingress_topic},
        "targets": target_pattern,
        "isolation_level": level,
        "range": {
            "since_ms": since_ms, "until_ms": until_ms, "since": iso(since_ms), "until": iso(until_ms),
            "ingress_starting_offsets": ingress_starting_offsets,
            "ingress_ending_offsets": ingress_ending_offsets,
        },
        "levels_ms": list(levels_ms),
        "grace_ms": grace_ms,
        "generated_at": iso(int(datetime.now(tz=UTC).timestamp() * 1000)),
        "totals": totals,
        "by_topic": by_topic,
        "by_tenant": by_tenant,
        "by_topic_level": by_level,
        "by_minute": by_minute,
    }
    summary_path = out / "summary.json"
    outputs["summary"] = str(summary_path)
    summary["outputs"] = outputs
    summary_path.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return summary


def chart_data(joined: DataFrame, totals: dict[str, Any], *, title: str) -> ChartData:
    """The chart's numbers (spark/chart.py): histogram bins with an edge at 0, per-minute lateness."""
    from pyspark.sql import functions as F

    from spark.chart import ChartData, MinuteRow, bin_width

    lat = totals["lateness_ms"]
    counts = {k: int(totals[k]) for k in ("sent", "delivered", "lost", "duplicates", "early")}
    if lat["min"] is None or lat["max"] is None:
        return ChartData(title=title, counts=counts, lateness=lat)
    width = bin_width(int(lat["min"]), int(lat["max"]))
    copies = joined.where(F.col("lateness_ms").isNotNull())
    # bin k = [k * width, (k + 1) * width): 0 is always an edge, so no bin mixes early and on time
    bins = copies.groupBy(F.floor(F.col("lateness_ms") / width).alias("bin")).count().collect()
    per_minute = (
        copies.groupBy("minute_ms")
        .agg(
            F.percentile_approx("lateness_ms", [0.5, 0.99], PERCENTILE_ACCURACY).alias("pct"),
            F.max("lateness_ms").alias("max"),
        )
        .orderBy("minute_ms")
        .collect()
    )
    return ChartData(
        title=title,
        counts=counts,
        lateness=lat,
        bin_width=width,
        bins={int(r["bin"]): int(r["count"]) for r in bins},
        minutes=[
            MinuteRow(int(r["minute_ms"]), float(r["pct"][0]), float(r["pct"][1]), float(r["max"]))
            for r in per_minute
        ],
    )


def main(argv: list[str] | None = None) -> int:
    """``spark-submit spark/accuracy.py --bootstrap-servers B --since T --until T --out DIR``."""
    from spark.cli import accuracy_main

    return accuracy_main(argv, prog="accuracy.py")


if __name__ == "__main__":
    raise SystemExit(main())
