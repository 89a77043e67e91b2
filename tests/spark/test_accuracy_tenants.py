"""The accuracy reports broken down by tenant (spark/tenancy.py), on the real local SparkSession and
broker: the batch job over two tenants' ingress topics, and the stream job by ``delay.source``."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from spark.accuracy import run_accuracy
from spark.accuracy_stream import run_stream
from spark.cli import accuracy_main
from tests.spark.helpers import Rec, consume_all, create_topics, produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]

MIN = 60_000


def test_batch_report_per_tenant(kafka_bootstrap: str, spark: Any, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    u = uuid.uuid4().hex[:8]
    pay, search, target = f"acct.pay.{u}", f"acct.search.{u}", f"acct.out.{u}"
    create_topics(kafka_bootstrap, [pay, search, target])
    base = (int(time.time() * 1000) // MIN) * MIN - 10 * MIN

    def ing(rid: str) -> Rec:
        return Rec(ts=base, headers={"delay.id": rid, "delay.ms": "1000", "delay.target-topic": target})

    def dl(rid: str, src: str, late: int) -> Rec:
        return Rec(ts=base + 1000 + late, headers={"delay.id": rid, "delay.deliver-at": str(base + 1000),
                                                    "delay.source": f"{src}:0:0"})

    produce(kafka_bootstrap, pay, [ing("p1"), ing("p2"), ing("p3")])
    produce(kafka_bootstrap, search, [ing("s1"), ing("s2")])
    # p3 is lost; s1 comes twice (a duplicate) and late
    produce(kafka_bootstrap, target, [dl("p1", pay, 5), dl("p2", pay, 7), dl("s1", search, 300),
                                      dl("s1", search, 310), dl("s2", search, 20)])
    summary = run_accuracy(spark, kafka_bootstrap, f"{pay},{search}", rf"acct\.out\.{u}", base, base + 2 * MIN,
                           tmp_path / "one", chart=False, details=False, tenants={pay: "payments"})
    by = {r["tenant"]: r for r in summary["by_tenant"]}
    assert set(by) == {"payments", search}  # a topic the mapping does not name is its own tenant
    p, s = by["payments"], by[search]
    assert (p["sent"], p["delivered"], p["lost"], p["duplicates"], p["early"]) == (3, 2, 1, 0, 0)
    assert (s["sent"], s["delivered"], s["lost"], s["duplicates"]) == (2, 2, 0, 1)
    assert p["lateness_ms"]["max"] == 7 and s["lateness_ms"]["max"] == 310
    assert summary["totals"]["sent"] == 5

    # the CLI: the tenants (and their ingress topics) from the sidecar's configuration
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"tenants:\n  payments:\n    ingress-topic: {pay}\n  search:\n    ingress-topic: {search}\n")
    rc = accuracy_main(["--bootstrap-servers", kafka_bootstrap, "--config", str(config),
                        "--targets", rf"acct\.out\.{u}", "--since", str(base), "--until", str(base + 2 * MIN),
                        "--out", str(tmp_path / "cli"), "--no-chart", "--no-details", "--json"])
    assert rc == 0
    out = orjson.loads(capsys.readouterr().out)
    assert {r["tenant"]: r["sent"] for r in out["by_tenant"]} == {"payments": 3, "search": 2}


def test_stream_rows_per_tenant_from_delay_source(kafka_bootstrap: str, spark: Any, tmp_path: Path) -> None:
    u = uuid.uuid4().hex[:8]
    target, out_topic = f"accst.out.{u}", f"accst.res.{u}"
    create_topics(kafka_bootstrap, [target, out_topic])
    base = (int(time.time() * 1000) // MIN) * MIN - 5 * MIN

    def dl(ts: int, lateness: int, source: str | None) -> Rec:
        headers = {"delay.id": uuid.uuid4().hex, "delay.deliver-at": str(ts - lateness)}
        if source is not None:
            headers["delay.source"] = source
        return Rec(ts=ts, headers=headers)

    produce(kafka_bootstrap, target, [
        dl(base + 1000, 10, "pay.in:0:1"), dl(base + 2000, 30, "pay.in:1:7"),
        dl(base + 3000, 500, "search.in:0:3"),
        dl(base + 4000, 1, None),  # not the sidecar's: no tenant
    ])
    run_stream(spark, kafka_bootstrap, rf"accst\.out\.{u}", output_topic=out_topic,
               checkpoint_dir=tmp_path / "ckpt", starting_offsets="earliest", available_now=True,
               tenants={"pay.in": "payments"})
    latest: dict[str | None, dict[str, Any]] = {}
    for m in consume_all(kafka_bootstrap, out_topic, min_count=3):
        row = orjson.loads(m.value())
        tenant = row.get("tenant")
        assert m.key().decode() == "@".join([target, str(base), *([tenant] if tenant else [])])
        latest[tenant] = row
    assert set(latest) == {"payments", "search.in", None}
    assert (latest["payments"]["deliveries"], latest["payments"]["lateness_ms"]["max"]) == (2, 30)
    assert (latest["search.in"]["deliveries"], latest["search.in"]["lateness_ms"]["max"]) == (1, 500)
    assert latest[None]["deliveries"] == 1
