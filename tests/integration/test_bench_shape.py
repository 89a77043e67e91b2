"""The bench's common producer shape (issue 54, bench/shape.py): ``throughput`` and ``lateness``
with ``--shape common`` at ``--size small``, one scheduler, changelog on, at least once (the
configuration the CPU goal is about), on the session's broker, at the smoke tests' shortest
(``bench_runner.SHORT``). Figures are not asserted against their goals (the machine is shared);
only that the records had the shape (their explicit ``delay.id`` delivered, every ingress
partition served) and that the CPU per record of the sidecar and the passthrough and their ratio
are reported, side by side, under ``results.common``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import shape
from bench.cli import parse_args
from bench.workload import Bench
from tests.integration.bench_runner import SHORT, check_shape, run_bench

pytestmark = pytest.mark.integration


def test_bench_common_shape(kafka_bootstrap: str, tmp_path: Path) -> None:
    report = run_bench(["throughput,lateness", "--bootstrap-servers", kafka_bootstrap, "--shape", "common",
                        "--schedulers", "levels", "--changelog", "on", "--delivery", "at-least-once", *SHORT],
                       tmp_path / "bench.json", timeout_s=300)
    check_shape(report, ["throughput", "lateness"])
    assert report["settings"]["shapes"] == ["common"]
    tp = report["scenarios"]["throughput"]
    assert tp["settings"]["shapes"] == ["common"]
    assert tp["settings"]["common"]["ingress_partitions"] == shape.COMMON_PARTITIONS
    assert set(tp["results"]) == {"common"}  # the plain shape's 100B / 1KB not measured
    res = tp["results"]["common"]
    pt_cpu, cpu = res["passthrough"]["cpu_us_per_record"]["value"], res["levels"]["cpu_us_per_record"]["value"]
    assert pt_cpu > 0 and cpu > 0
    ratio = res["levels"]["cpu_to_passthrough"]
    assert ratio["goal"] == "<= 1.5" and ratio["value"] == pytest.approx(cpu / pt_cpu, rel=0.01)
    one = tp["details"]["common"]["rounds"][0]["levels"]
    assert one["delivered"] == tp["settings"]["records"] and one["duplicates"] == 0
    assert one["ingress_partitions_seen"] == shape.COMMON_PARTITIONS
    assert one["id_sample"].startswith("order-")  # the producer's delay.id, not one the sidecar made

    lat = report["scenarios"]["lateness"]
    assert lat["settings"]["shapes"] == ["common"]
    common = lat["results"]["common"]
    assert set(lat["results"]) == {"common"}
    assert common["levels"]["rate"]["value"] > 0 and common["levels"]["p99_ms"]["goal"] == "<= 50"
    assert common["levels"]["cpu_us_per_record"]["value"] > 0
    assert common["passthrough_latency"]["cpu_us_per_record"]["value"] > 0
    assert common["levels"]["cpu_to_passthrough"]["value"] > 0
    d = lat["details"]["common-levels"]
    assert d["produce_failed"] == 0 and d["duplicates"] == 0
    assert d["max_throughput_source"] == "throughput scenario of this run"


def test_bench_shape_default_depends_on_size() -> None:
    """Small runs (the CI smoke test) keep the plain shape alone; full runs measure both."""
    def shapes(*argv: str) -> list[str]:
        ns = parse_args(["throughput", "--json", "x.json", *argv])
        return shape.shapes_for(Bench("b", Path("."), ns.size, ["levels"], options={"shapes": ns.shapes}))

    assert shapes() == ["plain"]
    assert shapes("--size", "full") == ["plain", "common"]
    assert shapes("--shape", "common") == ["common"]
    assert shapes("--size", "full", "--shape", "plain") == ["plain"]


@pytest.mark.parametrize("value", ["round", "plain,plain", ","])
def test_bench_rejects_bad_shape(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["throughput", "--shape", value, "--json", "x.json"])
    assert exited.value.code == 2
    assert f"--shape {value!r}: give plain, common or plain,common" in capsys.readouterr().err
