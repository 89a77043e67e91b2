"""Level arithmetic: round up, never down; beyond the last level is out of range."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.config import DEFAULT_LEVELS
from sidecar.durations import parse_duration_list
from sidecar.levels.table import level_for_delay, plan

LEVELS = tuple(parse_duration_list(DEFAULT_LEVELS))


def test_rocketmq_default_table() -> None:
    assert len(LEVELS) == 18
    assert LEVELS[0] == 1000 and LEVELS[2] == 10_000 and LEVELS[-1] == 7_200_000


def test_exact_and_between_levels() -> None:
    assert level_for_delay(LEVELS, 1000) == 1
    assert level_for_delay(LEVELS, 1001) == 2  # 1.001 s waits for the 5 s level, never the 1 s one
    assert level_for_delay(LEVELS, 1) == 1
    assert level_for_delay(LEVELS, 0) == 0
    assert level_for_delay(LEVELS, 7_200_000) == 18
    assert level_for_delay(LEVELS, 7_200_001) is None


@given(st.integers(-10_000, 8_000_000))
def test_round_up_against_a_linear_reference(delay: int) -> None:
    ref = 0 if delay <= 0 else next((i + 1 for i, lv in enumerate(LEVELS) if lv >= delay), None)
    assert level_for_delay(LEVELS, delay) == ref


@given(st.integers(0, 7_200_000), st.integers(0, 2**40))
def test_plan_is_never_early(delay: int, enqueue: int) -> None:
    result = plan(LEVELS, "ms", 0, enqueue + delay, enqueue)
    assert result is not None
    level, due = result
    assert due >= enqueue + delay
    if level:
        assert due == enqueue + LEVELS[level - 1]
        assert level == 1 or enqueue + LEVELS[level - 2] < enqueue + delay  # the smallest such level


def test_plan_modes() -> None:
    assert plan(LEVELS, "now", 0, 123, 100) == (0, 123)
    assert plan(LEVELS, "level", 3, 0, 100) == (3, 10_100)
    assert plan(LEVELS, "at", 0, 50, 100) == (0, 50)  # already due
    assert plan(LEVELS, "at", 0, 100 + 7_200_001, 100) is None
