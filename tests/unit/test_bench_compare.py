"""bench/compare.py: a bench report beside a committed baseline (CI prints it, never asserts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bench import compare
from bench.report import fig


def _report(rate: float, p99: float, cpu: float | None, extra: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {
        "levels": {"changelog_on": {"rate": fig(rate, "records/s"), "ratio": fig(rate / 100_000, "x", ">= 0.6")}},
    }
    lateness: dict[str, Any] = {"levels": {"p99": fig(p99, "ms", "<= 50"), "cpu_to_passthrough": fig(cpu, "x")}}
    if extra:
        lateness["levels"]["early"] = fig(0, "records", "== 0")
    return {"command": "delay-sidecar bench throughput,lateness --size small", "finished_at": "2026-12-03T17:00:00Z",
            "machine": {"git_commit": "abc", "cpu_count": 2, "cpu_model": "x", "memory_bytes": 1},
            "scenarios": {"throughput": {"results": results}, "lateness": {"results": lateness}}}


def test_each_figure_gets_its_change_and_direction() -> None:
    base = compare.baseline_of(_report(50_000, 40, 30))
    rows = {r.figure: r for r in compare.compare(base, _report(40_000, 41, None, extra=True))}
    rate = rows["throughput.levels.changelog_on.rate"]
    assert (rate.baseline, rate.now, rate.change_pct, rate.verdict) == (50_000, 40_000, -20.0, "worse")
    assert rows["throughput.levels.changelog_on.ratio"].verdict == "worse"  # its goal says higher is better
    p99 = rows["lateness.levels.p99"]
    assert p99.change_pct == 2.5 and p99.verdict == "noise"  # within NOISE_PCT
    cpu = rows["lateness.levels.cpu_to_passthrough"]
    assert cpu.now is None and cpu.change_pct is None and cpu.verdict == ""  # not measured now
    new = rows["lateness.levels.early"]  # a figure the baseline has not: shown, no change
    assert new.baseline is None and new.now == 0 and new.change_pct is None
    assert list(rows)[-1] == "lateness.levels.early"


def test_lower_is_better_for_times_and_costs() -> None:
    rows = {r.figure: r for r in compare.compare(_report(50_000, 40, 30), _report(60_000, 20, 45))}
    assert rows["throughput.levels.changelog_on.rate"].verdict == "better"
    assert rows["lateness.levels.p99"].verdict == "better" and rows["lateness.levels.p99"].change_pct == -50.0
    cpu = rows["lateness.levels.cpu_to_passthrough"]
    assert cpu.verdict == "worse" and cpu.change_pct == 50.0


def test_a_zero_baseline_has_no_percentage() -> None:
    base = {"figures": {"x.early": {"value": 0, "unit": "records", "goal": "== 0"}}}
    now = {"figures": {"x.early": {"value": 3, "unit": "records", "goal": "== 0"}}}
    [row] = compare.compare(base, now)
    assert (row.baseline, row.now, row.change_pct, row.verdict) == (0, 3, None, "worse")
    assert compare.higher_is_better("x.early", "records", "== 0") is False
    assert compare.higher_is_better("x.p99_ms", "ms", None) is False
    assert compare.higher_is_better("x.runqueue_wait_share", "x", None) is False
    assert compare.higher_is_better("x.ratio_min", "x", None) is True
    assert compare.higher_is_better("x.pending", "records", None) is None


def test_the_printed_table_and_the_baseline_file(tmp_path: Path) -> None:
    path = tmp_path / "baseline-small.json"
    compare.write_baseline(path, _report(50_000, 40, 30))
    written = orjson.loads(path.read_bytes())
    assert written["commit"] == "abc" and written["schema"] == compare.SCHEMA
    assert written["figures"]["lateness.levels.p99"] == {"value": 40, "unit": "ms", "goal": "<= 50"}
    text = compare.print_comparison(path, _report(40_000, 40, 30))
    lines = text.splitlines()
    assert lines[0].startswith(f"bench comparison against the baseline {path} (abc,")
    assert lines[1].split() == ["figure", "unit", "baseline", "now", "change", "%"]
    rate = next(line for line in lines if line.startswith("throughput.levels.changelog_on.rate "))
    assert rate.split()[-4:] == ["50,000", "40,000", "-20.0", "worse"]
    assert lines[-1] == ("4 figures; 2 worse by >= 10 %: throughput.levels.changelog_on.rate, "
                         "throughput.levels.changelog_on.ratio")


def test_a_missing_or_broken_baseline_is_said_not_raised(tmp_path: Path) -> None:
    assert compare.print_comparison(tmp_path / "none.json", _report(1, 1, 1)).startswith(
        "bench comparison: no baseline")
    bad = tmp_path / "bad.json"
    bad.write_text('{"figures": [1, 2]}')
    assert "unreadable baseline" in compare.print_comparison(bad, _report(1, 1, 1))
