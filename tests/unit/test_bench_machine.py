"""The memory probe beside the peers' rounds (bench/machine.py): the real probe's samples, each
drain's mean over its window, and a peer's figures over the rounds against hand-worked values
and, for the correlation, against its definition on linear data."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import machine, report


def test_the_real_probe_samples_the_memory_latency(tmp_path: Path) -> None:
    with machine.probing(tmp_path) as probe:
        assert probe is not None  # java is on PATH wherever Kafka runs
        t0 = time.monotonic()
        while len(probe.samples()) < 3 and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        samples = probe.samples()
    assert len(samples) >= 3
    for start, end, ns, cache_ns in samples:
        assert start <= end
        # a step that misses the caches costs tens to hundreds of ns; an L1 hit would be ~1
        assert 10 < ns < 100_000
        # the cache-sized chase: an L3 hit (~10 ns) at best, a memory latency at worst
        assert 3 < cache_ns < 100_000
    starts = [s[0] for s in samples]
    assert starts == sorted(starts)
    assert starts[1] - starts[0] >= machine.PERIOD_MS


SAMPLES = [machine.Sample(1_000, 1_005, 100.0, 10.0), machine.Sample(1_500, 1_505, 200.0, 20.0),
           machine.Sample(2_000, 2_005, 300.0, 40.0), machine.Sample(2_500, 2_505, 900.0, 90.0)]


def test_a_window_takes_the_samples_wholly_inside_it() -> None:
    assert machine.mean_between(SAMPLES, (1_000, 2_005)) == pytest.approx(200.0)
    assert machine.mean_between(SAMPLES, (1_001, 2_004)) == pytest.approx(200.0)  # the edges straddle it
    assert machine.mean_between(SAMPLES, (3_000, 4_000)) is None
    assert machine.mean_between(SAMPLES, None) is None
    assert machine.mean_between(SAMPLES, (1_400, 2_100), "cache_ns") == pytest.approx(30.0)


def test_annotate_gives_each_result_with_a_window_its_latency() -> None:
    one: dict[str, Any] = {"pg": {"records_per_s": 1.0, "window_ms": (1_400, 2_600)},
                           "levels": {"records_per_s": 2.0, "window_ms": None},
                           "wheel": {"records_per_s": 3.0}}
    machine.annotate(one, SAMPLES)
    assert one["pg"]["memory_ns"] == pytest.approx((200 + 300 + 900) / 3)
    assert one["pg"]["cache_ns"] == pytest.approx((20 + 40 + 90) / 3)
    assert one["levels"]["memory_ns"] is None and one["levels"]["cache_ns"] is None
    assert "memory_ns" not in one["wheel"]


def test_the_summary_gives_each_chase_its_range() -> None:
    out = machine.summary(SAMPLES)
    assert out["samples"] == 4 and out["mib"] == machine.MIB and out["cache_mib"] == machine.CACHE_MIB
    assert (out["median_ns"], out["min_ns"], out["max_ns"]) == (250.0, 100.0, 900.0)
    assert (out["cache_median_ns"], out["cache_min_ns"], out["cache_max_ns"]) == (30.0, 10.0, 90.0)
    assert machine.summary([])["cache_median_ns"] is None


def rounds(rates: list[float], ns: list[float | None], cache: list[float | None] | None = None) -> list[dict[str, Any]]:
    return [{"pg": {"records_per_s": r, "memory_ns": n, "cache_ns": c}}
            for r, n, c in zip(rates, ns, cache or [None] * len(ns), strict=True)]


def test_figures_of_a_peer_that_follows_the_machine() -> None:
    out = machine.machine_figures(rounds([400.0, 300.0, 200.0, 350.0], [200.0, 250.0, 300.0, 225.0],
                                         [20.0, 20.0, 20.0, 30.0]), "pg")
    assert out["memory_latency_ns"]["value"] == pytest.approx(237.5)
    assert out["memory_latency_spread"]["value"] == pytest.approx(100 / 237.5, abs=1e-4)
    assert out["rate_memory_latency_r"]["value"] == pytest.approx(-1.0)
    # the cache chase's figures are its own: here it does not follow the rate
    assert out["cache_latency_ns"]["value"] == pytest.approx(20.0)
    assert out["cache_latency_spread"]["value"] == pytest.approx(0.5)
    # worked by hand: deviations (87.5, -12.5, -112.5, 37.5) and (-2.5, -2.5, -2.5, 7.5):
    # 375 / sqrt(21875 * 75)
    assert out["rate_cache_latency_r"]["value"] == pytest.approx(375 / (21875 * 75) ** 0.5, abs=1e-4)


def test_rounds_without_a_latency_are_left_out_and_too_few_have_no_r() -> None:
    out = machine.machine_figures(rounds([400.0, 300.0, 200.0], [200.0, None, 300.0]), "pg")
    assert out["memory_latency_ns"]["value"] == pytest.approx(250.0)
    assert out["rate_memory_latency_r"]["value"] is None
    assert "2 of 3 rounds" in out["memory_latency_ns"]["note"]
    empty = machine.machine_figures(rounds([400.0], [None]), "pg")
    assert empty["memory_latency_ns"]["value"] is None and empty["memory_latency_spread"]["value"] is None


def test_a_constant_side_has_no_correlation() -> None:
    assert machine.pearson([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]) is None
    assert machine.pearson([1.0, 2.0], [1.0, 2.0]) is None


@given(st.lists(st.integers(-1_000, 1_000), min_size=3, max_size=20, unique=True),
       st.integers(-50, 50).filter(lambda a: a != 0), st.integers(-1_000, 1_000))
def test_linear_data_correlates_by_the_sign_of_its_slope(xs: list[int], a: int, b: int) -> None:
    ys = [float(a * x + b) for x in xs]
    r = machine.pearson([float(x) for x in xs], ys)
    assert r == pytest.approx(1.0 if a > 0 else -1.0)


@given(st.lists(st.one_of(st.none(), st.just(0.0), st.floats(1.0, 1e6)), max_size=12))
def test_spread_is_the_range_over_the_median_of_the_known_values(values: list[float | None]) -> None:
    """``report.spread``, shared by the peers' rates and the probe's latency, against its
    definition worked out by sorting: rounds without a figure (``None``, 0) are left out."""
    known = sorted(v for v in values if v)
    got = report.spread(values)
    if not known:
        assert got is None
        return
    mid = len(known) // 2
    med = known[mid] if len(known) % 2 else (known[mid - 1] + known[mid]) / 2
    assert got == pytest.approx((known[-1] - known[0]) / med)
    assert got >= 0 and (len(set(known)) > 1) == (got > 0)
