"""The streaming accuracy job: crafted delivered records -> per-minute JSON rows on a Kafka topic."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from spark.accuracy_stream import run_stream
from tests.spark.helpers import Rec, consume_all, create_topics, produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]

MIN = 60_000


def test_stream_writes_per_minute_rows(kafka_bootstrap: str, spark: Any, tmp_path: Path) -> None:
    u = uuid.uuid4().hex[:8]
    t1, t2, out_topic = f"accs.a.{u}", f"accs.b.{u}", f"accs.out.{u}"
    create_topics(kafka_bootstrap, [t1, t2, out_topic])
    base = (int(time.time() * 1000) // MIN) * MIN - 5 * MIN

    def dl(ts: int, lateness: int | None) -> Rec:
        headers = {"delay.id": uuid.uuid4().hex}
        if lateness is not None:
            headers["delay.deliver-at"] = str(ts - lateness)
        return Rec(ts=ts, headers=headers)

    # topic a, minute 0: lateness 10 20 30 40 -5 (one early); minute 1: 100 200; topic b, minute 0: 7
    produce(kafka_bootstrap, t1, [
        dl(base + 1000, 10), dl(base + 2000, 20), dl(base + 3000, 30), dl(base + 4000, 40),
        dl(base + 5000, -5), dl(base + MIN + 1000, 100), dl(base + MIN + 2000, 200),
        dl(base + MIN + 3000, None),  # no delay.deliver-at: counted, not in the percentiles
    ])
    produce(kafka_bootstrap, t2, [dl(base + 30_000, 7)])

    progress = run_stream(
        spark, kafka_bootstrap, rf"accs\.[ab]\.{u}",
        output_topic=out_topic, checkpoint_dir=tmp_path / "ckpt", starting_offsets="earliest",
        available_now=True,
    )
    assert progress.get("sink", {}).get("description", "").startswith("org.apache.spark.sql.kafka010")

    msgs = consume_all(kafka_bootstrap, out_topic, min_count=3)
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for m in msgs:
        row = orjson.loads(m.value())
        assert m.key().decode() == f"{row['topic']}@{row['minute_ms']}"
        latest[(row["topic"], row["minute_ms"])] = row  # the last update per key wins
    assert set(latest) == {(t1, base), (t1, base + MIN), (t2, base)}

    a0 = latest[(t1, base)]
    assert (a0["deliveries"], a0["early"], a0["missing_deliver_at"]) == (5, 1, 0)
    assert a0["lateness_ms"]["max"] == 40
    assert a0["lateness_ms"]["min"] == -5
    assert a0["lateness_ms"]["p50"] == 20
    assert a0["window_end_ms"] == base + MIN
    a1 = latest[(t1, base + MIN)]
    assert (a1["deliveries"], a1["early"], a1["missing_deliver_at"]) == (3, 0, 1)
    assert (a1["lateness_ms"]["max"], a1["lateness_ms"]["p50"]) == (200, 100)
    b0 = latest[(t2, base)]
    assert (b0["deliveries"], b0["lateness_ms"]["p99"]) == (1, 7)
    assert b0["minute"].endswith("Z")
