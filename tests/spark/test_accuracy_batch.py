"""The batch accuracy job on crafted records with known timestamps and headers.

The scenario (base = a whole minute ten minutes ago; range [base, base + 2m)):

=====  =========================================  ======================  ==============
id     ingress                                    delivered copies         lateness (ms)
=====  =========================================  ======================  ==============
a1     delay.ms=1000                              base+1005               5
a2     delay.deliver-at=base+2000                 base+2020               20
a3     delay.level=2 (5s)                         base+5100               100
a4     delay.level=2 (5s)                         base+5300               300
a5     delay.ms=1000                              base+993 (early)        -7
a6     delay.ms=3000                              base+3010, base+3050    10, 50 (duplicate)
a7     delay.ms=2000                              none                    lost
(def)  no delay.id, delay.ms=61000                base+62000              1000 (next minute)
p1     delay.deliver-at=until+60s                 none                    pending
c1     delay.ms=30000, then a cancel command      none                    not counted
a1     a second a1 (duplicate id)                 -                       not counted
bad    no delay.target-topic                      -                       not counted
oth    target outside the pattern                 -                       not counted
zz     -                                          base+4000 (no ingress)  unmatched
=====  =========================================  ======================  ==============

Lateness over the 8 delivered copies: -7 5 10 20 50 100 300 1000 -> p50 20, max 1000, min -7.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from spark.accuracy import run_accuracy
from spark.cli import accuracy_main, parse_time_ms
from tests.spark.helpers import Rec, create_topics, produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]

MIN = 60_000


@pytest.fixture(scope="module")
def scenario(kafka_bootstrap: str, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    u = uuid.uuid4().hex[:8]
    ingress, target, other = f"acc.in.{u}", f"acc.out.{u}", f"acc.other.{u}"
    create_topics(kafka_bootstrap, [ingress, target, other])
    base = (int(time.time() * 1000) // MIN) * MIN - 10 * MIN
    since, until = base, base + 2 * MIN

    def ing(ts: int, **h: str) -> Rec:
        headers = {"delay.target-topic": target}
        headers.update({k.replace("_", "."): v for k, v in h.items()})
        return Rec(ts=ts, headers={k: v for k, v in headers.items() if v != ""})

    def dl(id_: str, ts: int, deliver_at: int) -> Rec:
        return Rec(ts=ts, headers={"delay.id": id_, "delay.deliver-at": str(deliver_at), "delay.source": "x"})

    ingress_records = [
        ing(base, delay_id="a1", delay_ms="1000"),
        ing(base, delay_id="a2", **{"delay_deliver-at": str(base + 2000)}),
        ing(base, delay_id="a3", delay_level="2"),
        ing(base, delay_id="a4", delay_level="2"),
        ing(base, delay_id="a5", delay_ms="1000"),
        ing(base, delay_id="a6", delay_ms="3000"),
        ing(base, delay_id="a7", delay_ms="2000"),
        ing(base, delay_ms="61000"),  # default id <topic>:0:<offset>
        ing(base, delay_id="p1", **{"delay_deliver-at": str(until + MIN)}),
        ing(base, delay_id="c1", delay_ms="30000"),
        Rec(ts=base + 10, headers={"delay.cancel": "c1"}),
        ing(base + 20, delay_id="a1", delay_ms="1000"),  # duplicate id: dropped by the sidecar
        Rec(ts=base, headers={"delay.id": "bad", "delay.ms": "1000"}),  # no target -> DLQ
        Rec(ts=base, headers={"delay.id": "oth", "delay.ms": "1000", "delay.target-topic": other}),
        ing(until + 1000, delay_id="late-sent", delay_ms="0"),  # sent after the range
    ]
    offsets = produce(kafka_bootstrap, ingress, ingress_records)
    default_id = f"{ingress}:0:{offsets[7]}"
    produce(kafka_bootstrap, target, [
        dl("a5", base + 993, base + 1000),
        dl("a1", base + 1005, base + 1000),
        dl("a2", base + 2020, base + 2000),
        dl("a6", base + 3010, base + 3000),
        dl("zz", base + 4000, base + 3900),
        dl("a6", base + 3050, base + 3000),
        dl("a3", base + 5100, base + 5000),
        dl("a4", base + 5300, base + 5000),
        dl(default_id, base + 62_000, base + 61_000),
        dl("late-sent", until + 1000, until + 1000),
    ])
    produce(kafka_bootstrap, other, [dl("oth", base + 1000, base + 1000)])
    out = tmp_path_factory.mktemp("accuracy")
    t0 = time.monotonic()
    summary = run_accuracy(
        spark, kafka_bootstrap, ingress, rf"acc\.out\.{u}", since, until, out,
    )
    return {
        "summary": summary, "out": out, "base": base, "since": since, "until": until, "ingress": ingress,
        "target": target, "pattern": rf"acc\.out\.{u}", "default_id": default_id,
        "seconds": time.monotonic() - t0,
    }


def test_totals_are_exact(scenario: dict[str, Any]) -> None:
    t = scenario["summary"]["totals"]
    assert {k: t[k] for k in ("sent", "delivered", "lost", "pending", "duplicates", "early", "unmatched")} == {
        "sent": 9, "delivered": 7, "lost": 1, "pending": 1, "duplicates": 1, "early": 1, "unmatched": 1,
    }
    assert t["ignored"] == {
        "commands": 1, "cancelled": 1, "invalid": 1, "duplicate_ids": 1, "other_targets": 1,
    }
    lat = t["lateness_ms"]
    assert lat["max"] == 1000
    assert lat["min"] == -7
    assert lat["p50"] == 20
    assert lat["p99"] == 1000
    assert lat["mean"] == pytest.approx((-7 + 5 + 10 + 20 + 50 + 100 + 300 + 1000) / 8)


def test_per_level_and_minute(scenario: dict[str, Any]) -> None:
    s = scenario["summary"]
    base, target = scenario["base"], scenario["target"]
    [topic_row] = s["by_topic"]
    assert topic_row["topic"] == target and topic_row["sent"] == 9
    levels = {r["level"]: r for r in s["by_topic_level"]}
    assert set(levels) == {None, 2}
    assert (levels[2]["sent"], levels[2]["delivered"], levels[2]["lateness_ms"]["max"]) == (2, 2, 300)
    assert (levels[2]["lateness_ms"]["p50"], levels[2]["early"]) == (100, 0)
    assert (levels[None]["sent"], levels[None]["lost"], levels[None]["early"]) == (7, 1, 1)
    minutes = {(r["level"], r["minute_ms"]): r for r in s["by_minute"]}
    assert set(minutes) == {(None, base), (2, base), (None, base + MIN), (None, scenario["until"] + MIN)}
    first = minutes[(None, base)]
    assert (first["sent"], first["delivered"], first["lost"], first["duplicates"], first["early"]) == (5, 4, 1, 1, 1)
    assert first["lateness_ms"]["max"] == 50
    second = minutes[(None, base + MIN)]
    assert (second["sent"], second["delivered"], second["lateness_ms"]["p50"]) == (1, 1, 1000)
    assert minutes[(None, scenario["until"] + MIN)]["pending"] == 1
    for r in s["by_minute"]:
        assert r["sent"] == r["delivered"] + r["lost"] + r["pending"]


def test_outputs_written(scenario: dict[str, Any], spark: Any) -> None:
    out: Path = scenario["out"]
    on_disk = orjson.loads((out / "summary.json").read_bytes())
    assert on_disk["totals"] == scenario["summary"]["totals"]
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = spark.read.parquet(str(out / "details.parquet")).collect()
    by_status: dict[str, list[Any]] = {}
    for r in rows:
        by_status.setdefault(r["status"], []).append(r)
    assert {k: len(v) for k, v in by_status.items()} == {
        "delivered": 7, "duplicate": 1, "lost": 1, "pending": 1, "unmatched": 1,
    }
    assert [r["id"] for r in by_status["lost"]] == ["a7"]
    assert [r["lateness_ms"] for r in by_status["duplicate"]] == [50]
    default = [r for r in by_status["delivered"] if r["id"] == scenario["default_id"]]
    assert default and default[0]["lateness_ms"] == 1000


def test_grace_turns_lost_into_pending(
    scenario: dict[str, Any], spark: Any, tmp_path: Path, kafka_bootstrap: str
) -> None:
    # a7 is due at base+2s; with until = base+2m and 119s of grace it is not due "before the end" yet
    summary = run_accuracy(
        spark, kafka_bootstrap, scenario["ingress"], scenario["pattern"], scenario["since"], scenario["until"],
        tmp_path, grace_ms=119_000, chart=False, details=False,
    )
    t = summary["totals"]
    assert (t["lost"], t["pending"], t["sent"]) == (0, 2, 9)


def test_cli_prints_table(scenario: dict[str, Any], tmp_path: Path, kafka_bootstrap: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    rc = accuracy_main([
        "--bootstrap-servers", kafka_bootstrap, "--ingress-topic", scenario["ingress"],
        "--targets", scenario["pattern"], "--since", str(scenario["since"]),
        "--until", str(scenario["until"]), "--out", str(tmp_path), "--no-chart", "--no-details", "--check",
    ])
    out = capsys.readouterr().out
    assert rc == 1  # --check: one lost, one early
    assert "sent 9  delivered 7  lost 1  pending 1  duplicates 1  early 1" in out
    assert scenario["target"] in out and "p99.9" in out
    assert (tmp_path / "summary.json").exists()


def test_cli_bad_flags_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert accuracy_main(["--bootstrap-servers", "x:1", "--targets", "t", "--since", "yesterday"]) == 2
    assert "--since" in capsys.readouterr().err
    assert accuracy_main(["--bootstrap-servers", "x:1", "--targets", "t", "--levels", "1s 1s"]) == 2
    assert "--levels" in capsys.readouterr().err
    assert accuracy_main(["--bootstrap-servers", "x:1", "--targets", "t", "--since", "now", "--until", "now-1h"]) == 2
    assert "--until" in capsys.readouterr().err


def test_parse_time() -> None:
    now = 1_700_000_000_000
    assert parse_time_ms("1700000000123") == 1_700_000_000_123
    assert parse_time_ms("2023-11-14T22:13:20Z") == now
    assert parse_time_ms("2023-11-14T22:13:20") == now
    assert parse_time_ms("2023-11-14T23:13:20+01:00") == now
    assert parse_time_ms("now", now_ms=now) == now
    assert parse_time_ms("now-1h", now_ms=now) == now - 3_600_000
    assert parse_time_ms("-15m", now_ms=now) == now - 900_000
    with pytest.raises(ValueError, match="not a time"):
        parse_time_ms("soon")
