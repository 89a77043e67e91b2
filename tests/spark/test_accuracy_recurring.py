"""Recurring schedules measured by the Spark batch job: the sidecar fires schedules on the real
broker beside one-shot records; the job (real local SparkSession, real Kafka connector) counts
the one-shot records as always and the firings apart (``totals.firings``): each nominal time
once, none early, lateness against ``delay.fire-time`` (= ``delay.deliver-at``), none lost. A
firing whose ``delay.next-at`` never came is reported lost: one is written by hand to show it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from spark.accuracy import run_accuracy
from tests.integration.harness import SidecarProcess, consume_until, create_topics, producer

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_firings_are_measured_like_any_delivery(spark: Any, kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    target = f"accrec-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--ingress-partitions", "2"])
    sc.start()
    since = int(time.time() * 1000) - 1000
    try:
        p = producer(kafka_bootstrap)
        for i in range(3):
            p.produce(sc.ingress, key=b"s%d" % i, value=b"v", headers=[
                ("delay.target-topic", target.encode()), ("delay.id", b"sched-%d" % i),
                ("delay.every", b"1000"), ("delay.max-count", b"4")])
        for i in range(10):
            p.produce(sc.ingress, key=b"o%d" % i, value=b"v", headers=[
                ("delay.target-topic", target.encode()), ("delay.ms", b"500")])
        # a schedule that will not fire within the test (it starts in an hour), and a forged
        # firing of it naming a next firing that never comes: the job must report it lost
        ghost_at = since + 3_600_000
        p.produce(sc.ingress, key=b"g", value=b"v", headers=[
            ("delay.target-topic", target.encode()), ("delay.id", b"ghost"), ("delay.every", b"1000"),
            ("delay.start", b"%d" % ghost_at)])
        assert p.flush(30) == 0
        assert len(consume_until(kafka_bootstrap, [target], want=3 * 4 + 10, timeout_s=60, settle_s=1)) == 22
        forged_fire = int(time.time() * 1000) - 2000
        p.produce(target, key=b"g", value=b"v", headers=[
            ("delay.id", b"ghost"), ("delay.deliver-at", b"%d" % forged_fire), ("delay.fire-time", b"%d" % forged_fire),
            ("delay.fire-seq", b"1"), ("delay.next-at", b"%d" % (forged_fire + 1000))])
        assert p.flush(30) == 0
    finally:
        sc.stop_quietly()
    until = int(time.time() * 1000)
    summary = run_accuracy(spark, kafka_bootstrap, sc.ingress, target, since, until, tmp_path / "out",
                           exclude_topics=(sc.dlq,), chart=False, details=False)
    t = summary["totals"]
    print(f"\nspark accuracy with firings: {t}")
    assert (t["sent"], t["delivered"], t["lost"], t["early"], t["duplicates"]) == (10, 10, 0, 0, 0)
    assert t["ignored"]["recurring"] == 4 and t["unmatched"] == 0
    f = t["firings"]
    assert (f["fired"], f["duplicates"], f["early"], f["missed"]) == (13, 0, 0, 0)  # 3 x 4, and the forged one
    assert f["lost"] == 1  # the forged firing's next one
    assert f["lateness_ms"]["min"] >= 0 and f["lateness_ms"]["p50"] is not None
