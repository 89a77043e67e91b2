"""``--max-delay`` as the failover, exactly-once and mass-expiry scenarios read it (no broker):
it only cuts their delays, and without it they are the ones their methods state; ``--dwell`` and
``--crashes`` likewise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bench import exactly_once, failover, lateness, mass_expiry, tenants
from bench.cli import parse_args
from bench.workload import cut_delays, dwell_s


def bench(max_delay_ms: int | None, full: bool = False, dwell_ms: int | None = None,
          expiry_delay_ms: int | None = None) -> Any:
    return SimpleNamespace(options={"max_delay_ms": max_delay_ms, "dwell_ms": dwell_ms,
                                    "expiry_delay_ms": expiry_delay_ms}, full=full,
                           size="full" if full else "small")


def test_cut_keeps_the_first_level_and_ends_the_wheel_range_at_the_cap() -> None:
    assert cut_delays((1_000, 5_000), (1_000, 5_000), None) == ((1_000, 5_000), (1_000, 5_000))
    assert cut_delays((1_000, 5_000), (1_000, 5_000), 2_000) == ((1_000,), (1_000, 2_000))
    assert cut_delays((1_000, 5_000), (1_000, 5_000), 10_000) == ((1_000, 5_000), (1_000, 5_000))  # never longer
    assert cut_delays((5_000,), (2_000, 5_000), 1_000) == ((5_000,), (1_000, 1_000))


@pytest.mark.parametrize("top", [None, 2_000, 10_000])
def test_failover_and_exactly_once_delays(top: int | None) -> None:
    want = ((1_000, 5_000), (1_000, 5_000)) if top != 2_000 else ((1_000,), (1_000, 2_000))
    assert failover.delays(bench(top)) == want
    assert exactly_once.delays_ms(bench(top)) == want
    assert failover.longest_delay_ms(bench(top)) == max(*want[0], want[1][1])


def test_lateness_delays_as_before() -> None:
    assert lateness.capped_delays(bench(None)) == ((1_000, 5_000, 10_000), (1_000, 10_000))
    assert lateness.capped_delays(bench(2_000)) == ((1_000,), (1_000, 2_000))


@pytest.mark.parametrize(("top", "full", "delay_ms"), [
    (None, False, 10_000), (5_000, False, 5_000), (7_000, False, 5_000), (2_000, False, 1_000),
    (None, True, 240_000), (10_000, True, 10_000),
])
def test_mass_expiry_delay_is_a_level_time_up_to_the_cap(top: int | None, full: bool, delay_ms: int) -> None:
    assert mass_expiry.params(bench(top, full))[1] == delay_ms
    # tenants: A's one delay is cut the same way; its records and B's rate are the size's
    n, a_delay_ms, b_rate = tenants.params(bench(top, full))
    assert a_delay_ms == delay_ms and (n, b_rate) == ((1_000_000, 1_000.0) if full else (20_000, 500.0))


@pytest.mark.parametrize(("given", "top", "delay_ms"), [
    ("30s", None, 30_000), ("1m", None, 60_000), ("4m", None, 240_000), ("1m", 5_000, 5_000),
])
def test_expiry_delay_sets_the_mass_expirys_delay_and_max_delay_still_cuts_it(
        given: str, top: int | None, delay_ms: int) -> None:
    ns = parse_args(["tenants", "--json", "x.json", "--expiry-delay", given])
    b = bench(top, full=True, expiry_delay_ms=ns.expiry_delay)
    assert mass_expiry.params(b) == (1_000_000, delay_ms, 2_000.0)
    assert tenants.params(b) == (1_000_000, delay_ms, 1_000.0)


@pytest.mark.parametrize("given", ["45s", "5m", "500ms", "soon"])
def test_expiry_delay_other_than_a_level_time_is_refused(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["tenants", "--json", "x.json", "--expiry-delay", given])
    err = capsys.readouterr().err
    assert "--expiry-delay" in err and given in err
    if given != "soon":
        assert "1s, 5s, 10s, 30s, 1m, 2m, 3m or 4m" in err


def test_dwell_is_the_sizes_unless_given() -> None:
    assert dwell_s(bench(None), exactly_once.DWELL_S) == 3.0
    assert dwell_s(bench(None, full=True), failover.DWELL_S) == 30.0
    assert dwell_s(bench(None, dwell_ms=1_000), exactly_once.DWELL_S) == 1.0
    assert dwell_s(bench(None, full=True, dwell_ms=0), failover.DWELL_S) == 0.0


def test_crashes_are_the_sizes_unless_given() -> None:
    assert failover.crashes(bench(None)) == 4 and failover.crashes(bench(None, full=True)) == 10
    b = bench(None)
    b.options["crashes"] = 2
    assert failover.crashes(b) == 2
