"""The peers' mass-expiry, cancel and RabbitMQ restart figures, their pure parts: the ratios of the
sidecar's figures to a peer's, the RabbitMQ probes' pacing (each published a level before its due
time, none before its turn), the probes' level (longer than the window and the kill's lead), the
pending counts each peer is measured at, the warm-up round kept out of the spread and the maximum
the Kafka Streams lateness run offers half of."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import peer_cancel, peer_expiry, peer_restart, peers
from bench.cli import parse_args
from bench.rabbit_queues import LEVELS_MS
from bench.rabbit_ttl import RabbitCrash, restart_level_ms
from bench.restart import STEP_MS
from bench.streams_punctuator import lateness_maximum
from bench.workload import Bench, wall_ms


def bench(full: bool, tmp_path: Path) -> Bench:
    return Bench("", tmp_path, "full" if full else "small", ["levels"])


def test_expiry_ratio_is_the_sidecars_drain_over_the_peers() -> None:
    peer = {"records": 1_000, "stored_before_due_s": 2.5, "drain_rate": 50_000.0, "first_lateness_ms": 3,
            "last_lateness_ms": 20, "early": 0, "lost": 0, "duplicates": 0}
    ours: dict[str, dict[str, Any]] = {"levels": {"drain_rate": 150_000.0, "early": 0},
                                       "wheel": {"drain_rate": None, "early": 0}}
    out = peer_expiry.figures(peer, ours, "pg")
    assert out["levels_ratio_to_pg"]["value"] == pytest.approx(3.0)
    assert out["levels_ratio_to_pg"]["goal"] == ">= 2"
    assert out["wheel_ratio_to_pg"]["value"] is None  # a drain not measured has no ratio
    assert out["drain_records_per_s"]["value"] == 50_000.0


def test_cancel_ratio_and_what_must_be_zero() -> None:
    peer: dict[str, Any] = {"records": 10, "cancels": 5, "cancels_per_s": 1_000.0, "cancelled_delivered": 0,
                            "lost": 0, "early": 0}
    ours = {"levels": {"cancels_per_s": 4_000.0, "cancelled_delivered": 0, "lost": 0}}
    out = peer_cancel.figures(peer, ours, "redis")
    assert out["levels_ratio_to_redis"]["value"] == pytest.approx(4.0)
    for key in ("cancelled_delivered", "lost", "early", "levels_cancelled_delivered", "levels_lost"):
        assert out[key]["goal"] == "== 0"


def test_rabbit_probes_are_published_a_level_before_their_due_time(tmp_path: Path) -> None:
    level = 30_000
    crash = RabbitCrash(bench(False, tmp_path), None, level)  # type: ignore[arg-type]  # paced needs no node
    # probe k is published at S - level + k steps: with S = now + level - 10 steps, probes 0..10 now
    got = next(crash.paced("t", wall_ms() + level - 10 * STEP_MS, 100))
    assert [r.id for r in got] == [f"probe{k}" for k in range(len(got))] and 11 <= len(got) <= 13
    assert {r.delay_ms for r in got} == {level} and {r.target for r in got} == {"t"}
    # S two levels ahead: no probe's publish time has come
    assert next(crash.paced("t", wall_ms() + 2 * level, 100)) == []
    # long past: all of them at once, then the generator ends
    every = list(crash.paced("t", wall_ms() - 10 * level, 5))
    assert [[r.id for r in b] for b in every] == [[f"probe{k}" for k in range(5)]]


def test_rabbit_probe_level_outlasts_the_window_and_the_kill(tmp_path: Path) -> None:
    for full in (False, True):
        b = bench(full, tmp_path)
        level = restart_level_ms(b)
        assert level in LEVELS_MS
        assert level > peer_restart.probe_seconds(b) * 1000 + peer_restart.KILL_LEAD_MS
    assert restart_level_ms(bench(False, tmp_path)) == 30_000
    assert restart_level_ms(bench(True, tmp_path)) == 120_000


def test_pending_counts_are_1m_and_10m_at_full_size_and_what_is_asked() -> None:
    assert peers.pending_counts(bench(True, Path("/nonexistent")), 50_000) == [1_000_000, 10_000_000]
    assert peers.pending_counts(bench(False, Path("/nonexistent")), 50_000) == [50_000]
    asked = Bench("", Path("/nonexistent"), "small", ["levels"], options={"peer_pending": [20_000, 3_000]})
    assert peers.pending_counts(asked, 50_000) == [20_000, 3_000]
    assert [peers.count_label(n) for n in (1_000_000, 10_000_000, 20_000, 2_500_000)] == ["1M", "10M", "20k", "2.5M"]


def test_peer_pending_flag_takes_counts_and_names_a_bad_one() -> None:
    ns = parse_args(["pg-poll", "--json", "x.json", "--peer-pending", "1M,10M"])
    assert ns.peer_pending == [1_000_000, 10_000_000]
    with pytest.raises(SystemExit):
        parse_args(["pg-poll", "--json", "x.json", "--peer-pending", "1M,ten"])


def test_a_warm_up_round_runs_first_at_full_size_and_is_not_counted(tmp_path: Path) -> None:
    calls: list[int] = []

    def one(r: int) -> dict[str, Any]:
        calls.append(r)
        return {"round": r, "call": len(calls)}

    details: dict[str, Any] = {}
    rounds = peers.rounds_after_warm_up(bench(True, tmp_path), one, details)
    assert details["warm_up_round"] == {"round": -1, "call": 1}  # the first run, kept apart
    assert [x["call"] for x in rounds] == list(range(2, len(calls) + 1)) and len(rounds) == len(calls) - 1
    assert [x["round"] for x in rounds] == list(range(len(rounds)))
    small: dict[str, Any] = {}
    calls.clear()
    assert len(peers.rounds_after_warm_up(bench(False, tmp_path), one, small)) == 1
    assert "warm_up_round" not in small
    # the memory probe ran beside both runs' rounds (bench/machine.py)
    assert details["memory_probe"]["mib"] == small["memory_probe"]["mib"] == 64


def test_wait_quiet_returns_once_a_window_used_little_cpu_and_gives_up_at_its_timeout() -> None:
    # CPU so far at each reading: busy for two windows (a core each), then at rest
    readings = iter([0.0, 0.01, 0.02, 0.0201, 9.0])
    waited = peers.wait_quiet(lambda: next(readings), timeout_s=5, window_s=0.01)
    assert 0.03 <= waited < 1, "three windows: two busy, the third at rest"
    busy = iter(float(i) for i in range(10_000))  # a core and more, always
    waited = peers.wait_quiet(lambda: next(busy) * 0.01, timeout_s=0.1, window_s=0.01)
    assert 0.1 <= waited < 0.5, "never at rest: the timeout"


def test_fast_peers_drain_1m_records_a_round_at_full_size_unless_told(tmp_path: Path) -> None:
    assert peers.fast_peer_records(bench(True, tmp_path)) == 1_000_000
    assert peers.fast_peer_records(bench(False, tmp_path)) == 20_000
    asked = Bench("", tmp_path, "full", ["levels"], options={"throughput_records": 5_000})
    assert peers.fast_peer_records(asked) == 5_000


def test_streams_lateness_offers_half_the_lower_of_its_two_drains() -> None:
    # a 1-10 s delay takes the stored path: the mass-expiry drain, below the forward path's backlog drain
    assert lateness_maximum(346_020.0, 128_733.0) == (128_733.0, "mass-expiry drain")
    # the backlog drain bounds it when it is the lower
    assert lateness_maximum(100_000.0, 128_733.0) == (100_000.0, "backlog drain")
    # the mass expiry not measured (or no drain rate): the backlog drain stands in
    assert lateness_maximum(346_020.0, None) == (346_020.0, "backlog drain")
    assert lateness_maximum(346_020.0, 0.0) == (346_020.0, "backlog drain")
    # the backlog not measured: the mass-expiry drain; neither: none, the run's floor rate applies
    assert lateness_maximum(None, 128_733.0) == (128_733.0, "mass-expiry drain")
    assert lateness_maximum(None, None) == (None, "backlog drain")
