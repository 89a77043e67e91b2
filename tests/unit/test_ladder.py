"""Consumer retry ladder: RocketMQ %RETRY% semantics (step n for retry-count n, last repeats)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.config import DEFAULT_RETRY_LADDER, Settings, load_settings
from sidecar.durations import parse_duration_list
from sidecar.retry import RetryLadder

MIN = 60_000
HOUR = 3_600_000


def reference(steps: list[int], max_retries: int, n: int) -> int | None:
    """Walk the ladder one failure at a time, staying on the last rung."""
    if n > max_retries:
        return None
    rung = 0
    for _ in range(n - 1):
        rung = min(rung + 1, len(steps) - 1)
    return steps[rung]


@given(
    st.lists(st.integers(min_value=0, max_value=10**10), min_size=1, max_size=30),
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=1, max_value=100),
)
def test_matches_reference(steps: list[int], max_retries: int, n: int) -> None:
    ladder = RetryLadder(tuple(steps), max_retries)
    assert ladder.delay_for(n) == reference(steps, max_retries, n)


def test_alipay_ladder() -> None:
    ladder = RetryLadder(tuple(parse_duration_list("4m 10m 10m 1h 2h 6h 15h")), max_retries=10)
    assert [ladder.delay_for(n) for n in range(1, 12)] == [
        4 * MIN, 10 * MIN, 10 * MIN, HOUR, 2 * HOUR, 6 * HOUR, 15 * HOUR,
        15 * HOUR, 15 * HOUR, 15 * HOUR,  # the last step repeats
        None,  # 11 > max-retries: DLQ retries-exhausted
    ]


def test_default_is_rocketmq_from_level_3() -> None:
    ladder = RetryLadder.from_settings(Settings())
    assert ladder.max_retries == 16
    rocketmq_levels = parse_duration_list("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
    # a message that failed n times is redelivered after level 3 + n - 1 (1-based)
    for n in range(1, 17):
        assert ladder.delay_for(n) == rocketmq_levels[3 + n - 1 - 1]
    assert ladder.delay_for(16) == 2 * HOUR
    assert ladder.delay_for(17) is None
    assert ladder.steps_ms == tuple(parse_duration_list(DEFAULT_RETRY_LADDER))


def test_from_settings_uses_configured_options() -> None:
    s = load_settings(flags={"retry-ladder": "4m 10m 10m 1h 2h 6h 15h", "max-retries": "3"}, environ={})
    ladder = RetryLadder.from_settings(s)
    assert ladder.steps_ms == (4 * MIN, 10 * MIN, 10 * MIN, HOUR, 2 * HOUR, 6 * HOUR, 15 * HOUR)
    assert [ladder.delay_for(n) for n in (1, 3, 4)] == [4 * MIN, 10 * MIN, None]


def test_max_retries_zero_exhausts_every_retry() -> None:
    ladder = RetryLadder((1000,), max_retries=0)
    assert ladder.delay_for(1) is None


@pytest.mark.parametrize("n", [0, -1])
def test_retry_count_below_one_is_not_a_retry(n: int) -> None:
    with pytest.raises(ValueError, match="normal delay headers"):
        RetryLadder((1000,), 16).delay_for(n)


def test_accepts_a_list_and_stores_a_tuple() -> None:
    ladder = RetryLadder([1, 2, 3], 5)  # type: ignore[arg-type]
    assert ladder.steps_ms == (1, 2, 3)
    assert hash(ladder) == hash(RetryLadder((1, 2, 3), 5))


@pytest.mark.parametrize(("steps", "max_retries"), [((), 3), ((-1,), 3), ((1,), -1)])
def test_rejects_bad_ladders(steps: tuple[int, ...], max_retries: int) -> None:
    with pytest.raises(ValueError):
        RetryLadder(steps, max_retries)
