"""End to end: the sidecar delivers N records on the real broker; the Spark batch job reads the
ingress and the delivered topics through the Kafka connector and reports lost = 0, early = 0, and
figures that agree with the sidecar's own Prometheus metrics."""

from __future__ import annotations

import random
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark.accuracy import run_accuracy
from tests.integration.harness import SidecarProcess, consume_until, create_topics, free_port, producer

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _synced(port: int, n: int, timeout_s: float = 30) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The metrics once the sidecar's periodic sync (once a second) has counted all ``n``
    deliveries and their lateness (or as they are at the timeout: the assertions then say what is
    missing), instead of sleeping a sync period."""
    tenant = (("tenant", "default"),)
    keys = [("delay_sidecar_delivered_records_total", tenant),
            ("delay_sidecar_delivery_lateness_seconds_count", tenant)]
    deadline = time.monotonic() + timeout_s
    metrics = _metrics(port)
    while any(metrics.get(k) != n for k in keys) and time.monotonic() < deadline:
        time.sleep(0.1)
        metrics = _metrics(port)
    return metrics


def test_sidecar_delivery_measured_by_spark(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, unique: str
) -> None:
    targets = [f"acc-a-{unique}", f"acc-b-{unique}"]
    create_topics(kafka_bootstrap, targets)
    port = free_port()
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--scheduler", "levels", "--ingress-partitions", "2", "--http-port", str(port)])
    sc.start()
    try:
        since = int(time.time() * 1000) - 1000
        n = 600
        rng = random.Random(3)
        p = producer(kafka_bootstrap)
        for i in range(n):
            level = str(rng.randint(1, 2)).encode()
            headers = [("delay.target-topic", targets[i % 2].encode()), ("delay.level", level)]
            p.produce(sc.ingress, key=str(i).encode(), value=b"v", headers=headers)
        assert p.flush(30) == 0
        assert len(consume_until(kafka_bootstrap, targets, want=n, timeout_s=60)) == n
        metrics = _synced(port, n)
    finally:
        sc.stop_quietly()
    until = int(time.time() * 1000)
    summary = run_accuracy(spark, kafka_bootstrap, sc.ingress, f"acc-.-{unique}", since, until, tmp_path / "out",
                           exclude_topics=(sc.dlq,))
    t = summary["totals"]
    print(f"\nspark accuracy: {t}")
    assert (t["sent"], t["delivered"], t["lost"], t["early"], t["duplicates"]) == (n, n, 0, 0, 0)
    tenant = (("tenant", "default"),)  # the one implicit tenant
    assert metrics[("delay_sidecar_delivered_records_total", tenant)] == n
    assert metrics[("delay_sidecar_early_deliveries_total", ())] == 0
    # Consistency with the sidecar's lateness histogram: the job's p99 and max fall in buckets that
    # the sidecar's own histogram says hold >= 99 % and 100 % of its observations.
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in metrics.items()
                     if k[0] == "delay_sidecar_delivery_lateness_seconds_bucket")
    count = metrics[("delay_sidecar_delivery_lateness_seconds_count", tenant)]
    assert count == n
    lat = t["lateness_ms"]
    le_p99 = next(le for le, c in buckets if c >= 0.99 * count)
    le_max = next(le for le, c in buckets if c >= count)
    assert lat["p99"] / 1000 <= le_p99 and lat["max"] / 1000 <= le_max
    assert {row["topic"] for row in summary["by_topic"]} == set(targets)
    assert (tmp_path / "out" / "summary.json").exists() and (tmp_path / "out" / "chart.png").exists()
