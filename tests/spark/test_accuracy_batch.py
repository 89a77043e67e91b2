"""The batch accuracy job on crafted records with known timestamps and headers.

The scenario and its expected figures are in tests/spark/helpers.py; the ``batch_scenario``
fixture (tests/spark/conftest.py) produces it once per session and runs the job locally.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from spark.accuracy import run_accuracy
from spark.cli import accuracy_main
from tests.spark.helpers import MIN_MS

pytestmark = [pytest.mark.spark, pytest.mark.integration]

MIN = MIN_MS


def test_totals_are_exact(batch_scenario: dict[str, Any]) -> None:
    t = batch_scenario["summary"]["totals"]
    assert {k: t[k] for k in ("sent", "delivered", "lost", "pending", "duplicates", "early", "unmatched")} == {
        "sent": 9, "delivered": 7, "lost": 1, "pending": 1, "duplicates": 1, "early": 1, "unmatched": 1,
    }
    assert t["ignored"] == {
        "commands": 1, "cancelled": 1, "invalid": 1, "duplicate_ids": 1, "other_targets": 1, "recurring": 0,
    }
    f = t["firings"]  # no recurring schedule in this scenario
    assert (f["fired"], f["duplicates"], f["early"], f["missed"], f["lost"]) == (0, 0, 0, 0, 0)
    lat = t["lateness_ms"]
    assert lat["max"] == 1000
    assert lat["min"] == -7
    assert lat["p50"] == 20
    assert lat["p99"] == 1000
    assert lat["mean"] == pytest.approx((-7 + 5 + 10 + 20 + 50 + 100 + 300 + 1000) / 8)


def test_per_level_and_minute(batch_scenario: dict[str, Any]) -> None:
    s = batch_scenario["summary"]
    base, target = batch_scenario["base"], batch_scenario["target"]
    [topic_row] = s["by_topic"]
    assert topic_row["topic"] == target and topic_row["sent"] == 9
    levels = {r["level"]: r for r in s["by_topic_level"]}
    assert set(levels) == {None, 2}
    assert (levels[2]["sent"], levels[2]["delivered"], levels[2]["lateness_ms"]["max"]) == (2, 2, 300)
    assert (levels[2]["lateness_ms"]["p50"], levels[2]["early"]) == (100, 0)
    assert (levels[None]["sent"], levels[None]["lost"], levels[None]["early"]) == (7, 1, 1)
    minutes = {(r["level"], r["minute_ms"]): r for r in s["by_minute"]}
    assert set(minutes) == {(None, base), (2, base), (None, base + MIN), (None, batch_scenario["until"] + MIN)}
    first = minutes[(None, base)]
    assert (first["sent"], first["delivered"], first["lost"], first["duplicates"], first["early"]) == (5, 4, 1, 1, 1)
    assert first["lateness_ms"]["max"] == 50
    second = minutes[(None, base + MIN)]
    assert (second["sent"], second["delivered"], second["lateness_ms"]["p50"]) == (1, 1, 1000)
    assert minutes[(None, batch_scenario["until"] + MIN)]["pending"] == 1
    for r in s["by_minute"]:
        assert r["sent"] == r["delivered"] + r["lost"] + r["pending"]


def test_outputs_written(batch_scenario: dict[str, Any], spark: Any) -> None:
    out: Path = batch_scenario["out"]
    on_disk = orjson.loads((out / "summary.json").read_bytes())
    assert on_disk["totals"] == batch_scenario["summary"]["totals"]
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
    default = [r for r in by_status["delivered"] if r["id"] == batch_scenario["default_id"]]
    assert default and default[0]["lateness_ms"] == 1000


def test_grace_turns_lost_into_pending(
    batch_scenario: dict[str, Any], spark: Any, tmp_path: Path, kafka_bootstrap: str
) -> None:
    # a7 is due at base+2s; with until = base+2m and 119s of grace it is not due "before the end" yet
    summary = run_accuracy(
        spark, kafka_bootstrap, batch_scenario["ingress"], batch_scenario["pattern"],
        batch_scenario["since"], batch_scenario["until"],
        tmp_path, grace_ms=119_000, chart=False, details=False,
    )
    t = summary["totals"]
    assert (t["lost"], t["pending"], t["sent"]) == (0, 2, 9)


def test_cli_prints_table(batch_scenario: dict[str, Any], tmp_path: Path, kafka_bootstrap: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    rc = accuracy_main([
        "--bootstrap-servers", kafka_bootstrap, "--ingress-topic", batch_scenario["ingress"],
        "--targets", batch_scenario["pattern"], "--since", str(batch_scenario["since"]),
        "--until", str(batch_scenario["until"]), "--out", str(tmp_path), "--no-chart", "--no-details", "--check",
    ])
    out = capsys.readouterr().out
    assert rc == 1  # --check: one lost, one early
    assert "sent 9  delivered 7  lost 1  pending 1  duplicates 1  early 1" in out
    assert batch_scenario["target"] in out and "p99.9" in out
    assert (tmp_path / "summary.json").exists()
