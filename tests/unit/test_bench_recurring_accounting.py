"""The ``recurring`` bench scenario's accounting and size flags (bench/recurring.py, bench/cli.py),
without a broker: what counts as missed, covered by ``delay.missed``, doubled in flight at a kill
or not, and how ``--recurring-*`` (and ``list``'s ``--list-pending``) set the size."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import listing, recurring
from bench.cli import parse_args
from bench.workload import Bench, Delivered

P = 1000
T0 = 1_000_000


def delivered(rows: list[tuple[int, int, int, int]]) -> Delivered:
    """rows of (schedule, nominal ms, written ms, delay.missed)."""
    d = Delivered()
    for i, da, ts, m in rows:
        d.ids.append(b"sched-%d" % i)
        d.deliver_at.append(da)
        d.ts.append(ts)
        d.missed.append(m)
    return d


def test_every_nominal_time_fired_once_is_clean() -> None:
    rows = [(i, T0 + i * 500 + k * P, T0 + i * 500 + k * P + 7, 0) for i in range(2) for k in range(5)]
    acc = recurring.account(delivered(rows), [T0, T0 + 500], P, (T0 + P, T0 + 3 * P), [])
    assert (acc["missed"], acc["doubled"], acc["early"], acc["doubled_not_in_flight"]) == (0, 0, 0, 0)
    assert acc["lateness_ms"]["p99"] == 7


def test_a_gap_is_missed_unless_the_next_firing_stands_for_it() -> None:
    gap = [(0, T0 + k * P, T0 + k * P, 0) for k in (0, 1, 4, 5)]  # 2 and 3 never fired
    assert recurring.account(delivered(gap), [T0], P, (T0, T0 + 5 * P), [])["missed"] == 2
    stamped = [(0, T0 + k * P, T0 + k * P + (P if k == 4 else 0), 2 if k == 4 else 0) for k in (0, 1, 4, 5)]
    assert recurring.account(delivered(stamped), [T0], P, (T0, T0 + 5 * P), [])["missed"] == 0
    short = [(0, T0 + k * P, T0 + k * P, 1 if k == 4 else 0) for k in (0, 1, 4, 5)]  # covers 3, not 2
    assert recurring.account(delivered(short), [T0], P, (T0, T0 + 5 * P), [])["missed"] == 1


def test_a_doubled_firing_is_allowed_only_in_flight_at_a_kill() -> None:
    rows = [(0, T0 + k * P, T0 + k * P + 1, 0) for k in range(4)]
    again = [*rows, (0, T0 + 2 * P, T0 + 9 * P, 0)]  # written again after the restart
    kill = T0 + 2 * P + 100
    near = recurring.account(delivered(again), [T0], P, (T0, T0 + 3 * P), [(kill, kill + 5000)])
    assert (near["doubled"], near["doubled_not_in_flight"]) == (1, 0)
    far = recurring.account(delivered(again), [T0], P, (T0, T0 + 3 * P), [(kill + 60_000, kill + 65_000)])
    assert (far["doubled"], far["doubled_not_in_flight"]) == (1, 1)
    early = recurring.account(delivered([(0, T0, T0 - 1, 0)]), [T0], P, (T0, T0), [])
    assert early["early"] == 1


def test_size_flags(tmp_path: Path) -> None:
    ns = parse_args(["recurring", "--json", "x.json", "--recurring-schedules", "100k", "--recurring-period", "1m",
                     "--recurring-kills", "10"])
    assert (ns.recurring_schedules, ns.recurring_period, ns.recurring_kills) == (100_000, 60_000, 10)
    bench = Bench("", tmp_path, "small", ["wheel"], options={
        "recurring_schedules": ns.recurring_schedules, "recurring_period_ms": ns.recurring_period,
        "recurring_kills": ns.recurring_kills})
    assert recurring.params(bench) == (100_000, 60_000, 3, 200.0, 10)
    assert recurring.params(Bench("", tmp_path, "small", ["wheel"])) == (3_000, 10_000, 3, 200.0, 0)
    assert recurring.params(Bench("", tmp_path, "full", ["wheel"])) == (1_000_000, 60_000, 3, 1_000.0, 10)


def test_a_period_under_a_second_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["recurring", "--json", "x.json", "--recurring-period", "500ms"])
    assert "--recurring-period" in capsys.readouterr().err


def test_list_pending_flag(tmp_path: Path) -> None:
    """``--list-pending`` sets the ``list`` scenario's N at either size (bench/listing.py)."""
    ns = parse_args(["list", "--json", "x.json", "--list-pending", "3M"])
    assert listing.records_for(Bench("", tmp_path, "small", ["wheel"], options={"list_pending": ns.list_pending})) \
        == 3_000_000
    assert listing.records_for(Bench("", tmp_path, "full", ["wheel"])) == 10_000_000
