"""Both accuracy jobs with ``--read-committed``: records written in an aborted Kafka transaction
must not count, as a ``read_committed`` consumer never sees them; without the flag (Spark's
default ``read_uncommitted``) they do. The report says which isolation level it read with.

Batch scenario (base = a whole minute ten minutes ago; range [base, base + 2m); every ingress
record ``delay.ms=1000``, so due at base + 1s; lateness of a copy = its timestamp - base - 1000):

=====  ======================  ========================  ==========================
id     ingress                 committed copies          aborted copies
=====  ======================  ========================  ==========================
t1     committed transaction   base+1010 (10)            -
t2     committed transaction   base+1020 (20)            base+1030 (30, 2nd copy)
t3     committed transaction   -                         base+1040 (40)
t4     committed transaction   base+1050 (50)            base+995 (-5, early)
t5     aborted transaction     -                         -
=====  ======================  ========================  ==========================

read_committed: sent 4 (t1-t4), delivered 3, lost 1 (t3), duplicates 0, early 0.
read_uncommitted: sent 5, delivered 4, lost 1 (t5), duplicates 2 (t2, t4), early 1 (t4).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from spark.accuracy_stream import main as stream_main
from spark.accuracy_stream import run_stream
from spark.cli import accuracy_main
from tests.spark.helpers import MIN_MS, Rec, consume_all, create_topics, produce_transaction

pytestmark = [pytest.mark.spark, pytest.mark.integration]

COUNTS = ("sent", "delivered", "lost", "pending", "duplicates", "early", "unmatched")


def _copy(id_: str, ts: int, deliver_at: int) -> Rec:
    return Rec(ts=ts, headers={"delay.id": id_, "delay.deliver-at": str(deliver_at), "delay.source": "x"})


def test_batch_aborted_records_count_only_without_read_committed(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    u = uuid.uuid4().hex[:8]
    ingress, target = f"rc.in.{u}", f"rc.out.{u}"
    create_topics(kafka_bootstrap, [ingress, target])
    base = (int(time.time() * 1000) // MIN_MS) * MIN_MS - 10 * MIN_MS
    due = base + 1000

    def ing(id_: str) -> Rec:
        return Rec(ts=base, headers={"delay.id": id_, "delay.target-topic": target, "delay.ms": "1000"})

    produce_transaction(kafka_bootstrap, ingress, [ing(i) for i in ("t1", "t2", "t3", "t4")], commit=True)
    produce_transaction(kafka_bootstrap, ingress, [ing("t5")], commit=False)
    produce_transaction(kafka_bootstrap, target, [
        _copy("t1", due + 10, due), _copy("t2", due + 20, due), _copy("t4", due + 50, due),
    ], commit=True)
    produce_transaction(kafka_bootstrap, target, [
        _copy("t2", due + 30, due), _copy("t3", due + 40, due), _copy("t4", due - 5, due),
    ], commit=False)

    def run(*flags: str) -> dict[str, Any]:
        rc = accuracy_main([
            "--bootstrap-servers", kafka_bootstrap, "--ingress-topic", ingress, "--targets", rf"rc\.out\.{u}",
            "--since", str(base), "--until", str(base + 2 * MIN_MS), "--out", str(tmp_path / "-".join(flags)),
            "--no-chart", "--no-details", "--json", *flags,
        ])
        assert rc == 0
        summary: dict[str, Any] = orjson.loads(capsys.readouterr().out)
        return summary

    committed = run("--read-committed")
    assert committed["isolation_level"] == "read_committed"
    t = committed["totals"]
    assert {k: t[k] for k in COUNTS} == {
        "sent": 4, "delivered": 3, "lost": 1, "pending": 0, "duplicates": 0, "early": 0, "unmatched": 0,
    }
    assert (t["lateness_ms"]["min"], t["lateness_ms"]["max"]) == (10, 50)
    on_disk = orjson.loads((tmp_path / "--read-committed" / "summary.json").read_bytes())
    assert on_disk["isolation_level"] == "read_committed"

    uncommitted = run()
    assert uncommitted["isolation_level"] == "read_uncommitted"
    t = uncommitted["totals"]
    assert {k: t[k] for k in COUNTS} == {
        "sent": 5, "delivered": 4, "lost": 1, "pending": 0, "duplicates": 2, "early": 1, "unmatched": 0,
    }
    assert (t["lateness_ms"]["min"], t["lateness_ms"]["max"]) == (-5, 50)


def test_stream_aborted_records_count_only_without_read_committed(
    spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    u = uuid.uuid4().hex[:8]
    topic, out_committed, out_uncommitted = f"rcs.a.{u}", f"rcs.outc.{u}", f"rcs.outu.{u}"
    create_topics(kafka_bootstrap, [topic, out_committed, out_uncommitted])
    base = (int(time.time() * 1000) // MIN_MS) * MIN_MS - 5 * MIN_MS
    # one minute: committed s1 (10), s2 (20), s2 again (30); aborted s1 again (40), s3 (-5, early)
    produce_transaction(kafka_bootstrap, topic, [
        _copy("s1", base + 1010, base + 1000), _copy("s2", base + 2020, base + 2000),
        _copy("s2", base + 2030, base + 2000),
    ], commit=True)
    produce_transaction(kafka_bootstrap, topic, [
        _copy("s1", base + 1040, base + 1000), _copy("s3", base + 2995, base + 3000),
    ], commit=False)

    assert stream_main([
        "--bootstrap-servers", kafka_bootstrap, "--targets", rf"rcs\.a\.{u}", "--output-topic", out_committed,
        "--checkpoint", str(tmp_path / "ckpt-c"), "--starting-offsets", "earliest", "--available-now",
        "--read-committed",
    ]) == 0
    run_stream(spark, kafka_bootstrap, rf"rcs\.a\.{u}", output_topic=out_uncommitted,
               checkpoint_dir=tmp_path / "ckpt-u", starting_offsets="earliest", available_now=True)

    def last_row(out_topic: str) -> dict[str, Any]:
        rows = [orjson.loads(m.value()) for m in consume_all(kafka_bootstrap, out_topic)]
        assert {(r["topic"], r["minute_ms"]) for r in rows} == {(topic, base)}
        row: dict[str, Any] = rows[-1]  # the last update of the window wins
        return row

    c = last_row(out_committed)
    assert (c["isolation_level"], c["deliveries"], c["duplicates"], c["early"]) == ("read_committed", 3, 1, 0)
    assert (c["lateness_ms"]["min"], c["lateness_ms"]["max"]) == (10, 30)
    uc = last_row(out_uncommitted)
    assert (uc["isolation_level"], uc["deliveries"], uc["duplicates"], uc["early"]) == ("read_uncommitted", 5, 2, 1)
    assert (uc["lateness_ms"]["min"], uc["lateness_ms"]["max"]) == (-5, 40)
