"""bench.peer_restart.steady_s: when a restarted peer is back on time for good."""

from __future__ import annotations

from bench.peer_restart import steady_s
from bench.restart import STEP_MS

S, W = 1_000_000, 10_000


def test_no_late_probe_is_steady_at_once() -> None:
    assert steady_s(S, W, [], True) == 0


def test_steady_after_the_last_late_probe_not_the_first_on_time_one() -> None:
    # on time at 1 s, then behind again until the probe due at 4 s: steady from 4 s + a step
    late = [S + k * STEP_MS for k in range(20)] + [S + 4_000]
    assert steady_s(S, W, late, True) == (4_000 + STEP_MS) / 1000


def test_late_to_the_end_of_the_window_is_not_measured() -> None:
    assert steady_s(S, W, [S + W - STEP_MS], True) is None
    assert steady_s(S, W, [S], False) is None
